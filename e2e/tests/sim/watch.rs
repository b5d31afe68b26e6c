//! Watches, on kube-sim and the real API server (`#[both_backends]`):
//! kube-runtime watchers surviving dropped watches (resume from their
//! resourceVersion, no relist) and 410 Gone (relist), streaming lists,
//! timeouts, selector transitions and too-old resourceVersions. Faults go
//! through kube-sim's hooks, on the real backend through its fault proxy
//! (`compact`: etcd compaction and an API server restart); the clients use
//! the proxy. Periodic bookmarks are checked on kube-sim only: its interval
//! is configurable (200 ms here), the real server's about a minute.

use crate::sim_support;

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use serde_json::{Value, json};
use sim_support::{
    Backend, Cluster, assert_alive, cluster, count, eventually, options, watch_lines,
};
use testenv::both_backends;
use tokio::sync::mpsc;

/// The API server (kube-sim: 200 ms bookmarks; real: with the `WatchList`
/// feature gate, off by default in v1.34, that kube-sim's streaming lists
/// correspond to) and an admin client through the fault proxy.
async fn start(backend: Backend) -> (Cluster, kube::Client) {
    let mut opts = options(false);
    opts.apiserver_args
        .push("--feature-gates=WatchList=true".into());
    let cl = cluster(backend, opts).await;
    let c = cl.client(&cl.admin_token()).await.expect("client");
    (cl, c)
}

async fn stats(cl: &Cluster) -> Value {
    cl.stats().await.expect("stats")
}

async fn fault(cl: &Cluster, body: Value) {
    cl.fault(&body)
        .await
        .unwrap_or_else(|e| panic!("fault {body}: {e:#}"));
}

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(
        json!({"metadata": {"name": name, "labels": {"app": "w"}}, "data": {"k": "v"}}),
    )
    .expect("cm")
}

/// Spawn a watcher forwarding "apply:<name>", "initapply:<name>", "init", "initdone", "delete:<name>".
fn spawn_watcher(api: Api<ConfigMap>, cfg: watcher::Config) -> mpsc::UnboundedReceiver<String> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut s = watcher(api, cfg).boxed();
        while let Some(ev) = s.next().await {
            let msg = match ev {
                Ok(watcher::Event::Apply(o)) => {
                    format!("apply:{}", o.metadata.name.unwrap_or_default())
                }
                Ok(watcher::Event::Delete(o)) => {
                    format!("delete:{}", o.metadata.name.unwrap_or_default())
                }
                Ok(watcher::Event::InitApply(o)) => {
                    format!("initapply:{}", o.metadata.name.unwrap_or_default())
                }
                Ok(watcher::Event::Init) => "init".into(),
                Ok(watcher::Event::InitDone) => "initdone".into(),
                Err(e) => format!("error:{e}"),
            };
            if tx.send(msg).is_err() {
                return;
            }
        }
    });
    rx
}

async fn expect(rx: &mut mpsc::UnboundedReceiver<String>, want: &str) -> Vec<String> {
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let msg = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {want:?}; saw {seen:?}"))
            .expect("watcher alive");
        seen.push(msg.clone());
        if msg == want {
            return seen;
        }
    }
}

#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_resumes_after_dropped_watch_without_relisting(backend: Backend) {
    let (cl, c) = start(backend).await;
    let api: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    api.create(&PostParams::default(), &cm("before"))
        .await
        .expect("create");
    let mut rx = spawn_watcher(api.clone(), watcher::Config::default());
    let init = expect(&mut rx, "initdone").await;
    assert!(init.contains(&"initapply:before".to_string()), "{init:?}");
    // Let a bookmark arrive so the watcher's resourceVersion is current.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let lists_before = count(&stats(&cl).await, "list", "configmaps");
    let watches_before = count(&stats(&cl).await, "watch", "configmaps");

    fault(&cl, json!({"dropWatches": true})).await;
    api.create(&PostParams::default(), &cm("after-drop"))
        .await
        .expect("create");
    expect(&mut rx, "apply:after-drop").await;

    let s = stats(&cl).await;
    assert_eq!(
        count(&s, "list", "configmaps"),
        lists_before,
        "the watcher relisted instead of resuming: {s}"
    );
    assert!(
        count(&s, "watch", "configmaps") > watches_before,
        "no new watch request: {s}"
    );
    assert_alive(&cl);
}

