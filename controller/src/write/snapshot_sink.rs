//! The ConfigMap snapshot sink (`kube_discovery.sinks.configmap`): the whole
//! discovered state, in APISIX's dump shape, in ConfigMaps of one namespace on
//! the home cluster, for gateways that mount a file instead of reading
//! DiscoveredServices. The layout (index + shards, hashes, sizes) is the pure
//! [`kube_discovery_core::snapshot`]; every decision (when a round runs, what to
//! apply in which order, what to delete, retries, leadership) is the pure
//! [`kube_discovery_core::snapshot_plan::Planner`], tested there with
//! scripted inputs and golden files. This module is its executor: it runs
//! the watch, builds the layout when asked, sends the requests (fenced, with
//! the client's timeout) and feeds the results back; it also reads the
//! snapshot back.
//!
//! ```text
//!  ControllerState generation, every cluster listed? ──┐
//!  leadership (epoch, leading) ────────────────────────┤
//!  ConfigMap watch (label kubediscovery.io/snapshot=<name>):
//!     relist, applied, deleted ────────────────────────┼─▶ Planner::handle / poll ─▶ actions
//!  the answer of the request in flight ────────────────┤
//!  the wake-up the planner asked for ──────────────────┘
//!
//!  actions: Build ─▶ dump::Builder::build(ControllerState's Arcs) ─▶ Built (fed back at once)
//!           Apply / Delete {name, epoch} ─▶ one request at a time: fence check, SSA / DELETE
//!                                        ─▶ Written / Deleted / Failed / Fenced
//!           Done / Retry / Dropped ─▶ gauges, snapshot_writes_total, log
//!
//!  a round (the planner's): 1. shards whose text differs from what the watch shows
//!  2. the index <name> (index.json: version, shard names + sha256) LAST
//!  3. delete labelled ConfigMaps the index does not list (old shards)
//! ```
//!
//! * **No needless writes.** What the API server holds is known from the
//!   label-selected watch; an object is written only when its data key
//!   differs from the desired text or it lacks our labels. Events of our own
//!   writes therefore cause no writes, and a restart with an unchanged state
//!   writes nothing. A watch event older than our last write of that object
//!   (smaller resourceVersion) is ignored so a lagging event does not undo a
//!   newer write.
//! * **At most one round per coalescing window**: a state change after a
//!   quiet window starts one at once, a burst is one round per window.
//! * **Never a partial state.** Nothing is written before every cluster has
//!   completed its first list, and only by the leader.
//! * **Fenced.** A round belongs to the leadership epoch it starts in; a
//!   lost lease drops it at once (the planner sends nothing more), and each
//!   request checks right before it is sent that its epoch is still the
//!   current leading one ([`crate::k8s::leader::Fence`]), for a loss the planner
//!   has not seen yet (`snapshot_writes_total{result="fenced"}`, no retry
//!   until it leads again).
//! * **Drift.** An edited or deleted index or shard shows up on the watch and
//!   is rewritten in the next round (one coalescing window later); a labelled
//!   ConfigMap of this snapshot that the index does not list is deleted. Keys
//!   other than ours that someone adds are left alone (readers ignore them).
//! * **Readers** (`kube_discovery_client::snapshot::{read, read_dir}`)
//!   assemble the shards with [`kube_discovery_core::snapshot::assemble`], which
//!   refuses mixed versions; a shard being rewritten or just deleted means
//!   "read again".
//!
//! RBAC: `list`, `watch`, `create`, `patch`, `delete` on `configmaps` in the
//! snapshot namespace (`rbac/optional/configmap-snapshot.yaml`; `create`
//! because the API server also authorizes an apply that creates the object).
//! Known gap: someone making a snapshot ConfigMap `immutable: true` makes its
//! repair fail (retried with backoff, logged) until it is deleted.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::watcher::{Event, watcher};
use kube_discovery_core::snapshot::{self as dump, Dump};
use kube_discovery_core::snapshot_plan::{self, Action, At, Input, Observed, Planner};
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::k8s::leader::{Fence, Leadership};
use crate::k8s::watch::Watch;
use crate::serve::metrics::Metrics;
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
    /// Whether a state change after a quiet window starts a round at once
    /// (the writer's `coalesce_leading_edge`).
    pub coalesce_leading_edge: bool,
    /// First retry delay after a failed round.
    pub retry_min: Duration,
    /// Largest retry delay.
    pub retry_max: Duration,
    /// Server-side timeout of the ConfigMap watch (`None`: the API's
    /// default; `run` sets [`crate::k8s::client::watch_renewal`]).
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
            coalesce_leading_edge: true,
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

