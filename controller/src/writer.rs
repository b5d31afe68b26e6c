//! The writer: turns "these keys changed" into as few API writes as possible.
//!
//! ```text
//!  WriterMsg::Changed(keys) ──▶ pending{key: due = first change + window}
//!                                   │ due, not in flight, < concurrency, rate token
//!                                   ▼
//!              desired = Shared::desired(key)      (always the LATEST state)
//!              ├─ Some(v), known[key] == v.version ─▶ skip (no write)
//!              ├─ Some(v)                           ─▶ Sink::apply(v)  ─▶ known[key] = v.version
//!              ├─ None, key in known                ─▶ Sink::delete    ─▶ known.remove(key)
//!              └─ None, unknown                     ─▶ nothing
//!              failure ─▶ back into pending with exponential backoff (never dropped)
//! ```
//!
//! * `known` starts from [`Sink::list_versions`] (the objects the API server
//!   already holds), so a restart with unchanged sources writes nothing.
//! * Coalescing: a key's write is due `coalesce_window` after its FIRST change
//!   since the last write; later changes inside the window ride along, so a
//!   rolling update's burst becomes one write per window.
//! * One write per key at a time (no reordering), at most `concurrency` in
//!   flight overall, at most `qps` writes per second (token bucket).
//! * `WriterMsg::Synced(cluster)` is a barrier sent by a source after its first
//!   complete list: objects of that cluster the API server holds but the list
//!   did not produce are queued for deletion, and the cluster becomes `synced`
//!   (readiness) once every key queued before the barrier is written.
//! * On shutdown no new writes start; in-flight writes finish.
//!
//! * `WriterMsg::Drifted(keys)` (from [`crate::drift`]): the objects of these
//!   keys may differ from what we want. `drift_delay` later, when the key has
//!   no write pending or in flight and its last write finished `drift_settle`
//!   ago, [`Sink::drift`] compares the LATEST cached copy with the desired
//!   state; only a real difference forgets `known[key]` and queues the key
//!   (rewrite, or delete for an orphan). Late watch events of our own writes
//!   therefore never cause writes. A check that comes due while the key's
//!   write is pending or in flight is "parked" (a set, no timer) and
//!   scheduled again, `drift_settle` later, when that write finishes or is
//!   skipped: on a first start the drift sweep reports every key (nothing is
//!   written yet), and re-timing 10,000 pending checks every `drift_delay`
//!   would be O(pending) per tick.
//!
//! Scheduling cost is O(log n) per key, never O(pending) per loop turn
//! (`Queue`): besides the `key -> Pending` map, the due order of the keys
//! that are not in flight is kept in a `BTreeMap<(due, seq), key>`, so
//! `dispatch` pops only what it starts (or skips) and the next wake-up is the
//! first entry; a key changed while its write is in flight is "parked" (in
//! the map, not in the due order) until that write finishes. Readiness
//! barriers use a per-cluster ordered set of pending sequence numbers plus a
//! per-cluster in-flight count, so checking one is O(log n) too.
//!
//! Memory (at 10,000 services the writer holds a key per service in `known`,
//! and several per service while a first sync is pending):
//! * Keys are stored packed (`Key`: one 16-byte box per copy instead of a
//!   72-byte `ServiceKey` with a heap block per string), `known` versions as
//!   a `u64` when they are our 16-hex-digit versions (`Version`, exact: any
//!   other text is kept as text and compared as text).
//! * Tables that held every service during a first sync give their buckets
//!   back once mostly drained (`trim_map`, checked every loop turn), and
//!   the completion times of the drift settle rule are dropped once older
//!   than `drift_settle` (`Drift::prune`), since they decide nothing then.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use kube_discovery_core::{ServiceKey, ServiceNodes};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::Result;
use crate::drift::DriftCheck;
use crate::metrics::Metrics;
use crate::state::Shared;

/// Where DiscoveredServices go (the API server in production, a fake in tests).
pub trait Sink: Clone + Send + Sync + 'static {
    /// Versions (`spec.version`) of the objects that already exist, one
    /// entry per service.
    fn list_versions(&self) -> impl Future<Output = Result<Vec<(ServiceKey, String)>>> + Send;
    /// Creates or updates the object for `svc` (and its status).
    fn apply(&self, svc: Arc<ServiceNodes>) -> impl Future<Output = Result<()>> + Send;
    /// Deletes the object for `key` (absent is success).
    fn delete(&self, key: ServiceKey) -> impl Future<Output = Result<()>> + Send;
    /// Whether what the API server holds for `key` (as last seen) is what
    /// `desired` wants. Sinks without a cache of their objects say `Ok`.
    fn drift(&self, _key: &ServiceKey, _desired: Option<&ServiceNodes>) -> DriftCheck {
        DriftCheck::Ok
    }
}

/// Tuning of the writer.
#[derive(Debug, Clone)]
pub struct WriterOptions {
    /// Per-key coalescing window.
    pub coalesce_window: Duration,
    /// Maximum writes in flight.
    pub concurrency: usize,
    /// Maximum writes per second (0 = unlimited).
    pub qps: f64,
    /// First retry delay after a failed write.
    pub retry_min: Duration,
    /// Maximum retry delay.
    pub retry_max: Duration,
    /// Delay before a drift report is checked (at least `coalesce_window`).
    pub drift_delay: Duration,
    /// A drift check waits until the key's last write finished this long ago
    /// (the watch event of that write has arrived by then).
    pub drift_settle: Duration,
}

impl Default for WriterOptions {
    fn default() -> Self {
        Self {
            coalesce_window: Duration::from_millis(100),
            concurrency: 8,
            qps: 50.0,
            retry_min: Duration::from_millis(500),
            retry_max: Duration::from_secs(30),
            drift_delay: Duration::from_millis(200),
            drift_settle: Duration::from_millis(750),
        }
    }
}

/// Messages from the sources.
#[derive(Debug)]
pub enum WriterMsg {
    /// These keys' desired state (in [`Shared`]) changed at `at`.
    Changed {
        /// The keys.
        keys: Vec<ServiceKey>,
        /// When the source event arrived (for the latency histogram).
        at: Instant,
    },
    /// `cluster` finished its first complete list; everything before this
    /// message belongs to it.
    Synced {
        /// The cluster id.
        cluster: String,
    },
    /// The objects of these keys may differ from the desired state (drift
    /// watch); checked after `drift_delay`.
    Drifted {
        /// The keys.
        keys: Vec<ServiceKey>,
    },
}

/// Sending side of the writer.
#[derive(Clone, Debug)]
pub struct WriterHandle {
    tx: mpsc::UnboundedSender<WriterMsg>,
}

impl WriterHandle {
    /// Queues changed keys (ignored after shutdown).
    pub fn changed(&self, keys: Vec<ServiceKey>, at: Instant) {
        if !keys.is_empty() {
            let _ = self.tx.send(WriterMsg::Changed { keys, at });
        }
    }

    /// Reports keys whose objects may have drifted (ignored after shutdown).
    pub fn drifted(&self, keys: Vec<ServiceKey>) {
        if !keys.is_empty() {
            let _ = self.tx.send(WriterMsg::Drifted { keys });
        }
    }

    /// Sends the first-list barrier of `cluster`.
    pub fn synced(&self, cluster: &str) {
        let _ = self.tx.send(WriterMsg::Synced {
            cluster: cluster.to_string(),
        });
    }
}

