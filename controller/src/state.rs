//! The process-wide state, [`ControllerState`]: the desired nodes of every service
//! (written by the sources from the pure core `Index`, read by the writer at
//! write time, by the drift checks and by the HTTP API) and the status of
//! every cluster (listed? written? which of its watches fail?) and of leader
//! election's Lease: what `/readyz` answers.
//!
//! ```text
//!  source ── set_desired_arc(key, Arc) ─▶ ControllerState ◀── desired(key) ── writer, drift, http
//!         ── update_cluster(listed..) ─▶                 ── subscribe() ───▶ snapshot sink
//! ```
//!
//! The writer only queues *keys* and reads the desired value from here when it
//! is about to write, so a newer desired state always replaces an older pending
//! one and nothing is ever written stale.
//!
//! Values are `Arc<ServiceNodes>`: the sources hand in the index's own
//! allocation ([`ControllerState::set_desired_arc`]), so the nodes of a service are
//! held once, not once in the index and again here. The table is a set of
//! those `Arc`s ordered by the key INSIDE each value ([`Desired`]), not a map
//! with a second copy of every key.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use kube_discovery_core::write_plan::DesiredView;
use kube_discovery_core::{ServiceKey, ServiceNodes};
use serde::Serialize;

/// A long-running task that ended while the controller was not shutting
/// down, or panicked (`/healthz` says which; the process then exits non-zero).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct TaskDeath {
    /// The task (`source <cluster>`, `writer`, `leader election`, ...).
    pub task: String,
    /// What happened: the panic message, or that it returned.
    pub cause: String,
}

/// Status of one cluster as shown by `/readyz`.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct ClusterStatus {
    /// The first complete list has been received and indexed.
    pub listed: bool,
    /// Everything from the first complete list has been written (or found
    /// already up to date on the API server).
    pub synced: bool,
    /// Number of complete lists so far (1 + relists).
    pub lists: u64,
    /// The watches of the cluster that are failing now, by kind
    /// (`EndpointSlice`, `Endpoints`, `Service`): each one's health is its
    /// own ([`ControllerState::watch_failed`] / [`ControllerState::watch_ok`]),
    /// so a Service watch that works does not hide an endpoint watch that
    /// does not.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub failing_watches: BTreeMap<String, WatchStatus>,
}

/// A failing watch (or the Lease of leader election).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct WatchStatus {
    /// The last error, as a safe summary ([`crate::k8s::redact`]): never the raw
    /// error text, which may carry credentials or a credential plugin's output.
    pub last_error: String,
    /// The first error after the watch last succeeded.
    #[serde(skip)]
    pub failing_since: std::time::Instant,
}

impl WatchStatus {
    fn failing_for(&self, now: std::time::Instant) -> std::time::Duration {
        now.saturating_duration_since(self.failing_since)
    }
}

impl ClusterStatus {
    /// How long the longest failing watch of the cluster has been failing at
    /// `now` (`None`: none is).
    pub fn failing_for(&self, now: std::time::Instant) -> Option<std::time::Duration> {
        self.failing_watches
            .values()
            .map(|w| w.failing_for(now))
            .max()
    }
}

/// Why the process is unready although its clusters are synced: a watch, or
/// the Lease, failing for longer than `unready_after`
/// ([`ControllerState::failing_too_long`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unready {
    /// The cluster of the watch (`None`: the leader election Lease).
    pub cluster: Option<String>,
    /// The kind watched (`EndpointSlice`, `Endpoints`, `Service`; `Lease`).
    pub watch: String,
    /// How long it has been failing.
    pub failing_for: std::time::Duration,
    /// Its last error (a safe summary).
    pub last_error: String,
}

impl std::fmt::Display for Unready {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = self.failing_for.as_secs();
        match &self.cluster {
            Some(id) => write!(
                f,
                "cluster {id:?}: watch failing for {secs}s: {} watch: {}",
                self.watch, self.last_error
            ),
            None => write!(
                f,
                "leader election: the Lease cannot be read or written for {secs}s (this replica cannot lead): {}",
                self.last_error
            ),
        }
    }
}

