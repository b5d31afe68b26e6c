//! `gateways`: how fast the world follows (issue 31), on the real control
//! plane with kwok Pods (`kd-testenv`'s [`testenv::kwok`]): per gateway
//! (nginx, HAProxy, the Rust proxy of `client/examples/reverse_proxy.rs`), a
//! Deployment of `replicas` Pods behind its own Service, rolled out
//! (`restartedAt`, as `kubectl rollout restart`) `rollouts` times under
//! continuous requests through the gateway, then:
//!
//! * **ready -> first request**: from the watch event in which a Pod's Ready
//!   condition turns True (kwok's status write) to the first request the Pod
//!   server answers for it;
//! * **delete -> last request**: from the watch event in which the Pod gets
//!   its `deletionTimestamp` (the ReplicaSet controller's delete call) to the
//!   last request it answers (it keeps answering for its grace period).
//!
//! Each is split at the first EndpointSlice event with the endpoint ready
//! (deletion: no longer ready, or gone) and the first DiscoveredService event
//! listing the address (deletion: no longer listing it as a node). Every time
//! is this process's monotonic clock when it saw the event or served the hit,
//! so the parts add up; the Ready condition's own `lastTransitionTime` has
//! whole-second resolution and is not used.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event, watcher};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::child::Child;
use crate::env::{Env, dsvc_resource};
use crate::scenarios::{Opts, wait_ready};
use crate::stats::percentiles;

/// Namespace of the scenario.
const NS: &str = "shop";

/// The size of one gateway's run.
#[derive(Debug, Clone)]
pub struct GatewayParams {
    /// Replicas of each Deployment.
    pub replicas: usize,
    /// Rollouts per gateway (each makes `replicas` Pods Ready and deletes as many).
    pub rollouts: usize,
    /// `terminationGracePeriodSeconds` of the Pods (they answer until it ends).
    pub grace_s: u64,
    /// Client connections through the gateway, each one request at a time.
    pub clients: usize,
    /// Pause of each client between its requests.
    pub every: Duration,
}

/// One gateway under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gw {
    Nginx,
    Haproxy,
    RustProxy,
}

impl Gw {
    fn name(self) -> &'static str {
        match self {
            Gw::Nginx => "nginx",
            Gw::Haproxy => "haproxy",
            Gw::RustProxy => "rust-proxy",
        }
    }

    /// Its Service and Deployment (`web-<gateway>`).
    fn svc(self) -> String {
        format!("web-{}", self.name())
    }
}

/// The gateways' view of the bench environment.
struct GwEnv<'a> {
    env: &'a Env,
    bin: PathBuf,
    examples: PathBuf,
}

impl testenv::gateways::GatewayEnv for GwEnv<'_> {
    fn path(&self, name: &str) -> PathBuf {
        self.env.path(name)
    }

    fn admin_kubeconfig(&self) -> PathBuf {
        self.env
            .kubeconfig()
            .unwrap_or_else(|e| panic!("admin kubeconfig: {e:#}"))
    }

    fn kube_discovery_bin(&self) -> PathBuf {
        self.bin.clone()
    }

    fn example_bin(&self, name: &str) -> PathBuf {
        self.examples.join(name)
    }
}

/// A running gateway: its address and processes (dropping them kills them).
struct Running {
    addr: SocketAddr,
    _procs: Vec<testenv::gateways::Proc>,
}

async fn start_gateway(g: &GwEnv<'_>, gw: Gw) -> Running {
    let svc = gw.svc();
    let spec = format!("web={NS}/{svc}:http");
    match gw {
        Gw::Nginx => {
            let n = testenv::gateways::start_nginx(g, "ngx", &[&spec], "web", &[]).await;
            Running {
                addr: n.addr,
                _procs: vec![n.proc, n.sync],
            }
        }
        Gw::Haproxy => {
            let h = testenv::gateways::start_haproxy(g, "hap", &[&spec], "web", &[]).await;
            Running {
                addr: h.addr,
                _procs: vec![h.proc, h.sync],
            }
        }
        Gw::RustProxy => {
            let (p, addr) =
                testenv::gateways::start_proxy(g, "proxy", &format!("{NS}/{svc}:http"), &[]).await;
            Running {
                addr,
                _procs: vec![p],
            }
        }
    }
}

