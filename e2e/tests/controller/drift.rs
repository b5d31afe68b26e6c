//! Live drift correction (issue 4 "Drift correction", issue 7 scenario 6),
//! on both API servers: the `kube-discovery` binary watches its own
//! DiscoveredServices and puts back what someone else changed, with the write
//! log proving that it writes exactly the repairs (and nothing for the late
//! watch events of its own writes). kube-sim's write log lists changes; the
//! real server's (its audit log) lists every successful write REQUEST, no-op
//! patches included, so there the same counts also prove that no request was
//! wasted (and under churn the revisions the writes answered with show that
//! each changed its object, on both):
//! * zero writes in a quiet period, and writes == changes under churn;
//! * a hand edit of `spec.ports` (a list replaced, a port key added), the
//!   managed-by label removed, another label removed, an object deleted, one
//!   shard of a sharded service deleted: each restored within 2 s;
//! * a hand-made object with our labels for a service that does not exist:
//!   deleted within 2 s;
//! * `kube_discovery_drift_corrections_total{kind}` counts each repair.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::controller_support;

use std::collections::BTreeSet;
use std::time::Duration;

use controller_support::{Backend, Controller, Env, LIMIT, Options, dsvc_resource, eventually};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testenv::both_backends;
use tokio::time::Instant;

/// The bound of the issue: restored "within a second or two".
const RESTORE: Duration = Duration::from_secs(2);

const NS: &str = "drift";

fn config(env: &Env) -> String {
    format!(
        "discovery:\n  kubernetes:\n{}    watch_endpoint_slices: true\nkube_discovery:\n  coalesce_window: 20ms\n",
        env.service_block(&env.admin_token())
    )
}

fn api(env: &Env) -> Api<DynamicObject> {
    Api::namespaced_with(env.admin.clone(), NS, &dsvc_resource())
}

/// `verb ns/name` of every DiscoveredService write after `mark`.
async fn writes(env: &Env, mark: u64) -> Vec<String> {
    env.dsvc_writes_since(mark)
        .await
        .iter()
        .map(|w| {
            format!(
                "{} {}/{}",
                w["verb"].as_str().unwrap_or(""),
                w["namespace"].as_str().unwrap_or(""),
                w["name"].as_str().unwrap_or("")
            )
        })
        .collect()
}

/// `metadata.labels`, `ownerReferences` and `spec` of `name`.
async fn snapshot(env: &Env, name: &str) -> Option<Value> {
    let o = env.dsvc(NS, name).await?;
    Some(json!({"labels": o["metadata"]["labels"], "spec": o["spec"]}))
}

/// Waits until `name` looks like `want` again (`None`: gone); returns how
/// long that took from `since`.
async fn wait_restored(env: &Env, name: &str, want: &Option<Value>, since: Instant) -> Duration {
    eventually(&format!("{NS}/{name} restored"), LIMIT, || async {
        (snapshot(env, name).await == *want).then(|| since.elapsed())
    })
    .await
}

