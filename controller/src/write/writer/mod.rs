//! The writer: carries out what the pure planner
//! ([`kube_discovery_core::write_plan::Planner`]) decides, and feeds the
//! results back. Every decision (coalescing, skipping no-ops, the rate limit,
//! retries and when a key is failing, drift checks, first-list barriers,
//! leadership epochs) is the planner's, tested there with scripted inputs and
//! golden files; this loop turns each action into sink calls, metrics and
//! logs, one action at a time, and never asks the planner mid-action.
//!
//! ```text
//!  inbox (Changed / Drifted / Synced) ─┐
//!  leadership (epoch, leading) ────────┼─▶ Planner::handle ─┐
//!  finished writes / loads ────────────┤   (reads the       ├─▶ actions ─▶ Sink::apply / delete (tasks),
//!  drift answers (queued, not nested) ─┘    record)         │            Sink::list_versions (a task),
//!  the wake-up the planner asked for ──▶ Planner::poll ─────┘            Sink::drift_facts, Events, state, metrics
//! ```
//!
//! The planner reads what the API server holds of our objects from the
//! sink's record ([`Sink::record`], locked around each planner call, never
//! across a request). A finished list has landed in it before
//! [`Input::Loaded`]; an applied or deleted write's answer (version and
//! shard slots) is put into it here, before the planner hears of it.
//!
//! The answer to an action carried out at once (a drift check: what the
//! drift watch shows of the key's objects, which the planner judges) is
//! queued and fed to the planner after the current batch of actions, never
//! from inside it. A failed write is logged and reported (an Event) when the planner's
//! `Retry` and `Failing` actions say so; the writer only keeps the error
//! until then.
//!
//! 429s reach the planner's adaptive limiter two ways: the writer's client
//! records every 429 answer with its `Retry-After` ([`ThrottleSignal`]),
//! which this loop drains into [`Input::Throttled`] whenever a task ends; a
//! write that failed with 429 finishes as [`Outcome::Throttled`] (written
//! again when the limiter allows, not a failure).
//!
//! Only keys travel: an apply writes the desired state of its key as
//! [`ControllerState`] has it when the write starts (always the latest);
//! gone by then, nothing is sent ([`Outcome::Superseded`]) and the planner
//! decides again (a delete). Every write is fenced by the epoch of its
//! action, the one the planner decided it in. A
//! write task that panics is a failed write of its key (retried). On shutdown
//! no new write starts; in-flight writes finish.

#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use kube_discovery_core::ServiceKey;
use kube_discovery_core::crd::Owner;
use kube_discovery_core::write_plan::{Action, At, Held, Input, Options, Outcome, Planner, Prior};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::k8s::client::ThrottleSignal;
use crate::k8s::leader::Leadership;
use crate::serve::metrics::Metrics;
use crate::state::ControllerState;
use crate::write::inbox::{Inbox, WriterHandle, WriterMsg};
use crate::write::record::SharedRecord;
use crate::write::sink::Sink;
use crate::{Error, Result, panic_message};

/// Tuning of the writer (the planner's [`Options`]).
pub type WriterOptions = Options;

/// What a writer runs with besides its sink and the shared state. Only
/// `opts` usually differs from the default; the rest is for the runtime
/// (leader election, the client's 429s) and tests that read the metrics.
#[derive(Clone, Default)]
pub struct Spawn {
    /// The planner's tuning.
    pub opts: WriterOptions,
    /// Where the writer counts.
    pub metrics: Metrics,
    /// Stops the writer: no new write starts, in-flight writes finish.
    pub shutdown: CancellationToken,
    /// Write only while this says so (leader election); `None`: always. A
    /// standby keeps its queue; on becoming leader (in any new epoch, also
    /// after a loss and a gain it did not see in between) it re-reads what
    /// the API server holds and re-checks every service. The writes
    /// themselves are fenced by the sink (a [`crate::k8s::leader::Fence`] given
    /// to it at construction): a write this loop starts after a loss it
    /// has not processed yet sends nothing.
    pub leader: Option<watch::Receiver<Leadership>>,
    /// The 429s the sink's client saw
    /// ([`crate::k8s::client::ClientLimits::throttle`]), fed to the limiter.
    pub throttle: ThrottleSignal,
}

