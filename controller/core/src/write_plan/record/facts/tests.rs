use super::*;
use crate::Node;
use crate::crd::{LABEL_SERVICE_NAME, MAX_OBJECT_PORTS_BYTES, desired_object, desired_objects};
use kube::ResourceExt;

#[test]
fn matches_tolerates_additions_but_not_spec_label_or_owner_changes() {
    let want = desired_object(&svc(&["10.0.0.1"]), &ObjectNaming::source());
    assert!(matches(&want, &want));
    let mut extra = want.clone();
    extra
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("team".into(), "blue".into());
    extra
        .metadata
        .owner_references
        .as_mut()
        .unwrap()
        .push(OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: "other".into(),
            uid: "uid-9".into(),
            ..OwnerReference::default()
        });
    extra
        .annotations_mut()
        .insert("someone/else".into(), "x".into());
    assert!(
        matches(&extra, &want),
        "added labels, owners, annotations are tolerated"
    );
    let mut edited = want.clone();
    edited.spec.ports.insert("bogus".into(), vec![]);
    assert!(!matches(&edited, &want));
    let mut unlabeled = want.clone();
    unlabeled
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .remove(LABEL_SERVICE_NAME);
    assert!(!matches(&unlabeled, &want));
    let mut relabeled = want.clone();
    relabeled
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(LABEL_SERVICE_NAME.into(), "other".into());
    assert!(!matches(&relabeled, &want));
    let mut orphaned = want.clone();
    orphaned.metadata.owner_references = None;
    assert!(!matches(&orphaned, &want));
    // Each field of our owner reference counts.
    let owner_edits: [fn(&mut OwnerReference); 4] = [
        |o| o.uid = "uid-2".into(),
        |o| o.kind = "Pod".into(),
        |o| o.name = "api".into(),
        |o| o.api_version = "v2".into(),
    ];
    for (i, edit) in owner_edits.iter().enumerate() {
        let mut o = want.clone();
        edit(&mut o.metadata.owner_references.as_mut().unwrap()[0]);
        assert!(!matches(&o, &want), "owner edit {i} went unnoticed");
    }
}