#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_relists_after_410_gone(backend: Backend) {
    let (cl, c) = start(backend).await;
    let api: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    let mut rx = spawn_watcher(api.clone(), watcher::Config::default());
    expect(&mut rx, "initdone").await;
    let lists_before = count(&stats(&cl).await, "list", "configmaps");

    // Stall the watch so it cannot see the next write, then compact the history
    // and cut it: its resume point is now too old -> 410 -> relist.
    fault(&cl, json!({"stallWatchesSeconds": 30})).await;
    api.create(&PostParams::default(), &cm("missed"))
        .await
        .expect("create");
    fault(&cl, json!({"compact": true, "dropWatches": true})).await;
    fault(&cl, json!({"clear": true})).await;

    let seen = expect(&mut rx, "initapply:missed").await;
    assert!(
        seen.contains(&"init".to_string()),
        "a relist starts with Init: {seen:?}"
    );
    expect(&mut rx, "initdone").await;
    let s = stats(&cl).await;
    assert!(
        count(&s, "list", "configmaps") > lists_before,
        "no relist after 410: {s}"
    );
    // And it keeps following changes.
    api.create(&PostParams::default(), &cm("later"))
        .await
        .expect("create");
    expect(&mut rx, "apply:later").await;
    assert_alive(&cl);
}