/// One desired service, ordered and looked up by its own key.
#[derive(Debug, Clone)]
struct ByKey(Arc<ServiceNodes>);

impl PartialEq for ByKey {
    fn eq(&self, other: &Self) -> bool {
        self.0.key == other.0.key
    }
}

impl Eq for ByKey {}

impl PartialOrd for ByKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ByKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.key.cmp(&other.0.key)
    }
}

// `Ord` of `ByKey` is `Ord` of its key, as `Borrow` requires.
impl Borrow<ServiceKey> for ByKey {
    fn borrow(&self) -> &ServiceKey {
        &self.0.key
    }
}

/// The desired services, ordered by key (what [`ControllerState::with_desired`] shows).
#[derive(Debug, Default)]
pub struct Desired(BTreeSet<ByKey>, Journal);

/// How many of the latest desired-state changes [`ControllerState::desired_since`]
/// can tell one by one; a follower further behind gets the whole state.
const JOURNAL: usize = 16_384;

/// The keys of the latest desired-state changes, in order: the change numbered
/// `next - keys.len() + i` is `keys[i]`. A follower of every change (the xDS
/// hub) reads the keys changed since it last looked instead of diffing all
/// services per wake (at 10,000 services and 500 changes/s that diff was 37 %
/// of the controller's CPU, BENCHMARKS.md).
#[derive(Debug, Default)]
struct Journal {
    next: u64,
    keys: std::collections::VecDeque<ServiceKey>,
}

/// What changed in the desired state since a follower's last look.
#[derive(Debug)]
pub enum DesiredSince {
    /// The services changed since then (once each, in key order) with their
    /// desired nodes now (`None`: gone).
    Changed(Vec<(ServiceKey, Option<Arc<ServiceNodes>>)>),
    /// Too far behind (or a first look): every desired service, in key order.
    All(Vec<Arc<ServiceNodes>>),
}

impl Desired {
    /// The desired nodes of `key`.
    pub fn get(&self, key: &ServiceKey) -> Option<&Arc<ServiceNodes>> {
        self.0.get(key).map(|e| &e.0)
    }

    /// Whether `key` has desired nodes.
    pub fn contains_key(&self, key: &ServiceKey) -> bool {
        self.0.contains(key)
    }

    /// All desired services, ordered by key.
    pub fn values(&self) -> impl Iterator<Item = &Arc<ServiceNodes>> {
        self.0.iter().map(|e| &e.0)
    }

    /// Number of desired services.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no service is desired.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The process-wide state (see the module docs); one per process, behind an `Arc`.
#[derive(Debug, Default)]
pub struct ControllerState {
    desired: RwLock<Desired>,
    clusters: RwLock<BTreeMap<String, ClusterStatus>>,
    standby: AtomicBool,
    /// The first long-running task that died (`/healthz` fails with it).
    died: Mutex<Option<TaskDeath>>,
    /// `kube_discovery.unready_after`: a watch, or the Lease, failing for
    /// longer makes the process unready (`None`: never).
    unready_after: RwLock<Option<std::time::Duration>>,
    /// Services whose object name another kube-discovery instance holds
    /// (the object and that instance, per service): unready while any.
    held_by_others: RwLock<BTreeMap<String, (String, String)>>,
    /// Leader election's Lease requests are failing (errors or timeouts,
    /// not another replica holding it): since when, and the last error.
    lease: Mutex<Option<WatchStatus>>,
    /// Bumped on every change of `desired` and when a cluster appears or its
    /// `listed` flag flips: a cheap "something changed" signal for consumers
    /// of the whole state (the snapshot sink).
    generation: tokio::sync::watch::Sender<u64>,
}

fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl ControllerState {
    /// Creates the state with the given clusters registered (not listed yet).
    pub fn new<'a>(clusters: impl IntoIterator<Item = &'a str>) -> Self {
        let s = Self::default();
        {
            let mut c = write(&s.clusters);
            for id in clusters {
                c.insert(id.to_string(), ClusterStatus::default());
            }
        }
        s
    }

