//! Nodes and Pods that behave like a cluster's, without containers: kwok
//! (`sigs.k8s.io/kwok`, built by `e2e/controlplane/build.sh`) plays kubelet
//! for fake Nodes the harness creates, and kube-scheduler binds Pods to them,
//! so Deployments roll out through the real Deployment, ReplicaSet,
//! EndpointSlice and Endpoints controllers.
//!
//! * **Nodes**: `kwok-<i>` with `topology.kubernetes.io/zone` (round robin
//!   over [`Options::zones`]) and a `/24` Pod CIDR each, annotated
//!   [`MANAGED_BY`] so that kwok (`--manage-nodes-with-annotation-selector`)
//!   manages them and nothing else.
//! * **Pods** follow the stages of [`stages`] (our own, not kwok's defaults):
//!   Running with an IP from their Node's CIDR at once; Ready when the harness
//!   has their address answering ([`LISTENING`]) plus the ready delay
//!   ([`Options::ready_delay`], per Pod [`READY_DELAY`]); not Ready while
//!   annotated [`READY`]`=false` (a failing readiness probe); removed when
//!   their `deletionTimestamp` is reached, i.e. after
//!   `terminationGracePeriodSeconds`, as a kubelet does once the containers
//!   stopped.
//! * **Pods that answer**: the Pod network of this module adds a Pod's IP to
//!   `lo` while the Pod exists, serves every container port on it (one HTTP
//!   server: the body is the Pod's name), and removes both when the Pod is
//!   gone. Each cluster takes one of [`RANGES`] `/20` ranges of [`POD_BLOCK`]
//!   (a lock file per range), so concurrent test processes never share a Pod
//!   address and removing one never pulls it from under another test. The
//!   block is routed `unreachable`: a request to a Pod that is gone fails on
//!   this machine ("No route to host"), as no packet may leave it.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;

use crate::process::{Proc, free_port};
use crate::{Error, Result, net};

/// The pinned kwok version; `e2e/controlplane/env.sh` has the same and builds it.
pub const KWOK_VERSION: &str = "v0.8.0";

/// The annotation (`key=value`) of the Nodes kwok manages.
pub const MANAGED_BY: (&str, &str) = ("kwok.x-k8s.io/node", "fake");
/// Set (`"true"`) by the harness once the Pod's address answers; kwok makes
/// a Pod Ready only then.
pub const LISTENING: &str = "testenv.kubediscovery.io/listening";
/// `"false"` on a Pod: its readiness probe fails (kwok sets Ready=False);
/// removing it makes the Pod Ready again after the ready delay.
pub const READY: &str = "testenv.kubediscovery.io/ready";
/// A Go duration (`"1500ms"`, `"2s"`) on a Pod: its own ready delay.
pub const READY_DELAY: &str = "testenv.kubediscovery.io/ready-delay";

/// How many Pod address ranges there are (so, kwok clusters at once on a machine).
pub const RANGES: usize = 8;
/// The block the clusters' Pod ranges are taken from.
pub const POD_BLOCK: &str = "198.19.128.0/17";
/// Nodes per cluster at most (one `/24` each in the cluster's `/20`).
pub const MAX_NODES: usize = 16;
/// Where the Pods of a cluster without a Pod network ([`Options::answer`]
/// off) take their addresses: one `/24` per Node. Shared by such clusters:
/// nothing routes or serves these addresses, they are only data.
pub const SCALE_BLOCK: Ipv4Addr = Ipv4Addr::new(100, 64, 0, 0);
/// Nodes at most without a Pod network (one `/24` each in [`SCALE_BLOCK`]`/16`).
pub const MAX_SCALE_NODES: usize = 256;

/// How long kwok may take to make the Nodes Ready.
const READY_LIMIT: Duration = Duration::from_secs(60);