/// What the planner needs of ConfigMap `name` (data hashed).
fn observed(name: &str, cm: &ConfigMap, label: &str) -> Observed {
    let rv = cm
        .metadata
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok());
    let labelled = cm
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(SNAPSHOT_LABEL))
        .is_some_and(|v| v == label);
    let data = cm
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.as_str(), v.as_str()));
    Observed::new(name, rv, data, labelled)
}

/// A watched ConfigMap for the planner (`None`: it has no name).
fn watched(cm: &ConfigMap, label: &str) -> Option<Observed> {
    let name = cm.metadata.name.as_deref()?;
    Some(observed(name, cm, label))
}

/// Spawns the snapshot task. It writes only while `leader` says this
/// replica leads (or always, without leader election), every request fenced
/// by the epoch the planner decided it in.
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
    let task = Task::new(api, shared, metrics, opts, fence);
    tokio::spawn(task.run(shutdown, leader))
}

/// The one request of a round in flight; it ends with the planner's input.
type Request = Pin<Box<dyn Future<Output = Input> + Send>>;

/// The executor: runs the watch, builds layouts, sends requests, and feeds
/// everything to the [`Planner`], which decides.
struct Task {
    /// Checked right before every request.
    fence: Fence,
    api: Api<ConfigMap>,
    shared: Arc<ControllerState>,
    generation: watch::Receiver<u64>,
    metrics: Metrics,
    opts: SnapshotOptions,
    label: String,
    planner: Planner,
    /// Keeps the entries and shards of earlier rounds (an error: the
    /// budget is invalid, every build fails with it).
    builder: std::result::Result<dump::Builder, dump::BuildError>,
    origin: Instant,
    /// The round's request in flight (at most one, the planner's rule).
    request: Option<Request>,
}

impl Task {
    fn new(
        api: Api<ConfigMap>,
        shared: Arc<ControllerState>,
        metrics: Metrics,
        opts: SnapshotOptions,
        fence: Fence,
    ) -> Self {
        let planner = Planner::new(snapshot_plan::Options {
            name: opts.name.clone(),
            coalesce_window: opts.coalesce_window,
            coalesce_leading_edge: opts.coalesce_leading_edge,
            retry_min: opts.retry_min,
            retry_max: opts.retry_max,
        });
        Task {
            builder: dump::Builder::new(&opts.name, opts.max_shard_bytes),
            fence,
            api,
            generation: shared.subscribe(),
            shared,
            metrics,
            label: dump::label_value(&opts.name),
            opts,
            planner,
            origin: Instant::now(),
            request: None,
        }
    }

    fn now(&self) -> At {
        self.origin.elapsed()
    }

    /// Feeds `input` (or polls, for `None`) and carries out the actions;
    /// returns when the planner wants to be polled again.
    fn feed(&mut self, input: Option<Input>) -> Option<Instant> {
        let now = self.now();
        let mut plan = match input {
            Some(input) => self.planner.handle(now, input),
            None => self.planner.poll(now),
        };
        loop {
            let mut answer = None;
            for action in plan.actions {
                answer = answer.or(self.execute(action));
            }
            match answer {
                Some(input) => plan = self.planner.handle(self.now(), input),
                None => return plan.wake.map(|w| self.origin + w),
            }
        }
    }