/// Starts the writer task. It first reads what the sink already holds
/// (retrying with backoff), then processes messages until `with.shutdown`.
pub fn spawn<S: Sink>(
    sink: S,
    shared: Arc<ControllerState>,
    with: Spawn,
) -> (WriterHandle, tokio::task::JoinHandle<()>) {
    let (handle, inbox) = crate::write::inbox::channel();
    let mut w = Writer::new(sink, shared, with.metrics, with.opts);
    w.throttle = with.throttle;
    let task = tokio::spawn(w.run(inbox, with.shutdown, with.leader));
    (handle, task)
}

/// What a task of the writer ends with.
enum Done {
    Write {
        key: ServiceKey,
        since: At,
        result: Result<Outcome>,
    },
    Load {
        epoch: u64,
        result: Result<Vec<(ServiceKey, Held)>>,
    },
}

/// What a write task sends: the desired state of an [`Action::Apply`] as
/// it is when the write starts (`None`: gone since the planner decided, so
/// nothing is sent), or an [`Action::Delete`].
enum Write {
    Apply(Option<Arc<kube_discovery_core::ServiceNodes>>),
    Delete,
}

struct Writer<S> {
    sink: S,
    shared: Arc<ControllerState>,
    metrics: Metrics,
    planner: Planner,
    /// What the API server holds of our objects (the sink's).
    record: SharedRecord,
    origin: Instant,
    tasks: JoinSet<Done>,
    throttle: ThrottleSignal,
    /// The error of the failed write being handed to the planner, for its
    /// `Retry` (the log line) and `Failing` (the Event) actions.
    failure: Option<(ServiceKey, Error)>,
}

impl<S: Sink> Writer<S> {
    fn new(sink: S, shared: Arc<ControllerState>, metrics: Metrics, opts: WriterOptions) -> Self {
        let record = sink.record();
        Writer {
            sink,
            shared,
            metrics,
            planner: Planner::new(opts),
            record,
            origin: Instant::now(),
            tasks: JoinSet::new(),
            throttle: ThrottleSignal::default(),
            failure: None,
        }
    }

    fn at(&self, t: Instant) -> At {
        t.saturating_duration_since(self.origin)
    }

    fn now(&self) -> At {
        self.at(Instant::now())
    }

    /// Feeds `input` to the planner and carries out its actions; the
    /// answers of actions carried out at once go to the planner after them.
    fn handle(&mut self, input: Input) {
        let mut inputs = VecDeque::from([input]);
        while let Some(input) = inputs.pop_front() {
            let now = self.now();
            let actions = {
                let record = self.record.lock();
                self.planner.handle(now, input, &*self.shared, &record)
            };
            inputs.extend(actions.into_iter().filter_map(|a| self.execute(a)));
        }
    }

    /// Feeds the 429s the client saw since the last call to the limiter.
    fn drain_throttles(&mut self) {
        if let Some(t) = self.throttle.take() {
            self.metrics.throttled(t.apf, t.other);
            let before = self.planner.write_rate();
            self.handle(Input::Throttled {
                retry_after: t.retry_after,
            });
            let rate = self.planner.write_rate();
            if rate < before {
                tracing::warn!(answers = t.count(), retry_after = ?t.retry_after, rate, "API server throttles writes (429): slowing down");
            } else {
                tracing::debug!(answers = t.count(), retry_after = ?t.retry_after, rate, "429 answers");
            }
        }
    }

    /// Polls the planner until it has nothing due (drift answers are fed
    /// back after each batch) and returns when it wants to be polled again.
    fn poll(&mut self) -> Option<Instant> {
        loop {
            let now = self.now();
            let (actions, wake) = {
                let record = self.record.lock();
                self.planner.poll(now, &*self.shared, &record)
            };
            if actions.is_empty() {
                return wake.map(|w| self.origin + w);
            }
            let answers: Vec<Input> = actions
                .into_iter()
                .filter_map(|a| self.execute(a))
                .collect();
            for input in answers {
                self.handle(input);
            }
        }
    }

