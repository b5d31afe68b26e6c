//! The ConfigMap snapshot sink (`kube_discovery.sinks.configmap`): the whole
//! discovered state, in APISIX's dump shape, in ConfigMaps of one namespace on
//! the home cluster, for gateways that mount a file instead of reading
//! DiscoveredServices. The layout (index + shards, hashes, sizes) is the pure
//! [`kube_discovery_core::dump`]; this module writes it, keeps it as
//! written (drift correction), and reads it back.
//!
//! ```text
//!  ControllerState ─generation─▶ wait one coalescing window ──┐
//!  watch ConfigMaps (label kubediscovery.io/snapshot=<name>) ─┤ (drift: every event)
//!  leader gained ─────────────────────────────────────────────┤
//!                                                             ▼
//!  round: (leader? every cluster listed? our watch listed?)
//!     layout = build(dump of ControllerState)      (rebuilt only when the state changed)
//!     1. SSA every shard whose text differs from what the watch shows
//!     2. SSA the index  <name>  (index.json: version, shard names + sha256)  LAST
//!     3. delete labelled ConfigMaps the index does not list (old shards)
//! ```
//!
//! * **No needless writes.** What the API server holds is known from the
//!   label-selected watch; an object is written only when its data key
//!   differs from the desired text or it lacks our labels. Events of our own
//!   writes therefore cause no writes, and a restart with an unchanged state
//!   writes nothing. A watch event older than our last write of that object
//!   (smaller resourceVersion) is ignored so a lagging event does not undo a
//!   newer write.
//! * **At most one round per coalescing window** after a state change; a burst
//!   of changes is one round.
//! * **Never a partial state.** Nothing is written before every cluster has
//!   completed its first list, and only by the leader.
//! * **Fenced.** A round notes the leadership epoch it starts in and checks
//!   before each request that it is still the current leading one
//!   ([`crate::leader::Fence`]); a round of a replica that lost the lease
//!   sends nothing more (`snapshot_writes_total{result="fenced"}`, no retry
//!   until it leads again).
//! * **Drift.** An edited or deleted index or shard shows up on the watch and
//!   is rewritten in the next round (one coalescing window later); a labelled
//!   ConfigMap of this snapshot that the index does not list is deleted. Keys
//!   other than ours that someone adds are left alone (readers ignore them).
//! * **Readers** (`kube_discovery_client::snapshot::{read, read_dir}`)
//!   assemble the shards with [`kube_discovery_core::dump::assemble`], which
//!   refuses mixed versions; a shard being rewritten or just deleted means
//!   "read again".
//!
//! RBAC: `list`, `watch`, `create`, `patch`, `delete` on `configmaps` in the
//! snapshot namespace (`rbac/optional/configmap-snapshot.yaml`; `create`
//! because the API server also authorizes an apply that creates the object).
//! Known gap: someone making a snapshot ConfigMap `immutable: true` makes its
//! repair fail (retried with backoff, logged) until it is deleted.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{Event, watcher};
use kube_discovery_core::dump::{self, Dump, INDEX_KEY, Layout};
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::leader::{Fence, FenceToken, Leadership};
use crate::metrics::Metrics;
use crate::state::ControllerState;
use crate::{Error, Result, SettingError};

/// Label every snapshot ConfigMap carries: the snapshot's name
/// ([`dump::label_value`]).
pub const SNAPSHOT_LABEL: &str = "kubediscovery.io/snapshot";
/// Field manager of snapshot writes.
pub const FIELD_MANAGER: &str = "kube-discovery-snapshot";
/// Test-only override of the shard budget (bytes); not a supported setting.
#[doc(hidden)]
pub const MAX_SHARD_BYTES_ENV: &str = "KUBE_DISCOVERY_SNAPSHOT_MAX_SHARD_BYTES";
/// Longest accepted snapshot name: `<name>-<i>.json` must stay a valid
/// ConfigMap name and data key.
pub const MAX_NAME_LEN: usize = 240;

