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
