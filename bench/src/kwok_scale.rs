//! Scenario `kwok-scale` (issue 31): the controller against a cluster that
//! behaves like one at size. The real control plane with the Deployment,
//! ReplicaSet and EndpointSlice controllers, kube-scheduler and kwok (no Pod
//! network: Pods are only data, see `testenv::kwok::Options::answer`) runs
//! `deployments` Deployments of `replicas` Pods behind one Service each, over
//! three zones. Steps:
//!
//! 1. **cluster**: create everything, wait until every Pod is Ready;
//! 2. **first sync**: start the controller, wait until every
//!    DiscoveredService holds exactly the ready Pod IPs of its Service;
//! 3. **rolling**: restart `rolling` Deployments at once (what
//!    `kubectl rollout restart` writes), wait until they are done and every
//!    DiscoveredService again equals the ready Pod IPs.
//!
//! The check after each step compares a reflector of the Pods with a
//! reflector of the DiscoveredServices (both in this process, one clock);
//! a step fails if they do not agree within the timeout. Each step records
//! its time and the CPU seconds and RSS of the controller next to those of
//! etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube_discovery_core::crd::DiscoveredService;
use serde_json::{Value, json};

use crate::child::{Child, metric_sum};
use crate::env::Env;
use crate::procfs;
use crate::scenarios::{Opts, kib_to_mib, wait_ready};

/// The label every Pod of the scenario carries (the Pod reflector's selector).
const LABEL: &str = "kd-bench";

/// Sizes of the scenario.
#[derive(Debug, Clone, Copy)]
pub struct ScaleParams {
    /// Deployments (and Services), spread over 10 namespaces.
    pub deployments: usize,
    /// Pods per Deployment.
    pub replicas: usize,
    /// Deployments restarted at once in the rolling step.
    pub rolling: usize,
    /// Fake Nodes (over three zones, 250 Pods each at most).
    pub nodes: usize,
    /// `--kube-api-qps` of kube-controller-manager and kube-scheduler.
    pub api_qps: u32,
}

const NAMESPACES: usize = 10;

fn ns_of(i: usize) -> String {
    format!("scale-{}", i % NAMESPACES)
}

fn app_of(i: usize) -> String {
    format!("app-{i:04}")
}

/// One process of the control plane or the controller at one moment.
#[derive(Debug, Clone)]
struct Proc {
    name: String,
    pid: u32,
}

/// The name of the executable of `pid` (`/proc/<pid>/comm` is cut at 15 bytes).
fn exe_name(pid: u32) -> String {
    std::fs::read_link(format!("/proc/{pid}/exe"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| format!("pid-{pid}"))
}

/// CPU seconds (cumulative), RSS and peak RSS of each process.
fn sample_all(procs: &[Proc]) -> Result<BTreeMap<String, procfs::Sample>> {
    procs
        .iter()
        .map(|p| {
            procfs::sample(p.pid)
                .with_context(|| format!("sampling {} ({})", p.name, p.pid))
                .map(|s| (p.name.clone(), s))
        })
        .collect()
}

/// `{process: {cpu_s, rss_mib, peak_rss_mib}}` between two samples (CPU of
/// the step; RSS at its end; peak since the process started).
fn step_usage(
    before: &BTreeMap<String, procfs::Sample>,
    after: &BTreeMap<String, procfs::Sample>,
) -> Value {
    let mut m = serde_json::Map::new();
    for (name, a) in after {
        let cpu0 = before.get(name).map_or(0.0, |b| b.cpu_s);
        m.insert(
            name.clone(),
            json!({"cpu_s": a.cpu_s - cpu0, "rss_mib": kib_to_mib(a.rss_kib), "peak_rss_mib": kib_to_mib(a.hwm_kib)}),
        );
    }
    Value::Object(m)
}

/// `namespace/app` -> the IPs of its Ready, not terminating Pods.
fn wanted(pods: &Store<Pod>) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for p in pods.state() {
        let (Some(ns), Some(app)) = (
            p.metadata.namespace.as_deref(),
            p.metadata.labels.as_ref().and_then(|l| l.get("app")),
        ) else {
            continue;
        };
        let set = out.entry(format!("{ns}/{app}")).or_default();
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let Some(status) = &p.status else { continue };
        let ready = status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        if let (true, Some(ip)) = (ready, &status.pod_ip) {
            set.insert(ip.clone());
        }
    }
    out
}

/// `namespace/name` -> the hosts of port `http` of its DiscoveredService.
fn published(ds: &Store<DiscoveredService>) -> BTreeMap<String, BTreeSet<String>> {
    ds.state()
        .iter()
        .map(|d| {
            let hosts = d
                .spec
                .ports
                .get("http")
                .map(|nodes| nodes.iter().map(|n| n.host.to_string()).collect())
                .unwrap_or_default();
            (
                format!("{}/{}", d.spec.source_namespace, d.spec.source_name),
                hosts,
            )
        })
        .collect()
}