    /// Carries out one action; returns the answer of an action carried out
    /// at once (a drift check), for the planner.
    fn execute(&mut self, action: Action) -> Option<Input> {
        match action {
            Action::Load { epoch } => {
                let sink = self.sink.clone();
                self.tasks.spawn(async move {
                    Done::Load {
                        epoch,
                        result: sink.list_versions().await,
                    }
                });
            }
            Action::Apply {
                key,
                since,
                prior,
                epoch,
            } => {
                let desired = self.shared.desired(&key);
                self.spawn_write(key, since, prior, epoch, Write::Apply(desired));
            }
            Action::Delete {
                key,
                since,
                prior,
                epoch,
            } => self.spawn_write(key, since, prior, epoch, Write::Delete),
            Action::CheckDrift { key } => {
                let desired = self.shared.desired(&key);
                let facts = self.sink.drift_facts(&key, desired.as_deref());
                return Some(Input::DriftSeen { key, facts });
            }
            Action::Skipped { key } => {
                self.metrics
                    .writes_skipped
                    .get_or_create(&Metrics::cluster(&key.cluster))
                    .inc();
                tracing::debug!(service = %key, "up to date, no write");
            }
            Action::Repair { key, kind } => {
                self.metrics.drift(&key.cluster, kind);
                tracing::info!(service = %key, kind, "drift: restoring the desired state");
            }
            Action::Retry {
                key,
                attempt,
                delay: retry_in,
                ..
            } => {
                if let Some((_, e)) = self.failure.as_ref().filter(|(k, _)| *k == key) {
                    match e {
                        Error::NameTaken { object, owner } => {
                            tracing::warn!(service = %key, object = %object, owner = %owner, attempt, retry_in = ?retry_in, "name taken: the object of this service belongs to someone else; not written");
                        }
                        Error::WritePanicked(_) => {
                            tracing::error!(service = %key, error = %e, attempt, retry_in = ?retry_in, "write task panicked; retrying");
                        }
                        _ => {
                            tracing::warn!(service = %key, error = %e, attempt, retry_in = ?retry_in, "write failed");
                        }
                    }
                }
            }
            Action::Failing { key, from, to } => {
                self.metrics
                    .failing(&key.cluster, from.as_deref(), to.as_deref());
                // An Event only when the key starts failing or fails for
                // another reason (not on every retry).
                if to.is_some()
                    && let Some((_, e)) = self.failure.as_ref().filter(|(k, _)| *k == key)
                {
                    let desired = self.shared.desired(&key);
                    self.sink.failing(&key, desired.as_deref(), e);
                }
            }
            Action::ClusterSynced(cluster) => {
                self.shared.update_cluster(&cluster, |c| c.synced = true);
                tracing::info!(cluster = %cluster, "first complete list written");
            }
            Action::Standby(standby) => {
                self.shared.set_standby(standby);
                if standby {
                    tracing::info!("standby: not writing");
                } else {
                    tracing::info!("leader: writing");
                }
            }
        }
        None
    }

    fn spawn_write(&mut self, key: ServiceKey, since: At, prior: Prior, epoch: u64, write: Write) {
        let sink = self.sink.clone();
        self.tasks.spawn(async move {
            let k = key.clone();
            let write = async move {
                match write {
                    Write::Apply(Some(d)) => {
                        let version = d.version.clone();
                        sink.apply(d, prior, epoch)
                            .await
                            .map(|shards| Outcome::Applied { version, shards })
                    }
                    // Gone since the planner decided: nothing is sent; the
                    // planner decides again (its input has the change).
                    Write::Apply(None) => Ok(Outcome::Superseded),
                    Write::Delete => sink
                        .delete(k, prior, epoch)
                        .await
                        .map(|()| Outcome::Deleted),
                }
            };
            // A panicking write is a failed write of its key (retried with
            // backoff), not a key in flight forever.
            let result = AssertUnwindSafe(write)
                .catch_unwind()
                .await
                .unwrap_or_else(|panic| Err(Error::WritePanicked(panic_message(&*panic))));
            Done::Write { key, since, result }
        });
    }

