//! The drift checks over the record ([`DriftView`]): is what the API
//! server holds for a service what we want? The checks themselves are pure
//! core functions over the record (`kube_discovery_core::write_plan::record`:
//! `drift_facts`, `suspicious` per watch event, `sweep` after a relist);
//! this view locks the record and hands them the desired state.

use std::sync::MutexGuard;
#[cfg(test)]
use std::sync::{Arc, Mutex, PoisonError};

#[cfg(test)]
use kube_discovery_core::crd::{DesiredObjects, DiscoveredService};
use kube_discovery_core::crd::{MAX_OBJECT_PORTS_BYTES, ObjectNaming, Owner};
use kube_discovery_core::write_plan::DriftFacts;
#[cfg(test)]
use kube_discovery_core::write_plan::record::WantedShards;
use kube_discovery_core::write_plan::record::{self, Record};
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
    /// The memo of [`DriftView::intact_of`] (tests).
    #[cfg(test)]
    wanted_shards: Arc<Mutex<WantedShards>>,
}

impl DriftView {
    /// An empty, unlisted view (`DriftView::new` pairs it with its feed).
    pub(super) fn empty(naming: ObjectNaming) -> DriftView {
        DriftView {
            naming,
            record: SharedRecord::default(),
            max_ports_bytes: MAX_OBJECT_PORTS_BYTES,
            #[cfg(test)]
            wanted_shards: Arc::default(),
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

    /// Whether the record shows no watched object.
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

    /// [`Record::intact`] (tests).
    #[cfg(test)]
    pub fn intact(&self, want: &DiscoveredService) -> bool {
        self.lock().intact(want)
    }

    /// [`record::intact_of`] with the view's own memo of wanted shards
    /// (tests; the sink keeps its own).
    #[cfg(test)]
    pub fn intact_of(&self, desired: &DesiredObjects<'_>, index: u32) -> bool {
        let mut shards = self
            .wanted_shards
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        record::intact_of(self.record.mutex(), desired, index, &mut shards)
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
            self.record.mutex(),
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
            self.record.mutex(),
            &obj.seen(&owner),
            deleted,
            shared,
            &self.naming,
            self.max_ports_bytes,
        )
    }

    /// Keys to check after a (re)list ([`record::sweep`]).
    pub(super) fn sweep(&self, shared: &ControllerState) -> Vec<ServiceKey> {
        record::sweep(
            self.record.mutex(),
            shared,
            &self.naming,
            self.max_ports_bytes,
        )
    }
}

#[cfg(test)]
mod tests;