/// What the watchers saw, per object, at the first time they saw it.
#[derive(Default)]
struct Seen {
    /// Pod `name` -> its address.
    ip: HashMap<String, String>,
    /// Pod -> first seen (created).
    created: HashMap<String, Instant>,
    /// Pod -> first event with Ready=True.
    ready: HashMap<String, Instant>,
    /// Pod -> first event with a deletionTimestamp.
    deleting: HashMap<String, Instant>,
    /// Pod -> its Delete event (kwok removed it at the end of its grace period).
    gone: HashMap<String, Instant>,
    /// Pod -> first EndpointSlice event with its endpoint ready.
    slice_ready: HashMap<String, Instant>,
    /// Pod -> first EndpointSlice event, after it was ready, with it not ready or absent.
    slice_unready: HashMap<String, Instant>,
    /// `service` -> `(when, address, listed)` at each change of the
    /// DiscoveredService's node list (draining nodes count as not listed).
    ds: HashMap<String, Vec<(Instant, String, bool)>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Watches Pods, EndpointSlices and DiscoveredServices of [`NS`] into `seen`
/// on a runtime (one thread) and a client of their own, so that the client
/// loops and the Pod servers of this process do not delay the watch events'
/// timestamps. Shut the runtime down to stop.
async fn start_watchers(
    kubeconfig: &std::path::Path,
    seen: Arc<Mutex<Seen>>,
) -> Result<tokio::runtime::Runtime> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("kd-bench-watchers")
        .enable_all()
        .build()
        .context("the watchers' runtime")?;
    let yaml = std::fs::read_to_string(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    let client = rt
        .spawn(async move {
            let kc = kube::config::Kubeconfig::from_yaml(&yaml)?;
            let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
            let client = kube::Client::try_from(cfg)?;
            watch_all(&client, seen);
            anyhow::Ok(())
        })
        .await
        .context("the watchers' runtime")?;
    client.context("the watchers' client")?;
    Ok(rt)
}

fn watch_all(client: &kube::Client, seen: Arc<Mutex<Seen>>) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let s = seen.clone();
    tasks.push(tokio::spawn(async move {
        let mut st = watcher(pods, watcher::Config::default()).boxed();
        while let Some(ev) = st.next().await {
            let now = Instant::now();
            let mut s = lock(&s);
            match ev {
                Ok(Event::Apply(p) | Event::InitApply(p)) => {
                    let Some(name) = p.metadata.name.clone() else {
                        continue;
                    };
                    s.created.entry(name.clone()).or_insert(now);
                    if let Some(ip) = p.status.as_ref().and_then(|st| st.pod_ip.clone()) {
                        s.ip.entry(name.clone()).or_insert(ip);
                    }
                    if pod_ready(&p) {
                        s.ready.entry(name.clone()).or_insert(now);
                    }
                    if p.metadata.deletion_timestamp.is_some() {
                        s.deleting.entry(name).or_insert(now);
                    }
                }
                Ok(Event::Delete(p)) => {
                    if let Some(name) = p.metadata.name {
                        s.gone.entry(name).or_insert(now);
                    }
                }
                _ => {}
            }
        }
    }));
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    let s = seen.clone();
    tasks.push(tokio::spawn(async move {
        // Slice name -> the Pods it lists as ready.
        let mut state: HashMap<String, HashSet<String>> = HashMap::new();
        let mut st = watcher(slices, watcher::Config::default()).boxed();
        while let Some(ev) = st.next().await {
            let now = Instant::now();
            let (name, ready) = match ev {
                Ok(Event::Apply(sl) | Event::InitApply(sl)) => {
                    let ready: HashSet<String> = sl
                        .endpoints
                        .iter()
                        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
                        .filter_map(|e| e.target_ref.as_ref().and_then(|r| r.name.clone()))
                        .collect();
                    (sl.metadata.name.unwrap_or_default(), ready)
                }
                Ok(Event::Delete(sl)) => (sl.metadata.name.unwrap_or_default(), HashSet::new()),
                _ => continue,
            };
            let before = state.insert(name, ready.clone()).unwrap_or_default();
            let mut s = lock(&s);
            for p in ready.difference(&before) {
                s.slice_ready.entry(p.clone()).or_insert(now);
            }
            for p in before.difference(&ready) {
                s.slice_unready.entry(p.clone()).or_insert(now);
            }
        }
    }));
    let ds: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &dsvc_resource());
    let s = seen;
    tasks.push(tokio::spawn(async move {
        let mut state: HashMap<String, HashSet<String>> = HashMap::new();
        let mut st = watcher(ds, watcher::Config::default()).boxed();
        while let Some(ev) = st.next().await {
            let now = Instant::now();
            let (name, listed) = match ev {
                Ok(Event::Apply(o) | Event::InitApply(o)) => {
                    let listed: HashSet<String> = o.data["spec"]["ports"]["http"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter(|n| n["draining"] != true)
                        .filter_map(|n| n["host"].as_str().map(str::to_string))
                        .collect();
                    (o.metadata.name.unwrap_or_default(), listed)
                }
                Ok(Event::Delete(o)) => (o.metadata.name.unwrap_or_default(), HashSet::new()),
                _ => continue,
            };
            let before = state
                .insert(name.clone(), listed.clone())
                .unwrap_or_default();
            let mut s = lock(&s);
            let log = s.ds.entry(name).or_default();
            for a in listed.difference(&before) {
                log.push((now, a.clone(), true));
            }
            for a in before.difference(&listed) {
                log.push((now, a.clone(), false));
            }
        }
    }));
    tasks
}

