use std::sync::Arc;
use std::time::Duration;

use kube_discovery_core::xds::{Catalog as _, Kind, Request, Stream};
use kube_discovery_core::{Node, PortMap, ServiceKey, ServiceNodes, SourceKind};

use super::*;

fn svc(name: &str, ips: &[&str]) -> Arc<ServiceNodes> {
    let ports: PortMap = [(
        "http".to_string(),
        ips.iter().map(|ip| Node::new(*ip, 80, 50)).collect(),
    )]
    .into_iter()
    .collect();
    Arc::new(ServiceNodes::new(
        ServiceKey::new("", "ns", name),
        SourceKind::EndpointSlice,
        ports,
        None,
    ))
}

/// A stream subscribed (SotW) to the EDS resources `names`.
fn subscribed(hub: &Hub, names: &[&str]) -> (Arc<StreamHandle>, Stream) {
    let h = hub.connect("test".into());
    let mut m = Stream::new();
    m.on_request(
        Request::Sotw {
            kind: Kind::ClusterLoadAssignment,
            version_info: String::new(),
            names: names.iter().map(|s| (*s).into()).collect(),
            nonce: String::new(),
            error: None,
        },
        &*hub.catalog(),
    );
    hub.route(h.id, &m);
    (h, m)
}

#[test]
fn a_change_wakes_only_the_streams_subscribed_to_it() {
    let hub = Hub::default();
    hub.apply(&[
        (
            svc("a", &["10.0.0.1"]).key.clone(),
            Some(svc("a", &["10.0.0.1"])),
        ),
        (
            svc("b", &["10.0.0.2"]).key.clone(),
            Some(svc("b", &["10.0.0.2"])),
        ),
    ]);
    let (on_a, _) = subscribed(&hub, &["ns/a:http"]);
    let (on_b, _) = subscribed(&hub, &["ns/b:http"]);
    let _ = (on_a.take(), on_b.take());
    let a2 = svc("a", &["10.0.0.9"]);
    hub.apply(&[(a2.key.clone(), Some(a2))]);
    let got_a = on_a.take();
    assert_eq!(
        got_a
            .names
            .get(&Kind::ClusterLoadAssignment)
            .map(|s| s.len()),
        Some(1)
    );
    assert!(got_a.since.is_some());
    assert!(on_b.take().names.is_empty(), "b's stream was told about a");
}

#[test]
fn a_slow_stream_holds_one_pending_name_per_resource_however_many_changes() {
    let hub = Hub::default();
    let (h, _) = subscribed(&hub, &["ns/a:http"]);
    for i in 0..1000u32 {
        let s = svc("a", &[&format!("10.0.{}.{}", i / 250, i % 250 + 1)]);
        hub.apply(&[(s.key.clone(), Some(s))]);
    }
    let p = h.take();
    let names: Vec<&String> = p.names.values().flatten().collect();
    assert_eq!(names, vec!["ns/a:http"], "{p:?}");
    // And the catalog holds only the latest content.
    let latest = svc("a", &["10.0.3.250"]);
    let mut c = super::super::resources::Catalog::default();
    c.apply(&latest.key, Some(&latest));
    assert_eq!(
        hub.catalog()
            .version(Kind::ClusterLoadAssignment, "ns/a:http"),
        c.version(Kind::ClusterLoadAssignment, "ns/a:http")
    );
}

#[test]
fn unsubscribed_and_disconnected_streams_are_not_woken() {
    let hub = Hub::default();
    let (h, mut m) = subscribed(&hub, &["ns/a:http"]);
    // Resubscribe to nothing: a's changes no longer reach it.
    m.on_request(
        Request::Sotw {
            kind: Kind::ClusterLoadAssignment,
            version_info: String::new(),
            names: vec![],
            nonce: "1".into(),
            error: None,
        },
        &*hub.catalog(),
    );
    hub.route(h.id, &m);
    let s = svc("a", &["10.0.0.1"]);
    hub.apply(&[(s.key.clone(), Some(s))]);
    assert!(h.take().names.is_empty());
    hub.disconnect(h.id);
    assert_eq!(hub.streams(), 0);
}

