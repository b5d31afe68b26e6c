//! Scenario 5 (issue 19, item 1): many clusters. `clusters` kube-sims (one
//! per cluster, all in this process), each holding `count` services x `per`
//! endpoints as EndpointSlices, and ONE controller with the multi-cluster
//! configuration (ids `c0`, `c1`, ...) writing every DiscoveredService to the
//! home cluster, `c0` (also a source cluster, as when the controller runs in
//! one of them). Measured:
//!
//! * **first sync**: from the controller's start until every
//!   DiscoveredService (`c<k>.svc-<i>` in `default` of the home cluster) is
//!   written and `/readyz` answers 200; peak RSS and CPU of the controller;
//! * **idle restart**: a second controller over the same state; the
//!   DiscoveredService writes it makes (target 0);
//! * **one cluster away and back**: the last cluster's watch is stalled,
//!   `changed` of its services change behind its back, then its history is
//!   compacted, its watches dropped and its connections refused for
//!   `outage_s`; when it answers again the controller must relist it and
//!   rewrite exactly the changed services. Counted: the services rewritten
//!   in the home cluster from the outage until 2 s after the last expected
//!   write (target: exactly the changed ones, nothing of other clusters).
//!
//! kube-sim only: ten real control planes (etcd + kube-apiserver each) do not
//! fit a 2-core machine next to the controller, and the outage needs
//! kube-sim's faults in the controller's path.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::child::{Child, metric_sum};
use crate::env::{Backend, Env, Write};
use crate::load::{self, Mode, Svc};
use crate::scenarios::{Opts, kib_to_mib, now_nanos, secs, touch, wait_ready};

/// The DiscoveredService name of service `i` of cluster `k` (multi-cluster
/// naming in the source namespace: `<id>.<name>`).
fn ds_name(k: usize, svc: &str) -> String {
    format!("c{k}.{svc}")
}

/// The multi-cluster controller configuration over `envs` (home: the
/// first).
fn config(envs: &[Env], opts: &Opts) -> Result<String> {
    let mut text = String::from("discovery:\n  kubernetes:\n");
    for (k, env) in envs.iter().enumerate() {
        text.push_str(&env.cluster_entry(&format!("c{k}"))?);
    }
    let home = envs.first().context("no cluster")?;
    text.push_str(&format!(
        "kube_discovery:\n  home:\n    kubeconfig: {}\n{}",
        home.kubeconfig()?.display(),
        opts.kube_discovery_block()
    ));
    Ok(text)
}

/// The DiscoveredService writes of the home cluster's write log, read
/// incrementally (the log of a million-endpoint sync is long; re-reading it
/// every poll would load the machine being measured).
struct DsLog {
    next: u64,
    /// Last write time per object name.
    last: HashMap<String, u64>,
    /// Every write, in order.
    all: Vec<Write>,
}

impl DsLog {
    fn since(mark: u64) -> Self {
        DsLog {
            next: mark,
            last: HashMap::new(),
            all: Vec::new(),
        }
    }

    async fn poll(&mut self, env: &Env) -> Result<()> {
        let ws = env.writes_since(self.next).await?;
        for w in ws {
            self.next = self.next.max(w.resource_version);
            if w.resource == "discoveredservices" {
                let e = self.last.entry(w.name.clone()).or_default();
                *e = (*e).max(w.time_nanos);
                self.all.push(w);
            }
        }
        Ok(())
    }