    /// Carries out one action; a layout build is answered at once.
    fn execute(&mut self, action: Action) -> Option<Input> {
        match action {
            Action::Build => return Some(self.build()),
            Action::Apply {
                name,
                key,
                text,
                epoch,
            } => self.start(self.apply(name, key, text, epoch)),
            Action::Delete { name, epoch } => self.start(self.delete(name, epoch)),
            Action::Done(s) => {
                self.metrics.snapshot_shards.set(gauge(s.shards));
                self.metrics.snapshot_bytes.set(gauge(s.bytes));
                if s.published {
                    let now = jiff::Timestamp::now().as_second();
                    self.metrics.snapshot_last_write.set(now);
                    tracing::info!(version = %s.version, shards = s.shards, services = s.services, nodes = s.nodes, objects_written = s.written, "snapshot published");
                } else if s.written > 0 {
                    tracing::info!(version = %s.version, objects_written = s.written, "snapshot repaired");
                }
            }
            Action::Retry {
                reason,
                attempt,
                delay,
            } => {
                tracing::warn!(error = %reason, attempt, retry_in = ?delay, "snapshot: write failed");
            }
            Action::Dropped => {
                // Lost the lease during the round: not a failure; the next
                // round comes when it leads again.
                self.metrics.snapshot_write("fenced");
                let now = self.fence.current();
                tracing::info!(
                    epoch = now.epoch,
                    leading = now.leading,
                    "snapshot: round dropped: not the leader"
                );
            }
        }
        None
    }

    fn start(&mut self, request: Request) {
        debug_assert!(
            self.request.is_none(),
            "the planner sends one request at a time"
        );
        self.request = Some(request);
    }

    /// The layout of the current state, and the generation it holds (at
    /// least: a change after the read is reported again). Incremental
    /// ([`dump::Builder`]): a round after one change costs the changed
    /// services and shards, not the whole state (issue 19 item 2).
    fn build(&mut self) -> Input {
        let generation = *self.generation.borrow_and_update();
        // The `Arc`s only, under the lock (no node list is copied); the
        // builder reuses what it built of every value it has seen before.
        let clusters = self.shared.clusters();
        let services = self
            .shared
            .with_desired(|all| all.values().cloned().collect::<Vec<_>>());
        let built = match self.builder.as_mut() {
            Ok(b) => b.build(clusters.keys().map(String::as_str), &services),
            Err(e) => Err(e.clone()),
        };
        match built {
            Ok(layout) => Input::Built {
                generation,
                layout: Arc::new(layout),
            },
            Err(e) => Input::BuildFailed(Error::Snapshot(e).to_string()),
        }
    }