    fn finish(&mut self, done: Done) {
        // Before the outcome: a throttled write is due again after the pause.
        self.drain_throttles();
        match done {
            Done::Load { epoch, result } => match result {
                Ok(known) => {
                    tracing::info!(objects = known.len(), "read existing DiscoveredServices");
                    self.handle(Input::Loaded { epoch });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot list existing DiscoveredServices");
                    self.handle(Input::LoadFailed { epoch });
                }
            },
            Done::Write { key, since, result } => {
                let cluster = key.cluster.to_string();
                let outcome = match result {
                    Ok(Outcome::Superseded) => {
                        tracing::debug!(service = %key, "desired state gone before the write started: not written");
                        Outcome::Superseded
                    }
                    Ok(outcome) => {
                        self.shared.set_held_by_other(&key, None);
                        // An applied write is logged at DEBUG, not INFO: under
                        // churn (hundreds a second) formatting and writing the
                        // line cost ~5 % of the controller's CPU (BENCHMARKS.md,
                        // issue 19, item 3); `kube_discovery_writes_total`
                        // counts them. Deletes (a service gone) stay at INFO.
                        let label = match &outcome {
                            Outcome::Applied { version, shards } => {
                                tracing::debug!(service = %key, %version, shards, "applied");
                                self.record.lock().service_written(&key, version, *shards);
                                "applied"
                            }
                            _ => {
                                tracing::info!(service = %key, "deleted");
                                self.record.lock().service_removed(&key);
                                "deleted"
                            }
                        };
                        self.metrics.write(&cluster, label);
                        self.metrics
                            .event_to_write
                            .get_or_create(&Metrics::cluster(&cluster))
                            .observe(self.now().saturating_sub(since).as_secs_f64());
                        outcome
                    }
                    Err(e) if e.is_throttled() => {
                        self.metrics.write(&cluster, "throttled");
                        tracing::debug!(service = %key, "write throttled (429): again when the limiter allows");
                        Outcome::Throttled
                    }
                    Err(e) if e.is_fenced() => {
                        // Not a failure: this replica lost the lease while the
                        // write was due or running, and it sent nothing after that.
                        self.metrics.write(&cluster, "fenced");
                        tracing::info!(service = %key, error = %e, "write dropped: not the leader");
                        Outcome::Fenced
                    }
                    Err(e) => {
                        let reason = e.metric_label();
                        self.metrics.write(&cluster, &format!("error_{reason}"));
                        // Another instance's object under our name: unready
                        // (readers trust it) until the name is ours or free.
                        let held = match &e {
                            Error::NameTaken {
                                object,
                                owner: Owner::Instance(i),
                            } => Some((object.clone(), i.clone())),
                            _ => None,
                        };
                        self.shared.set_held_by_other(&key, held);
                        // Logged and reported by the planner's answer
                        // (`Retry`, `Failing`), which needs the error.
                        self.failure = Some((key.clone(), e));
                        Outcome::Failed(reason.to_string())
                    }
                };
                self.handle(Input::Finished { key, outcome });
                self.failure = None;
            }
        }
    }

    async fn run(
        mut self,
        mut rx: Inbox,
        shutdown: CancellationToken,
        mut leader: Option<watch::Receiver<Leadership>>,
    ) {
        let first = leader.as_mut().map_or(
            Leadership {
                epoch: 0,
                leading: true,
                until: None,
            },
            |l| *l.borrow_and_update(),
        );
        self.shared.set_standby(!first.leading);
        self.handle(Input::Leadership {
            epoch: first.epoch,
            leading: first.leading,
        });
        let mut open = true;
        loop {
            let wake = self.poll();
            let rate = self.planner.write_rate();
            self.metrics
                .write_rate_limit
                .set(if rate.is_finite() { rate } else { 0.0 });
            if !open && self.tasks.is_empty() && self.planner.idle() {
                break;
            }
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                now = leader_changed(&mut leader) => {
                    self.handle(Input::Leadership { epoch: now.epoch, leading: now.leading });
                }
                Some(done) = self.tasks.join_next(), if !self.tasks.is_empty() => {
                    match done {
                        Ok(done) => self.finish(done),
                        Err(e) => tracing::error!(error = %e, "writer task failed"),
                    }
                }
                msg = rx.recv(), if open => match msg {
                    Some(m) => self.receive(m),
                    None => open = false,
                },
                () = sleep_until_opt(wake) => {}
            }
        }
        // Graceful shutdown: let in-flight writes finish, start no new ones.
        while let Some(done) = self.tasks.join_next().await {
            if let Ok(done @ Done::Write { .. }) = done {
                self.finish(done);
            }
        }
    }

    fn receive(&mut self, msg: WriterMsg) {
        let input = match msg {
            WriterMsg::Changed { keys } => {
                Input::Changed(keys.into_iter().map(|(k, at)| (k, self.at(at))).collect())
            }
            WriterMsg::Drifted { keys } => Input::Drifted(keys),
            WriterMsg::Synced { cluster } => Input::Synced(cluster),
        };
        self.handle(input);
    }
}

/// Resolves with the new leadership state; never when not gated.
async fn leader_changed(leader: &mut Option<watch::Receiver<Leadership>>) -> Leadership {
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