    /// Sets (`Some`) or removes (`None`) the desired nodes of `key`.
    pub fn set_desired(&self, key: &ServiceKey, value: Option<ServiceNodes>) {
        self.set_desired_arc(key, value.map(Arc::new));
    }

    /// [`ControllerState::set_desired`] with the producer's own `Arc` (the index's),
    /// without copying the nodes. A value is stored under its own
    /// `key` field, which callers pass as `key`; one that names another
    /// service is a bug of the caller and is stored as a copy carrying `key`.
    pub fn set_desired_arc(&self, key: &ServiceKey, value: Option<Arc<ServiceNodes>>) {
        let value = value.map(|v| {
            if v.key == *key {
                v
            } else {
                tracing::error!(service = %key, value_of = %v.key, "desired state handed in under another service's key");
                Arc::new(ServiceNodes {
                    key: key.clone(),
                    ..(*v).clone()
                })
            }
        });
        {
            let mut d = write(&self.desired);
            d.1.next += 1;
            if d.1.keys.len() == JOURNAL {
                d.1.keys.pop_front();
            }
            d.1.keys.push_back(key.clone());
            match value {
                // `replace`, not `insert`: an equal entry (same key) is
                // swapped for the new value.
                Some(v) => {
                    d.0.replace(ByKey(v));
                }
                None => {
                    d.0.remove(key);
                }
            }
        }
        self.bump();
    }

    fn bump(&self) {
        self.generation.send_modify(|g| *g = g.wrapping_add(1));
    }

    /// A receiver that is marked changed whenever the desired state or a
    /// cluster status changes (the value is a generation counter).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// Runs `f` on all desired services under one read lock (a consistent
    /// view across clusters, without cloning).
    pub fn with_desired<R>(&self, f: impl FnOnce(&Desired) -> R) -> R {
        f(&read(&self.desired))
    }

    /// What changed since the cursor `since` (`None`: nothing seen yet), and
    /// the cursor to pass next time; one read lock, so consistent with it.
    pub fn desired_since(&self, since: Option<u64>) -> (u64, DesiredSince) {
        let d = read(&self.desired);
        let j = &d.1;
        let first = j.next - j.keys.len() as u64;
        let changed = match since {
            Some(s) if s >= first && s <= j.next => {
                let keys: BTreeSet<&ServiceKey> = j.keys.range((s - first) as usize..).collect();
                DesiredSince::Changed(
                    keys.into_iter()
                        .map(|k| (k.clone(), d.get(k).cloned()))
                        .collect(),
                )
            }
            _ => DesiredSince::All(d.values().cloned().collect()),
        };
        (j.next, changed)
    }

    /// The desired nodes of `key` (`None`: the source is gone). The `Arc`, not
    /// a copy: a write or a drift check of a big service copies no nodes.
    pub fn desired(&self, key: &ServiceKey) -> Option<Arc<ServiceNodes>> {
        read(&self.desired).get(key).cloned()
    }

    /// All desired services of `cluster`.
    pub fn desired_of(&self, cluster: &str) -> Vec<Arc<ServiceNodes>> {
        read(&self.desired)
            .values()
            .filter(|s| s.key.cluster == cluster)
            .cloned()
            .collect()
    }

    /// Whether `key` currently has desired nodes.
    pub fn has_desired(&self, key: &ServiceKey) -> bool {
        read(&self.desired).contains_key(key)
    }

    /// `(services, nodes)` of `cluster`.
    pub fn counts(&self, cluster: &str) -> (usize, usize) {
        let d = read(&self.desired);
        d.values()
            .filter(|s| s.key.cluster == cluster)
            .fold((0, 0), |(s, n), v| (s + 1, n + v.node_count()))
    }

    /// Updates the status of `cluster` in place.
    pub fn update_cluster(&self, cluster: &str, f: impl FnOnce(&mut ClusterStatus)) {
        let listed_changed = {
            let mut c = write(&self.clusters);
            let known = c.contains_key(cluster);
            let s = c.entry(cluster.to_string()).or_default();
            let before = s.listed;
            f(s);
            !known || before != s.listed
        };
        // Only what the whole-state consumers depend on (which clusters exist
        // and are listed) signals a change; sync flags and errors do not.
        if listed_changed {
            self.bump();
        }
    }

