use super::*;
use crate::source::filter::AnchoredRegex;
use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::{Value, json};

/// A fresh resourceVersion, as the API server assigns one on every write
/// (every object a test builds is a new write unless it sets its own).
fn next_rv() -> String {
    static RV: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1000);
    RV.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        .to_string()
}

fn ep(ns: &str, name: &str, ips: &[&str], extra_meta: Value) -> Endpoints {
    let mut meta = json!({"name": name, "namespace": ns, "resourceVersion": next_rv()});
    if let (Some(m), Some(e)) = (meta.as_object_mut(), extra_meta.as_object()) {
        m.extend(e.clone());
    }
    let addrs: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip})).collect();
    serde_json::from_value(json!({
            "metadata": meta,
            "subsets": [{"addresses": addrs, "notReadyAddresses": [], "ports": [{"name": "http", "port": 80}]}]
        }))
        .unwrap()
}

fn slice(ns: &str, name: &str, svc: Option<&str>, eps: Value) -> EndpointSlice {
    let mut labels =
        json!({"endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"});
    if let Some(s) = svc {
        labels["kubernetes.io/service-name"] = json!(s);
    }
    serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns, "labels": labels, "resourceVersion": next_rv(),
                          "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": svc.unwrap_or(""), "uid": "svc-uid"}]},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 80}],
            "endpoints": eps,
        }))
        .unwrap()
}

/// An index with Service-port aliases on (off by default).
fn idx(source: SourceKind) -> Index {
    Index::new(
        String::new(),
        source,
        ConvertOptions {
            service_port_aliases: true,
            ..ConvertOptions::default()
        },
        NamespaceFilter::All,
    )
}

fn k(ns: &str, name: &str) -> ServiceKey {
    ServiceKey::new("", ns, name)
}

fn hosts(i: &Index, key: &ServiceKey) -> Vec<String> {
    i.get(key).unwrap().ports["http"]
        .iter()
        .map(|n| n.host.to_string())
        .collect()
}

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

#[test]
fn slices_merge_move_and_delete() {
    let mut i = idx(SourceKind::EndpointSlice);
    let web = k("ns", "web");
    assert_eq!(
        i.apply_slice(&slice(
            "ns",
            "web-a",
            Some("web"),
            json!([{"addresses": ["10.0.0.1"]}])
        )),
        vec![web.clone()]
    );
    assert_eq!(
        i.apply_slice(&slice(
            "ns",
            "web-b",
            Some("web"),
            json!([{"addresses": ["10.0.0.2"]}])
        )),
        vec![web.clone()]
    );
    assert_eq!(hosts(&i, &web), vec!["10.0.0.1", "10.0.0.2"]);
    assert_eq!(i.get(&web).unwrap().source, SourceKind::EndpointSlice);
    assert_eq!(i.get(&web).unwrap().owner_uid.as_deref(), Some("svc-uid"));
    // Endpoint moves from slice b to slice a: two events, but the final state
    // equals the start, and the intermediate one is reported honestly.
    let c1 = i.apply_slice(&slice(
        "ns",
        "web-a",
        Some("web"),
        json!([{"addresses": ["10.0.0.1"]}, {"addresses": ["10.0.0.2"]}]),
    ));
    assert!(
        c1.is_empty(),
        "10.0.0.2 is now in both slices: deduplicated, no change"
    );
    let c2 = i.apply_slice(&slice("ns", "web-b", Some("web"), json!([])));
    assert!(c2.is_empty());
    assert_eq!(hosts(&i, &web), vec!["10.0.0.1", "10.0.0.2"]);
    // Deleting one slice keeps the service while another slice exists.
    assert!(
        i.delete_slice(&slice("ns", "web-b", Some("web"), json!([])))
            .is_empty()
    );
    assert_eq!(
        i.delete_slice(&slice("ns", "web-a", Some("web"), json!([]))),
        vec![web.clone()]
    );
    assert!(i.get(&web).is_none());
    assert!(i.is_empty());
}

#[test]
fn slice_relabelled_to_another_service_updates_both() {
    let mut i = idx(SourceKind::EndpointSlice);
    i.apply_slice(&slice(
        "ns",
        "s1",
        Some("a"),
        json!([{"addresses": ["10.0.0.1"]}]),
    ));
    i.apply_slice(&slice(
        "ns",
        "s2",
        Some("a"),
        json!([{"addresses": ["10.0.0.2"]}]),
    ));
    let changed = i.apply_slice(&slice(
        "ns",
        "s2",
        Some("b"),
        json!([{"addresses": ["10.0.0.2"]}]),
    ));
    assert_eq!(changed, vec![k("ns", "a"), k("ns", "b")]);
    assert_eq!(hosts(&i, &k("ns", "a")), vec!["10.0.0.1"]);
    assert_eq!(hosts(&i, &k("ns", "b")), vec!["10.0.0.2"]);
}

#[test]
fn slice_without_service_label_is_skipped_with_warning() {
    let mut i = idx(SourceKind::EndpointSlice);
    assert!(
        i.apply_slice(&slice(
            "ns",
            "orphan",
            None,
            json!([{"addresses": ["10.0.0.1"]}])
        ))
        .is_empty()
    );
    assert!(i.is_empty());
    let w: Vec<_> = i.warnings().collect();
    assert_eq!(w.len(), 1);
    assert!(w[0].1[0].contains("no kubernetes.io/service-name label"));
    // Once labelled, the warning is gone.
    i.apply_slice(&slice(
        "ns",
        "orphan",
        Some("web"),
        json!([{"addresses": ["10.0.0.1"]}]),
    ));
    assert_eq!(i.warnings().count(), 0);
    assert!(i.get(&k("ns", "web")).is_some());
    // If a tracked slice loses its label, its service is recomputed.
    i.apply_slice(&slice(
        "ns",
        "s1",
        Some("a"),
        json!([{"addresses": ["10.0.0.1"]}]),
    ));
    assert_eq!(
        i.apply_slice(&slice(
            "ns",
            "s1",
            None,
            json!([{"addresses": ["10.0.0.1"]}])
        )),
        vec![k("ns", "a")]
    );
    assert!(i.get(&k("ns", "a")).is_none());
}

