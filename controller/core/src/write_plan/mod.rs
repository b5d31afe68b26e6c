//! The write planner: what to write, delete or check, and when. Pure: it
//! takes what happened ([`Input`]), the time, and reads the desired state
//! ([`DesiredView`]) and what the API server holds of our objects (the
//! [`Record`], fed by the runtime with the start-up list and the answers to
//! our writes BEFORE the input that reports them), and answers with what
//! to do ([`Action`]) and when to ask again; the controller's writer only
//! carries the actions out (each request with a timeout) and feeds the
//! results back.
//!
//! ```text
//!  Changed(keys, at) ─▶ pending{key: due, first event} (a pending key keeps its due)
//!                      due = now, or the key's last write start + coalesce_window
//!                      if that is later (leading and trailing edge;
//!                      coalesce_leading_edge false: now + coalesce_window)
//!  poll(now):  due, not in flight, < concurrency, limiter token
//!              desired == record's version, no repair owed ─▶ skip
//!              desired ─▶ Apply     none, held (or repair owed) ─▶ Delete
//!  Finished:   Applied / Deleted ─▶ repair done (the record has the answer)
//!              Failed(reason) ─▶ again after backoff, reported failing until written
//!              Fenced ─▶ again at once (the lease was lost; nothing was sent)
//!              Superseded ─▶ again at once (the desired state went away; nothing was sent)
//!              Throttled (429) ─▶ again when the limiter allows (not a failure)
//!  Throttled(retry_after) ─▶ limiter: rate halved, paused (see [`limiter`])
//!  Drifted(keys) ─▶ CheckDrift later (not while a write of the key is pending or settling)
//!  DriftSeen(facts) ─▶ judge_drift (`seen.rs`): Drift ─▶ repair owed (never skipped);
//!                     queued    Stale ─▶ check again later    Intact ─▶ nothing
//!  Synced(cluster) ─▶ stale objects of the cluster queued for deletion; ClusterSynced once
//!                     everything queued before it was attempted
//!  Leadership{epoch, leading}: a new leading epoch ─▶ Load{epoch}; Loaded ─▶ resync
//! ```
//!
//! Coalescing has a leading and a trailing edge: a change of a quiet key
//! (no write of it started within `coalesce_window`) is written at once,
//! and the changes that follow within the window wait for its end and
//! become one write, so a key is written at most once per window and a
//! burst of changes costs about one write per window it lasts, plus one.
//! kube-proxy's `BoundedFrequencyRunner` follows the same rule (a sync at
//! once when the last is `minSyncPeriod` old, else at last + period).
//! `coalesce_leading_edge: false` is the trailing-only rule (every change
//! due `now + coalesce_window`, the changes of one window one write; Istio's
//! `PILOT_DEBOUNCE_AFTER` debounce is trailing-only too): a rolling
//! update step (new Pod ready, old one terminating ~20 ms later) is one
//! write instead of two, a lone change waits the whole window.
//!
//! The planner keeps no copy of what the API server holds: it reads the
//! one [`Record`] (per service: version and shard slots) as plain input.
//! Its own decision state is what it decided: pending writes, retries,
//! failing keys, drift checks, and the repairs owed (a set: a judgement of
//! the planner, not something the API server holds, so it survives a new
//! start-up list).
//!
//! Every [`Action::Apply`] / [`Action::Delete`] carries a [`Prior`]: the
//! shard slots the service's last write left on the API server (from the
//! start-up list, then from every write) and whether the write repairs
//! drift. [`object_ops`] turns that and the desired objects into the
//! requests of the write (which shards, which surplus or stray objects), so
//! the sink that sends them keeps no state of its own.
//!
//! Time is an [`At`], a [`Duration`] since an origin the caller picks (the
//! writer uses its start), so tests script time exactly.

pub mod answer;
mod compact;
mod drift;
pub mod limiter;
mod objects;
mod queue;
pub mod record;
mod seen;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use self::compact::PackedKey;
use self::compact::{trim_map, trim_set};
use self::drift::DriftChecks;
use self::limiter::{Limiter, RateOptions};
pub use self::objects::{
    DeleteWhy, NameTaken, ObjName, ObjectOp, ObjectPlan, ServerFacts, ServerView, object_ops,
};
use self::queue::{Pending, Queue};
use self::record::Record;
pub use self::seen::{DriftFacts, SeenObject, WantedObjectFacts, judge_drift};
use crate::backoff::RetryDelays;
use crate::{ServiceKey, ServiceNodes};

