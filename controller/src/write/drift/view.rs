//! The drift checks over the record ([`DriftView`]): is what the API
//! server holds for a service what we want? Also the checks
//! the drift watch makes per event (`suspicious`) and after a relist
//! (`sweep`).
//!
//! ```text
//!  facts(key, desired)   wanted_objects(desired) next to the cached objects of key (key index):
//!                        names, resourceVersions (cached, our last write), digests
//!    ─▶ judged by the planner (write_plan::judge_drift): Deleted / Edited / Stale / Orphan / Ok
//! ```

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use kube_discovery_core::crd::{
    DesiredObjects, DiscoveredService, MAX_OBJECT_PORTS_BYTES, ObjectNaming, Owner,
};
use kube_discovery_core::write_plan::record::{Record, WantedObject, wanted_objects};
use kube_discovery_core::write_plan::{DriftFacts, DriftResult, judge_drift};
use kube_discovery_core::{ServiceKey, ServiceNodes};

#[cfg(test)]
use super::DriftCheck;
use super::ObjName;
use super::decode::Watched;
use crate::state::ControllerState;
use crate::write::record::SharedRecord;

/// The drift checks over the record of our own objects
/// ([`crate::write::record`]).
#[derive(Clone)]
pub struct DriftView {
    pub(super) naming: ObjectNaming,
    record: SharedRecord,
    /// The object size bound of `desired_objects` (tests use small ones).
    pub(super) max_ports_bytes: usize,
    /// The wanted form of shards `i > 0` by `(namespace, name)`, with the
    /// service and `spec.version` it was built for ([`DriftView::intact_of`]).
    shard_wants: Arc<Mutex<ShardWants>>,
}

/// [`DriftView::shard_wants`]: `(namespace, name)` -> (service, shard
/// version, wanted form).
type ShardWants = HashMap<ObjName, (ServiceKey, String, WantedObject)>;

/// [`DriftView::shard_wants`] is emptied when it grows beyond this many
/// shards (a memo: entries of deleted services are never looked up again,
/// and any entry is rebuilt on demand).
const SHARD_WANTS_MAX: usize = 65_536;

impl DriftView {
    /// An empty, unlisted view (`DriftView::new` pairs it with its feed).
    pub(super) fn empty(naming: ObjectNaming) -> DriftView {
        DriftView {
            naming,
            record: SharedRecord::default(),
            max_ports_bytes: MAX_OBJECT_PORTS_BYTES,
            shard_wants: Arc::default(),
        }
    }