/// Services whose DiscoveredService differs from their ready Pod IPs, and
/// one example (for the error).
fn mismatches(pods: &Store<Pod>, ds: &Store<DiscoveredService>) -> (usize, Option<String>) {
    let want = wanted(pods);
    let have = published(ds);
    let mut n = 0;
    let mut example = None;
    for (svc, ips) in &want {
        let got = have.get(svc);
        if got != Some(ips) {
            n += 1;
            example.get_or_insert_with(|| {
                format!(
                    "{svc}: ready Pods {ips:?}, DiscoveredService {:?}",
                    got.map(|g| g.iter().collect::<Vec<_>>())
                )
            });
        }
    }
    // A DiscoveredService of a service the scenario does not have is wrong too.
    for svc in have.keys().filter(|s| !want.contains_key(*s)) {
        n += 1;
        example.get_or_insert_with(|| format!("{svc}: published, but no such Service"));
    }
    (n, example)
}

/// Polls `done` every 250 ms until it returns `Some`, at most `limit`.
async fn until<T>(
    what: &str,
    limit: Duration,
    mut done: impl FnMut() -> Result<Option<T>>,
) -> Result<(T, Duration)> {
    let t = Instant::now();
    loop {
        if let Some(v) = done()? {
            return Ok((v, t.elapsed()));
        }
        if t.elapsed() > limit {
            bail!("{what}: not within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits until every DiscoveredService equals its Service's ready Pods
/// (the controller and the control plane alive meanwhile); the error names
/// the `step` and one service that differs.
async fn all_equal(
    step: &str,
    limit: Duration,
    cp: &testenv::ControlPlane,
    c: &mut Child,
    pods: &Store<Pod>,
    ds: &Store<DiscoveredService>,
) -> Result<()> {
    let mut last = None;
    let r = until(
        "every DiscoveredService equals its ready Pods",
        limit,
        || {
            cp.check_alive()?;
            c.sample()?;
            let (n, ex) = mismatches(pods, ds);
            last = ex;
            Ok((n == 0).then_some(()))
        },
    )
    .await;
    r.map(drop)
        .with_context(|| format!("{step}; for example {last:?}\n{}", c.log_tail()))
}

fn ready_pods(pods: &Store<Pod>) -> usize {
    wanted(pods).values().map(BTreeSet::len).sum()
}

/// Starts a reflector; returns its store once the first list is in.
async fn reflect<K>(api: Api<K>, cfg: watcher::Config) -> Result<Store<K>>
where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, cfg))
        .default_backoff()
        .applied_objects();
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(r) = stream.next().await {
            if let Err(e) = r {
                tracing::debug!(error = %e, "kd-bench kwok-scale: reflector error");
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(120), reader.wait_until_ready())
        .await
        .context("the reflector's first list took over 120 s")?
        .context("the reflector stopped")?;
    Ok(reader)
}

async fn create_world(env: &Env, p: &ScaleParams) -> Result<()> {
    let client = env.client.clone();
    for n in 0..NAMESPACES.min(p.deployments) {
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": ns_of(n)}}))?;
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("creating namespace {}", ns_of(n)))?;
    }
    futures::stream::iter(0..p.deployments)
        .map(|i| {
            let client = client.clone();
            let replicas = p.replicas;
            async move {
                let (ns, app) = (ns_of(i), app_of(i));
                let svc: Service = serde_json::from_value(json!({
                    "metadata": {"name": app, "namespace": ns},
                    "spec": {"selector": {"app": app}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
                }))?;
                Api::<Service>::namespaced(client.clone(), &ns)
                    .create(&PostParams::default(), &svc)
                    .await
                    .with_context(|| format!("creating Service {ns}/{app}"))?;
                let d: Deployment = serde_json::from_value(json!({
                    "metadata": {"name": app, "namespace": ns},
                    "spec": {
                        "replicas": replicas,
                        "selector": {"matchLabels": {"app": app}},
                        "template": {
                            "metadata": {"labels": {"app": app, LABEL: "scale"}},
                            "spec": {
                                "terminationGracePeriodSeconds": 1,
                                "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                                                "ports": [{"name": "http", "containerPort": 8080}]}],
                            },
                        },
                    },
                }))?;
                Api::<Deployment>::namespaced(client, &ns)
                    .create(&PostParams::default(), &d)
                    .await
                    .with_context(|| format!("creating Deployment {ns}/{app}"))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Deployments `0..n` whose rollout is not finished (the Deployment
/// controller's own verdict, as `kubectl rollout status` reads it).
async fn unfinished(env: &Env, n: usize) -> Result<usize> {
    let mut left = 0;
    for k in 0..NAMESPACES.min(n) {
        let list = Api::<Deployment>::namespaced(env.client.clone(), &ns_of(k))
            .list(&ListParams::default())
            .await
            .context("listing Deployments")?;
        for d in list.items {
            let name = d.metadata.name.clone().unwrap_or_default();
            let index: usize = name
                .strip_prefix("app-")
                .and_then(|s| s.parse().ok())
                .unwrap_or(usize::MAX);
            if index >= n {
                continue;
            }
            let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            let s = d.status.unwrap_or_default();
            let done = s.observed_generation >= d.metadata.generation
                && s.updated_replicas == Some(want)
                && s.replicas == Some(want)
                && s.available_replicas == Some(want);
            if !done {
                left += 1;
            }
        }
    }
    Ok(left)
}

/// Runs the scenario (real control plane with kwok).
pub async fn kwok_scale(opts: &Opts, p: &ScaleParams) -> Result<Value> {
    let kwok = testenv::kwok::Options {
        nodes: p.nodes,
        answer: false,
        api_qps: Some(p.api_qps),
        ..Default::default()
    };
    let env = Env::start_kwok(opts.controller_user.as_deref(), kwok).await?;
    let cp = env
        .api
        .real()
        .context("kwok-scale needs the real control plane")?;
    let mut procs: Vec<Proc> = cp
        .pids()
        .into_iter()
        .map(|pid| Proc {
            name: exe_name(pid),
            pid,
        })
        .collect();
    let pods = reflect(
        Api::<Pod>::all(env.client.clone()),
        watcher::Config::default().labels(&format!("{LABEL}=scale")),
    )
    .await?;
    let limit = opts.timeout;
    let total = p.deployments * p.replicas;

    // 1. The cluster: every Pod Ready.
    let s0 = sample_all(&procs)?;
    let t = Instant::now();
    create_world(&env, p).await?;
    let created_s = t.elapsed().as_secs_f64();
    until("every Pod Ready", limit, || {
        cp.check_alive()?;
        Ok((ready_pods(&pods) == total).then_some(()))
    })
    .await?;
    let cluster_s = t.elapsed().as_secs_f64();
    let s1 = sample_all(&procs)?;

    // 2. First sync.
    let cfg = env.path("scale.yaml");
    std::fs::write(
        &cfg,
        env.controller_config(true, &opts.kube_discovery_block())?,
    )?;
    let t = Instant::now();
    let mut c = Child::controller(&opts.bin, &cfg, &env.path("scale.log")).await?;
    procs.push(Proc {
        name: "kube-discovery".into(),
        pid: c.pid,
    });
    let ready_s = wait_ready(&mut c, limit).await?.as_secs_f64();
    let ds = reflect(
        Api::<DiscoveredService>::all(env.client.clone()),
        watcher::Config::default(),
    )
    .await?;
    all_equal("first sync", limit, cp, &mut c, &pods, &ds).await?;
    let sync_s = t.elapsed().as_secs_f64();
    let s2 = sample_all(&procs)?;
    let writes = |text: &str| metric_sum(text, "kube_discovery_writes_total", "result=\"applied\"");
    let m2 = c.get("/metrics").await.map(|(_, b)| b).unwrap_or_default();

    // 3. Rolling: `rolling` Deployments restarted at once.
    let t = Instant::now();
    let stamp = crate::scenarios::now_nanos().to_string();
    futures::stream::iter(0..p.rolling.min(p.deployments))
        .map(|i| {
            let client = env.client.clone();
            let stamp = stamp.clone();
            async move {
                let patch = json!({"spec": {"template": {"metadata": {"annotations": {
                    "kubectl.kubernetes.io/restartedAt": stamp}}}}});
                Api::<Deployment>::namespaced(client, &ns_of(i))
                    .patch(&app_of(i), &PatchParams::default(), &Patch::Merge(patch))
                    .await
                    .with_context(|| format!("restarting Deployment {}/{}", ns_of(i), app_of(i)))
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
    let patched_s = t.elapsed().as_secs_f64();
    let mut max_mismatched = 0;
    let deadline = Instant::now() + limit;
    let rolled_s = loop {
        cp.check_alive()?;
        c.sample()?;
        max_mismatched = max_mismatched.max(mismatches(&pods, &ds).0);
        if unfinished(&env, p.rolling).await? == 0 {
            break t.elapsed().as_secs_f64();
        }
        if Instant::now() > deadline {
            bail!("the rollouts did not finish within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    // The old Pods end their grace period after the rollout is done.
    until("every old Pod gone", limit, || {
        Ok((pods.state().len() == total).then_some(()))
    })
    .await?;
    let settled_s = t.elapsed().as_secs_f64();
    all_equal("rolling", limit, cp, &mut c, &pods, &ds).await?;
    let converged_s = t.elapsed().as_secs_f64();
    let s3 = sample_all(&procs)?;
    let m3 = c.get("/metrics").await.map(|(_, b)| b).unwrap_or_default();
    let restarted_pods = p.rolling.min(p.deployments) * p.replicas;
    c.stop().await?;
    Ok(json!({
        "scenario": "kwok-scale", "mode": "slices",
        "deployments": p.deployments, "replicas": p.replicas, "pods": total,
        "nodes": p.nodes, "zones": 3, "namespaces": NAMESPACES.min(p.deployments),
        "controller_manager_and_scheduler_api_qps": p.api_qps,
        "cluster": {"create_s": created_s, "all_pods_ready_s": cluster_s, "usage": step_usage(&s0, &s1)},
        "first_sync": {"controller_ready_s": ready_s, "all_equal_s": sync_s,
                       "ds_writes": writes(&m2), "usage": step_usage(&s1, &s2)},
        "rolling": {"deployments": p.rolling.min(p.deployments), "pods_replaced": restarted_pods,
                    "patch_s": patched_s, "rollouts_done_s": rolled_s, "old_pods_gone_s": settled_s,
                    "all_equal_s": converged_s,
                    "max_services_behind_while_rolling": max_mismatched,
                    "ds_writes": writes(&m3) - writes(&m2),
                    "usage": step_usage(&s2, &s3)},
        "controller_peak_rss_mib": kib_to_mib(c_peak(&s3)),
    }))
}

fn c_peak(s: &BTreeMap<String, procfs::Sample>) -> u64 {
    s.get("kube-discovery").map_or(0, |x| x.hwm_kib)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::watcher::Event;

    fn pod(ns: &str, app: &str, name: &str, ip: &str, ready: bool, deleting: bool) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns, "labels": {"app": app},
                         "deletionTimestamp": deleting.then_some("2026-01-01T00:00:00Z")},
            "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]},
        }))
        .expect("Pod")
    }

    fn dsvc(ns: &str, name: &str, hosts: &[&str]) -> DiscoveredService {
        let nodes: Vec<Value> = hosts
            .iter()
            .map(|h| json!({"host": h, "port": 8080, "weight": 100}))
            .collect();
        serde_json::from_value(json!({
            "apiVersion": "kubediscovery.io/v1alpha1", "kind": "DiscoveredService",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"service": format!("{ns}/{name}"), "sourceNamespace": ns, "sourceName": name,
                     "source": "EndpointSlice", "ports": {"http": nodes}, "version": "v1"},
        }))
        .expect("DiscoveredService")
    }

    fn store<K>(objs: Vec<K>) -> Store<K>
    where
        K: kube::Resource + Clone + 'static,
        K::DynamicType: Default + Eq + std::hash::Hash + Clone,
    {
        let (reader, mut writer) = reflector::store();
        writer.apply_watcher_event(&Event::Init);
        for o in objs {
            writer.apply_watcher_event(&Event::InitApply(o));
        }
        writer.apply_watcher_event(&Event::InitDone);
        reader
    }

    #[test]
    fn only_ready_pods_that_are_not_terminating_count() {
        let pods = store(vec![
            pod("a", "web", "w1", "10.0.0.1", true, false),
            pod("a", "web", "w2", "10.0.0.2", false, false),
            pod("a", "web", "w3", "10.0.0.3", true, true),
            pod("a", "db", "d1", "10.0.1.1", false, false),
        ]);
        let equal = store(vec![dsvc("a", "web", &["10.0.0.1"]), dsvc("a", "db", &[])]);
        assert_eq!(mismatches(&pods, &equal).0, 0);
        // A terminating Pod still published, a Service missing, one too many.
        for (ds, what) in [
            (
                vec![
                    dsvc("a", "web", &["10.0.0.1", "10.0.0.3"]),
                    dsvc("a", "db", &[]),
                ],
                "a/web",
            ),
            (vec![dsvc("a", "web", &["10.0.0.1"])], "a/db"),
            (
                vec![
                    dsvc("a", "web", &["10.0.0.1"]),
                    dsvc("a", "db", &[]),
                    dsvc("b", "gone", &[]),
                ],
                "b/gone",
            ),
        ] {
            let (n, example) = mismatches(&pods, &store(ds));
            assert_eq!(n, 1, "{what}");
            assert!(example.is_some_and(|e| e.starts_with(what)), "{what}");
        }
    }
}
