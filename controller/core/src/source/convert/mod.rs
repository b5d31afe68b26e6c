//! Conversion of Kubernetes endpoint objects into [`PortMap`]s: pure functions,
//! no I/O, every rule unit-tested.
//!
//! * [`from_endpoints`]: `v1/Endpoints`, `subsets[].addresses x subsets[].ports`
//!   (never `notReadyAddresses`, exactly like APISIX).
//! * [`from_slices`]: all `discovery.k8s.io/v1/EndpointSlice`s of one Service
//!   merged, with kube-proxy's condition rules (absent `ready`/`serving` = true,
//!   absent `terminating` = false), de-duplicated by `host:port` (the
//!   non-terminating endpoint wins), and the opt-in draining fallback.
//!
//! Port key: the port `name` when non-empty, else the port number as a string.
//! (APISIX also looks at a `targetPort` there, but neither `EndpointPort` type of
//! the Kubernetes API has that field, so name > number is the effective rule.)
//! With [`ConvertOptions::index_port_numbers`] a named port is additionally
//! indexed under its number, so `ns/name:http` and `ns/name:8080` both resolve.
//!
//! Bad data (an invalid address for the slice's `addressType`, a port outside
//! 1..=65535, a missing port, a duplicate port name, an unknown `addressType`) is
//! skipped with a warning in [`Converted::warnings`]; good data of the same
//! object is kept and nothing panics. Every warning also has a low-cardinality
//! [`SkipReason`], counted in [`Converted::skipped`] (the runtime turns these
//! into the `kube_discovery_source_skipped_total` metric).

mod endpoints;
mod incremental;
mod slices;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

pub use endpoints::from_endpoints;
pub use incremental::{MergeState, Patch};
pub use slices::{SliceContribution, from_slices, merge_slices};

use crate::model::{Node, PortMap};

/// What becomes of endpoints that are serving but terminating (a pod being
/// shut down that still answers): `kube_discovery.drain_terminating`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Drain {
    /// Ready endpoints only (`false`, the default).
    #[default]
    Off,
    /// When a port has no ready endpoint, its serving+terminating ones are
    /// published instead, flagged `draining: true` with their usual weight,
    /// so a gateway keeps answering while a rollout's last old pod drains
    /// (`true`).
    Fallback,
    /// Serving+terminating endpoints are always published next to the ready
    /// ones, flagged `draining: true` with weight 0: a gateway sends them no
    /// new traffic but can finish sticky sessions and open connections
    /// (Kong's drain, Envoy Gateway's DRAINING) (`always`).
    Always,
}

impl Drain {
    /// The setting's value as written in a config file: `false`, `true` or
    /// `"always"`.
    pub fn to_json(self) -> serde_json::Value {
        match self {
            Drain::Off => serde_json::Value::Bool(false),
            Drain::Fallback => serde_json::Value::Bool(true),
            Drain::Always => serde_json::Value::from("always"),
        }
    }
}

/// Knobs of the conversion (from `discovery.kubernetes.default_weight` and the
/// `kube_discovery:` block).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConvertOptions {
    /// Weight of every node (`default_weight`, APISIX default 50).
    pub default_weight: u32,
    /// What to do with serving+terminating endpoints ([`Drain`]).
    /// EndpointSlices only (Endpoints carry no terminating information).
    pub drain_terminating: Drain,
    /// Also index a named port under its number.
    pub index_port_numbers: bool,
    /// Fill `zone`, `nodeName` and `targetRef` of every node.
    pub topology: bool,
    /// Derive Service-port aliases from known Services
    /// ([`crate::source::service::port_extras`]); appProtocols are derived either way.
    pub service_port_aliases: bool,
    /// `kube_discovery.export: opt-in`: only Services annotated
    /// `kubediscovery.io/export: "true"` are published (default: all but
    /// those annotated `"false"`).
    pub export_opt_in: bool,
    /// `kube_discovery.external_name`: `None` = ExternalName Services are
    /// ignored (the default, see Contour's CVE-2021-32783); `Some(allow)` =
    /// an ExternalName Service whose host fully matches one of `allow` is
    /// published, one node per port with the host as `host`.
    pub external_name: Option<Vec<crate::source::filter::AnchoredRegex>>,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        Self {
            default_weight: 50,
            drain_terminating: Drain::Off,
            index_port_numbers: false,
            topology: false,
            service_port_aliases: false,
            export_opt_in: false,
            external_name: None,
        }
    }
}

/// Result of a conversion: the nodes, plus one warning per skipped piece of bad data.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Converted {
    /// Port key -> nodes, sorted by host then port.
    pub ports: PortMap,
    /// Human-readable warnings naming the object and field that was skipped.
    pub warnings: Vec<String>,
    /// How many of `warnings` there are per reason (the counts sum to
    /// `warnings.len()`).
    pub skipped: BTreeMap<SkipReason, u64>,
}