/// Client connections through the gateway: one `GET /` at a time each
/// (`Connection: close`), `every` apart.
struct Load {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    first_failures: Arc<Mutex<Vec<String>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    started: Instant,
}

impl Load {
    fn start(addr: SocketAddr, clients: usize, every: Duration) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let first_failures: Arc<Mutex<Vec<String>>> = Arc::default();
        let started = Instant::now();
        let tasks = (0..clients)
            .map(|_| {
                let (stop, ok, failed, ff) = (
                    stop.clone(),
                    ok.clone(),
                    failed.clone(),
                    first_failures.clone(),
                );
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        match testenv::net::http_get(addr).await {
                            Ok((200, _)) => {
                                ok.fetch_add(1, Ordering::Relaxed);
                            }
                            other => {
                                failed.fetch_add(1, Ordering::Relaxed);
                                let mut f = lock(&ff);
                                if f.len() < 10 {
                                    f.push(format!(
                                        "+{:.3}s {other:?}",
                                        started.elapsed().as_secs_f64()
                                    ));
                                }
                            }
                        }
                        tokio::time::sleep(every).await;
                    }
                })
            })
            .collect();
        Load {
            stop,
            ok,
            failed,
            first_failures,
            tasks,
            started,
        }
    }

    /// Stops; returns (ok, failed, seconds, first failures).
    async fn stop(self) -> (u64, u64, f64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            let _ = t.await;
        }
        (
            self.ok.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
            self.started.elapsed().as_secs_f64(),
            lock(&self.first_failures).clone(),
        )
    }
}

