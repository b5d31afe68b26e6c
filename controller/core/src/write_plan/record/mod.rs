//! The one record of what the API server holds of our objects: per object a
//! slim slot (spec / owner digests, our labels and stamp present, the
//! resourceVersions of the watched copy and of our last write, the
//! generation; or whose the name is when it is not ours), per service the
//! conditions shard 0 holds and the version and shard slots of its objects.
//! Plain data, no I/O: the runtime keeps one behind a lock and feeds it; the
//! planner, the writes and the drift checks read it.
//!
//! ```text
//!  start-up list (sink) ──── list_begins,             ┐
//!                            listed(ticket, Listing) ─┤
//!  drift watch (feed.rs) ─── init / init_apply /     ├─▶ Record ─▶ held / prior (the planner),
//!                            init_done / apply /     │            next_generation, conditions,
//!                            delete(ObjectSeen)      │            taken, objects_of, cached
//!  answers to our writes ─── written / removed /     │            (the sink, the drift view,
//!                            conditions_written /    │            the planner's drift facts)
//!                            service_written / _removed ┘
//! ```
//!
//! * Per service, the version and shard slots (`services.rs`) are what the
//!   planner skips no-ops against and starts a write from; a start-up list
//!   landing late never overwrites the answers of writes made while it ran.
//!
//! * A relist of the drift watch is built apart and swapped in at
//!   `init_done` (what kube-runtime's store does), keeping the versions of
//!   our writes and the generations; until then everything reads the old
//!   objects.
//! * The generation is what a write stamps into `status.observedGeneration`
//!   (`generation + 1`): only a higher one is taken from the watch (an
//!   event may be older than our write's answer), a write's answer sets it,
//!   a delete forgets it. A wrong guess costs one corrective apply, never a
//!   wrong stamp (the sink checks every answer).
//! * Conditions are kept under a 64-bit hash of the service key (a
//!   collision could only carry a time or an Event decision over to another
//!   service), reduced to what a write reads back (`kept.rs`).
//! * Names held by others come from the start-up list until the drift
//!   watch has listed, then from the watch.
//! * The functions that read a shared record while they compare it with
//!   the desired state (`check.rs`, `intact.rs`) take the `Mutex` and lock
//!   it only around their reads: building wanted objects (a big service's
//!   shards) never blocks the drift watch or a write's answer.

mod check;
mod facts;
mod intact;
mod kept;
mod objects;
mod services;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Mutex, MutexGuard, PoisonError};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

pub use self::check::{drift_facts, suspicious, sweep};
pub use self::facts::{
    Facts, Owners, WantedObject, matches, ports_digest, stamp_ok, wanted_objects,
};
pub use self::intact::{RecordView, WantedShards, intact_of};
use self::kept::Kept;
pub use self::objects::Slot;
use self::objects::{Objects, pack_rv};
pub use self::services::{Found, FoundShard, versions_of};
use self::services::{Service, Services};
use super::compact::PackedKey;
use super::{Held, ObjName, Prior};
use crate::ServiceKey;
use crate::crd::Owner;

/// One object as the drift watch shows it, decoded by the runtime.
#[derive(Debug, Clone, Copy)]
pub struct ObjectSeen<'a> {
    /// Its namespace.
    pub ns: &'a str,
    /// Its name.
    pub name: &'a str,
    /// The service its spec describes.
    pub key: &'a ServiceKey,
    /// Whose it is (adopted instances counted as ours).
    pub owner: &'a Owner,
    /// What drift compares of it.
    pub facts: &'a Facts,
    /// Its `metadata.resourceVersion`.
    pub resource_version: Option<u64>,
    /// Its `metadata.generation`.
    pub generation: Option<i64>,
}

/// What the sink's start-up list found, gathered page by page and handed
/// to [`Record::listed`] in one piece.
#[derive(Debug, Default)]
pub struct Listing {
    generations: Vec<(ObjName, i64)>,
    conditions: HashMap<u64, Kept>,
    foreign: HashMap<ObjName, Owner>,
    services: HashMap<PackedKey, Service>,
}

