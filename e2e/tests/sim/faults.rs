//! The `/_sim/` test hooks: stats, the write log, and every fault (fail with a
//! code, latency, stalled watches, dropped watches, compaction, refused
//! connections), driven through the kube-rs client.
//!
//! kube-sim only: these are kube-sim's own hooks (`/_sim/*`); a real API server
//! has none (the real backend's fault proxy is tested in `e2e/testenv`, and the
//! faults are used on both backends by `sim/watch.rs` and the fault suite).

use crate::sim_support;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use sim_support::{ADMIN, client, count, fault, raw, start, stats, watch_lines};

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}})).expect("cm")
}

fn code(e: kube::Error) -> u16 {
    match e {
        kube::Error::Api(s) => s.code,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_and_write_log() {
    let sim = start(false).await;
    let c = client(&sim, ADMIN).await;
    let api: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    let since = stats(&c).await["resourceVersion"]
        .as_str()
        .expect("rv")
        .to_string();
    let created = api
        .create(&PostParams::default(), &cm("w1"))
        .await
        .expect("create");
    api.list(&ListParams::default()).await.expect("list");
    api.delete("w1", &Default::default()).await.expect("delete");
    let s = stats(&c).await;
    assert_eq!(count(&s, "create", "configmaps"), 1);
    assert_eq!(count(&s, "list", "configmaps"), 1);
    assert_eq!(count(&s, "delete", "configmaps"), 1);
    assert_eq!(s["writes"]["configmaps"], 2);
    assert_eq!(s["openWatches"], 0);
    // The same requests, by user; a second user's list counts under its name only.
    assert_eq!(
        s["requestsByUser"]["kube-sim-admin"]["list"]["configmaps"],
        1
    );
    sim.add_user_token("t-viewer", "viewer", &["system:masters"]);
    let viewer = client(&sim, "t-viewer").await;
    Api::<ConfigMap>::namespaced(viewer, "default")
        .list(&ListParams::default())
        .await
        .expect("list as viewer");
    let s = stats(&c).await;
    assert_eq!(s["requestsByUser"]["viewer"]["list"]["configmaps"], 1);
    assert_eq!(
        s["requestsByUser"]["kube-sim-admin"]["list"]["configmaps"],
        1
    );
    assert_eq!(count(&s, "list", "configmaps"), 2);

    let (status, log) = raw(
        &c,
        "GET",
        &format!("/_sim/writes?resource=configmaps&since={since}"),
        None,
        "",
    )
    .await;
    assert_eq!(status, 200);
    let items = log["items"].as_array().expect("items");
    assert_eq!(items.len(), 2, "{log}");
    assert_eq!(items[0]["verb"], "create");
    assert_eq!(items[0]["name"], "w1");
    assert_eq!(items[0]["namespace"], "default");
    assert_eq!(
        items[0]["resourceVersion"],
        created.metadata.resource_version.expect("rv").as_str()
    );
    assert_eq!(items[0]["user"], "kube-sim-admin");
    assert_eq!(items[1]["verb"], "delete");
    let t0 = items[0]["timeNanos"].as_u64().expect("nanos");
    let t1 = items[1]["timeNanos"].as_u64().expect("nanos");
    assert!(t0 > 1_700_000_000_000_000_000 && t1 >= t0, "{t0} {t1}");
    // `since` filters by resourceVersion.
    let last = items[1]["resourceVersion"].as_str().expect("rv");
    let (_, log) = raw(
        &c,
        "GET",
        &format!("/_sim/writes?resource=configmaps&since={last}"),
        None,
        "",
    )
    .await;
    assert_eq!(log["items"].as_array().map(Vec::len), Some(0));
    // Bad requests to the hooks are 400s naming the problem.
    let (status, body) = raw(
        &c,
        "POST",
        "/_sim/faults",
        Some(json!({"explode": true})),
        "application/json",
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = raw(
        &c,
        "POST",
        "/_sim/faults",
        Some(json!({"fail": {"code": 200}})),
        "application/json",
    )
    .await;
    assert_eq!(status, 400, "{body}");
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_failures_and_latency() {
    let sim = start(false).await;
    let c = client(&sim, ADMIN).await;
    let api: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    // 429 with Retry-After for the next two creates of configmaps only. (Plain
    // HTTP: kube's client would transparently retry 429/503.)
    fault(&c, json!({"fail": {"verb": "create", "resource": "configmaps", "count": 2, "code": 429, "retryAfterSeconds": 3}})).await;
    api.list(&ListParams::default())
        .await
        .expect("lists are not affected");
    let create = || {
        sim_support::plain_http(
            sim.addr(),
            "POST",
            "/api/v1/namespaces/default/configmaps",
            ADMIN,
            Some(json!({"metadata": {"name": "x"}})),
        )
    };
    for _ in 0..2 {
        let (status, head, body) = create().await;
        assert_eq!(status, 429, "{body}");
        assert!(head.contains("retry-after: 3"), "{head}");
        assert_eq!(body["reason"], "TooManyRequests");
        assert_eq!(body["details"]["retryAfterSeconds"], 3);
    }
    let (status, _, body) = create().await;
    assert_eq!(status, 201, "third create passes: {body}");
    // 500 and 503 on any verb of a resource.
    fault(&c, json!({"fail": {"resource": "configmaps", "code": 500}})).await;
    assert_eq!(code(api.get("x").await.expect_err("500")), 500);
    fault(&c, json!({"fail": {"verb": "get", "code": 503}})).await;
    let (status, _, body) = sim_support::plain_http(
        sim.addr(),
        "GET",
        "/api/v1/namespaces/default/configmaps/x",
        ADMIN,
        None,
    )
    .await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["reason"], "ServiceUnavailable");
    api.get("x").await.expect("faults consumed");
    // Latency on matching requests only.
    fault(
        &c,
        json!({"latency": {"verb": "get", "resource": "configmaps", "millis": 300, "count": 1}}),
    )
    .await;
    let t = Instant::now();
    api.list(&ListParams::default()).await.expect("list");
    assert!(t.elapsed() < Duration::from_millis(250), "list was delayed");
    let t = Instant::now();
    api.get("x").await.expect("get");
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "get not delayed: {:?}",
        t.elapsed()
    );
    let t = Instant::now();
    api.get("x").await.expect("get");
    assert!(
        t.elapsed() < Duration::from_millis(250),
        "latency count not honoured"
    );
    // Unlimited latency until cleared.
    fault(&c, json!({"latency": {"millis": 200}})).await;
    let t = Instant::now();
    api.get("x").await.expect("get");
    assert!(t.elapsed() >= Duration::from_millis(200));
    fault(&c, json!({"clear": true})).await;
    let t = Instant::now();
    api.get("x").await.expect("get");
    assert!(
        t.elapsed() < Duration::from_millis(150),
        "clear did not remove latency"
    );
    sim.shutdown().await;
}

/// A delayed write is held in transit: a client that gives up during the
/// delay (its connection closed) has the write dropped, never applied; one
/// that waits gets it applied after the delay (issue 29 item 9's test holds
/// an old leader's write this way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_write_whose_client_gives_up_is_never_applied() {
    let sim = start(false).await;
    let c = client(&sim, ADMIN).await;
    let api: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    fault(
        &c,
        json!({"latency": {"verb": "create", "resource": "configmaps", "millis": 1500, "count": 2}}),
    )
    .await;
    let gave_up = tokio::time::timeout(
        Duration::from_millis(300),
        api.create(&PostParams::default(), &cm("abandoned")),
    )
    .await;
    assert!(gave_up.is_err(), "the create was not held");
    let t = Instant::now();
    api.create(&PostParams::default(), &cm("waited"))
        .await
        .expect("a held create is applied after the delay");
    assert!(t.elapsed() >= Duration::from_millis(1500));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        api.get_opt("abandoned").await.expect("get").is_none(),
        "the abandoned create was applied"
    );
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_dropped_and_compacted_watches() {
    let sim = start(false).await;
    let c = client(&sim, ADMIN).await;
    let api: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    let first = api
        .create(&PostParams::default(), &cm("s0"))
        .await
        .expect("create");
    let rv = first.metadata.resource_version.expect("rv");

    // Stall: the connection stays open, nothing arrives until the stall ends.
    fault(&c, json!({"stallWatchesSeconds": 1.0})).await;
    let c2 = c.clone();
    let path = format!(
        "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={rv}&timeoutSeconds=5"
    );
    let started = Instant::now();
    let reader = tokio::spawn(async move {
        let (_, lines) = watch_lines(&c2, &path, 1, 5).await;
        (lines, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    api.create(&PostParams::default(), &cm("s1"))
        .await
        .expect("create");
    let (lines, elapsed) = reader.await.expect("reader");
    assert_eq!(
        lines
            .first()
            .map(|l| l["object"]["metadata"]["name"].clone()),
        Some(json!("s1"))
    );
    assert!(
        elapsed >= Duration::from_millis(900),
        "event arrived during the stall: {elapsed:?}"
    );

    // Drop: every open watch ends now.
    let c3 = c.clone();
    let reader = tokio::spawn(async move {
        let t = Instant::now();
        let (_, lines) = watch_lines(
            &c3,
            "/api/v1/configmaps?watch=1&resourceVersion=1&timeoutSeconds=30",
            10_000,
            30,
        )
        .await;
        (lines, t.elapsed())
    });
    sim_support::eventually(5, "watch open", || {
        let c = c.clone();
        async move { (stats(&c).await["openWatches"] == 1).then_some(()) }
    })
    .await;
    fault(&c, json!({"dropWatches": true})).await;
    let (_, elapsed) = reader.await.expect("reader");
    assert!(
        elapsed < Duration::from_secs(10),
        "watch was not dropped: {elapsed:?}"
    );

    // Compact: a watch from before the compaction gets 410 (HTTP 200 + ERROR event).
    fault(&c, json!({"compact": true})).await;
    api.create(&PostParams::default(), &cm("s2"))
        .await
        .expect("create");
    let (_, lines) = watch_lines(
        &c,
        &format!("/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={rv}"),
        1,
        5,
    )
    .await;
    assert_eq!(lines[0]["type"], "ERROR");
    assert_eq!(lines[0]["object"]["code"], 410);
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connections_keep_state() {
    let sim = start(true).await;
    let c = client(&sim, ADMIN).await;
    let api: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    api.create(&PostParams::default(), &cm("kept"))
        .await
        .expect("create");
    fault(&c, json!({"refuseConnectionsSeconds": 1.5})).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The listener is down: a fresh TCP connection is refused.
    let err = tokio::net::TcpStream::connect(sim.addr()).await;
    assert!(err.is_err(), "connection accepted while refusing");
    // A fresh client cannot reach the server either.
    let fresh = client(&sim, ADMIN).await;
    let fresh_api: Api<ConfigMap> = Api::namespaced(fresh, "default");
    assert!(
        fresh_api.get("kept").await.is_err(),
        "request served while refusing"
    );
    // Afterwards the same address serves again, with all state.
    let got = sim_support::eventually(10, "listener back", || {
        let api = api.clone();
        async move { api.get("kept").await.ok() }
    })
    .await;
    assert_eq!(got.metadata.name.as_deref(), Some("kept"));
    sim.shutdown().await;
}

/// `freezeConnectionsSeconds`: an open connection never answers again, a
/// new one is swallowed during the window, later ones are served; the
/// admin token's connections (the test's own) are exempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_connections_stay_silent() {
    let sim = start(false).await;
    let admin = client(&sim, ADMIN).await;
    let user = client(&sim, &sim.issue_token("default", "frozen")).await;
    let user_api: Api<ConfigMap> = Api::namespaced(user.clone(), "default");
    // An answer (forbidden or not) opens the user's pooled connection.
    let _ = user_api.list(&ListParams::default()).await;
    fault(&admin, json!({"freezeConnectionsSeconds": 0.5})).await;
    assert!(
        tokio::time::timeout(
            Duration::from_secs(2),
            user_api.list(&ListParams::default())
        )
        .await
        .is_err(),
        "a frozen connection answered"
    );
    // The admin's connection is exempt; a new client after the window is served.
    let admin_api: Api<ConfigMap> = Api::namespaced(admin.clone(), "default");
    admin_api
        .list(&ListParams::default())
        .await
        .expect("the admin is served");
    let fresh = client(&sim, &sim.issue_token("default", "frozen")).await;
    let (status, _) = raw(
        &fresh,
        "GET",
        "/api/v1/namespaces/default/configmaps",
        None,
        "",
    )
    .await;
    assert!(status == 200 || status == 403, "{status}");
    sim.shutdown().await;
}

/// `expireContinueTokens`: the next lists with a `continue` token get
/// `410 Expired`, first pages do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_continue_tokens() {
    let sim = start(false).await;
    let c = client(&sim, ADMIN).await;
    let api: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    for n in ["a", "b", "c"] {
        api.create(&PostParams::default(), &cm(n))
            .await
            .expect("create");
    }
    fault(&c, json!({"expireContinueTokens": 1})).await;
    let page = api
        .list(&ListParams::default().limit(1))
        .await
        .expect("a first page");
    let token = page.metadata.continue_.expect("a continue token");
    let err = api
        .list(&ListParams::default().limit(1).continue_token(&token))
        .await
        .expect_err("expired");
    assert_eq!(code(err), 410);
    api.list(&ListParams::default().limit(1).continue_token(&token))
        .await
        .expect("one expiry only");
    sim.shutdown().await;
}