#[test]
fn slice_irrelevant_changes_report_nothing() {
    let mut i = idx(SourceKind::EndpointSlice);
    let eps = json!([{"addresses": ["10.0.0.1"], "conditions": {"ready": true}},
                         {"addresses": ["10.0.0.9"], "conditions": {"ready": false, "serving": false}}]);
    i.apply_slice(&slice("ns", "s1", Some("web"), eps));
    let mut s = slice(
        "ns",
        "s1",
        Some("web"),
        json!([{"addresses": ["10.0.0.1"], "conditions": {"ready": true}},
                                                         {"addresses": ["10.0.0.9"], "conditions": {"ready": false, "serving": true}}]),
    );
    s.metadata.annotations = Some(BTreeMap::from([("x".to_string(), "y".to_string())]));
    s.metadata.resource_version = Some("77".into());
    assert!(i.apply_slice(&s).is_empty());
}

#[test]
fn slices_reset_removes_vanished_keeps_unchanged() {
    let mut i = idx(SourceKind::EndpointSlice);
    i.apply_slice(&slice(
        "ns",
        "a-1",
        Some("a"),
        json!([{"addresses": ["10.0.0.1"]}]),
    ));
    i.apply_slice(&slice(
        "ns",
        "b-1",
        Some("b"),
        json!([{"addresses": ["10.0.0.2"]}]),
    ));
    i.apply_slice(&slice(
        "ns",
        "c-1",
        Some("c"),
        json!([{"addresses": ["10.0.0.3"]}]),
    ));
    let changed = i.reset_slices(&[
        slice("ns", "a-1", Some("a"), json!([{"addresses": ["10.0.0.1"]}])),
        slice(
            "ns",
            "b-2",
            Some("b"),
            json!([{"addresses": ["10.0.0.2"]}, {"addresses": ["10.0.0.5"]}]),
        ),
    ]);
    assert_eq!(changed, vec![k("ns", "b"), k("ns", "c")]);
    assert!(i.get(&k("ns", "c")).is_none());
    assert_eq!(hosts(&i, &k("ns", "b")), vec!["10.0.0.2", "10.0.0.5"]);
    // The replaced slice b-1 is really gone: deleting b-2 removes b.
    assert_eq!(
        i.delete_slice(&slice("ns", "b-2", Some("b"), json!([]))),
        vec![k("ns", "b")]
    );
}

/// The index keeps each slice's contribution, not the object: what it
/// publishes equals the conversion of the raw objects, with topology
/// fields kept only when topology output is on.
#[test]
fn kept_slices_give_what_the_objects_give() {
    let mut s = slice(
        "ns",
        "s1",
        Some("web"),
        json!([{"addresses": ["10.0.0.1"], "hostname": "h", "zone": "z", "nodeName": "n"},
                   {"addresses": ["bad", "10.0.0.2"], "conditions": {"ready": false, "serving": true, "terminating": true}}]),
    );
    s.metadata.annotations = Some(BTreeMap::from([("big".to_string(), "x".repeat(1000))]));
    s.metadata.managed_fields = Some(vec![Default::default()]);
    for topology in [false, true] {
        let opts = ConvertOptions {
            topology,
            drain_terminating: crate::source::convert::Drain::Fallback,
            ..Default::default()
        };
        let mut i = Index::new(
            String::new(),
            SourceKind::EndpointSlice,
            opts.clone(),
            NamespaceFilter::All,
        );
        i.apply_slice(&s);
        let want = crate::source::convert::from_slices([&s], &opts);
        let got = i.get(&k("ns", "web")).unwrap();
        assert_eq!(got.ports, want.ports);
        assert_eq!(got.owner_uid.as_deref(), Some("svc-uid"));
        assert_eq!(
            got.ports["http"][0].zone(),
            topology.then_some("z"),
            "topology {topology}"
        );
        let (_, w) = i.warnings().next().unwrap();
        assert_eq!(w, &want.warnings);
    }
}

/// A relist fed object by object: the old state stays readable until the
/// finish, an unfinished relist is dropped by the next `begin_reset`, and
/// the result equals `reset_slices` of the same objects.
#[test]
fn streamed_relist_swaps_at_the_end() {
    let a1 = slice("ns", "a-1", Some("a"), json!([{"addresses": ["10.0.0.1"]}]));
    let b1 = slice("ns", "b-1", Some("b"), json!([{"addresses": ["10.0.1.1"]}]));
    let a1_new = slice("ns", "a-1", Some("a"), json!([{"addresses": ["10.0.0.9"]}]));
    let c1 = slice("ns", "c-1", Some("c"), json!([{"addresses": ["10.0.2.1"]}]));
    let mut i = idx(SourceKind::EndpointSlice);
    assert_eq!(i.reset_slices(&[a1.clone(), b1.clone()]).len(), 2);
    // An interrupted relist that saw only c-1 ...
    i.begin_reset();
    i.reset_add_slice(&c1);
    assert_eq!(hosts(&i, &k("ns", "a")), vec!["10.0.0.1"]);
    assert!(i.get(&k("ns", "c")).is_none());
    // ... is dropped by the next one.
    i.begin_reset();
    i.reset_add_slice(&a1_new);
    i.reset_add_slice(&b1);
    assert_eq!(
        hosts(&i, &k("ns", "a")),
        vec!["10.0.0.1"],
        "old state until the finish"
    );
    assert_eq!(i.finish_reset_slices(), vec![k("ns", "a")]);
    assert_eq!(hosts(&i, &k("ns", "a")), vec!["10.0.0.9"]);
    assert!(i.get(&k("ns", "c")).is_none());
    let mut reference = idx(SourceKind::EndpointSlice);
    reference.reset_slices(&[a1_new, b1]);
    assert_eq!(
        i.iter().cloned().collect::<Vec<_>>(),
        reference.iter().cloned().collect::<Vec<_>>()
    );
    assert_eq!(i.node_count(), 2);
    // An empty relist removes everything.
    i.begin_reset();
    assert_eq!(i.finish_reset_slices(), vec![k("ns", "a"), k("ns", "b")]);
    assert_eq!((i.len(), i.node_count()), (0, 0));
}

