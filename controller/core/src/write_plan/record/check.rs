//! The drift checks over the record, pure: what the record shows of a
//! service's objects next to what its desired state wants
//! ([`drift_facts`], judged by the planner's `judge_drift`), whether one
//! watch event needs a closer look ([`suspicious`]), and which services
//! to check after the drift watch (re)listed ([`sweep`]).
//!
//! ```text
//!  drift_facts(key)   wanted_objects(desired) next to the watched objects of key (key index):
//!                     names, resourceVersions (watched, our last write), digests
//!  suspicious(event)  our own write or older ─▶ no;  no source ─▶ an orphan once its cluster
//!                     is listed;  not a name we want ─▶ a stray;  else: not what we want?
//!  sweep              every desired key of the listed clusters that is not intact, and the
//!                     keys of watched objects without a source
//! ```

use std::collections::BTreeSet;
use std::sync::Mutex;

use super::{ObjectSeen, Record, lock, wanted_objects};
use crate::crd::ObjectNaming;
use crate::write_plan::{DesiredView, DriftFacts, DriftResult, ObjName, judge_drift};
use crate::{ServiceKey, ServiceNodes};

/// What the record shows of `key`'s objects next to what `desired`
/// (`None`: no source) wants: gathered, not decided.
pub fn drift_facts(
    record: &Mutex<Record>,
    key: &ServiceKey,
    desired: Option<&ServiceNodes>,
    naming: &ObjectNaming,
    max_ports_bytes: usize,
) -> DriftFacts {
    let present = {
        let r = lock(record);
        if !r.watched() {
            return DriftFacts {
                listed: false,
                wanted: Vec::new(),
                present: Vec::new(),
            };
        }
        r.objects_of(key)
    };
    facts_among(record, desired, present, naming, max_ports_bytes)
}

/// [`drift_facts`] with the watched objects of the key given.
fn facts_among(
    record: &Mutex<Record>,
    desired: Option<&ServiceNodes>,
    present: Vec<ObjName>,
    naming: &ObjectNaming,
    max_ports_bytes: usize,
) -> DriftFacts {
    let wanted = desired
        .map(|d| wanted_objects(d, naming, max_ports_bytes))
        .unwrap_or_default();
    let record = lock(record);
    let wanted = wanted
        .iter()
        .map(|w| w.facts(record.cached(&w.ns, &w.name).map(|s| s.seen())))
        .collect();
    DriftFacts {
        listed: true,
        wanted,
        present,
    }
}

/// Whether a watch event about `obj` (`deleted`: it was deleted) needs a
/// closer look: `Some(true)` yes, `Some(false)` no, `None` not decidable
/// yet (its cluster is not listed). Feed the event to the record first.
pub fn suspicious(
    record: &Mutex<Record>,
    obj: &ObjectSeen<'_>,
    deleted: bool,
    desired: &dyn DesiredView,
    naming: &ObjectNaming,
    max_ports_bytes: usize,
) -> Option<bool> {
    if !deleted && lock(record).ours_or_older(obj.ns, obj.name, obj.resource_version) {
        // Cheap, and the common case: nothing of the desired state is
        // looked at per event of our own writes.
        return Some(false);
    }
    let key = obj.key;
    match desired.nodes(key) {
        None => match desired
            .clusters()
            .into_iter()
            .find(|(id, _)| *id == key.cluster)
            .map(|(_, listed)| listed)
        {
            // Another cluster's object (not configured here): not ours to judge.
            None => Some(false),
            Some(false) => None,
            // No source: an orphan (a deleted one is simply gone).
            Some(true) => Some(!deleted),
        },
        Some(d) => {
            let wanted = wanted_objects(&d, naming, max_ports_bytes);
            let w = wanted.iter().find(|w| w.ns == obj.ns && w.name == obj.name);
            Some(match (w, deleted) {
                // Not a name we want: a stray (a deleted stray is fine).
                (None, d) => !d,
                (Some(_), true) => true,
                (Some(w), false) => !obj.facts.satisfies(w),
            })
        }
    }
}

/// Keys to check after a (re)list of the drift watch: every desired key of
/// the listed clusters that the record does not show intact, and the keys
/// of watched objects without a source (of listed clusters).
pub fn sweep(
    record: &Mutex<Record>,
    desired: &dyn DesiredView,
    naming: &ObjectNaming,
    max_ports_bytes: usize,
) -> Vec<ServiceKey> {
    if !lock(record).watched() {
        return Vec::new();
    }
    let clusters = desired.clusters();
    let listed = |cluster: &str| clusters.iter().any(|(id, l)| *l && id == cluster);
    let mut out = BTreeSet::new();
    for (id, _) in clusters.iter().filter(|(_, l)| *l) {
        for key in desired.keys_of(id) {
            let Some(svc) = desired.nodes(&key) else {
                continue;
            };
            let here = lock(record).objects_of(&key);
            let facts = facts_among(record, Some(&svc), here, naming, max_ports_bytes);
            if judge_drift(&facts) != DriftResult::Intact {
                out.insert(key);
            }
        }
    }
    // Orphans: one pass over the slots, a key is built only for objects
    // of listed clusters.
    let record = lock(record);
    for s in record.cached_slots() {
        if !listed(s.cluster()) {
            continue;
        }
        let key = s.service_key();
        if !out.contains(&key) && desired.version(&key).is_none() {
            out.insert(key);
        }
    }
    out.into_iter().collect()
}

#[cfg(test)]
mod tests;