/// A [`ServiceKey`] packed into ONE heap block: `cluster 0xFF namespace 0xFF
/// name`. 0xFF never occurs in UTF-8, so the packing is injective and
/// equality and hashing are those of the three strings. A copy is 16
/// bytes plus one small block, where a `ServiceKey` is 72 bytes plus a block
/// per non-empty string; the writer holds one per service it ever wrote
/// (`known`) and, during a first sync, several per pending service.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Key(Box<[u8]>);

const KEY_SEP: u8 = 0xFF;

impl Key {
    fn new(k: &ServiceKey) -> Self {
        let mut b = Vec::with_capacity(k.cluster.len() + k.namespace.len() + k.name.len() + 2);
        b.extend_from_slice(k.cluster.as_bytes());
        b.push(KEY_SEP);
        b.extend_from_slice(k.namespace.as_bytes());
        b.push(KEY_SEP);
        b.extend_from_slice(k.name.as_bytes());
        Self(b.into_boxed_slice())
    }

    /// `[cluster, namespace, name]` (each part is UTF-8 by construction).
    fn parts(&self) -> [&str; 3] {
        let mut it = self
            .0
            .splitn(3, |b| *b == KEY_SEP)
            .map(|p| std::str::from_utf8(p).unwrap_or_default());
        [
            it.next().unwrap_or_default(),
            it.next().unwrap_or_default(),
            it.next().unwrap_or_default(),
        ]
    }

    fn cluster(&self) -> &str {
        self.parts()[0]
    }

    fn service_key(&self) -> ServiceKey {
        let [cluster, namespace, name] = self.parts();
        ServiceKey::new(cluster, namespace, name)
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.service_key().fmt(f)
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key({self})")
    }
}

/// A `spec.version` as held in `known`, without a `String` per service: our
/// versions are 16 lowercase hex digits, i.e. one `u64`; anything else (a
/// foreign object's version, `""` for "rewrite this") is kept as text.
/// Canonical hex and `u64` map one-to-one, so [`Version::is`] is exactly the
/// string comparison it replaces.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Version {
    Hex(u64),
    Text(Box<str>),
}

impl Version {
    fn new(v: &str) -> Self {
        match hex16(v) {
            Some(h) => Self::Hex(h),
            None => Self::Text(v.into()),
        }
    }

    /// Whether this is the version `v`.
    fn is(&self, v: &str) -> bool {
        match self {
            Self::Hex(h) => hex16(v) == Some(*h),
            Self::Text(t) => **t == *v,
        }
    }
}

/// `v` as a number when it is exactly 16 lowercase hex digits.
fn hex16(v: &str) -> Option<u64> {
    if v.len() == 16 && v.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        u64::from_str_radix(v, 16).ok()
    } else {
        None
    }
}

/// Gives a table's memory back once it is mostly empty: a map that held
/// every service during a first sync keeps its buckets (megabytes at 10,000
/// services) after draining otherwise. Amortised O(1): a shrink to twice the
/// length happens only after three quarters of the capacity were removed.
fn trim_map<K: Eq + std::hash::Hash, V>(m: &mut HashMap<K, V>) {
    if m.capacity() > 64 && m.len() * 4 < m.capacity() {
        m.shrink_to(m.len() * 2);
    }
}

/// [`trim_map`] for a set.
fn trim_set<K: Eq + std::hash::Hash>(s: &mut HashSet<K>) {
    if s.capacity() > 64 && s.len() * 4 < s.capacity() {
        s.shrink_to(s.len() * 2);
    }
}

#[derive(Debug)]
struct Pending {
    due: Instant,
    first_event: Instant,
    seq: u64,
    attempts: u32,
}

/// The pending keys with the indexes that keep scheduling O(log n).
///
/// Invariants: every entry's `seq` is in `seqs[cluster]`; an entry is in
/// `due` (under `(due, seq)`) exactly when its key is not in `inflight`.
/// Sequence numbers are unique among pending entries (one per enqueue, and a
/// failed write merges back with the minimum of two distinct ones).
#[derive(Default)]
struct Queue {
    entries: HashMap<Key, Pending>,
    due: BTreeMap<(Instant, u64), Key>,
    seqs: HashMap<String, BTreeSet<u64>>,
    inflight: HashSet<Key>,
    inflight_per_cluster: HashMap<String, usize>,
}

impl Queue {
    fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether `key` has a write pending or in flight.
    fn busy(&self, key: &Key) -> bool {
        self.entries.contains_key(key) || self.inflight.contains(key)
    }

    fn index(&mut self, key: &Key, p: &Pending) {
        let cluster = key.cluster();
        match self.seqs.get_mut(cluster) {
            Some(set) => {
                set.insert(p.seq);
            }
            None => {
                self.seqs
                    .insert(cluster.to_string(), BTreeSet::from([p.seq]));
            }
        }
        if !self.inflight.contains(key) {
            self.due.insert((p.due, p.seq), key.clone());
        }
    }

    fn unindex(&mut self, key: &Key, p: &Pending) {
        if let Some(set) = self.seqs.get_mut(key.cluster()) {
            set.remove(&p.seq);
        }
        self.due.remove(&(p.due, p.seq));
    }

    /// Adds a key that is not pending yet.
    fn insert(&mut self, key: Key, p: Pending) {
        // Callers check first; replacing keeps the indexes consistent anyway.
        self.remove(&key);
        self.index(&key, &p);
        self.entries.insert(key, p);
    }

    /// Changes a pending key in place; `false` if it is not pending.
    fn modify(&mut self, key: &Key, f: impl FnOnce(&mut Pending)) -> bool {
        let Some(mut p) = self.entries.remove(key) else {
            return false;
        };
        self.unindex(key, &p);
        f(&mut p);
        self.index(key, &p);
        self.entries.insert(key.clone(), p);
        true
    }

    /// Removes a pending key.
    fn remove(&mut self, key: &Key) -> Option<Pending> {
        let p = self.entries.remove(key)?;
        self.unindex(key, &p);
        Some(p)
    }

    /// Earliest due time of a key that is not in flight.
    fn first_due(&self) -> Option<Instant> {
        self.due.first_key_value().map(|((due, _), _)| *due)
    }

    /// The earliest key due at `now` that is not in flight.
    fn first_due_key(&self, now: Instant) -> Option<Key> {
        self.due
            .first_key_value()
            .filter(|((due, _), _)| *due <= now)
            .map(|(_, k)| k.clone())
    }

    /// Takes `key` out of the queue and marks it in flight.
    fn start(&mut self, key: &Key) -> Option<Pending> {
        let p = self.remove(key)?;
        self.inflight.insert(key.clone());
        let cluster = key.cluster();
        match self.inflight_per_cluster.get_mut(cluster) {
            Some(n) => *n += 1,
            None => {
                self.inflight_per_cluster.insert(cluster.to_string(), 1);
            }
        }
        Some(p)
    }

    /// The write of `key` finished: a change that arrived meanwhile becomes
    /// schedulable.
    fn finished(&mut self, key: &Key) {
        if !self.inflight.remove(key) {
            return;
        }
        if let Some(n) = self.inflight_per_cluster.get_mut(key.cluster()) {
            *n = n.saturating_sub(1);
        }
        if let Some(p) = self.entries.get(key) {
            self.due.insert((p.due, p.seq), key.clone());
        }
    }

    /// Whether a barrier `(cluster, bseq)` still waits: a key of `cluster`
    /// queued at or before it is pending, or any write of `cluster` is in flight.
    fn waiting(&self, cluster: &str, bseq: u64) -> bool {
        self.seqs
            .get(cluster)
            .and_then(BTreeSet::first)
            .is_some_and(|s| *s <= bseq)
            || self
                .inflight_per_cluster
                .get(cluster)
                .is_some_and(|n| *n > 0)
    }

