//! Fault suite, the requests side (issue 16): what the controller does when
//! the API server stops answering without closing anything, sends huge
//! `Retry-After`s, or when it must stop while the API server hangs. On both
//! backends (kube-sim's faults; the real API server behind the fault proxy).
//!
//! | scenario | test |
//! |---|---|
//! | a 6 s partition after which the open connections never answer again; then 40 services change | `p01_frozen_connections` |
//! | a write answered 429 with `Retry-After: 3600` | `p02_retry_after_capped` |
//! | the controller's RBAC revoked at runtime, then restored | `p03_revoked_rbac_unready` |
//! | SIGTERM while a write hangs on the server | `p04_shutdown_deadline` |
//! | every paged list's `continue` token expires (410) | `p05_expired_continue_token` |
//! | real only: etcd compacted between two pages of the first list | `p06_compaction_between_pages_real` |
//! | 429 (`Retry-After: 1`) on every second write, ten times, with a ceiling of 20 writes/s (issue 19, item 4) | `p07_throttled_server_never_sees_more_than_the_ceiling` |
//! | real only: API Priority and Fairness itself rejects the controller's writes (a priority level of one share that rejects instead of queueing) | `p08_apf_rejections_real` |

use crate::controller_support;
use crate::fault_support;

use std::time::Duration;

use controller_support::{Backend, Controller, Env, Options, eventually};
use fault_support::{
    Churn, Kind, arrivals, config, fault, masters, metric_sum, signal, user_token, wait_converged,
};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use testenv::both_backends;

/// The default `kube_discovery.request_timeout`.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The controller's token: not kube-sim's admin token, whose connections
/// kube-sim never freezes (they are the test's own).
fn controller_token(env: &Env) -> String {
    user_token(env, "kd")
}

/// Issue 16, item 2: a 6 s network partition in which the open connections
/// stop answering (nothing closed) and new ones are swallowed; afterwards
/// the old connections stay dead. 40 services change right after it heals.
/// Before request timeouts, the watch (and every pooled connection) waited
/// for the server forever: the changes were written only when the watch's
/// own idle timeout fired, ~290 s later. Now every request is bounded by
/// `request_timeout` and watches are renewed within it, so the dead
/// connections are replaced: converged within two request timeouts (a dead
/// watch, then dead pooled write connections) plus a margin.
#[both_backends]
#[tokio::test]
async fn p01_frozen_connections(backend: Backend) {
    let env = Env::start_with(backend, masters(&["kd"])).await;
    let cfg = config(&env, &controller_token(&env), Kind::Slices, "");
    let services = 40;
    let mut churn = Churn::new("frozen", services, Kind::Slices, 31, 31);
    churn.seed(&env).await;
    let ctl = Controller::start(&env, "frozen", &cfg, &[]).await;
    ctl.wait_ready().await;
    wait_converged(&env, &cfg, Duration::from_secs(30)).await;

    let partition = Duration::from_secs(6);
    fault(
        &env,
        json!({"freezeConnectionsSeconds": partition.as_secs_f64()}),
    )
    .await;
    tokio::time::sleep(partition).await;
    let healed = tokio::time::Instant::now();
    // Every service changes (a new address each) right after the heal.
    for i in 0..services {
        let svc = Churn::service(i);
        let ip = format!("10.31.{i}.250");
        env.slice(
            "frozen",
            &svc,
            &format!("{svc}-a"),
            &[(ip.as_str(), true)],
            &[("http", 80)],
        )
        .await;
    }
    let bound = 2 * REQUEST_TIMEOUT + Duration::from_secs(5);
    wait_converged(&env, &cfg, Duration::from_secs(60)).await;
    let took = healed.elapsed();
    eprintln!("{services} changed services converged {took:?} after the partition healed");
    assert!(
        took <= bound,
        "converged only {took:?} after the partition healed (bound {bound:?}); log:\n{}",
        ctl.logs()
    );
    // The requests in flight are reported, and none hangs on: soon the open
    // watches (EndpointSlices, DiscoveredServices) are all that stays (a
    // write or a watch renewal may still be under way at the moment of
    // convergence).
    let (_, metrics) = ctl.get("/metrics").await;
    assert!(
        metrics.contains("kube_discovery_api_requests_in_flight{client=\"home\""),
        "no in-flight gauge:\n{metrics}"
    );
    eventually(
        "only the open watches in flight",
        REQUEST_TIMEOUT,
        || async {
            let n = metric_sum(&ctl, "kube_discovery_api_requests_in_flight", &[]).await;
            (1.0..=4.0).contains(&n).then_some(())
        },
    )
    .await;
    ctl.stop().await;
}