/// Endpoints relist: unchanged services keep their shared allocation, and a
/// Service UID learned while the list arrives is not lost.
#[test]
fn streamed_endpoints_relist_shares_unchanged_and_keeps_uid_updates() {
    let mut i = idx(SourceKind::Endpoints);
    i.reset_endpoints(&[
        ep("ns", "a", &["10.0.0.1"], json!({})),
        ep("ns", "b", &["10.0.0.2"], json!({})),
    ]);
    let a_before = i.get_arc(&k("ns", "a")).unwrap();
    i.begin_reset();
    i.reset_add_endpoints(&ep("ns", "a", &["10.0.0.1"], json!({})));
    i.reset_add_endpoints(&ep("ns", "b", &["10.0.0.2", "10.0.0.3"], json!({})));
    // The Service watch reports b's UID before the list is complete.
    assert_eq!(
        i.set_service_uid("ns", "b", Some("uid-b".into())),
        vec![k("ns", "b")]
    );
    assert_eq!(i.finish_reset_endpoints(), vec![k("ns", "b")]);
    let b = i.get(&k("ns", "b")).unwrap();
    assert_eq!(b.owner_uid.as_deref(), Some("uid-b"));
    assert_eq!(b.node_count(), 2);
    assert!(Arc::ptr_eq(&a_before, &i.get_arc(&k("ns", "a")).unwrap()));
    assert_eq!(i.node_count(), 3);
}

/// Incremental updates and a relist must agree: applying the same slices in
/// any order (with redundant re-applies and a delete of a slice that is later
/// re-created) ends in the state `reset_slices(final set)` produces.
#[test]
fn incremental_equals_relist_in_any_order() {
    let all: Vec<EndpointSlice> = vec![
        slice(
            "ns",
            "a-1",
            Some("a"),
            json!([{"addresses": ["10.0.0.1"]}, {"addresses": ["10.0.0.2"], "conditions": {"ready": false}}]),
        ),
        slice(
            "ns",
            "a-2",
            Some("a"),
            json!([{"addresses": ["10.0.0.2"]}, {"addresses": ["10.0.0.3"], "conditions": {"terminating": true, "ready": false, "serving": true}}]),
        ),
        slice("ns", "a-3", Some("a"), json!([{"addresses": ["10.0.0.3"]}])),
        slice("ns", "b-1", Some("b"), json!([{"addresses": ["10.0.1.1"]}])),
        slice(
            "other",
            "a-1",
            Some("a"),
            json!([{"addresses": ["10.0.2.1"]}]),
        ),
        slice("ns", "c-1", Some("c"), json!([])),
    ];
    let mut reference = idx(SourceKind::EndpointSlice);
    reference.reset_slices(&all);
    let want: Vec<ServiceNodes> = reference.iter().cloned().collect();
    assert_eq!(want.len(), 4);
    // Every rotation of the order, forwards and backwards.
    for rot in 0..all.len() {
        for reverse in [false, true] {
            let mut order: Vec<&EndpointSlice> =
                all.iter().cycle().skip(rot).take(all.len()).collect();
            if reverse {
                order.reverse();
            }
            let mut i = idx(SourceKind::EndpointSlice);
            for s in &order {
                i.apply_slice(s);
            }
            // Redundant events change nothing.
            for s in &order {
                assert!(i.apply_slice(s).is_empty());
            }
            // Delete and re-create one slice.
            i.delete_slice(order[0]);
            i.apply_slice(order[0]);
            let got: Vec<ServiceNodes> = i.iter().cloned().collect();
            assert_eq!(got, want, "rotation {rot}, reverse {reverse}");
            let sum: usize = got.iter().map(ServiceNodes::node_count).sum();
            assert_eq!(i.node_count(), sum, "running node total");
            // A relist of the same state reports nothing.
            assert!(i.reset_slices(&all).is_empty());
        }
    }
}

/// `n` services `s0..`, each with slices `-a` and `-b` of one endpoint each.
fn slice_fleet(n: usize) -> Vec<EndpointSlice> {
    (0..n)
        .flat_map(|i| {
            ["a", "b"].into_iter().enumerate().map(move |(j, part)| {
                slice(
                    "ns",
                    &format!("s{i}-{part}"),
                    Some(&format!("s{i}")),
                    json!([{"addresses": [format!("10.{j}.0.{i}")]}]),
                )
            })
        })
        .collect()
}

fn fresh_relist(list: &[EndpointSlice]) -> Index {
    let mut reference = idx(SourceKind::EndpointSlice);
    reference.reset_slices(list);
    reference
}

fn same_state(got: &Index, want: &Index) {
    assert_eq!(
        got.iter().cloned().collect::<Vec<_>>(),
        want.iter().cloned().collect::<Vec<_>>()
    );
    assert_eq!(got.node_count(), want.node_count());
    assert_eq!(
        got.warnings().collect::<Vec<_>>(),
        want.warnings().collect::<Vec<_>>()
    );
}