/// Where and how the snapshot is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotOptions {
    /// Namespace of the ConfigMaps.
    pub namespace: String,
    /// Name of the index ConfigMap; shards are `<name>-<i>`.
    pub name: String,
    /// Shard budget (escaped JSON bytes).
    pub max_shard_bytes: usize,
    /// Coalescing window (the writer's `coalesce_window`).
    pub coalesce_window: Duration,
    /// First retry delay after a failed round.
    pub retry_min: Duration,
    /// Largest retry delay.
    pub retry_max: Duration,
    /// Server-side timeout of the ConfigMap watch (`None`: the API's
    /// default; `run` sets [`crate::client::watch_renewal`]).
    pub watch_timeout: Option<Duration>,
}

impl SnapshotOptions {
    /// Options with the default shard budget and retry policy.
    pub fn new(namespace: String, name: String, coalesce_window: Duration) -> Self {
        Self {
            namespace,
            name,
            max_shard_bytes: dump::DEFAULT_MAX_SHARD_BYTES,
            coalesce_window,
            retry_min: Duration::from_millis(200),
            retry_max: Duration::from_secs(5),
            watch_timeout: None,
        }
    }

    /// Checks the name length and applies the hidden test override of the
    /// shard budget (`env` is the process environment in production).
    pub fn validated(mut self, env: &dyn Fn(&str) -> Option<String>) -> Result<Self> {
        if self.name.len() > MAX_NAME_LEN {
            return Err(SettingError::SnapshotNameTooLong {
                max: MAX_NAME_LEN,
                len: self.name.len(),
            }
            .into());
        }
        if let Some(v) = env(MAX_SHARD_BYTES_ENV) {
            let n: usize =
                v.trim()
                    .parse()
                    .map_err(|source| SettingError::ShardBytesNotANumber {
                        variable: MAX_SHARD_BYTES_ENV,
                        value: v.clone(),
                        source,
                    })?;
            if !(dump::MIN_SHARD_BYTES..=dump::DEFAULT_MAX_SHARD_BYTES).contains(&n) {
                return Err(SettingError::ShardBytesOutOfRange {
                    variable: MAX_SHARD_BYTES_ENV,
                    value: n,
                    min: dump::MIN_SHARD_BYTES,
                    max: dump::DEFAULT_MAX_SHARD_BYTES,
                }
                .into());
            }
            self.max_shard_bytes = n;
        }
        Ok(self)
    }

    fn selector(&self) -> String {
        format!("{SNAPSHOT_LABEL}={}", dump::label_value(&self.name))
    }
}

/// The dump of the shared state (every registered cluster, also empty ones),
/// read under one lock.
pub fn dump_of(shared: &ControllerState) -> Dump {
    let clusters = shared.clusters();
    let mut d = Dump::with_clusters(clusters.keys().map(String::as_str));
    shared.with_desired(|all| {
        for s in all.values() {
            d.insert(&s.key, s.ports.clone());
        }
    });
    d
}

fn all_listed(shared: &ControllerState) -> bool {
    let c = shared.clusters();
    !c.is_empty() && c.values().all(|s| s.listed)
}

fn hash(s: &str) -> [u8; 32] {
    Sha256::digest(s.as_bytes()).into()
}

/// What the watch shows of one of our ConfigMaps.
#[derive(Debug, Clone)]
struct Seen {
    rv: Option<u64>,
    /// Data key -> sha256 of its value.
    data: HashMap<String, [u8; 32]>,
    labelled: bool,
}

fn seen_of(cm: &ConfigMap, label: &str) -> Seen {
    Seen {
        rv: cm
            .metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse().ok()),
        data: cm
            .data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), hash(v)))
            .collect(),
        labelled: cm
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SNAPSHOT_LABEL))
            .is_some_and(|v| v == label),
    }
}

/// One ConfigMap we want: its name, and the one data key it holds with its text.
struct WantedConfigMap<'a> {
    name: &'a str,
    data_key: &'a str,
    text: &'a str,
}

/// Spawns the snapshot task. It writes only while `leader` says this
/// replica leads (or always, without leader election), every request fenced
/// by the epoch its round started in.
pub fn spawn(
    client: Client,
    shared: Arc<ControllerState>,
    metrics: Metrics,
    opts: SnapshotOptions,
    shutdown: CancellationToken,
    leader: Option<watch::Receiver<Leadership>>,
) -> tokio::task::JoinHandle<()> {
    let api: Api<ConfigMap> = Api::namespaced(client, &opts.namespace);
    let fence = leader.clone().map_or_else(Fence::always, Fence::new);
    let task = Task {
        fence,
        label: dump::label_value(&opts.name),
        api,
        shared,
        metrics,
        opts,
        seen: HashMap::new(),
        written_rv: HashMap::new(),
        layout: None,
        layout_gen: None,
    };
    tokio::spawn(task.run(shutdown, leader))
}

