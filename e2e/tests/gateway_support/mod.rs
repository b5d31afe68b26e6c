//! Shared harness of the gateway end-to-end tests (`gateway_*.rs`): real
//! backends (axum servers answering with their identity and recording when
//! they were hit) on local non-loopback addresses the harness assigns to `lo`
//! ([`testenv::net`]: the real API server refuses 127.0.0.0/8 in
//! EndpointSlices), a bounded client loop through a gateway,
//! EndpointSlices with explicit conditions, and the scenario of issue 8
//! (scale 1 -> 3 -> 1, a replacement whose only endpoint drains before the
//! new one is ready, a rolling replacement, move to new addresses) run
//! against any gateway, returning what was measured.
//!
//! The gateways run the scenario with `--empty-policy 503`, so an empty node
//! list would show up as 503s: the drain step can then only pass because the
//! controller keeps the terminating-but-serving endpoint (`draining: true`).
//!
//! Uses `controller_support` (kube-sim or the real API server with the CRD,
//! the `kube-discovery` binary); each test file declares both modules.
#![allow(dead_code)]

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tokio::time::Instant;

use crate::controller_support::{Controller, Env, LIMIT, eventually, repo_root};

/// Namespace and Service of the scenario.
pub const NS: &str = "shop";
pub const SVC: &str = "web";
/// The APISIX name the gateways route.
pub const SERVICE: &str = "shop/web:http";

/// `kube-discovery sync <gateway>`: the one sync entry point.
pub fn sync_command(gateway: &str) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(crate::controller_support::bin());
    c.arg("sync").arg(gateway);
    c
}

/// The gateways (nginx, HAProxy, the Rust proxy) and their process
/// handling live in [`testenv::gateways`] (kd-bench starts them too).
pub use testenv::gateways::{
    Proc, free_port, nginx_conf, run_ok, start_haproxy, start_nginx, start_proxy, system_bin,
};

impl testenv::gateways::GatewayEnv for Env {
    fn path(&self, name: &str) -> PathBuf {
        Env::path(self, name)
    }

    fn admin_kubeconfig(&self) -> PathBuf {
        self.kubeconfig(&self.admin_token())
    }

    fn kube_discovery_bin(&self) -> PathBuf {
        crate::controller_support::bin()
    }

    fn example_bin(&self, name: &str) -> PathBuf {
        gw_example(name)
    }
}

/// An example of the client crate (`target/debug/examples/<name>`).
pub fn gw_example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let p = dir.join("examples").join(name);
    assert!(
        p.exists(),
        "{} not found: run `cargo build -p kube-discovery-client --examples` first",
        p.display()
    );
    p
}

/// A backend: answers every request with its name, records when it was hit.
pub struct Backend {
    pub name: String,
    pub addr: SocketAddr,
    hits: Arc<Mutex<Vec<Instant>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Backend {
    pub async fn start(name: &str, addr: SocketAddr) -> Backend {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .unwrap_or_else(|e| panic!("backend {name} bind {addr}: {e}"));
        let hits: Arc<Mutex<Vec<Instant>>> = Arc::default();
        let (h, body) = (hits.clone(), name.to_string());
        let app = axum::Router::new().fallback(move || {
            let (h, body) = (h.clone(), body.clone());
            async move {
                h.lock().expect("hits").push(Instant::now());
                body
            }
        });
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = rx.await;
                })
                .await;
        });
        Backend {
            name: name.to_string(),
            addr,
            hits,
            stop: Some(tx),
            task,
        }
    }

    /// Hits in `(from, to)`.
    pub fn hits_between(&self, from: Instant, to: Instant) -> usize {
        self.hits
            .lock()
            .expect("hits")
            .iter()
            .filter(|h| **h > from && **h < to)
            .count()
    }

    /// Hits after `t`.
    pub fn hits_after(&self, t: Instant) -> usize {
        self.hits
            .lock()
            .expect("hits")
            .iter()
            .filter(|h| **h > t)
            .count()
    }

    pub fn hits(&self) -> usize {
        self.hits.lock().expect("hits").len()
    }

    /// Stops listening (in-flight requests finish).
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), &mut self.task).await;
    }
}

/// One request of the client loop.
#[derive(Debug, Clone)]
pub struct Sample {
    pub start: Instant,
    pub done: Instant,
    /// `Ok((status, body))` or a connection error / timeout.
    pub outcome: Result<(u16, String), String>,
}

/// One `GET /` with `Connection: close` (bounded by 2 s).
pub use testenv::net::http_get as get;

/// A bounded client loop (at most `max` requests, at most `max_time`, one
/// request every `every`), only to a local address: loopback or one the
/// harness assigned to `lo`.
pub struct Load {
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Load {
    pub fn start(addr: SocketAddr, every: Duration, max: usize, max_time: Duration) -> Load {
        assert!(
            addr.ip().is_loopback() || testenv::net::is_assigned(addr.ip()),
            "the client loop only talks to 127.0.0.0/8 or addresses the harness assigned to lo, not {addr}"
        );
        let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (samples.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let begin = Instant::now();
            for _ in 0..max {
                if st.load(Ordering::Relaxed) || begin.elapsed() > max_time {
                    break;
                }
                let start = Instant::now();
                let outcome = get(addr).await;
                s.lock().expect("samples").push(Sample {
                    start,
                    done: Instant::now(),
                    outcome,
                });
                tokio::time::sleep(every).await;
            }
        });
        Load {
            samples,
            stop,
            task,
        }
    }

    pub fn samples(&self) -> Vec<Sample> {
        self.samples.lock().expect("samples").clone()
    }

    pub async fn stop(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        let samples = self.samples.clone();
        let _ = self.task.await;
        samples.lock().expect("samples").clone()
    }
}

/// Creates or replaces the EndpointSlice `shop/web-1` of Service `shop/web`:
/// `eps` are `(ip, ready, serving, terminating)`.
pub async fn slice(env: &Env, eps: &[(Ipv4Addr, bool, bool, bool)], port: u16) {
    let obj = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "web-1", "namespace": NS, "labels": {"kubernetes.io/service-name": SVC}},
        "addressType": "IPv4",
        "endpoints": eps.iter().map(|(ip, ready, serving, terminating)| json!({
            "addresses": [ip.to_string()],
            "conditions": {"ready": ready, "serving": serving, "terminating": terminating}})).collect::<Vec<_>>(),
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
    });
    let api: Api<EndpointSlice> = Api::namespaced(env.admin.clone(), NS);
    api.patch(
        "web-1",
        &PatchParams::apply("e2e").force(),
        &Patch::Apply(&obj),
    )
    .await
    .expect("apply EndpointSlice");
}

pub fn ready(ip: Ipv4Addr) -> (Ipv4Addr, bool, bool, bool) {
    (ip, true, true, false)
}

pub fn terminating(ip: Ipv4Addr) -> (Ipv4Addr, bool, bool, bool) {
    (ip, false, true, true)
}

/// The backend address `host` of test network `net` on `env`'s API server
/// backend (assigned to `lo`; see [`testenv::net::backend_ip`]).
pub fn ip(env: &Env, net: u8, host: u8) -> Ipv4Addr {
    testenv::net::backend_ip(env.api.backend(), net, host)
        .unwrap_or_else(|e| panic!("a local address for a test backend: {e:#}"))
}