/// A relist converts only the objects whose resourceVersion changed and
/// merges only the services they touch; the result equals a fresh index.
#[test]
fn slice_relist_converts_and_merges_only_what_changed() {
    let fleet = slice_fleet(20);
    let mut i = idx(SourceKind::EndpointSlice);
    assert_eq!(i.reset_slices(&fleet).len(), 20);
    assert_eq!(
        i.take_work(),
        Work {
            converted: 40,
            merged: 20
        }
    );
    let before: BTreeMap<ServiceKey, Arc<ServiceNodes>> = i.services.clone();

    // The same list again (same resourceVersions): no conversion, no merge.
    assert!(i.reset_slices(&fleet).is_empty());
    assert_eq!(i.take_work(), Work::default());

    let by_name = |n: &str| {
        fleet
            .iter()
            .find(|s| s.metadata.name.as_deref() == Some(n))
            .unwrap()
            .clone()
    };
    let mut list: Vec<EndpointSlice> = fleet
        .iter()
        .filter(|s| {
            let n = s.metadata.name.as_deref().unwrap();
            // s5-b dropped (s5 keeps s5-a); s9 dropped entirely; s11-b relabelled.
            !["s5-b", "s9-a", "s9-b", "s11-b", "s3-a"].contains(&n)
        })
        .cloned()
        .collect();
    // s3-a modified (a new write: new resourceVersion).
    list.push(slice(
        "ns",
        "s3-a",
        Some("s3"),
        json!([{"addresses": ["10.9.9.3"]}]),
    ));
    // s7-c added.
    list.push(slice(
        "ns",
        "s7-c",
        Some("s7"),
        json!([{"addresses": ["10.9.9.7"]}]),
    ));
    // s11-b moved to service s12.
    let mut moved = by_name("s11-b");
    moved
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(SERVICE_NAME_LABEL.to_string(), "s12".to_string());
    moved.metadata.resource_version = Some(next_rv());
    list.push(moved);
    // A real list is in name order; the index must not depend on it.
    list.reverse();

    let changed = i.reset_slices(&list);
    assert_eq!(
        changed,
        ["s11", "s12", "s3", "s5", "s7", "s9"]
            .map(|n| k("ns", n))
            .to_vec()
    );
    assert_eq!(
        i.take_work(),
        Work {
            converted: 3,
            merged: 5
        },
        "3 new objects converted; s3, s5, s7, s11, s12 merged (s9 only removed)"
    );
    assert!(i.get(&k("ns", "s9")).is_none());
    assert_eq!(
        hosts(&i, &k("ns", "s12")),
        vec!["10.0.0.12", "10.1.0.11", "10.1.0.12"]
    );
    same_state(&i, &fresh_relist(&list));
    // Unchanged services keep their very allocation (nothing to publish).
    for (key, old) in &before {
        if !changed.contains(key) {
            assert!(Arc::ptr_eq(old, &i.get_arc(key).unwrap()), "{key}");
        }
    }
    // The dropped slices are really gone: deleting s5-a now removes s5.
    assert_eq!(i.delete_slice(&by_name("s5-a")), vec![k("ns", "s5")]);
}

/// What resourceVersion equality does and does not prove.
#[test]
fn slice_relist_reuse_needs_equal_nonempty_version_and_same_service() {
    let a = slice("ns", "a-1", Some("a"), json!([{"addresses": ["10.0.0.1"]}]));
    let mut i = idx(SourceKind::EndpointSlice);
    i.reset_slices(std::slice::from_ref(&a));
    i.take_work();

    // Equal resourceVersion: the API server guarantees the same object, so
    // the kept contribution is used even if (only a fake server could do
    // this) the content differs.
    let mut forged = slice(
        "ns",
        "a-1",
        Some("a"),
        json!([{"addresses": ["10.0.0.99"]}]),
    );
    forged.metadata.resource_version = a.metadata.resource_version.clone();
    assert!(i.reset_slices(std::slice::from_ref(&forged)).is_empty());
    assert_eq!(hosts(&i, &k("ns", "a")), vec!["10.0.0.1"]);
    assert_eq!(i.take_work(), Work::default());

    // Equal resourceVersion but another Service label: converted, both merged.
    let mut relabelled = a.clone();
    relabelled
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(SERVICE_NAME_LABEL.to_string(), "b".to_string());
    assert_eq!(
        i.reset_slices(std::slice::from_ref(&relabelled)),
        vec![k("ns", "a"), k("ns", "b")]
    );
    assert_eq!(
        i.take_work(),
        Work {
            converted: 1,
            merged: 1
        }
    );

    // No (or an empty) resourceVersion proves nothing: always converted.
    for rv in [None, Some(String::new())] {
        let mut bare = slice("ns", "c-1", Some("c"), json!([{"addresses": ["10.0.0.3"]}]));
        bare.metadata.resource_version = rv.clone();
        i.reset_slices(std::slice::from_ref(&bare));
        i.take_work();
        bare.endpoints[0].addresses = vec!["10.0.0.4".into()];
        assert_eq!(
            i.reset_slices(std::slice::from_ref(&bare)),
            vec![k("ns", "c")],
            "resourceVersion {rv:?}"
        );
        assert_eq!(hosts(&i, &k("ns", "c")), vec!["10.0.0.4"]);
        assert_eq!(
            i.take_work(),
            Work {
                converted: 1,
                merged: 1
            }
        );
    }

    // An unchanged slice whose Service UID changes while the list arrives
    // (slices without an ownerReference use the looked-up UID).
    let mut orphan = slice("ns", "d-1", Some("d"), json!([{"addresses": ["10.0.0.5"]}]));
    orphan.metadata.owner_references = None;
    i.reset_slices(std::slice::from_ref(&orphan));
    i.begin_reset();
    i.reset_add_slice(&orphan);
    assert_eq!(
        i.set_service_uid("ns", "d", Some("uid-d".into())),
        vec![k("ns", "d")]
    );
    assert!(
        i.finish_reset_slices().is_empty(),
        "already published when the UID arrived"
    );
    assert_eq!(
        i.get(&k("ns", "d")).unwrap().owner_uid.as_deref(),
        Some("uid-d")
    );
    let mut reference = idx(SourceKind::EndpointSlice);
    reference.set_service_uid("ns", "d", Some("uid-d".into()));
    reference.reset_slices(std::slice::from_ref(&orphan));
    same_state(&i, &reference);
}

