//! The requests ONE write of a service makes, in order: [`object_ops`].
//!
//! The planner decides THAT a service is written ([`super::Action::Apply`] /
//! [`super::Action::Delete`]) and carries what it knows of the service's
//! objects on the API server along ([`Prior`]: how many shard slots the last
//! write left, whether the write repairs drift). This function decides WHICH
//! objects that write touches, from data only: what the sink's caches show
//! of the objects the write may touch is read once, before
//! ([`ServerFacts::gather`]), and never asked while deciding. The sink only
//! sends the requests.
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

/// What the sink knows of the API server, read by [`ServerFacts::gather`]
/// before a write is planned. Each question is asked only when the answer
/// matters (the cache of a service's objects only on a repair).
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
/// sink's caches show it: what [`object_ops`] decides from.
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
pub(super) mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;
    use crate::crd::{DiscoveredService, desired_objects_with_limit};
    use crate::{Node, PortMap, ServiceNodes, SourceKind};

    /// The API server as the sink's caches show it (object names in
    /// namespace `ns`).
    #[derive(Default)]
    pub(crate) struct View {
        pub(crate) intact: BTreeSet<String>,
        pub(crate) taken: BTreeMap<String, Owner>,
        pub(crate) cached: Vec<String>,
    }

    impl ServerView for View {
        fn intact(&self, desired: &DesiredObjects<'_>, index: u32) -> bool {
            self.intact.contains(&desired.name(index).1)
        }
        fn taken(&self, _ns: &str, name: &str) -> Option<Owner> {
            self.taken.get(name).cloned()
        }
        fn objects_of(&self, _key: &ServiceKey) -> Vec<ObjName> {
            self.cached
                .iter()
                .map(|n| ("ns".to_string(), n.clone()))
                .collect()
        }
    }

    fn key() -> ServiceKey {
        ServiceKey::new("", "ns", "web")
    }

    /// [`object_ops`] over the facts `view` gives ([`ServerFacts::gather`]),
    /// as the sink plans a write.
    pub(crate) fn ops_over(
        key: &ServiceKey,
        naming: &ObjectNaming,
        desired: Option<&DesiredObjects<'_>>,
        prior: Prior,
        view: &dyn ServerView,
    ) -> Result<ObjectPlan, NameTaken> {
        let facts = ServerFacts::gather(key, naming, desired, prior, view);
        object_ops(key, naming, desired, prior, &facts)
    }

    fn obj_name(o: &DiscoveredService) -> ObjName {
        (
            o.metadata.namespace.clone().unwrap_or_default(),
            o.metadata.name.clone().unwrap_or_default(),
        )
    }

    /// The size bound of the test objects: at most 4 nodes per object.
    pub(crate) const LIMIT: usize = 200;

    /// `web` with `nodes` nodes.
    fn objects(nodes: usize) -> ServiceNodes {
        service_of(&key(), nodes)
    }

    /// `key` with `nodes` nodes (at most 4 per object under [`LIMIT`]).
    pub(crate) fn service_of(key: &ServiceKey, nodes: usize) -> ServiceNodes {
        let list = (0..nodes)
            .map(|i| Node::new(format!("10.0.0.{i}"), 80, 50))
            .collect();
        ServiceNodes::new(
            key.clone(),
            SourceKind::EndpointSlice,
            PortMap::from([("http".to_string(), list)]),
            None,
        )
    }

    /// The lazy objects of `svc` under [`LIMIT`].
    pub(crate) fn lazy(svc: &ServiceNodes) -> DesiredObjects<'_> {
        DesiredObjects::with_limit(svc, &ObjectNaming::source(), LIMIT)
    }

    /// The ops as short text: `apply web.1`, `delete web.2 (Surplus)`.
    pub(crate) fn show(plan: &ObjectPlan) -> Vec<String> {
        plan.ops
            .iter()
            .map(|op| match op {
                ObjectOp::Apply { name, .. } => format!("apply {}", name.1),
                ObjectOp::Delete((_, n), why) => format!("delete {n} ({why:?})"),
            })
            .collect()
    }

    fn ops(svc: Option<&ServiceNodes>, shards: u32, repair: bool, view: &View) -> Vec<String> {
        let desired = svc.map(lazy);
        let plan = ops_over(
            &key(),
            &ObjectNaming::source(),
            desired.as_ref(),
            Prior { shards, repair },
            view,
        )
        .unwrap();
        assert!(plan.left_alone.is_empty(), "{:?}", plan.left_alone);
        show(&plan)
    }

    #[test]
    fn the_test_service_has_the_sizes_the_tests_assume() {
        for (nodes, count) in [(1, 1), (4, 1), (5, 2), (8, 2), (12, 4)] {
            assert_eq!(lazy(&objects(nodes)).len(), count, "{nodes}");
        }
    }

    #[test]
    fn a_shrink_from_four_shards_writes_one_object_then_deletes_the_surplus() {
        let one = objects(1);
        assert_eq!(
            ops(Some(&one), 4, false, &View::default()),
            [
                "apply web",
                "delete web.1 (Surplus)",
                "delete web.2 (Surplus)",
                "delete web.3 (Surplus)"
            ]
        );
        // 4 -> 2: two surplus slots.
        let two = objects(8);
        assert_eq!(lazy(&two).len(), 2);
        assert_eq!(
            ops(Some(&two), 4, false, &View::default()),
            [
                "apply web.1",
                "apply web",
                "delete web.2 (Surplus)",
                "delete web.3 (Surplus)"
            ]
        );
    }

    #[test]
    fn a_grow_to_four_shards_writes_shards_one_to_three_before_shard_zero() {
        assert_eq!(
            ops(Some(&objects(12)), 1, false, &View::default()),
            ["apply web.1", "apply web.2", "apply web.3", "apply web"]
        );
        // An unchanged count deletes nothing.
        assert_eq!(
            ops(Some(&objects(12)), 4, false, &View::default()),
            ["apply web.1", "apply web.2", "apply web.3", "apply web"]
        );
    }

    #[test]
    fn intact_shards_beyond_zero_are_never_sent_and_a_repair_skips_every_intact_object() {
        let four = objects(12);
        let view = View {
            intact: ["web".into(), "web.2".into()].into(),
            cached: vec!["web".into(), "web.2".into()],
            ..View::default()
        };
        assert_eq!(
            ops(Some(&four), 4, true, &view),
            ["apply web.1", "apply web.3"]
        );
        // Not a repair: shard 0 always (its manifest is what changed), the
        // other shards only when the cache does not show them intact.
        assert_eq!(
            ops(Some(&four), 4, false, &view),
            ["apply web.1", "apply web.3", "apply web"]
        );
        // Everything intact: a repair that finds nothing to do sends nothing.
        let all = View {
            intact: ["web".into(), "web.1".into(), "web.2".into(), "web.3".into()].into(),
            ..View::default()
        };
        assert_eq!(ops(Some(&four), 4, true, &all), Vec::<String>::new());
        assert_eq!(ops(Some(&four), 4, false, &all), ["apply web"]);
        // An unsharded object is always sent outside a repair.
        let one = View {
            intact: ["web".into()].into(),
            ..View::default()
        };
        assert_eq!(ops(Some(&objects(1)), 1, false, &one), ["apply web"]);
    }

    /// The API server after a write of `written`: "intact" is "the same
    /// spec as written" (what the drift cache answers once its watch saw
    /// the write), by content, not by name.
    struct Holds(Vec<DiscoveredService>);

    impl ServerView for Holds {
        fn intact(&self, desired: &DesiredObjects<'_>, index: u32) -> bool {
            let Some(obj) = desired.object(index) else {
                return false;
            };
            self.0
                .iter()
                .any(|o| o.metadata.name == obj.metadata.name && o.spec == obj.spec)
        }
        fn taken(&self, _ns: &str, _name: &str) -> Option<Owner> {
            None
        }
        fn objects_of(&self, _key: &ServiceKey) -> Vec<ObjName> {
            self.0.iter().map(obj_name).collect()
        }
    }

    /// Issue 19 item 2: one endpoint added to or removed from a sharded
    /// service (here 8 shards of 300 nodes) is written as exactly two applies, its
    /// shard and then shard 0, wherever the endpoint sorts.
    #[test]
    fn one_endpoint_change_writes_its_shard_then_shard_zero() {
        let svc = |hosts: &[String]| {
            let mut list: Vec<Node> = hosts
                .iter()
                .map(|h| Node::new(h.as_str(), 80, 50))
                .collect();
            crate::model::sort_nodes(&mut list);
            ServiceNodes::new(
                key(),
                SourceKind::EndpointSlice,
                PortMap::from([("http".to_string(), list)]),
                None,
            )
        };
        let hosts: Vec<String> = (0..300)
            .map(|i| format!("10.0.{}.{}", i / 256, i % 256))
            .collect();
        let limit = 2_000;
        let before = desired_objects_with_limit(&svc(&hosts), &ObjectNaming::source(), limit);
        assert_eq!(before.len(), 8);
        let server = Holds(before.clone());
        let mut seen = BTreeSet::new();
        for change in ["0.0.0.1", "10.0.0.77", "99.0.0.1", "10.0.1.2", "10.0.0.0"] {
            let mut now = hosts.clone();
            if let Some(at) = now.iter().position(|h| h == change) {
                now.remove(at);
            } else {
                now.push(change.to_string());
            }
            let now = svc(&now);
            let after = desired_objects_with_limit(&now, &ObjectNaming::source(), limit);
            assert_eq!(after.len(), 8);
            let lazy = DesiredObjects::with_limit(&now, &ObjectNaming::source(), limit);
            let plan = ops_over(
                &key(),
                &ObjectNaming::source(),
                Some(&lazy),
                Prior {
                    shards: 8,
                    repair: false,
                },
                &server,
            )
            .unwrap();
            let got = show(&plan);
            assert_eq!(got.len(), 2, "{change}: {got:?}");
            assert_eq!(got[1], "apply web", "{change}: {got:?}");
            // The one applied shard is the one whose spec changed.
            let changed: Vec<String> = after
                .iter()
                .zip(&before)
                .skip(1)
                .filter(|(a, b)| a.spec != b.spec)
                .map(|(a, _)| format!("apply {}", obj_name(a).1))
                .collect();
            assert_eq!(changed, [got[0].clone()], "{change}");
            // What the sink builds for the plan is the eager build's objects.
            let applied = plan.applied();
            let built = lazy.build(&applied);
            assert_eq!(applied.len(), 2);
            for (index, obj) in applied.iter().zip(&built) {
                assert_eq!(*obj, after[*index as usize], "{change}: shard {index}");
            }
            seen.insert(got[0].clone());
        }
        assert!(
            seen.len() > 1,
            "the changes all landed in one shard: {seen:?}"
        );
    }

    /// A [`View`] that records the questions it is asked.
    struct Asked<'a>(&'a View, std::cell::RefCell<Vec<String>>);

    impl ServerView for Asked<'_> {
        fn intact(&self, desired: &DesiredObjects<'_>, index: u32) -> bool {
            self.1
                .borrow_mut()
                .push(format!("intact {}", desired.name(index).1));
            self.0.intact(desired, index)
        }
        fn taken(&self, ns: &str, name: &str) -> Option<Owner> {
            self.1.borrow_mut().push(format!("taken {name}"));
            self.0.taken(ns, name)
        }
        fn objects_of(&self, key: &ServiceKey) -> Vec<ObjName> {
            self.1.borrow_mut().push("objects_of".to_string());
            self.0.objects_of(key)
        }
    }

    #[test]
    fn the_facts_of_a_write_are_read_once_and_only_where_they_matter() {
        let four = objects(12);
        let four = lazy(&four);
        let view = View {
            intact: ["web.2".into()].into(),
            cached: vec!["web.7".into()],
            ..View::default()
        };
        let gather = |prior: Prior, view: &View| {
            let asked = Asked(view, Default::default());
            let facts =
                ServerFacts::gather(&key(), &ObjectNaming::source(), Some(&four), prior, &asked);
            (facts, asked.1.into_inner())
        };
        // Not a repair: shard 0 is always sent (not asked), the cache of the
        // service is not read.
        let (facts, asked) = gather(
            Prior {
                shards: 5,
                repair: false,
            },
            &view,
        );
        assert_eq!(
            asked,
            [
                "taken web",
                "taken web.1",
                "taken web.2",
                "taken web.3",
                "intact web.1",
                "intact web.2",
                "intact web.3",
                "taken web.4"
            ]
        );
        assert_eq!(facts.intact, [2].into());
        assert!(facts.cached.is_empty());
        // A repair: shard 0 too, and the service's cached objects.
        let (facts, asked) = gather(
            Prior {
                shards: 4,
                repair: true,
            },
            &view,
        );
        assert_eq!(
            asked,
            [
                "taken web",
                "taken web.1",
                "taken web.2",
                "taken web.3",
                "intact web",
                "intact web.1",
                "intact web.2",
                "intact web.3",
                "objects_of",
                "taken web.7"
            ]
        );
        assert_eq!(facts.cached, [("ns".to_string(), "web.7".to_string())]);
        // A desired name held by someone else: the write fails, nothing else
        // is asked.
        let taken = View {
            taken: [("web.1".to_string(), Owner::Unmanaged)].into(),
            ..View::default()
        };
        let (facts, asked) = gather(
            Prior {
                shards: 4,
                repair: true,
            },
            &taken,
        );
        assert_eq!(
            asked,
            ["taken web", "taken web.1", "taken web.2", "taken web.3"]
        );
        assert_eq!(
            object_ops(
                &key(),
                &ObjectNaming::source(),
                Some(&four),
                Prior::default(),
                &facts
            ),
            Err(NameTaken {
                object: ("ns".into(), "web.1".into()),
                owner: Owner::Unmanaged
            })
        );
    }

    #[test]
    fn strays_are_deleted_only_by_a_repair() {
        let one = objects(1);
        let view = View {
            intact: ["web".into()].into(),
            cached: vec!["web.9".into(), "web".into(), "web.7".into()],
            ..View::default()
        };
        assert_eq!(ops(Some(&one), 1, false, &view), ["apply web"]);
        assert_eq!(
            ops(Some(&one), 1, true, &view),
            ["delete web.7 (Stray)", "delete web.9 (Stray)"]
        );
        // A stray that is also a surplus slot is deleted once.
        let view = View {
            cached: vec!["web.1".into()],
            ..View::default()
        };
        assert_eq!(
            ops(Some(&one), 2, true, &view),
            ["apply web", "delete web.1 (Surplus)"]
        );
        // A deleted service: every slot, and on a repair the strays too.
        assert_eq!(
            ops(None, 2, false, &view),
            ["delete web (Gone)", "delete web.1 (Gone)"]
        );
        let view = View {
            cached: vec!["web.5".into()],
            ..View::default()
        };
        assert_eq!(
            ops(None, 1, true, &view),
            ["delete web (Gone)", "delete web.5 (Stray)"]
        );
    }

    #[test]
    fn names_held_by_others_are_never_written_or_deleted() {
        let three = objects(12);
        let three = lazy(&three);
        assert_eq!(three.len(), 4);
        let other = Owner::Instance("b".into());
        let view = View {
            taken: [("web.2".to_string(), other.clone())].into(),
            ..View::default()
        };
        let err = ops_over(
            &key(),
            &ObjectNaming::source(),
            Some(&three),
            Prior::default(),
            &view,
        )
        .unwrap_err();
        assert_eq!(
            err,
            NameTaken {
                object: ("ns".into(), "web.2".into()),
                owner: other.clone()
            }
        );
        // A surplus slot or a stray held by someone else is left alone and reported.
        let view = View {
            taken: [
                ("web.2".to_string(), other.clone()),
                ("web.4".to_string(), Owner::Unmanaged),
            ]
            .into(),
            cached: vec!["web.4".into()],
            ..View::default()
        };
        let one = objects(1);
        let plan = ops_over(
            &key(),
            &ObjectNaming::source(),
            Some(&lazy(&one)),
            Prior {
                shards: 3,
                repair: true,
            },
            &view,
        )
        .unwrap();
        assert_eq!(show(&plan), ["apply web", "delete web.1 (Surplus)"]);
        assert_eq!(
            plan.left_alone,
            [
                (("ns".into(), "web.2".into()), other),
                (("ns".into(), "web.4".into()), Owner::Unmanaged)
            ]
        );
    }
}