/// [`ip`] as a string (a node host).
pub fn host(env: &Env, net: u8, host: u8) -> String {
    ip(env, net, host).to_string()
}

/// The API server of `backend` + the controller (EndpointSlices, draining on)
/// with `shop/web` served by one backend; returns the env, the controller,
/// the backends and the port.
pub async fn start_world(
    backend: testenv::Backend,
    net: u8,
) -> (Env, Controller, Vec<Backend>, u16) {
    start_world_with(backend, net, "").await
}

/// [`start_world`] with more `kube_discovery` settings (`extra`: lines
/// indented by two spaces, e.g. the xDS server's).
pub async fn start_world_with(
    backend: testenv::Backend,
    net: u8,
    extra: &str,
) -> (Env, Controller, Vec<Backend>, u16) {
    let env = Env::start(backend).await;
    env.namespace(NS).await;
    let b1_ip = ip(&env, net, 1);
    let port = free_port(b1_ip.into());
    let b1 = Backend::start("b1", (b1_ip, port).into()).await;
    slice(&env, &[ready(b1_ip)], port).await;
    let cfg = format!(
        "discovery:\n  kubernetes:\n{}    watch_endpoint_slices: true\nkube_discovery:\n  coalesce_window: 20ms\n  drain_terminating: true\n{extra}",
        env.service_block(&env.admin_token())
    );
    let ctl = Controller::start(&env, "ctl", &cfg, &[]).await;
    ctl.wait_ready().await;
    env.wait_nodes(NS, SVC, "http", &[&b1_ip.to_string()]).await;
    (env, ctl, vec![b1], port)
}

/// Waits until a GET through the gateway answers 200 with `body`.
pub async fn wait_served(gw: SocketAddr, body: &str) {
    eventually(&format!("gateway {gw} answers {body}"), LIMIT, || async {
        matches!(get(gw).await, Ok((200, b)) if b == body).then_some(())
    })
    .await;
}

/// What the scenario measured.
#[derive(Debug, Default)]
pub struct Report {
    /// Change -> first response from each new backend (done time), per new backend.
    pub follow: Vec<Duration>,
    /// Requests / non-2xx / connection errors over the whole run.
    pub requests: usize,
    pub non_2xx: usize,
    pub conn_errors: usize,
    /// The same during the rolling replacement.
    pub rolling_requests: usize,
    pub rolling_5xx: usize,
    pub rolling_conn_errors: usize,
    /// Requests reaching a removed backend later than 1 s after its removal.
    pub late_hits_removed: usize,
    /// Drain step (the only endpoint terminating-but-serving, its replacement
    /// not ready yet): requests sent while the controller listed the old
    /// endpoint as `draining`, and how many of them the old backend answered.
    pub drain_requests: usize,
    pub drain_old_hits: usize,
    /// Steps that changed the node list the gateways route to (host, port or
    /// weight): a gateway that reloads on content change reloads this often.
    pub content_changes: usize,
    /// Share of each of the 3 equal-weight backends at 3 replicas.
    pub spread: Vec<(String, f64)>,
}

impl Report {
    /// p99 of the follow latencies (nearest rank).
    pub fn p99(&self) -> Duration {
        let mut v = self.follow.clone();
        v.sort();
        let idx = ((v.len() as f64 * 0.99).ceil() as usize).saturating_sub(1);
        v.get(idx).copied().unwrap_or_default()
    }

    pub fn max(&self) -> Duration {
        self.follow.iter().max().copied().unwrap_or_default()
    }

    /// One line for BENCHMARKS.md.
    pub fn line(&self, gateway: &str) -> String {
        let mut f = self.follow.clone();
        f.sort();
        let ms: Vec<String> = f.iter().map(|d| format!("{}", d.as_millis())).collect();
        format!(
            "BENCH gateway={gateway} follow_ms=[{}] p99_ms={} requests={} non_2xx={} conn_errors={} rolling+drain: requests={} 5xx={} conn_errors={} drain: requests={} old_backend_hits={} late_hits_removed={} spread={:?}",
            ms.join(","),
            self.p99().as_millis(),
            self.requests,
            self.non_2xx,
            self.conn_errors,
            self.rolling_requests,
            self.rolling_5xx,
            self.rolling_conn_errors,
            self.drain_requests,
            self.drain_old_hits,
            self.late_hits_removed,
            self.spread
                .iter()
                .map(|(n, s)| format!("{n}:{s:.2}"))
                .collect::<Vec<_>>()
        )
    }

    /// The issue's asserts.
    pub fn assert_issue_targets(&self, gateway: &str) {
        eprintln!("{}", self.line(gateway));
        assert!(
            self.follow.len() >= 6,
            "{gateway}: follow samples {:?}",
            self.follow
        );
        assert!(
            self.p99() <= Duration::from_secs(1),
            "{gateway}: traffic reached new backends after {:?} (p99 > 1s): {:?}",
            self.p99(),
            self.follow
        );
        assert!(
            self.rolling_requests >= 50,
            "{gateway}: only {} requests during the rolling replacement",
            self.rolling_requests
        );
        assert_eq!(
            (self.rolling_5xx, self.rolling_conn_errors),
            (0, 0),
            "{gateway}: 5xx / connection errors during the drain step or the rolling replacement"
        );
        assert!(
            self.drain_requests >= 50,
            "{gateway}: only {} requests while the only endpoint was draining",
            self.drain_requests
        );
        // Every request in that window was answered (zero 5xx above) and the
        // old backend was the only node: it must have served them.
        assert!(
            self.drain_old_hits * 10 >= self.drain_requests * 9,
            "{gateway}: the draining backend served {} of {} requests while it was the only node",
            self.drain_old_hits,
            self.drain_requests
        );
        assert_eq!(
            self.late_hits_removed, 0,
            "{gateway}: removed backends still got requests 1 s after removal"
        );
        for (n, s) in &self.spread {
            assert!(
                (0.2..=0.47).contains(s),
                "{gateway}: backend {n} got {s:.2} of the traffic at 3 equal-weight replicas: {:?}",
                self.spread
            );
        }
    }
}

/// First time after `since` a response came from `name`.
fn first_from(samples: &[Sample], since: Instant, name: &str) -> Option<Instant> {
    samples
        .iter()
        .find(|s| s.start >= since && matches!(&s.outcome, Ok((200, b)) if b == name))
        .map(|s| s.done)
}

async fn wait_reached(load: &Load, since: Instant, names: &[&str]) -> Vec<Duration> {
    let mut out = Vec::new();
    for n in names {
        let at = eventually(
            &format!("traffic reaches {n}"),
            Duration::from_secs(15),
            || async { first_from(&load.samples(), since, n) },
        )
        .await;
        out.push(at.saturating_duration_since(since));
    }
    out
}