/// A point in time: the time since an origin the caller picks.
pub type At = Duration;

/// Tuning of the planner.
#[derive(Debug, Clone)]
pub struct Options {
    /// Per-key coalescing window: writes of one key start at least this far
    /// apart; a change of a key not written within it is written at once.
    pub coalesce_window: Duration,
    /// Whether a change of a quiet key is written at once (the leading
    /// edge). `false`: every change waits `coalesce_window` (trailing edge
    /// only: about half the writes of a rolling update, each change a
    /// window later).
    pub coalesce_leading_edge: bool,
    /// Maximum writes in flight.
    pub concurrency: usize,
    /// The ceiling of the adaptive rate limit ([`limiter`]), writes per
    /// second (0 = unlimited: no limiter at all).
    pub qps: f64,
    /// Where the adaptive rate limit starts, writes per second (at most
    /// `qps`).
    pub start_qps: f64,
    /// The longest pause a 429's `Retry-After` causes.
    pub max_pause: Duration,
    /// First retry delay after a failed write (also of a failed start-up list).
    pub retry_min: Duration,
    /// Maximum retry delay.
    pub retry_max: Duration,
    /// Delay before a drift report is checked (at least `coalesce_window`).
    pub drift_delay: Duration,
    /// A drift check waits until the key's last write finished this long ago.
    pub drift_settle: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            coalesce_window: Duration::from_millis(100),
            coalesce_leading_edge: true,
            concurrency: 8,
            qps: RateOptions::default().ceiling,
            start_qps: RateOptions::default().start,
            max_pause: RateOptions::default().max_pause,
            retry_min: Duration::from_millis(500),
            retry_max: Duration::from_secs(30),
            drift_delay: Duration::from_millis(200),
            drift_settle: Duration::from_millis(750),
        }
    }
}

/// What the planner reads of the desired state when it decides (always the
/// latest: a write carries whatever is desired when it starts).
pub trait DesiredView {
    /// The desired `spec.version` of `key` (`None`: no source, delete).
    fn version(&self, key: &ServiceKey) -> Option<String>;
    /// Whether `cluster` finished its first complete list.
    fn listed(&self, cluster: &str) -> bool;
    /// Every configured cluster and whether it is listed.
    fn clusters(&self) -> Vec<(String, bool)>;
    /// The keys with a desired state in `cluster`.
    fn keys_of(&self, cluster: &str) -> Vec<ServiceKey>;
    /// The desired state of `key` (`None`: no source), for the drift
    /// checks over the record ([`record::drift_facts`]).
    fn nodes(&self, key: &ServiceKey) -> Option<Arc<ServiceNodes>>;
}

/// What the API server holds of one service's objects (the start-up list
/// found it, [`record::Listing::service`]; [`Record::held`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The `spec.version` of the whole service (`""` when its objects are
    /// incomplete or mixed: it is rewritten).
    pub version: String,
    /// Shard slots in use: the highest shard index found + 1 (1: one object).
    pub shards: u32,
}

/// What a write of a service starts from (carried by [`Action::Apply`] and
/// [`Action::Delete`], read by [`object_ops`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prior {
    /// Shard slots the last write (or the start-up list) left: a shrink
    /// deletes the slots beyond the new count, a delete every slot.
    pub shards: u32,
    /// A drift check found the objects different: write only what the cache
    /// does not show intact, and delete strays.
    pub repair: bool,
}

impl Default for Prior {
    fn default() -> Self {
        Prior {
            shards: 1,
            repair: false,
        }
    }
}

/// How a write ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Applied.
    Applied {
        /// The `spec.version` written.
        version: String,
        /// The number of objects (shards) the service has now.
        shards: u32,
    },
    /// Deleted (or already absent).
    Deleted,
    /// Failed; the reason is a metric label (`forbidden`, `name_taken`, ...).
    Failed(String),
    /// Dropped by the leadership fence: nothing was sent after the loss.
    Fenced,
    /// An [`Action::Apply`] found no desired state when the write started
    /// (it went away after the planner decided): nothing was sent; planned
    /// again at once (a delete, when the API server holds objects of it).
    Superseded,
    /// The API server answered 429 (too many requests): written again when
    /// the limiter allows, not a failure (the 429 itself reaches the
    /// limiter as [`Input::Throttled`]).
    Throttled,
}

