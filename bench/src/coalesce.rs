//! The scenarios of issue 31's coalescing (a change to a quiet service is
//! written at once, what follows within the window becomes one write at its
//! end). Measured like the churn scenario: times from kube-sim's write log,
//! a change's latency = the first DiscoveredService write of its service
//! committed at or after the source write.
//!
//! * `lone`: changes (one endpoint added) to random services, one at a time
//!   and spaced well over the coalescing window, so every change meets a
//!   quiet service: latency p50/p99 and writes per change.
//! * `rollout`: every service rolled at once as the EndpointSlice controller
//!   writes a Deployment's rollout with `maxSurge: 1, maxUnavailable: 0`:
//!   a new Pod appears not ready, turns ready `startup_ms` later, then
//!   (`react_ms` later: the Deployment controller's reaction) an old Pod
//!   turns terminating (not ready) and the next new Pod appears, and the old
//!   one disappears `grace_ms` after it started terminating. Two variants:
//!   `paced` (Pods start slower than the window: each step is a small burst
//!   of its own) and `burst` (Pods ready at once: the whole rollout is one
//!   burst). Writes per rollout and per relevant change (a change of the
//!   ready addresses), and the latency of the relevant changes.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::env::Env;
use crate::load::{self, Ep, Mode, Svc};
use crate::scenarios::{
    Opts, ds_node_count, ds_writes, start_controller, wait_ds_written, wait_ready,
};
use crate::stats::{Rng, percentiles};

/// Sizes of the two scenarios.
#[derive(Debug, Clone)]
pub struct CoalesceParams {
    /// `lone`: services, and changes made.
    pub lone_services: usize,
    pub lone_changes: usize,
    /// `rollout`: services (Deployments) rolled at once, Pods of each.
    pub rollout_services: usize,
    pub replicas: usize,
    /// Grace period of an old Pod (terminating until it disappears).
    pub grace_ms: u64,
}

/// The time between two lone changes: well over the window.
fn lone_gap(opts: &Opts) -> Duration {
    Duration::from_millis((opts.window_ms * 5).max(300))
}

/// Starts kube-sim with `count` services of `per` ready endpoints and a
/// controller that wrote them all; returns the revision to read writes from.
async fn setup(
    opts: &Opts,
    mode: Mode,
    tag: &str,
    count: usize,
    per: usize,
) -> Result<(Env, crate::child::Child, Vec<Svc>)> {
    let env = Env::start(opts.apiserver, opts.controller_user.as_deref(), 100_000).await?;
    let svcs = load::services(count, per);
    load::create_all(&env.client, mode, &svcs, 32).await?;
    let rv_setup = env.rv().await?;
    let mut c = start_controller(&env, opts, mode, tag).await?;
    wait_ready(&mut c, opts.timeout).await?;
    let names: Vec<(String, u64)> = (0..count).map(|i| (load::svc_name(i), 0)).collect();
    wait_ds_written(&env, rv_setup, &names, &mut c, opts.timeout).await?;
    // Past every window of the first sync: the services are quiet.
    tokio::time::sleep(Duration::from_millis(opts.window_ms * 3 + 500)).await;
    Ok((env, c, svcs))
}

/// The source write times by revision, and each service's DiscoveredService
/// write times (sorted), of the writes after `rv0`.
async fn write_times(
    env: &Env,
    mode: Mode,
    rv0: u64,
) -> Result<(HashMap<u64, u64>, HashMap<String, Vec<u64>>)> {
    let ws = env.writes_since(rv0).await?;
    let src = ws
        .iter()
        .filter(|w| w.resource == mode.plural())
        .map(|w| (w.resource_version, w.time_nanos))
        .collect();
    let mut ds: HashMap<String, Vec<u64>> = HashMap::new();
    for w in ds_writes(&ws) {
        ds.entry(w.name.clone()).or_default().push(w.time_nanos);
    }
    for v in ds.values_mut() {
        v.sort_unstable();
    }
    Ok((src, ds))
}