/// The scenario of issue 8 through the gateway at `gw`. `backends` holds b1
/// (serving `shop/web` on [`ip`]`(env, net, 1)`:`port`) on entry.
pub async fn scenario(
    env: &Env,
    gw: SocketAddr,
    net: u8,
    mut backends: Vec<Backend>,
    port: u16,
) -> Report {
    let ip = |i: u8| ip(env, net, i);
    wait_served(gw, "b1").await;
    let load = Load::start(
        gw,
        Duration::from_millis(4),
        40_000,
        Duration::from_secs(90),
    );
    let mut r = Report::default();
    tokio::time::sleep(Duration::from_millis(200)).await;

    // 1 -> 3.
    for (i, n) in [(2u8, "b2"), (3, "b3")] {
        backends.push(Backend::start(n, (ip(i), port).into()).await);
    }
    let t = Instant::now();
    slice(env, &[ready(ip(1)), ready(ip(2)), ready(ip(3))], port).await;
    r.content_changes += 1;
    r.follow.extend(wait_reached(&load, t, &["b2", "b3"]).await);
    // Spread at 3 equal-weight replicas, over the next 1.2 s.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let from = Instant::now();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let window: Vec<Sample> = load
        .samples()
        .into_iter()
        .filter(|s| s.start >= from)
        .collect();
    let ok = window
        .iter()
        .filter(|s| matches!(s.outcome, Ok((200, _))))
        .count()
        .max(1) as f64;
    for n in ["b1", "b2", "b3"] {
        let c = window
            .iter()
            .filter(|s| matches!(&s.outcome, Ok((200, b)) if b == n))
            .count() as f64;
        r.spread.push((n.to_string(), c / ok));
    }

    // 3 -> 1: b2, b3 keep listening for 2 s and must get nothing after 1 s.
    let t = Instant::now();
    slice(env, &[ready(ip(1))], port).await;
    r.content_changes += 1;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let gone: Vec<Backend> = backends.drain(1..).collect();
    for b in gone {
        r.late_hits_removed += b.hits_after(t + Duration::from_secs(1));
        b.stop().await;
    }

    // Drain: the ONLY endpoint (b1) goes terminating-but-serving BEFORE its
    // replacement r1 is ready. With `drain_terminating: true` the controller
    // keeps it as a node (`draining: true`), so the gateways keep answering
    // from b1; then r1 is ready (b1 leaves the nodes), then b1 leaves the
    // slice, and only then stops listening.
    let rolling_from = Instant::now();
    slice(env, &[terminating(ip(1))], port).await;
    let b1_host = ip(1).to_string();
    eventually("the controller lists b1 as draining", LIMIT, || async {
        let ds = env.dsvc(NS, SVC).await?;
        let nodes = ds["spec"]["ports"]["http"].as_array()?.clone();
        (nodes.len() == 1 && nodes[0]["host"] == b1_host.as_str() && nodes[0]["draining"] == true)
            .then_some(())
    })
    .await;
    // Past the gateways' follow time (< 1 s asserted), while b1 is still draining.
    let drain_from = Instant::now() + Duration::from_millis(300);
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let drain_to = Instant::now();
    r.drain_requests = load
        .samples()
        .iter()
        .filter(|s| s.start > drain_from && s.done < drain_to)
        .count();
    r.drain_old_hits = backends[0].hits_between(drain_from, drain_to);
    backends.insert(1, Backend::start("r1", (ip(8), port).into()).await);
    let t = Instant::now();
    slice(env, &[terminating(ip(1)), ready(ip(8))], port).await;
    r.content_changes += 1;
    r.follow.extend(wait_reached(&load, t, &["r1"]).await);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    slice(env, &[ready(ip(8))], port).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b1 = backends.remove(0);
    r.late_hits_removed += b1.hits_after(t + Duration::from_secs(1));
    b1.stop().await;

    // Rolling replacement with draining: n1, n2 ready; r1 terminating (serving); r1 away.
    for (i, n) in [(4u8, "n1"), (5, "n2")] {
        backends.push(Backend::start(n, (ip(i), port).into()).await);
    }
    let t = Instant::now();
    slice(env, &[ready(ip(8)), ready(ip(4)), ready(ip(5))], port).await;
    r.content_changes += 1;
    r.follow.extend(wait_reached(&load, t, &["n1", "n2"]).await);
    let t = Instant::now();
    slice(env, &[terminating(ip(8)), ready(ip(4)), ready(ip(5))], port).await;
    r.content_changes += 1;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    slice(env, &[ready(ip(4)), ready(ip(5))], port).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r1 = backends.remove(0);
    r.late_hits_removed += r1.hits_after(t + Duration::from_secs(1));
    r1.stop().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rolling: Vec<Sample> = load
        .samples()
        .into_iter()
        .filter(|s| s.start >= rolling_from)
        .collect();
    r.rolling_requests = rolling.len();
    r.rolling_5xx = rolling
        .iter()
        .filter(|s| matches!(s.outcome, Ok((c, _)) if c >= 500))
        .count();
    r.rolling_conn_errors = rolling.iter().filter(|s| s.outcome.is_err()).count();

    // Move to new addresses on a new port.
    let port2 = free_port(ip(6).into());
    for (i, n) in [(6u8, "m1"), (7, "m2")] {
        backends.push(Backend::start(n, (ip(i), port2).into()).await);
    }
    let t = Instant::now();
    slice(env, &[ready(ip(6)), ready(ip(7))], port2).await;
    r.content_changes += 1;
    r.follow.extend(wait_reached(&load, t, &["m1", "m2"]).await);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let old: Vec<Backend> = backends.drain(..2).collect();
    for b in old {
        r.late_hits_removed += b.hits_after(t + Duration::from_secs(1));
        b.stop().await;
    }

    let all = load.stop().await;
    r.requests = all.len();
    r.non_2xx = all
        .iter()
        .filter(|s| matches!(s.outcome, Ok((c, _)) if !(200..300).contains(&c)))
        .count();
    r.conn_errors = all.iter().filter(|s| s.outcome.is_err()).count();
    for b in backends {
        b.stop().await;
    }
    r
}