/// Options of the kwok side of a control plane.
#[derive(Debug, Clone)]
pub struct Options {
    /// How many Nodes (at most [`MAX_NODES`]).
    pub nodes: usize,
    /// Their zones, round robin.
    pub zones: Vec<String>,
    /// From a Pod's address answering to the Pod being Ready.
    pub ready_delay: Duration,
    /// Pods answer on their addresses (the default). Off, for scale runs:
    /// no Pod network; a Pod is Ready the ready delay after it started, its
    /// address taken from [`SCALE_BLOCK`] (never on this machine), and up to
    /// [`MAX_SCALE_NODES`] Nodes.
    pub answer: bool,
    /// `--kube-api-qps` (burst twice that) of kube-scheduler and
    /// kube-controller-manager; `None`: their defaults (50 and 20), which
    /// make 10,000 Pods take minutes to schedule and create.
    pub api_qps: Option<u32>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            nodes: 3,
            zones: ["zone-a", "zone-b", "zone-c"].map(String::from).to_vec(),
            ready_delay: Duration::ZERO,
            answer: true,
            api_qps: None,
        }
    }
}

/// Where `build.sh` puts kwok: `KD_KWOK_BIN`, else
/// `.tools/controlplane/kwok-<v>/kwok` at the repository root.
pub fn bin() -> PathBuf {
    if let Ok(p) = std::env::var("KD_KWOK_BIN") {
        return PathBuf::from(p);
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(".tools/controlplane")
        .join(format!("kwok-{KWOK_VERSION}/kwok"))
}

/// One fake Node.
#[derive(Debug, Clone)]
pub struct FakeNode {
    /// Its name.
    pub name: String,
    /// Its `topology.kubernetes.io/zone`.
    pub zone: String,
    /// Its `spec.podCIDR`.
    pub pod_cidr: String,
}

/// kwok's stages (`kwok-stages.yaml`), with `@READY_DELAY_MS@` to fill in.
const STAGES: &str = include_str!("kwok-stages.yaml");

/// The selector line of `kd-pod-ready` that waits for the Pod network.
const WAIT_LISTENING: &str =
    "    matchAnnotations:\n      testenv.kubediscovery.io/listening: \"true\"\n";

/// kwok's configuration: the Node and Pod stages described in the module doc,
/// Pods Ready `ready_delay` after their address answers (`answer`), or after
/// they started (no Pod network).
pub fn stages(ready_delay: Duration, answer: bool) -> String {
    let s = STAGES.replace("@READY_DELAY_MS@", &ready_delay.as_millis().to_string());
    if answer {
        s
    } else {
        s.replace(WAIT_LISTENING, "")
    }
}

/// kwok, kube-scheduler, the fake Nodes and the Pod network of one control plane.
pub struct Kwok {
    nodes: Vec<FakeNode>,
    /// `None` without a Pod network ([`Options::answer`] off).
    net: Option<PodNet>,
    kwok: Mutex<Proc>,
    scheduler: Mutex<Proc>,
}

/// What [`Kwok::start`] needs from the control plane.
pub(crate) struct Start<'a> {
    pub dir: &'a Path,
    pub controlplane_bin: &'a Path,
    pub url: &'a str,
    pub ca_pem: &'a str,
    pub kwok_token: &'a str,
    pub scheduler_token: &'a str,
}

