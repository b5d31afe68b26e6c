//! Fault suite, part 2 (issue 7): credentials, several clusters, several
//! replicas, on both backends (kube-sim, and the real kube-apiserver behind
//! the fault proxy; leader election on real Leases). Same rules as
//! `controller/fault_suite.rs`: churn, then a convergence check against the truth
//! rendered from the server's source objects and against the churns' own model
//! of what they wrote (`fault_support::Sources`).
//!
//! | # | scenario | test |
//! |---|---|---|
//! | 8 | two replicas, Lease leader election, leader SIGKILLed, lease released on SIGTERM | `s08_leader_election` |
//! | 8 | the leader cannot renew: it stops writing at the renew deadline, before the lease expires | `s08_leader_steps_down_at_the_renew_deadline` |
//! | 8 | a leader whose clock is 20 s behind keeps renewing: no takeover; it stops: takeover (issue 16 item 6) | `s08_no_takeover_from_a_renewing_leader_with_a_skewed_clock` |
//! | 8 | the lease is lost while the new leader reads its objects: it writes nothing after the loss (issue 16 item 3) | `s08_a_leader_that_lost_the_lease_while_reading_writes_nothing` |
//! | 8 | the leader's write is held by the server past the takeover: nothing of it lands after the new leader's first write (issue 29 item 9) | `s08_a_write_held_past_the_takeover_never_lands_after_the_new_leader` |
//! | 8 | SIGTERM while every Lease request hangs: the release is bounded, the process exits 0 (issue 16 item 7) | `s08_the_release_at_shutdown_is_bounded` |
//! | 9 | `token_file` rotated on disk | `s09_token_file_rotation` |
//! | 9 | invalid token | `s09_invalid_token` |
//! | 10 | multi-cluster: one cluster down | `s10_one_cluster_down` |
//! | 10 | multi-cluster: one cluster forbidden | `s10_one_cluster_forbidden` |
//! | 10 | multi-cluster: one cluster's Services LIST keeps failing (issue 29, item 1) | `s10_one_clusters_service_list_failing` |

use crate::controller_support;
use crate::fault_support;

use std::time::Duration;

use controller_support::{Backend, Controller, Env, LIMIT, eventually};
use fault_support::{
    Churn, Kind, Specs, actual, config, diff, fault, masters, metric_sum, model_diff, reachable,
    signal, token_file_block, truth, truth_of, user_token, writes_since,
};
use k8s_openapi::api::coordination::v1::Lease;
use serde_json::{Value, json};
use testenv::both_backends;

const CONVERGE: Duration = Duration::from_secs(30);

/// Users that wrote DiscoveredServices after `since`.
async fn dsvc_writers(env: &Env, since: u64) -> Vec<String> {
    let mut users: Vec<String> = writes_since(env, since)
        .await
        .iter()
        .filter(|w| {
            w["resource"]
                .as_str()
                .is_some_and(|r| r.starts_with("discoveredservices"))
        })
        .filter_map(|w| w["user"].as_str().map(str::to_string))
        .collect();
    users.sort();
    users.dedup();
    users
}

fn token_file_config(env: &Env, token_file: &std::path::Path) -> String {
    format!(
        "discovery:\n  kubernetes:\n{}    watch_endpoint_slices: true\nkube_discovery:\n  coalesce_window: 20ms\n",
        token_file_block(env, token_file)
    )
}

