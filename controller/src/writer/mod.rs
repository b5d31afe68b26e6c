//! The writer: turns "these keys changed" into as few API writes as possible.
//!
//! ```text
//!  inbox: Changed(keys) ──▶ queue: pending{key: due = first change + window}
//!                                   │ due, not in flight, < concurrency, rate token
//!                                   ▼
//!              desired = ControllerState::desired(key)      (always the LATEST state)
//!              ├─ Some(v), known[key] == v.version ─▶ skip (no write)
//!              ├─ Some(v)                           ─▶ Sink::apply(v)  ─▶ known[key] = v.version
//!              ├─ None, key in known                ─▶ Sink::delete    ─▶ known.remove(key)
//!              └─ None, unknown                     ─▶ nothing
//!              failure ─▶ back into pending with exponential backoff (never dropped),
//!                         counted in kube_discovery_objects_failing{reason} until written
//!  inbox: Drifted(keys) ──▶ drift checks: later, Sink::drift(key) ─ Drift ─▶ forget known[key], queue it
//!  inbox: Synced(cluster) ─▶ barrier: stale objects of the cluster queued for deletion;
//!                            `synced` (readiness) once everything queued before it was
//!                            attempted: written, or failed and reported (a failed key is
//!                            re-queued behind the barrier, so one object the API server
//!                            refuses never keeps the controller unready)
//! ```
//!
//! * `known` starts from [`Sink::list_versions`] (the objects the API server
//!   already holds), so a restart with unchanged sources writes nothing.
//! * Coalescing: a key's write is due `coalesce_window` after its FIRST change
//!   since the last write; later changes inside the window ride along, so a
//!   rolling update's burst becomes one write per window.
//! * One write per key at a time (no reordering), at most `concurrency` in
//!   flight overall, at most `qps` writes per second (token bucket).
//! * Only while leading (leader election): a standby keeps its queue, and on
//!   becoming leader re-reads what the API server holds and re-checks
//!   everything.
//! * On shutdown no new writes start; in-flight writes finish.
//!
//! The parts:
//!
//! | module | what |
//! |---|---|
//! | `queue` | the pending keys, in due order; per-cluster barrier bookkeeping; O(log n) per key |
//! | `writes` | starting a write (skip no-ops, rate limit, spawn) and finishing it (retry on failure) |
//! | `drift_checks` | the `Drifted` reports: when a check is due, and what a drifted key does |
//! | `compact` | the compact forms the long-lived tables hold: `PackedKey`, `Version`, trimming |
//!
//! Scheduling never walks every pending key: the next wake-up is the first
//! entry of the due order, and a turn of the loop pops only what it starts
//! or skips.

mod compact;
mod drift_checks;
mod queue;
#[cfg(test)]
mod tests;
mod writes;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use self::compact::{PackedKey, Version, trim_map};
use self::drift_checks::DriftChecks;
use self::queue::{Pending, Queue};
use self::writes::Done;
use crate::inbox::{Inbox, WriterHandle, WriterMsg};
use crate::metrics::Metrics;
use crate::sink::Sink;
use crate::state::ControllerState;

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

/// Starts the writer task. It first reads what the sink already holds
/// (retrying with backoff), then processes messages until `shutdown`.
pub fn spawn<S: Sink>(
    sink: S,
    shared: Arc<ControllerState>,
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
    shared: Arc<ControllerState>,
    metrics: Metrics,
    opts: WriterOptions,
    shutdown: CancellationToken,
    leader: Option<watch::Receiver<bool>>,
) -> (WriterHandle, tokio::task::JoinHandle<()>) {
    let (handle, inbox) = crate::inbox::channel();
    let w = Writer::new(sink, shared, metrics, opts);
    let task = tokio::spawn(w.run(inbox, shutdown, leader));
    (handle, task)
}

struct Writer<S> {
    sink: S,
    shared: Arc<ControllerState>,
    metrics: Metrics,
    opts: WriterOptions,
    /// The version of every object the API server holds, by service (what
    /// we last wrote, or what [`Sink::list_versions`] found).
    known: HashMap<PackedKey, Version>,
    pending: Queue,
    barriers: Vec<(String, u64)>,
    seq: u64,
    next_token: Instant,
    drift_checks: DriftChecks,
    /// Services whose last write failed, with the failure's metric label
    /// (`kube_discovery_objects_failing`). Usually empty.
    failing: HashMap<PackedKey, &'static str>,
}

fn backoff(opts: &WriterOptions, attempts: u32) -> Duration {
    let exp = attempts.saturating_sub(1).min(16);
    let d = opts.retry_min.saturating_mul(1u32 << exp);
    d.min(opts.retry_max)
}

impl<S: Sink> Writer<S> {
    /// A writer with nothing known, pending or scheduled yet.
    fn new(sink: S, shared: Arc<ControllerState>, metrics: Metrics, opts: WriterOptions) -> Self {
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
            drift_checks: DriftChecks::default(),
            failing: HashMap::new(),
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
                        .map(|(k, v)| (PackedKey::new(&k), Version::new(&v)))
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
                self.enqueue(PackedKey::new(&svc.key), now);
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
        mut rx: Inbox,
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
                    self.enqueue(PackedKey::new(key), at);
                }
            }
            WriterMsg::Drifted { keys } => {
                let at = Instant::now() + self.opts.drift_delay.max(self.opts.coalesce_window);
                for key in &keys {
                    self.drift_checks.schedule(PackedKey::new(key), at);
                }
            }
            WriterMsg::Synced { cluster } => {
                // Objects the API server holds for this cluster that the first
                // complete list did not produce: their source vanished while we
                // were not watching.
                let stale: Vec<PackedKey> = self
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

    fn enqueue(&mut self, key: PackedKey, at: Instant) {
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
        match (write, self.drift_checks.first_due()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Gives back the memory of drained tables and of completions older
    /// than `drift_settle` (see [`trim_map`]); cheap when there is nothing to do.
    fn trim(&mut self) {
        self.pending.trim();
        trim_map(&mut self.failing);
        self.drift_checks
            .prune(Instant::now(), self.opts.drift_settle);
        trim_map(&mut self.known);
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
