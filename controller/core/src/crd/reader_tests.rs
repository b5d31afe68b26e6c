//! [`ReaderRule`]: everything the writer produces is accepted, in every
//! naming mode; each way of claiming another service is refused.

use super::*;
use crate::model::PortMap;

fn web(cluster: &str) -> ServiceNodes {
    ServiceNodes::new(
        ServiceKey::new(cluster, "default", "web"),
        SourceKind::EndpointSlice,
        PortMap::from([(
            "http".to_string(),
            vec![
                Node::new("10.0.0.1", 8080, 1),
                Node::new("10.0.0.2", 8080, 1),
            ],
        )]),
        Some("uid-1".into()),
    )
}

fn namings() -> [ObjectNaming; 2] {
    [ObjectNaming::source(), ObjectNaming::fixed("kd")]
}

#[test]
fn the_writers_objects_are_accepted_in_every_naming_mode() {
    let long = "s".repeat(70);
    for naming in namings() {
        let rule = ReaderRule::new(naming.clone());
        for cluster in ["", "c1"] {
            let s = web(cluster);
            // Unsharded, and sharded (one node per shard).
            for objs in [
                desired_objects(&s, &naming),
                desired_objects_with_limit(&s, &naming, 1),
            ] {
                for o in &objs {
                    assert_eq!(rule.check(o), Ok(s.key.clone()), "{naming:?} {o:?}");
                }
            }
            // A name the naming scheme shortens and hashes.
            let odd = ServiceNodes::new(
                ServiceKey::new(cluster, "default", format!("Bad_{long}")),
                SourceKind::Endpoints,
                s.ports.clone(),
                None,
            );
            for o in desired_objects_with_limit(&odd, &naming, 1) {
                assert_eq!(rule.check(&o), Ok(odd.key.clone()), "{naming:?} {o:?}");
            }
        }
    }
}