impl Listing {
    /// What the API server holds of `key`'s objects ([`Found::versions`]).
    pub fn service(&mut self, key: &ServiceKey, held: &Held) {
        self.services.insert(
            PackedKey::new(key),
            Service::new(&held.version, held.shards),
        );
    }

    /// An object of ours at `generation`.
    pub fn ours(&mut self, name: ObjName, generation: i64) {
        self.generations.push((name, generation));
    }

    /// The conditions of shard 0 of `key`.
    pub fn conditions(&mut self, key: &ServiceKey, conditions: &[Condition]) {
        self.conditions
            .insert(service_hash(key), Kept::of(conditions));
    }

    /// An object that is not ours.
    pub fn foreign(&mut self, name: ObjName, owner: Owner) {
        self.foreign.insert(name, owner);
    }

    /// How many objects are not ours.
    pub fn foreign_len(&self) -> usize {
        self.foreign.len()
    }
}

/// `record` locked (a poisoned lock is taken over: the record is plain
/// data, consistent after every call). The functions over a shared record
/// lock it only around their reads, never while they build wanted objects.
fn lock(record: &Mutex<Record>) -> MutexGuard<'_, Record> {
    record.lock().unwrap_or_else(PoisonError::into_inner)
}

fn service_hash(key: &ServiceKey) -> u64 {
    let mut h = DefaultHasher::new();
    key.hash(&mut h);
    h.finish()
}

/// See the module docs.
pub struct Record {
    live: Objects,
    /// `init` .. `init_done` of a relist, like the store's buffer.
    relist: Option<Objects>,
    /// Whether the drift watch has listed once.
    watched: bool,
    /// Per service (hashed key): the conditions shard 0 holds.
    conditions: HashMap<u64, Kept>,
    /// Per service: the version and shard slots its objects hold.
    services: Services,
}

impl Default for Record {
    fn default() -> Self {
        Record {
            live: Objects::new(),
            relist: None,
            watched: false,
            conditions: HashMap::new(),
            services: Services::default(),
        }
    }
}

impl Record {
    // ---- fed by the start-up list ----

    /// A start-up list begins: its ticket for [`Record::listed`].
    pub fn list_begins(&mut self) -> u64 {
        self.services.begin()
    }

    /// What the start-up list `ticket` found replaces the versions and
    /// shard slots (except of services written since it began), the
    /// generations and conditions, and the names held by others until the
    /// drift watch has listed (then it knows better). A list that began
    /// before the last one landed is dropped: it is older.
    pub fn listed(&mut self, ticket: u64, found: Listing) {
        if !self.services.may_land(ticket) {
            return;
        }
        self.services.listed(ticket, found.services);
        self.live.listed_generations(&found.generations);
        self.conditions = found.conditions;
        if !self.watched {
            self.live.set_foreign(found.foreign);
        }
    }

    // ---- fed by the drift watch ----

    /// A relist starts.
    pub fn init(&mut self) {
        self.relist = Some(Objects::new());
    }

    /// One object of the relist.
    pub fn init_apply(&mut self, o: &ObjectSeen<'_>) {
        self.relist.get_or_insert_with(Objects::new).apply(o);
    }

    /// The relist replaces what the watch showed before, keeping our
    /// writes and the generations; the watch has listed.
    pub fn init_done(&mut self) {
        let mut next = self.relist.take().unwrap_or_else(Objects::new);
        next.adopt_written(&self.live);
        self.live = next;
        self.watched = true;
    }

    /// The watch shows `o` added or changed.
    pub fn apply(&mut self, o: &ObjectSeen<'_>) {
        self.live.apply(o);
    }

    /// The watch shows `ns/name` deleted.
    pub fn delete(&mut self, ns: &str, name: &str) {
        self.live.delete(ns, name);
    }

    // ---- fed by the answers to our writes ----