impl Kwok {
    /// Creates the Nodes, starts kube-scheduler, kwok and the Pod network, and
    /// waits until kwok made every Node Ready.
    pub(crate) async fn start(s: Start<'_>, opts: &Options) -> Result<Kwok> {
        let client = crate::client_for(s.url, s.ca_pem, s.kwok_token).await?;
        let net = match opts.answer {
            true => Some(PodNet::start(client.clone()).await?),
            false => None,
        };
        let node_cidr = |i: usize| match &net {
            Some(net) => net.node_cidr(i),
            None => cidr_24(SCALE_BLOCK, i),
        };
        let count = match net {
            Some(_) => opts.nodes.clamp(1, MAX_NODES),
            None => opts.nodes.clamp(1, MAX_SCALE_NODES),
        };
        let nodes: Vec<FakeNode> = (0..count)
            .map(|i| FakeNode {
                name: format!("kwok-{i}"),
                zone: opts
                    .zones
                    .get(i % opts.zones.len().max(1))
                    .cloned()
                    .unwrap_or_else(|| "zone-a".into()),
                pod_cidr: node_cidr(i),
            })
            .collect();
        let api: Api<Node> = Api::all(client.clone());
        for n in &nodes {
            let node: Node = serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {
                    "name": n.name,
                    "labels": {"kubernetes.io/hostname": n.name, "kubernetes.io/os": "linux",
                               "topology.kubernetes.io/zone": n.zone, "type": "kwok"},
                    "annotations": {MANAGED_BY.0: MANAGED_BY.1},
                },
                "spec": {"podCIDR": n.pod_cidr, "podCIDRs": [n.pod_cidr]},
            }))
            .map_err(|e| Error::json(format!("Node {}", n.name), e))?;
            api.create(&PostParams::default(), &node)
                .await
                .map_err(|e| Error::kube(format!("creating Node {}", n.name), e))?;
        }

        let kubeconfig = |name: &str, token: &str| -> Result<PathBuf> {
            let p = s.dir.join(format!("{name}.kubeconfig"));
            std::fs::write(&p, kube_sim::kubeconfig(s.url, Some(s.ca_pem), token)).map_err(
                |source| Error::File {
                    what: "writing",
                    path: p.clone(),
                    source,
                },
            )?;
            Ok(p)
        };
        let sk = kubeconfig("kube-scheduler", s.scheduler_token)?
            .display()
            .to_string();
        let mut args = vec![
            format!("--kubeconfig={sk}"),
            format!("--authentication-kubeconfig={sk}"),
            format!("--authorization-kubeconfig={sk}"),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={}", free_port()?),
            "--leader-elect=false".into(),
            "--v=1".into(),
        ];
        args.extend(qps_args(opts.api_qps));
        let scheduler = Proc::spawn(
            "kube-scheduler",
            &s.controlplane_bin.join("kube-scheduler"),
            args,
            &s.dir.join("kube-scheduler.log"),
        )?;

        let config = s.dir.join("kwok.yaml");
        std::fs::write(&config, stages(opts.ready_delay, opts.answer)).map_err(|source| {
            Error::File {
                what: "writing",
                path: config.clone(),
                source,
            }
        })?;
        let kk = kubeconfig("kwok", s.kwok_token)?;
        let home = s.dir.join("kwok-home");
        std::fs::create_dir_all(&home).map_err(|source| Error::File {
            what: "creating",
            path: home.clone(),
            source,
        })?;
        let kwok = Proc::spawn_with_env(
            "kwok",
            &bin(),
            vec![
                format!("--kubeconfig={}", kk.display()),
                format!("--config={}", config.display()),
                format!(
                    "--manage-nodes-with-annotation-selector={}={}",
                    MANAGED_BY.0, MANAGED_BY.1
                ),
                // Unused (every Node has a Pod CIDR), but inside the cluster's range.
                format!("--cidr={}", node_cidr(0)),
            ],
            // kwok also reads ~/.kwok/kwok.yaml: a home of its own keeps a
            // developer's stages out.
            &[("HOME", home.as_os_str())],
            &s.dir.join("kwok.log"),
        )?;
        let k = Kwok {
            nodes,
            net,
            kwok: Mutex::new(kwok),
            scheduler: Mutex::new(scheduler),
        };
        let start = Instant::now();
        loop {
            k.check_alive()?;
            let ready = api
                .list(&Default::default())
                .await
                .map_err(|e| Error::kube("listing Nodes", e))?
                .items
                .iter()
                .filter(|n| {
                    n.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
                })
                .count();
            if ready == k.nodes.len() {
                // The API server's TaintNodesByCondition admission gives a new
                // Node the `node.kubernetes.io/not-ready:NoSchedule` taint; the
                // node lifecycle controller (not run here: kwok sends no
                // heartbeats) takes it off once the Node is Ready.
                for n in &k.nodes {
                    api.patch(
                        &n.name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"spec": {"taints": null}})),
                    )
                    .await
                    .map_err(|e| Error::kube(format!("untainting Node {}", n.name), e))?;
                }
                return Ok(k);
            }
            if start.elapsed() > READY_LIMIT {
                return Err(Error::Timeout {
                    what: format!("kwok made {ready} of {} Nodes Ready", k.nodes.len()),
                    limit: READY_LIMIT,
                    last: None,
                    log_tail: Some(lock(&k.kwok).tail()),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The fake Nodes.
    pub fn nodes(&self) -> &[FakeNode] {
        &self.nodes
    }

    /// The cluster's Pod address range (`198.19.x.0/20`; without a Pod
    /// network [`SCALE_BLOCK`]`/16`).
    pub fn pod_range(&self) -> String {
        match &self.net {
            Some(net) => format!("{}/20", net.base),
            None => format!("{SCALE_BLOCK}/16"),
        }
    }

    /// The Pods whose address answers now: `ip -> namespace/name`.
    pub fn answering(&self) -> HashMap<Ipv4Addr, String> {
        self.net
            .as_ref()
            .map(|net| lock(&net.shared.owners).clone())
            .unwrap_or_default()
    }

    /// When the Pod server answered for Pod `namespace/name` (every request).
    pub fn hits(&self, pod: &str) -> Vec<tokio::time::Instant> {
        let Some(net) = &self.net else {
            return Vec::new();
        };
        lock(&net.shared.hits)
            .iter()
            .filter(|(p, _)| p == pod)
            .map(|(_, t)| *t)
            .collect()
    }

    /// Errors (with the log tail) if kwok or kube-scheduler died, or the Pod network failed.
    pub fn check_alive(&self) -> Result<()> {
        lock(&self.kwok).check_alive()?;
        lock(&self.scheduler).check_alive()?;
        if let Some(e) = self
            .net
            .as_ref()
            .and_then(|net| lock(&net.shared.error).clone())
        {
            return Err(Error::PodNet(e));
        }
        Ok(())
    }

    /// Pids of kwok and kube-scheduler.
    pub fn pids(&self) -> Vec<u32> {
        let mut v = Vec::new();
        v.extend(lock(&self.kwok).pid());
        v.extend(lock(&self.scheduler).pid());
        v
    }
}

impl Drop for Kwok {
    fn drop(&mut self) {
        lock(&self.kwok).stop(Duration::ZERO);
        lock(&self.scheduler).stop(Duration::ZERO);
    }
}

/// `--kube-api-qps`/`--kube-api-burst` for a Kubernetes component.
pub(crate) fn qps_args(qps: Option<u32>) -> Vec<String> {
    qps.map(|q| {
        vec![
            format!("--kube-api-qps={q}"),
            format!("--kube-api-burst={}", q.saturating_mul(2)),
        ]
    })
    .unwrap_or_default()
}

/// The `i`-th `/24` after `base`.
fn cidr_24(base: Ipv4Addr, i: usize) -> String {
    let o = base.octets();
    format!("{}.{}.{}.0/24", o[0], o[1], o[2].wrapping_add(i as u8))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the Pod network's watcher and its servers share with the harness.
#[derive(Default)]
struct Shared {
    /// Address -> `namespace/name` of the Pod that holds it.
    owners: Mutex<HashMap<Ipv4Addr, String>>,
    /// Addresses on `lo` now (removed on drop).
    added: Mutex<HashSet<Ipv4Addr>>,
    /// Every answered request: `namespace/name`, when.
    hits: Mutex<Vec<(String, tokio::time::Instant)>>,
    /// The first failure of the watcher.
    error: Mutex<Option<String>>,
}

/// One cluster's Pod addresses: a locked `/20`, a watcher of the Pods that
/// adds and removes their addresses on `lo` and serves their container ports.
struct PodNet {
    base: Ipv4Addr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
    _lock: File,
}

impl PodNet {
    async fn start(client: kube::Client) -> Result<PodNet> {
        let dir = std::env::temp_dir();
        let mut taken = None;
        for slot in 0..RANGES {
            let path = dir.join(format!("kd-testenv-podnet-{slot}.lock"));
            let f = File::create(&path).map_err(|source| Error::File {
                what: "creating",
                path: path.clone(),
                source,
            })?;
            if f.try_lock().is_ok() {
                taken = Some((slot, f));
                break;
            }
        }
        let Some((slot, lock_file)) = taken else {
            return Err(Error::NoPodRange(RANGES, dir.display().to_string()));
        };
        // Every request to a Pod address that is not (or no longer) on `lo`
        // must fail on this machine, never leave it.
        net::unreachable_route(POD_BLOCK)?;
        let base = Ipv4Addr::new(198, 19, 128 + 16 * slot as u8, 0);
        // Addresses a killed test process of this range left behind.
        for ip in net::listed_in_block()? {
            if in_range(base, ip) {
                net::remove_local(ip)?;
            }
        }
        let shared = Arc::new(Shared::default());
        let task = tokio::spawn(watch(client, base, shared.clone()));
        Ok(PodNet {
            base,
            shared,
            task,
            _lock: lock_file,
        })
    }

    fn node_cidr(&self, i: usize) -> String {
        cidr_24(self.base, i)
    }
}

impl Drop for PodNet {
    fn drop(&mut self) {
        self.task.abort();
        let added: Vec<Ipv4Addr> = lock(&self.shared.added).drain().collect();
        for ip in added {
            let _ = net::remove_local(ip);
        }
    }
}

fn in_range(base: Ipv4Addr, ip: Ipv4Addr) -> bool {
    u32::from(ip) & 0xffff_f000 == u32::from(base)
}

/// One Pod's servers: one per TCP container port.
struct Served {
    uid: String,
    stops: Vec<tokio::sync::oneshot::Sender<()>>,
}

async fn watch(client: kube::Client, base: Ipv4Addr, shared: Arc<Shared>) {
    let api: Api<Pod> = Api::all(client.clone());
    let mut table: HashMap<Ipv4Addr, Served> = HashMap::new();
    let mut seen: HashSet<String> = HashSet::new();
    let mut stream = watcher(api, watcher::Config::default()).boxed();
    while let Some(ev) = stream.next().await {
        let res = match ev {
            Ok(watcher::Event::Apply(p)) => apply(&client, base, &shared, &mut table, &p).await,
            Ok(watcher::Event::InitApply(p)) => {
                seen.extend(p.metadata.uid.clone());
                apply(&client, base, &shared, &mut table, &p).await
            }
            Ok(watcher::Event::Delete(p)) => gone(&shared, &mut table, |s| {
                Some(&s.uid) == p.metadata.uid.as_ref()
            }),
            Ok(watcher::Event::Init) => {
                seen.clear();
                Ok(())
            }
            Ok(watcher::Event::InitDone) => gone(&shared, &mut table, |s| !seen.contains(&s.uid)),
            // The watcher retries by itself; a failed list or watch is not the test's failure.
            Err(e) => {
                tracing::debug!(error = %e, "kwok Pod network: watch error");
                tokio::time::sleep(Duration::from_millis(200)).await;
                Ok(())
            }
        };
        if let Err(e) = res {
            let mut err = lock(&shared.error);
            if err.is_none() {
                *err = Some(e.to_string());
            }
        }
    }
}

fn pod_ip(base: Ipv4Addr, p: &Pod) -> Option<Ipv4Addr> {
    let ip: Ipv4Addr = p.status.as_ref()?.pod_ip.as_ref()?.parse().ok()?;
    in_range(base, ip).then_some(ip)
}

/// A Pod with an address of this cluster: the address on `lo`, its ports
/// served, the [`LISTENING`] annotation written.
async fn apply(
    client: &kube::Client,
    base: Ipv4Addr,
    shared: &Arc<Shared>,
    table: &mut HashMap<Ipv4Addr, Served>,
    p: &Pod,
) -> Result<()> {
    let Some(ip) = pod_ip(base, p) else {
        return Ok(());
    };
    let (Some(uid), Some(ns), Some(name)) = (
        p.metadata.uid.clone(),
        p.metadata.namespace.clone(),
        p.metadata.name.clone(),
    ) else {
        return Ok(());
    };
    if table.get(&ip).is_some_and(|s| s.uid != uid) {
        // kwok gave the address of a Pod that is gone to a new one.
        if let Some(old) = table.remove(&ip) {
            drop(old.stops);
        }
    }
    if let std::collections::hash_map::Entry::Vacant(slot) = table.entry(ip) {
        net::ensure_local(ip)?;
        lock(&shared.added).insert(ip);
        lock(&shared.owners).insert(ip, format!("{ns}/{name}"));
        let mut stops = Vec::new();
        let ports = p
            .spec
            .iter()
            .flat_map(|s| &s.containers)
            .flat_map(|c| c.ports.iter().flatten())
            .filter(|cp| cp.protocol.as_deref().unwrap_or("TCP") == "TCP");
        for cp in ports {
            let port = u16::try_from(cp.container_port).unwrap_or(0);
            stops.push(serve(shared.clone(), SocketAddr::from((ip, port))).await?);
        }
        slot.insert(Served { uid, stops });
    }
    let listening = p
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(LISTENING))
        .is_some_and(|v| v == "true");
    if !listening && p.metadata.deletion_timestamp.is_none() {
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let patch = json!({"metadata": {"annotations": {LISTENING: "true"}}});
        match pods
            .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                return Err(Error::kube(
                    format!("annotating Pod {ns}/{name} {LISTENING}"),
                    e,
                ));
            }
        }
    }
    Ok(())
}