#[test]
fn an_object_in_another_namespace_is_refused() {
    let naming = ObjectNaming::source();
    let mut evil = desired_object(&web(""), &naming);
    evil.metadata.namespace = Some("evil".into());
    assert_eq!(
        ReaderRule::new(naming).check(&evil),
        Err(Disagreement::Namespace {
            service: "default/web".into(),
            expected: "default".into(),
            actual: "evil".into()
        })
    );
    // Fixed mode: only the configured namespace, not the source's.
    let fixed = ObjectNaming::fixed("kd");
    let mut other = desired_object(&web(""), &fixed);
    other.metadata.namespace = Some("default".into());
    let e = ReaderRule::new(fixed).check(&other).unwrap_err();
    assert!(matches!(e, Disagreement::Namespace { .. }), "{e}");
    // A fixed-mode object read with the source rule (wrong namespace).
    let kd = desired_object(&web(""), &ObjectNaming::fixed("kd"));
    let e = ReaderRule::default().check(&kd).unwrap_err();
    assert!(matches!(e, Disagreement::Namespace { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        "default/web belongs in namespace \"default\", not \"kd\""
    );
}

#[test]
fn a_wrong_name_is_refused() {
    let rule = ReaderRule::default();
    let base = desired_object(&web(""), &rule.naming);
    for (name, expected) in [
        ("web-evil", "web"),
        ("web.1", "web"),
        ("c1.web", "web"),
        ("", "web"),
    ] {
        let mut o = base.clone();
        o.metadata.name = Some(name.into());
        assert_eq!(
            rule.check(&o),
            Err(Disagreement::Name {
                service: "default/web".into(),
                expected: expected.into(),
                actual: name.into()
            })
        );
    }
    // A shard must carry its shard name.
    let sharded = desired_objects_with_limit(&web(""), &rule.naming, 1);
    let mut second = sharded[1].clone();
    second.metadata.name = Some("web".into());
    assert!(matches!(
        rule.check(&second),
        Err(Disagreement::Name { expected, .. }) if expected == "web.1"
    ));
    // Multi-cluster: the cluster is part of the name.
    let mut c1 = desired_object(&web("c1"), &rule.naming);
    c1.metadata.name = Some("web".into());
    assert!(matches!(rule.check(&c1), Err(Disagreement::Name { .. })));
}

#[test]
fn labels_that_disagree_with_the_spec_are_refused() {
    let rule = ReaderRule::default();
    let base = desired_object(&web(""), &rule.naming);
    let cases: [(&str, Option<&str>); 6] = [
        (LABEL_SERVICE_NAME, Some("api")),
        (LABEL_SERVICE_NAMESPACE, Some("evil")),
        (LABEL_CLUSTER, Some("c1")),
        (LABEL_MANAGED_BY, Some("someone-else")),
        (LABEL_SERVICE_NAME, None),
        (LABEL_SHARD, Some("1")),
    ];
    for (label, value) in cases {
        let mut o = base.clone();
        let labels = o.metadata.labels.get_or_insert_default();
        match value {
            Some(v) => labels.insert(label.into(), v.into()),
            None => labels.remove(label),
        };
        let e = rule.check(&o).unwrap_err();
        assert!(
            matches!(&e, Disagreement::Label { label: l, .. } if *l == label),
            "{label}={value:?}: {e}"
        );
    }
    // No labels at all.
    let mut bare = base.clone();
    bare.metadata.labels = None;
    let e = rule.check(&bare).unwrap_err();
    assert!(matches!(e, Disagreement::Label { .. }));
    assert_eq!(
        e.to_string(),
        "label app.kubernetes.io/managed-by is absent, the spec of default/web wants \"kube-discovery\""
    );
    // A shard whose label names another shard.
    let mut sharded = desired_objects_with_limit(&web(""), &rule.naming, 1);
    sharded[1]
        .metadata
        .labels
        .get_or_insert_default()
        .insert(LABEL_SHARD.into(), "0".into());
    assert!(matches!(
        rule.check(&sharded[1]),
        Err(Disagreement::Label {
            label: LABEL_SHARD,
            ..
        })
    ));
    // Extra labels are someone else's business.
    let mut extra = base.clone();
    extra
        .metadata
        .labels
        .get_or_insert_default()
        .insert("team".into(), "x".into());
    assert!(rule.check(&extra).is_ok());
}

#[test]
fn an_unsharded_object_may_keep_shard_label_zero_while_unsharding() {
    let rule = ReaderRule::default();
    let mut o = desired_object(&web(""), &rule.naming);
    o.metadata
        .labels
        .get_or_insert_default()
        .insert(LABEL_SHARD.into(), "0".into());
    assert!(rule.check(&o).is_ok());
}

#[test]
fn a_spec_that_disagrees_with_itself_is_refused() {
    let rule = ReaderRule::default();
    let mut o = desired_object(&web(""), &rule.naming);
    o.spec.service = "default/api".into();
    assert!(matches!(rule.check(&o), Err(Disagreement::Service { .. })));
    let mut o = desired_objects_with_limit(&web(""), &rule.naming, 1)[1].clone();
    o.spec.shard = Some(Shard {
        index: 2,
        count: 2,
        versions: Vec::new(),
    });
    assert_eq!(
        rule.check(&o),
        Err(Disagreement::Shard { index: 2, count: 2 })
    );
}

#[test]
fn a_reader_told_the_instance_counts_only_that_installations_objects() {
    let obj = desired_object(&web(""), &ObjectNaming::source().with_instance("edge"));
    let any = ReaderRule::new(ObjectNaming::source());
    assert!(any.check(&obj).is_ok());
    let edge = any.clone().for_instance(Some("edge".into()));
    assert!(edge.check(&obj).is_ok());
    let other = any.for_instance(Some("other".into()));
    let err = other.check(&obj).unwrap_err();
    assert_eq!(
        err.to_string(),
        "label kubediscovery.io/instance is \"edge\", the spec of default/web wants \"other\""
    );
    let mut unlabelled = obj.clone();
    unlabelled
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .remove(LABEL_INSTANCE);
    assert!(
        other.check(&unlabelled).is_err(),
        "no label: not that instance's"
    );
}
