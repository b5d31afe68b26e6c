//! Endpoints: apply, change, delete, reset; namespace and label filters, cluster ids,
//! owner uids, Service uids, warnings and skipped counts, invalid names.

use super::*;

#[test]
fn endpoints_apply_change_noop_delete() {
    let mut i = idx(SourceKind::Endpoints);
    assert_eq!(
        i.apply_endpoints(&ep("ns", "web", &["10.0.0.1"], json!({}))),
        vec![k("ns", "web")]
    );
    assert_eq!(i.len(), 1);
    assert_eq!(i.node_count(), 1);
    // resourceVersion bump + annotation: nothing relevant changed.
    let noisy = ep(
        "ns",
        "web",
        &["10.0.0.1"],
        json!({"resourceVersion": "2", "annotations": {"a": "b"}}),
    );
    assert!(i.apply_endpoints(&noisy).is_empty());
    // A not-ready address flapping: no change.
    let mut flap = ep("ns", "web", &["10.0.0.1"], json!({}));
    flap.subsets.as_mut().unwrap()[0].not_ready_addresses = Some(vec![
        serde_json::from_value(json!({"ip": "10.0.0.9"})).unwrap(),
    ]);
    assert!(i.apply_endpoints(&flap).is_empty());
    // Scale up.
    assert_eq!(
        i.apply_endpoints(&ep("ns", "web", &["10.0.0.2", "10.0.0.1"], json!({}))),
        vec![k("ns", "web")]
    );
    assert_eq!(hosts(&i, &k("ns", "web")), vec!["10.0.0.1", "10.0.0.2"]);
    // Scale to zero: still present, with an empty port.
    assert_eq!(
        i.apply_endpoints(&ep("ns", "web", &[], json!({}))),
        vec![k("ns", "web")]
    );
    assert!(i.get(&k("ns", "web")).unwrap().ports["http"].is_empty());
    // Delete.
    assert_eq!(
        i.delete_endpoints(&ep("ns", "web", &[], json!({}))),
        vec![k("ns", "web")]
    );
    assert!(i.get(&k("ns", "web")).is_none());
    assert!(
        i.delete_endpoints(&ep("ns", "web", &[], json!({})))
            .is_empty()
    );
}

#[test]
fn endpoints_reset_reports_only_changed_and_vanished() {
    let mut i = idx(SourceKind::Endpoints);
    i.apply_endpoints(&ep("ns", "a", &["10.0.0.1"], json!({})));
    i.apply_endpoints(&ep("ns", "b", &["10.0.0.2"], json!({})));
    i.apply_endpoints(&ep("ns", "c", &["10.0.0.3"], json!({})));
    let changed = i.reset_endpoints(&[
        ep("ns", "a", &["10.0.0.1"], json!({"resourceVersion": "9"})),
        ep("ns", "b", &["10.0.0.22"], json!({})),
        ep("ns", "d", &["10.0.0.4"], json!({})),
    ]);
    assert_eq!(changed, vec![k("ns", "b"), k("ns", "c"), k("ns", "d")]);
    assert!(i.get(&k("ns", "c")).is_none());
    assert_eq!(i.len(), 3);
    assert!(
        i.reset_endpoints(&[
            ep("ns", "a", &["10.0.0.1"], json!({})),
            ep("ns", "b", &["10.0.0.22"], json!({})),
            ep("ns", "d", &["10.0.0.4"], json!({})),
        ])
        .is_empty()
    );
}

#[test]
fn namespace_and_label_filters() {
    let filter = NamespaceFilter::Match(vec![AnchoredRegex::new("dev").unwrap()]);
    let mut i = Index::new(
        String::new(),
        SourceKind::Endpoints,
        ConvertOptions::default(),
        filter,
    )
    .with_label_selector(LabelSelector::parse("app=web").unwrap());
    let labelled = json!({"labels": {"app": "web"}});
    assert!(
        i.apply_endpoints(&ep("dev-2", "web", &["10.0.0.1"], labelled.clone()))
            .is_empty()
    );
    assert!(
        i.apply_endpoints(&ep("dev", "web", &["10.0.0.1"], json!({})))
            .is_empty()
    );
    assert_eq!(
        i.apply_endpoints(&ep("dev", "web", &["10.0.0.1"], labelled)),
        vec![k("dev", "web")]
    );
    // Label removed: the object leaves the selection -> treated as delete.
    assert_eq!(
        i.apply_endpoints(&ep("dev", "web", &["10.0.0.1"], json!({}))),
        vec![k("dev", "web")]
    );
    assert!(i.is_empty());
}

#[test]
fn cluster_id_goes_into_keys() {
    let mut i = Index::new(
        "c1".into(),
        SourceKind::Endpoints,
        ConvertOptions::default(),
        NamespaceFilter::All,
    );
    assert_eq!(
        i.apply_endpoints(&ep("ns", "web", &["10.0.0.1"], json!({}))),
        vec![ServiceKey::new("c1", "ns", "web")]
    );
    assert_eq!(i.iter().next().unwrap().key.to_string(), "c1/ns/web");
}