/// What a drift check found ([`judge_drift`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriftResult {
    /// What the API server holds is what we want (or not ours to judge).
    Intact,
    /// The cache has not seen our last write yet: look again later.
    Stale,
    /// Differs; the kind is a metric label (`edited`, `deleted`, `orphan`).
    Drift(&'static str),
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// These keys' desired state changed, each first at the given time.
    Changed(Vec<(ServiceKey, At)>),
    /// The objects of these keys may differ from the desired state.
    Drifted(Vec<ServiceKey>),
    /// `cluster` finished its first complete list; every change reported
    /// before belongs to it.
    Synced(String),
    /// Leadership changed (without leader election: one leading epoch 0).
    Leadership {
        /// Changes on every gain and loss.
        epoch: u64,
        /// Whether this replica leads in it.
        leading: bool,
    },
    /// The list of [`Action::Load`] landed in the record (what the API
    /// server holds of our objects, read by the planner from then on).
    Loaded {
        /// The epoch the list was asked for.
        epoch: u64,
    },
    /// The list of [`Action::Load`] failed; asked again after a backoff.
    LoadFailed {
        /// The epoch the list was asked for.
        epoch: u64,
    },
    /// A write of [`Action::Apply`] / [`Action::Delete`] ended.
    Finished {
        /// The key.
        key: ServiceKey,
        /// How.
        outcome: Outcome,
    },
    /// The API server answered a write request with 429 (seen on the
    /// writer's client, also when the client retried it): the limiter halves
    /// the rate and pauses for `retry_after` (capped).
    Throttled {
        /// The answer's `Retry-After`.
        retry_after: Option<Duration>,
    },
    /// The answer to [`Action::CheckDrift`]: what the drift watch shows of
    /// the key's objects and what its desired state wants; the planner
    /// judges it ([`judge_drift`]).
    DriftSeen {
        /// The key.
        key: ServiceKey,
        /// What is compared.
        facts: DriftFacts,
    },
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// List our objects on the API server into the record; answer with
    /// [`Input::Loaded`] or [`Input::LoadFailed`].
    Load {
        /// The leading epoch it is for.
        epoch: u64,
    },
    /// Write the desired state of `key` (as desired when the write starts);
    /// answer with [`Input::Finished`].
    Apply {
        /// The key.
        key: ServiceKey,
        /// The leading epoch the write is fenced with.
        epoch: u64,
        /// The first change this write carries (for the latency histogram).
        since: At,
        /// What the write starts from.
        prior: Prior,
    },
    /// Delete the objects of `key`; answer with [`Input::Finished`].
    Delete {
        /// The key.
        key: ServiceKey,
        /// The leading epoch the write is fenced with.
        epoch: u64,
        /// The first change this write carries.
        since: At,
        /// What the write starts from.
        prior: Prior,
    },
    /// Gather what the drift watch shows of `key`'s objects and what its
    /// desired state wants; answer with [`Input::DriftSeen`].
    CheckDrift {
        /// The key.
        key: ServiceKey,
    },
    /// `key` needed no write (the API server holds its version).
    Skipped {
        /// The key.
        key: ServiceKey,
    },
    /// A drift check found `key` different: it is rewritten.
    Repair {
        /// The key.
        key: ServiceKey,
        /// `edited`, `deleted` or `orphan`.
        kind: &'static str,
    },
    /// A failed write of `key` is tried again after `delay`.
    Retry {
        /// The key.
        key: ServiceKey,
        /// The failure's reason.
        reason: String,
        /// Failed attempts so far.
        attempt: u32,
        /// Until the next attempt.
        delay: Duration,
    },
    /// `key` moves between failure reasons (`None`: not failing).
    Failing {
        /// The key.
        key: ServiceKey,
        /// Its previous reason.
        from: Option<String>,
        /// Its reason now.
        to: Option<String>,
    },
    /// Everything `cluster`'s first complete list asked for was attempted.
    ClusterSynced(String),
    /// This replica writes (`false`) or waits as a standby (`true`).
    Standby(bool),
}