/// Why a piece of a source object was skipped: a small, fixed set (it is a
/// metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SkipReason {
    /// An address that is not valid for its type (IP or FQDN); the address is skipped.
    InvalidAddress,
    /// An EndpointSlice endpoint without any address; the endpoint is skipped.
    MissingAddress,
    /// A port outside 1..=65535; the port is skipped.
    InvalidPort,
    /// A port without a number; the port is skipped.
    MissingPort,
    /// A second port with the same name; the later port is skipped.
    DuplicatePortName,
    /// An EndpointSlice `addressType` other than IPv4/IPv6/FQDN; the slice is skipped.
    UnknownAddressType,
    /// An object without `metadata.name`; the object is skipped.
    MissingName,
    /// An EndpointSlice without the `kubernetes.io/service-name` label; the slice is skipped.
    MissingServiceLabel,
    /// An EndpointSlice whose `kubernetes.io/service-name` label, or an Endpoints
    /// whose name, is no valid Service name (a DNS-1035 label): no Service can
    /// own it, and its object name could collide with another's (`web.1` is
    /// shard 1 of `web`); the object is skipped.
    InvalidServiceName,
    /// A Service annotation (`kubediscovery.io/export`, `kubediscovery.io/weight`)
    /// with an invalid value; the annotation is skipped (the Service is
    /// handled as if it did not have it).
    InvalidAnnotation,
    /// An ExternalName Service whose host is not a DNS name; the Service is skipped.
    InvalidExternalName,
    /// An ExternalName Service whose host no `external_name.allow` regex
    /// matches; the Service is skipped.
    ExternalNameRefused,
}

impl SkipReason {
    /// Every reason, in label order.
    pub const ALL: [SkipReason; 12] = [
        SkipReason::InvalidAddress,
        SkipReason::MissingAddress,
        SkipReason::InvalidPort,
        SkipReason::MissingPort,
        SkipReason::DuplicatePortName,
        SkipReason::UnknownAddressType,
        SkipReason::MissingName,
        SkipReason::MissingServiceLabel,
        SkipReason::InvalidServiceName,
        SkipReason::InvalidAnnotation,
        SkipReason::InvalidExternalName,
        SkipReason::ExternalNameRefused,
    ];

    /// The metric label value (`snake_case`).
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::InvalidAddress => "invalid_address",
            SkipReason::MissingAddress => "missing_address",
            SkipReason::InvalidPort => "invalid_port",
            SkipReason::MissingPort => "missing_port",
            SkipReason::DuplicatePortName => "duplicate_port_name",
            SkipReason::UnknownAddressType => "unknown_address_type",
            SkipReason::MissingName => "missing_name",
            SkipReason::MissingServiceLabel => "missing_service_label",
            SkipReason::InvalidServiceName => "invalid_service_name",
            SkipReason::InvalidAnnotation => "invalid_annotation",
            SkipReason::InvalidExternalName => "invalid_external_name",
            SkipReason::ExternalNameRefused => "external_name_refused",
        }
    }

    /// The reason of the Kubernetes Event that reports it (README, Events):
    /// what a Service says about itself has its own reason on the Service;
    /// skipped endpoint data is `SourceDataSkipped` on the DiscoveredService.
    pub fn event_reason(self) -> &'static str {
        match self {
            SkipReason::InvalidAnnotation => "InvalidAnnotation",
            SkipReason::InvalidExternalName | SkipReason::ExternalNameRefused => {
                "ExternalNameRefused"
            }
            SkipReason::InvalidAddress
            | SkipReason::MissingAddress
            | SkipReason::InvalidPort
            | SkipReason::MissingPort
            | SkipReason::DuplicatePortName
            | SkipReason::UnknownAddressType
            | SkipReason::MissingName
            | SkipReason::MissingServiceLabel
            | SkipReason::InvalidServiceName => crate::crd::conditions::SOURCE_DATA_SKIPPED,
        }
    }
}

impl std::fmt::Display for SkipReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Collects warnings with their reasons while converting.
#[derive(Debug, Default)]
pub(crate) struct Warnings {
    pub messages: Vec<String>,
    pub skipped: BTreeMap<SkipReason, u64>,
    /// The reason of each message, same order as `messages`.
    reasons: Vec<SkipReason>,
}

impl Warnings {
    pub(crate) fn push(&mut self, reason: SkipReason, message: String) {
        self.messages.push(message);
        self.reasons.push(reason);
        *self.skipped.entry(reason).or_insert(0) += 1;
    }