struct Task {
    /// Checked before every request of a round.
    fence: Fence,
    api: Api<ConfigMap>,
    shared: Arc<ControllerState>,
    metrics: Metrics,
    opts: SnapshotOptions,
    label: String,
    /// Our ConfigMaps as the watch shows them.
    seen: HashMap<String, Seen>,
    /// resourceVersion of our last write per object.
    written_rv: HashMap<String, u64>,
    layout: Option<Arc<Layout>>,
    layout_gen: Option<u64>,
}

fn backoff(opts: &SnapshotOptions, attempts: u32) -> Duration {
    let exp = attempts.saturating_sub(1).min(16);
    opts.retry_min
        .saturating_mul(1u32 << exp)
        .min(opts.retry_max)
}

impl Task {
    async fn run(
        mut self,
        shutdown: CancellationToken,
        mut leader: Option<watch::Receiver<Leadership>>,
    ) {
        let mut generation = self.shared.subscribe();
        let stream = watcher(
            self.api.clone(),
            crate::watch::config(self.opts.watch_timeout).labels(&self.opts.selector()),
        )
        .default_backoff();
        let mut stream = std::pin::pin!(stream);
        let mut listing: Option<HashMap<String, Seen>> = None;
        let mut watch_listed = false;
        let mut due: Option<Instant> = None;
        let mut attempts: u32 = 0;
        let mut leading = leader.as_ref().is_none_or(|l| l.borrow().leading);
        tracing::info!(namespace = %self.opts.namespace, name = %self.opts.name, "snapshot sink enabled");
        loop {
            let sleep_until = due.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                () = shutdown.cancelled() => break,
                r = generation.changed() => {
                    if r.is_err() {
                        break;
                    }
                    due.get_or_insert_with(|| Instant::now() + self.opts.coalesce_window);
                }
                now = leader_changed(&mut leader) => {
                    leading = now.leading;
                    if leading {
                        tracing::info!("snapshot: leader, writing");
                        due = Some(Instant::now());
                    }
                }
                ev = stream.next() => {
                    let Some(ev) = ev else { break };
                    match ev {
                        Ok(Event::Init) => listing = Some(HashMap::new()),
                        Ok(Event::InitApply(cm)) => {
                            if let (Some(l), Some(name)) = (listing.as_mut(), cm.metadata.name.clone()) {
                                l.insert(name, seen_of(&cm, &self.label));
                            }
                        }
                        Ok(Event::InitDone) => {
                            let mut fresh = listing.take().unwrap_or_default();
                            // Keep our own writes that are newer than what the list shows.
                            for (name, s) in &self.seen {
                                let ours = self.written_rv.get(name).copied();
                                let listed_rv = fresh.get(name).and_then(|x| x.rv);
                                if let (Some(w), Some(l)) = (ours, listed_rv)
                                    && w > l
                                {
                                    fresh.insert(name.clone(), s.clone());
                                }
                            }
                            self.seen = fresh;
                            watch_listed = true;
                            due.get_or_insert_with(|| Instant::now() + self.opts.coalesce_window);
                        }
                        Ok(Event::Apply(cm)) => {
                            if self.observe(&cm, false) {
                                due.get_or_insert_with(|| Instant::now() + self.opts.coalesce_window);
                            }
                        }
                        Ok(Event::Delete(cm)) => {
                            if self.observe(&cm, true) {
                                due.get_or_insert_with(|| Instant::now() + self.opts.coalesce_window);
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "snapshot: ConfigMap watch failed; retrying with backoff");
                        }
                    }
                }
                () = tokio::time::sleep_until(sleep_until), if due.is_some() => {
                    due = None;
                    if !leading || !watch_listed || !all_listed(&self.shared) {
                        continue;
                    }
                    match self.round(&mut generation).await {
                        Ok(()) => attempts = 0,
                        Err(e) if e.is_fenced() => {
                            // Lost the lease during the round: not a failure;
                            // the next round comes when it leads again.
                            self.metrics.snapshot_write("fenced");
                            tracing::info!(error = %e, "snapshot: round dropped: not the leader");
                        }
                        Err(e) => {
                            attempts += 1;
                            let d = backoff(&self.opts, attempts);
                            tracing::warn!(error = %e, retry_in = ?d, "snapshot: write failed");
                            due = Some(Instant::now() + d);
                        }
                    }
                }
            }
        }
        tracing::info!("snapshot sink stopped");
    }

    /// Applies a watch event; `true` when it may need a round (not an echo
    /// of our own newer write).
    fn observe(&mut self, cm: &ConfigMap, deleted: bool) -> bool {
        let Some(name) = cm.metadata.name.clone() else {
            return false;
        };
        let s = seen_of(cm, &self.label);
        if let (Some(ev), Some(w)) = (s.rv, self.written_rv.get(&name))
            && ev < *w
        {
            return false;
        }
        if deleted {
            self.seen.remove(&name);
        } else {
            self.seen.insert(name, s);
        }
        true
    }

    fn in_sync(&self, w: &WantedConfigMap<'_>) -> bool {
        self.seen.get(w.name).is_some_and(|s| {
            s.labelled && s.data.get(w.data_key).is_some_and(|h| *h == hash(w.text))
        })
    }

    fn current_layout(&mut self, generation: &mut watch::Receiver<u64>) -> Result<Arc<Layout>> {
        let g = *generation.borrow_and_update();
        if let (Some(l), Some(lg)) = (&self.layout, self.layout_gen)
            && lg == g
        {
            return Ok(l.clone());
        }
        let dump = dump_of(&self.shared);
        let l = Arc::new(
            dump::build(&dump, &self.opts.name, self.opts.max_shard_bytes)
                .map_err(Error::Snapshot)?,
        );
        self.layout = Some(l.clone());
        self.layout_gen = Some(g);
        Ok(l)
    }

    async fn round(&mut self, generation: &mut watch::Receiver<u64>) -> Result<()> {
        let token = self.fence.begin()?;
        let layout = self.current_layout(generation)?;
        let mut wants: Vec<WantedConfigMap<'_>> = layout
            .shards
            .iter()
            .map(|s| WantedConfigMap {
                name: &s.name,
                data_key: &s.key,
                text: &s.text,
            })
            .collect();
        // The index goes last: it switches readers to the new version.
        let index_name = self.opts.name.clone();
        wants.push(WantedConfigMap {
            name: &index_name,
            data_key: INDEX_KEY,
            text: &layout.index,
        });
        let mut wrote = 0usize;
        let mut index_written = false;
        for w in &wants {
            if self.in_sync(w) {
                continue;
            }
            self.apply(token, w).await?;
            wrote += 1;
            index_written |= w.name == index_name;
        }
        let keep: std::collections::HashSet<&str> = wants.iter().map(|w| w.name).collect();
        let stale: Vec<String> = self
            .seen
            .keys()
            .filter(|n| !keep.contains(n.as_str()))
            .cloned()
            .collect();
        for name in stale {
            self.fence.check(token)?;
            match self.api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {
                    self.metrics.snapshot_write("deleted");
                    tracing::info!(configmap = %name, "snapshot: deleted stale ConfigMap");
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    let e = Error::from(e);
                    self.metrics
                        .snapshot_write(&format!("error_{}", e.metric_label()));
                    return Err(e);
                }
            }
            self.seen.remove(&name);
            wrote += 1;
        }
        self.metrics.snapshot_shards.set(gauge(layout.shards.len()));
        self.metrics.snapshot_bytes.set(gauge(layout.shard_bytes()));
        if index_written {
            let now = jiff::Timestamp::now().as_second();
            self.metrics.snapshot_last_write.set(now);
            tracing::info!(version = %layout.version, shards = layout.shards.len(), services = layout.services, nodes = layout.nodes, objects_written = wrote, "snapshot published");
        } else if wrote > 0 {
            tracing::info!(version = %layout.version, objects_written = wrote, "snapshot repaired");
        }
        Ok(())
    }

    async fn apply(&mut self, token: FenceToken, w: &WantedConfigMap<'_>) -> Result<()> {
        self.fence.check(token)?;
        let cm = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": w.name,
                "namespace": self.opts.namespace,
                "labels": {
                    "app.kubernetes.io/managed-by": "kube-discovery",
                    (SNAPSHOT_LABEL): self.label,
                },
            },
            "data": { (w.data_key): w.text },
        });
        let pp = PatchParams::apply(FIELD_MANAGER).force();
        match self.api.patch(w.name, &pp, &Patch::Apply(&cm)).await {
            Ok(got) => {
                self.metrics.snapshot_write("applied");
                let s = seen_of(&got, &self.label);
                if let Some(rv) = s.rv {
                    self.written_rv.insert(w.name.to_string(), rv);
                }
                tracing::debug!(configmap = %w.name, bytes = w.text.len(), "snapshot: wrote");
                self.seen.insert(w.name.to_string(), s);
                Ok(())
            }
            Err(e) => {
                let e = Error::from(e);
                self.metrics
                    .snapshot_write(&format!("error_{}", e.metric_label()));
                Err(e)
            }
        }
    }
}