    /// Gives back the tables' memory once they drained ([`trim_map`]).
    fn trim(&mut self) {
        trim_map(&mut self.entries);
        trim_set(&mut self.inflight);
    }
}

enum Outcome {
    Applied(String),
    Deleted,
}

struct Done {
    key: Key,
    seq: u64,
    first_event: Instant,
    attempts: u32,
    result: Result<Outcome>,
}

/// Starts the writer task. It first reads what the sink already holds
/// (retrying with backoff), then processes messages until `shutdown`.
pub fn spawn<S: Sink>(
    sink: S,
    shared: Arc<Shared>,
    metrics: Metrics,
    opts: WriterOptions,
    shutdown: CancellationToken,
) -> (WriterHandle, tokio::task::JoinHandle<()>) {
    spawn_gated(sink, shared, metrics, opts, shutdown, None)
}

/// Like [`spawn`], but writes only while `leader` is `true` (leader
/// election). A standby keeps its queue; on becoming leader it re-reads what
/// the API server holds and re-checks every service.
pub fn spawn_gated<S: Sink>(
    sink: S,
    shared: Arc<Shared>,
    metrics: Metrics,
    opts: WriterOptions,
    shutdown: CancellationToken,
    leader: Option<watch::Receiver<bool>>,
) -> (WriterHandle, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let w = Writer::new(sink, shared, metrics, opts);
    let task = tokio::spawn(w.run(rx, shutdown, leader));
    (WriterHandle { tx }, task)
}

struct Writer<S> {
    sink: S,
    shared: Arc<Shared>,
    metrics: Metrics,
    opts: WriterOptions,
    /// The version of every object the API server holds, by service (what
    /// we last wrote, or what [`Sink::list_versions`] found).
    known: HashMap<Key, Version>,
    pending: Queue,
    barriers: Vec<(String, u64)>,
    seq: u64,
    next_token: Instant,
    drift: Drift,
}

/// Drift checks waiting for their time, and when each key's last write finished.
#[derive(Default)]
struct Drift {
    due: BTreeMap<(Instant, u64), Key>,
    keys: HashSet<Key>,
    seq: u64,
    /// When a key's last write finished, for the keys whose write finished
    /// less than `drift_settle` ago (older entries mean nothing to
    /// `check_drift` and are dropped by [`Drift::prune`]).
    last_done: HashMap<Key, Instant>,
    /// When [`Drift::prune`] runs next (`None`: `last_done` is empty).
    prune_at: Option<Instant>,
    /// Checks waiting for the key's pending / in-flight write.
    parked: HashSet<Key>,
}

impl Drift {
    /// Schedules a check of `key` at `at` unless one is already scheduled.
    fn schedule(&mut self, key: Key, at: Instant) {
        if self.keys.insert(key.clone()) {
            self.seq += 1;
            self.due.insert((at, self.seq), key);
        }
    }

    /// The next time the writer must wake for drift: a due check, or the
    /// pruning of `last_done`.
    fn first_due(&self) -> Option<Instant> {
        let check = self.due.first_key_value().map(|((t, _), _)| *t);
        match (check, self.prune_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn pop_due(&mut self, now: Instant) -> Option<Key> {
        let (&(t, seq), _) = self.due.first_key_value()?;
        if t > now {
            return None;
        }
        let key = self.due.remove(&(t, seq))?;
        self.keys.remove(&key);
        Some(key)
    }

    fn done(&mut self, key: &Key, at: Instant, settle: Duration) {
        self.last_done.insert(key.clone(), at);
        if self.prune_at.is_none() {
            self.prune_at = Some(at + settle);
        }
    }

    /// Whether a write of `key` finished less than `settle` before `now`;
    /// if so, when that stops being the case.
    fn settling(&self, key: &Key, now: Instant, settle: Duration) -> Option<Instant> {
        self.last_done
            .get(key)
            .map(|t| *t + settle)
            .filter(|until| *until > now)
    }

    /// Drops the completions older than `settle` (at most once per `settle`,
    /// so an entry lives less than twice `settle`) and gives back the
    /// memory of drained tables.
    fn prune(&mut self, now: Instant, settle: Duration) {
        if self.prune_at.is_some_and(|t| t <= now) {
            self.last_done.retain(|_, t| *t + settle > now);
            self.prune_at = (!self.last_done.is_empty()).then_some(now + settle);
        }
        trim_map(&mut self.last_done);
        trim_set(&mut self.keys);
        trim_set(&mut self.parked);
    }
}

fn backoff(opts: &WriterOptions, attempts: u32) -> Duration {
    let exp = attempts.saturating_sub(1).min(16);
    let d = opts.retry_min.saturating_mul(1u32 << exp);
    d.min(opts.retry_max)
}

impl<S: Sink> Writer<S> {
    /// A writer with nothing known, pending or scheduled yet.
    fn new(sink: S, shared: Arc<Shared>, metrics: Metrics, opts: WriterOptions) -> Self {
        Writer {
            sink,
            shared,
            metrics,
            opts,
            known: HashMap::new(),
            pending: Queue::default(),
            barriers: Vec::new(),
            seq: 0,
            next_token: Instant::now(),
            drift: Drift::default(),
        }
    }

    /// Reads what the API server holds (retrying); `false` on shutdown.
    async fn load_known(&mut self, shutdown: &CancellationToken) -> bool {
        let mut attempt = 0;
        loop {
            match self.sink.list_versions().await {
                Ok(known) => {
                    tracing::info!(objects = known.len(), "read existing DiscoveredServices");
                    self.known = known
                        .into_iter()
                        .map(|(k, v)| (Key::new(&k), Version::new(&v)))
                        .collect();
                    return true;
                }
                Err(e) => {
                    attempt += 1;
                    let d = backoff(&self.opts, attempt);
                    tracing::warn!(error = %e, retry_in = ?d, "cannot list existing DiscoveredServices");
                    tokio::select! {
                        () = tokio::time::sleep(d) => {}
                        () = shutdown.cancelled() => return false,
                    }
                }
            }
        }
    }

    /// After becoming leader: everything desired is due again (no-ops are
    /// skipped against the fresh `known`), stale objects of listed clusters
    /// are deleted, and listed clusters get a new readiness barrier.
    fn resync(&mut self) {
        let now = Instant::now();
        let clusters = self.shared.clusters();
        for (id, status) in &clusters {
            for svc in self.shared.desired_of(id) {
                self.enqueue(Key::new(&svc.key), now);
            }
            if status.listed {
                self.receive(WriterMsg::Synced {
                    cluster: id.clone(),
                });
            }
        }
    }

    async fn run(
        mut self,
        mut rx: mpsc::UnboundedReceiver<WriterMsg>,
        shutdown: CancellationToken,
        mut leader: Option<watch::Receiver<bool>>,
    ) {
        let mut leading = leader.as_ref().is_none_or(|l| *l.borrow());
        self.shared.set_standby(!leading);
        // What the API server holds, so unchanged services are never rewritten.
        if leading && !self.load_known(&shutdown).await {
            return;
        }

        let mut tasks: JoinSet<Done> = JoinSet::new();
        let mut open = true;
        loop {
            if leading {
                self.check_drift();
                self.dispatch(&mut tasks);
                self.check_barriers();
            }
            self.trim();
            let full = tasks.len() >= self.opts.concurrency.max(1);
            let wake = if leading { self.next_wake(full) } else { None };
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                now = leader_changed(&mut leader) => {
                    if now != leading {
                        leading = now;
                        self.shared.set_standby(!now);
                        if now {
                            tracing::info!("leader: writing");
                            if !self.load_known(&shutdown).await {
                                break;
                            }
                            self.resync();
                        } else {
                            tracing::info!("standby: not writing");
                        }
                    }
                }
                Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                    match done {
                        Ok(done) => self.finish(done),
                        Err(e) => tracing::error!(error = %e, "write task failed"),
                    }
                }
                msg = rx.recv(), if open => match msg {
                    Some(m) => self.receive(m),
                    None => open = false,
                },
                () = sleep_until_opt(wake) => {}
            }
            if !open && tasks.is_empty() && self.pending.is_empty() {
                break;
            }
        }
        // Graceful shutdown: let in-flight writes finish, start no new ones.
        while let Some(done) = tasks.join_next().await {
            if let Ok(done) = done {
                self.finish(done);
            }
        }
    }

