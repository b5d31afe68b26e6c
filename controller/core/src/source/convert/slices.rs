//! All `EndpointSlice`s of one Service -> one [`PortMap`].
//!
//! Rules (kube-proxy's `endpointslicecache.go`):
//! * conditions: absent `ready` = true, absent `serving` = true, absent
//!   `terminating` = false;
//! * only the first valid address of an endpoint is used (addresses of one
//!   endpoint are fungible);
//! * the same `host:port` in several slices appears once: the non-terminating
//!   one wins, then the ready one, then the first seen (callers pass slices in
//!   a stable order, e.g. by name);
//! * a port uses its ready endpoints; with `drain_terminating: true`
//!   ([`Drain::Fallback`]) a port with no ready endpoint falls back to the
//!   `serving && terminating` ones, flagged `draining: true`; with
//!   `drain_terminating: always` ([`Drain::Always`]) the `serving &&
//!   terminating` ones are always published next to the ready ones, flagged
//!   `draining: true` with weight 0 (no new traffic).

use std::collections::BTreeMap;

use compact_str::CompactString;
#[cfg(test)]
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::{
    AddressType, ConvertOptions, Converted, Drain, PortSpec, SkipReason, Warnings, finish,
    object_name, valid_address, validate_ports,
};
use crate::model::{Node, NodeTopology};
use crate::source::lean::AsLeanSlice;

#[derive(Debug)]
struct Candidate {
    node: Node,
    ready: bool,
    serving: bool,
    terminating: bool,
}

impl Candidate {
    /// Whether `self` should replace `old` for the same `host:port`.
    fn beats(&self, old: &Candidate) -> bool {
        (old.terminating && !self.terminating)
            || (old.terminating == self.terminating && !old.ready && self.ready)
    }
}

/// One endpoint of a slice, reduced to what the merge reads: its first valid
/// address and its conditions (defaults applied). A view into the packed
/// [`SliceEndpoints`] of a [`SliceContribution`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SliceEndpoint<'a> {
    pub(super) host: &'a str,
    pub(super) ready: bool,
    pub(super) serving: bool,
    pub(super) terminating: bool,
    /// Set only when topology output is on and the endpoint has some; the
    /// merge copies it into the endpoint's nodes ([`SliceEndpoint::boxed_topology`]).
    pub(super) topology: Option<&'a NodeTopology>,
}

impl SliceEndpoint<'_> {
    /// The topology as a node carries it.
    pub(super) fn boxed_topology(&self) -> Option<Box<NodeTopology>> {
        self.topology.map(|t| Box::new(t.clone()))
    }
}

/// One endpoint before packing: host, ready, serving, terminating, topology.
type Unpacked<'a> = (&'a str, bool, bool, bool, Option<Box<NodeTopology>>);

/// Terminates each endpoint's record in [`SliceEndpoints::text`]: never part
/// of a host, which is a valid IPv4 or IPv6 address or DNS name by then.
const END: char = '\n';

/// The usable endpoints of one slice, packed for the index, which keeps one
/// of these per EndpointSlice for as long as the slice lives.
///
/// Why packed (issue 19, item 1): as a `Vec` of 40-byte endpoints (a
/// 24-byte inline host, three flags, a topology box) a 10-endpoint slice
/// took 400 bytes next to the 480 of its Service's merged nodes, i.e. every
/// host was held twice at full size. Here an endpoint is its host text and
/// two bytes, in ONE block per slice: about 120 bytes for 10 IPv4
/// endpoints. Reading it back costs a scan of that text per merge, which
/// only the (small) Services of fewer than
/// [`crate::index::INCREMENTAL_MIN_SLICES`] slices do per change.
///
/// Each record is `<flags><host>\n`: `flags` one ASCII digit `'0'..='7'`
/// (bit 0 ready, bit 1 serving, bit 2 terminating). A `str`, not bytes, so
/// reading needs neither a UTF-8 check nor `unsafe`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct SliceEndpoints {
    text: Box<str>,
    /// Per endpoint in order, its topology; `None` (no allocation) unless
    /// topology output is on and some endpoint has one.
    topology: Option<Box<[Option<Box<NodeTopology>>]>>,
}

