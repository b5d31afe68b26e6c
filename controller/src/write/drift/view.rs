//! The drift checks over the record ([`DriftView`]): is what the API
//! server holds for a service what we want? The checks themselves are pure
//! core functions over the record (`kube_discovery_core::write_plan::record`:
//! `drift_facts`, `suspicious` per watch event, `sweep` after a relist);
//! this view locks the record and hands them the desired state, and answers
//! the sink which objects are intact (remembering the wanted form of
//! shards, [`DriftView::intact_of`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use kube_discovery_core::crd::{
    DesiredObjects, DiscoveredService, MAX_OBJECT_PORTS_BYTES, ObjectNaming, Owner,
};
use kube_discovery_core::write_plan::DriftFacts;
use kube_discovery_core::write_plan::record::{self, Record, WantedObject};
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
    /// queued as a write anyway). Tests.
    #[cfg(test)]
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

    /// What the record shows of `key`'s objects next to what the desired
    /// state (`None`: no source) wants, for the planner to judge
    /// ([`kube_discovery_core::write_plan::judge_drift`]): gathered, not
    /// decided ([`record::drift_facts`]).
    pub fn facts(&self, key: &ServiceKey, desired: Option<&ServiceNodes>) -> DriftFacts {
        record::drift_facts(
            &self.lock(),
            key,
            desired,
            &self.naming,
            self.max_ports_bytes,
        )
    }

    /// The planner's verdict on the record and the desired state of `key`
    /// (`None`: no source), as the tests ask it.
    #[cfg(test)]
    pub fn check(&self, key: &ServiceKey, desired: Option<&ServiceNodes>) -> DriftCheck {
        DriftCheck::from(kube_discovery_core::write_plan::judge_drift(
            &self.facts(key, desired),
        ))
    }

    /// Whether a watch event about `obj` (already in the record) needs a
    /// closer look by the writer ([`record::suspicious`]).
    pub(super) fn suspicious(
        &self,
        obj: &Watched,
        deleted: bool,
        shared: &ControllerState,
    ) -> Option<bool> {
        let owner = obj.owner(&self.naming);
        record::suspicious(
            &self.lock(),
            &obj.seen(&owner),
            deleted,
            shared,
            &self.naming,
            self.max_ports_bytes,
        )
    }

    /// Keys to check after a (re)list ([`record::sweep`]). The record is
    /// locked for the whole sweep (a sweep follows a relist only; the sink
    /// waits for it at its next request).
    pub(super) fn sweep(&self, shared: &ControllerState) -> Vec<ServiceKey> {
        record::sweep(&self.lock(), shared, &self.naming, self.max_ports_bytes)
    }
}

#[cfg(test)]
mod tests;