/// Empties the hand-written DiscoveredService `shop/<name>`: the `--empty-policy 503`
/// gateway at `unavailable` answers 503, and the `keep` gateway (at `keep`, its
/// sync process `keep_sync`) logs that it keeps the last good set and keeps
/// answering 200 from it.
pub async fn assert_empty_policies(
    env: &Env,
    name: &str,
    unavailable: SocketAddr,
    keep: SocketAddr,
    keep_sync: &Proc,
) {
    put_dsvc(env, name, &[]).await;
    eventually(
        "the 503 gateway answers 503 for an empty service",
        Duration::from_secs(10),
        || async { matches!(get(unavailable).await, Ok((503, _))).then_some(()) },
    )
    .await;
    // The keep instance has seen the empty set (its decision is logged) ...
    eventually(
        "the keep instance processed the empty set",
        LIMIT,
        || async {
            keep_sync
                .logs()
                .contains("keeping the last good set")
                .then_some(())
        },
    )
    .await;
    // ... and still serves the last set.
    for _ in 0..20 {
        let r = get(keep).await;
        assert!(
            matches!(&r, Ok((200, _))),
            "keep policy must keep serving: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Creates or replaces the DiscoveredService `shop/<name>` (port key `http`) by hand,
/// with the label the syncs select by default.
pub async fn put_dsvc(env: &Env, name: &str, nodes: &[(&str, u16, u32)]) {
    put_dsvc_labeled(env, name, nodes, true).await
}

/// [`put_dsvc`], with or without the labels the controller sets
/// (`app.kubernetes.io/managed-by: kube-discovery`, which the syncs select by,
/// and the cluster and service labels, which readers check against the spec).
pub async fn put_dsvc_labeled(env: &Env, name: &str, nodes: &[(&str, u16, u32)], labeled: bool) {
    use kube::api::{Api, DynamicObject, Patch, PatchParams};
    let labels = if labeled {
        serde_json::json!({"app.kubernetes.io/managed-by": "kube-discovery",
            "kubediscovery.io/cluster": "",
            "kubediscovery.io/service-namespace": NS,
            "kubediscovery.io/service-name": name})
    } else {
        serde_json::json!({"team": "e2e"})
    };
    let obj = serde_json::json!({
        "apiVersion": "kubediscovery.io/v1alpha1", "kind": "DiscoveredService",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {"cluster": "", "service": format!("{NS}/{name}"), "sourceNamespace": NS, "sourceName": name,
            "source": "EndpointSlice", "version": "0000000000000000",
            "ports": {"http": nodes.iter().map(|(h, p, w)| serde_json::json!({"host": h, "port": p, "weight": w})).collect::<Vec<_>>()}},
    });
    let api: Api<DynamicObject> = Api::namespaced_with(
        env.admin.clone(),
        NS,
        &crate::controller_support::dsvc_resource(),
    );
    api.patch(
        name,
        &PatchParams::apply("e2e").force(),
        &Patch::Apply(&obj),
    )
    .await
    .expect("apply DiscoveredService");
}

/// Sets an annotation on the DiscoveredService `shop/<name>` (a change that
/// leaves the nodes as they are); returns the new resourceVersion.
pub async fn annotate_dsvc(env: &Env, name: &str, value: &str) -> String {
    use kube::api::{Api, DynamicObject, Patch, PatchParams};
    let api: Api<DynamicObject> = Api::namespaced_with(
        env.admin.clone(),
        NS,
        &crate::controller_support::dsvc_resource(),
    );
    let o = api
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"e2e.kubediscovery.io/touch": value}}}),
            ),
        )
        .await
        .expect("annotate DiscoveredService");
    o.metadata.resource_version.expect("resourceVersion")
}

/// Waits until the sync in `proc` has logged the watch event of
/// DiscoveredService `shop/<name>` at `rv` AND, after it, a finished apply
/// cycle (`done`: e.g. "upstreams unchanged"); returns the log.
pub async fn wait_processed(proc: &Proc, name: &str, rv: &str, done: &str) -> String {
    let event = format!("DiscoveredService event dsvc={NS}/{name} resource_version={rv}");
    eventually(
        &format!("{} processed {event} ({done})", proc.name),
        LIMIT,
        || async {
            let logs = proc.logs();
            let at = logs.find(&event)?;
            logs[at..].contains(done).then_some(logs)
        },
    )
    .await
}

/// The repository root (for scripts in messages).
pub fn root() -> PathBuf {
    repo_root()
}

/// The Pods' `terminationGracePeriodSeconds` in the rollout: longer than the
/// gateways' published follow time (p99 <= 1 s, [`Report::assert_issue_targets`]).
pub const ROLLOUT_GRACE_SECONDS: u64 = 5;

/// A kwok cluster on the real API server ([`testenv::kwok`]: Pods Ready 500 ms
/// after their address answers) with Deployment `shop/web` (3 replicas,
/// `maxSurge: 1`, `maxUnavailable: 0`, grace [`ROLLOUT_GRACE_SECONDS`]) behind
/// Service `shop/web`, and the controller (EndpointSlices, `drain_terminating:
/// true`) listing its 3 Pods.
pub async fn start_rollout_world() -> (Env, Controller) {
    start_rollout_world_with(&RolloutDeployment::default()).await
}

/// The Deployment `shop/web` of [`start_rollout_world_with`].
#[derive(Debug, Clone)]
pub struct RolloutDeployment {
    pub replicas: usize,
    /// `maxSurge` and `maxUnavailable`: a count or a percentage (`"25%"`).
    pub max_surge: serde_json::Value,
    pub max_unavailable: serde_json::Value,
    pub grace_seconds: u64,
}

impl Default for RolloutDeployment {
    fn default() -> Self {
        RolloutDeployment {
            replicas: 3,
            max_surge: json!(1),
            max_unavailable: json!(0),
            grace_seconds: ROLLOUT_GRACE_SECONDS,
        }
    }
}

/// [`start_rollout_world`] with the Deployment `d`: the controller lists its
/// `d.replicas` Pods on return.
pub async fn start_rollout_world_with(d: &RolloutDeployment) -> (Env, Controller) {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::Service;
    use kube::api::PostParams;
    let env = Env::start_with(
        testenv::Backend::Real,
        crate::controller_support::Options {
            kwok: Some(testenv::kwok::Options {
                ready_delay: Duration::from_millis(500),
                ..Default::default()
            }),
            ..Default::default()
        },
    )
    .await;
    env.namespace(NS).await;
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": SVC, "namespace": NS},
        "spec": {"selector": {"app": SVC}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
    }))
    .expect("Service");
    Api::<Service>::namespaced(env.admin.clone(), NS)
        .create(&PostParams::default(), &svc)
        .await
        .expect("create Service");
    let deploy: Deployment = serde_json::from_value(json!({
        "metadata": {"name": SVC, "namespace": NS},
        "spec": {
            "replicas": d.replicas,
            "selector": {"matchLabels": {"app": SVC}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": d.max_surge, "maxUnavailable": d.max_unavailable}},
            "template": {
                "metadata": {"labels": {"app": SVC}},
                "spec": {
                    "terminationGracePeriodSeconds": d.grace_seconds,
                    "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                                    "ports": [{"name": "http", "containerPort": 8080}]}],
                },
            },
        },
    }))
    .expect("Deployment");
    Api::<Deployment>::namespaced(env.admin.clone(), NS)
        .create(&PostParams::default(), &deploy)
        .await
        .expect("create Deployment");
    let cfg = format!(
        "discovery:\n  kubernetes:\n{}    watch_endpoint_slices: true\nkube_discovery:\n  coalesce_window: 20ms\n  drain_terminating: true\n",
        env.service_block(&env.admin_token())
    );
    let ctl = Controller::start(&env, "ctl", &cfg, &[]).await;
    ctl.wait_ready().await;
    let what = format!("the controller lists the {} Pods", d.replicas);
    eventually(&what, LIMIT, || async {
        env.assert_alive();
        let ds = env.dsvc(NS, SVC).await?;
        (ds["spec"]["ports"]["http"].as_array()?.len() == d.replicas).then_some(())
    })
    .await;
    (env, ctl)
}

/// The names of the Pods of `shop/web` (terminating ones too).
pub async fn web_pods(env: &Env) -> Vec<String> {
    use k8s_openapi::api::core::v1::Pod;
    Api::<Pod>::namespaced(env.admin.clone(), NS)
        .list(&kube::api::ListParams::default().labels(&format!("app={SVC}")))
        .await
        .expect("list Pods")
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect()
}

// Rollout variants, scale 0 -> N -> 0 and a readiness flap under traffic (issue 31).

