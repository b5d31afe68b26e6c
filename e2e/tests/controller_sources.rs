//! Controller end to end on kube-sim (the `kube-discovery` binary as a separate
//! process): Endpoints mode and EndpointSlice mode, scale up / down / to zero /
//! delete, the four namespace_selector forms and label_selector.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod controller_support;

use controller_support::{Controller, Env, LIMIT, eventually};
use serde_json::json;

fn config(env: &Env, extra: &str) -> String {
    format!(
        "discovery:\n  kubernetes:\n{}{extra}kube_discovery:\n  coalesce_window: 20ms\n",
        env.service_block(&env.sim.admin_token())
    )
}

fn hosts(ds: &serde_json::Value, port: &str) -> Vec<String> {
    ds["spec"]["ports"][port]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|n| n["host"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn endpoints_mode_follows_scale_up_down_zero_and_delete() {
    let env = Env::start().await;
    env.namespace("shop").await;
    env.endpoints(
        "shop",
        "web",
        &["10.0.0.2", "10.0.0.1"],
        &[("http", 8080)],
        json!({}),
    )
    .await;
    let ctl = Controller::start(&env, "ep", &config(&env, ""), &[]).await;
    ctl.wait_ready().await;

    let ds = env
        .wait_nodes("shop", "web", "http", &["10.0.0.1", "10.0.0.2"])
        .await;
    assert_eq!(ds["spec"]["source"], "Endpoints");
    assert_eq!(ds["spec"]["service"], "shop/web");
    assert_eq!(
        ds["spec"]["ports"]["http"][0],
        json!({"host": "10.0.0.1", "port": 8080, "weight": 50})
    );
    assert_eq!(
        ds["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "kube-discovery"
    );
    assert!(
        ctl.logs().contains("deprecated"),
        "the Endpoints-mode notice is logged"
    );

    // Scale up, down, to zero, delete.
    env.endpoints(
        "shop",
        "web",
        &["10.0.0.1", "10.0.0.2", "10.0.0.3"],
        &[("http", 8080)],
        json!({}),
    )
    .await;
    env.wait_nodes("shop", "web", "http", &["10.0.0.1", "10.0.0.2", "10.0.0.3"])
        .await;
    env.endpoints("shop", "web", &["10.0.0.3"], &[("http", 8080)], json!({}))
        .await;
    env.wait_nodes("shop", "web", "http", &["10.0.0.3"]).await;
    env.endpoints("shop", "web", &[], &[("http", 8080)], json!({}))
        .await;
    eventually("shop/web has no nodes", LIMIT, || async {
        let ds = env.dsvc("shop", "web").await?;
        let total: usize = ds["spec"]["ports"]
            .as_object()
            .map(|m| m.values().filter_map(|v| v.as_array()).map(Vec::len).sum())
            .unwrap_or(0);
        (total == 0).then_some(())
    })
    .await;
    env.delete_endpoints("shop", "web").await;
    env.wait_gone("shop", "web").await;
    ctl.stop().await;
}

#[tokio::test]
async fn slice_mode_merges_slices_uses_ready_endpoints_and_deletes() {
    let env = Env::start().await;
    env.namespace("shop").await;
    env.slice(
        "shop",
        "web",
        "web-a",
        &[("10.0.1.1", true), ("10.0.1.9", false)],
        &[("http", 8080)],
    )
    .await;
    env.slice(
        "shop",
        "web",
        "web-b",
        &[("10.0.1.2", true)],
        &[("http", 8080)],
    )
    .await;
    let ctl = Controller::start(
        &env,
        "slices",
        &config(&env, "    watch_endpoint_slices: true\n"),
        &[],
    )
    .await;
    ctl.wait_ready().await;
    let ds = env
        .wait_nodes("shop", "web", "http", &["10.0.1.1", "10.0.1.2"])
        .await;
    assert_eq!(ds["spec"]["source"], "EndpointSlice");
    assert!(
        !ctl.logs().contains("deprecated"),
        "no Endpoints notice in slice mode"
    );

    // Scale up in one slice, the not-ready endpoint becomes ready, then a slice goes away.
    env.slice(
        "shop",
        "web",
        "web-a",
        &[("10.0.1.1", true), ("10.0.1.9", true), ("10.0.1.3", true)],
        &[("http", 8080)],
    )
    .await;
    env.wait_nodes(
        "shop",
        "web",
        "http",
        &["10.0.1.1", "10.0.1.2", "10.0.1.3", "10.0.1.9"],
    )
    .await;
    env.delete_slice("shop", "web-a").await;
    env.wait_nodes("shop", "web", "http", &["10.0.1.2"]).await;
    env.slice(
        "shop",
        "web",
        "web-b",
        &[("10.0.1.2", false)],
        &[("http", 8080)],
    )
    .await;
    eventually("no ready nodes", LIMIT, || async {
        let ds = env.dsvc("shop", "web").await?;
        hosts(&ds, "http").is_empty().then_some(())
    })
    .await;
    env.delete_slice("shop", "web-b").await;
    env.wait_gone("shop", "web").await;
    ctl.stop().await;
}

/// Creates the same service in namespaces `a`, `b`, `team-x`, with label
/// `tier=<ns>` on each, and returns which DiscoveredServices exist once the
/// controller is ready and has written `expect_one`.
async fn selected(selector: &str, expect_one: &str) -> Vec<String> {
    let env = Env::start().await;
    for ns in ["a", "b", "team-x"] {
        env.namespace(ns).await;
        env.endpoints(
            ns,
            "svc",
            &["10.1.0.1"],
            &[("http", 80)],
            json!({"tier": ns}),
        )
        .await;
    }
    let ctl = Controller::start(&env, "sel", &config(&env, selector), &[]).await;
    ctl.wait_ready().await;
    let (ns, name) = expect_one.split_once('/').expect("ns/name");
    env.wait_nodes(ns, name, "http", &["10.1.0.1"]).await;
    // Ready means the first list is completely written: what exists now is all.
    let names = env.dsvc_names().await;
    ctl.stop().await;
    names
}

#[tokio::test]
async fn namespace_selector_equal() {
    assert_eq!(
        selected("    namespace_selector:\n      equal: b\n", "b/svc").await,
        vec!["b/svc"]
    );
}

#[tokio::test]
async fn namespace_selector_not_equal() {
    assert_eq!(
        selected("    namespace_selector:\n      not_equal: b\n", "a/svc").await,
        vec!["a/svc", "team-x/svc"]
    );
}

#[tokio::test]
async fn namespace_selector_match_is_anchored() {
    // A regex must match the WHOLE name: `team` does not select `team-x`.
    assert_eq!(
        selected(
            "    namespace_selector:\n      match: [\"a\", \"team\"]\n",
            "a/svc"
        )
        .await,
        vec!["a/svc"]
    );
    assert_eq!(
        selected(
            "    namespace_selector:\n      match: [\"a\", \"team-.*\"]\n",
            "a/svc"
        )
        .await,
        vec!["a/svc", "team-x/svc"]
    );
}

#[tokio::test]
async fn namespace_selector_not_match() {
    assert_eq!(
        selected(
            "    namespace_selector:\n      not_match: [\"team-.*\", \"b\"]\n",
            "a/svc"
        )
        .await,
        vec!["a/svc"]
    );
    // Anchored: `team` does not exclude `team-x`.
    assert_eq!(
        selected(
            "    namespace_selector:\n      not_match: [\"team\", \"b\"]\n",
            "a/svc"
        )
        .await,
        vec!["a/svc", "team-x/svc"]
    );
}

#[tokio::test]
async fn label_selector_filters_on_the_server() {
    assert_eq!(
        selected("    label_selector: \"tier in (a,team-x)\"\n", "team-x/svc").await,
        vec!["a/svc", "team-x/svc"]
    );
}
