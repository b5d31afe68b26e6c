//! The scenarios of issue 6. Each one starts its own kube-sim, runs the release
//! controller (and, for churn, the echo client) as separate processes and
//! returns a JSON object of MEASURED figures only:
//!
//! * times come from kube-sim's write log (`timeNanos` of the commits) and, for
//!   readiness, from polling the controller's `/readyz` every 20 ms;
//! * memory and CPU from `/proc/<pid>/status` (`VmHWM`, `VmRSS`) and
//!   `/proc/<pid>/stat` (`utime + stime`);
//! * request counts from `/_sim/stats` (the harness's own `/_sim` calls are not
//!   counted there, and the harness sends no API request while it measures a
//!   sync);
//! * write counts from the write log, cross-checked with the controller's
//!   `/metrics` (`kube_discovery_writes_total{result="applied"}`); the target
//!   "writes per relevant change" counts API writes from the write log.
//!
//! Latency of a change = time of the first DiscoveredService write of that
//! service committed at or after the source write (the echo client: the first
//! write of its ConfigMap, by revision: see `echo_write`). A write already in
//! flight when the change lands is counted as reflecting it, so values can be
//! slightly optimistic; changes are spread over many services to keep that
//! rare. The changes of a service
//! between two of its DiscoveredService writes that end where they started
//! (the ready addresses back where they were: a ready flip and back, an add
//! and its removal inside the coalescing window) have nothing to write: they
//! are counted as "undone", not as latencies (else the next, unrelated write
//! seconds later would count as their latency). A change with no later write
//! that was not undone is "unreflected" (a miss). That the end state is right is checked separately
//! (`final_state_mismatches`: every DiscoveredService's hosts against the
//! harness's own model, after settling).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use kube::api::{Api, DynamicObject, ListParams};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::child::{Child, metric_sum};
use crate::env::{Env, Write, dsvc_resource, request_diff};
use crate::load::{self, Mode, Svc};
use crate::stats::{Rng, percentiles};

/// Options shared by every scenario.
#[derive(Debug, Clone)]
pub struct Opts {
    /// The API server every scenario starts.
    pub apiserver: crate::env::Backend,
    /// The `kube-discovery` binary.
    pub bin: PathBuf,
    /// `kube_discovery.coalesce_window`, milliseconds.
    pub window_ms: u64,
    /// `kube_discovery.coalesce_leading_edge` (`None`: not set, the
    /// controller's default).
    pub leading_edge: Option<bool>,
    /// `kube_discovery.write_qps` (`None`: not set, the controller's
    /// default adaptive limiter).
    pub write_qps: Option<f64>,
    /// `kube_discovery.write_concurrency` (`None`: the controller's default).
    pub write_concurrency: Option<usize>,
    /// Upper bound of every wait.
    pub timeout: Duration,
    /// The plain user the controller authenticates as (`None`: the admin).
    pub controller_user: Option<String>,
}

impl Opts {
    pub(crate) fn kube_discovery_block(&self) -> String {
        let mut b = format!("  coalesce_window: {}ms\n", self.window_ms);
        if let Some(l) = self.leading_edge {
            b.push_str(&format!("  coalesce_leading_edge: {l}\n"));
        }
        if let Some(q) = self.write_qps {
            b.push_str(&format!("  write_qps: {q}\n"));
        }
        if let Some(c) = self.write_concurrency {
            b.push_str(&format!("  write_concurrency: {c}\n"));
        }
        b
    }
}

pub(crate) fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

pub(crate) fn secs(nanos: i128) -> f64 {
    nanos as f64 / 1e9
}

pub(crate) fn kib_to_mib(k: u64) -> f64 {
    k as f64 / 1024.0
}

pub(crate) async fn start_controller(
    env: &Env,
    opts: &Opts,
    mode: Mode,
    tag: &str,
) -> Result<Child> {
    let cfg = env.path(&format!("{tag}.yaml"));
    std::fs::write(
        &cfg,
        env.controller_config(mode == Mode::Slices, &opts.kube_discovery_block())?,
    )?;
    Child::controller(&opts.bin, &cfg, &env.path(&format!("{tag}.log"))).await
}