#[test]
fn owner_uid_from_owner_refs_or_service_lookup() {
    let mut i = idx(SourceKind::Endpoints);
    let owned = json!({"ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": "web", "uid": "u-own"}]});
    i.apply_endpoints(&ep("ns", "web", &["10.0.0.1"], owned));
    assert_eq!(
        i.get(&k("ns", "web")).unwrap().owner_uid.as_deref(),
        Some("u-own")
    );
    i.apply_endpoints(&ep("ns", "api", &["10.0.0.1"], json!({})));
    assert_eq!(i.get(&k("ns", "api")).unwrap().owner_uid, None);
    assert_eq!(
        i.set_service_uid("ns", "api", Some("u-api".into())),
        vec![k("ns", "api")]
    );
    assert_eq!(
        i.get(&k("ns", "api")).unwrap().owner_uid.as_deref(),
        Some("u-api")
    );
    assert!(
        i.set_service_uid("ns", "api", Some("u-api".into()))
            .is_empty()
    );
    // Survives later updates of the Endpoints.
    assert!(
        i.apply_endpoints(&ep("ns", "api", &["10.0.0.1"], json!({})))
            .is_empty()
    );
    // An explicit ownerReference wins over the looked-up UID.
    assert!(
        i.set_service_uid("ns", "web", Some("other".into()))
            .is_empty()
    );
    // A UID for a Service with no endpoints object yet is remembered.
    assert!(
        i.set_service_uid("ns", "later", Some("u-later".into()))
            .is_empty()
    );
    i.apply_endpoints(&ep("ns", "later", &[], json!({})));
    assert_eq!(
        i.get(&k("ns", "later")).unwrap().owner_uid.as_deref(),
        Some("u-later")
    );
}

#[test]
fn service_uids_relist_recreate_and_vanish() {
    let mut i = Index::new(
        String::new(),
        SourceKind::Endpoints,
        ConvertOptions::default(),
        NamespaceFilter::NotEqual("kube-system".into()),
    );
    i.apply_endpoints(&ep("ns", "web", &["10.0.0.1"], json!({})));
    i.apply_endpoints(&ep("ns", "api", &["10.0.0.2"], json!({})));
    let uids = |v: &[(&str, &str, &str)]| -> Vec<(String, String, String)> {
        v.iter()
            .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
            .collect()
    };
    // First list: both owners appear; a Service in an unselected namespace is ignored.
    assert_eq!(
        i.reset_service_uids(uids(&[
            ("ns", "web", "u1"),
            ("ns", "api", "u2"),
            ("kube-system", "dns", "u3"),
        ])),
        vec![k("ns", "api"), k("ns", "web")]
    );
    assert_eq!(i.service_uids.len(), 2);
    // The same relist again changes nothing.
    assert!(
        i.reset_service_uids(uids(&[("ns", "web", "u1"), ("ns", "api", "u2")]))
            .is_empty()
    );
    // web re-created with a new UID, api gone: both change.
    assert_eq!(
        i.reset_service_uids(uids(&[("ns", "web", "u1b")])),
        vec![k("ns", "api"), k("ns", "web")]
    );
    assert_eq!(
        i.get(&k("ns", "web")).unwrap().owner_uid.as_deref(),
        Some("u1b")
    );
    // A missing Service never holds the service back: published, no owner.
    assert_eq!(i.get(&k("ns", "api")).unwrap().owner_uid, None);
    assert_eq!(hosts(&i, &k("ns", "api")), vec!["10.0.0.2"]);
    // Incremental: delete, then re-create with another UID.
    assert_eq!(i.set_service_uid("ns", "web", None), vec![k("ns", "web")]);
    assert!(i.set_service_uid("ns", "web", None).is_empty());
    assert_eq!(
        i.set_service_uid("ns", "web", Some("u1c".into())),
        vec![k("ns", "web")]
    );
    assert_eq!(
        i.get(&k("ns", "web")).unwrap().owner_uid.as_deref(),
        Some("u1c")
    );
    assert!(
        i.set_service_uid("kube-system", "dns", Some("u3".into()))
            .is_empty()
    );
}