    fn apply(&self, name: String, key: String, text: String, epoch: u64) -> Request {
        let (api, fence, metrics, label) = (
            self.api.clone(),
            self.fence.clone(),
            self.metrics.clone(),
            self.label.clone(),
        );
        let namespace = self.opts.namespace.clone();
        Box::pin(async move {
            if fence.check_epoch(epoch).is_err() {
                return Input::Fenced;
            }
            let cm = json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": {
                        "app.kubernetes.io/managed-by": "kube-discovery",
                        (SNAPSHOT_LABEL): label,
                    },
                },
                "data": { (key): text },
            });
            let pp = PatchParams::apply(FIELD_MANAGER).force();
            let Ok(sent) = fence
                .send_epoch(epoch, api.patch(&name, &pp, &Patch::Apply(&cm)))
                .await
            else {
                return Input::Fenced;
            };
            match sent {
                Ok(got) => {
                    metrics.snapshot_write("applied");
                    tracing::debug!(configmap = %name, bytes = text.len(), "snapshot: wrote");
                    Input::Written(observed(&name, &got, &label))
                }
                Err(e) => {
                    let e = Error::from(e);
                    metrics.snapshot_write(&format!("error_{}", e.metric_label()));
                    Input::Failed(format!("ConfigMap {name}: {e}"))
                }
            }
        })
    }

    fn delete(&self, name: String, epoch: u64) -> Request {
        let (api, fence, metrics) = (self.api.clone(), self.fence.clone(), self.metrics.clone());
        Box::pin(async move {
            if fence.check_epoch(epoch).is_err() {
                return Input::Fenced;
            }
            let Ok(sent) = fence
                .send_epoch(epoch, api.delete(&name, &DeleteParams::default()))
                .await
            else {
                return Input::Fenced;
            };
            match sent {
                Ok(_) => {
                    metrics.snapshot_write("deleted");
                    tracing::info!(configmap = %name, "snapshot: deleted stale ConfigMap");
                    Input::Deleted { name }
                }
                Err(kube::Error::Api(s)) if s.code == 404 => Input::Deleted { name },
                Err(e) => {
                    let e = Error::from(e);
                    metrics.snapshot_write(&format!("error_{}", e.metric_label()));
                    Input::Failed(format!("ConfigMap {name}: {e}"))
                }
            }
        })
    }

    async fn run(
        mut self,
        shutdown: CancellationToken,
        mut leader: Option<watch::Receiver<Leadership>>,
    ) {
        let mut stream = Watch::new(watcher(
            self.api.clone(),
            crate::k8s::watch::config(self.opts.watch_timeout).labels(&self.opts.selector()),
        ));
        let mut listing: Option<Vec<Observed>> = None;
        let first = leader.as_mut().map_or(
            Leadership {
                epoch: 0,
                leading: true,
                until: None,
            },
            |l| *l.borrow_and_update(),
        );
        self.feed(Some(Input::Leadership {
            epoch: first.epoch,
            leading: first.leading,
        }));
        let mut wake = self.feed(Some(Input::AllClustersListed(all_listed(&self.shared))));
        tracing::info!(namespace = %self.opts.namespace, name = %self.opts.name, "snapshot sink enabled");
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                r = self.generation.changed() => {
                    if r.is_err() {
                        break;
                    }
                    let generation = *self.generation.borrow_and_update();
                    self.feed(Some(Input::AllClustersListed(all_listed(&self.shared))));
                    wake = self.feed(Some(Input::StateChanged { generation }));
                }
                now = leader_changed(&mut leader) => {
                    if now.leading {
                        tracing::info!("snapshot: leader, writing");
                    }
                    wake = self.feed(Some(Input::Leadership { epoch: now.epoch, leading: now.leading }));
                }
                input = async { self.request.as_mut().expect("guarded").await }, if self.request.is_some() => {
                    self.request = None;
                    wake = self.feed(Some(input));
                }
                ev = stream.next() => {
                    let Some(ev) = ev else { break };
                    let input = match ev {
                        Ok(Event::Init) => {
                            listing = Some(Vec::new());
                            None
                        }
                        Ok(Event::InitApply(cm)) => {
                            if let (Some(l), Some(o)) = (listing.as_mut(), watched(&cm, &self.label)) {
                                l.push(o);
                            }
                            None
                        }
                        Ok(Event::InitDone) => Some(Input::WatchListed(listing.take().unwrap_or_default())),
                        Ok(Event::Apply(cm)) => watched(&cm, &self.label).map(Input::Observed),
                        Ok(Event::Delete(cm)) => watched(&cm, &self.label).map(Input::Gone),
                        Err(e) => {
                            tracing::warn!(error = %e, "snapshot: ConfigMap watch failed; retrying with backoff");
                            None
                        }
                    };
                    if input.is_some() {
                        wake = self.feed(input);
                    }
                }
                () = sleep_until_opt(wake) => wake = self.feed(None),
            }
        }
        // A request in flight is not cut off (it is bounded by the client's
        // request timeout); nothing new starts.
        if let Some(request) = self.request.take() {
            request.await;
        }
        tracing::info!("snapshot sink stopped");
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

async fn sleep_until_opt(when: Option<Instant>) {
    match when {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