    /// The record the drift watch feeds (the sink shares it).
    pub fn record(&self) -> &SharedRecord {
        &self.record
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Record> {
        self.record.lock()
    }

    /// The object naming.
    pub fn naming(&self) -> &ObjectNaming {
        &self.naming
    }

    /// Whether the first list of the drift watch is in the record.
    pub fn ready(&self) -> bool {
        self.lock().watched()
    }

    /// Number of watched objects in the record.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether the (live) cache holds no object.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Our write of `ns/name` was answered with `rv` (`None`: deleted), as
    /// the sink records it (tests).
    #[cfg(test)]
    pub fn note_written(&self, ns: &str, name: &str, rv: Option<u64>) {
        match rv {
            Some(_) => self.lock().written(ns, name, rv, None),
            None => self.lock().removed(ns, name),
        }
    }

    /// Whether the watch event `w` is our own last write of it or older:
    /// it needs no comparison (a change of the desired state since then is
    /// queued as a write anyway).
    pub(super) fn ours_or_older(&self, w: &Watched) -> bool {
        self.lock()
            .ours_or_older(w.ns(), w.name(), w.resource_version())
    }

    /// Whether the object `want` names is intact in the cache: cached, not
    /// older than our last write of it, and [`matches()`](super::matches) `want` (status is not
    /// compared). A repair skips such objects (the sink's apply would only
    /// move their `lastSyncTime`); unknown or stale counts as not intact.
    pub fn intact(&self, want: &DiscoveredService) -> bool {
        let w = WantedObject::of(want);
        self.lock()
            .cached(&w.ns, &w.name)
            .is_some_and(|s| !s.older_than_our_write() && s.satisfies(&w))
    }

    /// [`DriftView::intact`] of object `index` of `desired`, building it
    /// only when the answer needs it: not for an object the cache does not
    /// hold (or holds older than our write), and not for a shard `i > 0`
    /// whose wanted form is remembered for its `spec.version`.
    ///
    /// Why remembering is exact: a shard `i > 0` carries the version of its
    /// own content (`kube_discovery_core::crd::shards::shard_version`: its nodes,
    /// index, count, source, owner and extras), and everything else of it
    /// follows from its service and the naming, so the same service and
    /// version mean the same wanted object, which is compared with the
    /// cached copy as before (a hand edit of its nodes is still seen). Why
    /// it matters: a write of one change in a 100,000-endpoint service asks
    /// this of 15 shards; building them copied every node (issue 19 item 2).
    pub fn intact_of(&self, desired: &DesiredObjects<'_>, index: u32) -> bool {
        let (ns, name) = desired.name(index);
        let current = |record: &Record| {
            record
                .cached(&ns, &name)
                .is_some_and(|s| !s.older_than_our_write())
        };
        if !current(&self.lock()) {
            return false;
        }
        let want = if desired.is_later_shard(index) {
            self.shard_want(desired, index, (ns.clone(), name.clone()))
        } else {
            desired.object(index).map(|o| WantedObject::of(&o))
        };
        let Some(want) = want else { return false };
        self.lock()
            .cached(&ns, &name)
            .is_some_and(|s| !s.older_than_our_write() && s.satisfies(&want))
    }

    /// The wanted form of shard `index > 0` of `desired` named `at`,
    /// remembered per service and version ([`DriftView::intact_of`]).
    fn shard_want(
        &self,
        desired: &DesiredObjects<'_>,
        index: u32,
        at: ObjName,
    ) -> Option<WantedObject> {
        let key = &desired.service().key;
        let version = desired.version(index);
        let lock = || {
            self.shard_wants
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
        };
        if let Some((k, v, w)) = lock().get(&at)
            && k == key
            && v == version
        {
            return Some(w.clone());
        }
        let want = WantedObject::of(&desired.object(index)?);
        let mut wants = lock();
        if wants.len() >= SHARD_WANTS_MAX {
            wants.clear();
        }
        wants.insert(at, (key.clone(), version.to_string(), want.clone()));
        Some(want)
    }

    /// Who holds `ns/name` when that is not this instance (another
    /// instance, or a hand-made object), as the watch last showed it.
    pub fn taken(&self, ns: &str, name: &str) -> Option<Owner> {
        self.lock().taken(ns, name).cloned()
    }

    /// Every cached object that describes `key` (by its spec): an index
    /// lookup, O(objects of `key`).
    pub fn objects_of(&self, key: &ServiceKey) -> Vec<ObjName> {
        self.lock().objects_of(key)
    }

    /// What the cache shows of `key`'s objects next to what the desired
    /// state (`None`: no source) wants, for the planner to judge
    /// ([`kube_discovery_core::write_plan::judge_drift`]): gathered, not
    /// decided.
    pub fn facts(&self, key: &ServiceKey, desired: Option<&ServiceNodes>) -> DriftFacts {
        if !self.ready() {
            return DriftFacts {
                listed: false,
                wanted: Vec::new(),
                present: Vec::new(),
            };
        }
        self.facts_among(desired, self.objects_of(key))
    }

    /// [`DriftView::facts`] with the cached objects of the key given.
    fn facts_among(&self, desired: Option<&ServiceNodes>, present: Vec<ObjName>) -> DriftFacts {
        let wanted = desired
            .map(|d| wanted_objects(d, &self.naming, self.max_ports_bytes))
            .unwrap_or_default();
        let record = self.lock();
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

    /// The planner's verdict on the cache and the desired state of `key`
    /// (`None`: no source), as the tests ask it.
    #[cfg(test)]
    pub fn check(&self, key: &ServiceKey, desired: Option<&ServiceNodes>) -> DriftCheck {
        DriftCheck::from(judge_drift(&self.facts(key, desired)))
    }

    /// Whether a watch event about `obj` needs a closer look by the writer:
    /// `Some(true)` yes, `Some(false)` no, `None` not decidable yet (its
    /// cluster is not listed).
    pub(super) fn suspicious(
        &self,
        obj: &Watched,
        deleted: bool,
        shared: &ControllerState,
    ) -> Option<bool> {
        if !deleted && self.ours_or_older(obj) {
            // Cheap, and the common case: nothing of the desired state is
            // looked at per event of our own writes.
            return Some(false);
        }
        let key = &obj.key;
        let listed = shared
            .clusters()
            .get(key.cluster.as_str())
            .map(|c| c.listed);
        match shared.desired(key) {
            None => match listed {
                // Another cluster's object (not configured here): not ours to judge.
                None => Some(false),
                Some(false) => None,
                // No source: an orphan (a deleted one is simply gone).
                Some(true) => Some(!deleted),
            },
            Some(d) => {
                let wanted = wanted_objects(&d, &self.naming, self.max_ports_bytes);
                let w = wanted
                    .iter()
                    .find(|w| w.ns == obj.ns() && w.name == obj.name());
                Some(match (w, deleted) {
                    // Not a name we want: a stray (a deleted stray is fine).
                    (None, d) => !d,
                    (Some(_), true) => true,
                    (Some(w), false) => !obj.facts.satisfies(w),
                })
            }
        }
    }

    /// Keys to check after a (re)list: every desired key of the listed
    /// clusters, and the keys of cached objects without a source.
    pub(super) fn sweep(&self, shared: &ControllerState) -> Vec<ServiceKey> {
        let clusters = shared.clusters();
        let mut out = BTreeSet::new();
        if !self.ready() {
            return Vec::new();
        }
        for (id, status) in &clusters {
            if !status.listed {
                continue;
            }
            for svc in shared.desired_of(id) {
                let here = self.objects_of(&svc.key);
                if judge_drift(&self.facts_among(Some(&svc), here)) != DriftResult::Intact {
                    out.insert(svc.key.clone());
                }
            }
        }
        // Orphans: one pass over the slots, a key is built only for objects
        // of listed clusters. (ControllerState's locks are only ever taken inside its
        // own methods, so calling it under the cache lock cannot deadlock.)
        let record = self.lock();
        for s in record.cached_slots() {
            if !clusters.get(s.cluster()).is_some_and(|c| c.listed) {
                continue;
            }
            let key = s.service_key();
            if !out.contains(&key) && !shared.has_desired(&key) {
                out.insert(key);
            }
        }
        out.into_iter().collect()
    }
}

#[cfg(test)]
mod tests;
