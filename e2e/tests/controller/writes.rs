//! Controller end to end on both API servers: what it writes and what it
//! does NOT write.
//! * relist after a forced 410 Gone deletes objects whose source vanished while
//!   the watch was down, and rewrites nothing that is still present;
//! * no write when nothing relevant changed (annotation-only edits, a
//!   not-ready address appearing) and no write at all after a restart.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::controller_support;

use controller_support::{Backend, Controller, Env, LIMIT, eventually};
use serde_json::{Value, json};
use testenv::both_backends;

fn config(env: &Env) -> String {
    format!(
        "discovery:\n  kubernetes:\n{}kube_discovery:\n  coalesce_window: 20ms\n",
        env.service_block(&env.admin_token())
    )
}

fn names(writes: &[Value]) -> Vec<String> {
    let mut v: Vec<String> = writes
        .iter()
        .map(|w| {
            format!(
                "{} {}/{} {}",
                w["verb"].as_str().unwrap_or(""),
                w["namespace"].as_str().unwrap_or(""),
                w["name"].as_str().unwrap_or(""),
                w["resource"].as_str().unwrap_or("")
            )
        })
        .collect();
    v.sort();
    v
}

async fn metric(ctl: &Controller, needle: &str) -> f64 {
    let (_, text) = ctl.get("/metrics").await;
    text.lines()
        .find(|l| l.starts_with(needle))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[both_backends]
#[tokio::test]
async fn relist_after_forced_410_deletes_vanished_and_rewrites_nothing_else(backend: Backend) {
    let env = Env::start(backend).await;
    env.namespace("ns").await;
    for (name, ip) in [
        ("keep", "10.2.0.1"),
        ("gone", "10.2.0.2"),
        ("moved", "10.2.0.3"),
    ] {
        env.endpoints("ns", name, &[ip], &[("http", 80)], json!({}))
            .await;
    }
    let ctl = Controller::start(&env, "relist", &config(&env), &[]).await;
    ctl.wait_ready().await;
    env.wait_nodes("ns", "keep", "http", &["10.2.0.1"]).await;
    env.wait_nodes("ns", "gone", "http", &["10.2.0.2"]).await;
    env.wait_nodes("ns", "moved", "http", &["10.2.0.3"]).await;
    let before = env.mark().await;

    // Stall the controller's watch (real: in the fault proxy), change the
    // world behind its back, then compact the history and cut the watch:
    // resuming gets 410 Gone -> relist.
    env.api
        .fault(&json!({"stallWatchesSeconds": 60}))
        .await
        .expect("stall watches");
    env.delete_endpoints("ns", "gone").await;
    env.endpoints("ns", "moved", &["10.2.0.4"], &[("http", 80)], json!({}))
        .await;
    env.endpoints("ns", "new", &["10.2.0.5"], &[("http", 80)], json!({}))
        .await;
    env.force_410().await;

    env.wait_gone("ns", "gone").await;
    env.wait_nodes("ns", "moved", "http", &["10.2.0.4"]).await;
    env.wait_nodes("ns", "new", "http", &["10.2.0.5"]).await;
    eventually("a relist was counted", LIMIT, || async {
        (metric(
            &ctl,
            "kube_discovery_watch_events_total{cluster=\"\",type=\"relist\"}",
        )
        .await
            >= 1.0)
            .then_some(())
    })
    .await;
    let writes = env.dsvc_writes_since(before).await;
    assert!(
        writes.iter().all(|w| w["name"] != "keep"),
        "the unchanged service was rewritten: {:?}",
        names(&writes)
    );
    assert!(
        writes
            .iter()
            .any(|w| w["name"] == "gone" && w["verb"] == "delete"),
        "{:?}",
        names(&writes)
    );
    ctl.stop().await;
}

#[both_backends]
#[tokio::test]
async fn no_write_when_nothing_relevant_changed_and_none_after_restart(backend: Backend) {
    let env = Env::start(backend).await;
    env.namespace("ns").await;
    env.endpoints("ns", "a", &["10.3.0.1"], &[("http", 80)], json!({}))
        .await;
    env.endpoints(
        "ns",
        "b",
        &["10.3.0.2", "10.3.0.3"],
        &[("http", 80), ("admin", 81)],
        json!({}),
    )
    .await;
    let ctl = Controller::start(&env, "noop1", &config(&env), &[]).await;
    ctl.wait_ready().await;
    env.wait_nodes("ns", "a", "http", &["10.3.0.1"]).await;
    env.wait_nodes("ns", "b", "admin", &["10.3.0.2", "10.3.0.3"])
        .await;

    // Irrelevant changes: a label on the source, an annotation, a not-ready address.
    let before = env.mark().await;
    env.endpoints(
        "ns",
        "a",
        &["10.3.0.1"],
        &[("http", 80)],
        json!({"team": "blue"}),
    )
    .await;
    let api: kube::Api<k8s_openapi::api::core::v1::Endpoints> =
        kube::Api::namespaced(env.admin.clone(), "ns");
    api.patch(
        "b",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"metadata": {"annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2026-01-01T00:00:00Z"}},
            "subsets": [{"addresses": [{"ip": "10.3.0.2"}, {"ip": "10.3.0.3"}], "notReadyAddresses": [{"ip": "10.3.0.9"}],
                         "ports": [{"name": "http", "port": 80, "protocol": "TCP"}, {"name": "admin", "port": 81, "protocol": "TCP"}]}]})),
    )
    .await
    .expect("patch b");
    // A relevant change afterwards acts as a marker: once it is written, the
    // irrelevant ones before it have been processed too.
    env.endpoints("ns", "marker", &["10.3.0.7"], &[("http", 80)], json!({}))
        .await;
    env.wait_nodes("ns", "marker", "http", &["10.3.0.7"]).await;
    let writes = env.dsvc_writes_since(before).await;
    // The write log sees the marker's write (so "nothing else" is not
    // vacuous; on the real server the log is the audit log) ...
    assert!(
        writes.iter().any(|w| w["name"] == "marker"),
        "the marker's write is missing from the write log: {:?}",
        names(&writes)
    );
    // ... and nothing but it.
    assert!(
        writes.iter().all(|w| w["name"] == "marker"),
        "unexpected writes: {:?}",
        names(&writes)
    );
    // The API server holds the marker's write before the controller has
    // read the answer and counted it: wait for the count.
    eventually("3 applied writes counted", LIMIT, || async {
        let applied = metric(
            &ctl,
            "kube_discovery_writes_total{cluster=\"\",result=\"applied\"}",
        )
        .await;
        (applied >= 3.0).then_some(())
    })
    .await;
    ctl.stop().await;

    // Restart with nothing changed: zero writes.
    let before = env.mark().await;
    let ctl = Controller::start(&env, "noop2", &config(&env), &[]).await;
    ctl.wait_ready().await;
    let writes = env.dsvc_writes_since(before).await;
    assert!(writes.is_empty(), "a restart wrote: {:?}", names(&writes));
    assert_eq!(
        metric(
            &ctl,
            "kube_discovery_writes_total{cluster=\"\",result=\"applied\"}"
        )
        .await,
        0.0
    );
    assert!(metric(&ctl, "kube_discovery_writes_skipped_total{cluster=\"\"}").await >= 3.0);
    // ...and it still follows changes.
    env.endpoints(
        "ns",
        "a",
        &["10.3.0.1", "10.3.0.8"],
        &[("http", 80)],
        json!({}),
    )
    .await;
    env.wait_nodes("ns", "a", "http", &["10.3.0.1", "10.3.0.8"])
        .await;
    ctl.stop().await;
}