/// Warnings and skip counts stay right when slices are reused: an
/// unchanged bad slice is neither re-logged nor re-counted, a dropped one
/// takes its warnings along, a new bad one is counted.
#[test]
fn slice_relist_reuse_keeps_warnings_and_skip_counts_right() {
    let good = slice(
        "ns",
        "w-1",
        Some("web"),
        json!([{"addresses": ["10.0.0.1"]}]),
    );
    let bad = slice(
        "ns",
        "w-2",
        Some("web"),
        json!([{"addresses": ["fd00::1"]}, {"addresses": ["10.0.0.2"]}]),
    );
    let orphan = slice("ns", "o-1", None, json!([{"addresses": ["10.0.0.3"]}]));
    let mut i = idx(SourceKind::EndpointSlice);
    i.reset_slices(&[good.clone(), bad.clone(), orphan.clone()]);
    assert_eq!(
        i.take_skipped(),
        BTreeMap::from([
            (SkipReason::InvalidAddress, 1),
            (SkipReason::MissingServiceLabel, 1)
        ])
    );
    assert_eq!(i.warnings().count(), 2);
    // Unchanged: nothing logged or counted again.
    assert!(
        i.reset_slices(&[good.clone(), bad.clone(), orphan.clone()])
            .is_empty()
    );
    assert!(i.take_skipped().is_empty());
    assert_eq!(i.warnings().count(), 2);
    // The bad slice and the orphan dropped: their warnings go, web changes.
    assert_eq!(
        i.reset_slices(std::slice::from_ref(&good)),
        vec![k("ns", "web")]
    );
    assert_eq!(i.warnings().count(), 0);
    assert_eq!(hosts(&i, &k("ns", "web")), vec!["10.0.0.1"]);
    // Back again (same objects): logged and counted again.
    i.reset_slices(&[good.clone(), bad.clone(), orphan.clone()]);
    assert_eq!(
        i.take_skipped(),
        BTreeMap::from([
            (SkipReason::InvalidAddress, 1),
            (SkipReason::MissingServiceLabel, 1)
        ])
    );
    same_state(&i, &fresh_relist(&[good, bad, orphan]));
}

/// Endpoints mode: a relist converts only objects with a new
/// resourceVersion, drops vanished ones, keeps warnings, owners and shared
/// allocations of the unchanged ones.
#[test]
fn endpoints_relist_converts_only_what_changed() {
    let owned = json!({"ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": "x", "uid": "u-own"}]});
    let all: Vec<Endpoints> = (0..10)
        .map(|n| {
            ep(
                "ns",
                &format!("e{n}"),
                &[&format!("10.0.0.{n}")],
                owned.clone(),
            )
        })
        .collect();
    let bad: Endpoints = serde_json::from_value(json!({
            "metadata": {"name": "bad", "namespace": "ns", "resourceVersion": "b1"},
            "subsets": [{"addresses": [{"ip": "999.1.1.1"}, {"ip": "10.0.1.1"}], "ports": [{"name": "http", "port": 80}]}]
        }))
        .unwrap();
    let mut list = all.clone();
    list.push(bad.clone());
    let mut i = idx(SourceKind::Endpoints);
    assert_eq!(i.reset_endpoints(&list).len(), 11);
    assert_eq!(i.take_work().converted, 11);
    assert_eq!(
        i.take_skipped(),
        BTreeMap::from([(SkipReason::InvalidAddress, 1)])
    );
    let e1 = i.get_arc(&k("ns", "e1")).unwrap();

    // e3 changed, e7 gone, the rest (and the bad one) unchanged.
    let mut next: Vec<Endpoints> = list
        .iter()
        .filter(|e| !matches!(e.metadata.name.as_deref(), Some("e3" | "e7")))
        .cloned()
        .collect();
    next.push(ep("ns", "e3", &["10.0.0.33"], owned.clone()));
    assert_eq!(i.reset_endpoints(&next), vec![k("ns", "e3"), k("ns", "e7")]);
    assert_eq!(i.take_work().converted, 1);
    assert!(
        i.take_skipped().is_empty(),
        "the unchanged bad object is not counted again"
    );
    assert_eq!(i.warnings().count(), 1);
    assert!(Arc::ptr_eq(&e1, &i.get_arc(&k("ns", "e1")).unwrap()));
    assert_eq!(
        i.get(&k("ns", "e1")).unwrap().owner_uid.as_deref(),
        Some("u-own")
    );
    let mut reference = idx(SourceKind::Endpoints);
    reference.reset_endpoints(&next);
    same_state(&i, &reference);
    // The kept owner survives a Service UID update after the relist:
    // the ownerReference on the object still wins.
    assert!(
        i.set_service_uid("ns", "e1", Some("other".into()))
            .is_empty()
    );

    // An unchanged object whose Service UID arrives while the list does.
    let bare = ep("ns", "u", &["10.0.2.1"], json!({}));
    i.reset_endpoints(std::slice::from_ref(&bare));
    i.begin_reset();
    i.reset_add_endpoints(&bare);
    assert_eq!(
        i.set_service_uid("ns", "u", Some("uid-u".into())),
        vec![k("ns", "u")]
    );
    assert!(i.finish_reset_endpoints().is_empty());
    assert_eq!(
        i.get(&k("ns", "u")).unwrap().owner_uid.as_deref(),
        Some("uid-u")
    );
    assert_eq!(
        i.take_work().converted,
        1,
        "the first relist converted it, the second reused it"
    );
    // Deselected objects are not reused: with a label selector the same
    // object (same resourceVersion) that does not match is dropped.
    let mut sel = Index::new(
        String::new(),
        SourceKind::Endpoints,
        ConvertOptions::default(),
        NamespaceFilter::All,
    )
    .with_label_selector(LabelSelector::parse("app=web").unwrap());
    sel.reset_endpoints(std::slice::from_ref(&bare));
    assert!(sel.is_empty());
    assert!(sel.reset_endpoints(std::slice::from_ref(&bare)).is_empty());
    assert!(sel.is_empty());
}

fn service_info(ports: Value) -> ServiceInfo {
    let s: k8s_openapi::api::core::v1::Service = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "ns"},
        "spec": {"ports": ports}
    }))
    .unwrap();
    ServiceInfo::from_service(&s)
}