#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_list_watcher_gets_initial_events_end_bookmark(backend: Backend) {
    let (cl, c) = start(backend).await;
    let api: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    for n in ["s1", "s2"] {
        api.create(&PostParams::default(), &cm(n))
            .await
            .expect("create");
    }
    let mut rx = spawn_watcher(api.clone(), watcher::Config::default().streaming_lists());
    let seen = expect(&mut rx, "initdone").await;
    assert!(
        seen.contains(&"initapply:s1".into()) && seen.contains(&"initapply:s2".into()),
        "{seen:?}"
    );
    assert_eq!(
        count(&stats(&cl).await, "list", "configmaps"),
        0,
        "streaming lists must not LIST"
    );

    // The raw stream: ADDED per object, then the annotated BOOKMARK.
    let (status, lines) = watch_lines(
        &c,
        "/api/v1/namespaces/default/configmaps?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=5",
        3,
        10,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(lines[0]["type"], "ADDED");
    assert_eq!(lines[1]["type"], "ADDED");
    assert_eq!(lines[2]["type"], "BOOKMARK");
    assert_eq!(
        lines[2]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    // sendInitialEvents without resourceVersionMatch=NotOlderThan is invalid.
    let (status, body) = sim_support::raw(
        &c,
        "GET",
        "/api/v1/configmaps?watch=true&sendInitialEvents=true&allowWatchBookmarks=true",
        None,
        "",
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["reason"], "Invalid");
    assert_alive(&cl);
}

#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookmarks_timeouts_selectors_and_too_old_versions(backend: Backend) {
    let (cl, c) = start(backend).await;
    let api: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    let first = api
        .create(&PostParams::default(), &cm("b1"))
        .await
        .expect("create");
    let rv = first.metadata.resource_version.clone().expect("rv");

    // timeoutSeconds=1 ends the stream; kube-sim sends a bookmark every
    // 200 ms meanwhile (the real server about once a minute: not checked).
    let started = std::time::Instant::now();
    let (_, lines) = watch_lines(&c, &format!("/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds=1"), 1000, 10).await;
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(900) && elapsed < Duration::from_secs(5),
        "timeoutSeconds not honoured: {elapsed:?}"
    );
    if !cl.is_real() {
        let bookmarks: Vec<_> = lines.iter().filter(|l| l["type"] == "BOOKMARK").collect();
        assert!(bookmarks.len() >= 2, "{lines:?}");
        assert_eq!(
            bookmarks[0]["object"]["metadata"]["resourceVersion"],
            rv.as_str()
        );
    }

    // Exact resourceVersion: only later events. Selector transitions: into the
    // selector -> ADDED, out of it -> DELETED.
    let c2 = c.clone();
    let path = format!(
        "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={rv}&labelSelector=tier%3Dgold&timeoutSeconds=5"
    );
    let reader = tokio::spawn(async move { watch_lines(&c2, &path, 3, 10).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let pp = kube::api::PatchParams::default();
    let label = |v: serde_json::Value| {
        kube::api::Patch::Merge(json!({"metadata": {"labels": {"tier": v}}}))
    };
    api.patch("b1", &pp, &label(json!("gold")))
        .await
        .expect("label in");
    api.patch("b1", &pp, &label(json!("gold")))
        .await
        .expect("no-op");
    api.patch(
        "b1",
        &pp,
        &kube::api::Patch::Merge(json!({"data": {"x": "y"}})),
    )
    .await
    .expect("modify");
    api.patch("b1", &pp, &label(json!(null)))
        .await
        .expect("label out");
    let (_, lines) = reader.await.expect("reader");
    let types: Vec<&str> = lines.iter().filter_map(|l| l["type"].as_str()).collect();
    assert_eq!(types, ["ADDED", "MODIFIED", "DELETED"], "{lines:?}");

    // A resourceVersion older than the history: ERROR event with a 410 Status.
    fault(&cl, json!({"compact": true})).await;
    api.create(&PostParams::default(), &cm("b2"))
        .await
        .expect("create");
    let (status, lines) = watch_lines(
        &c,
        &format!("/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={rv}"),
        1,
        5,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(lines[0]["type"], "ERROR");
    assert_eq!(lines[0]["object"]["code"], 410);
    assert_eq!(lines[0]["object"]["reason"], "Expired");
    assert!(
        lines[0]["object"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("too old resource version")),
        "{lines:?}"
    );
    let open = eventually(5, "watches closed", || {
        let cl = &cl;
        async move {
            let n = stats(cl).await["openWatches"].as_i64().unwrap_or(-1);
            (n == 0).then_some(n)
        }
    })
    .await;
    assert_eq!(open, 0);
    assert_alive(&cl);
}

/// A watch with `resourceVersion` unset or `"0"` starts with synthetic ADDED
/// events for the current state (and nothing older), then streams live changes.
#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_from_unset_or_zero_starts_with_the_current_state(backend: Backend) {
    let (cl, c) = start(backend).await;
    let nss: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(c.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "w0"}})).expect("ns"),
    )
    .await
    .expect("ns");
    let api: Api<ConfigMap> = Api::namespaced(c.clone(), "w0");
    for n in ["a", "b", "gone"] {
        api.create(&PostParams::default(), &cm(n))
            .await
            .expect("create");
    }
    // History the watch must not replay: `gone` was deleted, `b` modified.
    api.delete("gone", &Default::default())
        .await
        .expect("delete");
    let patch = kube::api::Patch::Merge(json!({"data": {"k": "b2"}}));
    api.patch("b", &Default::default(), &patch)
        .await
        .expect("patch");
    for (i, query) in ["", "&resourceVersion=0"].into_iter().enumerate() {
        let path = format!("/api/v1/namespaces/w0/configmaps?watch=true{query}");
        let watcher = {
            let c = c.clone();
            tokio::spawn(async move { watch_lines(&c, &path, 4, 10).await })
        };
        // Write only once the watch has taken its snapshot (it is counted open).
        eventually(5, "the watch is open", || {
            let cl = &cl;
            async move { (stats(cl).await["openWatches"].as_u64() == Some(1)).then_some(()) }
        })
        .await;
        let live = format!("live-{i}");
        api.patch(
            "a",
            &Default::default(),
            &kube::api::Patch::Merge(json!({"data": {"k": live}})),
        )
        .await
        .expect("patch");
        api.create(&PostParams::default(), &cm(&live))
            .await
            .expect("create");
        let (code, events) = watcher.await.expect("watch task");
        assert_eq!(code, 200);
        let seen: Vec<String> = events
            .iter()
            .map(|e| {
                format!(
                    "{}:{}:{}",
                    e["type"].as_str().unwrap_or(""),
                    e["object"]["metadata"]["name"].as_str().unwrap_or(""),
                    e["object"]["data"]["k"].as_str().unwrap_or("")
                )
            })
            .collect();
        let prev_a = if i == 0 {
            "v".to_string()
        } else {
            "live-0".to_string()
        };
        let mut want = vec![format!("ADDED:a:{prev_a}"), "ADDED:b:b2".to_string()];
        if i == 1 {
            // The object created live during the first round is current state now.
            want.push("ADDED:live-0:v".to_string());
            want.push(format!("MODIFIED:a:{live}"));
        } else {
            want.push(format!("MODIFIED:a:{live}"));
            want.push(format!("ADDED:{live}:v"));
        }
        assert_eq!(seen, want, "watch{query}");
        // The task ended after 4 lines; wait until the server has closed it too.
        eventually(5, "the watch is closed", || {
            let cl = &cl;
            async move { (stats(cl).await["openWatches"].as_u64() == Some(0)).then_some(()) }
        })
        .await;
    }
    assert_alive(&cl);
}