/// `coalesce_leading_edge: false`: two changes of a service inside the
/// window are one write of the latest (with the default leading edge the
/// first one is written at once, the second a window later: two writes).
#[both_backends]
#[tokio::test]
async fn trailing_edge_only_makes_two_changes_inside_the_window_one_write(backend: Backend) {
    let env = Env::start(backend).await;
    env.namespace("ns").await;
    env.endpoints("ns", "web", &["10.4.0.1"], &[("http", 80)], json!({}))
        .await;
    let cfg = format!(
        "discovery:\n  kubernetes:\n{}kube_discovery:\n  coalesce_window: 1s\n  coalesce_leading_edge: false\n",
        env.service_block(&env.admin_token())
    );
    let ctl = Controller::start(&env, "trailing", &cfg, &[]).await;
    ctl.wait_ready().await;
    env.wait_nodes("ns", "web", "http", &["10.4.0.1"]).await;
    // The first write's window passes: the service is quiet (with the
    // leading edge, the next change would be written at once).
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let before = env.mark().await;
    // A rolling update step: a new endpoint, then the old one leaves.
    env.endpoints(
        "ns",
        "web",
        &["10.4.0.1", "10.4.0.2"],
        &[("http", 80)],
        json!({}),
    )
    .await;
    env.endpoints("ns", "web", &["10.4.0.2"], &[("http", 80)], json!({}))
        .await;
    env.wait_nodes("ns", "web", "http", &["10.4.0.2"]).await;
    let writes: Vec<Value> = env
        .dsvc_writes_since(before)
        .await
        .into_iter()
        .filter(|w| w["name"] == "web")
        .collect();
    assert_eq!(writes.len(), 1, "{:?}", names(&writes));
    ctl.stop().await;
}
