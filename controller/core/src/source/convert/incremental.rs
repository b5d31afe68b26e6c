//! The merge of a big Service's EndpointSlices, kept up to date per slice
//! change.
//!
//! [`super::merge_slices`] rebuilds a Service from all its slices: right for
//! a Service of a few slices, but one endpoint change in a Service of
//! thousands of slices then re-merges every endpoint. [`MergeState`]
//! keeps what the merge needs to be updated instead:
//!
//! ```text
//!  port key ──▶ (host, port) ──▶ [contribution of slice s, #k; ...] (slice-name order)
//!                                  └─ winner (kube-proxy's rule) ──▶ output node or none
//!           └─ refs: how many slice ports name the key (the key exists while > 0)
//!           └─ ready: how many winners are ready (drain_terminating: true falls
//!              back to the draining nodes when there is none)
//! ```
//!
//! A slice change removes the slice's old contributions and adds its new
//! ones (O(slice)), recomputes the winner of each `(host, port)` it touched,
//! and returns a [`Patch`]: the output nodes that changed. [`Patch::apply`]
//! patches the Service's sorted node lists in place and keeps its
//! [`Buckets`] (its version, the writer's shard sizes and versions) up to
//! date, so nothing of the other endpoints is copied or hashed again. The rules are exactly those of
//! [`super::merge_slices`] (unit-tested against it over random slice
//! histories): the non-terminating contribution wins, then the ready one,
//! then the first in slice-name order (then endpoint order in the slice);
//! only the winners count; the port-level draining fallback flips a whole
//! port (the patch then replaces its list).
//!
//! Memory: a second copy of every host of the Service (the merged lists hold
//! the first). The index keeps a state only for Services with many slices
//! (`index::INCREMENTAL_MIN_SLICES`), so the usual small Service costs
//! nothing more.

use std::collections::BTreeMap;
use std::sync::Arc;

use compact_str::CompactString;

use super::{ConvertOptions, Drain, SliceContribution};
use crate::crd::shards::Buckets;
use crate::model::{Node, NodeTopology, PortMap};

/// A node's identity within one port key.
type HostPort = (CompactString, i32);

/// What one slice says about one `(port key, host, port)`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    /// The slice's name (shared by all entries of the slice).
    slice: Arc<str>,
    /// Position in the slice's emission order (endpoint, port, key), which
    /// breaks ties within one slice the way `merge_slices`' loop does.
    seq: u32,
    ready: bool,
    serving: bool,
    terminating: bool,
    topology: Option<Box<NodeTopology>>,
}

impl Entry {
    /// `merge_slices`' `Candidate::beats`: whether `self` replaces `old`.
    fn beats(&self, old: &Entry) -> bool {
        (old.terminating && !self.terminating)
            || (old.terminating == self.terminating && !old.ready && self.ready)
    }
}

/// The winner among the contributions of one `(host, port)`, which are kept
/// in merge order.
fn winner(entries: &[Entry]) -> Option<&Entry> {
    let mut it = entries.iter();
    let first = it.next()?;
    Some(it.fold(first, |w, e| if e.beats(w) { e } else { w }))
}

/// One port key of the state.
#[derive(Debug, Clone, Default)]
struct PortState {
    refs: usize,
    cands: BTreeMap<HostPort, Vec<Entry>>,
    /// Winners that are ready.
    ready: usize,
}

/// A port key a slice change touches, as it was before the change.
#[derive(Debug, Default)]
struct Touched {
    /// Whether the key existed.
    existed: bool,
    /// Whether it had a ready winner.
    had_ready: bool,
    /// The output of each touched `(host, port)`.
    before: BTreeMap<HostPort, Option<Node>>,
}

/// See the module docs.
#[derive(Debug, Clone)]
pub struct MergeState {
    drain: Drain,
    /// The weight of every published node (the Service's annotation, else
    /// `default_weight`); draining nodes of `drain_terminating: always`
    /// have 0, like `Index::build` gives them.
    weight: u32,
    ports: BTreeMap<String, PortState>,
}

/// What a slice change did to the merged node lists (see [`Patch::apply`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Patch {
    ports: Vec<(String, PortPatch)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum PortPatch {
    /// The key is gone.
    Remove,
    /// The key's whole list (a new key, or the draining fallback flipped).
    Set(Vec<Node>),
    /// These nodes changed (`None`: removed), identified by host and port.
    Nodes(Vec<(HostPort, Option<Node>)>),
}

impl Patch {
    /// Whether the change left every node list as it was.
    pub fn is_empty(&self) -> bool {
        self.ports.is_empty()
    }