    /// Whether `cluster` finished its first complete list (`false` for an
    /// unknown cluster). A read lock, no copy: the writer asks per drift
    /// check and per stale key, where [`ControllerState::clusters`] would
    /// clone every cluster's status each time.
    pub fn listed(&self, cluster: &str) -> bool {
        read(&self.clusters).get(cluster).is_some_and(|c| c.listed)
    }

    /// Snapshot of all cluster statuses.
    pub fn clusters(&self) -> BTreeMap<String, ClusterStatus> {
        read(&self.clusters).clone()
    }

    /// Records that a long-running task died (the first one is kept):
    /// `/healthz` fails from now on, naming it.
    pub fn set_task_died(&self, death: TaskDeath) {
        let mut d = self.died.lock().unwrap_or_else(PoisonError::into_inner);
        if d.is_none() {
            *d = Some(death);
        }
    }

    /// The first long-running task that died, if any.
    pub fn task_died(&self) -> Option<TaskDeath> {
        self.died
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Marks this replica as a leader-election standby (it does not write).
    pub fn set_standby(&self, standby: bool) {
        self.standby.store(standby, Ordering::Relaxed);
        if standby {
            // A standby writes nothing, so it holds no name up.
            write(&self.held_by_others).clear();
        }
    }

    /// The object of `service` is (`Some((object, instance))`) or is no
    /// longer (`None`) held by another kube-discovery instance.
    pub fn set_held_by_other(&self, service: &ServiceKey, held: Option<(String, String)>) {
        let key = service.to_string();
        match held {
            Some(h) => {
                write(&self.held_by_others).insert(key, h);
            }
            None => {
                if read(&self.held_by_others).contains_key(&key) {
                    write(&self.held_by_others).remove(&key);
                }
            }
        }
    }

    /// Why this instance is unready because of names other instances hold:
    /// one line naming the objects (at most 10) and what to do.
    pub fn held_by_others(&self) -> Option<String> {
        let held = read(&self.held_by_others);
        if held.is_empty() {
            return None;
        }
        let mut instances: Vec<&str> = held.values().map(|(_, i)| i.as_str()).collect();
        instances.sort_unstable();
        instances.dedup();
        let objects: Vec<String> = held
            .iter()
            .take(10)
            .map(|(svc, (obj, i))| format!("{obj} (service {svc}, instance {i:?})"))
            .collect();
        let more = held.len().saturating_sub(objects.len());
        Some(format!(
            "{} DiscoveredService(s) this instance must write belong to other kube-discovery instances, so readers see their (frozen) content: {}{}; if {} no longer run(s) under that name (renamed: a Helm reinstall under another release name), list it in kube_discovery.adopt_instances to take its objects over, else give the two installations services of their own",
            held.len(),
            objects.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            },
            instances.join(", "),
        ))
    }

    /// Whether this replica is a standby.
    pub fn standby(&self) -> bool {
        self.standby.load(Ordering::Relaxed)
    }

    /// Sets `kube_discovery.unready_after` (see [`ControllerState::ready`]).
    pub fn set_unready_after(&self, after: std::time::Duration) {
        *write(&self.unready_after) = Some(after);
    }

    /// The watch of `kind` (`EndpointSlice`, `Endpoints`, `Service`) of
    /// `cluster` failed with `error` (a safe summary, see
    /// [`crate::k8s::redact`]): remembered as its last error; it is failing from
    /// now on unless it already was.
    pub fn watch_failed(&self, cluster: &str, kind: &str, error: String) {
        self.update_cluster(cluster, |c| {
            let now = std::time::Instant::now();
            c.failing_watches
                .entry(kind.to_string())
                .and_modify(|w| w.last_error.clone_from(&error))
                .or_insert_with(|| WatchStatus {
                    last_error: error.clone(),
                    failing_since: now,
                });
        });
    }

