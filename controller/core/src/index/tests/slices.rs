//! EndpointSlices: merging the slices of a service, moves between services, missing
//! labels, irrelevant changes, resets, streamed relists and the order independence of
//! incremental updates.

use super::*;

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
