//! Controller end to end on both API servers: the HTTP API (dump, nodes,
//! auth) and readiness gating.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::controller_support;

use controller_support::{Backend, Controller, Env, LIMIT, eventually, http_get};
use serde_json::{Value, json};
use testenv::both_backends;

#[both_backends]
#[tokio::test]
async fn dump_and_nodes_api_with_bearer_auth(backend: Backend) {
    let env = Env::start(backend).await;
    env.namespace("default").await;
    env.endpoints(
        "default",
        "plat-dev",
        &["10.5.10.110", "10.5.10.109"],
        &[("port", 3306)],
        json!({}),
    )
    .await;
    let token_file = env.path("http-token");
    std::fs::write(&token_file, "api-s3cret\n").unwrap();
    let admin = env.admin_token();
    let cfg = format!(
        "discovery:\n  kubernetes:\n{}kube_discovery:\n  coalesce_window: 20ms\n  http:\n    auth_token_file: {}\n",
        env.service_block(&admin),
        token_file.display()
    );
    let ctl = Controller::start(&env, "api", &cfg, &[]).await;
    ctl.wait_ready().await;
    env.wait_nodes(
        "default",
        "plat-dev",
        "port",
        &["10.5.10.109", "10.5.10.110"],
    )
    .await;

    let q = "/v1/discovery/kubernetes/nodes?service=default/plat-dev:port";
    assert_eq!(http_get(ctl.http, q, None).await.0, 401);
    assert_eq!(http_get(ctl.http, q, Some("wrong")).await.0, 401);
    let (code, body) = http_get(ctl.http, q, Some("api-s3cret")).await;
    assert_eq!(code, 200, "{body}");
    // The reference page's example, byte for byte in APISIX's node shape.
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        json!([{"host": "10.5.10.109", "port": 3306, "weight": 50}, {"host": "10.5.10.110", "port": 3306, "weight": 50}])
    );
    let (code, body) = http_get(
        ctl.http,
        "/v1/discovery/kubernetes/nodes?service=default/nope:port",
        Some("api-s3cret"),
    )
    .await;
    assert_eq!(code, 404, "{body}");
    let (code, body) = http_get(
        ctl.http,
        "/v1/discovery/kubernetes/nodes?service=default-plat-dev",
        Some("api-s3cret"),
    )
    .await;
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("port"), "the 400 says what is wrong: {body}");

    let (code, body) = http_get(
        ctl.http,
        "/v1/discovery/kubernetes/dump",
        Some("api-s3cret"),
    )
    .await;
    assert_eq!(code, 200);
    let dump: Value = serde_json::from_str(&body).unwrap();
    let eps = &dump["endpoints"][0];
    assert_eq!(eps["id"], "");
    let entry = eps["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "default/plat-dev")
        .expect("dump entry");
    let value: Value =
        serde_json::from_str(entry["value"].as_str().expect("value is a JSON string")).unwrap();
    assert_eq!(value["port"][0]["host"], "10.5.10.109");
    assert!(dump["config"].is_array(), "{dump}");
    assert!(
        !body.contains(&admin),
        "the dump must not contain the API token"
    );
    assert!(!body.contains("api-s3cret"));
    // Probes and metrics need no token.
    assert_eq!(ctl.get("/healthz").await.0, 200);
    assert_eq!(ctl.get("/metrics").await.0, 200);
    ctl.stop().await;
}