#[test]
fn skipped_counts_follow_logged_warnings_not_events() {
    let mut i = idx(SourceKind::Endpoints);
    let bad: Endpoints = serde_json::from_value(json!({
            "metadata": {"name": "bad", "namespace": "ns"},
            "subsets": [{"addresses": [{"ip": "999.1.1.1"}, {"ip": "10.0.0.1"}],
                         "ports": [{"name": "a", "port": 0}, {"name": "b", "port": 80}, {"name": "b", "port": 81}]}]
        }))
        .unwrap();
    i.apply_endpoints(&bad);
    let want = BTreeMap::from([
        (SkipReason::InvalidAddress, 1),
        (SkipReason::InvalidPort, 1),
        (SkipReason::DuplicatePortName, 1),
    ]);
    assert_eq!(i.take_skipped(), want);
    assert!(i.take_skipped().is_empty(), "drained");
    // The same object again, and a relist finding it unchanged: not counted again.
    i.apply_endpoints(&bad);
    i.reset_endpoints(std::slice::from_ref(&bad));
    assert!(i.take_skipped().is_empty());
    // A relist without it drops its warnings; when it comes back it counts again.
    i.reset_endpoints::<Endpoints>(&[]);
    assert_eq!(i.warnings().count(), 0);
    i.apply_endpoints(&bad);
    assert_eq!(i.take_skipped(), want);
    // A nameless object counts every time (there is no object to remember).
    let nameless: Endpoints =
        serde_json::from_value(json!({"metadata": {"namespace": "ns"}})).unwrap();
    i.apply_endpoints(&nameless);
    i.apply_endpoints(&nameless);
    assert_eq!(
        i.take_skipped(),
        BTreeMap::from([(SkipReason::MissingName, 2)])
    );

    let mut s = idx(SourceKind::EndpointSlice);
    let orphan = slice("ns", "orphan", None, json!([{"addresses": ["10.0.0.1"]}]));
    s.apply_slice(&orphan);
    s.reset_slices(std::slice::from_ref(&orphan));
    assert_eq!(
        s.take_skipped(),
        BTreeMap::from([(SkipReason::MissingServiceLabel, 1)])
    );
    let v6_in_v4 = slice(
        "ns",
        "w",
        Some("web"),
        json!([{"addresses": ["fd00::1"]}, {"addresses": []}, {"addresses": ["10.0.0.2"]}]),
    );
    s.apply_slice(&v6_in_v4);
    s.reset_slices(&[orphan, v6_in_v4]);
    assert_eq!(
        s.take_skipped(),
        BTreeMap::from([
            (SkipReason::InvalidAddress, 1),
            (SkipReason::MissingAddress, 1)
        ])
    );
    assert_eq!(hosts(&s, &k("ns", "web")), vec!["10.0.0.2"]);
}

/// `web.1` is the object name of shard 1 of `web` (and `x.web` that of
/// `web` of cluster `x` in a fixed namespace): a slice labelled, or an
/// Endpoints named, so belongs to no Service and must never be indexed,
/// nor delete what `web` published. Skipped, warned once, counted.
#[test]
fn invalid_service_names_are_skipped_and_never_touch_another_service() {
    let mut s = idx(SourceKind::EndpointSlice);
    let web = slice(
        "ns",
        "web-a",
        Some("web"),
        json!([{"addresses": ["10.0.0.1"]}]),
    );
    assert_eq!(s.apply_slice(&web), vec![k("ns", "web")]);
    for (n, label) in ["web.1", "Web", "1web", "web_1", &"w".repeat(64)]
        .iter()
        .enumerate()
    {
        let bad = slice(
            "ns",
            &format!("bad-{n}"),
            Some(label),
            json!([{"addresses": ["10.9.9.9"]}]),
        );
        assert!(s.apply_slice(&bad).is_empty(), "{label}: indexed");
        assert!(
            s.delete_slice(&bad).is_empty(),
            "{label}: delete touched a service"
        );
    }
    let bad = slice(
        "ns",
        "bad",
        Some("web.1"),
        json!([{"addresses": ["10.9.9.9"]}]),
    );
    s.apply_slice(&bad);
    s.apply_slice(&bad);
    s.reset_slices(&[web.clone(), bad.clone()]);
    assert_eq!(
        s.take_skipped(),
        BTreeMap::from([(SkipReason::InvalidServiceName, 6)]),
        "five labels, and the sixth slice once although seen three times"
    );
    assert!(
        s.warnings().any(|(_, w)| w
            .iter()
            .any(|w| w.contains("\"web.1\" is not a valid Service name"))),
        "the warning names the label value"
    );
    assert_eq!(s.len(), 1);
    assert_eq!(hosts(&s, &k("ns", "web")), vec!["10.0.0.1"]);
    // A slice whose label becomes invalid leaves its old service.
    let moved = slice(
        "ns",
        "web-a",
        Some("web.2"),
        json!([{"addresses": ["10.0.0.1"]}]),
    );
    assert_eq!(s.apply_slice(&moved), vec![k("ns", "web")]);
    assert_eq!(s.len(), 0);

    let mut e = idx(SourceKind::Endpoints);
    assert_eq!(
        e.apply_endpoints(&ep("ns", "web", &["10.0.0.1"], json!({}))),
        vec![k("ns", "web")]
    );
    let bad = ep("ns", "web.1", &["10.9.9.9"], json!({}));
    assert!(e.apply_endpoints(&bad).is_empty());
    assert!(e.delete_endpoints(&bad).is_empty());
    assert!(
        e.reset_endpoints(&[ep("ns", "web", &["10.0.0.1"], json!({})), bad.clone()])
            .is_empty()
    );
    assert_eq!(e.len(), 1);
    assert_eq!(
        e.take_skipped(),
        BTreeMap::from([(SkipReason::InvalidServiceName, 2)]),
        "once, and once more when the deleted object is listed again"
    );
}