    /// The watch of `kind` of `cluster` itself succeeded (its list completed,
    /// it delivered an event, or the API server answered its watch request):
    /// it is no longer failing. Another watch or request of the same client
    /// does not count. Cheap when it was not failing (a read lock).
    pub fn watch_ok(&self, cluster: &str, kind: &str) {
        let failing = read(&self.clusters)
            .get(cluster)
            .is_some_and(|c| c.failing_watches.contains_key(kind));
        if failing {
            self.update_cluster(cluster, |c| {
                c.failing_watches.remove(kind);
            });
        }
    }

    fn lease_state(&self) -> std::sync::MutexGuard<'_, Option<WatchStatus>> {
        self.lease.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A leader election round failed (the Lease could not be read or
    /// written, or the round timed out) with `error` (a safe summary).
    /// Returns whether it was working until now (the caller logs a change
    /// once, not every retry).
    pub fn lease_failed(&self, error: String) -> bool {
        let mut l = self.lease_state();
        match l.as_mut() {
            Some(w) => {
                w.last_error = error;
                false
            }
            None => {
                *l = Some(WatchStatus {
                    last_error: error,
                    failing_since: std::time::Instant::now(),
                });
                true
            }
        }
    }

    /// A leader election round succeeded (whoever holds the Lease). Returns
    /// whether it was failing until now.
    pub fn lease_ok(&self) -> bool {
        self.lease_state().take().is_some()
    }

    /// Whether leader election's Lease requests are failing now.
    pub fn lease_failing(&self) -> bool {
        self.lease_state().is_some()
    }

    /// What has been failing for longer than `unready_after` at `now`:
    /// every watch of every cluster, then the Lease.
    pub fn failing_too_long(&self, now: std::time::Instant) -> Vec<Unready> {
        let Some(after) = *read(&self.unready_after) else {
            return Vec::new();
        };
        let mut out: Vec<Unready> = read(&self.clusters)
            .iter()
            .flat_map(|(id, c)| {
                c.failing_watches.iter().map(move |(kind, w)| Unready {
                    cluster: Some(id.clone()),
                    watch: kind.clone(),
                    failing_for: w.failing_for(now),
                    last_error: w.last_error.clone(),
                })
            })
            .filter(|u| u.failing_for > after)
            .collect();
        if let Some(w) = self.lease_state().as_ref()
            && w.failing_for(now) > after
        {
            out.push(Unready {
                cluster: None,
                watch: "Lease".to_string(),
                failing_for: w.failing_for(now),
                last_error: w.last_error.clone(),
            });
        }
        out
    }

    /// Ready when every registered cluster is synced (and there is at least
    /// one), no watch and no leader election round has been failing for
    /// longer than `unready_after` (stale data, or a replica that can never
    /// lead, must not look ready), and no name it must write is held by
    /// another kube-discovery instance (readers would trust that instance's
    /// frozen objects). A standby, which does not write, is ready once every
    /// cluster is listed: it serves the HTTP API and is warm for a takeover
    /// (while it can read the Lease).
    pub fn ready(&self) -> bool {
        let standby = self.standby();
        let synced = {
            let c = read(&self.clusters);
            !c.is_empty() && c.values().all(|s| s.synced || (standby && s.listed))
        };
        synced
            && self.failing_too_long(std::time::Instant::now()).is_empty()
            && read(&self.held_by_others).is_empty()
    }
}

/// The desired state as the core reads it (the planner, the drift checks
/// over the record): always the latest.
impl DesiredView for ControllerState {
    fn version(&self, key: &ServiceKey) -> Option<String> {
        self.desired(key).map(|d| d.version.clone())
    }
    fn listed(&self, cluster: &str) -> bool {
        ControllerState::listed(self, cluster)
    }
    fn clusters(&self) -> Vec<(String, bool)> {
        ControllerState::clusters(self)
            .into_iter()
            .map(|(id, c)| (id, c.listed))
            .collect()
    }
    fn keys_of(&self, cluster: &str) -> Vec<ServiceKey> {
        self.desired_of(cluster)
            .iter()
            .map(|d| d.key.clone())
            .collect()
    }
    fn nodes(&self, key: &ServiceKey) -> Option<Arc<ServiceNodes>> {
        self.desired(key)
    }
}

#[cfg(test)]
mod tests;