#[test]
fn the_spec_digest_finds_an_edit_of_every_spec_field() {
    let want = desired_object(&svc(&["10.0.0.1", "10.0.0.2"]), &ObjectNaming::source());
    let reduced = Facts::of_object(&want);
    assert!(reduced.satisfies(&WantedObject::of(&want)));
    type Edit = (&'static str, fn(&mut DiscoveredServiceSpec));
    let edits: [Edit; 14] = [
        ("cluster", |s| s.cluster = "c9".into()),
        ("service", |s| s.service = "ns/other".into()),
        ("sourceNamespace", |s| s.source_namespace = "other".into()),
        ("sourceName", |s| s.source_name = "other".into()),
        ("source", |s| s.source = SourceKind::Endpoints),
        ("version", |s| s.version = "0000000000000000".into()),
        ("shard added", |s| {
            s.shard = Some(Shard {
                index: 0,
                count: 1,
                versions: Vec::new(),
            })
        }),
        ("node host", |s| {
            s.ports
                .values_mut()
                .for_each(|v| v[0].host = "10.9.9.9".into())
        }),
        ("node port", |s| {
            s.ports.values_mut().for_each(|v| v[0].port += 1)
        }),
        ("node weight", |s| {
            s.ports.values_mut().for_each(|v| v[1].weight += 1)
        }),
        ("node draining", |s| {
            s.ports
                .values_mut()
                .for_each(|v| v[1].draining = Some(true))
        }),
        ("node removed", |s| {
            s.ports.values_mut().for_each(|v| v.truncate(1))
        }),
        ("port added", |s| {
            s.ports.insert("extra".into(), vec![]);
        }),
        ("port renamed", |s| {
            let nodes = s.ports.remove("http").unwrap();
            s.ports.insert("web".into(), nodes);
        }),
    ];
    for (field, edit) in edits {
        let mut edited = want.clone();
        edit(&mut edited.spec);
        assert!(
            !matches(&edited, &want),
            "an edit of {field} went unnoticed"
        );
    }
    // A shard's index and count count too.
    let mut shard = want.clone();
    shard.spec.shard = Some(Shard {
        index: 1,
        count: 3,
        versions: Vec::new(),
    });
    shard
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(LABEL_SHARD.into(), "1".into());
    assert!(matches(&shard, &shard));
    for (index, count) in [(2, 3), (1, 4)] {
        let s = Shard {
            index,
            count,
            versions: Vec::new(),
        };
        let mut o = shard.clone();
        o.spec.shard = Some(s);
        assert!(!matches(&o, &shard));
    }
    // Nodes moved between ports are not the same spec.
    let mut a = PortMap::new();
    a.insert("a".into(), vec![Node::new("10.0.0.1", 80, 1)]);
    a.insert("b".into(), vec![]);
    let mut b = PortMap::new();
    b.insert("a".into(), vec![]);
    b.insert("b".into(), vec![Node::new("10.0.0.1", 80, 1)]);
    assert_ne!(ports_digest(&a), ports_digest(&b));
}

#[test]
fn the_shard_label_is_ours_only_on_shards() {
    let want = desired_object(&svc(&["10.0.0.1"]), &ObjectNaming::source());
    let mut o = want.clone();
    o.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(LABEL_SHARD.into(), "7".into());
    assert!(
        matches(&o, &want),
        "someone's shard label on an unsharded object is tolerated"
    );
    let s = big(40);
    let shards = desired_objects_with_limit(&s, &ObjectNaming::source(), 600);
    assert!(shards.len() > 2);
    let mut relabeled = shards[1].clone();
    relabeled
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(LABEL_SHARD.into(), "0".into());
    assert!(
        !matches(&relabeled, &shards[1]),
        "a shard's label value is ours"
    );
}

#[test]
fn the_wanted_form_equals_the_reduced_desired_objects() {
    let namings = [ObjectNaming::source(), ObjectNaming::fixed("discovery")];
    let keys = [
        ServiceKey::new("", "ns", "web"),
        ServiceKey::new("c1", "ns", "web"),
        ServiceKey::new("", "Bad_NS", "x".repeat(300)),
    ];
    for naming in &namings {
        for key in &keys {
            for uid in [Some("uid-1"), None] {
                let s = svc_at(key.clone(), &["10.0.0.1", "10.0.0.2"], uid);
                let reduced: Vec<WantedObject> = desired_objects(&s, naming)
                    .iter()
                    .map(WantedObject::of)
                    .collect();
                assert_eq!(wanted_objects(&s, naming, MAX_OBJECT_PORTS_BYTES), reduced);
                for o in desired_objects(&s, naming) {
                    assert!(Facts::of_object(&o).labels_ok, "{key} {naming:?}");
                }
            }
        }
        // Sharded: the same, and every shard carries exactly our labels.
        let s = big(40);
        let objs = desired_objects_with_limit(&s, naming, 600);
        assert!(objs.len() > 2, "sharded");
        let reduced: Vec<WantedObject> = objs.iter().map(WantedObject::of).collect();
        assert_eq!(wanted_objects(&s, naming, 600), reduced);
        for o in &objs {
            assert!(Facts::of_object(o).labels_ok);
            let shard = o.spec.shard.as_ref().unwrap();
            let mut ours = labels_for(&s.key, &naming.instance);
            ours.insert(LABEL_SHARD.into(), shard.index.to_string());
            assert_eq!(o.metadata.labels.as_ref(), Some(&ours));
        }
    }
}

fn svc(hosts: &[&str]) -> ServiceNodes {
    svc_at(ServiceKey::new("", "ns", "web"), hosts, Some("uid-1"))
}

fn svc_at(key: ServiceKey, hosts: &[&str], uid: Option<&str>) -> ServiceNodes {
    let mut ports = PortMap::new();
    ports.insert(
        "http".into(),
        hosts.iter().map(|h| Node::new(*h, 80, 50)).collect(),
    );
    ServiceNodes::new(key, SourceKind::EndpointSlice, ports, uid.map(String::from))
}

/// A service of `n` nodes on two ports (big enough to shard with a
/// small limit).
fn big(n: usize) -> ServiceNodes {
    let mut ports = PortMap::new();
    for port in ["grpc", "http"] {
        ports.insert(
            port.into(),
            (0..n)
                .map(|i| Node::new(format!("10.0.{}.{}", i / 250, i % 250 + 1), 80, 50))
                .collect(),
        );
    }
    ServiceNodes::new(
        ServiceKey::new("", "ns", "web"),
        SourceKind::EndpointSlice,
        ports,
        Some("uid-1".into()),
    )
}