    /// Applies the patch to `ports` (the merged lists the state was built
    /// for) and updates their buckets (`digest`: their version, sizes); O(changed nodes x log n) plus the
    /// moves of a `Vec` insert or remove. Returns whether anything changed.
    pub fn apply(self, ports: &mut PortMap, digest: &mut Buckets) -> bool {
        let mut changed = false;
        for (key, patch) in self.ports {
            match patch {
                PortPatch::Remove => {
                    if let Some(old) = ports.remove(&key) {
                        old.iter().for_each(|n| digest.remove(&key, n));
                        changed = true;
                    }
                }
                PortPatch::Set(list) => {
                    if ports.get(&key) == Some(&list) {
                        continue;
                    }
                    list.iter().for_each(|n| digest.add(&key, n));
                    if let Some(old) = ports.insert(key.clone(), list) {
                        old.iter().for_each(|n| digest.remove(&key, n));
                    }
                    changed = true;
                }
                PortPatch::Nodes(nodes) => {
                    if ports.get(&key).is_none() {
                        ports.insert(key.clone(), Vec::new());
                    }
                    let Some(list) = ports.get_mut(&key) else {
                        continue;
                    };
                    for ((host, port), new) in nodes {
                        let at = list.binary_search_by(|n| {
                            (n.host.as_str(), n.port).cmp(&(host.as_str(), port))
                        });
                        match (at, new) {
                            (Ok(i), Some(node)) => {
                                digest.remove(&key, &list[i]);
                                digest.add(&key, &node);
                                list[i] = node;
                            }
                            (Ok(i), None) => {
                                digest.remove(&key, &list[i]);
                                list.remove(i);
                            }
                            (Err(i), Some(node)) => {
                                digest.add(&key, &node);
                                list.insert(i, node);
                            }
                            (Err(_), None) => continue,
                        }
                        changed = true;
                    }
                    // A list that grew by one doubled its capacity: the
                    // index keeps it for long, so give the room back once
                    // it is more than a sixteenth.
                    if list.capacity() > list.len() + list.len() / 16 + 16 {
                        list.shrink_to_fit();
                    }
                }
            }
        }
        changed
    }
}