async fn metric(ctl: &Controller, kind: &str) -> f64 {
    let (_, text) = ctl.get("/metrics").await;
    let needle = format!("kube_discovery_drift_corrections_total{{cluster=\"\",kind=\"{kind}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&needle))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// 5,000 endpoints with 3 ports: too big for one object (two shards).
async fn big_service(env: &Env) {
    let ports = [("http", 8080), ("grpc", 9090), ("metrics", 9100)];
    let mut futs = Vec::new();
    for s in 0..50 {
        let ips: Vec<String> = (0..100).map(|i| format!("10.60.{s}.{}", i + 1)).collect();
        futs.push(async move {
            let eps: Vec<(&str, bool)> = ips.iter().map(|ip| (ip.as_str(), true)).collect();
            env.slice(NS, "huge", &format!("huge-{s}"), &eps, &ports)
                .await;
        });
    }
    futures::future::join_all(futs).await;
}

async fn quiet_period_writes_nothing(env: &Env) {
    let mark = env.mark().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let w = writes(env, mark).await;
    assert!(w.is_empty(), "writes in a quiet period: {w:?}");
}

// kube-sim runs in this process: with its own threads, the test's polling
// (reading the megabyte-sized shard) does not hold up the API server.
#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_edits_deletes_and_orphans_are_repaired_with_exactly_the_needed_writes(
    backend: Backend,
) {
    let env = Env::start(backend).await;
    env.namespace(NS).await;
    for (i, name) in ["a", "b", "c", "d"].iter().enumerate() {
        env.slice(
            NS,
            name,
            &format!("{name}-x"),
            &[(&format!("10.61.{i}.1"), true)],
            &[("http", 80)],
        )
        .await;
    }
    big_service(&env).await;
    let ctl = Controller::start(&env, "drift", &config(&env), &[]).await;
    ctl.wait_ready().await;
    env.wait_nodes(NS, "d", "http", &["10.61.3.1"]).await;
    let huge = eventually("huge is written as shards", LIMIT, || async {
        let names = env.dsvc_names().await;
        let shards: Vec<String> = names
            .into_iter()
            .filter(|n| n.starts_with(&format!("{NS}/huge")))
            .collect();
        (shards.len() >= 2).then_some(shards)
    })
    .await;
    let original: Vec<(String, Option<Value>)> = {
        let mut v = Vec::new();
        for n in ["a", "b", "c", "d", "huge.1"] {
            v.push((n.to_string(), snapshot(&env, n).await));
        }
        v
    };
    let orig = |n: &str| {
        original
            .iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.clone())
            .expect("known object")
    };
    assert!(orig("huge.1").is_some(), "{huge:?}");
    quiet_period_writes_nothing(&env).await;

    // 1. spec.ports edited: a list replaced and a port key added.
    let mark = env.mark().await;
    let t = Instant::now();
    api(&env)
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"ports": {
                "http": [{"host": "6.6.6.6", "port": 1, "weight": 1}],
                "bogus": [{"host": "6.6.6.7", "port": 2, "weight": 1}]}}})),
        )
        .await
        .expect("hand edit");
    let took = wait_restored(&env, "a", &orig("a"), t).await;
    assert!(took <= RESTORE, "edit of a restored after {took:?}");
    // The content is back after the removal; the generation stamp comes
    // right after it (counting before it raced: 3 writes seen, CI).
    eventually("drift/a observedGeneration = generation", LIMIT, || async {
        let o = env.dsvc(NS, "a").await?;
        (o["status"]["observedGeneration"] == o["metadata"]["generation"]).then_some(())
    })
    .await;
    // The edit, then ours: apply (spec and status in one request), removal
    // of the added key (server-side apply never removes a key it does not
    // own), and the apply that stamps the generation the removal produced
    // (`observedGeneration`; every other repair below guesses it right).
    let w = writes(&env, mark).await;
    assert_eq!(w, vec!["patch drift/a"; 4]);

    // 2. The managed-by label removed: still ours (its instance label says
    //    so), an edit, and the label comes back.
    let mark = env.mark().await;
    let t = Instant::now();
    api(&env)
        .patch(
            "b",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"app.kubernetes.io/managed-by": null}}})),
        )
        .await
        .expect("remove label");
    let took = wait_restored(&env, "b", &orig("b"), t).await;
    assert!(took <= RESTORE, "label of b restored after {took:?}");
    let w = writes(&env, mark).await;
    assert_eq!(w, vec!["patch drift/b"; 2], "the edit and our apply");

    // 3. Another of our labels removed (still selected): an edit.
    let mark = env.mark().await;
    let t = Instant::now();
    api(&env)
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"kubediscovery.io/service-name": null}}})),
        )
        .await
        .expect("remove label");
    let took = wait_restored(&env, "c", &orig("c"), t).await;
    assert!(took <= RESTORE, "label of c restored after {took:?}");
    let w = writes(&env, mark).await;
    assert_eq!(w, vec!["patch drift/c"; 2], "the edit and our apply");

    // 4. A whole object deleted.
    let mark = env.mark().await;
    let t = Instant::now();
    api(&env)
        .delete("d", &DeleteParams::default())
        .await
        .expect("delete d");
    let took = wait_restored(&env, "d", &orig("d"), t).await;
    assert!(took <= RESTORE, "d re-created after {took:?}");
    let w = writes(&env, mark).await;
    // The delete, then ours: ONE apply creates it with its status.
    assert_eq!(w, vec!["delete drift/d", "create drift/d"]);

    // 5. A hand-made object with our labels for a service that does not exist.
    let mark = env.mark().await;
    let ghost: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kubediscovery.io/v1alpha1", "kind": "DiscoveredService",
        "metadata": {"name": "ghost", "namespace": NS, "labels": {
            "app.kubernetes.io/managed-by": "kube-discovery",
            "kubediscovery.io/cluster": "",
            "kubediscovery.io/service-namespace": NS,
            "kubediscovery.io/service-name": "ghost"}},
        "spec": {"cluster": "", "service": "drift/ghost", "sourceNamespace": NS,
                 "sourceName": "ghost", "source": "EndpointSlice",
                 "ports": {"http": [{"host": "6.6.6.6", "port": 80, "weight": 1}]},
                 "version": "0000000000000000"}
    }))
    .expect("object");
    let t = Instant::now();
    api(&env)
        .create(&PostParams::default(), &ghost)
        .await
        .expect("create ghost");
    let took = wait_restored(&env, "ghost", &None, t).await;
    assert!(took <= RESTORE, "orphan removed after {took:?}");
    let w = writes(&env, mark).await;
    assert_eq!(w, vec!["create drift/ghost", "delete drift/ghost"]);
    // ... and says so on the deleted object (Events outlive it).
    let orphaned = eventually("an OrphanDeleted Event on ghost", LIMIT, || async {
        let ev = env
            .events(NS, "OrphanDeleted", "DiscoveredService", "ghost")
            .await;
        (!ev.is_empty()).then_some(ev)
    })
    .await;
    assert_eq!(orphaned.len(), 1, "{orphaned:?}");
    assert!(
        orphaned[0]
            .note
            .as_deref()
            .is_some_and(|n| n.contains("drift/ghost was deleted: no Service")),
        "{orphaned:?}"
    );

    // 6. One shard of a sharded service deleted (last: its megabyte-sized
    //    watch events keep a debug build busy for a while): only that shard is written
    //    (the others are intact in the cache: not rewritten, which would
    //    only move their lastSyncTime).
    let mark = env.mark().await;
    let t = Instant::now();
    api(&env)
        .delete("huge.1", &DeleteParams::default())
        .await
        .expect("delete shard");
    let took = wait_restored(&env, "huge.1", &orig("huge.1"), t).await;
    assert!(took <= RESTORE, "huge.1 re-created after {took:?}");
    let w = writes(&env, mark).await;
    assert_eq!(w, vec!["delete drift/huge.1", "create drift/huge.1"]);

    // Everything else untouched, and quiet again.
    for (n, v) in &original {
        assert_eq!(&snapshot(&env, n).await, v, "{n}");
    }
    quiet_period_writes_nothing(&env).await;
    assert_eq!(metric(&ctl, "edited").await, 3.0);
    assert_eq!(metric(&ctl, "deleted").await, 2.0);
    assert_eq!(metric(&ctl, "orphan").await, 1.0);
    let logs = ctl.logs();
    assert_eq!(
        logs.matches("drift: restoring the desired state").count(),
        6,
        "one log line per correction"
    );
    ctl.stop().await;
}