/// Polls `/readyz` every 20 ms (sampling `/proc` each time) until 200.
pub(crate) async fn wait_ready(c: &mut Child, timeout: Duration) -> Result<Duration> {
    let t0 = Instant::now();
    loop {
        c.sample()?;
        if let Ok((200, _)) = c.get("/readyz").await {
            return Ok(t0.elapsed());
        }
        if t0.elapsed() > timeout {
            bail!("controller not ready within {timeout:?}:\n{}", c.log_tail());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(crate) fn ds_writes(ws: &[Write]) -> impl Iterator<Item = &Write> {
    ws.iter().filter(|w| w.resource == "discoveredservices")
}

/// Waits until every name in `names` has a DiscoveredService write after `since`
/// (and at or after the given time, if any); returns the writes seen.
pub(crate) async fn wait_ds_written(
    env: &Env,
    since: u64,
    names: &[(String, u64)],
    c: &mut Child,
    timeout: Duration,
) -> Result<Vec<Write>> {
    let t0 = Instant::now();
    loop {
        c.sample()?;
        let ws = env.writes_since(since).await?;
        let mut last: HashMap<&str, u64> = HashMap::new();
        for w in ds_writes(&ws) {
            let e = last.entry(w.name.as_str()).or_default();
            *e = (*e).max(w.time_nanos);
        }
        if names
            .iter()
            .all(|(n, t)| last.get(n.as_str()).is_some_and(|l| l >= t))
        {
            return Ok(ws);
        }
        if t0.elapsed() > timeout {
            let missing = names
                .iter()
                .filter(|(n, t)| last.get(n.as_str()).is_none_or(|l| l < t))
                .count();
            bail!(
                "{missing} DiscoveredServices not written within {timeout:?}:\n{}",
                c.log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Nodes of service `name` over all of its DiscoveredService objects (a big
/// service is sharded over `<name>`, `<name>.1`, ...; each carries the
/// service-name label), taken as every reader takes them
/// (`kube_discovery_core::crd::consistent_shards`: shard 0 and the shards
/// its manifest lists). Shards that do not form one version, or objects
/// beyond shard 0's count, count as 0 nodes (a broken result).
pub(crate) async fn ds_node_count(env: &Env, name: &str) -> Result<usize> {
    use kube_discovery_core::crd::{DiscoveredService, ShardHead, consistent_shards};
    let api: Api<DynamicObject> =
        Api::namespaced_with(env.client.clone(), load::NAMESPACE, &dsvc_resource());
    let lp = ListParams::default().labels(&format!("kubediscovery.io/service-name={name}"));
    let objs: Vec<DiscoveredService> = api
        .list(&lp)
        .await
        .with_context(|| format!("listing the DiscoveredServices of {name}"))?
        .items
        .into_iter()
        .map(|o| serde_json::to_value(o).and_then(serde_json::from_value))
        .collect::<Result<_, _>>()
        .with_context(|| format!("decoding the DiscoveredServices of {name}"))?;
    let heads: Vec<ShardHead<'_>> = objs.iter().map(ShardHead::of).collect();
    let Ok((take, _)) = consistent_shards(&heads) else {
        return Ok(0);
    };
    if take.len() != objs.len() {
        return Ok(0);
    }
    Ok(objs
        .iter()
        .map(|o| o.spec.ports.get("http").map_or(0, Vec::len))
        .sum())
}

/// Scenario 1: initial sync of `count` services x `per` endpoints.
pub async fn sync(opts: &Opts, mode: Mode, count: usize, per: usize) -> Result<Value> {
    let env = Env::start(opts.apiserver, opts.controller_user.as_deref(), 10_000).await?;
    let svcs = load::services(count, per);
    let t = Instant::now();
    let objects = load::create_all(&env.client, mode, &svcs, 32).await?;
    let create_s = t.elapsed().as_secs_f64();
    let rv0 = env.rv().await?;
    let req0 = env.request_counts().await?;
    let t0_wall = now_nanos();
    let mut c = start_controller(&env, opts, mode, "sync").await?;
    let ready = wait_ready(&mut c, opts.timeout).await?;
    let names: Vec<(String, u64)> = (0..count).map(|i| (load::svc_name(i), 0)).collect();
    let ws = wait_ds_written(&env, rv0, &names, &mut c, opts.timeout).await?;
    let end = c.sample()?;
    let last_write = ds_writes(&ws)
        .map(|w| w.time_nanos)
        .max()
        .unwrap_or(t0_wall);
    let sync_s = ready
        .as_secs_f64()
        .max(secs(last_write as i128 - t0_wall as i128));
    let ds_api_writes = ds_writes(&ws).count();
    let req1 = env.request_counts().await?;
    let (requests, by_verb) = request_diff(&req0, &req1);
    let metrics = c.get("/metrics").await.map(|(_, b)| b).unwrap_or_default();
    // Spot-check the content: first and last service carry every endpoint.
    let first_nodes = ds_node_count(&env, &load::svc_name(0)).await?;
    let last_nodes = ds_node_count(&env, &load::svc_name(count - 1)).await?;
    let endpoints = count * per;
    let hwm = end.hwm_kib.max(c.max_rss_kib);
    let budget_kib = 30 * 1024 + (endpoints as u64 * 400).div_ceil(1024);
    c.stop().await?;
    drop(env); // stops kube-sim (and keeps logs with KD_BENCH_KEEP_LOGS)
    Ok(json!({
        "scenario": "sync", "mode": mode.as_str(), "services": count, "endpoints_per_service": per,
        "endpoints": endpoints, "source_objects": objects, "create_s": create_s,
        "ready_s": ready.as_secs_f64(), "sync_s": sync_s,
        "peak_rss_mib": kib_to_mib(hwm), "end_rss_mib": kib_to_mib(end.rss_kib),
        "rss_bytes_per_endpoint": hwm as f64 * 1024.0 / endpoints as f64,
        "rss_budget_mib": kib_to_mib(budget_kib), "rss_within_budget": hwm <= budget_kib,
        "cpu_s": end.cpu_s,
        "api_requests": requests, "api_requests_by_verb": by_verb,
        "ds_api_writes": ds_api_writes,
        "applied_metric": metric_sum(&metrics, "kube_discovery_writes_total", "result=\"applied\""),
        // 429 answers to the controller's writes, and where its adaptive
        // limiter ended (writes/s).
        "throttled_429": metric_sum(&metrics, "kube_discovery_writes_throttled_total", ""),
        "write_rate_limit_end": metric_sum(&metrics, "kube_discovery_write_rate_limit", ""),
        "content_check": {"first_service_nodes": first_nodes, "last_service_nodes": last_nodes, "ok": first_nodes == per && last_nodes == per},
    }))
}

/// Churn parameters.
#[derive(Debug, Clone)]
pub struct ChurnParams {
    /// Services receiving relevant changes.
    pub relevant: usize,
    /// Services receiving only irrelevant changes.
    pub irrelevant: usize,
    /// Initial ready endpoints per service.
    pub per: usize,
    /// Target changes per second (all kinds).
    pub rate: f64,
    /// Share of irrelevant changes.
    pub irrelevant_share: f64,
    /// Duration of the load.
    pub seconds: f64,
}

#[derive(Debug, Clone)]
struct Change {
    svc: usize,
    relevant: bool,
    kind: &'static str,
    rv: u64,
    /// Fingerprint of the service's ready addresses before and after the change.
    before: u64,
    after: u64,
}

/// Fingerprint of the ready addresses of `svc` (order-independent).
fn ready_set(svc: &Svc) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut ips: Vec<_> = svc.eps.iter().filter(|e| e.ready).map(|e| e.ip).collect();
    ips.sort_unstable();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    ips.hash(&mut h);
    h.finish()
}

async fn apply_change(
    client: &kube::Client,
    mode: Mode,
    svc: &mut Svc,
    relevant: bool,
    rng: &mut Rng,
    extra: &mut u32,
    tick: u64,
) -> Result<Change> {
    let kind: &'static str;
    let before = ready_set(svc);
    if relevant {
        let ready = svc.eps.iter().filter(|e| e.ready).count();
        let choice = rng.below(3);
        let room = svc.eps.len() < load::SLICE_SIZE;
        kind = if svc.eps.is_empty()
            || (room && ((choice == 0 && svc.eps.len() < 90) || (ready <= 2 && choice != 2)))
        {
            *extra += 1;
            svc.eps.push(load::Ep {
                ip: load::extra_ip(*extra),
                ready: true,
            });
            "add"
        } else if choice <= 1 && ready > 0 {
            let readies: Vec<usize> = (0..svc.eps.len()).filter(|&i| svc.eps[i].ready).collect();
            let idx = readies[rng.below(readies.len())];
            svc.eps.remove(idx);
            "remove"
        } else {
            let idx = rng.below(svc.eps.len());
            svc.eps[idx].ready = !svc.eps[idx].ready;
            "ready_flip"
        };
        let rv = load::update(client, mode, svc).await?;
        return Ok(Change {
            svc: svc.index,
            relevant,
            kind,
            rv,
            before,
            after: ready_set(svc),
        });
    }
    if rng.below(2) == 0 {
        let rv = load::annotate(client, mode, svc.index, tick).await?;
        return Ok(Change {
            svc: svc.index,
            relevant,
            kind: "annotation",
            rv,
            before,
            after: before,
        });
    }
    if let Some(pos) = svc.eps.iter().position(|e| !e.ready) {
        svc.eps.remove(pos);
    } else {
        *extra += 1;
        svc.eps.push(load::Ep {
            ip: load::extra_ip(*extra),
            ready: false,
        });
    }
    let rv = load::update(client, mode, svc).await?;
    Ok(Change {
        svc: svc.index,
        relevant,
        kind: "not_ready_flap",
        rv,
        before,
        after: ready_set(svc),
    })
}

/// Drives `p.rate` changes/s for `p.seconds`, spread over the services by 16
/// workers (one service always belongs to the same worker, so its changes stay
/// ordered). Returns the changes made and the real duration.
async fn drive(
    client: &kube::Client,
    mode: Mode,
    svcs: Vec<Svc>,
    p: &ChurnParams,
) -> Result<(Vec<Change>, Vec<Svc>, f64)> {
    const WORKERS: usize = 16;
    let mut per_worker: Vec<Vec<Svc>> = (0..WORKERS).map(|_| Vec::new()).collect();
    for s in svcs {
        per_worker[s.index % WORKERS].push(s);
    }
    let mut txs = Vec::new();
    let mut handles = Vec::new();
    for (w, owned) in per_worker.into_iter().enumerate() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, bool, u64)>();
        txs.push(tx);
        let client = client.clone();
        handles.push(tokio::spawn(async move {
            let mut by_index: HashMap<usize, Svc> =
                owned.into_iter().map(|s| (s.index, s)).collect();
            let mut rng = Rng::new(0x9E37_79B9 + w as u64);
            let mut extra = (w as u32) << 20;
            let mut out = Vec::new();
            while let Some((i, relevant, tick)) = rx.recv().await {
                let Some(svc) = by_index.get_mut(&i) else {
                    continue;
                };
                out.push(
                    apply_change(&client, mode, svc, relevant, &mut rng, &mut extra, tick).await?,
                );
            }
            anyhow::Ok((out, by_index.into_values().collect::<Vec<_>>()))
        }));
    }
    let mut rng = Rng::new(42);
    let start = Instant::now();
    let mut sent: u64 = 0;
    let mut iv = tokio::time::interval(Duration::from_millis(10));
    loop {
        iv.tick().await;
        let el = start.elapsed().as_secs_f64();
        if el >= p.seconds {
            break;
        }
        let due = (el * p.rate) as u64;
        while sent < due {
            sent += 1;
            let relevant = p.irrelevant == 0 || !rng.chance(p.irrelevant_share);
            let i = if relevant {
                rng.below(p.relevant)
            } else {
                p.relevant + rng.below(p.irrelevant)
            };
            txs[i % WORKERS]
                .send((i, relevant, sent))
                .context("worker gone")?;
        }
    }
    drop(txs);
    let mut changes = Vec::new();
    let mut finals = Vec::new();
    for h in handles {
        let (c, f) = h.await.context("worker panicked")??;
        changes.extend(c);
        finals.extend(f);
    }
    Ok((changes, finals, start.elapsed().as_secs_f64()))
}

/// First time in `sorted` at or after `t`.
fn first_at_or_after(sorted: &[u64], t: u64) -> Option<u64> {
    let i = sorted.partition_point(|&x| x < t);
    sorted.get(i).copied()
}

/// The time of the echo client's first ConfigMap write that reflects a source
/// write at time `t` with revision `rv`; `writes` are `(time, revision)`,
/// sorted by time. By revision where the log has them: the real API server's
/// log times a write by its answer, and the echo of a write can be answered
/// before the write itself (then it counts at `t`, latency 0).
fn echo_write(writes: &[(u64, u64)], t: u64, rv: u64) -> Option<u64> {
    if rv != 0 && writes.iter().all(|&(_, r)| r != 0) {
        return writes
            .iter()
            .filter(|&&(_, r)| r > rv)
            .min_by_key(|&&(_, r)| r)
            .map(|&(x, _)| x.max(t));
    }
    let i = writes.partition_point(|&(x, _)| x < t);
    writes.get(i).map(|&(x, _)| x)
}

/// Scenarios 2 and 3: churn with the controller and the echo client running
/// side by side on the same load.
pub async fn churn(opts: &Opts, mode: Mode, p: &ChurnParams) -> Result<Value> {
    let env = Env::start(opts.apiserver, opts.controller_user.as_deref(), 100_000).await?;
    let total = p.relevant + p.irrelevant;
    let svcs = load::services(total, p.per);
    load::create_all(&env.client, mode, &svcs, 32).await?;
    let rv_setup = env.rv().await?;
    let mut c = start_controller(&env, opts, mode, "churn").await?;
    wait_ready(&mut c, opts.timeout).await?;
    let names: Vec<(String, u64)> = (0..total).map(|i| (load::svc_name(i), 0)).collect();
    wait_ds_written(&env, rv_setup, &names, &mut c, opts.timeout).await?;
    let kc = env.kubeconfig()?;
    let mut echo = Child::echo(&kc, mode == Mode::Slices, &env.path("echo.log")).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let rv0 = env.rv().await?;
    let m0 = c.get("/metrics").await?.1;
    let (c0, e0) = (c.sample()?, echo.sample()?);
    let load_start = now_nanos();
    let (changes, finals, load_s) = drive(&env.client, mode, svcs, p).await?;
    // Settle: until the write log stops growing for 1 s (bounded).
    let mut last_len = 0usize;
    let mut stable_since = Instant::now();
    let settle_start = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        c.sample()?;
        echo.sample()?;
        let n = env.writes_since(rv0).await?.len();
        if n != last_len {
            last_len = n;
            stable_since = Instant::now();
        } else if stable_since.elapsed() >= Duration::from_secs(1) {
            break;
        }
        if settle_start.elapsed() > opts.timeout {
            bail!(
                "writes still growing {:?} after the load ended",
                opts.timeout
            );
        }
    }
    let (c1, e1) = (c.sample()?, echo.sample()?);
    let m1 = c.get("/metrics").await?.1;
    let mismatches = final_mismatches(&env, &finals).await?;
    let ws = env.writes_since(rv0).await?;

    let src_time: HashMap<u64, u64> = ws
        .iter()
        .filter(|w| w.resource == mode.plural())
        .map(|w| (w.resource_version, w.time_nanos))
        .collect();
    let mut ds_times: HashMap<&str, Vec<u64>> = HashMap::new();
    let mut cm_times: HashMap<&str, Vec<(u64, u64)>> = HashMap::new();
    for w in &ws {
        match w.resource.as_str() {
            "discoveredservices" => ds_times
                .entry(w.name.as_str())
                .or_default()
                .push(w.time_nanos),
            "configmaps" => cm_times
                .entry(w.name.as_str())
                .or_default()
                .push((w.time_nanos, w.resource_version)),
            _ => {}
        }
    }
    for v in ds_times.values_mut() {
        v.sort_unstable();
    }
    for v in cm_times.values_mut() {
        v.sort_unstable();
    }
    let relevant: Vec<&Change> = changes.iter().filter(|c| c.relevant).collect();
    // Each service's changes in order, with their source write times.
    let mut by_svc: HashMap<usize, Vec<(u64, &Change)>> = HashMap::new();
    for ch in &changes {
        let Some(&t) = src_time.get(&ch.rv) else {
            bail!("source write rv {} missing from the write log", ch.rv)
        };
        by_svc.entry(ch.svc).or_default().push((t, ch));
    }
    for v in by_svc.values_mut() {
        v.sort_unstable_by_key(|(t, ch)| (*t, ch.rv));
    }
    let mut ctl_lat = Vec::new();
    let mut echo_lat = Vec::new();
    let (mut ctl_missing, mut echo_missing, mut undone) = (0usize, 0usize, 0usize);
    let mut slowest: Vec<(f64, u64, &Change)> = Vec::new();
    for ch in &relevant {
        let t = src_time[&ch.rv];
        let ds = ds_times
            .get(load::svc_name(ch.svc).as_str())
            .and_then(|v| first_at_or_after(v, t));
        // The changes of this service between its previous DiscoveredService
        // write and its next one form a group; when the ready addresses after
        // this change or a later one of the group equal those before the
        // group's first change (a ready flip and back, an add and its removal),
        // the controller correctly had nothing to write for this change and
        // the next write, if any, belongs to a later change. Such changes are
        // counted apart ("undone"), not as latencies or misses.
        let writes = ds_times.get(load::svc_name(ch.svc).as_str());
        let prev = writes.and_then(|v| v.iter().rev().find(|w| **w < t).copied());
        let group: Vec<&Change> = by_svc[&ch.svc]
            .iter()
            .filter(|(t2, _)| prev.is_none_or(|p| *t2 > p) && ds.is_none_or(|d| *t2 < d))
            .map(|(_, c)| *c)
            .collect();
        let net_zero = group.first().is_some_and(|a| {
            group
                .iter()
                .skip_while(|g| g.rv != ch.rv)
                .any(|b| b.after == a.before)
        });
        if net_zero {
            undone += 1;
        } else {
            match ds {
                Some(d) => {
                    ctl_lat.push((d - t) as f64 / 1e6);
                    slowest.push(((d - t) as f64 / 1e6, t, ch));
                }
                None => ctl_missing += 1,
            }
        }
        let cm_name = format!("echo-{}", load::first_object_name(mode, ch.svc));
        match cm_times
            .get(cm_name.as_str())
            .and_then(|v| echo_write(v, t, ch.rv))
        {
            Some(d) => echo_lat.push((d - t) as f64 / 1e6),
            None => echo_missing += 1,
        }
    }
    let is_relevant_svc = |name: &str| {
        name.strip_prefix("svc-")
            .and_then(|n| n.parse::<usize>().ok())
            .is_some_and(|i| i < p.relevant)
    };
    let ds_relevant_writes: usize = ds_times
        .iter()
        .filter(|(n, _)| is_relevant_svc(n))
        .map(|(_, v)| v.len())
        .sum();
    let ds_irrelevant_writes: usize = ds_times
        .iter()
        .filter(|(n, _)| !is_relevant_svc(n))
        .map(|(_, v)| v.len())
        .sum();
    let echo_writes: usize = cm_times.values().map(Vec::len).sum();
    let applied = metric_sum(&m1, "kube_discovery_writes_total", "result=\"applied\"")
        - metric_sum(&m0, "kube_discovery_writes_total", "result=\"applied\"");
    let skipped = metric_sum(&m1, "kube_discovery_writes_skipped_total", "")
        - metric_sum(&m0, "kube_discovery_writes_skipped_total", "");
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for ch in &changes {
        *kinds.entry(ch.kind).or_default() += 1;
    }
    // The 5 slowest changes, for attributing the tail (seconds since the load began).
    slowest.sort_by(|a, b| b.0.total_cmp(&a.0));
    let slowest: Vec<Value> = slowest
        .iter()
        .take(5)
        .map(|(ms, t, ch)| {
            let rel = |t: u64| secs(t as i128 - load_start as i128);
            let name = load::svc_name(ch.svc);
            // That service's changes and DiscoveredService writes around it.
            let near = |x: u64| x + 2_000_000_000 >= *t && x <= *t + (*ms * 1e6) as u64;
            let changes: Vec<Value> = by_svc[&ch.svc]
                .iter()
                .filter(|(t2, _)| near(*t2))
                .map(|(t2, c)| json!([rel(*t2), c.kind, c.before != c.after]))
                .collect();
            let writes: Vec<f64> = ds_times
                .get(name.as_str())
                .map(|v| v.iter().filter(|x| near(**x)).map(|x| rel(*x)).collect())
                .unwrap_or_default();
            json!({"latency_ms": ms, "at_s": rel(*t), "service": name, "kind": ch.kind,
                   "nearby_changes_s_kind_changed": changes, "nearby_ds_writes_s": writes})
        })
        .collect();
    let n = changes.len().max(1) as f64;
    let ctl_cpu = c1.cpu_s - c0.cpu_s;
    let echo_cpu = e1.cpu_s - e0.cpu_s;
    let ctl_p = percentiles(&mut ctl_lat);
    let echo_p = percentiles(&mut echo_lat);
    let window = opts.window_ms as f64;
    let targets = json!({
        "p99_le_window_plus_50ms": ctl_p["p99"].as_f64().is_some_and(|v| v <= window + 50.0),
        "p99_le_2x_echo_p99_plus_window": match (ctl_p["p99"].as_f64(), echo_p["p99"].as_f64()) { (Some(a), Some(b)) => a <= 2.0 * b + window, _ => false },
        "cpu_le_2x_echo": ctl_cpu <= 2.0 * echo_cpu,
        "writes_per_relevant_change_le_1": (ds_relevant_writes as f64 / relevant.len().max(1) as f64) <= 1.0,
        "irrelevant_writes_zero": ds_irrelevant_writes == 0,
        "final_state_converged": mismatches == 0,
    });
    let ctl_rss = c.max_rss_kib;
    let echo_rss = echo.max_rss_kib;
    // The echo client has no signal handler: SIGTERM ends it with a non-zero status.
    let _ = echo.stop().await;
    c.stop().await?;
    drop(env); // stops kube-sim (and keeps logs with KD_BENCH_KEEP_LOGS)
    Ok(json!({
        "scenario": "churn", "mode": mode.as_str(), "coalesce_window_ms": opts.window_ms,
        "services_relevant": p.relevant, "services_irrelevant": p.irrelevant, "endpoints_per_service": p.per,
        "target_rate": p.rate, "load_s": load_s, "changes": changes.len(), "achieved_rate": changes.len() as f64 / load_s,
        "relevant_changes": relevant.len(), "changes_by_kind": kinds,
        "controller": {
            "latency_ms": ctl_p, "unreflected_changes": ctl_missing, "undone_changes": undone, "slowest": slowest, "final_state_mismatches": mismatches,
            "applies_metric": applied, "skipped_metric": skipped,
            "ds_api_writes_relevant": ds_relevant_writes,
            "applies_per_relevant_change": applied / relevant.len().max(1) as f64,
            "api_writes_per_relevant_change": ds_relevant_writes as f64 / relevant.len().max(1) as f64,
            "ds_api_writes_from_irrelevant": ds_irrelevant_writes,
            "cpu_s": ctl_cpu, "cpu_s_per_1000_changes": ctl_cpu * 1000.0 / n, "max_rss_mib": kib_to_mib(ctl_rss),
        },
        "echo": {
            "latency_ms": echo_p, "unreflected_changes": echo_missing, "api_writes": echo_writes,
            "cpu_s": echo_cpu, "cpu_s_per_1000_changes": echo_cpu * 1000.0 / n, "max_rss_mib": kib_to_mib(echo_rss),
        },
        "ratios": {
            "p50": ratio(&ctl_p["p50"], &echo_p["p50"]), "p99": ratio(&ctl_p["p99"], &echo_p["p99"]),
            "max": ratio(&ctl_p["max"], &echo_p["max"]), "cpu": if echo_cpu > 0.0 { json!(ctl_cpu / echo_cpu) } else { Value::Null },
        },
        "targets_met": targets,
    }))
}

/// Services whose DiscoveredService hosts differ from the ready endpoints the
/// harness last wrote (after the settle time: must be 0).
async fn final_mismatches(env: &Env, finals: &[Svc]) -> Result<usize> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(env.client.clone(), load::NAMESPACE, &dsvc_resource());
    let list = api
        .list(&Default::default())
        .await
        .context("listing DiscoveredServices")?;
    let by_name: HashMap<String, Vec<String>> = list
        .items
        .into_iter()
        .map(|o| {
            let mut hosts: Vec<String> = o.data["spec"]["ports"]["http"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|n| n["host"].as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            hosts.sort();
            (o.metadata.name.unwrap_or_default(), hosts)
        })
        .collect();
    Ok(finals
        .iter()
        .filter(|s| {
            let mut want: Vec<String> = s
                .eps
                .iter()
                .filter(|e| e.ready)
                .map(|e| e.ip.to_string())
                .collect();
            want.sort();
            by_name
                .get(&load::svc_name(s.index))
                .map(Vec::as_slice)
                .unwrap_or(&[])
                != want.as_slice()
        })
        .count())
}

fn ratio(a: &Value, b: &Value) -> Value {
    match (a.as_f64(), b.as_f64()) {
        (Some(a), Some(b)) if b > 0.0 => json!(a / b),
        _ => Value::Null,
    }
}

/// Changes `k` services (adds one ready endpoint each) and returns the
/// `(DiscoveredService name, source write time)` pairs.
pub(crate) async fn touch(
    env: &Env,
    mode: Mode,
    svcs: &mut [Svc],
    k: usize,
    extra: &mut u32,
) -> Result<Vec<(String, u64)>> {
    let mut rvs = Vec::new();
    for s in svcs.iter_mut().take(k) {
        *extra += 1;
        s.eps.push(load::Ep {
            ip: load::extra_ip(*extra),
            ready: true,
        });
        rvs.push((s.index, load::update(&env.client, mode, s).await?));
    }
    let min_rv = rvs
        .iter()
        .map(|(_, rv)| *rv)
        .min()
        .unwrap_or(1)
        .saturating_sub(1);
    let ws = env.writes_since(min_rv).await?;
    let times: HashMap<u64, u64> = ws
        .iter()
        .map(|w| (w.resource_version, w.time_nanos))
        .collect();
    rvs.into_iter()
        .map(|(i, rv)| {
            Ok((
                load::svc_name(i),
                *times
                    .get(&rv)
                    .context("change missing from the write log")?,
            ))
        })
        .collect()
}

/// Scenario 4: idle restart with everything published, forced 410, outage.
pub async fn recovery(
    opts: &Opts,
    mode: Mode,
    count: usize,
    per: usize,
    outage_s: f64,
) -> Result<Value> {
    let env = Env::start(opts.apiserver, opts.controller_user.as_deref(), 10_000).await?;
    let mut svcs = load::services(count, per);
    load::create_all(&env.client, mode, &svcs, 32).await?;
    let rv_setup = env.rv().await?;
    let mut c = start_controller(&env, opts, mode, "first").await?;
    wait_ready(&mut c, opts.timeout).await?;
    let names: Vec<(String, u64)> = (0..count).map(|i| (load::svc_name(i), 0)).collect();
    wait_ds_written(&env, rv_setup, &names, &mut c, opts.timeout).await?;
    c.stop().await?;

    // Idle restart.
    let rv0 = env.rv().await?;
    let req0 = env.request_counts().await?;
    let mut c = start_controller(&env, opts, mode, "restart").await?;
    let ready = wait_ready(&mut c, opts.timeout).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let restart_writes = env.writes_since(rv0).await?.len();
    let (restart_requests, restart_by_verb) = request_diff(&req0, &env.request_counts().await?);
    let restart_sample = c.sample()?;

    let k = count.min(10);
    let mut extra = 0u32;
    // Forced 410: stall the watch, change k services behind its back, then
    // compact the history and drop every watch: resuming gets 410 Gone and the
    // controller must relist. Reconvergence is timed from the compaction.
    let m0 = c.get("/metrics").await?.1;
    let rv_f = env.rv().await?;
    env.fault(json!({"stallWatchesSeconds": 60})).await?;
    let touched = touch(&env, mode, &mut svcs, k, &mut extra).await?;
    let t_f = now_nanos();
    env.fault(json!({"clear": true, "compact": true, "dropWatches": true}))
        .await?;
    let ws = wait_ds_written(&env, rv_f, &touched, &mut c, opts.timeout).await?;
    let last = ds_writes(&ws).map(|w| w.time_nanos).max().unwrap_or(t_f);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after_410 = env.writes_since(rv_f).await?;
    let rewritten_410: std::collections::BTreeSet<&str> =
        ds_writes(&after_410).map(|w| w.name.as_str()).collect();
    let m1 = c.get("/metrics").await?.1;
    let relists = metric_sum(&m1, "kube_discovery_watch_events_total", "type=\"relist\"")
        - metric_sum(&m0, "kube_discovery_watch_events_total", "type=\"relist\"");
    let restarts = metric_sum(&m1, "kube_discovery_watch_restarts_total", "")
        - metric_sum(&m0, "kube_discovery_watch_restarts_total", "");

    // Outage: refuse connections for outage_s, then change k services as soon
    // as the API server answers again.
    env.fault(json!({"refuseConnectionsSeconds": outage_s}))
        .await?;
    let t_out = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(outage_s)).await;
    loop {
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(500), env.rv()).await {
            break;
        }
        if t_out.elapsed() > opts.timeout + Duration::from_secs_f64(outage_s) {
            bail!("kube-sim did not answer after the outage");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let t_back = now_nanos();
    let rv_b = env.rv().await?;
    let mut rest: Vec<Svc> = svcs.split_off(k.min(svcs.len()));
    let touched_b = touch(&env, mode, &mut rest, k, &mut extra).await?;
    let ws_b = wait_ds_written(&env, rv_b, &touched_b, &mut c, opts.timeout).await?;
    let last_b = ds_writes(&ws_b)
        .map(|w| w.time_nanos)
        .max()
        .unwrap_or(t_back);
    let m2 = c.get("/metrics").await?.1;
    let restarts_b = metric_sum(&m2, "kube_discovery_watch_restarts_total", "")
        - metric_sum(&m1, "kube_discovery_watch_restarts_total", "");
    c.stop().await?;
    drop(env); // stops kube-sim (and keeps logs with KD_BENCH_KEEP_LOGS)
    Ok(json!({
        "scenario": "recovery", "mode": mode.as_str(), "services": count, "endpoints_per_service": per,
        "idle_restart": {"ready_s": ready.as_secs_f64(), "api_writes": restart_writes, "api_requests": restart_requests,
                         "api_requests_by_verb": restart_by_verb, "rss_mib": kib_to_mib(restart_sample.rss_kib)},
        "forced_410": {"changed_services": k, "reconverge_s": secs(last as i128 - t_f as i128),
                       "services_rewritten": rewritten_410.len(), "ds_api_writes": ds_writes(&after_410).count(),
                       "relist_events_metric": relists, "watch_restarts_metric": restarts},
        "outage": {"seconds": outage_s, "changed_services": k, "reconverge_s": secs(last_b as i128 - t_back as i128),
                   "watch_restarts_metric": restarts_b},
        "targets_met": {"idle_restart_zero_writes": restart_writes == 0,
                        "reconverge_410_le_2s": secs(last as i128 - t_f as i128) <= 2.0,
                        "reconverge_outage_le_2s": secs(last_b as i128 - t_back as i128) <= 2.0},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seen on the real API server under load: the echo client's write of
    /// revision 479, caused by the source write of revision 478, answered
    /// 1.7 ms before that source write's own answer.
    #[test]
    fn an_echo_answered_before_its_source_write_still_reflects_it() {
        let t = 1_796_626_717_947_154_000;
        let writes = [
            (t - 1_646_658_816, 306),
            (t - 248_939_008, 443),
            (t - 1_691_904, 479),
        ];
        assert_eq!(echo_write(&writes, t, 478), Some(t));
        // An older write answered later does not reflect it.
        let writes = [(t - 1_691_904, 443), (t + 2_000_000, 479)];
        assert_eq!(echo_write(&writes, t, 478), Some(t + 2_000_000));
        assert_eq!(echo_write(&[(t + 5, 443)], t, 478), None);
        // Without revisions (a log that has none): by time.
        assert_eq!(echo_write(&[(t - 1, 0), (t + 7, 0)], t, 478), Some(t + 7));
    }
}