    /// The API server answered our write of `ns/name` with
    /// `resource_version` and `generation`.
    pub fn written(
        &mut self,
        ns: &str,
        name: &str,
        resource_version: Option<u64>,
        generation: Option<i64>,
    ) {
        self.live
            .note_written(ns, name, pack_rv(resource_version), generation);
    }

    /// We deleted `ns/name` (or found it absent).
    pub fn removed(&mut self, ns: &str, name: &str) {
        self.live.note_written(ns, name, None, None);
    }

    /// Shard 0 of `key` was written with `conditions`.
    pub fn conditions_written(&mut self, key: &ServiceKey, conditions: &[Condition]) {
        self.conditions
            .insert(service_hash(key), Kept::of(conditions));
    }

    /// The objects of `key` now hold `version` in `shards` slots (an
    /// apply's answer).
    pub fn service_written(&mut self, key: &ServiceKey, version: &str, shards: u32) {
        self.services.written(PackedKey::new(key), version, shards);
    }

    /// Every object of `key` was deleted.
    pub fn service_removed(&mut self, key: &ServiceKey) {
        self.conditions.remove(&service_hash(key));
        self.services.removed(&PackedKey::new(key));
    }

    // ---- read ----

    /// What the API server holds of `key`'s objects (`None`: nothing).
    pub fn held(&self, key: &ServiceKey) -> Option<Held> {
        self.service(&PackedKey::new(key)).map(|s| Held {
            version: s.version.to_string(),
            shards: s.shards,
        })
    }

    pub(crate) fn service(&self, key: &PackedKey) -> Option<&Service> {
        self.services.held.get(key)
    }

    /// What a write of `key` starts from, but for the repair flag (the
    /// planner's).
    pub(crate) fn prior(&self, key: &PackedKey, repair: bool) -> Prior {
        Prior {
            shards: self.service(key).map_or(1, |s| s.shards),
            repair,
        }
    }

    /// Every service the API server holds objects of.
    pub(crate) fn services(&self) -> impl Iterator<Item = &PackedKey> {
        self.services.held.keys()
    }

    /// Number of services the API server holds objects of.
    pub fn services_len(&self) -> usize {
        self.services.held.len()
    }

    /// Whether the drift watch has listed once (before, nothing is cached).
    pub fn watched(&self) -> bool {
        self.watched
    }

    /// The `observedGeneration` a write of `ns/name` stamps: the generation
    /// the object will have after it (1: a new object).
    pub fn next_generation(&self, ns: &str, name: &str) -> i64 {
        self.live.generation(ns, name).map_or(1, |g| {
            i64::try_from(g.get()).unwrap_or(i64::MAX).saturating_add(1)
        })
    }

    /// The conditions `key`'s object holds, as last listed or written
    /// (only what a write reads back, reason empty).
    pub fn conditions(&self, key: &ServiceKey) -> Vec<Condition> {
        self.conditions
            .get(&service_hash(key))
            .map(Kept::conditions)
            .unwrap_or_default()
    }

    /// Who holds `ns/name` when it is not ours (`None`: ours or absent).
    pub fn taken(&self, ns: &str, name: &str) -> Option<&Owner> {
        self.live.taken(ns, name)
    }

    /// The watched object `ns/name`.
    pub fn cached(&self, ns: &str, name: &str) -> Option<&Slot> {
        self.live.cached(ns, name)
    }

    /// Every watched object, in no particular order.
    pub fn cached_slots(&self) -> impl Iterator<Item = &Slot> {
        self.live.cached_slots()
    }

    /// Number of watched objects.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// Whether no object is watched.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether a watch event of `ns/name` at `resource_version` is our own
    /// last write of it or older.
    pub fn ours_or_older(&self, ns: &str, name: &str, resource_version: Option<u64>) -> bool {
        let ours = self.live.written(ns, name);
        matches!((pack_rv(resource_version), ours), (Some(have), Some(ours)) if have <= ours)
    }

    /// Every watched object whose spec describes `key`, in the order they
    /// came: an index lookup, O(objects of `key`).
    pub fn objects_of(&self, key: &ServiceKey) -> Vec<ObjName> {
        self.live.objects_of(key)
    }
}