#[both_backends]
#[tokio::test]
async fn own_writes_under_churn_cause_no_extra_writes(backend: Backend) {
    // The real server's write log with the revisions of DiscoveredService
    // writes (kube-sim's always has them).
    let mut opts = Options::default();
    opts.audit_write_bodies
        .push(("kubediscovery.io".into(), "discoveredservices".into()));
    let env = Env::start_with(backend, opts).await;
    env.namespace(NS).await;
    let names = ["p", "q", "r"];
    for (i, name) in names.iter().enumerate() {
        env.slice(
            NS,
            name,
            &format!("{name}-x"),
            &[(&format!("10.62.{i}.1"), true)],
            &[("http", 80)],
        )
        .await;
    }
    let ctl = Controller::start(&env, "churn", &config(&env), &[]).await;
    ctl.wait_ready().await;
    env.wait_nodes(NS, "r", "http", &["10.62.2.1"]).await;
    quiet_period_writes_nothing(&env).await;
    // 30 changes, round robin, 60 ms apart (longer than the 20 ms window, so
    // each is its own write, and the watch events of our writes arrive while
    // newer changes are already pending).
    let rv0: u64 = api(&env)
        .list(&ListParams::default().limit(1))
        .await
        .expect("list")
        .metadata
        .resource_version
        .and_then(|v| v.parse().ok())
        .expect("list resourceVersion");
    let mark = env.mark().await;
    let changes = 30;
    for k in 0..changes {
        let i = k % names.len();
        let ip = format!("10.62.{i}.{}", k + 2);
        env.slice(
            NS,
            names[i],
            &format!("{}-x", names[i]),
            &[(ip.as_str(), true)],
            &[("http", 80)],
        )
        .await;
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    for (i, name) in names.iter().enumerate() {
        let last = (0..changes).filter(|k| k % names.len() == i).max().unwrap();
        env.wait_nodes(NS, name, "http", &[&format!("10.62.{i}.{}", last + 2)])
            .await;
    }
    // Let late events and drift checks play out.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let writes = env.dsvc_writes_since(mark).await;
    let w: Vec<String> = writes
        .iter()
        .map(|w| w["name"].as_str().unwrap_or("").to_string())
        .collect();
    let applied = {
        let (_, text) = ctl.get("/metrics").await;
        text.lines()
            .find_map(|l| {
                l.strip_prefix("kube_discovery_writes_total{cluster=\"\",result=\"applied\"} ")
            })
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(0)
    };
    // Three initial applies, then at most one per change (coalescing may
    // merge two changes of a service, never add writes); each apply is ONE
    // API write (spec and status together, no status subresource).
    let applies = applied - names.len();
    assert!(
        applies <= changes && applies >= changes / 2,
        "{applies} applies for {changes} changes"
    );
    assert_eq!(
        w.len(),
        applies,
        "{} writes for {applies} applies: {w:?}",
        w.len()
    );
    // And each write changed its object (kube-sim's write log lists only
    // changes, the real server's every request): it answered with a new
    // revision, where a no-op apply answers with the one the object had.
    let mut revisions = BTreeSet::new();
    for x in &writes {
        let rv: u64 = x["resourceVersion"]
            .as_str()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        assert!(
            rv > rv0 && revisions.insert(rv),
            "{} answered with revision {rv}, not a new one (after {rv0}): a write that changed nothing",
            x["name"]
        );
    }
    for kind in ["edited", "deleted", "orphan"] {
        assert_eq!(
            metric(&ctl, kind).await,
            0.0,
            "a drift correction under churn"
        );
    }
    quiet_period_writes_nothing(&env).await;
    ctl.stop().await;
}