fn gauge(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Resolves with the new leadership state; never when not gated.
async fn leader_changed(leader: &mut Option<watch::Receiver<Leadership>>) -> Leadership {
    match leader {
        Some(rx) => {
            if rx.changed().await.is_err() {
                // The elector stopped (shutdown): stay as we are.
                *leader = None;
                return std::future::pending().await;
            }
            *rx.borrow_and_update()
        }
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube_discovery_core::{Node, PortMap, ServiceKey, ServiceNodes, SourceKind};

    #[test]
    fn options_validate_name_and_hidden_budget() {
        let o = SnapshotOptions::new("kd".into(), "n".into(), Duration::from_millis(100));
        assert_eq!(o.clone().validated(&|_| None).unwrap(), o);
        let small = o
            .clone()
            .validated(&|k| (k == MAX_SHARD_BYTES_ENV).then(|| "4096".to_string()))
            .unwrap();
        assert_eq!(small.max_shard_bytes, 4096);
        let e = o
            .clone()
            .validated(&|_| Some("12".into()))
            .unwrap_err()
            .to_string();
        assert!(e.contains(MAX_SHARD_BYTES_ENV), "{e}");
        let long = SnapshotOptions::new("kd".into(), "a".repeat(241), Duration::ZERO);
        let e = long.validated(&|_| None).unwrap_err().to_string();
        assert!(e.contains("kube_discovery.sinks.configmap.name"), "{e}");
    }

    #[test]
    fn dump_of_shared_lists_every_cluster() {
        let shared = ControllerState::new(["", "west"]);
        let k = ServiceKey::new("", "default", "web");
        let ports = PortMap::from([("http".to_string(), vec![Node::new("10.0.0.1", 80, 100)])]);
        shared.set_desired(
            &k,
            Some(ServiceNodes::new(
                k.clone(),
                SourceKind::Endpoints,
                ports,
                None,
            )),
        );
        let d = dump_of(&shared);
        assert_eq!(d.services(), 1);
        assert_eq!(d.clusters.len(), 2);
        // That it equals the HTTP dump is a test of `http` (which uses this).
    }

    async fn sim_client() -> (kube_sim::Sim, Client, tempfile::TempDir) {
        let sim = kube_sim::Sim::start(kube_sim::SimConfig::default())
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kc = dir.path().join("kubeconfig");
        sim.write_kubeconfig(&kc, &sim.admin_token()).unwrap();
        let client = crate::client::client(
            &crate::client::Connection::Kubeconfig {
                path: Some(kc),
                context: None,
            },
            &crate::client::ClientLimits::default(),
        )
        .await
        .unwrap();
        let ns: k8s_openapi::api::core::v1::Namespace =
            serde_json::from_value(json!({"metadata": {"name": "kd"}})).unwrap();
        Api::all(client.clone())
            .create(&Default::default(), &ns)
            .await
            .unwrap();
        (sim, client, dir)
    }

    fn state(n: u32) -> Arc<ControllerState> {
        let shared = Arc::new(ControllerState::new([""]));
        for i in 0..n {
            let k = ServiceKey::new("", "ns", format!("s{i:02}"));
            let ports = PortMap::from([(
                "http".to_string(),
                vec![Node::new(format!("10.0.0.{i}"), 80, 100)],
            )]);
            shared.set_desired(
                &k,
                Some(ServiceNodes::new(
                    k.clone(),
                    SourceKind::Endpoints,
                    ports,
                    None,
                )),
            );
        }
        shared
    }

    async fn wait_read(client: &Client, want: &Dump) {
        for _ in 0..200 {
            if let Ok(d) = kube_discovery_client::snapshot::read(client, "kd", "snap").await
                && &d == want
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the snapshot never equalled the state");
    }

    #[tokio::test]
    async fn the_task_publishes_only_when_leader_and_listed_and_read_assembles_it() {
        let (_sim, client, _dir) = sim_client().await;
        let shared = state(30);
        let mut opts = SnapshotOptions::new("kd".into(), "snap".into(), Duration::from_millis(10));
        opts.max_shard_bytes = 2048;
        let (leader_tx, leader_rx) = watch::channel(crate::leader::Leadership::default());
        let shutdown = CancellationToken::new();
        let task = spawn(
            client.clone(),
            shared.clone(),
            Metrics::default(),
            opts,
            shutdown.clone(),
            Some(leader_rx),
        );
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), "kd");
        // A leader whose clusters are not listed yet does not write, nor does a
        // standby with listed clusters (checked after many coalescing
        // windows; no timing target).
        crate::leader::publish(&leader_tx, true);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            api.get_opt("snap").await.unwrap().is_none(),
            "written before the first list"
        );
        crate::leader::publish(&leader_tx, false);
        shared.update_cluster("", |c| c.listed = true);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            api.get_opt("snap").await.unwrap().is_none(),
            "a standby wrote"
        );
        crate::leader::publish(&leader_tx, true);
        let want = dump_of(&shared);
        wait_read(&client, &want).await;
        let idx =
            dump::parse_index(&api.get("snap").await.unwrap().data.unwrap()[INDEX_KEY]).unwrap();
        assert!(idx.shards.len() > 1, "{} shards", idx.shards.len());
        // A change is followed.
        shared.set_desired(&ServiceKey::new("", "ns", "s00"), None);
        let want = dump_of(&shared);
        wait_read(&client, &want).await;
        shutdown.cancel();
        task.await.unwrap();
    }

    /// Issue 16 item 3, the snapshot's side: a round of a replica that does
    /// not lead (or whose epoch ended) sends nothing and fails as `Fenced`.
    #[tokio::test]
    async fn a_round_without_the_lease_sends_nothing() {
        let (_sim, client, _dir) = sim_client().await;
        let shared = state(3);
        let (tx, rx) = watch::channel(Leadership::default());
        let opts = SnapshotOptions::new("kd".into(), "snap".into(), Duration::from_millis(10));
        let mut task = Task {
            fence: Fence::new(rx),
            label: dump::label_value(&opts.name),
            api: Api::namespaced(client.clone(), "kd"),
            shared: shared.clone(),
            metrics: Metrics::default(),
            opts,
            seen: HashMap::new(),
            written_rv: HashMap::new(),
            layout: None,
            layout_gen: None,
        };
        let mut generation = shared.subscribe();
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), "kd");
        let e = task.round(&mut generation).await.unwrap_err();
        assert!(e.is_fenced(), "{e}");
        assert!(api.get_opt("snap").await.unwrap().is_none());
        crate::leader::publish(&tx, true);
        task.round(&mut generation).await.unwrap();
        assert!(api.get_opt("snap").await.unwrap().is_some());
    }

    #[tokio::test]
    async fn generation_signal_fires_on_state_changes() {
        let shared = ControllerState::new([""]);
        let mut rx = shared.subscribe();
        assert!(!rx.has_changed().unwrap());
        shared.update_cluster("", |c| c.listed = true);
        assert!(rx.has_changed().unwrap());
        rx.borrow_and_update();
        // Status details the dump does not contain signal nothing.
        shared.update_cluster("", |c| {
            c.synced = true;
            c.lists += 1;
            c.last_error = Some("x".into());
        });
        assert!(!rx.has_changed().unwrap());
        shared.set_desired(&ServiceKey::new("", "a", "b"), None);
        assert!(rx.has_changed().unwrap());
        rx.borrow_and_update();
        shared.update_cluster("new", |_| {});
        assert!(rx.has_changed().unwrap(), "a new cluster is in the dump");
    }
}