#[both_backends]
#[tokio::test]
async fn readyz_is_503_until_the_first_list_is_written_then_reports_failing_writes(
    backend: Backend,
) {
    let env = Env::start(backend).await;
    env.namespace("ns").await;
    env.endpoints("ns", "web", &["10.6.0.1"], &[("http", 80)], json!({}))
        .await;
    // 1. The first write is slow (4 s): listed, the write in flight, not ready yet.
    let slow = json!({"latency": {"verb": "patch", "resource": "discoveredservices", "millis": 4000, "count": 1}});
    env.api.fault(&slow).await.expect("fault");
    let cfg = format!(
        "discovery:\n  kubernetes:\n{}kube_discovery:\n  coalesce_window: 20ms\n",
        env.service_block(&env.admin_token())
    );
    let ctl = Controller::start(&env, "ready", &cfg, &[]).await;
    let body = eventually(
        "readyz reports the listed-but-unwritten state",
        LIMIT,
        || async {
            let (code, body) = ctl.get("/readyz").await;
            assert_eq!(code, 503, "ready before the first write was done: {body}");
            body.contains("writing first list").then_some(body)
        },
    )
    .await;
    assert!(body.contains("\"ready\":false"), "{body}");
    ctl.wait_ready().await;
    env.wait_nodes("ns", "web", "http", &["10.6.0.1"]).await;

    // 2. After a restart, every write fails: attempted, reported, and ready
    //    all the same (one refused object must not keep the controller
    //    unready forever); what the server held is untouched.
    ctl.stop().await;
    env.endpoints("ns", "web", &["10.6.0.2"], &[("http", 80)], json!({}))
        .await;
    let fail = json!({"fail": {"verb": "patch", "resource": "discoveredservices", "count": 100000, "code": 500}});
    env.api.fault(&fail).await.expect("fault");
    let ctl = Controller::start(&env, "ready2", &cfg, &[]).await;
    ctl.wait_ready().await;
    eventually("the failing write is reported", LIMIT, || async {
        let (_, m) = ctl.get("/metrics").await;
        (m.contains("result=\"error_api_error\"")
            && m.contains("kube_discovery_objects_failing{cluster=\"\",reason=\"api_error\"} 1"))
        .then_some(())
    })
    .await;
    // ... and explained where `kubectl describe service web` shows it: one
    // WriteFailed Event on the Service, not one per retry.
    let evs = eventually("a WriteFailed Event on the Service", LIMIT, || async {
        let evs = env.events("ns", "WriteFailed", "Service", "web").await;
        (!evs.is_empty()).then_some(evs)
    })
    .await;
    let note = evs[0].note.clone().unwrap_or_default();
    assert!(
        note.contains("ns/web") && note.contains("api_error"),
        "{note}"
    );
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert_eq!(
        env.events("ns", "WriteFailed", "Service", "web")
            .await
            .len(),
        1,
        "retries add no Event objects"
    );
    env.wait_nodes("ns", "web", "http", &["10.6.0.1"]).await;
    env.api
        .fault(&json!({"clear": true}))
        .await
        .expect("clear faults");
    env.wait_nodes("ns", "web", "http", &["10.6.0.2"]).await;
    eventually("no longer failing once written", LIMIT, || async {
        let (_, m) = ctl.get("/metrics").await;
        m.contains("kube_discovery_objects_failing{cluster=\"\",reason=\"api_error\"} 0")
            .then_some(())
    })
    .await;
    ctl.stop().await;
}

/// Issue 29 item 6: the API token file is re-read while running. Rotated as
/// the kubelet rotates a mounted Secret (a new file renamed over the old),
/// the new token works and the old one gets 401, without a restart.
#[both_backends]
#[tokio::test]
async fn the_api_token_file_is_re_read_when_it_changes(backend: Backend) {
    let env = Env::start(backend).await;
    env.namespace("default").await;
    env.endpoints("default", "web", &["10.7.0.1"], &[("http", 80)], json!({}))
        .await;
    let token_file = env.path("http-token");
    std::fs::write(&token_file, "old-token\n").unwrap();
    let cfg = format!(
        "discovery:\n  kubernetes:\n{}kube_discovery:\n  coalesce_window: 20ms\n  http:\n    auth_token_file: {}\n",
        env.service_block(&env.admin_token()),
        token_file.display()
    );
    let ctl = Controller::start(&env, "rotate", &cfg, &[]).await;
    ctl.wait_ready().await;
    let q = "/v1/discovery/kubernetes/nodes?service=default/web:http";
    assert_eq!(http_get(ctl.http, q, Some("old-token")).await.0, 200);
    assert_eq!(http_get(ctl.http, q, Some("new-token")).await.0, 401);

    let tmp = env.path("http-token.new");
    std::fs::write(&tmp, "new-token\n").unwrap();
    std::fs::rename(&tmp, &token_file).unwrap();
    let rotated = std::time::Instant::now();
    eventually(
        "the new token works and the old one is refused",
        std::time::Duration::from_secs(10),
        || async {
            let new = http_get(ctl.http, q, Some("new-token")).await.0;
            let old = http_get(ctl.http, q, Some("old-token")).await.0;
            (new == 200 && old == 401).then_some(())
        },
    )
    .await;
    assert!(
        rotated.elapsed() < std::time::Duration::from_secs(5),
        "seen after {:?}",
        rotated.elapsed()
    );
    // A file that disappears keeps the last token (never: no authentication).
    std::fs::remove_file(&token_file).unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert_eq!(http_get(ctl.http, q, Some("new-token")).await.0, 200);
    assert_eq!(http_get(ctl.http, q, None).await.0, 401);
    ctl.stop().await;
}