/// Issue 16, item 7: a write answered `429` with `Retry-After: 3600`. kube's
/// own retry layer slept the hour, holding the write (and its service)
/// stale; the controller's client waits at most `MAX_RETRY_AFTER` (5 s)
/// before retrying.
#[both_backends]
#[tokio::test]
async fn p02_retry_after_capped(backend: Backend) {
    let env = Env::start(backend).await;
    let cfg = config(&env, &env.admin_token(), Kind::Slices, "");
    let mut churn = Churn::new("retry", 3, Kind::Slices, 32, 32);
    churn.seed(&env).await;
    let ctl = Controller::start(&env, "retry", &cfg, &[]).await;
    ctl.wait_ready().await;
    wait_converged(&env, &cfg, Duration::from_secs(30)).await;
    fault(
        &env,
        json!({"fail": {"verb": "patch", "resource": "discoveredservices", "count": 1,
                        "code": 429, "retryAfterSeconds": 3600}}),
    )
    .await;
    let changed = tokio::time::Instant::now();
    churn.run(&env, 3, Duration::ZERO).await;
    wait_converged(&env, &cfg, Duration::from_secs(30)).await;
    let took = changed.elapsed();
    eprintln!("converged {took:?} after a 429 with Retry-After: 3600");
    assert!(
        took <= Duration::from_secs(15),
        "converged only after {took:?}"
    );
    ctl.stop().await;
}

/// Binds `cluster-admin` to the plain user `kd` (revocable, unlike
/// `system:masters`).
async fn grant(env: &Env) {
    let crb: ClusterRoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "kd-admin"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "kd"}]
    }))
    .expect("binding");
    Api::<ClusterRoleBinding>::all(env.admin.clone())
        .create(&PostParams::default(), &crb)
        .await
        .expect("grant");
}