/// Latencies (ms) of the changes `(service, revision)`, and how many had no
/// later write.
fn latencies(
    changes: &[(usize, u64)],
    src: &HashMap<u64, u64>,
    ds: &HashMap<String, Vec<u64>>,
) -> Result<(Vec<f64>, usize)> {
    let (mut lat, mut missing) = (Vec::new(), 0);
    for (svc, rv) in changes {
        let t = *src
            .get(rv)
            .with_context(|| format!("source write rv {rv} missing from the write log"))?;
        let first = ds.get(&load::svc_name(*svc)).and_then(|v| {
            let i = v.partition_point(|&x| x < t);
            v.get(i).copied()
        });
        match first {
            Some(w) => lat.push((w - t) as f64 / 1e6),
            None => missing += 1,
        }
    }
    Ok((lat, missing))
}

/// Waits until the write log stopped growing for a second (bounded).
async fn settle(env: &Env, rv0: u64, c: &mut crate::child::Child, timeout: Duration) -> Result<()> {
    let (mut last, mut stable) = (usize::MAX, Instant::now());
    let t0 = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        c.sample()?;
        let n = env.writes_since(rv0).await?.len();
        if n != last {
            last = n;
            stable = Instant::now();
        } else if stable.elapsed() >= Duration::from_secs(1) {
            return Ok(());
        }
        anyhow::ensure!(
            t0.elapsed() < timeout,
            "writes still growing after {timeout:?}"
        );
    }
}

/// Scenario `lone`.
pub async fn lone(opts: &Opts, mode: Mode, p: &CoalesceParams) -> Result<Value> {
    let (env, mut c, mut svcs) = setup(opts, mode, "lone", p.lone_services, 3).await?;
    let rv0 = env.rv().await?;
    let gap = lone_gap(opts);
    let mut rng = Rng::new(31);
    let mut changes = Vec::new();
    for k in 0..p.lone_changes {
        let i = rng.below(svcs.len());
        svcs[i].eps.push(Ep {
            ip: load::extra_ip(k as u32),
            ready: true,
        });
        changes.push((i, load::update(&env.client, mode, &svcs[i]).await?));
        c.sample()?;
        tokio::time::sleep(gap).await;
    }
    settle(&env, rv0, &mut c, opts.timeout).await?;
    let (src, ds) = write_times(&env, mode, rv0).await?;
    let (mut lat, unreflected) = latencies(&changes, &src, &ds)?;
    let writes: usize = ds.values().map(Vec::len).sum();
    c.stop().await?;
    drop(env);
    Ok(json!({
        "scenario": "lone", "mode": mode.as_str(), "services": p.lone_services,
        "changes": changes.len(), "gap_ms": gap.as_millis() as u64,
        "latency_ms": percentiles(&mut lat), "unreflected": unreflected,
        "ds_api_writes": writes,
        "ds_writes_per_change": writes as f64 / changes.len().max(1) as f64,
    }))
}

/// What happens to one service's endpoints at one moment of its rollout.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// A new Pod appears, not ready.
    Create(u32),
    /// A new Pod turns ready.
    Ready(u32),
    /// Old Pod `j` (its index in the initial endpoints) starts terminating.
    Terminate(usize),
    /// Old Pod `j` is gone.
    Gone(usize),
}

/// The steps of one service's rollout, at offsets (ms) from its start;
/// new Pods' addresses are `first_new..first_new + replicas`.
fn rollout_steps(
    replicas: usize,
    first_new: u32,
    startup_ms: u64,
    react_ms: u64,
    grace_ms: u64,
) -> Vec<(u64, Step)> {
    let mut steps = vec![(0, Step::Create(first_new))];
    let mut created = 0;
    for k in 0..replicas {
        let ready = created + startup_ms;
        let term = ready + react_ms;
        steps.push((ready, Step::Ready(first_new + k as u32)));
        steps.push((term, Step::Terminate(k)));
        steps.push((term + grace_ms, Step::Gone(k)));
        if k + 1 < replicas {
            steps.push((term, Step::Create(first_new + k as u32 + 1)));
        }
        created = term;
    }
    steps
}

/// Fingerprint of the ready addresses.
fn ready_set(svc: &Svc) -> Vec<std::net::Ipv4Addr> {
    let mut ips: Vec<_> = svc.eps.iter().filter(|e| e.ready).map(|e| e.ip).collect();
    ips.sort_unstable();
    ips
}