/// The planner's state (see the module docs).
pub struct Planner {
    opts: Options,
    /// Services a drift check found different: their next write repairs
    /// ([`Prior::repair`]) and is never skipped, until one succeeds.
    repair: HashSet<PackedKey>,
    pending: Queue,
    barriers: Vec<(String, u64)>,
    seq: u64,
    limiter: Limiter,
    drift: DriftChecks,
    failing: HashMap<PackedKey, String>,
    /// The current epoch, whether it leads, and whether the record was
    /// listed for it.
    epoch: u64,
    leading: bool,
    loaded: bool,
    /// A load was asked for and not answered; `load_due`: when to ask again.
    loading: bool,
    load_due: At,
    load_attempts: u32,
    /// First-list barriers that arrived before the record was listed: they
    /// need it (stale objects), so they wait for it.
    deferred_synced: Vec<String>,
    actions: Vec<Action>,
}

impl Planner {
    /// A planner that leads in epoch 0 (no leader election) with nothing
    /// known yet: its first poll asks for [`Action::Load`].
    pub fn new(opts: Options) -> Self {
        let limiter = Limiter::new(RateOptions {
            start: opts.start_qps,
            ceiling: opts.qps,
            max_pause: opts.max_pause,
        });
        let pending = Queue::new(opts.coalesce_window);
        Planner {
            opts,
            repair: HashSet::new(),
            pending,
            barriers: Vec::new(),
            seq: 0,
            limiter,
            drift: DriftChecks::default(),
            failing: HashMap::new(),
            epoch: 0,
            leading: true,
            loaded: false,
            loading: false,
            load_due: At::ZERO,
            load_attempts: 0,
            deferred_synced: Vec::new(),
            actions: Vec::new(),
        }
    }

    /// `retry_min` doubling per attempt, at most `retry_max`.
    fn backoff(&self, attempts: u32) -> Duration {
        RetryDelays::new(self.opts.retry_min, self.opts.retry_max).delay(attempts)
    }

    /// Takes in what happened at `now`; returns what to do at once.
    /// `record` is what the API server holds of our objects, already fed
    /// with the answer `input` reports (a write's, a list's).
    pub fn handle(
        &mut self,
        now: At,
        input: Input,
        desired: &dyn DesiredView,
        record: &Record,
    ) -> Vec<Action> {
        match input {
            Input::Changed(keys) => {
                for (key, at) in &keys {
                    self.enqueue(PackedKey::new(key), *at, now);
                }
            }
            Input::Drifted(keys) => {
                let at = now + self.opts.drift_delay.max(self.opts.coalesce_window);
                for key in &keys {
                    self.drift.schedule(PackedKey::new(key), at);
                }
            }
            Input::Synced(cluster) => {
                if self.loaded {
                    self.synced(cluster, now, desired, record);
                } else if !self.deferred_synced.contains(&cluster) {
                    self.deferred_synced.push(cluster);
                }
            }
            Input::Leadership { epoch, leading } => {
                if (epoch, leading) != (self.epoch, self.leading) {
                    let was = self.leading;
                    self.epoch = epoch;
                    self.leading = leading;
                    self.loaded = false;
                    self.loading = false;
                    self.load_due = now;
                    self.load_attempts = 0;
                    if was != leading {
                        self.actions.push(Action::Standby(!leading));
                    }
                }
            }
            Input::Loaded { epoch } => {
                if epoch == self.epoch && self.leading && !self.loaded {
                    self.loaded = true;
                    self.loading = false;
                    self.resync(now, desired, record);
                }
            }
            Input::LoadFailed { epoch } => {
                if epoch == self.epoch && self.loading {
                    self.loading = false;
                    self.load_attempts += 1;
                    self.load_due = now + self.backoff(self.load_attempts);
                }
            }
            Input::Finished { key, outcome } => self.finish(PackedKey::new(&key), outcome, now),
            Input::Throttled { retry_after } => self.limiter.throttled(now, retry_after),
            Input::DriftSeen { key, facts } => {
                let key = PackedKey::new(&key);
                match judge_drift(&facts) {
                    DriftResult::Intact => {}
                    DriftResult::Stale => {
                        let at = now + self.opts.drift_delay.max(self.opts.coalesce_window);
                        self.drift.schedule(key, at);
                    }
                    DriftResult::Drift(kind) => {
                        self.actions.push(Action::Repair {
                            key: key.service_key(),
                            kind,
                        });
                        // Rewritten (or deleted), as a repair.
                        self.repair.insert(key.clone());
                        self.enqueue(key, now, now);
                    }
                }
            }
        }
        std::mem::take(&mut self.actions)
    }