/// The Service's ports give aliases and appProtocols in both modes,
/// whichever of Service and endpoints comes first; without a Service
/// the value (and its version) is exactly what it was before Services
/// were read.
#[test]
fn service_ports_give_aliases_and_app_protocols_in_both_modes() {
    let http = service_info(json!([
        {"name": "http", "port": 8000, "targetPort": "web", "appProtocol": "kubernetes.io/h2c"}
    ]));
    for source in [SourceKind::Endpoints, SourceKind::EndpointSlice] {
        let mut i = idx(source);
        let apply = |i: &mut Index| match source {
            SourceKind::Endpoints => i.apply_endpoints(&ep("ns", "web", &["10.0.0.1"], json!({}))),
            SourceKind::EndpointSlice => i.apply_slice(&slice(
                "ns",
                "web-1",
                Some("web"),
                json!([{"addresses": ["10.0.0.1"]}]),
            )),
        };
        assert_eq!(apply(&mut i), vec![k("ns", "web")]);
        let plain = i.get(&k("ns", "web")).unwrap().clone();
        assert!(plain.extras.is_empty());
        assert_eq!(
            plain.version,
            crate::model::version::object_version(source, &plain.ports, plain.owner_uid.as_deref())
        );
        // The Service arrives: same nodes, aliases and appProtocol added.
        assert_eq!(
            i.set_service("ns", "web", Some(http.clone())),
            vec![k("ns", "web")]
        );
        let with = i.get(&k("ns", "web")).unwrap().clone();
        assert_eq!(with.ports, plain.ports);
        assert_eq!(with.extras.aliases["8000"], "http");
        assert_eq!(with.extras.app_protocols["http"], "kubernetes.io/h2c");
        assert_ne!(with.version, plain.version);
        assert_eq!(with.nodes("8000"), with.nodes("http"));
        assert!(with.nodes("8000").is_some() && with.nodes("9999").is_none());
        // Same Service again: nothing changed.
        assert!(i.set_service("ns", "web", Some(http.clone())).is_empty());
        // An endpoint change keeps the extras.
        let _ = apply(&mut i);
        assert_eq!(i.get(&k("ns", "web")).unwrap().extras, with.extras);
        // Service deleted: back to the plain value, same version as before.
        assert_eq!(i.set_service("ns", "web", None), vec![k("ns", "web")]);
        assert_eq!(i.get(&k("ns", "web")).unwrap(), &plain);
        // Service first, endpoints after: the same result.
        let mut j = idx(source);
        assert!(j.set_service("ns", "web", Some(http.clone())).is_empty());
        let _ = apply(&mut j);
        assert_eq!(j.get(&k("ns", "web")).unwrap().extras, with.extras);
    }
}

/// A Service (re)list replaces the known Services: changed and vanished
/// ones are reported, unchanged ones not; a Service change while an
/// endpoints relist is arriving ends up in the relist's result.
#[test]
fn service_relists_and_changes_during_an_endpoints_relist() {
    let mut i = idx(SourceKind::Endpoints);
    i.apply_endpoints(&ep("ns", "web", &["10.0.0.1"], json!({})));
    i.apply_endpoints(&ep("ns", "api", &["10.0.0.2"], json!({})));
    let http80 = service_info(json!([{"name": "http", "port": 80}]));
    let http81 = service_info(json!([{"name": "http", "port": 81}]));
    let all = |web: &ServiceInfo| {
        vec![
            ("ns".to_string(), "web".to_string(), web.clone()),
            ("ns".to_string(), "api".to_string(), http81.clone()),
        ]
    };
    assert_eq!(
        i.reset_services(all(&http80)),
        vec![k("ns", "api"), k("ns", "web")]
    );
    assert_eq!(i.service_count(), 2);
    assert_eq!(i.get(&k("ns", "web")).unwrap().extras.aliases["80"], "http");
    assert!(i.reset_services(all(&http80)).is_empty());
    // The Service changes while an endpoints relist is arriving.
    i.begin_reset();
    i.reset_add_endpoints(&ep("ns", "web", &["10.0.0.1"], json!({})));
    i.reset_add_endpoints(&ep("ns", "api", &["10.0.0.2"], json!({})));
    // Reported at once (the live state has it), and the relist built
    // before it does not undo it.
    assert_eq!(
        i.set_service("ns", "web", Some(http81.clone())),
        vec![k("ns", "web")]
    );
    assert!(i.finish_reset_endpoints().is_empty());
    assert_eq!(i.get(&k("ns", "web")).unwrap().extras.aliases["81"], "http");
    // Gone from the list: its extras go.
    assert_eq!(
        i.reset_services([("ns".to_string(), "api".to_string(), http81.clone())]),
        vec![k("ns", "web")]
    );
    assert!(i.get(&k("ns", "web")).unwrap().extras.is_empty());
    // A Service outside the namespace filter is not kept.
    let mut f = Index::new(
        String::new(),
        SourceKind::Endpoints,
        ConvertOptions::default(),
        NamespaceFilter::Match(vec![AnchoredRegex::new("dev").unwrap()]),
    );
    assert!(f.set_service("ns", "web", Some(http81.clone())).is_empty());
    assert_eq!(f.service_count(), 0);
}

/// `service_port_aliases: false`: no aliases, appProtocols still.
#[test]
fn aliases_can_be_turned_off() {
    let mut i = Index::new(
        String::new(),
        SourceKind::Endpoints,
        ConvertOptions {
            service_port_aliases: false,
            ..ConvertOptions::default()
        },
        NamespaceFilter::All,
    );
    i.apply_endpoints(&ep("ns", "web", &["10.0.0.1"], json!({})));
    i.set_service(
        "ns",
        "web",
        Some(service_info(
            json!([{"name": "http", "port": 8000, "appProtocol": "grpc"}]),
        )),
    );
    let s = i.get(&k("ns", "web")).unwrap();
    assert!(s.extras.aliases.is_empty());
    assert_eq!(s.extras.app_protocols["http"], "grpc");
    assert!(s.nodes("8000").is_none());
}

fn annotated(annotations: Value) -> ServiceInfo {
    let s: k8s_openapi::api::core::v1::Service = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "ns", "annotations": annotations},
        "spec": {"ports": [{"name": "http", "port": 80}]}
    }))
    .unwrap();
    ServiceInfo::from_service(&s)
}

