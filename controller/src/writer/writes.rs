//! Starting and finishing writes.
//!
//! ```text
//!  dispatch: first due key ─▶ desired == known? ─ yes ─▶ skip (kube_discovery_writes_skipped_total)
//!                              │ no
//!                              ▼ rate token ─▶ spawn Sink::apply(desired) | Sink::delete(key)
//!  finish:   Ok  ─▶ known updated, kube_discovery_writes_total{result=applied|deleted}
//!            Err ─▶ back into the queue with exponential backoff and a new seq (behind the
//!                   readiness barriers: attempted), counted as failing until written
//! ```

use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;

use super::compact::{PackedKey, Version};
use super::queue::Pending;
use super::{Writer, backoff};
use crate::Result;
use crate::metrics::Metrics;
use crate::sink::Sink;

pub(super) enum Outcome {
    Applied(String),
    Deleted,
}

pub(super) struct Done {
    pub(super) key: PackedKey,
    pub(super) first_event: Instant,
    pub(super) attempts: u32,
    pub(super) result: Result<Outcome>,
}

impl<S: Sink> Writer<S> {
    /// `key` is written (or needs no write): no longer failing.
    pub(super) fn clear_failing(&mut self, key: &PackedKey) {
        if let Some(reason) = self.failing.remove(key) {
            self.metrics.failing(key.cluster(), Some(reason), None);
        }
    }

    pub(super) fn take_token(&mut self, now: Instant) -> bool {
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

    pub(super) fn dispatch(&mut self, tasks: &mut JoinSet<Done>) {
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
                    self.clear_failing(&key);
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
                    self.clear_failing(&key);
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
            let (first_event, attempts) = (p.first_event, p.attempts);
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
                    first_event,
                    attempts,
                    result,
                }
            });
        }
    }

    pub(super) fn finish(&mut self, done: Done) {
        let Done {
            key,
            first_event,
            attempts,
            result,
        } = done;
        self.pending.finished(&key);
        self.drift_checks
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
                self.clear_failing(&key);
                self.metrics
                    .event_to_write
                    .get_or_create(&Metrics::cluster(cluster))
                    .observe(first_event.elapsed().as_secs_f64());
                self.unpark(&key, Instant::now());
            }
            // Still pending (retried): a parked check stays parked.
            Err(e) => {
                let reason = e.metric_label();
                self.metrics.write(cluster, &format!("error_{reason}"));
                let previous = self.failing.insert(key.clone(), reason);
                self.metrics.failing(cluster, previous, Some(reason));
                let attempts = attempts + 1;
                let delay = backoff(&self.opts, attempts);
                if let crate::Error::NameTaken { object, owner } = &e {
                    tracing::warn!(service = %key, object = %object, owner = %owner, attempt = attempts, retry_in = ?delay, "name taken: the object of this service belongs to someone else; not written");
                } else {
                    tracing::warn!(service = %key, error = %e, attempt = attempts, retry_in = ?delay, "write failed");
                }
                let due = Instant::now() + delay;
                // Attempted: the retry gets a new sequence number, behind
                // every readiness barrier so far (a failure is reported, not
                // waited for). Keep the earliest event time; a newer change
                // may already be pending.
                let seq = self.seq;
                self.seq += 1;
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
        }
    }
}