    fn receive(&mut self, msg: WriterMsg) {
        match msg {
            WriterMsg::Changed { keys, at } => {
                for key in &keys {
                    self.enqueue(Key::new(key), at);
                }
            }
            WriterMsg::Drifted { keys } => {
                let at = Instant::now() + self.opts.drift_delay.max(self.opts.coalesce_window);
                for key in &keys {
                    self.drift.schedule(Key::new(key), at);
                }
            }
            WriterMsg::Synced { cluster } => {
                // Objects the API server holds for this cluster that the first
                // complete list did not produce: their source vanished while we
                // were not watching.
                let stale: Vec<Key> = self
                    .known
                    .keys()
                    .filter(|k| {
                        k.cluster() == cluster && !self.shared.has_desired(&k.service_key())
                    })
                    .cloned()
                    .collect();
                let now = Instant::now();
                for key in stale {
                    self.enqueue(key, now);
                }
                self.barriers.push((cluster, self.seq));
                self.seq += 1;
            }
        }
    }

    fn enqueue(&mut self, key: Key, at: Instant) {
        let seq = self.seq;
        self.seq += 1;
        let due = Instant::now() + self.opts.coalesce_window;
        let updated = self.pending.modify(&key, |p| {
            if at < p.first_event {
                p.first_event = at;
            }
            // A change after failures is worth trying again soon.
            if p.attempts > 0 && p.due > due {
                p.due = due;
            }
        });
        if !updated {
            self.pending.insert(
                key,
                Pending {
                    due,
                    first_event: at,
                    seq,
                    attempts: 0,
                },
            );
        }
    }