#[both_backends]
#[tokio::test]
async fn s09_token_file_rotation(backend: Backend) {
    let env = Env::start_with(backend, masters(&["rotation-old", "rotation-new"])).await;
    let old = user_token(&env, "rotation-old");
    let new = user_token(&env, "rotation-new");
    let file = env.path("token");
    std::fs::write(&file, &old).expect("write token");
    let cfg = token_file_config(&env, &file);
    let mut churn = Churn::new("rot", 3, Kind::Slices, 9, 19);
    churn.seed(&env).await;
    let ctl = Controller::start(&env, "rot", &cfg, &[]).await;
    ctl.wait_ready().await;
    churn.wait_converged(&env, &cfg, CONVERGE).await;
    let rv = env.mark().await;
    assert_eq!(
        dsvc_writers(&env, 0).await,
        vec!["rotation-old".to_string()]
    );

    // Rotate on disk (atomically, as the kubelet does), no restart.
    let tmp = env.path("token.new");
    std::fs::write(&tmp, &new).expect("write token");
    std::fs::rename(&tmp, &file).expect("rotate");
    let pid = ctl.child.id();
    // kube re-reads a token file about once a minute: keep changing sources
    // until a write is made with the new token.
    let start = tokio::time::Instant::now();
    loop {
        churn.step(&env).await;
        if dsvc_writers(&env, rv)
            .await
            .contains(&"rotation-new".to_string())
        {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(80),
            "the rotated token was not used within 80 s"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    eprintln!("new token used after {:?}", start.elapsed());
    assert_eq!(ctl.child.id(), pid, "no restart");
    churn.wait_converged(&env, &cfg, CONVERGE).await;
    let logs = ctl.logs();
    assert!(
        !logs.contains(&old) && !logs.contains(&new),
        "a token was logged"
    );
    ctl.stop().await;
}

#[both_backends]
#[tokio::test]
async fn s09_invalid_token(backend: Backend) {
    let env = Env::start_with(backend, masters(&["recovered"])).await;
    let bad = format!("not-a-valid-token-{}", std::process::id());
    let file = env.path("token");
    std::fs::write(&file, &bad).expect("write token");
    env.namespace("inv").await;
    env.slice(
        "inv",
        "web",
        "web-a",
        &[("10.29.0.1", true)],
        &[("http", 80)],
    )
    .await;
    let mut ctl = Controller::start(&env, "invalid", &token_file_config(&env, &file), &[]).await;
    // A clear log line naming the cause.
    let logs = fault_support::wait_log(&ctl, "Unauthorized", LIMIT).await;
    let line = logs
        .lines()
        .find(|l| l.contains("Unauthorized"))
        .unwrap_or_default()
        .to_string();
    assert!(
        line.contains("401") || line.to_lowercase().contains("unauthorized"),
        "{line}"
    );
    // Observe for a while: bounded retries, no crash loop, not ready.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(
        ctl.child.try_wait().expect("try_wait").is_none(),
        "the controller exited:\n{}",
        ctl.logs()
    );
    assert_eq!(ctl.get("/healthz").await.0, 200);
    let (code, body) = ctl.get("/readyz").await;
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("Unauthorized") || body.contains("401"),
        "/readyz names the cause: {body}"
    );
    // The source watch's own retries (other watches, e.g. drift's, log their own lines).
    let failures = ctl
        .logs()
        .matches(r#""message":"watch failed; retrying with backoff""#)
        .count();
    // The policy (controller/src/k8s/watch.rs, `WatchBackoff`): 250 ms doubling to a 1 s cap, each
    // delay jittered to 50-100 %, so at most ~3 + 10 s / 0.5 s attempts in the
    // ~10 s observed; a hot loop (every Init resetting the backoff) made ~46.
    assert!(
        (2..=24).contains(&failures),
        "{failures} failed attempts in ~10 s: retries must back off"
    );
    assert!(metric_sum(&ctl, "kube_discovery_watch_restarts_total", &[]).await >= 2.0);
    let logs = ctl.logs();
    assert!(!logs.contains(&bad), "the token was logged");
    let (_, metrics) = ctl.get("/metrics").await;
    assert!(!metrics.contains(&bad) && !body.contains(&bad));
    assert!(
        env.dsvc("inv", "web").await.is_none(),
        "nothing written without a valid token"
    );

    // A valid token later: recovers without a restart.
    let good = user_token(&env, "recovered");
    std::fs::write(&file, &good).expect("write token");
    // (kube re-reads the file within about a minute.)
    eventually(
        "recovered with the new token",
        Duration::from_secs(80),
        || async { env.dsvc("inv", "web").await.map(|_| ()) },
    )
    .await;
    ctl.wait_ready().await;
    ctl.stop().await;
}

fn multi_config(a: &std::path::Path, b: &std::path::Path) -> String {
    format!(
        "discovery:\n  kubernetes:\n    - id: a\n      kubeconfig: {a}\n      watch_endpoint_slices: true\n    - id: b\n      kubeconfig: {b}\n      watch_endpoint_slices: true\nkube_discovery:\n  coalesce_window: 20ms\n  home:\n    kubeconfig: {a}\n",
        a = a.display(),
        b = b.display()
    )
}

async fn multi_truth(a: &Env, b: &Env, cfg: &str) -> Specs {
    let mut t = truth_of(&a.admin, cfg, "a").await;
    t.extend(truth_of(&b.admin, cfg, "b").await);
    t
}

/// Waits until the DiscoveredServices on `a` equal `want` (the render
/// truth) and `model` (the churns' own model, `Sources::expected_in`).
async fn wait_multi(a: &Env, want: impl AsyncFn() -> Specs, model: &Specs) -> Specs {
    let start = tokio::time::Instant::now();
    loop {
        let w = want().await;
        let got = actual(a).await;
        let mut d = diff(&w, &got);
        d.extend(
            model_diff(model, &got)
                .into_iter()
                .map(|l| format!("model: {l}")),
        );
        if d.is_empty() {
            return got;
        }
        assert!(
            start.elapsed() < CONVERGE,
            "not converged:\n  {}",
            d.join("\n  ")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn of_cluster(s: &Specs, id: &str) -> Specs {
    s.iter()
        .filter(|(_, v)| v["cluster"] == id)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[both_backends]
#[tokio::test]
async fn s10_one_cluster_down(backend: Backend) {
    let a = Env::start(backend).await;
    let b = Env::start(backend).await;
    let cfg = multi_config(
        &a.kubeconfig(&a.admin_token()),
        &b.kubeconfig(&b.admin_token()),
    );
    let mut ca = Churn::new("multi", 4, Kind::Slices, 101, 31);
    let mut cb = Churn::new("multi", 4, Kind::Slices, 102, 32);
    ca.seed(&a).await;
    cb.seed(&b).await;
    let ctl = Controller::start(&a, "multi", &cfg, &[]).await;
    ctl.wait_ready().await;
    let model = |ca: &Churn, cb: &Churn| {
        let mut m = ca.sources.expected_in("a");
        m.extend(cb.sources.expected_in("b"));
        m
    };
    let before = wait_multi(
        &a,
        async || multi_truth(&a, &b, &cfg).await,
        &model(&ca, &cb),
    )
    .await;
    let b_before = of_cluster(&before, "b");
    assert!(!b_before.is_empty() && !of_cluster(&before, "a").is_empty());

    // Cluster b goes away; a keeps changing and is followed; b's objects stay.
    fault(&b, json!({"refuseConnectionsSeconds": 6})).await;
    let down_until = tokio::time::Instant::now() + Duration::from_secs(6);
    ca.run(&a, 12, Duration::from_millis(50)).await;
    // b's sources did not change: its model still holds.
    let during = wait_multi(
        &a,
        async || {
            let mut t = truth_of(&a.admin, &cfg, "a").await;
            t.extend(b_before.clone());
            t
        },
        &model(&ca, &cb),
    )
    .await;
    assert!(
        tokio::time::Instant::now() < down_until,
        "cluster a was only followed after b came back"
    );
    assert_eq!(
        of_cluster(&during, "b"),
        b_before,
        "cluster b's objects were touched while it was down"
    );

    tokio::time::sleep_until(down_until).await;
    eventually("cluster b reachable", LIMIT, || async {
        reachable(&b).await.then_some(())
    })
    .await;
    cb.run(&b, 8, Duration::from_millis(50)).await;
    wait_multi(
        &a,
        async || multi_truth(&a, &b, &cfg).await,
        &model(&ca, &cb),
    )
    .await;
    ctl.stop().await;
}

#[both_backends]
#[tokio::test]
async fn s10_one_cluster_forbidden(backend: Backend) {
    let a = Env::start(backend).await;
    let b = Env::start(backend).await;
    // b: a ServiceAccount with no RBAC binding at all.
    let b_token = b
        .api
        .issue_token("kube-discovery", "unbound")
        .await
        .expect("token");
    let cfg = multi_config(&a.kubeconfig(&a.admin_token()), &b.kubeconfig(&b_token));
    let mut ca = Churn::new("multi", 4, Kind::Slices, 103, 33);
    let mut cb = Churn::new("multi", 4, Kind::Slices, 104, 34);
    ca.seed(&a).await;
    cb.seed(&b).await;
    let ctl = Controller::start(&a, "forbidden", &cfg, &[]).await;
    ca.run(&a, 10, Duration::from_millis(50)).await;
    // a is followed completely, nothing of b is written.
    let got = wait_multi(
        &a,
        async || truth_of(&a.admin, &cfg, "a").await,
        &ca.sources.expected_in("a"),
    )
    .await;
    assert!(of_cluster(&got, "b").is_empty());
    let logs = fault_support::wait_log(&ctl, "forbidden", LIMIT).await;
    assert!(
        logs.lines()
            .any(|l| l.contains("forbidden") && l.contains("\"cluster\":\"b\"")),
        "the failing cluster is named"
    );
    let (code, body) = ctl.get("/readyz").await;
    assert_eq!(code, 503, "not every cluster is synced: {body}");
    assert!(!body.contains(&b_token) && !logs.contains(&b_token));
    ctl.stop().await;
}

/// Issue 29, item 1, with several clusters: the Services LIST of cluster b
/// keeps failing (500) while its endpoints list fine. b publishes nothing
/// (an unknown Service is not taken for exported), `/readyz` stays 503 and
/// the log names b; cluster a is followed meanwhile. Once b's Services list,
/// b converges and the controller is ready.
#[both_backends]
#[tokio::test]
async fn s10_one_clusters_service_list_failing(backend: Backend) {
    let a = Env::start(backend).await;
    let b = Env::start(backend).await;
    let cfg = multi_config(
        &a.kubeconfig(&a.admin_token()),
        &b.kubeconfig(&b.admin_token()),
    );
    let mut ca = Churn::new("multi", 4, Kind::Slices, 105, 35);
    let mut cb = Churn::new("multi", 4, Kind::Slices, 106, 36);
    ca.seed(&a).await;
    cb.seed(&b).await;
    fault(
        &b,
        json!({"fail": {"verb": "list", "resource": "services", "count": 1_000_000, "code": 500}}),
    )
    .await;
    let ctl = Controller::start(&a, "services-failing", &cfg, &[]).await;
    ca.run(&a, 10, Duration::from_millis(50)).await;
    let got = wait_multi(
        &a,
        async || truth_of(&a.admin, &cfg, "a").await,
        &ca.sources.expected_in("a"),
    )
    .await;
    assert!(of_cluster(&got, "b").is_empty());
    // b's endpoints are listed and its Services list has failed (and been
    // retried) three times: still nothing of b, not ready.
    let failed_before_list =
        |l: &&str| l.contains("Service watch failed") && l.contains("\"cluster\":\"b\"");
    let logs = eventually("b's Services list failed three times", LIMIT, || async {
        let logs = ctl.logs();
        let listed = logs
            .lines()
            .any(|l| l.contains("list complete") && l.contains("\"cluster\":\"b\""));
        (listed && logs.lines().filter(failed_before_list).count() >= 3).then_some(logs)
    })
    .await;
    let got = actual(&a).await;
    assert!(
        of_cluster(&got, "b").is_empty(),
        "cluster b published without its Services: {:?}",
        of_cluster(&got, "b").keys().collect::<Vec<_>>()
    );
    let (code, body) = ctl.get("/readyz").await;
    assert_eq!(code, 503, "cluster b is not synced: {body}");
    assert!(
        logs.lines()
            .filter(failed_before_list)
            .all(|l| l.contains("before its first list")),
        "the log says what a failing first Services list means"
    );
    // The Services list again: b converges, ready.
    fault(&b, json!({"clear": true})).await;
    wait_multi(&a, async || multi_truth(&a, &b, &cfg).await, &{
        let mut m = ca.sources.expected_in("a");
        m.extend(cb.sources.expected_in("b"));
        m
    })
    .await;
    ctl.wait_ready().await;
    ctl.stop().await;
}

fn leader_config(env: &Env, token: &str) -> String {
    config(
        env,
        token,
        Kind::Slices,
        "  leader_election:\n    enabled: true\n    lease_namespace: default\n    lease_duration: 3s\n",
    )
}

async fn lease_holder(env: &Env) -> Option<String> {
    let api: kube::Api<Lease> = kube::Api::namespaced(env.admin.clone(), "default");
    api.get_opt("kube-discovery")
        .await
        .expect("get Lease")?
        .spec?
        .holder_identity
        .filter(|h| !h.is_empty())
}

#[both_backends]
#[tokio::test]
async fn s08_leader_election(backend: Backend) {
    let env = Env::start_with(backend, masters(&["replica-a", "replica-b"])).await;
    let ta = user_token(&env, "replica-a");
    let tb = user_token(&env, "replica-b");
    let (cfg_a, cfg_b) = (leader_config(&env, &ta), leader_config(&env, &tb));
    let mut churn = Churn::new("ha", 6, Kind::Slices, 8, 18);
    churn.seed(&env).await;
    let rv0 = env.mark().await;
    let a = Controller::start(&env, "replica-a", &cfg_a, &[]).await;
    let b = Controller::start(&env, "replica-b", &cfg_b, &[]).await;
    let holder = eventually("a Lease holder", LIMIT, || lease_holder(&env)).await;
    churn.run(&env, 20, Duration::from_millis(30)).await;
    churn.wait_converged(&env, &cfg_a, CONVERGE).await;
    // Only the leader writes (the write log names the user).
    let writers = dsvc_writers(&env, rv0).await;
    assert_eq!(
        writers.len(),
        1,
        "DiscoveredServices written by {writers:?} (lease holder {holder})"
    );
    let (mut leader, follower, follower_user) = if writers[0] == "replica-a" {
        (a, b, "replica-b")
    } else {
        (b, a, "replica-a")
    };
    let leader_pid = leader.child.id().expect("pid").to_string();
    assert!(
        holder.contains(&leader_pid),
        "the writer {} is not the lease holder {holder}",
        writers[0]
    );
    // The follower keeps a warm cache: its dump shows the truth without writing.
    let want = truth(&env, &cfg_a).await;
    let (code, dump) = follower.get("/v1/discovery/kubernetes/dump").await;
    assert_eq!(code, 200);
    let dump: Value = serde_json::from_str(&dump).expect("dump JSON");
    let names: Vec<String> = dump["endpoints"][0]["endpoints"]
        .as_array()
        .expect("endpoints")
        .iter()
        .map(|e| e["name"].as_str().unwrap_or("").to_string())
        .collect();
    let mut want_names: Vec<String> = want.keys().cloned().collect();
    want_names.sort();
    let mut names_sorted = names.clone();
    names_sorted.sort();
    assert_eq!(names_sorted, want_names, "the follower's cache is not warm");

    // Kill the leader: the follower takes over within the lease duration (3 s)
    // plus one retry period, and writes.
    signal(&leader, "KILL");
    let _ = tokio::time::timeout(LIMIT, leader.child.wait()).await;
    let killed = tokio::time::Instant::now();
    let rv1 = env.mark().await;
    let took = loop {
        churn.step(&env).await;
        if dsvc_writers(&env, rv1)
            .await
            .iter()
            .any(|u| u == follower_user)
        {
            break killed.elapsed();
        }
        assert!(
            killed.elapsed() < Duration::from_secs(15),
            "no takeover within 15 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        took <= Duration::from_secs(6),
        "takeover took {took:?} (lease 3 s + retry)"
    );
    churn.wait_converged(&env, &cfg_a, CONVERGE).await;
    let new_holder = lease_holder(&env).await.expect("holder");
    assert!(
        new_holder.contains(&follower.child.id().expect("pid").to_string()),
        "{new_holder}"
    );

    // SIGTERM: the lease is released (no holder) and the process exits 0.
    follower.stop().await;
    assert_eq!(
        lease_holder(&env).await,
        None,
        "the lease was not released on SIGTERM"
    );
}

async fn standby(ctl: &Controller) -> Option<bool> {
    let (_, body) = ctl.get("/readyz").await;
    serde_json::from_str::<Value>(&body).ok()?["standby"].as_bool()
}

fn unix_millis_now() -> i64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock");
    i64::try_from(d.as_millis()).expect("millis")
}

/// client-go semantics: a leader whose renewals fail stops writing once the
/// renew deadline (2/3 of the lease: 2 s of 3 s) has passed since its last
/// successful renewal, i.e. BEFORE the lease expires and a standby may take
/// over; it does not step down at the first failure; it writes again once it
/// can renew.
#[both_backends]
#[tokio::test]
async fn s08_leader_steps_down_at_the_renew_deadline(backend: Backend) {
    let env = Env::start_with(backend, masters(&["replica-a"])).await;
    let token = user_token(&env, "replica-a");
    let cfg = leader_config(&env, &token);
    env.namespace("ha").await;
    env.slice("ha", "web", "web-a", &[("10.8.0.1", true)], &[("http", 80)])
        .await;
    let a = Controller::start(&env, "replica-a", &cfg, &[]).await;
    eventually("replica-a leads", LIMIT, || async {
        (standby(&a).await == Some(false)).then_some(())
    })
    .await;
    env.wait_nodes("ha", "web", "http", &["10.8.0.1"]).await;

    // Every lease update (the renewal) now fails; reads still work, so the
    // replica keeps trying and the test can read the last renewTime.
    fault(
        &env,
        json!({"fail": {"verb": "update", "resource": "leases", "count": 1_000_000, "code": 500}}),
    )
    .await;
    let faulted = unix_millis_now();
    let stepped_down = loop {
        if standby(&a).await == Some(true) {
            break unix_millis_now();
        }
        assert!(
            unix_millis_now() - faulted < 15_000,
            "the leader never stepped down"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let api: kube::Api<Lease> = kube::Api::namespaced(env.admin.clone(), "default");
    let spec = api
        .get("kube-discovery")
        .await
        .expect("get Lease")
        .spec
        .expect("spec");
    let renewed = spec.renew_time.expect("renewTime").0.as_millisecond();
    let lease_ms = i64::from(spec.lease_duration_seconds.expect("duration")) * 1000;
    assert_eq!(lease_ms, 3000);
    let after = stepped_down - renewed;
    // Not at the first failed renewal (one retry period, 400 ms, after the
    // last success) but close to the 2 s deadline, and before the lease expires.
    assert!(
        after >= 1500,
        "stepped down {after} ms after the last renewal: too early"
    );
    assert!(
        after < lease_ms,
        "stepped down {after} ms after the last renewal: a standby could take over after {lease_ms} ms"
    );
    assert!(
        a.logs()
            .contains("within the renew deadline; stepping down"),
        "no step-down log"
    );

    // Stepped down: changes are not written.
    let rv = env.mark().await;
    env.slice("ha", "web", "web-a", &[("10.8.0.2", true)], &[("http", 80)])
        .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        dsvc_writers(&env, rv).await,
        Vec::<String>::new(),
        "a replica that cannot renew wrote"
    );
    // Renewals work again: it leads and writes what it missed.
    fault(&env, json!({"clear": true})).await;
    env.wait_nodes("ha", "web", "http", &["10.8.0.2"]).await;
    assert_eq!(standby(&a).await, Some(false));
    a.stop().await;
}

/// Writes the Lease `kube-discovery` as held by `holder`, its `renewTime`
/// (and `acquireTime`) `behind` the test's clock: a leader whose wall clock
/// is that far behind. Creates it when absent; `false` on a conflict.
async fn write_skewed_lease(admin: &kube::Client, holder: &str, behind: Duration) -> bool {
    let api: kube::Api<Lease> = kube::Api::namespaced(admin.clone(), "default");
    let at = jiff::Timestamp::now() - jiff::SignedDuration::try_from(behind).expect("duration");
    let time = json!(at.to_string());
    let current = api.get_opt("kube-discovery").await.expect("get Lease");
    let spec = json!({"holderIdentity": holder, "leaseDurationSeconds": 3,
        "acquireTime": time, "renewTime": time, "leaseTransitions": 0});
    match current {
        None => {
            let lease: Lease = serde_json::from_value(
                json!({"metadata": {"name": "kube-discovery"}, "spec": spec}),
            )
            .expect("lease");
            api.create(&Default::default(), &lease).await.is_ok()
        }
        Some(mut lease) => {
            lease.spec = Some(serde_json::from_value(spec).expect("spec"));
            api.replace("kube-discovery", &Default::default(), &lease)
                .await
                .is_ok()
        }
    }
}

/// Issue 16 item 6: the standby compares nothing remote with its own clock.
/// The test plays a leader whose wall clock is 20 s behind (every renewTime
/// it writes looks 17 s expired to the controller's clock) and renews every
/// 300 ms: the controller stays a standby and writes nothing for 5 s (more
/// than the 3 s lease); once the renewals stop it takes over and writes.
#[both_backends]
#[tokio::test]
async fn s08_no_takeover_from_a_renewing_leader_with_a_skewed_clock(backend: Backend) {
    let env = Env::start_with(backend, masters(&["replica-b"])).await;
    let token = user_token(&env, "replica-b");
    let cfg = leader_config(&env, &token);
    env.namespace("skew").await;
    env.slice(
        "skew",
        "web",
        "web-a",
        &[("10.8.0.1", true)],
        &[("http", 80)],
    )
    .await;
    let behind = Duration::from_secs(20);
    assert!(write_skewed_lease(&env.admin, "skewed-leader", behind).await);
    let renewer = {
        let admin = env.admin.clone();
        tokio::spawn(async move {
            loop {
                write_skewed_lease(&admin, "skewed-leader", behind).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };
    let rv = env.mark().await;
    let b = Controller::start(&env, "replica-b", &cfg, &[]).await;
    b.wait_ready().await;
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    while tokio::time::Instant::now() < until {
        assert_eq!(
            standby(&b).await,
            Some(true),
            "took over from a leader that renews (its renewTime is 20 s behind)"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(lease_holder(&env).await.as_deref(), Some("skewed-leader"));
    assert_eq!(dsvc_writers(&env, rv).await, Vec::<String>::new());
    // The leader stops renewing: the controller takes over and writes.
    renewer.abort();
    let _ = renewer.await;
    eventually("the standby takes over", LIMIT, || async {
        (standby(&b).await == Some(false)).then_some(())
    })
    .await;
    let pid = b.child.id().expect("pid").to_string();
    assert!(lease_holder(&env).await.expect("holder").contains(&pid));
    env.wait_nodes("skew", "web", "http", &["10.8.0.1"]).await;
    b.stop().await;
}

/// Issue 16 item 7: SIGTERM while every Lease request hangs (a 2-minute
/// latency fault): the release is bounded, so the process still exits 0
/// (well within the test's 30 s limit; before, the release waited for the
/// API server).
#[both_backends]
#[tokio::test]
async fn s08_the_release_at_shutdown_is_bounded(backend: Backend) {
    let env = Env::start_with(backend, masters(&["replica-a"])).await;
    let token = user_token(&env, "replica-a");
    let cfg = leader_config(&env, &token);
    let a = Controller::start(&env, "replica-a", &cfg, &[]).await;
    eventually("replica-a leads", LIMIT, || async {
        (standby(&a).await == Some(false)).then_some(())
    })
    .await;
    fault(
        &env,
        json!({"latency": {"verb": "*", "resource": "leases", "millis": 120_000}}),
    )
    .await;
    a.stop().await;
    fault(&env, json!({"clear": true})).await;
}

/// Renews the Lease as `holder` (with the test's clock) every 300 ms until aborted.
fn renew_as(admin: &kube::Client, holder: &'static str) -> tokio::task::JoinHandle<()> {
    let admin = admin.clone();
    tokio::spawn(async move {
        loop {
            write_skewed_lease(&admin, holder, Duration::ZERO).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
}

/// Issue 16 item 3: a replica gains the lease, and while its writer reads
/// what the API server holds (that list delayed 4 s by a fault) someone else
/// takes the lease over. The write log shows no write of it after the loss
/// (before the write planner, its writer saw the loss only after the read
/// and started writes that only the epoch fence dropped); once it leads
/// again, it writes.
#[both_backends]
#[tokio::test]
async fn s08_a_leader_that_lost_the_lease_while_reading_writes_nothing(backend: Backend) {
    let env = Env::start_with(backend, masters(&["replica-b"])).await;
    let token = user_token(&env, "replica-b");
    let cfg = leader_config(&env, &token);
    assert!(write_skewed_lease(&env.admin, "other", Duration::ZERO).await);
    let renewer = renew_as(&env.admin, "other");
    let b = Controller::start(&env, "replica-b", &cfg, &[]).await;
    env.namespace("fence").await;
    for i in 0..4 {
        let (svc, slice) = (format!("web{i}"), format!("web{i}-a"));
        env.slice(
            "fence",
            &svc,
            &slice,
            &[("10.8.1.1", true)],
            &[("http", 80)],
        )
        .await;
    }
    b.wait_ready().await;
    assert_eq!(standby(&b).await, Some(true));
    // The start-up read of DiscoveredServices of the next leader takes 4 s.
    fault(
        &env,
        json!({"latency": {"verb": "list", "resource": "discoveredservices", "millis": 4000}}),
    )
    .await;
    renewer.abort();
    let _ = renewer.await;
    let api: kube::Api<Lease> = kube::Api::namespaced(env.admin.clone(), "default");
    let mut lease = api.get("kube-discovery").await.expect("Lease");
    if let Some(spec) = lease.spec.as_mut() {
        spec.holder_identity = Some(String::new());
    }
    api.replace("kube-discovery", &Default::default(), &lease)
        .await
        .expect("release");
    let pid = b.child.id().expect("pid").to_string();
    eventually("replica-b takes the lease", LIMIT, || async {
        lease_holder(&env)
            .await
            .filter(|h| h.contains(&pid))
            .map(|_| ())
    })
    .await;
    // Taken back at once, while b's writer still reads.
    let taken = tokio::time::Instant::now();
    eventually("the lease taken back", LIMIT, || async {
        write_skewed_lease(&env.admin, "other", Duration::ZERO)
            .await
            .then_some(())
    })
    .await;
    assert!(
        taken.elapsed() < Duration::from_secs(3),
        "the lease was not taken back while b's writer read"
    );
    let rv = env.mark().await;
    let renewer = renew_as(&env.admin, "other");
    // The read ends 4 s after it began; the writer's next turn comes then.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        dsvc_writers(&env, rv).await,
        Vec::<String>::new(),
        "a replica wrote after it lost the lease"
    );
    assert_eq!(standby(&b).await, Some(true));
    // It did gain the lease and lose it during the read. The planner takes
    // in the loss before the read's answer, so no write even starts (had one
    // started, the sink's epoch fence would drop it: `sink` unit tests).
    let logs = b.logs();
    let gained = logs.find("leader: writing").expect("b gained the lease");
    assert!(
        logs[gained..].contains("standby: not writing"),
        "b did not see the loss:\n{logs}"
    );
    assert_eq!(
        metric_sum(&b, "kube_discovery_writes_total", &["result=\"applied\""]).await,
        0.0
    );
    // Leading again: everything is written.
    fault(&env, json!({"clear": true})).await;
    renewer.abort();
    let _ = renewer.await;
    let mut lease = api.get("kube-discovery").await.expect("Lease");
    if let Some(spec) = lease.spec.as_mut() {
        spec.holder_identity = Some(String::new());
    }
    api.replace("kube-discovery", &Default::default(), &lease)
        .await
        .expect("release");
    for i in 0..4 {
        env.wait_nodes("fence", &format!("web{i}"), "http", &["10.8.1.1"])
            .await;
    }
    b.stop().await;
}

/// Issue 29 item 9: a write of the old leader never lands after the new
/// leader's first write. The leader (lease 3 s, renew deadline 2 s) cannot
/// renew from now on, and its next DiscoveredService write is held 8 s by
/// the API server (less than `request_timeout`, 10 s). The test plays the
/// standby: it takes the lease over once the record has not changed for the
/// lease duration, and writes the object (the new leader's first write).
/// The write log after that shows nothing of the old leader: its held
/// write was abandoned at its renew deadline, before the takeover.
#[both_backends]
#[tokio::test]
async fn s08_a_write_held_past_the_takeover_never_lands_after_the_new_leader(backend: Backend) {
    let env = Env::start_with(backend, masters(&["replica-a"])).await;
    let token = user_token(&env, "replica-a");
    let cfg = leader_config(&env, &token);
    env.namespace("held").await;
    env.slice(
        "held",
        "web",
        "web-a",
        &[("10.8.2.1", true)],
        &[("http", 80)],
    )
    .await;
    let a = Controller::start(&env, "replica-a", &cfg, &[]).await;
    eventually("replica-a leads", LIMIT, || async {
        (standby(&a).await == Some(false)).then_some(())
    })
    .await;
    env.wait_nodes("held", "web", "http", &["10.8.2.1"]).await;

    // From now on its renewals fail, and its next write is held 8 s.
    fault(
        &env,
        json!({
            "fail": {"verb": "update", "resource": "leases", "count": 1_000_000, "code": 500},
            "latency": {"verb": "patch", "resource": "discoveredservices", "millis": 8000, "count": 1}
        }),
    )
    .await;
    let held = tokio::time::Instant::now();
    env.slice(
        "held",
        "web",
        "web-a",
        &[("10.8.2.2", true)],
        &[("http", 80)],
    )
    .await;
    // The standby's view: the time the record last changed, on its own clock.
    let api: kube::Api<Lease> = kube::Api::namespaced(env.admin.clone(), "default");
    let mut seen = api.get("kube-discovery").await.expect("Lease").spec;
    let mut changed = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = api.get("kube-discovery").await.expect("Lease").spec;
        if now != seen {
            seen = now;
            changed = tokio::time::Instant::now();
        }
        if changed.elapsed() >= Duration::from_secs(3) {
            break;
        }
        assert!(
            held.elapsed() < Duration::from_secs(6),
            "the leader kept renewing"
        );
    }
    // Take over (delete and create: the updates of leases fail on kube-sim
    // for everyone), then write as the new leader.
    api.delete("kube-discovery", &Default::default())
        .await
        .expect("delete the Lease");
    assert!(write_skewed_lease(&env.admin, "new-leader", Duration::ZERO).await);
    let renewer = renew_as(&env.admin, "new-leader");
    let mark = env.mark().await;
    let dsvcs: kube::Api<kube::api::DynamicObject> = kube::Api::namespaced_with(
        env.admin.clone(),
        "held",
        &controller_support::dsvc_resource(),
    );
    // The new leader writes as the controller does: a server-side apply by
    // the installation's field manager (so the held apply meets no conflict).
    let mut first = env.dsvc("held", "web").await.expect("held/web");
    first["metadata"] = json!({"name": "web", "namespace": "held",
        "labels": first["metadata"]["labels"].clone()});
    first["spec"]["ports"] = json!({"http": [{"host": "10.8.2.9", "port": 80, "weight": 1}]});
    dsvcs
        .patch(
            "web",
            &kube::api::PatchParams::apply("kube-discovery/default").force(),
            &kube::api::Patch::Apply(&first),
        )
        .await
        .expect("the new leader's first write");
    assert!(
        held.elapsed() < Duration::from_secs(8),
        "the takeover came after the held write's 8 s: the test proves nothing"
    );
    // The held write would have been answered 8 s after it was sent.
    tokio::time::sleep(Duration::from_secs(9).saturating_sub(held.elapsed())).await;
    let after: Vec<String> = writes_since(&env, mark)
        .await
        .iter()
        .filter(|w| w["user"] == "replica-a")
        .map(|w| {
            let f = |k: &str| w[k].as_str().unwrap_or_default().to_string();
            format!("{} {}/{}", f("verb"), f("resource"), f("name"))
        })
        .collect();
    assert_eq!(
        after,
        Vec::<String>::new(),
        "the old leader's writes landed after the new leader's first write"
    );
    let ds = env.dsvc("held", "web").await.expect("held/web");
    assert_eq!(
        ds["spec"]["ports"]["http"][0]["host"], "10.8.2.9",
        "the new leader's write was overwritten: {ds}"
    );
    renewer.abort();
    let _ = renewer.await;
    fault(&env, json!({"clear": true})).await;
    a.stop().await;
}
