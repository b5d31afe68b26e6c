//! What a write reads of the record before it is planned: which desired
//! objects the record shows intact, who holds a name, the watched objects
//! of a service ([`RecordView`], the [`ServerView`] that
//! [`crate::write_plan::ServerFacts::gather`] asks; no call goes back into
//! the runtime). The wanted form of a shard `i > 0` is remembered per
//! service and version ([`WantedShards`]), so asking about an unchanged
//! shard copies no node.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Mutex;

use super::{Record, WantedObject, lock};
use crate::ServiceKey;
use crate::crd::{DesiredObjects, DiscoveredService, Owner};
use crate::write_plan::{ObjName, ServerView};

/// [`WantedShards`] is emptied when it grows beyond this many shards (a
/// memo: entries of deleted services are never looked up again, and any
/// entry is rebuilt on demand).
const WANTED_SHARDS_MAX: usize = 65_536;

/// The wanted form of shards `i > 0` by `(namespace, name)`, with the
/// service and `spec.version` it was built for ([`intact_of`]).
#[derive(Debug, Default)]
pub struct WantedShards(HashMap<ObjName, (ServiceKey, String, WantedObject)>);

impl WantedShards {
    /// The wanted form of shard `index > 0` of `desired` named `at`.
    fn get(
        &mut self,
        desired: &DesiredObjects<'_>,
        index: u32,
        at: ObjName,
    ) -> Option<WantedObject> {
        let key = &desired.service().key;
        let version = desired.version(index);
        if let Some((k, v, w)) = self.0.get(&at)
            && k == key
            && v == version
        {
            return Some(w.clone());
        }
        let want = WantedObject::of(&desired.object(index)?);
        if self.0.len() >= WANTED_SHARDS_MAX {
            self.0.clear();
        }
        self.0
            .insert(at, (key.clone(), version.to_string(), want.clone()));
        Some(want)
    }
}

impl Record {
    /// Whether the object `want` names is intact: watched, not older than
    /// our last write of it, and what `want` is (status is not compared). A
    /// repair skips such objects (the sink's apply would only move their
    /// `lastSyncTime`); unknown or stale counts as not intact.
    pub fn intact(&self, want: &DiscoveredService) -> bool {
        let w = WantedObject::of(want);
        self.cached(&w.ns, &w.name)
            .is_some_and(|s| !s.older_than_our_write() && s.satisfies(&w))
    }
}

/// [`Record::intact`] of object `index` of `desired`, building it only
/// when the answer needs it: not for an object the record does not
/// show (or shows older than our write), and not for a shard `i > 0`
/// whose wanted form `shards` remembers for its `spec.version`.
///
/// Why remembering is exact: a shard `i > 0` carries the version of its
/// own content (`crate::crd::shards::shard_version`: its nodes, index,
/// count, source, owner and extras), and everything else of it follows
/// from its service and the naming, so the same service and version
/// mean the same wanted object, which is compared with the watched copy
/// as before (a hand edit of its nodes is still seen). Why it matters:
/// a write of one change in a 100,000-endpoint service asks this of 15
/// shards; building them copied every node.
pub fn intact_of(
    record: &Mutex<Record>,
    desired: &DesiredObjects<'_>,
    index: u32,
    shards: &mut WantedShards,
) -> bool {
    let (ns, name) = desired.name(index);
    let current = |record: &Record| {
        record
            .cached(&ns, &name)
            .is_some_and(|s| !s.older_than_our_write())
    };
    if !current(&lock(record)) {
        return false;
    }
    let want = if desired.is_later_shard(index) {
        shards.get(desired, index, (ns.clone(), name.clone()))
    } else {
        desired.object(index).map(|o| WantedObject::of(&o))
    };
    let Some(want) = want else { return false };
    lock(record)
        .cached(&ns, &name)
        .is_some_and(|s| !s.older_than_our_write() && s.satisfies(&want))
}

/// The record as [`crate::write_plan::ServerFacts::gather`] reads it.
pub struct RecordView<'a> {
    record: &'a Mutex<Record>,
    shards: RefCell<&'a mut WantedShards>,
}

impl<'a> RecordView<'a> {
    /// `record`, remembering wanted shards in `shards`.
    pub fn new(record: &'a Mutex<Record>, shards: &'a mut WantedShards) -> Self {
        RecordView {
            record,
            shards: RefCell::new(shards),
        }
    }
}

impl ServerView for RecordView<'_> {
    fn intact(&self, desired: &DesiredObjects<'_>, index: u32) -> bool {
        intact_of(self.record, desired, index, &mut self.shards.borrow_mut())
    }
    fn taken(&self, ns: &str, name: &str) -> Option<Owner> {
        lock(self.record).taken(ns, name).cloned()
    }
    fn objects_of(&self, key: &ServiceKey) -> Vec<ObjName> {
        lock(self.record).objects_of(key)
    }
}