    /// When the loop must wake up by itself: the next due write (not while
    /// every write slot is taken: a finishing write wakes the loop then, and a
    /// due time in the past would make it spin) or drift check.
    fn next_wake(&self, slots_full: bool) -> Option<Instant> {
        let write = if slots_full {
            None
        } else {
            self.pending.first_due().map(|due| due.max(self.next_token))
        };
        match (write, self.drift.first_due()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Gives back the memory of drained tables and of completions older
    /// than `drift_settle` (see [`trim_map`]); cheap when there is nothing to do.
    fn trim(&mut self) {
        self.pending.trim();
        self.drift.prune(Instant::now(), self.opts.drift_settle);
        trim_map(&mut self.known);
    }

    /// Runs the drift checks that are due (see the module docs).
    fn check_drift(&mut self) {
        let now = Instant::now();
        let delay = self.opts.drift_delay.max(self.opts.coalesce_window);
        let mut later = Vec::new();
        while let Some(key) = self.drift.pop_due(now) {
            if self.pending.busy(&key) {
                // Scheduled again when the write is done (`unpark`).
                self.drift.parked.insert(key);
                continue;
            }
            if let Some(until) = self.drift.settling(&key, now, self.opts.drift_settle) {
                later.push((key, until));
                continue;
            }
            let skey = key.service_key();
            let desired = self.shared.desired(&skey);
            let listed = self
                .shared
                .clusters()
                .get(skey.cluster.as_str())
                .is_some_and(|c| c.listed);
            if desired.is_none() && !listed {
                // The first-list barrier decides about this cluster's objects.
                continue;
            }
            match self.sink.drift(&skey, desired.as_deref()) {
                DriftCheck::Ok => {}
                DriftCheck::Stale => later.push((key, now + delay)),
                DriftCheck::Drift(kind) => {
                    self.metrics.drift(&skey.cluster, kind.as_str());
                    tracing::info!(service = %skey, kind = kind.as_str(), "drift: restoring the desired state");
                    // A version nothing has: the key is rewritten (or deleted).
                    self.known.insert(key.clone(), Version::new(""));
                    self.enqueue(key, now);
                }
            }
        }
        for (key, at) in later {
            self.drift.schedule(key, at);
        }
    }

    /// `key`'s write finished or was skipped: a parked drift check of it is
    /// scheduled (unless another write of it is pending or in flight).
    fn unpark(&mut self, key: &Key, now: Instant) {
        if self.pending.busy(key) {
            return;
        }
        if self.drift.parked.remove(key) {
            self.drift
                .schedule(key.clone(), now + self.opts.drift_settle);
        }
    }

    fn take_token(&mut self, now: Instant) -> bool {
        if self.opts.qps <= 0.0 {
            return true;
        }
        if now < self.next_token {
            return false;
        }
        let step = Duration::from_secs_f64(1.0 / self.opts.qps);
        // Allow a small burst of one second's worth after idle time.
        let floor = now.checked_sub(Duration::from_secs(1)).unwrap_or(now);
        self.next_token = self.next_token.max(floor) + step;
        true
    }

    fn dispatch(&mut self, tasks: &mut JoinSet<Done>) {
        let now = Instant::now();
        while tasks.len() < self.opts.concurrency.max(1) {
            let Some(key) = self.pending.first_due_key(now) else {
                break;
            };
            let skey = key.service_key();
            let desired = self.shared.desired(&skey);
            let known = self.known.get(&key);
            // Decide first: skips and no-ops need neither a token nor a task.
            match (&desired, known) {
                (Some(d), Some(v)) if v.is(&d.version) => {
                    self.pending.remove(&key);
                    self.metrics
                        .writes_skipped
                        .get_or_create(&Metrics::cluster(&skey.cluster))
                        .inc();
                    tracing::debug!(service = %skey, version = %d.version, "up to date, no write");
                    self.unpark(&key, now);
                    continue;
                }
                (None, None) => {
                    self.pending.remove(&key);
                    self.unpark(&key, now);
                    continue;
                }
                _ => {}
            }
            if !self.take_token(now) {
                break;
            }
            let Some(p) = self.pending.start(&key) else {
                continue;
            };
            let sink = self.sink.clone();
            let (seq, first_event, attempts) = (p.seq, p.first_event, p.attempts);
            tasks.spawn(async move {
                let result = match desired {
                    Some(d) => {
                        let v = d.version.clone();
                        sink.apply(d).await.map(|()| Outcome::Applied(v))
                    }
                    None => sink.delete(skey).await.map(|()| Outcome::Deleted),
                };
                Done {
                    key,
                    seq,
                    first_event,
                    attempts,
                    result,
                }
            });
        }
    }

    fn finish(&mut self, done: Done) {
        let Done {
            key,
            seq,
            first_event,
            attempts,
            result,
        } = done;
        self.pending.finished(&key);
        self.drift
            .done(&key, Instant::now(), self.opts.drift_settle);
        let cluster = key.cluster();
        match result {
            Ok(outcome) => {
                let label = match outcome {
                    Outcome::Applied(v) => {
                        tracing::info!(service = %key, version = %v, "applied");
                        self.known.insert(key.clone(), Version::new(&v));
                        "applied"
                    }
                    Outcome::Deleted => {
                        tracing::info!(service = %key, "deleted");
                        self.known.remove(&key);
                        "deleted"
                    }
                };
                self.metrics.write(cluster, label);
                self.metrics
                    .event_to_write
                    .get_or_create(&Metrics::cluster(cluster))
                    .observe(first_event.elapsed().as_secs_f64());
                self.unpark(&key, Instant::now());
            }
            // Still pending (retried): a parked check stays parked.
            Err(e) => {
                self.metrics
                    .write(cluster, &format!("error_{}", e.metric_label()));
                let attempts = attempts + 1;
                let delay = backoff(&self.opts, attempts);
                tracing::warn!(service = %key, error = %e, attempt = attempts, retry_in = ?delay, "write failed");
                let due = Instant::now() + delay;
                // Keep the oldest sequence number (readiness waits for it) and
                // the earliest event time; a newer change may already be pending.
                let merged = self.pending.modify(&key, |p| {
                    p.seq = p.seq.min(seq);
                    p.first_event = p.first_event.min(first_event);
                    p.attempts = attempts;
                    p.due = p.due.max(due);
                });
                if !merged {
                    self.pending.insert(
                        key,
                        Pending {
                            due,
                            first_event,
                            seq,
                            attempts,
                        },
                    );
                }
            }
        }
    }

    fn check_barriers(&mut self) {
        if self.barriers.is_empty() {
            return;
        }
        let pending = &self.pending;
        let shared = &self.shared;
        self.barriers.retain(|(cluster, bseq)| {
            if pending.waiting(cluster, *bseq) {
                return true;
            }
            shared.update_cluster(cluster, |c| c.synced = true);
            tracing::info!(cluster = %cluster, "first complete list written");
            false
        });
    }
}

/// Resolves with the new leadership state; never when not gated.
async fn leader_changed(leader: &mut Option<watch::Receiver<bool>>) -> bool {
    match leader {
        Some(rx) => match rx.changed().await {
            Ok(()) => *rx.borrow_and_update(),
            Err(_) => {
                // The elector stopped (shutdown): keep the current state.
                *leader = None;
                std::future::pending().await
            }
        },
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
mod tests {
    use super::*;
    use kube_discovery_core::{Node, PortMap, SourceKind};
    use std::sync::Mutex;

    #[derive(Debug, Clone, PartialEq)]
    enum Call {
        Apply(String, String),
        Delete(String),
    }

    #[derive(Clone, Default)]
    struct FakeSink {
        existing: HashMap<ServiceKey, String>,
        calls: Arc<Mutex<Vec<Call>>>,
        /// Number of upcoming apply calls that fail.
        fail_next: Arc<Mutex<u32>>,
        /// What `drift` answers per key (default `Ok`), and how often it was asked.
        drift: Arc<Mutex<HashMap<ServiceKey, DriftCheck>>>,
        drift_asked: Arc<Mutex<u32>>,
    }

    impl FakeSink {
        fn calls(&self) -> Vec<Call> {
            self.calls.lock().unwrap().clone()
        }
    }

    impl Sink for FakeSink {
        async fn list_versions(&self) -> Result<Vec<(ServiceKey, String)>> {
            Ok(self.existing.clone().into_iter().collect())
        }
        async fn apply(&self, svc: Arc<ServiceNodes>) -> Result<()> {
            {
                let mut f = self.fail_next.lock().unwrap();
                if *f > 0 {
                    *f -= 1;
                    return Err(crate::Error::Input("injected failure".into()));
                }
            }
            self.calls
                .lock()
                .unwrap()
                .push(Call::Apply(svc.key.to_string(), svc.version.clone()));
            Ok(())
        }
        async fn delete(&self, key: ServiceKey) -> Result<()> {
            self.calls
                .lock()
                .unwrap()
                .push(Call::Delete(key.to_string()));
            Ok(())
        }
        fn drift(&self, key: &ServiceKey, _desired: Option<&ServiceNodes>) -> DriftCheck {
            *self.drift_asked.lock().unwrap() += 1;
            self.drift
                .lock()
                .unwrap()
                .get(key)
                .copied()
                .unwrap_or(DriftCheck::Ok)
        }
    }

    fn nodes(key: &ServiceKey, hosts: &[&str]) -> ServiceNodes {
        let mut ports = PortMap::new();
        ports.insert(
            "http".into(),
            hosts.iter().map(|h| Node::new(*h, 80, 50)).collect(),
        );
        ServiceNodes::new(key.clone(), SourceKind::EndpointSlice, ports, None)
    }

    fn opts() -> WriterOptions {
        WriterOptions {
            coalesce_window: Duration::from_millis(100),
            concurrency: 2,
            qps: 0.0,
            retry_min: Duration::from_millis(200),
            retry_max: Duration::from_secs(2),
            drift_delay: Duration::from_millis(250),
            drift_settle: Duration::from_millis(750),
        }
    }

    /// Runs the paused clock forward so every due write happens.
    async fn settle() {
        for _ in 0..50 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// While every write slot is taken, a due write is no reason to wake up:
    /// a finishing write wakes the loop. (Waking for it made the loop spin on
    /// a due time in the past: a core busy for a whole first sync against a
    /// slow API server, BENCHMARKS.md issue 14.)
    #[tokio::test(start_paused = true)]
    async fn a_due_write_wakes_the_loop_only_when_a_slot_is_free() {
        let shared = Arc::new(Shared::new([""]));
        let mut w = Writer::new(FakeSink::default(), shared, Metrics::default(), opts());
        let k = ServiceKey::new("", "ns", "web");
        w.enqueue(Key::new(&k), Instant::now());
        tokio::time::sleep(Duration::from_secs(1)).await;
        let due = w.next_wake(false).expect("a write is due");
        assert!(due <= Instant::now(), "due in the past");
        assert_eq!(w.next_wake(true), None, "slots full: no wake for it");
        // A drift check still wakes the loop when its time comes.
        let at = Instant::now() + Duration::from_secs(5);
        w.drift.schedule(Key::new(&k), at);
        assert_eq!(w.next_wake(true), Some(at));
    }

    #[tokio::test(start_paused = true)]
    async fn burst_inside_window_is_coalesced_into_one_write_of_the_latest_state() {
        let sink = FakeSink::default();
        let shared = Arc::new(Shared::new([""]));
        let (h, _t) = spawn(
            sink.clone(),
            shared.clone(),
            Metrics::default(),
            opts(),
            CancellationToken::new(),
        );
        let k = ServiceKey::new("", "ns", "web");
        for hosts in [
            &["10.0.0.1"][..],
            &["10.0.0.1", "10.0.0.2"],
            &["10.0.0.1", "10.0.0.2", "10.0.0.3"],
        ] {
            shared.set_desired(&k, Some(nodes(&k, hosts)));
            h.changed(vec![k.clone()], Instant::now());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        settle().await;
        let want = nodes(&k, &["10.0.0.1", "10.0.0.2", "10.0.0.3"]).version;
        assert_eq!(sink.calls(), vec![Call::Apply("ns/web".into(), want)]);
    }

    #[tokio::test(start_paused = true)]
    async fn existing_equal_versions_are_not_rewritten_and_changed_ones_are() {
        let k1 = ServiceKey::new("", "ns", "same");
        let k2 = ServiceKey::new("", "ns", "changed");
        let shared = Arc::new(Shared::new([""]));
        shared.set_desired(&k1, Some(nodes(&k1, &["10.0.0.1"])));
        shared.set_desired(&k2, Some(nodes(&k2, &["10.0.0.9"])));
        let sink = FakeSink {
            existing: HashMap::from([
                (k1.clone(), nodes(&k1, &["10.0.0.1"]).version),
                (k2.clone(), nodes(&k2, &["10.0.0.2"]).version),
            ]),
            ..FakeSink::default()
        };
        let m = Metrics::default();
        let (h, _t) = spawn(
            sink.clone(),
            shared.clone(),
            m.clone(),
            opts(),
            CancellationToken::new(),
        );
        h.changed(vec![k1.clone(), k2.clone()], Instant::now());
        h.synced("");
        settle().await;
        assert_eq!(
            sink.calls(),
            vec![Call::Apply(
                "ns/changed".into(),
                nodes(&k2, &["10.0.0.9"]).version
            )]
        );
        assert_eq!(
            m.writes_skipped.get_or_create(&Metrics::cluster("")).get(),
            1
        );
        assert!(shared.ready());
        // The same desired state again: no write.
        h.changed(vec![k1.clone(), k2.clone()], Instant::now());
        settle().await;
        assert_eq!(sink.calls().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn first_list_barrier_deletes_objects_whose_source_vanished() {
        let gone = ServiceKey::new("", "ns", "gone");
        let other = ServiceKey::new("c2", "ns", "gone");
        let shared = Arc::new(Shared::new([""]));
        let sink = FakeSink {
            existing: HashMap::from([
                (gone.clone(), "v".to_string()),
                (other.clone(), "v".to_string()),
            ]),
            ..FakeSink::default()
        };
        let (h, _t) = spawn(
            sink.clone(),
            shared.clone(),
            Metrics::default(),
            opts(),
            CancellationToken::new(),
        );
        h.synced("");
        tokio::task::yield_now().await;
        settle().await;
        // Only this cluster's object is deleted; another cluster's is left alone.
        assert_eq!(sink.calls(), vec![Call::Delete("ns/gone".into())]);
        assert!(shared.ready());
    }

    #[tokio::test(start_paused = true)]
    async fn failed_writes_are_retried_and_never_lose_the_latest_state() {
        let sink = FakeSink {
            fail_next: Arc::new(Mutex::new(3)),
            ..FakeSink::default()
        };
        let shared = Arc::new(Shared::new([""]));
        let m = Metrics::default();
        let (h, _t) = spawn(
            sink.clone(),
            shared.clone(),
            m.clone(),
            opts(),
            CancellationToken::new(),
        );
        let k = ServiceKey::new("", "ns", "web");
        shared.set_desired(&k, Some(nodes(&k, &["10.0.0.1"])));
        h.changed(vec![k.clone()], Instant::now());
        h.synced("");
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(sink.calls().is_empty());
        assert!(
            !shared.ready(),
            "not ready while the first list is not written"
        );
        // A newer state arrives while retrying: the newer one is what gets written.
        shared.set_desired(&k, Some(nodes(&k, &["10.0.0.2"])));
        h.changed(vec![k.clone()], Instant::now());
        settle().await;
        assert_eq!(
            sink.calls(),
            vec![Call::Apply(
                "ns/web".into(),
                nodes(&k, &["10.0.0.2"]).version
            )]
        );
        assert!(shared.ready());
        let text = crate::metrics::encode(&m.registry());
        assert!(
            text.contains(r#"kube_discovery_writes_total{cluster="",result="error_input"} 3"#),
            "{text}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_standby_does_not_write_until_it_becomes_leader() {
        let k = ServiceKey::new("", "ns", "web");
        let shared = Arc::new(Shared::new([""]));
        shared.set_desired(&k, Some(nodes(&k, &["10.0.0.1"])));
        let sink = FakeSink::default();
        let (tx, rx) = watch::channel(false);
        let (h, _t) = spawn_gated(
            sink.clone(),
            shared.clone(),
            Metrics::default(),
            opts(),
            CancellationToken::new(),
            Some(rx),
        );
        h.changed(vec![k.clone()], Instant::now());
        shared.update_cluster("", |c| c.listed = true);
        h.synced("");
        settle().await;
        assert!(sink.calls().is_empty(), "a standby wrote");
        assert!(
            shared.standby() && shared.ready(),
            "a listed standby is ready"
        );
        tx.send(true).unwrap();
        settle().await;
        assert_eq!(
            sink.calls(),
            vec![Call::Apply(
                "ns/web".into(),
                nodes(&k, &["10.0.0.1"]).version
            )]
        );
        assert!(!shared.standby() && shared.ready());
        // Leadership lost: new changes wait.
        tx.send(false).unwrap();
        settle().await;
        shared.set_desired(&k, Some(nodes(&k, &["10.0.0.2"])));
        h.changed(vec![k.clone()], Instant::now());
        settle().await;
        assert_eq!(sink.calls().len(), 1);
    }

    #[test]
    fn packed_keys_round_trip_and_are_equal_exactly_when_the_keys_are() {
        let keys = [
            ServiceKey::new("", "ns", "web"),
            ServiceKey::new("c1", "ns", "web"),
            ServiceKey::new("", "nsweb", ""),
            ServiceKey::new("", "ns", "web2"),
            // Separators inside parts cannot move a part boundary.
            ServiceKey::new("a/b", "c", "d"),
            ServiceKey::new("a", "b/c", "d"),
            ServiceKey::new("", "", ""),
            ServiceKey::new("zürich", "ñs", "wéb-ø"),
        ];
        for k in &keys {
            let p = Key::new(k);
            assert_eq!(&p.service_key(), k);
            assert_eq!(p.cluster(), k.cluster);
            assert_eq!(p.to_string(), k.to_string());
            for other in &keys {
                assert_eq!(p == Key::new(other), k == other, "{k} vs {other}");
            }
        }
        let set: HashSet<Key> = keys.iter().map(Key::new).collect();
        assert_eq!(set.len(), keys.len());
    }

    #[test]
    fn versions_compare_exactly_like_the_strings_they_replace() {
        let ours = nodes(&ServiceKey::new("", "ns", "web"), &["10.0.0.1"]).version;
        let texts = [
            ours.as_str(),
            "00000000000000ff",
            "ffffffffffffffff",
            "00000000000000FF",  // same number, other spelling: a foreign version
            "0000000000000ff",   // 15 digits
            "000000000000000ff", // 17 digits
            "+0000000000000ff",
            "",
            "v",
            "zzzzzzzzzzzzzzzz",
        ];
        assert!(matches!(Version::new(&ours), Version::Hex(_)));
        assert_eq!(Version::new("00000000000000ff"), Version::Hex(255));
        assert_eq!(
            Version::new("00000000000000FF"),
            Version::Text("00000000000000FF".into())
        );
        for a in texts {
            for b in texts {
                assert_eq!(Version::new(a).is(b), a == b, "{a:?} vs {b:?}");
            }
        }
    }

    #[test]
    fn drained_tables_give_their_memory_back_and_full_ones_keep_it() {
        let mut m: HashMap<u64, u64> = (0..10_000).map(|i| (i, i)).collect();
        let full = m.capacity();
        trim_map(&mut m);
        assert_eq!(m.capacity(), full, "a full table is left alone");
        m.retain(|k, _| *k < 10);
        trim_map(&mut m);
        assert!(
            m.capacity() < 100,
            "capacity {} after draining",
            m.capacity()
        );
        assert_eq!(m.len(), 10);
        let mut s: HashSet<u64> = (0..10_000).collect();
        s.clear();
        trim_set(&mut s);
        assert!(s.capacity() < 100, "capacity {}", s.capacity());
    }

    #[test]
    fn completions_are_forgotten_once_older_than_the_settle_time() {
        let settle = Duration::from_millis(750);
        let t0 = Instant::now();
        let k = Key::new(&ServiceKey::new("", "ns", "a"));
        let mut d = Drift::default();
        assert_eq!(d.first_due(), None);
        d.done(&k, t0, settle);
        assert_eq!(d.first_due(), Some(t0 + settle), "wakes up to prune");
        d.prune(t0 + settle / 2, settle);
        assert_eq!(d.settling(&k, t0 + settle / 2, settle), Some(t0 + settle));
        assert_eq!(d.last_done.len(), 1);
        d.prune(t0 + settle, settle);
        assert_eq!(d.settling(&k, t0 + settle, settle), None);
        assert!(d.last_done.is_empty() && d.prune_at.is_none());
        assert_eq!(d.first_due(), None, "nothing left to wake up for");
        // An entry survives a prune while it is recent, and the next prune
        // comes one settle time later.
        let k2 = Key::new(&ServiceKey::new("", "ns", "b"));
        d.done(&k, t0 + settle * 2, settle);
        d.done(&k2, t0 + settle * 3 - Duration::from_millis(1), settle);
        d.prune(t0 + settle * 3, settle);
        assert_eq!(d.last_done.len(), 1);
        assert!(d.settling(&k2, t0 + settle * 3, settle).is_some());
        assert_eq!(d.prune_at, Some(t0 + settle * 4));
    }

    /// The writer's own tables after a first sync of many services: every
    /// key is written once, then the queue's and the drift bookkeeping's
    /// tables are empty AND small again, and `known` holds one compact entry
    /// per service.
    #[tokio::test(start_paused = true)]
    async fn tables_shrink_after_a_large_first_sync() {
        let sink = FakeSink::default();
        let shared = Arc::new(Shared::new([""]));
        let n = 5_000;
        let keys: Vec<ServiceKey> = (0..n)
            .map(|i| ServiceKey::new("", "ns", format!("s{i}")))
            .collect();
        for k in &keys {
            shared.set_desired(k, Some(nodes(k, &["10.0.0.1"])));
        }
        let mut w = Writer::new(
            sink.clone(),
            shared.clone(),
            Metrics::default(),
            WriterOptions {
                concurrency: 64,
                ..opts()
            },
        );
        w.receive(WriterMsg::Changed {
            keys: keys.clone(),
            at: Instant::now(),
        });
        // A first start's drift sweep reports every key while it is pending.
        w.receive(WriterMsg::Drifted { keys: keys.clone() });
        w.receive(WriterMsg::Synced {
            cluster: String::new(),
        });
        let peak = w.pending.entries.capacity();
        assert!(peak >= n);
        let mut tasks = JoinSet::new();
        for _ in 0..10_000 {
            w.check_drift();
            w.dispatch(&mut tasks);
            w.check_barriers();
            w.trim();
            if let Some(done) = tasks.try_join_next() {
                w.finish(done.unwrap());
                continue;
            }
            if w.pending.is_empty() && tasks.is_empty() && w.drift.first_due().is_none() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(sink.calls().len(), n, "one write per service");
        assert!(shared.ready());
        assert_eq!(
            *sink.drift_asked.lock().unwrap(),
            n as u32,
            "every parked check ran once"
        );
        assert_eq!(w.known.len(), n);
        assert!(w.known.values().all(|v| matches!(v, Version::Hex(_))));
        for (name, cap) in [
            ("pending", w.pending.entries.capacity()),
            ("inflight", w.pending.inflight.capacity()),
            ("drift keys", w.drift.keys.capacity()),
            ("parked", w.drift.parked.capacity()),
            ("last_done", w.drift.last_done.capacity()),
        ] {
            assert!(
                cap <= 64,
                "{name}: capacity {cap} after the sync (peak {peak})"
            );
        }
        assert!(w.pending.due.is_empty() && w.drift.due.is_empty());
    }

    fn pending(due: Instant, seq: u64) -> Pending {
        Pending {
            due,
            first_event: due,
            seq,
            attempts: 0,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn queue_orders_by_due_parks_in_flight_keys_and_tracks_barriers() {
        let now = Instant::now();
        let ms = Duration::from_millis;
        let a = Key::new(&ServiceKey::new("", "ns", "a"));
        let b = Key::new(&ServiceKey::new("", "ns", "b"));
        let c = Key::new(&ServiceKey::new("c2", "ns", "c"));
        let mut q = Queue::default();
        q.insert(b.clone(), pending(now + ms(20), 1));
        q.insert(a.clone(), pending(now + ms(10), 2));
        q.insert(c.clone(), pending(now + ms(30), 3));
        assert_eq!(q.first_due(), Some(now + ms(10)));
        assert_eq!(q.first_due_key(now), None, "nothing due yet");
        assert_eq!(q.first_due_key(now + ms(25)), Some(a.clone()));
        // Barrier at seq 1 of cluster "": b (seq 1) still pending.
        assert!(q.waiting("", 1));
        assert!(!q.waiting("", 0));
        // Moving a key's due time re-sorts it.
        assert!(q.modify(&a, |p| p.due = now + ms(40)));
        assert_eq!(q.first_due_key(now + ms(100)), Some(b.clone()));
        // Start b: out of the order, in flight; the barrier still waits.
        assert_eq!(q.start(&b).map(|p| p.seq), Some(1));
        assert_eq!(q.first_due_key(now + ms(100)), Some(c.clone()));
        assert!(q.waiting("", 0), "a write of the cluster is in flight");
        // A change of b while in flight is parked, not schedulable.
        q.insert(b.clone(), pending(now + ms(5), 4));
        assert_eq!(q.first_due(), Some(now + ms(30)));
        q.finished(&b);
        assert_eq!(q.first_due_key(now + ms(100)), Some(b.clone()));
        assert!(!q.waiting("", 1), "b now carries seq 4, a seq 2");
        assert!(q.waiting("", 2), "a (seq 2) is pending");
        assert!(q.remove(&a).is_some() && q.remove(&b).is_some());
        assert!(!q.waiting("", 10));
        assert!(q.waiting("c2", 3) && !q.waiting("c2", 2));
        assert!(q.remove(&c).is_some());
        assert!(q.is_empty() && q.first_due().is_none() && q.due.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_later_change_after_a_large_batch_is_written_again() {
        let sink = FakeSink::default();
        let shared = Arc::new(Shared::new([""]));
        let (h, _t) = spawn(
            sink.clone(),
            shared.clone(),
            Metrics::default(),
            opts(),
            CancellationToken::new(),
        );
        let keys: Vec<ServiceKey> = (0..50)
            .map(|i| ServiceKey::new("", "ns", format!("s{i}")))
            .collect();
        for k in &keys {
            shared.set_desired(k, Some(nodes(k, &["10.0.0.1"])));
        }
        h.changed(keys.clone(), Instant::now());
        h.synced("");
        // After the batch became due, s0 changes again.
        tokio::time::sleep(Duration::from_millis(101)).await;
        shared.set_desired(&keys[0], Some(nodes(&keys[0], &["10.0.0.2"])));
        h.changed(vec![keys[0].clone()], Instant::now());
        settle().await;
        let calls = sink.calls();
        assert_eq!(calls.len(), 51, "{calls:?}");
        assert_eq!(
            calls.last(),
            Some(&Call::Apply(
                "ns/s0".into(),
                nodes(&keys[0], &["10.0.0.2"]).version
            ))
        );
        assert!(shared.ready());
    }

    #[tokio::test(start_paused = true)]
    async fn deletes_only_what_exists_and_rate_limit_spaces_writes() {
        let sink = FakeSink::default();
        let shared = Arc::new(Shared::new([""]));
        let o = WriterOptions {
            qps: 2.0,
            concurrency: 8,
            ..opts()
        };
        let (h, _t) = spawn(
            sink.clone(),
            shared.clone(),
            Metrics::default(),
            o,
            CancellationToken::new(),
        );
        let keys: Vec<ServiceKey> = (0..6)
            .map(|i| ServiceKey::new("", "ns", format!("s{i}")))
            .collect();
        for k in &keys {
            shared.set_desired(k, Some(nodes(k, &["10.0.0.1"])));
        }
        let start = Instant::now();
        h.changed(keys.clone(), start);
        // Never-written key removed: nothing to delete.
        h.changed(vec![ServiceKey::new("", "ns", "never")], start);
        settle().await;
        assert_eq!(sink.calls().len(), 6);
        // 6 writes at 2/s with a one-second burst allowance take >= 1.5 s.
        assert!(Instant::now() - start >= Duration::from_millis(1500));
        shared.set_desired(&keys[0], None);
        h.changed(vec![keys[0].clone()], Instant::now());
        settle().await;
        assert_eq!(sink.calls().last(), Some(&Call::Delete("ns/s0".into())));
    }

    #[tokio::test(start_paused = true)]
    async fn drift_reports_rewrite_only_real_differences_after_writes_settle() {
        use crate::drift::DriftKind;
        let sink = FakeSink::default();
        let shared = Arc::new(Shared::new([""]));
        let m = Metrics::default();
        let (h, _t) = spawn(
            sink.clone(),
            shared.clone(),
            m.clone(),
            opts(),
            CancellationToken::new(),
        );
        let k = ServiceKey::new("", "ns", "web");
        let v1 = nodes(&k, &["10.0.0.1"]);
        shared.set_desired(&k, Some(v1.clone()));
        shared.update_cluster("", |c| c.listed = true);
        h.changed(vec![k.clone()], Instant::now());
        h.synced("");
        settle().await;
        assert_eq!(sink.calls().len(), 1);
        // The late watch event of our own write: the cache says Ok -> no write.
        h.drifted(vec![k.clone()]);
        settle().await;
        assert_eq!(sink.calls().len(), 1, "an own-write event caused a write");
        assert_eq!(*sink.drift_asked.lock().unwrap(), 1);
        // The cache has not caught up: asked again later, no write meanwhile.
        sink.drift
            .lock()
            .unwrap()
            .insert(k.clone(), DriftCheck::Stale);
        h.drifted(vec![k.clone()]);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(
            *sink.drift_asked.lock().unwrap() >= 3,
            "a stale check is repeated"
        );
        assert_eq!(sink.calls().len(), 1);
        // A real edit: the same version is written again, once.
        sink.drift
            .lock()
            .unwrap()
            .insert(k.clone(), DriftCheck::Drift(DriftKind::Edited));
        settle().await;
        sink.drift.lock().unwrap().insert(k.clone(), DriftCheck::Ok);
        settle().await;
        assert_eq!(
            sink.calls(),
            vec![
                Call::Apply("ns/web".into(), v1.version.clone()),
                Call::Apply("ns/web".into(), v1.version.clone())
            ]
        );
        let text = crate::metrics::encode(&m.registry());
        assert!(
            text.contains(r#"kube_discovery_drift_corrections_total{cluster="",kind="edited"} 1"#),
            "{text}"
        );
        // An orphan (no desired state, cluster listed) is deleted.
        let orphan = ServiceKey::new("", "ns", "ghost");
        sink.drift
            .lock()
            .unwrap()
            .insert(orphan.clone(), DriftCheck::Drift(DriftKind::Orphan));
        h.drifted(vec![orphan.clone()]);
        tokio::time::sleep(Duration::from_millis(600)).await;
        sink.drift.lock().unwrap().remove(&orphan);
        settle().await;
        assert_eq!(sink.calls().last(), Some(&Call::Delete("ns/ghost".into())));
        assert_eq!(sink.calls().len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn drift_check_waits_for_pending_writes_and_unlisted_clusters() {
        use crate::drift::DriftKind;
        let sink = FakeSink::default();
        let shared = Arc::new(Shared::new([""]));
        let (h, _t) = spawn(
            sink.clone(),
            shared.clone(),
            Metrics::default(),
            opts(),
            CancellationToken::new(),
        );
        // Orphan reports before the cluster is listed are ignored.
        let ghost = ServiceKey::new("", "ns", "ghost");
        sink.drift
            .lock()
            .unwrap()
            .insert(ghost.clone(), DriftCheck::Drift(DriftKind::Orphan));
        h.drifted(vec![ghost.clone()]);
        settle().await;
        assert!(sink.calls().is_empty(), "{:?}", sink.calls());
        // A key with a write pending is not checked before the write is done.
        let k = ServiceKey::new("", "ns", "web");
        shared.set_desired(&k, Some(nodes(&k, &["10.0.0.1"])));
        h.changed(vec![k.clone()], Instant::now());
        h.drifted(vec![k.clone()]);
        settle().await;
        let asked = *sink.drift_asked.lock().unwrap();
        assert_eq!(sink.calls().len(), 1);
        assert_eq!(asked, 1, "checked once, after the write settled");
    }

    #[tokio::test(start_paused = true)]
    async fn a_drift_check_parked_behind_retried_writes_runs_once_after_success() {
        let sink = FakeSink {
            fail_next: Arc::new(Mutex::new(3)),
            ..FakeSink::default()
        };
        let shared = Arc::new(Shared::new([""]));
        shared.update_cluster("", |c| c.listed = true);
        let (h, _t) = spawn(
            sink.clone(),
            shared.clone(),
            Metrics::default(),
            opts(),
            CancellationToken::new(),
        );
        // Many keys reported by a first-start sweep while their writes are
        // pending; one of them fails three times first.
        let keys: Vec<ServiceKey> = (0..20)
            .map(|i| ServiceKey::new("", "ns", format!("s{i}")))
            .collect();
        for k in &keys {
            shared.set_desired(k, Some(nodes(k, &["10.0.0.1"])));
        }
        h.changed(keys.clone(), Instant::now());
        h.drifted(keys.clone());
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(
            *sink.drift_asked.lock().unwrap(),
            0,
            "checked while writes were pending"
        );
        settle().await;
        settle().await;
        assert_eq!(sink.calls().len(), 20);
        assert_eq!(
            *sink.drift_asked.lock().unwrap(),
            20,
            "each parked check runs exactly once, after its write"
        );
        // A key whose pending write turns out to be a no-op is checked too.
        h.changed(vec![keys[0].clone()], Instant::now());
        h.drifted(vec![keys[0].clone()]);
        settle().await;
        assert_eq!(sink.calls().len(), 20, "no-op written");
        assert_eq!(*sink.drift_asked.lock().unwrap(), 21);
    }
}