/// Every `(port key, host, port)` a contribution emits, in `merge_slices`'
/// order, with its entry.
fn emissions<'a>(
    slice: &'a Arc<str>,
    c: &'a SliceContribution,
) -> impl Iterator<Item = (&'a String, HostPort, Entry)> + 'a {
    let mut seq = 0u32;
    c.endpoints()
        .iter()
        .flat_map(move |ep| {
            c.specs()
                .iter()
                .flat_map(move |spec| spec.keys().map(move |key| (key, ep, spec.number)))
        })
        .map(move |(key, ep, number)| {
            let entry = Entry {
                slice: Arc::clone(slice),
                seq,
                ready: ep.ready,
                serving: ep.serving,
                terminating: ep.terminating,
                topology: ep.boxed_topology(),
            };
            seq = seq.saturating_add(1);
            (key, (ep.host.into(), number), entry)
        })
}

impl MergeState {
    /// The state of a Service whose slices are `slices` (name, contribution),
    /// its nodes published with `weight`.
    pub fn new<'a>(
        opts: &ConvertOptions,
        weight: u32,
        slices: impl IntoIterator<Item = (&'a str, &'a SliceContribution)>,
    ) -> Self {
        let mut s = Self {
            drain: opts.drain_terminating,
            weight,
            ports: BTreeMap::new(),
        };
        for (name, c) in slices {
            let name: Arc<str> = Arc::from(name);
            s.add(&name, c);
            // Nothing was output before: the counts are all there is to keep.
        }
        for ps in s.ports.values_mut() {
            ps.ready = ps
                .cands
                .values()
                .filter(|e| winner(e).is_some_and(|w| w.ready))
                .count();
        }
        s
    }

    /// Adds the entries and port refs of `c` (the ready counts are the
    /// caller's business).
    fn add(&mut self, slice: &Arc<str>, c: &SliceContribution) {
        for spec in c.specs() {
            for key in spec.keys() {
                self.ports.entry(key.clone()).or_default().refs += 1;
            }
        }
        for (key, hp, entry) in emissions(slice, c) {
            let list = self
                .ports
                .entry(key.clone())
                .or_default()
                .cands
                .entry(hp)
                .or_default();
            let at = list
                .binary_search_by(|e| (&*e.slice, e.seq).cmp(&(&*entry.slice, entry.seq)))
                .unwrap_or_else(|i| i);
            list.insert(at, entry);
        }
    }

    /// Removes the entries and port refs of `c`, which `slice` added before.
    fn remove(&mut self, slice: &Arc<str>, c: &SliceContribution) {
        for (key, hp, _) in emissions(slice, c) {
            let Some(ps) = self.ports.get_mut(key) else {
                continue;
            };
            if let Some(list) = ps.cands.get_mut(&hp) {
                list.retain(|e| *e.slice != **slice);
                if list.is_empty() {
                    ps.cands.remove(&hp);
                }
            }
        }
        for spec in c.specs() {
            for key in spec.keys() {
                if let Some(ps) = self.ports.get_mut(key) {
                    ps.refs = ps.refs.saturating_sub(1);
                }
            }
        }
    }

    /// The output node of a winner, given whether its port has a ready one.
    fn output(&self, hp: &HostPort, w: &Entry, has_ready: bool) -> Option<Node> {
        let node = |weight: u32, draining: bool| {
            let mut n =
                Node::new(hp.0.clone(), hp.1, weight).with_boxed_topology(w.topology.clone());
            if draining {
                n.draining = Some(true);
            }
            n
        };
        let drains = w.serving && w.terminating;
        match self.drain {
            Drain::Always if w.ready => Some(node(self.weight, false)),
            Drain::Always if drains => Some(node(0, true)),
            Drain::Off | Drain::Always => w.ready.then(|| node(self.weight, false)),
            Drain::Fallback if has_ready => w.ready.then(|| node(self.weight, false)),
            Drain::Fallback => drains.then(|| node(self.weight, true)),
        }
    }

    /// The output of `(key, hp)` now.
    fn output_of(&self, key: &str, hp: &HostPort) -> Option<Node> {
        let ps = self.ports.get(key)?;
        let w = winner(ps.cands.get(hp)?)?;
        self.output(hp, w, ps.ready > 0)
    }

    /// The whole sorted list of `key`.
    fn port_nodes(&self, key: &str) -> Vec<Node> {
        let Some(ps) = self.ports.get(key) else {
            return Vec::new();
        };
        let mut out: Vec<Node> = ps
            .cands
            .iter()
            .filter_map(|(hp, list)| self.output(hp, winner(list)?, ps.ready > 0))
            .collect();
        out.shrink_to_fit();
        out
    }

    /// The merged node lists: what `merge_slices` gives for the slices
    /// (with this state's weight, as `Index::build` would set it).
    pub fn ports(&self) -> PortMap {
        self.ports
            .iter()
            .filter(|(_, ps)| ps.refs > 0)
            .map(|(k, _)| (k.clone(), self.port_nodes(k)))
            .collect()
    }

    /// Slice `slice` changed from `old` to `new` (`None`: it was not part
    /// of the Service before / is not any more). Returns the change of the
    /// merged lists.
    pub fn replace_slice(
        &mut self,
        slice: &str,
        old: Option<&SliceContribution>,
        new: Option<&SliceContribution>,
    ) -> Patch {
        let slice: Arc<str> = Arc::from(slice);
        // Every (key, host:port) the change can touch, and each touched
        // key's state before: did it exist, did it have a ready winner.
        let mut touched: BTreeMap<String, Touched> = BTreeMap::new();
        for c in old.iter().chain(new.iter()) {
            for spec in c.specs() {
                for key in spec.keys() {
                    self.touch(&mut touched, key);
                }
            }
            for (key, hp, _) in emissions(&slice, c) {
                self.touch(&mut touched, key);
                if let Some(t) = touched.get_mut(key)
                    && !t.before.contains_key(&hp)
                {
                    let before = self.output_of(key, &hp);
                    // The winner's readiness leaves the count; the new
                    // winner's joins it below.
                    if let Some(ps) = self.ports.get_mut(key)
                        && ps
                            .cands
                            .get(&hp)
                            .and_then(|l| winner(l))
                            .is_some_and(|w| w.ready)
                    {
                        ps.ready -= 1;
                    }
                    t.before.insert(hp, before);
                }
            }
        }
        if let Some(c) = old {
            self.remove(&slice, c);
        }
        if let Some(c) = new {
            self.add(&slice, c);
        }
        for (key, t) in &touched {
            if let Some(ps) = self.ports.get_mut(key) {
                let now_ready = t
                    .before
                    .keys()
                    .filter(|hp| {
                        ps.cands
                            .get(*hp)
                            .and_then(|l| winner(l))
                            .is_some_and(|w| w.ready)
                    })
                    .count();
                ps.ready += now_ready;
            }
        }
        let mut patch = Patch::default();
        for (key, t) in touched {
            let Touched {
                existed,
                had_ready,
                before: hps,
            } = t;
            let exists = self.ports.get(&key).is_some_and(|ps| ps.refs > 0);
            if !exists {
                self.ports.remove(&key);
            }
            let port = match (existed, exists) {
                (false, false) => continue,
                (true, false) => PortPatch::Remove,
                (false, true) => PortPatch::Set(self.port_nodes(&key)),
                (true, true) => {
                    let has_ready = self.ports.get(&key).is_some_and(|ps| ps.ready > 0);
                    if self.drain == Drain::Fallback && has_ready != had_ready {
                        PortPatch::Set(self.port_nodes(&key))
                    } else {
                        let nodes: Vec<(HostPort, Option<Node>)> = hps
                            .into_iter()
                            .filter_map(|(hp, before)| {
                                let after = self.output_of(&key, &hp);
                                (after != before).then_some((hp, after))
                            })
                            .collect();
                        if nodes.is_empty() {
                            continue;
                        }
                        PortPatch::Nodes(nodes)
                    }
                }
            };
            patch.ports.push((key, port));
        }
        patch
    }

    /// Records `key` as touched with its state before the change.
    fn touch(&self, touched: &mut BTreeMap<String, Touched>, key: &String) {
        if !touched.contains_key(key) {
            let ps = self.ports.get(key);
            touched.insert(
                key.clone(),
                Touched {
                    existed: ps.is_some_and(|p| p.refs > 0),
                    had_ready: ps.is_some_and(|p| p.ready > 0),
                    before: BTreeMap::new(),
                },
            );
        }
    }
}

#[cfg(test)]
mod tests;