impl SliceEndpoints {
    /// Packs `endpoints` (`(host, ready, serving, terminating, topology)`).
    fn pack(endpoints: Vec<Unpacked<'_>>) -> Self {
        // At its exact size: no spare room to give back.
        let mut text = String::with_capacity(endpoints.iter().map(|e| e.0.len() + 2).sum());
        let mut topology = Vec::with_capacity(endpoints.len());
        for (host, ready, serving, terminating, topo) in endpoints {
            let flags = u8::from(ready) | (u8::from(serving) << 1) | (u8::from(terminating) << 2);
            text.push(char::from(b'0' + flags));
            text.push_str(host);
            text.push(END);
            topology.push(topo);
        }
        let topology = topology
            .iter()
            .any(Option::is_some)
            .then(|| topology.into_boxed_slice());
        Self {
            text: text.into_boxed_str(),
            topology,
        }
    }

    /// The endpoints in the slice's order.
    pub(super) fn iter(&self) -> impl Iterator<Item = SliceEndpoint<'_>> + Clone + '_ {
        self.text
            .split_terminator(END)
            .enumerate()
            .map(|(i, record)| {
                // Every record starts with its ASCII flag digit (see `pack`).
                let flags = record
                    .as_bytes()
                    .first()
                    .map_or(0, |b| b.wrapping_sub(b'0'));
                SliceEndpoint {
                    host: record.get(1..).unwrap_or_default(),
                    ready: flags & 1 != 0,
                    serving: flags & 2 != 0,
                    terminating: flags & 4 != 0,
                    topology: self
                        .topology
                        .as_ref()
                        .and_then(|t| t.get(i))
                        .and_then(Option::as_deref),
                }
            })
    }
}

/// What ONE EndpointSlice contributes to its Service's merge: validated ports,
/// the usable endpoints, and the warnings the slice raises, in the order
/// [`from_slices`] reports them. The index keeps this instead of the slice
/// (a fraction of the memory: no unused addresses, hints, or object fields;
/// the endpoints packed, [`SliceEndpoints`]), and merging contributions
/// gives exactly what [`from_slices`] gives for the slices themselves.
#[derive(Debug, Clone)]
pub struct SliceContribution {
    warnings: Vec<(SkipReason, String)>,
    /// Validated ports (empty when the address type is unknown: the slice is
    /// skipped as a whole, its ports too).
    specs: Vec<PortSpec>,
    endpoints: SliceEndpoints,
}

impl SliceContribution {
    /// The warnings the slice raises, with their reasons, in order.
    pub fn warnings(&self) -> &[(SkipReason, String)] {
        &self.warnings
    }

    /// The validated ports.
    pub(super) fn specs(&self) -> &[PortSpec] {
        &self.specs
    }

    /// The usable endpoints, in the slice's order.
    pub(super) fn endpoints(&self) -> &SliceEndpoints {
        &self.endpoints
    }

    /// Validates and reduces `slice` (`opts` must be the options later
    /// passed to [`merge_slices`]): what the watch decodes
    /// ([`crate::source::lean::LeanEndpointSlice`]) or a k8s-openapi `EndpointSlice`.
    pub fn new(slice: &(impl AsLeanSlice + ?Sized), opts: &ConvertOptions) -> Self {
        let slice = slice.lean();
        let mut warnings = Warnings::default();
        let obj = object_name("EndpointSlice", &slice.metadata);
        let address_type = match slice.address_type.as_str() {
            "IPv4" => AddressType::V4,
            "IPv6" => AddressType::V6,
            "FQDN" => AddressType::Fqdn,
            other => {
                warnings.push(
                    SkipReason::UnknownAddressType,
                    format!("{obj}: unknown addressType {other:?}; slice skipped"),
                );
                return Self {
                    warnings: warnings.into_pairs(),
                    specs: Vec::new(),
                    endpoints: SliceEndpoints::default(),
                };
            }
        };
        let mut specs = validate_ports(
            slice.ports.iter().map(|p| (p.name.as_deref(), p.port)),
            opts,
            &obj,
            &mut warnings,
        );
        // Kept for the slice's lifetime: no spare capacity (pushing one port
        // reserved room for four).
        specs.shrink_to_fit();
        let mut endpoints = Vec::with_capacity(slice.endpoints.len());
        for (ei, ep) in slice.endpoints.iter().enumerate() {
            let mut host = None;
            for (ai, addr) in ep.addresses.iter().enumerate() {
                if valid_address(addr, address_type) {
                    host = Some(addr);
                    break;
                }
                warnings.push(
                    SkipReason::InvalidAddress,
                    format!(
                        "{obj}: endpoints[{ei}].addresses[{ai}] {addr:?} is not a valid {} address; skipped",
                        slice.address_type
                    ),
                );
            }
            let Some(host) = host else {
                if ep.addresses.is_empty() {
                    warnings.push(
                        SkipReason::MissingAddress,
                        format!("{obj}: endpoints[{ei}] has no address; skipped"),
                    );
                }
                continue;
            };
            let cond = ep.conditions;
            endpoints.push((
                host.as_str(),
                cond.ready.unwrap_or(true),
                cond.serving.unwrap_or(true),
                cond.terminating.unwrap_or(false),
                opts.topology.then(|| ep.topology.clone()).flatten(),
            ));
        }
        Self {
            warnings: warnings.into_pairs(),
            specs,
            endpoints: SliceEndpoints::pack(endpoints),
        }
    }
}