    /// The warnings as `(reason, message)` pairs, in order.
    pub(crate) fn into_pairs(self) -> Vec<(SkipReason, String)> {
        self.reasons.into_iter().zip(self.messages).collect()
    }

    pub(crate) fn finish(self, ports: PortMap) -> Converted {
        Converted {
            ports,
            warnings: self.messages,
            skipped: self.skipped,
        }
    }
}

/// The UID of the owning Service, from `ownerReferences` of kind `Service`.
pub fn owner_service_uid(meta: &ObjectMeta) -> Option<String> {
    meta.owner_references
        .as_ref()?
        .iter()
        .find(|o| {
            o.kind == "Service"
                && (o.api_version == "v1" || o.api_version.is_empty())
                && !o.uid.is_empty()
        })
        .map(|o| o.uid.clone())
}

pub(crate) fn object_name(kind: &str, meta: &ObjectMeta) -> String {
    format!(
        "{kind} {}/{}",
        meta.namespace.as_deref().unwrap_or(""),
        meta.name.as_deref().unwrap_or("")
    )
}

/// Validates a port number; `Err` carries the reason.
pub(crate) fn check_port(port: Option<i32>) -> Result<i32, (SkipReason, String)> {
    match port {
        None => Err((SkipReason::MissingPort, "has no port number".to_string())),
        Some(p) if (1..=65535).contains(&p) => Ok(p),
        Some(p) => Err((
            SkipReason::InvalidPort,
            format!("has port {p} outside 1..65535"),
        )),
    }
}

/// The port key: `name` if non-empty, else the number.
pub(crate) fn port_key(name: Option<&str>, port: i32) -> String {
    match name {
        Some(n) if !n.is_empty() => n.to_string(),
        _ => port.to_string(),
    }
}

/// Address family of an address, per EndpointSlice `addressType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AddressType {
    V4,
    V6,
    Fqdn,
    /// Endpoints: any IP.
    AnyIp,
}

pub(crate) fn valid_address(addr: &str, t: AddressType) -> bool {
    match t {
        AddressType::V4 => addr.parse::<Ipv4Addr>().is_ok(),
        AddressType::V6 => addr.parse::<Ipv6Addr>().is_ok(),
        AddressType::AnyIp => addr.parse::<Ipv4Addr>().is_ok() || addr.parse::<Ipv6Addr>().is_ok(),
        AddressType::Fqdn => k8s_syntax::is_dns_name(addr.strip_suffix('.').unwrap_or(addr)),
    }
}

/// One validated port of an object: key, number, and its alias under the number.
#[derive(Debug, Clone)]
pub(crate) struct PortSpec {
    pub key: String,
    pub number: i32,
    pub alias: Option<String>,
}

impl PortSpec {
    pub(crate) fn keys(&self) -> impl Iterator<Item = &String> {
        std::iter::once(&self.key).chain(self.alias.iter())
    }
}

/// Validates a list of `(name, port)` pairs of one subset/slice. Invalid or
/// duplicate-name ports are skipped with a warning.
pub(crate) fn validate_ports<'a>(
    ports: impl Iterator<Item = (Option<&'a str>, Option<i32>)>,
    opts: &ConvertOptions,
    what: &str,
    warnings: &mut Warnings,
) -> Vec<PortSpec> {
    let mut out: Vec<PortSpec> = Vec::new();
    for (i, (name, port)) in ports.enumerate() {
        let number = match check_port(port) {
            Ok(p) => p,
            Err((reason, why)) => {
                warnings.push(reason, format!("{what}: ports[{i}] {why}; port skipped"));
                continue;
            }
        };
        let key = port_key(name, number);
        let named = name.is_some_and(|n| !n.is_empty());
        if named && out.iter().any(|p| p.key == key) {
            warnings.push(
                SkipReason::DuplicatePortName,
                format!("{what}: ports[{i}] duplicates port name {key:?}; port skipped"),
            );
            continue;
        }
        let alias = (named && opts.index_port_numbers).then(|| number.to_string());
        out.push(PortSpec { key, number, alias });
    }
    out
}

/// Sorts every port's nodes and removes exact `host:port` duplicates (the first
/// occurrence wins; callers order candidates by preference first).
///
/// The result is kept (in the index) for as long as the service lives, so the
/// node lists drop the spare capacity they grew while being pushed into, and
/// the map is built from the sorted `BTreeMap` at its exact size.
pub(crate) fn finish(ports: BTreeMap<String, Vec<Node>>) -> PortMap {
    ports
        .into_iter()
        .map(|(key, mut nodes)| {
            crate::model::sort_nodes(&mut nodes);
            nodes.dedup_by(|b, a| a.host == b.host && a.port == b.port);
            nodes.shrink_to_fit();
            (key, nodes)
        })
        .collect()
}
