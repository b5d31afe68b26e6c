//! The requests ONE write of a service makes, in order: [`object_ops`].
//!
//! The planner decides THAT a service is written ([`super::Action::Apply`] /
//! [`super::Action::Delete`]) and carries what it knows of the service's
//! objects on the API server along ([`Prior`]: how many shard slots the last
//! write left, whether the write repairs drift). This function decides WHICH
//! objects that write touches, from data only: what the record
//! ([`super::record`]) shows of the objects the write may touch is read
//! once, before ([`ServerFacts::gather`] over a
//! [`super::record::RecordView`]), and never asked while deciding. The sink
//! only sends the requests.
//!
//! ```text
//!  desired objects (crd::DesiredObjects)      ─┐
//!  Prior { shards, repair }                     ├─▶ object_ops ─▶ Apply(shard 1..), Apply(shard 0)
//!  ServerFacts: intact, taken, cached of key   ─┘                 Delete(surplus shard / stray / gone)
//!                                                                  left alone: names held by others
//! ```
//!
//! * Shards `1..` are applied first and shard 0 LAST: shard 0 carries the
//!   count and the manifest of shard versions a reader trusts
//!   (`crd::consistent_shards`), so a reader never takes a shard 0 whose
//!   shards are not written yet. Surplus shards go after shard 0 (a reader
//!   ignores shards beyond shard 0's count), so a write that stops after any
//!   request leaves the old or the new set for readers (a changed shard
//!   rewritten in place reads "not complete" until shard 0 follows).
//! * A shard `1..` the cache shows intact is not sent, in every write: its
//!   `spec.version` is the version of its own content
//!   (`crate::crd::shards`), so "intact" means this write would not change it.
//!   One endpoint changed in a big service is two applies: its shard, then
//!   shard 0. (Only when the drift watch lags behind our own last write of
//!   a shard is it sent again, unchanged.) Shard 0 and an unsharded object
//!   are always sent outside a repair: the planner only writes when the
//!   service's version changed, which changes them.
//! * A service that fits one object again after being sharded is ONE apply
//!   of shard 0 with every node and no `spec.shard` (server-side apply
//!   removes the fields its manager no longer sends, the emptied `shard`
//!   map with them), then the surplus deletes. It used to remove
//!   `spec.shard` by a merge patch first: between the two requests every
//!   reader took the old shard 0 alone, a fraction of the old nodes, as the
//!   whole service. Where someone else co-owns part of
//!   `spec.shard`, the sink removes what the apply left (`sink.rs`).
//! * Shard slots the last write used beyond the new count are deleted
//!   (a shrink), and so is every object of a deleted service.
//! * A repair writes only the objects the cache does NOT show intact
//!   (`lastSyncTime` in every apply would turn a rewrite of an intact shard
//!   into a real write) and also deletes stray objects the cache holds for the
//!   service (only then: no cache scan per ordinary write).
//! * Decided from names and versions alone ([`DesiredObjects`]): no object
//!   is built here; the sink builds the ones [`ObjectPlan::applied`] lists,
//!   so one change in a big service copies the nodes of two shards, not of
//!   all. [`ServerView::intact`] gets the lazy objects, to answer from
//!   versions where it can, and is asked only of the objects whose answer
//!   matters.
//! * A desired name held by someone else (another instance, a hand-made
//!   object) fails the whole write before any request ([`NameTaken`]): a
//!   sharded service is written whole or not at all. A name to delete that
//!   someone else holds is never deleted; it is reported
//!   ([`ObjectPlan::left_alone`]).

use std::collections::{BTreeMap, BTreeSet};

use super::Prior;
use crate::ServiceKey;
use crate::crd::{DesiredObjects, ObjectNaming, Owner, shard_name};

/// `(namespace, name)` of an object.
pub type ObjName = (String, String);

/// What the record shows of the API server, read by [`ServerFacts::gather`]
/// before a write is planned: [`super::record::RecordView`] (tests answer
/// from fakes). Each question is asked only when the answer matters (the
/// watched objects of a service only on a repair).
pub trait ServerView {
    /// Whether the cache shows object `index` of `desired` as wanted
    /// (cached, not older than our last write of it, same content; status
    /// not compared). Unknown is `false`. Asked with the lazy objects so
    /// that an answer from versions needs no node copied
    /// ([`DesiredObjects::build`] gives the object when one is needed).
    fn intact(&self, desired: &DesiredObjects<'_>, index: u32) -> bool;
    /// Who holds `ns/name` when that is not this instance.
    fn taken(&self, ns: &str, name: &str) -> Option<Owner>;
    /// Every object the cache holds that describes `key` (by its spec).
    fn objects_of(&self, key: &ServiceKey) -> Vec<ObjName>;
}

/// What the API server holds of the objects one write may touch, as the
/// record shows it: what [`object_ops`] decides from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerFacts {
    /// The desired objects (by index) shown intact, among those whose
    /// answer matters: every shard `i > 0`, and on a repair shard 0 too.
    pub intact: BTreeSet<u32>,
    /// The names the write may touch that someone else holds.
    pub taken: BTreeMap<ObjName, Owner>,
    /// On a repair: every object the cache holds of the service (else empty).
    pub cached: Vec<ObjName>,
}