/// Issue 29 item 2: what readers see at every point of a write that changes
/// a service's shard count. The API server is scripted: a prefix of the
/// plan's requests is applied (an apply replaces the object, as a
/// server-side apply by its only manager does; a delete removes it; before
/// the fix a merge patch first removed `spec.shard` from the old shard 0,
/// which readers then took alone as the whole service), the write stops
/// there (a failed request, a lost lease, a crash), and THE reader rule
/// (`ReaderRule::check`, then `crd::consistent_shards`) reads the objects.
/// Then the write is done again from that state, as a retry (the planner's
/// shard slots) and as a restart (the slots the start-up list finds), and
/// every prefix of that is read too.
#[cfg(test)]
mod reader_tests {
    use std::collections::BTreeMap;

    use super::tests::{LIMIT, lazy, ops_over, show};
    use super::*;
    use crate::crd::{
        DiscoveredService, Incomplete, ReaderRule, ShardHead, consistent_shards,
        desired_objects_with_limit,
    };
    use crate::{Node, PortMap, ServiceNodes, SourceKind};

    fn key() -> ServiceKey {
        ServiceKey::new("", "ns", "web")
    }

    /// `web` with the `n` nodes `10.0.0.<from>..`.
    fn service(from: usize, n: usize) -> ServiceNodes {
        let mut list: Vec<Node> = (from..from + n)
            .map(|i| Node::new(format!("10.0.{}.{}", i / 256, i % 256), 80, 50))
            .collect();
        crate::model::sort_nodes(&mut list);
        ServiceNodes::new(
            key(),
            SourceKind::EndpointSlice,
            PortMap::from([("http".to_string(), list)]),
            None,
        )
    }