/// Issue 16, item 5: the controller's RBAC is revoked at runtime. Its watch
/// is renewed within `request_timeout` and then forbidden; once that has
/// lasted `unready_after`, `/readyz` is 503 naming the cluster (before, it
/// stayed 200: the data was stale but looked ready). Restored, it is 200
/// again.
#[both_backends]
#[tokio::test]
async fn p03_revoked_rbac_unready(backend: Backend) {
    let env = Env::start_with(
        backend,
        Options {
            users: vec![("kd".to_string(), Vec::new())],
            ..Options::default()
        },
    )
    .await;
    grant(&env).await;
    let cfg = config(
        &env,
        &user_token(&env, "kd"),
        Kind::Slices,
        "  request_timeout: 5s\n  unready_after: 3s\n",
    );
    let mut churn = Churn::new("rbac", 2, Kind::Slices, 33, 33);
    churn.seed(&env).await;
    let ctl = Controller::start(&env, "rbac", &cfg, &[]).await;
    ctl.wait_ready().await;
    wait_converged(&env, &cfg, Duration::from_secs(30)).await;
    Api::<ClusterRoleBinding>::all(env.admin.clone())
        .delete("kd-admin", &DeleteParams::default())
        .await
        .expect("revoke");
    let (_, body) = eventually(
        "/readyz 503 after the revocation",
        Duration::from_secs(30),
        || async {
            let (code, body) = ctl.get("/readyz").await;
            (code == 503).then_some((code, body))
        },
    )
    .await;
    assert!(
        body.contains(r#"cluster \"\": watch failing for"#) && body.contains("orbidden"),
        "/readyz does not name the cluster and the cause: {body}"
    );
    assert_eq!(
        metric_sum(&ctl, "kube_discovery_ready", &[]).await,
        0.0,
        "kube_discovery_ready follows /readyz"
    );
    grant(&env).await;
    eventually(
        "/readyz 200 after the grant",
        Duration::from_secs(30),
        || async { (ctl.get("/readyz").await.0 == 200).then_some(()) },
    )
    .await;
    // And it works: a change is written.
    churn.run(&env, 2, Duration::ZERO).await;
    wait_converged(&env, &cfg, Duration::from_secs(30)).await;
    ctl.stop().await;
}

/// Issue 16, item 7: SIGTERM while a write hangs (the API server holds it
/// for 10 minutes). The process exits within
/// `shutdown_timeout` instead of waiting for the write (before: it waited
/// for the in-flight write, i.e. forever).
#[both_backends]
#[tokio::test]
async fn p04_shutdown_deadline(backend: Backend) {
    let env = Env::start_with(backend, masters(&["kd"])).await;
    let deadline = Duration::from_secs(3);
    // A long request timeout: the hung write outlives the deadline.
    let cfg = config(
        &env,
        &controller_token(&env),
        Kind::Slices,
        "  request_timeout: 60s\n  shutdown_timeout: 3s\n",
    );
    let mut churn = Churn::new("term-hung", 2, Kind::Slices, 34, 34);
    churn.seed(&env).await;
    let mut ctl = Controller::start(&env, "term-hung", &cfg, &[]).await;
    ctl.wait_ready().await;
    wait_converged(&env, &cfg, Duration::from_secs(30)).await;
    // The writer's own client (DiscoveredService writes).
    let writer = r#"client="writer""#;
    let idle = metric_sum(&ctl, "kube_discovery_api_requests_in_flight", &[writer]).await;
    fault(
        &env,
        json!({"latency": {"verb": "patch", "resource": "discoveredservices",
                           "millis": 600_000, "count": 1}}),
    )
    .await;
    churn.run(&env, 2, Duration::ZERO).await;
    // The write of the change is in flight (and hangs).
    eventually("a write in flight", Duration::from_secs(30), || async {
        (metric_sum(&ctl, "kube_discovery_api_requests_in_flight", &[writer]).await > idle)
            .then_some(())
    })
    .await;
    signal(&ctl, "TERM");
    let termed = tokio::time::Instant::now();
    let status = tokio::time::timeout(Duration::from_secs(30), ctl.child.wait())
        .await
        .unwrap_or_else(|_| panic!("no exit 30 s after SIGTERM; log:\n{}", ctl.logs()))
        .expect("wait");
    let took = termed.elapsed();
    eprintln!("exited {took:?} after SIGTERM with a hung write ({status})");
    assert!(
        took <= deadline + Duration::from_secs(2),
        "exited only {took:?} after SIGTERM (deadline {deadline:?})"
    );
    assert!(
        ctl.logs().contains("shutdown deadline passed"),
        "the deadline was not what ended it:\n{}",
        ctl.logs()
    );
}

/// Issue 16, item 10: the `continue` token of every paged list expires
/// (`410 Expired`, as after an etcd compaction between two pages) while
/// 250 EndpointSlices are listed in pages of 100. kube-runtime's watcher
/// started the list over from page 1 and never finished (never ready); the
/// controller lists once in one request instead, as client-go's pager does.
#[both_backends]
#[tokio::test]
async fn p05_expired_continue_token(backend: Backend) {
    let env = Env::start(backend).await;
    let cfg = config(&env, &env.admin_token(), Kind::Slices, "");
    let mut churn = Churn::new("pages", 250, Kind::Slices, 35, 35);
    churn.seed(&env).await;
    fault(&env, json!({"expireContinueTokens": 1000})).await;
    let ctl = Controller::start(&env, "pages", &cfg, &[]).await;
    ctl.wait_ready().await;
    wait_converged(&env, &cfg, Duration::from_secs(60)).await;
    let fallback = "the continue token of a paged list expired; listing again in one request";
    assert!(
        ctl.logs().contains(fallback),
        "no fallback to a full list:\n{}",
        ctl.logs()
    );
    ctl.stop().await;
    // A restart: now the start-up list of the 250 DiscoveredServices (and
    // the drift watch's list of them) is paged too, and expires as well.
    fault(&env, json!({"expireContinueTokens": 1000})).await;
    let ctl = Controller::start(&env, "pages2", &cfg, &[]).await;
    ctl.wait_ready().await;
    churn.run(&env, 5, Duration::ZERO).await;
    wait_converged(&env, &cfg, Duration::from_secs(60)).await;
    let logs = ctl.logs();
    let fallbacks = logs.matches(fallback).count();
    assert!(
        fallbacks >= 3,
        "{fallbacks} fallbacks, want the sources', the start-up list's and the drift watch's:\n{logs}"
    );
    ctl.stop().await;
}

/// Issue 16, item 10 on the real API server: etcd is compacted
/// (`ControlPlane::compact_etcd`) after the first page of the controller's
/// first list and before the second, so the real server answers the second
/// page `410 Expired`; the controller lists again in one request.
/// Real only: the expiry is etcd's (kube-sim's is `p05`). The fault proxy
/// holds the second page until the compaction is done.
#[tokio::test]
async fn p06_compaction_between_pages_real() {
    // Kubernetes 1.34 serves later pages from its watch cache's snapshots
    // (ListFromCacheSnapshot, beta, on by default), which an etcd compaction
    // does not expire; without it they are read from etcd at the first
    // page's revision, as before 1.34.
    let env = Env::start_with(
        Backend::Real,
        Options {
            apiserver_args: vec!["--feature-gates=ListFromCacheSnapshot=false".to_string()],
            ..Options::default()
        },
    )
    .await;
    // A long request timeout: the held page must not time out meanwhile.
    let cfg = config(
        &env,
        &env.admin_token(),
        Kind::Slices,
        "  request_timeout: 120s\n",
    );
    let mut churn = Churn::new("compact", 150, Kind::Slices, 36, 36);
    churn.seed(&env).await;
    // Page 1 passes; page 2 is held 20 s.
    for millis in [1, 20_000] {
        fault(
            &env,
            json!({"latency": {"verb": "list", "resource": "endpointslices", "millis": millis, "count": 1}}),
        )
        .await;
    }
    let ctl = Controller::start(&env, "compact", &cfg, &[]).await;
    eventually("the second page held", Duration::from_secs(30), || async {
        (arrivals(&env, "list", "endpointslices").await >= 2).then_some(())
    })
    .await;
    // A write after page 1's revision, then compact at the current revision.
    churn.run(&env, 1, Duration::ZERO).await;
    env.api
        .real()
        .expect("the real backend")
        .compact_etcd()
        .await
        .expect("compact etcd");
    ctl.wait_ready().await;
    wait_converged(&env, &cfg, Duration::from_secs(60)).await;
    let logs = ctl.logs();
    assert!(
        logs.contains("the continue token of a paged list expired; listing again in one request"),
        "no expired continue token after the compaction:\n{logs}"
    );
    ctl.stop().await;
}

/// The arrival times of the requests a `recordArrivals` fault matches, at
/// kube-sim or at the fault proxy in front of the real API server (where
/// injected 429s are answered: the API server never sees those).
fn arrival_times(env: &Env) -> Vec<std::time::Instant> {
    match env.api.real() {
        Some(real) => real.proxy().arrivals(),
        None => env.api.sim().expect("kube-sim").arrivals(),
    }
}

/// Issue 19, item 4: the server answers every second DiscoveredService write
/// with 429 and `Retry-After: 1` (ten times, then it recovers) while 60
/// services are first written with `write_qps: 20` (the ceiling) and
/// `write_qps_start: 20`. What reaches the server (kube-sim, or the fault
/// proxy in front of the real API server, where the 429s are injected) is
/// measured in sliding 1 s windows:
/// * never more than the ceiling: 20, + 1 at a window's edge, + 1 for
///   arrival jitter (requests spaced 50 ms apart by the limiter can arrive
///   bunched on a loaded machine; the limiter's own catch-up is at most
///   20 ms = 0.4 of a write); the writer's client does not retry 429s itself,
///   so every request reaching the server was admitted by the limiter: the
///   server sees exactly one request per write attempt (60 + 10);
/// * a 429 pauses the writer for its `Retry-After`: after each, at most one
///   request (one already under way) arrives within 0.9 s;
/// * everything is written in the end, and the 429s are counted.
#[both_backends]
#[tokio::test]
async fn p07_throttled_server_never_sees_more_than_the_ceiling(backend: Backend) {
    let env = Env::start(backend).await;
    let cfg = config(
        &env,
        &env.admin_token(),
        Kind::Slices,
        "  write_qps: 20\n  write_qps_start: 20\n",
    );
    let services = 60;
    let mut churn = Churn::new("throttled", services, Kind::Slices, 37, 37);
    churn.seed(&env).await;
    fault(
        &env,
        json!({"recordArrivals": {"verb": "patch", "resource": "discoveredservices"},
               "fail": {"verb": "patch", "resource": "discoveredservices", "count": 10,
                        "fraction": 0.5, "code": 429, "retryAfterSeconds": 1}}),
    )
    .await;
    let ctl = Controller::start(&env, "throttled", &cfg, &[]).await;
    ctl.wait_ready().await;
    wait_converged(&env, &cfg, Duration::from_secs(90)).await;
    let times = arrival_times(&env);
    let took = times
        .last()
        .copied()
        .zip(times.first().copied())
        .map(|(l, f)| l - f);
    let since_first: Vec<Duration> = times.iter().map(|t| *t - times[0]).collect();
    let most = kube_discovery_core::write_plan::limiter::busiest_second(&since_first);
    eprintln!(
        "{} writes reached the server over {took:?}, at most {most} in one second",
        times.len()
    );
    assert!(most <= 22, "{most} writes in one second (ceiling 20)");
    assert_eq!(
        times.len(),
        services + 10,
        "one request per write attempt (no client-side 429 retries); log:\n{}",
        ctl.logs()
    );
    // The 429s were the 2nd, 4th, ..., 20th arrival.
    for i in (1..20).step_by(2) {
        let t = times[i];
        let soon = times[i + 1..]
            .iter()
            .filter(|a| **a - t < Duration::from_millis(900))
            .count();
        assert!(
            soon <= 1,
            "{soon} writes within 0.9 s after the 429 #{i} (Retry-After: 1)"
        );
    }
    let throttled = metric_sum(&ctl, "kube_discovery_writes_throttled_total", &[]).await;
    assert_eq!(throttled, 10.0);
    let rate = metric_sum(&ctl, "kube_discovery_write_rate_limit", &[]).await;
    assert!((1.0..=20.0).contains(&rate), "rate {rate}");
    ctl.stop().await;
}

/// Issue 19, item 4 on the real API server: API Priority and Fairness itself
/// rejects the controller's writes. The controller's user `kd` is put in a
/// flow schema of its own whose priority level has one nominal share (about
/// 3 of the server's 600 seats) and rejects instead of queueing, so the 8
/// writes in flight of a full-speed first sync of 120 services meet real APF
/// 429s (with the server's own `Retry-After` and `X-Kubernetes-PF-*`
/// headers). Every one is seen and counted as `apf`, the limiter slows down,
/// and everything is still written. Real only: kube-sim has no APF (its 429s
/// are `p07`'s).
#[tokio::test]
async fn p08_apf_rejections_real() {
    use k8s_openapi::api::flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration};
    let env = Env::start_with(
        Backend::Real,
        Options {
            users: vec![("kd".to_string(), Vec::new())],
            ..Options::default()
        },
    )
    .await;
    grant(&env).await;
    let plc: PriorityLevelConfiguration = serde_json::from_value(json!({
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "PriorityLevelConfiguration",
        "metadata": {"name": "kd-tight"},
        "spec": {"type": "Limited", "limited": {
            "nominalConcurrencyShares": 1, "lendablePercent": 0, "borrowingLimitPercent": 0,
            "limitResponse": {"type": "Reject"}}}
    }))
    .expect("priority level");
    Api::<PriorityLevelConfiguration>::all(env.admin.clone())
        .create(&PostParams::default(), &plc)
        .await
        .expect("create the priority level");
    let fs: FlowSchema = serde_json::from_value(json!({
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
        "metadata": {"name": "kd-tight"},
        "spec": {"priorityLevelConfiguration": {"name": "kd-tight"}, "matchingPrecedence": 500,
                 "distinguisherMethod": {"type": "ByUser"},
                 "rules": [{"subjects": [{"kind": "User", "user": {"name": "kd"}}],
                            "resourceRules": [{"verbs": ["patch"], "apiGroups": ["kubediscovery.io"],
                                               "resources": ["discoveredservices"], "namespaces": ["*"]}]}]}
    }))
    .expect("flow schema");
    Api::<FlowSchema>::all(env.admin.clone())
        .create(&PostParams::default(), &fs)
        .await
        .expect("create the flow schema");
    // The API server's APF configuration controller marks the flow schema
    // `Dangling: False` once it has loaded it with its priority level.
    let schemas = Api::<FlowSchema>::all(env.admin.clone());
    eventually(
        "the flow schema is in effect",
        Duration::from_secs(30),
        || {
            let schemas = schemas.clone();
            async move {
                let fs = schemas.get("kd-tight").await.ok()?;
                let loaded = fs.status?.conditions?.iter().any(|c| {
                    c.type_.as_deref() == Some("Dangling") && c.status.as_deref() == Some("False")
                });
                loaded.then_some(())
            }
        },
    )
    .await;
    // Start at full speed with 8 writes in flight: more than the level's
    // ~3 seats whatever this machine's speed (the default 50 writes/s start
    // can stay under 3 concurrent writes on a fast machine). 8 in flight
    // keeps a round of rejections at 5 or fewer.
    let cfg = config(
        &env,
        &user_token(&env, "kd"),
        Kind::Slices,
        "  write_concurrency: 8\n  write_qps_start: 2000\n",
    );
    let mut churn = Churn::new("apf", 120, Kind::Slices, 38, 38);
    churn.seed(&env).await;
    let started = std::time::Instant::now();
    let ctl = Controller::start(&env, "apf", &cfg, &[]).await;
    ctl.wait_ready().await;
    wait_converged(&env, &cfg, Duration::from_secs(120)).await;
    let sync_secs = started.elapsed().as_secs_f64();
    let apf = metric_sum(
        &ctl,
        "kube_discovery_writes_throttled_total",
        &[r#"by="apf""#],
    )
    .await;
    let other = metric_sum(
        &ctl,
        "kube_discovery_writes_throttled_total",
        &[r#"by="other""#],
    )
    .await;
    let rate = metric_sum(&ctl, "kube_discovery_write_rate_limit", &[]).await;
    eprintln!("APF rejected {apf} writes ({other} other 429s); limiter at {rate} writes/s");
    assert!(apf > 0.0, "no APF rejection seen; log:\n{}", ctl.logs());
    // No storm: a rejection pauses every start for its Retry-After (APF
    // sends at least 1 s), so each second of the sync holds at most one round
    // of rejections, and a round is at most the 8 writes in flight. How many
    // rounds there are depends on how fast this machine serves the writes
    // (the limiter grows back after each pause); a client retrying at once
    // would be rejected hundreds of times a second.
    let bound = 8.0 * (sync_secs.ceil() + 1.0);
    eprintln!("first sync {sync_secs:.1} s: at most {bound} rejections allowed");
    assert!(apf <= bound, "{apf} APF rejections; log:\n{}", ctl.logs());
    assert_eq!(other, 0.0, "every 429 came from APF");
    assert!(
        ctl.logs()
            .contains("API server throttles writes (429): slowing down"),
        "{}",
        ctl.logs()
    );
    ctl.stop().await;
}