impl ServerFacts {
    /// Reads from `view` what a write of `desired` (`None`: a delete) for
    /// `key` over `prior` needs: who holds the desired names (none else is
    /// asked when one is taken: the write fails), which desired objects are
    /// intact, and on a repair the service's cached objects and who holds
    /// the ones the write would delete.
    pub fn gather(
        key: &ServiceKey,
        naming: &ObjectNaming,
        desired: Option<&DesiredObjects<'_>>,
        prior: Prior,
        view: &dyn ServerView,
    ) -> ServerFacts {
        let mut facts = ServerFacts::default();
        let count = desired.map_or(0, DesiredObjects::len);
        let note_taken = |facts: &mut ServerFacts, name: ObjName| {
            if let Some(owner) = view.taken(&name.0, &name.1) {
                facts.taken.insert(name, owner);
            }
        };
        if let Some(d) = desired {
            for index in 0..count {
                note_taken(&mut facts, d.name(index));
            }
            if !facts.taken.is_empty() {
                return facts;
            }
            for index in 0..count {
                if (prior.repair || d.is_later_shard(index)) && view.intact(d, index) {
                    facts.intact.insert(index);
                }
            }
        }
        if prior.repair {
            facts.cached = view.objects_of(key);
        }
        let ns = naming.namespace(key);
        let base = naming.name(key);
        for index in count..prior.shards.max(1) {
            note_taken(&mut facts, (ns.clone(), shard_name(&base, index)));
        }
        for name in facts.cached.clone() {
            note_taken(&mut facts, name);
        }
        facts
    }
}

/// Why an object is deleted (for the log line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteWhy {
    /// A shard slot beyond the new count (the service shrank).
    Surplus,
    /// An object of the service the cache holds under a name we do not want
    /// (found by a repair).
    Stray,
    /// An object of a service that has no source any more.
    Gone,
}

/// One request of a write, in the order they are sent.
#[derive(Debug, Clone, PartialEq)]
pub enum ObjectOp {
    /// Server-side apply (spec and status) of object `index` of the desired
    /// objects, named `name` ([`DesiredObjects::build`] makes it: only the
    /// objects a write sends are ever built).
    Apply {
        /// Its position in the desired objects (its shard index).
        index: u32,
        /// Its `(namespace, name)`.
        name: ObjName,
    },
    /// Delete this object (absent is success).
    Delete(ObjName, DeleteWhy),
}

/// The requests of one write, and the names it leaves to their owners.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ObjectPlan {
    /// In the order they are sent; the write stops at the first failure.
    pub ops: Vec<ObjectOp>,
    /// Objects that would have been deleted but are held by someone else.
    pub left_alone: Vec<(ObjName, Owner)>,
}

impl ObjectPlan {
    /// The indices of the objects this write applies, in the order sent
    /// (what the sink builds, [`DesiredObjects::build`]).
    pub fn applied(&self) -> Vec<u32> {
        self.ops
            .iter()
            .filter_map(|op| match op {
                ObjectOp::Apply { index, .. } => Some(*index),
                _ => None,
            })
            .collect()
    }
}

/// A desired object's name is held by someone else: nothing is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameTaken {
    /// The object.
    pub object: ObjName,
    /// Who holds it.
    pub owner: Owner,
}

/// The requests that write `desired` (`None`: the service is deleted) for
/// `key` over what the API server holds as far as `prior` and `facts` say
/// (see the module docs). Decided from names and versions alone: no object
/// is built here.
pub fn object_ops(
    key: &ServiceKey,
    naming: &ObjectNaming,
    desired: Option<&DesiredObjects<'_>>,
    prior: Prior,
    facts: &ServerFacts,
) -> Result<ObjectPlan, NameTaken> {
    let count = desired.map_or(0, DesiredObjects::len);
    for index in 0..count {
        let Some(d) = desired else { break };
        let object = d.name(index);
        if let Some(owner) = facts.taken.get(&object) {
            return Err(NameTaken {
                object,
                owner: owner.clone(),
            });
        }
    }
    let mut plan = ObjectPlan::default();
    if let Some(d) = desired {
        // A shard `i > 0` carries the version of its own content, so the
        // cache showing it intact means this write does not change it: only
        // the changed shards and shard 0 (whose manifest changed) are sent.
        let wanted = |index: u32| {
            !((prior.repair || d.is_later_shard(index)) && facts.intact.contains(&index))
        };
        for index in (1..count).chain([0]) {
            if wanted(index) {
                plan.ops.push(ObjectOp::Apply {
                    index,
                    name: d.name(index),
                });
            }
        }
    }
    let keep: BTreeSet<ObjName> = desired
        .into_iter()
        .flat_map(|d| (0..count).map(|i| d.name(i)))
        .collect();
    let why = if desired.is_none() {
        DeleteWhy::Gone
    } else {
        DeleteWhy::Surplus
    };
    let ns = naming.namespace(key);
    let base = naming.name(key);
    let mut deletes: Vec<(ObjName, DeleteWhy)> = (count..prior.shards.max(1))
        .map(|i| ((ns.clone(), shard_name(&base, i)), why))
        .collect();
    if prior.repair {
        let mut strays = facts.cached.clone();
        strays.sort();
        for stray in strays {
            if !keep.contains(&stray) && !deletes.iter().any(|(n, _)| *n == stray) {
                deletes.push((stray, DeleteWhy::Stray));
            }
        }
    }
    for (name, why) in deletes {
        match facts.taken.get(&name) {
            Some(owner) => plan.left_alone.push((name, owner.clone())),
            None => plan.ops.push(ObjectOp::Delete(name, why)),
        }
    }
    Ok(plan)
}

#[cfg(test)]
pub(super) mod tests;

#[cfg(test)]
mod reader_tests;