    /// The API server: the service's objects by name.
    type Server = BTreeMap<String, DiscoveredService>;

    /// The server as a [`ServerView`]: "intact" is "holds the same spec".
    struct Holds<'a>(&'a Server);

    impl ServerView for Holds<'_> {
        fn intact(&self, desired: &DesiredObjects<'_>, index: u32) -> bool {
            let Some(obj) = desired.object(index) else {
                return false;
            };
            self.0
                .get(obj.metadata.name.as_deref().unwrap_or_default())
                .is_some_and(|o| o.spec == obj.spec)
        }
        fn taken(&self, _ns: &str, _name: &str) -> Option<crate::crd::Owner> {
            None
        }
        fn objects_of(&self, _key: &ServiceKey) -> Vec<ObjName> {
            self.0
                .keys()
                .map(|n| ("ns".to_string(), n.clone()))
                .collect()
        }
    }

    /// Sends `ops` of the write of `desired` to `server`.
    fn send(server: &mut Server, desired: &DesiredObjects<'_>, ops: &[ObjectOp]) {
        for op in ops {
            match op {
                ObjectOp::Apply { index, name } => {
                    let obj = desired.build(&[*index]).remove(0);
                    server.insert(name.1.clone(), obj);
                }
                ObjectOp::Delete((_, name), _) => {
                    server.remove(name);
                }
            }
        }
    }

    /// What a reader takes of `server`: the nodes of every port, merged over
    /// the shards the reader rule takes.
    fn read(server: &Server) -> Result<PortMap, Incomplete> {
        let rule = ReaderRule::new(ObjectNaming::source());
        let mine: Vec<&DiscoveredService> =
            server.values().filter(|o| rule.check(o).is_ok()).collect();
        let heads: Vec<ShardHead<'_>> = mine.iter().map(|o| ShardHead::of(o)).collect();
        let (take, _) = consistent_shards(&heads)?;
        let mut out = PortMap::new();
        for i in take {
            for (port, nodes) in &mine[i].spec.ports {
                out.entry(port.clone())
                    .or_default()
                    .extend(nodes.iter().cloned());
            }
        }
        for nodes in out.values_mut() {
            crate::model::sort_nodes(nodes);
        }
        Ok(out)
    }

    /// `read(server)` is the whole old or the whole new node set; "not
    /// complete" (the reader keeps its last answer) only where `incomplete`
    /// allows it. Returns which.
    fn check(
        server: &Server,
        old: &ServiceNodes,
        new: &ServiceNodes,
        incomplete: bool,
        at: &str,
    ) -> &'static str {
        match read(server) {
            Ok(p) if p == new.ports => "new",
            Ok(p) if p == old.ports => "old",
            Err(_) if incomplete => "incomplete",
            Ok(p) => panic!(
                "{at}: a reader takes {} nodes as the whole service (old {}, new {}); objects: {:?}",
                p.values().map(Vec::len).sum::<usize>(),
                old.ports.values().map(Vec::len).sum::<usize>(),
                new.ports.values().map(Vec::len).sum::<usize>(),
                server
                    .values()
                    .map(|o| format!(
                        "{} shard={:?} nodes={}",
                        o.metadata.name.as_deref().unwrap_or_default(),
                        o.spec.shard.as_ref().map(|s| (s.index, s.count)),
                        o.spec.ports.values().map(Vec::len).sum::<usize>()
                    ))
                    .collect::<Vec<_>>()
            ),
            Err(e) => panic!("{at}: incomplete ({e}) where a whole set must be read"),
        }
    }

    /// The write of `new` over `server` (shard slots `slots`) and its ops.
    fn plan(server: &Server, new: &DesiredObjects<'_>, slots: u32) -> Vec<ObjectOp> {
        ops_over(
            &key(),
            &ObjectNaming::source(),
            Some(new),
            Prior {
                shards: slots,
                repair: false,
            },
            &Holds(server),
        )
        .unwrap()
        .ops
    }

    /// The slots the start-up list finds: the highest index + 1.
    fn listed_slots(server: &Server) -> u32 {
        server
            .values()
            .map(|o| o.spec.shard.as_ref().map_or(0, |s| s.index) + 1)
            .max()
            .unwrap_or(1)
    }

    #[test]
    fn readers_take_the_whole_old_or_the_whole_new_set_at_every_point_of_a_count_change() {
        // (old first node, old nodes, new first node, new nodes): with at
        // most 4 nodes per object, 1 object, 2 shards or 4.
        let cases = [
            ((0, 12), (0, 1)),  // 4 shards -> 1 object
            ((0, 6), (3, 2)),   // 2 -> 1
            ((0, 12), (20, 4)), // 4 -> 1, no node in common
            ((0, 1), (0, 12)),  // 1 -> 4
            ((0, 3), (5, 6)),   // 1 -> 2
            ((0, 12), (0, 6)),  // 4 -> 2
            ((0, 6), (0, 12)),  // 2 -> 4
            ((0, 12), (1, 12)), // 4 -> 4, other nodes
        ];
        for ((of, on), (nf, nn)) in cases {
            let old = service(of, on);
            let new = service(nf, nn);
            let before = desired_objects_with_limit(&old, &ObjectNaming::source(), LIMIT);
            let desired = lazy(&new);
            let (from, to) = (before.len() as u32, desired.len());
            let case = format!("{from} -> {to} objects");
            // Only a rewrite of shards in place (both sides sharded) has
            // moments that read "not complete yet".
            let incomplete = from > 1 && to > 1;
            let start: Server = before
                .iter()
                .map(|o| (o.metadata.name.clone().unwrap(), o.clone()))
                .collect();
            assert_eq!(check(&start, &old, &new, false, &case), "old");
            let ops = plan(&start, &desired, from);
            let mut seen = Vec::new();
            for k in 0..=ops.len() {
                let mut mid = start.clone();
                send(&mut mid, &desired, &ops[..k]);
                let at = format!("{case}, after {:?}", &show_ops(&ops[..k]));
                seen.push(check(&mid, &old, &new, incomplete, &at));
                // The write again from here: retried (the planner still
                // holds the old slots) or after a restart (the list's).
                for (how, slots) in [("retry", from), ("restart", listed_slots(&mid))] {
                    let again = plan(&mid, &desired, slots);
                    for j in 0..=again.len() {
                        let mut then = mid.clone();
                        send(&mut then, &desired, &again[..j]);
                        let at = format!("{at}, {how}: {:?}", show_ops(&again[..j]));
                        check(&then, &old, &new, incomplete, &at);
                        if j == again.len() {
                            assert_eq!(check(&then, &old, &new, false, &at), "new");
                            let names: Vec<&String> = then.keys().collect();
                            let want: Vec<String> = (0..to).map(|i| desired.name(i).1).collect();
                            assert_eq!(names, want.iter().collect::<Vec<_>>(), "{at}");
                        }
                    }
                }
            }
            assert_eq!(seen.last(), Some(&"new"), "{case}");
            eprintln!("{case}: {:?} -> {seen:?}", show_ops(&ops));
        }
    }

    fn show_ops(ops: &[ObjectOp]) -> Vec<String> {
        show(&ObjectPlan {
            ops: ops.to_vec(),
            left_alone: Vec::new(),
        })
    }
}