/// Removes the Pods `which` selects: servers stopped, addresses off `lo`.
fn gone(
    shared: &Arc<Shared>,
    table: &mut HashMap<Ipv4Addr, Served>,
    which: impl Fn(&Served) -> bool,
) -> Result<()> {
    let ips: Vec<Ipv4Addr> = table
        .iter()
        .filter(|(_, s)| which(s))
        .map(|(ip, _)| *ip)
        .collect();
    for ip in ips {
        if let Some(s) = table.remove(&ip) {
            drop(s.stops);
        }
        lock(&shared.owners).remove(&ip);
        lock(&shared.added).remove(&ip);
        net::remove_local(ip)?;
    }
    Ok(())
}

/// Serves `addr`: every request is answered with the name of the Pod that
/// holds the address now (503 when none does). Stops when the sender is dropped.
async fn serve(shared: Arc<Shared>, addr: SocketAddr) -> Result<tokio::sync::oneshot::Sender<()>> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Error::io(format!("the Pod server binding {addr}"), e))?;
    let std::net::IpAddr::V4(ip) = addr.ip() else {
        return Err(Error::PodNet(format!("{addr} is not IPv4")));
    };
    let app = axum::Router::new().fallback(move || {
        let shared = shared.clone();
        async move {
            let owner = lock(&shared.owners).get(&ip).cloned();
            match owner {
                Some(pod) => {
                    lock(&shared.hits).push((pod.clone(), tokio::time::Instant::now()));
                    let name = pod.rsplit('/').next().unwrap_or_default().to_string();
                    (http::StatusCode::OK, name)
                }
                None => (http::StatusCode::SERVICE_UNAVAILABLE, "no Pod".to_string()),
            }
        }
    });
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = rx.await;
            })
            .await;
    });
    Ok(tx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stages_use_the_harness_annotations() {
        let y = stages(Duration::from_millis(1500), true);
        for name in [LISTENING, READY, READY_DELAY, MANAGED_BY.0] {
            assert!(y.contains(name), "{name}");
        }
        assert!(y.contains("durationMilliseconds: 1500") && !y.contains('@'));
    }

    #[test]
    fn without_a_pod_network_pods_are_ready_without_listening() {
        let ready_stage = |y: &str| {
            y.split("\n---\n")
                .find(|d| d.contains("name: kd-pod-ready"))
                .map(str::to_string)
                .expect("kd-pod-ready")
        };
        assert!(ready_stage(&stages(Duration::ZERO, true)).contains(LISTENING));
        let y = stages(Duration::ZERO, false);
        assert!(!ready_stage(&y).contains(LISTENING), "{y}");
        // Only that selector went: every stage is still there.
        for stage in [
            "kd-node-ready",
            "kd-pod-start",
            "kd-pod-ready",
            "kd-pod-unready",
            "kd-pod-delete",
        ] {
            assert!(y.contains(stage), "{stage}");
        }
        assert_eq!(cidr_24(SCALE_BLOCK, 255), "100.64.255.0/24");
    }

    #[test]
    fn ranges_are_disjoint_and_inside_the_test_block() {
        for slot in 0..RANGES {
            let base = Ipv4Addr::new(198, 19, 128 + 16 * slot as u8, 0);
            assert!(net::in_block(base));
            let last = Ipv4Addr::from(u32::from(base) + 4095);
            assert!(net::in_block(last) && in_range(base, last));
            let next = Ipv4Addr::from(u32::from(base) + 4096);
            assert!(!in_range(base, next));
        }
        // The gateway tests' addresses (198.19.<net>.x, net < 128) are outside every range.
        assert!(!in_range(
            Ipv4Addr::new(198, 19, 128, 0),
            Ipv4Addr::new(198, 19, 3, 1)
        ));
    }
}