async fn create_world(client: &kube::Client, gw: Gw, p: &GatewayParams) -> Result<()> {
    let svc = gw.svc();
    let s: Service = serde_json::from_value(json!({
        "metadata": {"name": svc, "namespace": NS},
        "spec": {"selector": {"app": svc}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
    }))?;
    Api::<Service>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &s)
        .await
        .with_context(|| format!("creating Service {svc}"))?;
    let surge = p.replicas.div_ceil(4).max(1);
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": svc, "namespace": NS},
        "spec": {
            "replicas": p.replicas,
            "selector": {"matchLabels": {"app": svc}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": surge, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": {"app": svc}},
                "spec": {
                    "terminationGracePeriodSeconds": p.grace_s,
                    "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                                    "ports": [{"name": "http", "containerPort": 8080}]}],
                },
            },
        },
    }))?;
    Api::<Deployment>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &d)
        .await
        .with_context(|| format!("creating Deployment {svc}"))?;
    Ok(())
}

/// Waits until the Deployment `name` has rolled out completely: every
/// replica updated, available, and no old one left.
async fn wait_rolled_out(client: &kube::Client, name: &str, timeout: Duration) -> Result<()> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let t0 = Instant::now();
    loop {
        let d = api.get(name).await.context("get Deployment")?;
        let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        if let Some(s) = &d.status
            && s.observed_generation >= d.metadata.generation
            && s.updated_replicas == Some(want)
            && s.available_replicas == Some(want)
            && s.replicas == Some(want)
        {
            return Ok(());
        }
        if t0.elapsed() > timeout {
            bail!(
                "Deployment {name} not rolled out within {timeout:?}: {:?}",
                d.status
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until every Pod of `app` that is being deleted is gone.
async fn wait_terminated(client: &kube::Client, app: &str, timeout: Duration) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let t0 = Instant::now();
    loop {
        let pods = api
            .list(&kube::api::ListParams::default().labels(&format!("app={app}")))
            .await
            .context("list Pods")?;
        if pods
            .items
            .iter()
            .all(|p| p.metadata.deletion_timestamp.is_none())
        {
            return Ok(());
        }
        if t0.elapsed() > timeout {
            bail!("terminating Pods of {app} still there after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn ms(from: Instant, to: Instant) -> f64 {
    if to >= from {
        to.duration_since(from).as_secs_f64() * 1e3
    } else {
        -(from.duration_since(to).as_secs_f64() * 1e3)
    }
}

/// The per-gateway part of the scenario.
async fn one_gateway(
    env: &Env,
    g: &GwEnv<'_>,
    gw: Gw,
    p: &GatewayParams,
    seen: &Arc<Mutex<Seen>>,
    timeout: Duration,
) -> Result<Value> {
    let client = &env.client;
    let kwok = env
        .api
        .real()
        .and_then(|r| r.kwok())
        .ok_or_else(|| anyhow!("no kwok in this control plane"))?;
    let svc = gw.svc();
    create_world(client, gw, p).await?;
    wait_rolled_out(client, &svc, timeout).await?;
    let initial: HashSet<String> = lock(seen)
        .created
        .keys()
        .filter(|n| n.starts_with(&format!("{svc}-")))
        .cloned()
        .collect();
    let running = start_gateway(g, gw).await;
    // Served by the gateway before the load starts.
    let t0 = Instant::now();
    loop {
        if matches!(testenv::net::http_get(running.addr).await, Ok((200, _))) {
            break;
        }
        if t0.elapsed() > timeout {
            bail!("{} never answered 200", gw.name());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let load = Load::start(running.addr, p.clients, p.every);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let rollouts_from = Instant::now();
    for i in 0..p.rollouts {
        let patch = json!({"spec": {"template": {"metadata": {"annotations": {
            "kubectl.kubernetes.io/restartedAt": format!("kd-bench-{i}")}}}}});
        deploys
            .patch(&svc, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("restarting Deployment {svc}"))?;
        wait_rolled_out(client, &svc, timeout).await?;
    }
    let rollouts_s = rollouts_from.elapsed().as_secs_f64();
    // The last old Pods answer until their grace period ends.
    wait_terminated(client, &svc, timeout).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (ok, failed, load_s, first_failures) = load.stop().await;
    drop(running);

    let s = lock(seen);
    let ds_log = s.ds.get(&svc).cloned().unwrap_or_default();
    let mut rows = Vec::new();
    let (mut up, mut up_a, mut up_b, mut up_c) = (vec![], vec![], vec![], vec![]);
    let (mut down, mut down_a, mut down_b, mut down_c) = (vec![], vec![], vec![], vec![]);
    let (mut censored, mut missing) = (0usize, Vec::new());
    let mut names: Vec<&String> = s
        .created
        .keys()
        .filter(|n| n.starts_with(&format!("{svc}-")))
        .collect();
    names.sort();
    for name in names {
        let ip = s.ip.get(name).cloned().unwrap_or_default();
        let hits = kwok.hits(&format!("{NS}/{name}"));
        let first_hit = hits.iter().min().copied();
        let last_hit = hits.iter().max().copied();
        let created = s.created[name];
        let mut row = json!({"pod": name, "ip": ip, "hits": hits.len()});
        // Ready -> first request (Pods made by the rollouts).
        if !initial.contains(name)
            && let Some(ready) = s.ready.get(name).copied()
        {
            let slice = s.slice_ready.get(name).copied();
            let dsvc = ds_log
                .iter()
                .find(|(t, a, listed)| *listed && *a == ip && *t >= created)
                .map(|(t, _, _)| *t);
            match (slice, dsvc, first_hit) {
                (Some(sl), Some(d), Some(h)) => {
                    up.push(ms(ready, h));
                    up_a.push(ms(ready, sl));
                    up_b.push(ms(sl, d));
                    up_c.push(ms(d, h));
                    row["ready_to_first_request_ms"] = json!(ms(ready, h));
                    row["ready_to_slice_ms"] = json!(ms(ready, sl));
                    row["slice_to_dsvc_ms"] = json!(ms(sl, d));
                    row["dsvc_to_first_request_ms"] = json!(ms(d, h));
                }
                other => missing.push(format!(
                    "{name} ready: slice/dsvc/hit seen {:?}",
                    (other.0.is_some(), other.1.is_some(), other.2.is_some())
                )),
            }
        }
        // Delete -> last request. The address's first removal after this
        // Pod's own addition (an address comes back with a later Pod).
        if let Some(del) = s.deleting.get(name).copied() {
            let slice = s.slice_unready.get(name).copied();
            let added = ds_log
                .iter()
                .find(|(t, a, listed)| *listed && *a == ip && *t >= created)
                .map_or(created, |(t, _, _)| *t);
            let dsvc = ds_log
                .iter()
                .find(|(t, a, listed)| !*listed && *a == ip && *t >= added)
                .map(|(t, _, _)| *t);
            match (slice, dsvc, last_hit) {
                (Some(sl), Some(d), Some(h)) => {
                    down.push(ms(del, h));
                    down_a.push(ms(del, sl));
                    down_b.push(ms(sl, d));
                    down_c.push(ms(d, h));
                    row["delete_to_last_request_ms"] = json!(ms(del, h));
                    row["delete_to_slice_ms"] = json!(ms(del, sl));
                    row["slice_to_dsvc_ms_delete"] = json!(ms(sl, d));
                    row["dsvc_to_last_request_ms"] = json!(ms(d, h));
                    // Still sent to when the Pod went away: the true figure is larger.
                    if let Some(g) = s.gone.get(name)
                        && ms(h, *g) < 100.0
                    {
                        censored += 1;
                        row["censored"] = json!(true);
                    }
                }
                other => missing.push(format!(
                    "{name} delete: slice/dsvc/hit seen {:?}",
                    (other.0.is_some(), other.1.is_some(), other.2.is_some())
                )),
            }
        }
        rows.push(row);
    }
    drop(s);
    let rate = ok as f64 / load_s.max(1e-9);
    Ok(json!({
        "gateway": gw.name(),
        "pods_ready_measured": up.len(),
        "pods_deleted_measured": down.len(),
        "ready_to_first_request_ms": percentiles(&mut up),
        "ready_split_ms": {
            "a_pod_ready_to_endpointslice": percentiles(&mut up_a),
            "b_endpointslice_to_discoveredservice": percentiles(&mut up_b),
            "c_discoveredservice_to_first_request": percentiles(&mut up_c),
        },
        "delete_to_last_request_ms": percentiles(&mut down),
        "delete_split_ms": {
            "a_pod_deleted_to_endpointslice": percentiles(&mut down_a),
            "b_endpointslice_to_discoveredservice": percentiles(&mut down_b),
            "c_discoveredservice_to_last_request": percentiles(&mut down_c),
        },
        "deletes_censored_by_pod_removal": censored,
        "not_measured": missing,
        "rollouts": p.rollouts,
        "rollouts_s": rollouts_s,
        "requests_ok": ok,
        "requests_failed": failed,
        "first_failures": first_failures,
        "request_rate_per_s": rate,
        // A Pod among `replicas` (up to `replicas + surge` during a rollout)
        // gets about one request in `replicas`: the resolution of "first" and
        // "last request".
        "mean_request_interval_per_pod_ms": p.replicas as f64 / rate.max(1e-9) * 1e3,
        "pods": rows,
    }))
}

/// The scenario: one control plane with kwok, the release controller, then
/// each installed gateway in turn.
pub async fn gateways(opts: &Opts, p: &GatewayParams) -> Result<Value> {
    let examples = std::env::current_exe()?
        .parent()
        .ok_or_else(|| anyhow!("executable has no directory"))?
        .join("examples");
    let mut wanted = Vec::new();
    let mut skipped = BTreeMap::new();
    for gw in [Gw::Nginx, Gw::Haproxy, Gw::RustProxy] {
        let missing = match gw {
            Gw::Nginx | Gw::Haproxy => testenv::gateways::find_system_bin(gw.name())
                .is_none()
                .then(|| {
                    format!(
                        "{} is not installed (bash e2e/tools/install-gateways.sh)",
                        gw.name()
                    )
                }),
            Gw::RustProxy => (!examples.join("reverse_proxy").is_file()).then(|| {
                format!(
                    "{} not found: cargo build --release -p kube-discovery-client --examples",
                    examples.join("reverse_proxy").display()
                )
            }),
        };
        match missing {
            Some(why) => {
                eprintln!("kd-bench: gateways: skipping {}: {why}", gw.name());
                skipped.insert(gw.name().to_string(), why);
            }
            None => wanted.push(gw),
        }
    }
    let env = Env::start_kwok(
        None,
        testenv::kwok::Options {
            nodes: 8,
            ..Default::default()
        },
    )
    .await?;
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": NS}}))?;
    Api::<k8s_openapi::api::core::v1::Namespace>::all(env.client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .context("creating the namespace")?;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let watchers = start_watchers(&env.kubeconfig()?, seen.clone()).await?;
    let cfg = env.path("ctl.yaml");
    std::fs::write(
        &cfg,
        env.controller_config(true, &opts.kube_discovery_block())?,
    )?;
    let mut ctl = Child::controller(&opts.bin, &cfg, &env.path("ctl.log")).await?;
    wait_ready(&mut ctl, opts.timeout).await?;
    let g = GwEnv {
        env: &env,
        bin: opts.bin.clone(),
        examples,
    };
    let mut per = Vec::new();
    for gw in wanted {
        eprintln!("kd-bench: gateways: {} ...", gw.name());
        per.push(one_gateway(&env, &g, gw, p, &seen, opts.timeout).await?);
    }
    watchers.shutdown_background();
    env.api.check_alive()?;
    Ok(json!({
        "scenario": "gateways",
        "replicas": p.replicas,
        "rollouts_per_gateway": p.rollouts,
        "grace_s": p.grace_s,
        "clients": p.clients,
        "client_pause_ms": p.every.as_secs_f64() * 1e3,
        "coalesce_window_ms": opts.window_ms,
        "endpointslice_updates_batch_period": "0s (kd-testenv's kube-controller-manager flag)",
        "kwok_ready_delay_ms": 0,
        "skipped": skipped,
        "gateways": per,
    }))
}