/// Scenario `rollout` (one variant).
pub async fn rollout(
    opts: &Opts,
    mode: Mode,
    p: &CoalesceParams,
    variant: &str,
    startup_ms: u64,
    react_ms: u64,
) -> Result<Value> {
    let n = p.rollout_services;
    let (env, mut c, mut svcs) = setup(opts, mode, "rollout", n, p.replicas).await?;
    let old: Vec<Vec<std::net::Ipv4Addr>> = svcs
        .iter()
        .map(|s| s.eps.iter().map(|e| e.ip).collect())
        .collect();
    // Every service's steps on one time line (services start 3 ms apart);
    // the steps of a service at the same moment are one source write.
    let mut timeline: BTreeMap<(u64, usize), Vec<Step>> = BTreeMap::new();
    for i in 0..n {
        let first_new = (i * p.replicas) as u32;
        for (t, s) in rollout_steps(p.replicas, first_new, startup_ms, react_ms, p.grace_ms) {
            timeline.entry((t + 3 * i as u64, i)).or_default().push(s);
        }
    }
    let rv0 = env.rv().await?;
    let t0 = Instant::now();
    let (mut relevant, mut source_writes) = (Vec::new(), 0usize);
    for ((at, i), steps) in timeline {
        tokio::time::sleep_until(t0 + Duration::from_millis(at)).await;
        let svc = &mut svcs[i];
        let before = ready_set(svc);
        for s in steps {
            match s {
                Step::Create(k) => svc.eps.push(Ep {
                    ip: load::extra_ip(k),
                    ready: false,
                }),
                Step::Ready(k) => {
                    let ip = load::extra_ip(k);
                    svc.eps
                        .iter_mut()
                        .filter(|e| e.ip == ip)
                        .for_each(|e| e.ready = true);
                }
                Step::Terminate(j) => {
                    let ip = old[i][j];
                    svc.eps
                        .iter_mut()
                        .filter(|e| e.ip == ip)
                        .for_each(|e| e.ready = false);
                }
                Step::Gone(j) => {
                    let ip = old[i][j];
                    svc.eps.retain(|e| e.ip != ip);
                }
            }
        }
        let rv = load::update(&env.client, mode, svc).await?;
        source_writes += 1;
        if ready_set(svc) != before {
            relevant.push((i, rv));
        }
    }
    let load_s = t0.elapsed().as_secs_f64();
    settle(&env, rv0, &mut c, opts.timeout).await?;
    let (src, ds) = write_times(&env, mode, rv0).await?;
    let (mut lat, unreflected) = latencies(&relevant, &src, &ds)?;
    let writes: usize = ds.values().map(Vec::len).sum();
    let mut wrong = 0;
    for i in 0..n {
        if ds_node_count(&env, &load::svc_name(i)).await? != p.replicas {
            wrong += 1;
        }
    }
    c.stop().await?;
    drop(env);
    Ok(json!({
        "scenario": "rollout", "variant": variant, "mode": mode.as_str(),
        "services": n, "replicas": p.replicas, "startup_ms": startup_ms,
        "react_ms": react_ms, "grace_ms": p.grace_ms, "load_s": load_s,
        "source_writes": source_writes, "relevant_changes": relevant.len(),
        "ds_api_writes": writes,
        "ds_writes_per_rollout": writes as f64 / n.max(1) as f64,
        "ds_writes_per_relevant_change": writes as f64 / relevant.len().max(1) as f64,
        "latency_ms": percentiles(&mut lat), "unreflected": unreflected,
        "final_state_mismatches": wrong,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rollout_replaces_every_pod_one_at_a_time() {
        let steps = rollout_steps(3, 10, 500, 20, 1000);
        let at = |want: &str| -> Vec<u64> {
            steps
                .iter()
                .filter(|(_, s)| format!("{s:?}").starts_with(want))
                .map(|(t, _)| *t)
                .collect()
        };
        assert_eq!(at("Create"), [0, 520, 1040]);
        assert_eq!(at("Ready"), [500, 1020, 1540]);
        assert_eq!(at("Terminate"), [520, 1040, 1560]);
        assert_eq!(at("Gone"), [1520, 2040, 2560]);
    }
}