/// `kubediscovery.io/export` and `kubediscovery.io/weight`, in both
/// modes and both export modes: "false" deletes the object and "true"
/// brings it back without a new endpoint event (Endpoints mode keeps
/// the nodes); the weight applies to every node and goes back to
/// `default_weight` without it; invalid values are skipped, warned once
/// and counted, never guessed.
#[test]
fn export_and_weight_annotations() {
    for source in [SourceKind::Endpoints, SourceKind::EndpointSlice] {
        for opt_in in [false, true] {
            let mut i = Index::new(
                String::new(),
                source,
                ConvertOptions {
                    export_opt_in: opt_in,
                    ..ConvertOptions::default()
                },
                NamespaceFilter::All,
            );
            let web = k("ns", "web");
            let _ = match source {
                SourceKind::Endpoints => {
                    i.apply_endpoints(&ep("ns", "web", &["10.0.0.1"], json!({})))
                }
                SourceKind::EndpointSlice => i.apply_slice(&slice(
                    "ns",
                    "web-1",
                    Some("web"),
                    json!([{"addresses": ["10.0.0.1"]}]),
                )),
            };
            // No Service known: published unless opt-in.
            assert_eq!(i.get(&web).is_some(), !opt_in, "{source} opt_in={opt_in}");
            // Unannotated Service: the same.
            let _ = i.set_service("ns", "web", Some(annotated(json!({}))));
            assert_eq!(i.get(&web).is_some(), !opt_in);
            // "true": published, with its nodes.
            let _ = i.set_service(
                "ns",
                "web",
                Some(annotated(json!({"kubediscovery.io/export": "true"}))),
            );
            assert_eq!(hosts(&i, &web), vec!["10.0.0.1"]);
            assert_eq!(i.len(), 1);
            // "false": gone (reported), nodes kept aside.
            assert_eq!(
                i.set_service(
                    "ns",
                    "web",
                    Some(annotated(json!({"kubediscovery.io/export": "false"})))
                ),
                vec![web.clone()]
            );
            assert!(i.get(&web).is_none() && i.is_empty() && i.node_count() == 0);
            // A relist while withheld keeps it withheld.
            match source {
                SourceKind::Endpoints => {
                    assert!(
                        i.reset_endpoints(&[ep("ns", "web", &["10.0.0.1"], json!({}))])
                            .is_empty()
                    )
                }
                SourceKind::EndpointSlice => assert!(
                    i.reset_slices(&[slice(
                        "ns",
                        "web-1",
                        Some("web"),
                        json!([{"addresses": ["10.0.0.1"]}]),
                    )])
                    .is_empty()
                ),
            }
            assert!(i.get(&web).is_none());
            // Weight 7 and "true": back, every node weighs 7.
            assert_eq!(
                i.set_service(
                    "ns",
                    "web",
                    Some(annotated(json!({"kubediscovery.io/export": "true",
                                               "kubediscovery.io/weight": "7"})))
                ),
                vec![web.clone()]
            );
            let s = i.get(&web).unwrap();
            assert_eq!(s.ports["http"][0].weight, 7);
            assert_eq!(i.node_count(), 1);
            assert!(i.take_skipped().is_empty());
            // Invalid values: skipped (as if absent), warned and counted once.
            let bad = annotated(json!({"kubediscovery.io/export": "yes",
                                           "kubediscovery.io/weight": "-1"}));
            let _ = i.set_service("ns", "web", Some(bad.clone()));
            assert_eq!(i.get(&web).is_some(), !opt_in);
            if let Some(s) = i.get(&web) {
                assert_eq!(s.ports["http"][0].weight, 50);
            }
            let w: Vec<&String> = i.warnings().flat_map(|(_, w)| w).collect();
            assert_eq!(w.len(), 2, "{w:?}");
            assert!(
                w[0].contains("Service ns/web") && w[0].contains("kubediscovery.io/export=\"yes\""),
                "{w:?}"
            );
            assert!(w[1].contains("kubediscovery.io/weight=\"-1\""), "{w:?}");
            assert_eq!(
                i.take_skipped(),
                BTreeMap::from([(SkipReason::InvalidAnnotation, 2)])
            );
            // The news for an Event: once, naming each annotation.
            let news = i.take_service_news();
            assert_eq!(news.len(), 1, "{news:?}");
            assert_eq!(
                (news[0].namespace.as_str(), news[0].name.as_str()),
                ("ns", "web")
            );
            assert_eq!(
                news[0].warnings.iter().map(|(r, _)| *r).collect::<Vec<_>>(),
                [SkipReason::InvalidAnnotation, SkipReason::InvalidAnnotation]
            );
            // The same bad Service again (event or relist): not counted again.
            let _ = i.set_service("ns", "web", Some(bad.clone()));
            let _ = i.reset_services([("ns".into(), "web".into(), bad)]);
            assert!(i.take_skipped().is_empty());
            assert!(i.take_service_news().is_empty());
            // Another bad value: news again.
            let worse = annotated(json!({"kubediscovery.io/weight": "heavy"}));
            let _ = i.reset_services([("ns".into(), "web".into(), worse)]);
            let news = i.take_service_news();
            assert_eq!(news.len(), 1, "{news:?}");
            assert!(news[0].warnings[0].1.contains("heavy"), "{news:?}");
            // Fixed, then gone: the warnings go.
            let _ = i.reset_services([("ns".into(), "web".into(), annotated(json!({})))]);
            assert_eq!(i.warnings().count(), 0);
            let _ = i.set_service("ns", "web", None);
            assert_eq!(i.get(&web).is_some(), !opt_in);
        }
    }
}

fn external(name: &str, host: &str) -> ServiceInfo {
    let s: k8s_openapi::api::core::v1::Service = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"type": "ExternalName", "externalName": host,
                 "ports": [{"name": "https", "port": 443}, {"port": 80}]}
    }))
    .unwrap();
    ServiceInfo::from_service(&s)
}