    /// Polls until every `(name, not before)` has a write at or after its
    /// time.
    async fn wait(
        &mut self,
        env: &Env,
        names: &[(String, u64)],
        c: &mut Child,
        timeout: Duration,
    ) -> Result<()> {
        let t0 = Instant::now();
        loop {
            c.sample()?;
            self.poll(env).await?;
            let missing = names
                .iter()
                .filter(|(n, t)| self.last.get(n).is_none_or(|l| l < t))
                .count();
            if missing == 0 {
                return Ok(());
            }
            if t0.elapsed() > timeout {
                bail!(
                    "{missing} DiscoveredServices not written within {timeout:?}:\n{}",
                    c.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    fn last_time(&self) -> Option<u64> {
        self.all.iter().map(|w| w.time_nanos).max()
    }
}

/// Scenario 5 (see the module docs).
pub async fn multi(
    opts: &Opts,
    clusters: usize,
    count: usize,
    per: usize,
    changed: usize,
    outage_s: f64,
) -> Result<Value> {
    if opts.apiserver != Backend::Sim {
        bail!("multi: kube-sim only (see the scenario's docs)");
    }
    if clusters < 2 {
        bail!("multi: needs at least 2 clusters, got {clusters}");
    }
    let mut envs = Vec::with_capacity(clusters);
    for _ in 0..clusters {
        envs.push(Env::start(opts.apiserver, opts.controller_user.as_deref(), 10_000).await?);
    }
    let mut svcs: Vec<Vec<Svc>> = (0..clusters).map(|_| load::services(count, per)).collect();
    let t = Instant::now();
    let mut objects = 0;
    for (env, s) in envs.iter().zip(&svcs) {
        objects += load::create_all(&env.client, Mode::Slices, s, 32).await?;
    }
    let create_s = t.elapsed().as_secs_f64();
    let cfg = envs[0].path("multi.yaml");
    std::fs::write(&cfg, config(&envs, opts)?)?;
    let home = &envs[0];
    let names: Vec<(String, u64)> = (0..clusters)
        .flat_map(|k| (0..count).map(move |i| (ds_name(k, &load::svc_name(i)), 0)))
        .collect();

    // First sync.
    let mut log = DsLog::since(home.rv().await?);
    let t0_wall = now_nanos();
    let mut c = Child::controller(&opts.bin, &cfg, &home.path("multi-first.log")).await?;
    let ready = wait_ready(&mut c, opts.timeout).await?;
    log.wait(home, &names, &mut c, opts.timeout).await?;
    let end = c.sample()?;
    let sync_s = ready.as_secs_f64().max(secs(
        log.last_time().unwrap_or(t0_wall) as i128 - t0_wall as i128,
    ));
    let first_writes = log.all.len();
    let metrics = c.get("/metrics").await.map(|(_, b)| b).unwrap_or_default();
    let hwm = end.hwm_kib.max(c.max_rss_kib);
    let endpoints = clusters * count * per;
    c.stop().await?;

    // Idle restart.
    let mut idle = DsLog::since(home.rv().await?);
    let mut c = Child::controller(&opts.bin, &cfg, &home.path("multi-restart.log")).await?;
    let restart_ready = wait_ready(&mut c, opts.timeout).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    idle.poll(home).await?;
    let restart_sample = c.sample()?;

    // One cluster away and back.
    let k = clusters - 1;
    let away = &envs[k];
    let changed = changed.min(count);
    let mut back = DsLog::since(home.rv().await?);
    let m0 = c.get("/metrics").await?.1;
    away.fault(json!({"stallWatchesSeconds": 600})).await?;
    let mut extra = 0u32;
    let touched = touch(away, Mode::Slices, &mut svcs[k], changed, &mut extra).await?;
    away.fault(json!({"clear": true, "compact": true, "dropWatches": true, "refuseConnectionsSeconds": outage_s}))
        .await?;
    let t_out = now_nanos();
    let want: Vec<(String, u64)> = touched.iter().map(|(n, t)| (ds_name(k, n), *t)).collect();
    back.wait(
        home,
        &want,
        &mut c,
        opts.timeout + Duration::from_secs_f64(outage_s),
    )
    .await?;
    let last_back = back.last_time().unwrap_or(t_out);
    tokio::time::sleep(Duration::from_secs(2)).await;
    back.poll(home).await?;
    let m1 = c.get("/metrics").await?.1;
    let rewritten: BTreeSet<&str> = back.all.iter().map(|w| w.name.as_str()).collect();
    let wanted: BTreeSet<&str> = want.iter().map(|(n, _)| n.as_str()).collect();
    let relists = metric_sum(&m1, "kube_discovery_watch_events_total", "type=\"relist\"")
        - metric_sum(&m0, "kube_discovery_watch_events_total", "type=\"relist\"");
    c.stop().await?;
    drop(envs); // stops every kube-sim (and keeps logs with KD_BENCH_KEEP_LOGS)
    Ok(json!({
        "scenario": "multi", "mode": "slices", "clusters": clusters, "services_per_cluster": count,
        "endpoints_per_service": per, "services": clusters * count, "endpoints": endpoints,
        "source_objects": objects, "create_s": create_s,
        "first_sync": {"ready_s": ready.as_secs_f64(), "sync_s": sync_s, "peak_rss_mib": kib_to_mib(hwm),
                       "rss_bytes_per_endpoint": hwm as f64 * 1024.0 / endpoints as f64,
                       "cpu_s": end.cpu_s, "ds_api_writes": first_writes,
                       "applied_metric": metric_sum(&metrics, "kube_discovery_writes_total", "result=\"applied\"")},
        "idle_restart": {"ready_s": restart_ready.as_secs_f64(), "ds_api_writes": idle.all.len(),
                         "rss_mib": kib_to_mib(restart_sample.rss_kib)},
        "cluster_away_and_back": {"cluster": format!("c{k}"), "outage_s": outage_s, "changed_services": changed,
                                  "reconverge_s": secs(last_back as i128 - t_out as i128) - outage_s,
                                  "services_rewritten": rewritten.len(),
                                  "only_the_changed_rewritten": rewritten == wanted,
                                  "ds_api_writes": back.all.len(), "relist_events_metric": relists},
        "targets_met": {"first_sync_le_60s": sync_s <= 60.0, "peak_rss_le_300mib": hwm <= 300 * 1024,
                        "idle_restart_zero_writes": idle.all.is_empty(),
                        "away_and_back_rewrites_only_the_changed": rewritten == wanted},
    }))
}