#[tokio::test]
async fn serving_starts_only_after_every_cluster_listed_with_the_whole_list_in() {
    let state = Arc::new(ControllerState::new(["", "east"]));
    let hub = Arc::new(Hub::default());
    let stop = tokio_util::sync::CancellationToken::new();
    let follower = tokio::spawn(hub.clone().follow(state.clone(), stop.clone()));
    let a = svc("a", &["10.0.0.1"]);
    state.set_desired_arc(&a.key.clone(), Some(a));
    state.update_cluster("", |c| c.listed = true);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!hub.is_ready(), "ready before every cluster listed");
    let b = svc("b", &["10.0.0.2"]);
    state.set_desired_arc(&b.key.clone(), Some(b));
    state.update_cluster("east", |c| c.listed = true);
    tokio::time::timeout(Duration::from_secs(5), hub.wait_ready())
        .await
        .expect("ready once both are listed");
    assert_eq!(hub.catalog().len(Kind::ClusterLoadAssignment), 2);
    stop.cancel();
    follower.await.unwrap();
}

#[test]
fn diff_reports_changed_added_and_removed_services_in_key_order() {
    let (a, b, c) = (
        svc("a", &["1.1.1.1"]),
        svc("b", &["1.1.1.2"]),
        svc("c", &["1.1.1.3"]),
    );
    let b2 = svc("b", &["1.1.1.9"]);
    let b_same = svc("b", &["1.1.1.2"]);
    let old = vec![a.clone(), b.clone()];
    let d = diff(&old, &[b2.clone(), c.clone()]);
    let got: Vec<(String, bool)> = d
        .iter()
        .map(|(k, v)| (k.to_string(), v.is_some()))
        .collect();
    assert_eq!(
        got,
        [
            ("ns/a".into(), false),
            ("ns/b".into(), true),
            ("ns/c".into(), true)
        ]
    );
    // The same content in another allocation is no change.
    assert!(diff(&old, &[a, b_same]).is_empty());
}

/// Following the journal of changes gives what diffing whole snapshots gives,
/// also for a follower that fell behind the journal (it gets everything).
#[test]
fn following_the_changes_equals_diffing_the_whole_state() {
    let state = ControllerState::new([""]);
    let mut last = BTreeMap::new();
    let (cursor, since) = state.desired_since(None);
    assert!(advance(&mut last, since).is_empty());
    let (a, b, c) = (
        svc("a", &["1.1.1.1"]),
        svc("b", &["1.1.1.2"]),
        svc("c", &["1.1.1.3"]),
    );
    for s in [&a, &b, &c] {
        state.set_desired_arc(&s.key, Some(s.clone()));
    }
    // b changes and changes back (same content, another allocation): no change;
    // c goes; a changes.
    state.set_desired_arc(&b.key, Some(svc("b", &["9.9.9.9"])));
    state.set_desired_arc(&b.key, Some(svc("b", &["1.1.1.2"])));
    state.set_desired_arc(&c.key, None);
    let a2 = svc("a", &["1.1.1.9"]);
    state.set_desired_arc(&a.key, Some(a2.clone()));
    let (cursor2, since) = state.desired_since(Some(cursor));
    assert!(matches!(since, DesiredSince::Changed(_)), "{since:?}");
    let got: Vec<(String, bool)> = advance(&mut last, since)
        .iter()
        .map(|(k, v)| (k.to_string(), v.is_some()))
        .collect();
    assert_eq!(got, [("ns/a".into(), true), ("ns/b".into(), true)]);
    let (_, since) = state.desired_since(Some(cursor2));
    assert!(advance(&mut last, since).is_empty(), "nothing since");

    // A follower that starts from the whole state ends where this one did.
    let mut fresh = BTreeMap::new();
    let (_, since) = state.desired_since(None);
    assert!(matches!(since, DesiredSince::All(_)));
    advance(&mut fresh, since);
    let keys = |m: &BTreeMap<ServiceKey, Arc<ServiceNodes>>| -> Vec<(String, String)> {
        m.values()
            .map(|v| (v.key.to_string(), v.version.clone()))
            .collect()
    };
    assert_eq!(keys(&fresh), keys(&last));
}

/// A follower further behind than the journal holds gets the whole state, and
/// the diff against what it had.
#[test]
fn a_follower_behind_the_journal_gets_the_whole_state() {
    let state = ControllerState::new([""]);
    let mut last = BTreeMap::new();
    let a = svc("a", &["1.1.1.1"]);
    state.set_desired_arc(&a.key, Some(a.clone()));
    let (cursor, since) = state.desired_since(None);
    advance(&mut last, since);
    for i in 0..20_000 {
        let b = svc("b", &[&format!("10.0.{}.{}", i / 250, i % 250)]);
        state.set_desired_arc(&b.key.clone(), Some(b));
    }
    let (_, since) = state.desired_since(Some(cursor));
    assert!(
        matches!(since, DesiredSince::All(_)),
        "the journal is bounded"
    );
    let got: Vec<String> = advance(&mut last, since)
        .iter()
        .map(|(k, _)| k.to_string())
        .collect();
    assert_eq!(got, ["ns/b"]);
}