/// Merges the slices of ONE Service (the caller groups them by the
/// `kubernetes.io/service-name` label).
pub fn from_slices<'a, S: AsLeanSlice + 'a>(
    slices: impl IntoIterator<Item = &'a S>,
    opts: &ConvertOptions,
) -> Converted {
    let contributions: Vec<SliceContribution> = slices
        .into_iter()
        .map(|s| SliceContribution::new(s, opts))
        .collect();
    merge_slices(&contributions, opts)
}

/// Merges the [`SliceContribution`]s of ONE Service, in the caller's stable
/// order (e.g. by slice name): the same result as [`from_slices`] on the
/// slices themselves.
pub fn merge_slices<'a>(
    contributions: impl IntoIterator<Item = &'a SliceContribution>,
    opts: &ConvertOptions,
) -> Converted {
    let mut warnings = Warnings::default();
    let mut candidates: BTreeMap<String, BTreeMap<(CompactString, i32), Candidate>> =
        BTreeMap::new();
    for c in contributions {
        for (reason, message) in &c.warnings {
            warnings.push(*reason, message.clone());
        }
        for spec in &c.specs {
            for key in spec.keys() {
                candidates.entry(key.clone()).or_default();
            }
        }
        for ep in c.endpoints.iter() {
            let host = CompactString::from(ep.host);
            for spec in &c.specs {
                let node = Node::new(host.clone(), spec.number, opts.default_weight)
                    .with_boxed_topology(ep.boxed_topology());
                for key in spec.keys() {
                    let cand = Candidate {
                        node: node.clone(),
                        ready: ep.ready,
                        serving: ep.serving,
                        terminating: ep.terminating,
                    };
                    let per_port = candidates.entry(key.clone()).or_default();
                    let hp = (host.clone(), spec.number);
                    match per_port.get(&hp) {
                        Some(old) if !cand.beats(old) => {}
                        _ => {
                            per_port.insert(hp, cand);
                        }
                    }
                }
            }
        }
    }
    let ports = candidates
        .into_iter()
        .map(|(key, cands)| {
            let draining = |c: Candidate, weight: u32| {
                let mut node = c.node;
                node.draining = Some(true);
                node.weight = weight;
                node
            };
            let nodes: Vec<Node> = match opts.drain_terminating {
                Drain::Always => cands
                    .into_values()
                    .filter_map(|c| {
                        if c.ready {
                            Some(c.node)
                        } else if c.serving && c.terminating {
                            Some(draining(c, 0))
                        } else {
                            None
                        }
                    })
                    .collect(),
                Drain::Off | Drain::Fallback => {
                    let ready: Vec<Node> = cands
                        .values()
                        .filter(|c| c.ready)
                        .map(|c| c.node.clone())
                        .collect();
                    if !ready.is_empty() || opts.drain_terminating == Drain::Off {
                        ready
                    } else {
                        cands
                            .into_values()
                            .filter(|c| c.serving && c.terminating)
                            .map(|c| {
                                let weight = c.node.weight;
                                draining(c, weight)
                            })
                            .collect()
                    }
                }
            };
            (key, nodes)
        })
        .collect();
    warnings.finish(finish(ports))
}

#[cfg(test)]
mod tests;