/// The soft `ulimit -n` of process `pid` (`/proc/<pid>/limits`).
fn open_files_limit(pid: u32) -> u64 {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse().ok())
        .unwrap_or(u64::MAX)
}

/// The resident memory of process `pid` in KiB (`VmRSS` of `/proc/<pid>/status`).
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS")
}

/// Issue 29 item 4: slow and greedy clients never starve the probes.
/// 2,000 connections send half a request header and wait, while eight
/// clients fetch `/dump` back to back: `/healthz` (a fresh connection every
/// 100 ms, as a kubelet probes) answers within 1 s throughout, every
/// half-sent connection is closed by the controller within 35 s, the dumps
/// are answered `200` (or `503` when the dump slots are taken), a change is
/// written meanwhile, and the controller's memory stays bounded. Loopback
/// only; about 20 s.
#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_and_greedy_clients_do_not_starve_the_probes(backend: Backend) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::time::{Duration, Instant};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const HALF_SENT: usize = 2000;
    const DUMPERS: usize = 8;
    const SERVICES: usize = 20;
    const CLOSED_WITHIN: Duration = Duration::from_secs(35);
    // The descriptors: this process holds every half-sent socket, and so may
    // the controller (it inherits this limit).
    let limit = open_files_limit(std::process::id());
    assert!(
        limit >= (HALF_SENT + 1000) as u64,
        "ulimit -n is {limit}: raise it to at least {} for this test",
        HALF_SENT + 1000
    );

    let env = Env::start(backend).await;
    env.namespace("default").await;
    let hosts: Vec<String> = (0..100)
        .map(|i| format!("10.8.{}.{}", i / 250, i % 250 + 1))
        .collect();
    let hosts: Vec<&str> = hosts.iter().map(String::as_str).collect();
    for i in 0..SERVICES {
        env.endpoints(
            "default",
            &format!("svc-{i}"),
            &hosts,
            &[("http", 80)],
            json!({}),
        )
        .await;
    }
    let token_file = env.path("http-token");
    std::fs::write(&token_file, "dump-token\n").unwrap();
    let cfg = format!(
        "discovery:\n  kubernetes:\n{}kube_discovery:\n  coalesce_window: 20ms\n  http:\n    auth_token_file: {}\n",
        env.service_block(&env.admin_token()),
        token_file.display()
    );
    let ctl = Controller::start(&env, "greedy", &cfg, &[]).await;
    ctl.wait_ready().await;
    let pid = ctl.child.id().expect("controller pid");
    assert!(open_files_limit(pid) >= (HALF_SENT + 1000) as u64);
    let addr = ctl.http;
    eventually("the dump lists every service", LIMIT, || async {
        let (code, body) =
            http_get(addr, "/v1/discovery/kubernetes/dump", Some("dump-token")).await;
        let dump: Value = serde_json::from_str(&body).ok()?;
        let n = dump["endpoints"][0]["endpoints"]
            .as_array()
            .map_or(0, Vec::len);
        (code == 200 && n == SERVICES).then_some(())
    })
    .await;
    let rss_before = rss_kib(pid);
    let stop = Arc::new(AtomicBool::new(false));

    // The prober: a fresh connection every 100 ms.
    let prober = tokio::spawn({
        let stop = stop.clone();
        async move {
            let mut slowest = Duration::ZERO;
            let mut failures = Vec::new();
            let mut probes = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                match tokio::time::timeout(Duration::from_secs(1), http_get(addr, "/healthz", None))
                    .await
                {
                    Ok((200, _)) => {}
                    Ok((code, body)) => failures.push(format!("{code} {body}")),
                    Err(_) => failures.push("no answer within 1 s".to_string()),
                }
                probes += 1;
                slowest = slowest.max(t.elapsed());
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (probes, slowest, failures)
        }
    });
    // The memory watcher.
    let rss_max = Arc::new(AtomicU64::new(rss_before));
    let watcher = tokio::spawn({
        let (stop, rss_max) = (stop.clone(), rss_max.clone());
        async move {
            while !stop.load(Ordering::Relaxed) {
                rss_max.fetch_max(rss_kib(pid), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });
    // The greedy clients: /dump back to back.
    let dumpers: Vec<_> = (0..DUMPERS)
        .map(|_| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let (mut ok, mut busy, mut other) = (0u32, 0u32, Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    match http_get(addr, "/v1/discovery/kubernetes/dump", Some("dump-token")).await
                    {
                        (200, _) => ok += 1,
                        (503, _) => busy += 1,
                        (code, body) => other.push(format!("{code} {body}")),
                    }
                }
                (ok, busy, other)
            })
        })
        .collect();
    // The slow clients: half a header, then wait for the server to close.
    let mut slow = Vec::with_capacity(HALF_SENT);
    for i in 0..HALF_SENT {
        slow.push(tokio::spawn(async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
            let sent = Instant::now();
            let half = format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nX-Slow-{i}: ");
            if s.write_all(half.as_bytes()).await.is_err() {
                return Some(sent.elapsed());
            }
            let mut buf = [0u8; 512];
            let closed = async {
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                }
            };
            tokio::time::timeout(CLOSED_WITHIN + Duration::from_secs(5), closed)
                .await
                .ok()
                .map(|()| sent.elapsed())
        }));
        if i % 100 == 99 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    // Meanwhile the controller keeps writing: a change reaches its object.
    let changed = Instant::now();
    env.endpoints(
        "default",
        "svc-0",
        &["10.9.0.1"],
        &[("http", 80)],
        json!({}),
    )
    .await;
    env.wait_nodes("default", "svc-0", "http", &["10.9.0.1"])
        .await;
    let written_after = changed.elapsed();
    let mut closed_after = Vec::new();
    let mut never_closed = 0;
    for t in slow {
        match t.await.unwrap() {
            Some(d) => closed_after.push(d),
            None => never_closed += 1,
        }
    }
    stop.store(true, Ordering::Relaxed);
    let (probes, slowest, failures) = prober.await.unwrap();
    watcher.await.unwrap();
    let (mut ok, mut busy, mut other) = (0, 0, Vec::new());
    for d in dumpers {
        let (o, b, x) = d.await.unwrap();
        ok += o;
        busy += b;
        other.extend(x);
    }
    let latest = closed_after.iter().max().copied().unwrap_or_default();
    let rss_growth_mib = rss_max.load(Ordering::Relaxed).saturating_sub(rss_before) / 1024;
    eprintln!(
        "half-sent: {} closed (the last after {latest:?}), {never_closed} still open; \
         probes: {probes}, slowest {slowest:?}; dumps: {ok} ok, {busy} busy; RSS +{rss_growth_mib} MiB; \
         a change written after {written_after:?}",
        closed_after.len()
    );
    assert_eq!(
        never_closed,
        0,
        "{never_closed} of {HALF_SENT} half-sent connections still open after {:?}",
        CLOSED_WITHIN + Duration::from_secs(5)
    );
    assert!(
        latest <= CLOSED_WITHIN,
        "a half-sent connection stayed open {latest:?}"
    );
    assert!(
        failures.is_empty(),
        "/healthz failed {} of {probes} times: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    assert!(
        slowest < Duration::from_secs(1),
        "slowest /healthz: {slowest:?}"
    );
    assert!(probes >= 20, "only {probes} probes");
    assert!(
        other.is_empty(),
        "dumps answered other than 200/503: {other:?}"
    );
    assert!(ok > 0, "no dump answered 200 ({busy} busy)");
    assert!(
        written_after < Duration::from_secs(5),
        "a change was written after {written_after:?}"
    );
    assert!(
        rss_growth_mib < 64,
        "the controller's RSS grew by {rss_growth_mib} MiB (from {} MiB)",
        rss_before / 1024
    );
    // Still serving normally afterwards.
    assert_eq!(ctl.get("/healthz").await.0, 200);
    ctl.stop().await;
}