    /// What is due at `now`, and when to poll again (`None`: only after
    /// the next input).
    pub fn poll(
        &mut self,
        now: At,
        desired: &dyn DesiredView,
        record: &Record,
    ) -> (Vec<Action>, Option<At>) {
        let mut wake = None;
        if self.leading && !self.loaded {
            if !self.loading && self.load_due <= now {
                self.loading = true;
                self.actions.push(Action::Load { epoch: self.epoch });
            } else if !self.loading {
                wake = Some(self.load_due);
            }
        } else if self.leading {
            self.check_drift(now, desired);
            self.dispatch(now, desired, record);
            self.check_barriers();
        }
        // Before the wake-up: pruning moves the drift table's next time.
        self.trim(now);
        if self.leading && self.loaded {
            wake = self.next_wake();
        }
        (std::mem::take(&mut self.actions), wake)
    }

    /// Writes in flight.
    pub fn in_flight(&self) -> usize {
        self.pending.inflight.len()
    }

    /// The limiter's rate now, writes per second (infinite without a
    /// ceiling).
    pub fn write_rate(&self) -> f64 {
        self.limiter.rate()
    }

    /// Nothing pending and nothing in flight.
    pub fn idle(&self) -> bool {
        self.pending.is_empty() && self.pending.inflight.is_empty()
    }

