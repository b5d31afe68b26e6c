//! Whole relists: what a relist converts again, what it reuses, and that warnings and skip
//! counts stay right.

use super::*;

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