/// ExternalName Services: ignored unless enabled; allowed hosts (full
/// match) become one node per port in both modes and survive endpoint
/// relists; a host outside the allowlist or not a DNS name is skipped
/// with a warning and counted; a Service that stops being ExternalName
/// loses those nodes.
#[test]
fn external_name_services() {
    let allow = vec![AnchoredRegex::new(r"[a-z0-9-]+\.example\.com").unwrap()];
    for source in [SourceKind::Endpoints, SourceKind::EndpointSlice] {
        // Disabled (default): nothing, no warning.
        let mut off = idx(source);
        assert!(
            off.set_service("ns", "ext", Some(external("ext", "db.example.com")))
                .is_empty()
        );
        assert!(off.is_empty() && off.warnings().count() == 0);

        let mut i = Index::new(
            String::new(),
            source,
            ConvertOptions {
                external_name: Some(allow.clone()),
                service_port_aliases: true,
                ..ConvertOptions::default()
            },
            NamespaceFilter::All,
        );
        let ext = k("ns", "ext");
        assert_eq!(
            i.set_service("ns", "ext", Some(external("ext", "db.example.com"))),
            vec![ext.clone()]
        );
        let s = i.get(&ext).unwrap();
        assert_eq!(
            serde_json::to_value(&s.ports).unwrap(),
            json!({"80": [{"host": "db.example.com", "port": 80, "weight": 50}],
                       "https": [{"host": "db.example.com", "port": 443, "weight": 50}]})
        );
        assert_eq!(s.extras.aliases["443"], "https");
        // An endpoints relist does not drop it.
        match source {
            SourceKind::Endpoints => assert!(i.reset_endpoints::<Endpoints>(&[]).is_empty()),
            SourceKind::EndpointSlice => {
                assert!(i.reset_slices::<EndpointSlice>(&[]).is_empty())
            }
        }
        assert!(i.get(&ext).is_some());
        // Outside the allowlist ("evil.example.com.attacker.io" does not
        // fully match) and not a DNS name: skipped, warned, counted.
        assert_eq!(
            i.set_service(
                "ns",
                "ext",
                Some(external("ext", "db.example.com.attacker.io"))
            ),
            vec![ext.clone()]
        );
        assert!(i.get(&ext).is_none());
        let _ = i.set_service("ns", "bad", Some(external("bad", "not a host")));
        assert!(i.get(&k("ns", "bad")).is_none());
        assert_eq!(
            i.take_skipped(),
            BTreeMap::from([
                (SkipReason::InvalidExternalName, 1),
                (SkipReason::ExternalNameRefused, 1)
            ])
        );
        let w: Vec<&String> = i.warnings().flat_map(|(_, w)| w).collect();
        assert!(
            w.iter().any(|m| m.contains("Service ns/ext")
                && m.contains("db.example.com.attacker.io")
                && m.contains("external_name.allow")),
            "{w:?}"
        );
        // Allowed again, then turned into a ClusterIP Service: gone.
        let _ = i.set_service("ns", "ext", Some(external("ext", "db.example.com")));
        assert!(i.get(&ext).is_some());
        assert_eq!(
            i.set_service(
                "ns",
                "ext",
                Some(service_info(json!([{"name": "http", "port": 80}])))
            ),
            vec![ext.clone()]
        );
        assert!(i.get(&ext).is_none());
    }
}

/// An allowed ExternalName Service ignores its EndpointSlices, so the
/// warnings of what its slices skipped are not current: they must not
/// stay in `Index::warnings` when the Service becomes ExternalName after
/// its slices arrived (the other order never records them). Found by
/// `tests/order_independence.rs`.
#[test]
fn an_external_name_service_drops_the_warnings_of_its_slices_in_either_order() {
    let new = || {
        Index::new(
            String::new(),
            SourceKind::EndpointSlice,
            ConvertOptions {
                external_name: Some(vec![AnchoredRegex::new(r"db\.example\.com").unwrap()]),
                ..ConvertOptions::default()
            },
            NamespaceFilter::All,
        )
    };
    let bad = slice(
        "ns",
        "ext-1",
        Some("ext"),
        json!([{"addresses": ["999.0.0.1"]}]),
    );
    let info = external("ext", "db.example.com");
    let objects = |i: &Index| -> Vec<String> { i.warnings().map(|(o, _)| o.clone()).collect() };
    // Its slice while a plain Service: the skipped address is warned.
    let mut late = new();
    late.apply_slice(&bad);
    assert_eq!(objects(&late), ["EndpointSlices of ns/ext"]);
    let _ = late.set_service("ns", "ext", Some(info.clone()));
    // The Service first.
    let mut early = new();
    let _ = early.set_service("ns", "ext", Some(info));
    early.apply_slice(&bad);
    let ext = k("ns", "ext");
    assert!(late.get(&ext).is_some() && late.get(&ext) == early.get(&ext));
    assert!(objects(&early).is_empty(), "{:?}", objects(&early));
    assert_eq!(objects(&late), objects(&early), "the order does not matter");
    // No longer ExternalName: its slices count again, with their warnings.
    let _ = late.set_service("ns", "ext", None);
    assert_eq!(objects(&late), ["EndpointSlices of ns/ext"]);
}

/// A Service port whose targetPort no endpoint has: no port key, no
/// alias, lookups find nothing, and the index says why.
#[test]
fn unresolved_service_ports_are_exposed_as_data() {
    let mut i = idx(SourceKind::Endpoints);
    i.apply_endpoints(&ep("ns", "web", &["10.0.0.1"], json!({})));
    let _ = i.set_service(
        "ns",
        "web",
        Some(service_info(json!([
            {"name": "http", "port": 80},
            {"name": "admin", "port": 9000, "targetPort": "admin"}
        ]))),
    );
    let web = k("ns", "web");
    let s = i.get(&web).unwrap();
    assert!(s.nodes("admin").is_none() && s.nodes("9000").is_none());
    assert!(s.nodes("80").is_some());
    assert_eq!(
        i.unresolved_ports(&web),
        ["Service port 9000 (admin): no endpoint has targetPort admin; the port has no nodes"]
    );
    assert!(i.unresolved_ports(&k("ns", "nope")).is_empty());
}