/// The gateways' published reaction time: p99 from an EndpointSlice change
/// to the traffic following it is at most 1 s
/// ([`Report::assert_issue_targets`], BENCHMARKS.md). A failed request is
/// explained only when it started within this window after the
/// EndpointSlices stopped listing a removed Pod, and a 503 only when they
/// listed no serving endpoint at some time in this window before it
/// ([`StepReport`]).
pub const REACTION: Duration = Duration::from_secs(1);

/// Two watches of the same objects in the test process (e.g. the kwok Pod
/// network's, which takes a removed Pod's address off `lo`, and
/// [`PodTimeline`]'s) see an event at slightly different times: a failure may
/// end at most this long before the removal [`PodTimeline`] recorded.
pub const WATCH_SKEW: Duration = Duration::from_millis(250);

/// One Pod of `shop/web` as the API server has it: `(ready, terminating)`;
/// `None` once it is gone.
type PodState = Option<(bool, bool)>;

/// What the test saw of `shop/web`, from watches started before the steps:
/// every change of its Pods (Ready condition, deletion, removal) and of the
/// endpoints its EndpointSlices list (what the controller, and so the
/// gateways, follow), each with when it was seen.
pub struct PodTimeline {
    pods: Arc<Mutex<Vec<(Instant, String, PodState)>>>,
    /// Pod name -> its address.
    ips: Arc<Mutex<std::collections::HashMap<String, String>>>,
    /// The endpoints of the Service's EndpointSlices: address -> serving.
    slices: Arc<Mutex<Vec<(Instant, SliceEndpoints)>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Address -> serving, over every EndpointSlice of `shop/web`.
type SliceEndpoints = std::collections::BTreeMap<String, bool>;

impl PodTimeline {
    /// Starts the watches and waits for their first lists.
    pub async fn start(env: &Env) -> PodTimeline {
        use futures::StreamExt;
        use k8s_openapi::api::core::v1::Pod;
        use kube::runtime::watcher;
        use std::collections::{HashMap, HashSet};
        let pods: Arc<Mutex<Vec<(Instant, String, PodState)>>> = Arc::default();
        let ips: Arc<Mutex<HashMap<String, String>>> = Arc::default();
        let slices: Arc<Mutex<Vec<(Instant, SliceEndpoints)>>> = Arc::default();
        let pods_synced = Arc::new(AtomicBool::new(false));
        let slices_synced = Arc::new(AtomicBool::new(false));

        let api: Api<Pod> = Api::namespaced(env.admin.clone(), NS);
        let cfg = watcher::Config::default().labels(&format!("app={SVC}"));
        let (ev, ip, sy) = (pods.clone(), ips.clone(), pods_synced.clone());
        let pod_task = tokio::spawn(async move {
            let mut now: HashMap<String, (bool, bool)> = HashMap::new();
            let mut seen = HashSet::new();
            let record =
                |now: &mut HashMap<String, (bool, bool)>, name: String, state: PodState| {
                    let old = match state {
                        Some(s) => now.insert(name.clone(), s),
                        None => now.remove(&name),
                    };
                    if old != state {
                        ev.lock()
                            .expect("events")
                            .push((Instant::now(), name, state));
                    }
                };
            let state = |p: &Pod| {
                let ready = p
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
                (ready, p.metadata.deletion_timestamp.is_some())
            };
            let mut stream = watcher(api, cfg).boxed();
            while let Some(e) = stream.next().await {
                match e {
                    Ok(watcher::Event::Apply(p)) | Ok(watcher::Event::InitApply(p)) => {
                        let name = p.metadata.name.clone().unwrap_or_default();
                        if let Some(a) = p.status.as_ref().and_then(|s| s.pod_ip.clone()) {
                            ip.lock().expect("ips").insert(name.clone(), a);
                        }
                        seen.insert(name.clone());
                        record(&mut now, name, Some(state(&p)));
                    }
                    Ok(watcher::Event::Delete(p)) => {
                        record(&mut now, p.metadata.name.clone().unwrap_or_default(), None)
                    }
                    Ok(watcher::Event::Init) => seen.clear(),
                    Ok(watcher::Event::InitDone) => {
                        let gone: Vec<String> =
                            now.keys().filter(|n| !seen.contains(*n)).cloned().collect();
                        for n in gone {
                            record(&mut now, n, None);
                        }
                        sy.store(true, Ordering::Relaxed);
                    }
                    // The watcher retries by itself.
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        });

        let api: Api<EndpointSlice> = Api::namespaced(env.admin.clone(), NS);
        let cfg = watcher::Config::default().labels(&format!("kubernetes.io/service-name={SVC}"));
        let (ev, sy) = (slices.clone(), slices_synced.clone());
        let slice_task = tokio::spawn(async move {
            let mut by_slice: HashMap<String, Vec<(String, bool)>> = HashMap::new();
            let mut seen = HashSet::new();
            let endpoints = |s: &EndpointSlice| -> Vec<(String, bool)> {
                s.endpoints
                    .iter()
                    .flat_map(|e| {
                        let c = e.conditions.as_ref();
                        // `serving` unset means `ready`; `ready` unset means ready.
                        let serving = c.and_then(|c| c.serving.or(c.ready)).unwrap_or(true);
                        e.addresses.iter().map(move |a| (a.clone(), serving))
                    })
                    .collect()
            };
            let mut stream = watcher(api, cfg).boxed();
            while let Some(e) = stream.next().await {
                match e {
                    Ok(watcher::Event::Apply(s)) | Ok(watcher::Event::InitApply(s)) => {
                        let name = s.metadata.name.clone().unwrap_or_default();
                        seen.insert(name.clone());
                        by_slice.insert(name, endpoints(&s));
                    }
                    Ok(watcher::Event::Delete(s)) => {
                        by_slice.remove(&s.metadata.name.clone().unwrap_or_default());
                    }
                    Ok(watcher::Event::Init) => {
                        seen.clear();
                        continue;
                    }
                    Ok(watcher::Event::InitDone) => {
                        by_slice.retain(|n, _| seen.contains(n));
                        sy.store(true, Ordering::Relaxed);
                    }
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                }
                let all: SliceEndpoints = by_slice.values().flatten().cloned().collect();
                let mut ev = ev.lock().expect("slices");
                if ev.last().is_none_or(|(_, last)| *last != all) {
                    ev.push((Instant::now(), all));
                }
            }
        });
        eventually(
            "the timeline listed the Pods and EndpointSlices",
            LIMIT,
            || async {
                (pods_synced.load(Ordering::Relaxed) && slices_synced.load(Ordering::Relaxed))
                    .then_some(())
            },
        )
        .await;
        PodTimeline {
            pods,
            ips,
            slices,
            tasks: vec![pod_task, slice_task],
        }
    }

    fn events(&self) -> Vec<(Instant, String, PodState)> {
        self.pods.lock().expect("events").clone()
    }

    fn slices(&self) -> Vec<(Instant, SliceEndpoints)> {
        self.slices.lock().expect("slices").clone()
    }

    /// Pod `name`'s address.
    pub fn ip(&self, name: &str) -> Option<String> {
        self.ips.lock().expect("ips").get(name).cloned()
    }

    /// When Pod `name` was first seen in `state` after `since`.
    pub async fn wait_for(&self, name: &str, state: PodState, since: Instant) -> Instant {
        eventually(
            &format!("Pod {name} in state (ready, terminating) = {state:?}"),
            LIMIT,
            || async {
                self.events()
                    .iter()
                    .find(|(t, n, s)| *t >= since && n == name && *s == state)
                    .map(|(t, _, _)| *t)
            },
        )
        .await
    }

    /// When the EndpointSlices were first seen listing address `ip` as
    /// `serving` after `since`.
    pub async fn wait_slice(&self, ip: &str, serving: bool, since: Instant) -> Instant {
        eventually(
            &format!("the EndpointSlices list {ip} with serving={serving}"),
            LIMIT,
            || async {
                self.slices()
                    .iter()
                    .find(|(t, e)| *t >= since && e.get(ip) == Some(&serving))
                    .map(|(t, _)| *t)
            },
        )
        .await
    }

    /// The Pods now, as the timeline has them.
    pub fn pods(&self) -> std::collections::HashMap<String, (bool, bool)> {
        let mut now = std::collections::HashMap::new();
        for (_, n, s) in self.events() {
            match s {
                Some(s) => now.insert(n, s),
                None => now.remove(&n),
            };
        }
        now
    }

    /// The intervals in which the EndpointSlices listed no serving endpoint
    /// (`drain_terminating` keeps a terminating one that still serves); the
    /// last one may be open.
    fn empty(&self) -> Vec<(Instant, Option<Instant>)> {
        let mut out: Vec<(Instant, Option<Instant>)> = Vec::new();
        let mut since: Option<Instant> = None;
        for (t, e) in self.slices() {
            let serving = e.values().any(|s| *s);
            match (serving, since) {
                (false, None) => since = Some(t),
                (true, Some(a)) => {
                    out.push((a, Some(t)));
                    since = None;
                }
                _ => {}
            }
        }
        out.extend(since.map(|a| (a, None)));
        out
    }

    /// Pod removals: when, which, and when the EndpointSlices stopped
    /// listing its address (the last listing seen up to the removal, then
    /// the first without it; the removal itself when never listed; `None`
    /// when still listed).
    fn removals(&self) -> Vec<Removal> {
        let slices = self.slices();
        self.events()
            .into_iter()
            .filter(|(_, _, s)| s.is_none())
            .map(|(at, pod, _)| {
                let ip = self.ip(&pod).unwrap_or_default();
                let last = slices
                    .iter()
                    .rposition(|(t, e)| *t <= at + WATCH_SKEW && e.contains_key(&ip));
                let unlisted = match last {
                    None => Some(at),
                    Some(i) => slices[i..]
                        .iter()
                        .find(|(_, e)| !e.contains_key(&ip))
                        .map(|(t, _)| *t),
                };
                Removal {
                    at,
                    pod,
                    ip,
                    unlisted,
                }
            })
            .collect()
    }
}

/// A Pod removed (its address gone from `lo`), and when the EndpointSlices
/// stopped listing it.
struct Removal {
    at: Instant,
    pod: String,
    ip: String,
    unlisted: Option<Instant>,
}

impl Drop for PodTimeline {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// `kubectl <args> -n shop` as the admin.
pub async fn kubectl(env: &Env, args: &[&str]) -> String {
    let kubeconfig = env.kubeconfig(&env.admin_token());
    let home = env.path("kubectl-home");
    std::fs::create_dir_all(&home).expect("kubectl home");
    run_ok(
        &format!("kubectl {}", args.join(" ")),
        tokio::process::Command::new(repo_root().join(".tools/bin/kubectl"))
            .args(args)
            .args(["-n", NS, "--kubeconfig"])
            .arg(&kubeconfig)
            .env("HOME", &home),
    )
    .await
}

/// Merge-patches Deployment `shop/web`.
pub async fn patch_web(env: &Env, patch: serde_json::Value) {
    use k8s_openapi::api::apps::v1::Deployment;
    Api::<Deployment>::namespaced(env.admin.clone(), NS)
        .patch(SVC, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .expect("patch Deployment shop/web");
}

/// Waits until `shop/web` has exactly `replicas` Pods, all Ready, none
/// terminating and none of `old`, and the controller lists exactly those;
/// returns their names.
pub async fn wait_settled(
    env: &Env,
    timeline: &PodTimeline,
    old: &[String],
    replicas: usize,
) -> Vec<String> {
    eventually(
        &format!("{replicas} Ready Pods of shop/web, none of {old:?}, listed by the controller"),
        Duration::from_secs(90),
        || async {
            env.assert_alive();
            let pods = timeline.pods();
            let settled = pods.len() == replicas
                && pods
                    .iter()
                    .all(|(n, s)| *s == (true, false) && !old.contains(n));
            if !settled {
                return None;
            }
            let listed = match env.dsvc(NS, SVC).await {
                Some(ds) => ds["spec"]["ports"]["http"]
                    .as_array()
                    .map_or(0, |a| a.len()),
                None => 0,
            };
            (listed == replicas).then(|| pods.into_keys().collect())
        },
    )
    .await
}

/// What one step under traffic measured. Every request is one of: answered
/// 200 by a Pod (`ok`); a 503 when the EndpointSlices listed no serving
/// endpoint ([`PodTimeline`]) at some time from [`REACTION`] before it
/// started to its end (the gateways' `--empty-policy 503`: `empty_503`);
/// another failure that ended after a Pod's removal (less [`WATCH_SKEW`])
/// and started at most [`REACTION`] after the EndpointSlices stopped listing
/// that Pod (`explained`: its address went before the gateway could follow;
/// the gateway follows the EndpointSlices, which follow the Pods with the
/// EndpointSlice controller's own delay); anything else (`unexplained`).
#[derive(Debug, Default)]
pub struct StepReport {
    pub step: String,
    pub requests: usize,
    pub ok: usize,
    pub empty_503: usize,
    /// The empty-policy 503s with their explanation: `(why, request)`.
    pub empty_503_why: Vec<(String, String)>,
    /// Each with its explanation: `(why, request)`.
    pub explained: Vec<(String, String)>,
    pub unexplained: Vec<String>,
    /// From the step's action (`kubectl ...`) to the world settled.
    pub duration: Duration,
    /// Step-specific numbers for the BENCH line.
    pub extra: String,
}

impl StepReport {
    pub fn line(&self, gateway: &str) -> String {
        format!(
            "BENCH rollout-step gateway={gateway} step={:?} requests={} ok={} empty_503={} explained_failures={} unexplained_failures={} duration_ms={}{}",
            self.step,
            self.requests,
            self.ok,
            self.empty_503,
            self.explained.len(),
            self.unexplained.len(),
            self.duration.as_millis(),
            self.extra
        )
    }

    /// Enough traffic and nothing unexplained; prints the BENCH line and the
    /// explanations.
    pub fn assert_explained(&self, gateway: &str) {
        eprintln!("{}", self.line(gateway));
        print_grouped(gateway, &self.step, "expected 503(s)", &self.empty_503_why);
        print_grouped(gateway, &self.step, "failed request(s)", &self.explained);
        // One request at a time, every 4 ms plus its answer: at least one
        // per 40 ms on average even on a loaded machine.
        assert!(
            self.requests >= 50,
            "{gateway} / {}: only {} requests",
            self.step,
            self.requests
        );
        assert!(
            self.unexplained.is_empty(),
            "{gateway} / {}: {} of {} requests failed with no Pod removed within {REACTION:?} before them and no empty-policy 503 (REACTION {REACTION:?}, WATCH_SKEW {WATCH_SKEW:?}): {:?}",
            self.step,
            self.unexplained.len(),
            self.requests,
            self.unexplained
        );
    }

    /// [`Self::assert_explained`] and every request answered 200 by a Pod.
    pub fn assert_no_failures(&self, gateway: &str) {
        self.assert_explained(gateway);
        assert!(
            self.explained.is_empty() && self.empty_503 == 0,
            "{gateway} / {}: requests failed (grace {ROLLOUT_GRACE_SECONDS} s > reaction time {REACTION:?}, drain_terminating): {} empty-policy 503s, explained failures {:?}",
            self.step,
            self.empty_503,
            self.explained
        );
    }
}

/// One line per explanation in `v` (`(why, request)`): how many, the first
/// and the last request.
fn print_grouped(gateway: &str, step: &str, what: &str, v: &[(String, String)]) {
    let mut why: Vec<&str> = Vec::new();
    for (w, _) in v {
        if !why.contains(&w.as_str()) {
            why.push(w);
        }
    }
    for w in why {
        let reqs: Vec<&str> = v
            .iter()
            .filter(|(x, _)| x == w)
            .map(|(_, r)| r.as_str())
            .collect();
        eprintln!(
            "  {gateway} / {step}: {} {what} explained by {w} (reaction time {REACTION:?}): first {}, last {}",
            reqs.len(),
            reqs[0],
            reqs[reqs.len() - 1]
        );
    }
}

/// The traffic of one step: a request every 4 ms through the gateway from
/// 300 ms before the step's action to [`REACTION`] after it settled.
struct StepTraffic {
    load: Load,
    step: String,
    action: Instant,
}

impl StepTraffic {
    async fn start(gw: SocketAddr, step: &str) -> StepTraffic {
        let load = Load::start(
            gw,
            Duration::from_millis(4),
            40_000,
            Duration::from_secs(120),
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        StepTraffic {
            load,
            step: step.to_string(),
            action: Instant::now(),
        }
    }

    /// Stops the traffic [`REACTION`] after now and sorts every request.
    async fn finish(self, timeline: &PodTimeline) -> StepReport {
        let duration = self.action.elapsed();
        tokio::time::sleep(REACTION).await;
        let samples = self.load.stop().await;
        let (empty, removals) = (timeline.empty(), timeline.removals());
        // Relative to the step's action: "+1.2s", or "-300ms" before it.
        let at = |t: Instant| match t.checked_duration_since(self.action) {
            Some(d) => format!("+{d:?}"),
            None => format!("-{:?}", self.action.saturating_duration_since(t)),
        };
        let mut r = StepReport {
            step: self.step,
            requests: samples.len(),
            duration,
            ..Default::default()
        };
        for s in &samples {
            if matches!(s.outcome, Ok((200, _))) {
                r.ok += 1;
                continue;
            }
            let outcome = match &s.outcome {
                Ok((code, body)) => {
                    format!("{code} {:?}", body.chars().take(40).collect::<String>())
                }
                Err(e) => e.clone(),
            };
            let what = format!("request at {} -> {outcome}", at(s.start));
            let from = s.start.checked_sub(REACTION).unwrap_or(s.start);
            let in_empty = empty
                .iter()
                .find(|(a, b)| *a <= s.done + WATCH_SKEW && b.is_none_or(|b| b > from));
            if let (Ok((503, _)), Some((a, b))) = (&s.outcome, in_empty) {
                r.empty_503 += 1;
                let why = format!(
                    "no serving endpoint in the EndpointSlices from {} to {}",
                    at(*a),
                    b.map_or("the end".into(), &at)
                );
                r.empty_503_why.push((why, what));
                continue;
            }
            // Of the removals that explain it, the one listed longest (the
            // gateway was still following that one).
            let why = removals
                .iter()
                .filter(|d| {
                    s.done + WATCH_SKEW >= d.at
                        && d.unlisted.is_some_and(|u| s.start <= u + REACTION)
                })
                .max_by_key(|d| d.unlisted);
            match why {
                Some(d) => r.explained.push((
                    format!(
                        "Pod {} ({}) removed at {}, dropped from the EndpointSlices at {}",
                        d.pod,
                        d.ip,
                        at(d.at),
                        d.unlisted.map(at).unwrap_or_default()
                    ),
                    what,
                )),
                None => r.unexplained.push(what),
            }
        }
        r
    }
}

/// The names of the Pods in `timeline` now.
fn pod_names(timeline: &PodTimeline) -> Vec<String> {
    timeline.pods().into_keys().collect()
}

/// Requests Pod `shop/<name>` answered in `(from, to)`.
fn pod_hits(env: &Env, name: &str, from: Instant, to: Option<Instant>) -> usize {
    let kwok = env
        .api
        .real()
        .and_then(|r| r.kwok())
        .expect("a kwok cluster");
    kwok.hits(&format!("{NS}/{name}"))
        .iter()
        .filter(|t| **t > from && to.is_none_or(|to| **t < to))
        .count()
}

/// The steps of issue 31's "rollouts with traffic" after the world of
/// [`start_rollout_world`] (3 replicas, `maxSurge: 1`,
/// `maxUnavailable: 0`, grace [`ROLLOUT_GRACE_SECONDS`]), each under a
/// request every 4 ms through the gateway at `gw` (run with
/// `--empty-policy 503`), each asserted and printed as a BENCH line:
///
/// 0. `kubectl rollout restart` with maxSurge 1 / maxUnavailable 0: every request 200.
/// 1. Patched to maxSurge 0 / maxUnavailable 1, restart: every request 200.
/// 2. Scaled to 8 and patched to 25% / 25% (2 / 2), restart: every request 200.
/// 3. A readiness flap of one Pod (kwok's failing-probe annotation, which
///    kwok's stages honour; a patched Ready=False status is undone by kwok's
///    ready stage after the ready delay): every request 200, the Pod gets none
///    from [`REACTION`] after the EndpointSlices list it not serving until it
///    is Ready again, and traffic again after.
/// 4. `kubectl scale` 8 -> 0, 0 -> 3, 3 -> 0: 503s only while no endpoint
///    serves (and some of them), other failures only right after a Pod's
///    removal (the last draining Pods stop with nowhere else to go); each new
///    Pod served.
/// 5. Grace 0 s (patched while at 0 replicas, then scaled to 3), restart:
///    failures counted, each explained by a Pod removed just before.
///
/// What counts as a failure: [`StepReport`].
pub async fn rollout_variants_scale_and_flap(env: &Env, gw: SocketAddr, gateway: &str) {
    eventually("the gateway answers from a Pod", LIMIT, || async {
        matches!(get(gw).await, Ok((200, _))).then_some(())
    })
    .await;
    let timeline = PodTimeline::start(env).await;
    let mut reports = Vec::new();

    // 0. maxSurge 1 / maxUnavailable 0 (the Deployment as created).
    let old = pod_names(&timeline);
    assert_eq!(old.len(), 3, "{gateway}: {old:?}");
    let t = StepTraffic::start(gw, "restart maxSurge=1 maxUnavailable=0 replicas=3").await;
    kubectl(env, &["rollout", "restart", "deployment/web"]).await;
    wait_settled(env, &timeline, &old, 3).await;
    let r = t.finish(&timeline).await;
    r.assert_no_failures(gateway);
    reports.push(r);

    // 1. maxSurge 0 / maxUnavailable 1.
    patch_web(
        env,
        json!({"spec": {"strategy": {"rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}}}),
    )
    .await;
    let old = wait_settled(env, &timeline, &[], 3).await;
    let t = StepTraffic::start(gw, "restart maxSurge=0 maxUnavailable=1 replicas=3").await;
    kubectl(env, &["rollout", "restart", "deployment/web"]).await;
    wait_settled(env, &timeline, &old, 3).await;
    let r = t.finish(&timeline).await;
    r.assert_no_failures(gateway);
    reports.push(r);

    // 2. 25% / 25% with 8 replicas.
    patch_web(
        env,
        json!({"spec": {"replicas": 8, "strategy": {"rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}}}),
    )
    .await;
    let old = wait_settled(env, &timeline, &[], 8).await;
    let t = StepTraffic::start(gw, "restart maxSurge=25% maxUnavailable=25% replicas=8").await;
    kubectl(env, &["rollout", "restart", "deployment/web"]).await;
    wait_settled(env, &timeline, &old, 8).await;
    let r = t.finish(&timeline).await;
    r.assert_no_failures(gateway);
    reports.push(r);

    // 3. A readiness flap: the probe of one Pod fails, then passes.
    let mut pods = pod_names(&timeline);
    pods.sort();
    let flap = pods[0].clone();
    let pod_api: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(env.admin.clone(), NS);
    let probe = |v: Option<&str>| {
        Patch::Merge(json!({"metadata": {"annotations": {testenv::kwok::READY: v}}}))
    };
    let t = StepTraffic::start(gw, "readiness flap of 1 of 8 Pods").await;
    pod_api
        .patch(&flap, &PatchParams::default(), &probe(Some("false")))
        .await
        .expect("annotate the Pod's probe failing");
    let unready = timeline
        .wait_for(&flap, Some((false, false)), t.action)
        .await;
    let flap_ip = timeline.ip(&flap).expect("the flapping Pod's address");
    let unlisted = timeline.wait_slice(&flap_ip, false, unready).await;
    // Not serving in the EndpointSlices for the reaction time and 1 s more.
    tokio::time::sleep(
        (unlisted + REACTION + Duration::from_secs(1)).saturating_duration_since(Instant::now()),
    )
    .await;
    let passing = Instant::now();
    pod_api
        .patch(&flap, &PatchParams::default(), &probe(None))
        .await
        .expect("annotate the Pod's probe passing");
    let ready = timeline.wait_for(&flap, Some((true, false)), passing).await;
    let back = eventually(
        &format!("{gateway}: traffic reaches Pod {flap} again once Ready"),
        LIMIT,
        || async {
            let hits = env
                .api
                .real()
                .and_then(|r| r.kwok())
                .expect("a kwok cluster")
                .hits(&format!("{NS}/{flap}"));
            hits.into_iter().find(|h| *h > ready)
        },
    )
    .await;
    let mut r = t.finish(&timeline).await;
    let while_unready = pod_hits(env, &flap, unlisted + REACTION, Some(passing));
    let last_before = env
        .api
        .real()
        .and_then(|r| r.kwok())
        .expect("a kwok cluster")
        .hits(&format!("{NS}/{flap}"))
        .into_iter()
        .filter(|h| *h > unready && *h < passing)
        .max()
        .map_or(Duration::ZERO, |h| h.saturating_duration_since(unready));
    r.extra = format!(
        " not_ready_to_unserving_in_slices_ms={} not_ready_to_last_request_ms={} hits_while_not_ready_after_reaction={while_unready} ready_to_first_request_ms={}",
        unlisted.saturating_duration_since(unready).as_millis(),
        last_before.as_millis(),
        back.saturating_duration_since(ready).as_millis()
    );
    r.assert_no_failures(gateway);
    assert_eq!(
        while_unready, 0,
        "{gateway} / {}: Pod {flap} got requests more than {REACTION:?} after the EndpointSlices listed it not serving (not Ready)",
        r.step
    );
    reports.push(r);

    // 4. Scale 8 -> 0 -> 3 -> 0.
    for (replicas, step) in [
        (0, "scale 8 -> 0"),
        (3, "scale 0 -> 3"),
        (0, "scale 3 -> 0"),
    ] {
        let old = pod_names(&timeline);
        let t = StepTraffic::start(gw, step).await;
        kubectl(
            env,
            &["scale", "deployment/web", &format!("--replicas={replicas}")],
        )
        .await;
        let new = wait_settled(env, &timeline, &old, replicas).await;
        // The settled state for twice the reaction time.
        tokio::time::sleep(2 * REACTION).await;
        let action = t.action;
        let mut r = t.finish(&timeline).await;
        r.assert_explained(gateway);
        if replicas == 0 {
            assert!(
                r.empty_503 > 0,
                "{gateway} / {step}: no 503 from the gateway with no Pod serving (--empty-policy 503)"
            );
        } else {
            let served: Vec<usize> = new.iter().map(|n| pod_hits(env, n, action, None)).collect();
            r.extra = format!(" requests_per_new_pod={served:?}");
            assert!(
                served.iter().all(|h| *h > 0),
                "{gateway} / {step}: not every new Pod got traffic: {new:?} {served:?}"
            );
        }
        reports.push(r);
    }

    // 5. Grace 0 s: the Pods' addresses go at their deletion.
    patch_web(
        env,
        json!({"spec": {"template": {"spec": {"terminationGracePeriodSeconds": 0}}}}),
    )
    .await;
    kubectl(env, &["scale", "deployment/web", "--replicas=3"]).await;
    let old = wait_settled(env, &timeline, &[], 3).await;
    // The gateway followed out of its empty-policy 503.
    eventually(&format!("{gateway} answers from a Pod"), LIMIT, || async {
        matches!(get(gw).await, Ok((200, _))).then_some(())
    })
    .await;
    let t = StepTraffic::start(
        gw,
        "restart grace=0s maxSurge=25% maxUnavailable=25% replicas=3",
    )
    .await;
    kubectl(env, &["rollout", "restart", "deployment/web"]).await;
    wait_settled(env, &timeline, &old, 3).await;
    let r = t.finish(&timeline).await;
    r.assert_explained(gateway);
    reports.push(r);

    eprintln!(
        "BENCH rollout-steps gateway={gateway} steps={} requests={} explained_failures={} empty_503={}",
        reports.len(),
        reports.iter().map(|r| r.requests).sum::<usize>(),
        reports.iter().map(|r| r.explained.len()).sum::<usize>(),
        reports.iter().map(|r| r.empty_503).sum::<usize>()
    );
}