    fn enqueue(&mut self, key: PackedKey, at: At, now: At) {
        let seq = self.seq;
        self.seq += 1;
        let due = if self.opts.coalesce_leading_edge {
            self.pending.due_of_change(&key, now)
        } else {
            now + self.opts.coalesce_window
        };
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

    fn synced(&mut self, cluster: String, now: At, desired: &dyn DesiredView, record: &Record) {
        // Objects the API server holds for this cluster that the first
        // complete list did not produce: their source vanished while we were
        // not watching (also those a drift check found, held or not).
        let stale: Vec<PackedKey> = record
            .services()
            .chain(self.repair.iter().filter(|k| record.service(k).is_none()))
            .filter(|k| k.cluster() == cluster && desired.version(&k.service_key()).is_none())
            .cloned()
            .collect();
        for key in stale {
            self.enqueue(key, now, now);
        }
        self.barriers.push((cluster, self.seq));
        self.seq += 1;
    }

    /// After loading: everything desired is due again (no-ops are skipped
    /// against the fresh record), and listed clusters get a new barrier.
    fn resync(&mut self, now: At, desired: &dyn DesiredView, record: &Record) {
        let mut deferred = std::mem::take(&mut self.deferred_synced);
        for (cluster, listed) in desired.clusters() {
            for key in desired.keys_of(&cluster) {
                self.enqueue(PackedKey::new(&key), now, now);
            }
            if listed {
                deferred.retain(|c| *c != cluster);
                self.synced(cluster, now, desired, record);
            }
        }
        for cluster in deferred {
            self.synced(cluster, now, desired, record);
        }
    }

    fn dispatch(&mut self, now: At, desired: &dyn DesiredView, record: &Record) {
        while self.pending.inflight.len() < self.opts.concurrency.max(1) {
            let Some(key) = self.pending.first_due_key(now) else {
                break;
            };
            let skey = key.service_key();
            let version = desired.version(&skey);
            let repair = self.repair.contains(&key);
            match (&version, record.service(&key).map(|s| &s.version)) {
                // A repair is owed: written (or deleted) whatever the
                // versions say.
                _ if repair => {}
                (Some(d), Some(v)) if v.is(d) => {
                    self.pending.remove(&key);
                    self.clear_failing(&key);
                    self.actions.push(Action::Skipped { key: skey });
                    self.unpark(&key, now);
                    continue;
                }
                (None, None) => {
                    self.pending.remove(&key);
                    self.clear_failing(&key);
                    self.unpark(&key, now);
                    continue;
                }
                _ => {}
            }
            if !self.limiter.try_take(now) {
                break;
            }
            let Some(since) = self.pending.start(&key, now).map(|p| p.first_event) else {
                continue;
            };
            let epoch = self.epoch;
            let prior = record.prior(&key, repair);
            self.actions.push(match version {
                Some(_) => Action::Apply {
                    key: skey,
                    epoch,
                    since,
                    prior,
                },
                None => Action::Delete {
                    key: skey,
                    epoch,
                    since,
                    prior,
                },
            });
        }
    }

    fn finish(&mut self, key: PackedKey, outcome: Outcome, now: At) {
        let Some(started) = self.pending.finished_started(&key) else {
            return;
        };
        self.drift.done(&key, now, self.opts.drift_settle);
        let (attempts, due) = match outcome {
            // The record has the answer (the runtime fed it first).
            Outcome::Applied { .. } => {
                self.repair.remove(&key);
                self.clear_failing(&key);
                self.unpark(&key, now);
                self.limiter.succeeded();
                return;
            }
            Outcome::Deleted => {
                self.limiter.succeeded();
                self.repair.remove(&key);
                self.clear_failing(&key);
                self.unpark(&key, now);
                return;
            }
            Outcome::Fenced | Outcome::Superseded => (started.attempts, now),
            // Again once the limiter allows (it is paused now if the 429 was
            // reported first, as the writer does), and not before
            // `retry_min` (without a limiter: not in a tight loop).
            Outcome::Throttled => (
                started.attempts,
                self.limiter.ready_at().max(now + self.opts.retry_min),
            ),
            Outcome::Failed(reason) => {
                let attempts = started.attempts + 1;
                let delay = self.backoff(attempts);
                let from = self.failing.insert(key.clone(), reason.clone());
                if from.as_ref() != Some(&reason) {
                    self.actions.push(Action::Failing {
                        key: key.service_key(),
                        from,
                        to: Some(reason.clone()),
                    });
                }
                self.actions.push(Action::Retry {
                    key: key.service_key(),
                    reason,
                    attempt: attempts,
                    delay,
                });
                (attempts, now + delay)
            }
        };
        // Attempted: the retry gets a new sequence number, behind every
        // readiness barrier so far (a failure is reported, not waited for).
        let seq = self.seq;
        self.seq += 1;
        let first_event = started.first_event;
        let merged = self.pending.modify(&key, |p| {
            p.seq = seq;
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

    fn clear_failing(&mut self, key: &PackedKey) {
        if let Some(from) = self.failing.remove(key) {
            self.actions.push(Action::Failing {
                key: key.service_key(),
                from: Some(from),
                to: None,
            });
        }
    }

    fn check_barriers(&mut self) {
        let pending = &self.pending;
        let actions = &mut self.actions;
        self.barriers.retain(|(cluster, bseq)| {
            if pending.waiting(cluster, *bseq) {
                return true;
            }
            actions.push(Action::ClusterSynced(cluster.clone()));
            false
        });
    }

    fn check_drift(&mut self, now: At, desired: &dyn DesiredView) {
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
            if desired.version(&skey).is_none() && !desired.listed(&skey.cluster) {
                // The first-list barrier decides about this cluster's objects.
                continue;
            }
            self.actions.push(Action::CheckDrift { key: skey });
        }
        for (key, at) in later {
            self.drift.schedule(key, at);
        }
    }

    /// `key`'s write finished or was skipped: a parked drift check of it is
    /// scheduled (unless another write of it is pending or in flight).
    fn unpark(&mut self, key: &PackedKey, now: At) {
        if self.pending.busy(key) {
            return;
        }
        if self.drift.parked.remove(key) {
            self.drift
                .schedule(key.clone(), now + self.opts.drift_settle);
        }
    }

    /// The next due write (not while every write slot is taken: a finishing
    /// write is an input then) or drift check. (No wake-up to prune the
    /// write starts: the next poll does; the drift table's pruning wakes the
    /// loop `drift_settle` after every write.)
    fn next_wake(&self) -> Option<At> {
        let full = self.pending.inflight.len() >= self.opts.concurrency.max(1);
        let write = if full {
            None
        } else {
            self.pending
                .first_due()
                .map(|due| due.max(self.limiter.ready_at()))
        };
        match (write, self.drift.first_due()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn trim(&mut self, now: At) {
        self.pending.prune_recent(now);
        self.pending.trim();
        self.drift.prune(now, self.opts.drift_settle);
        trim_set(&mut self.repair);
        trim_map(&mut self.failing);
    }
}
