//! The drift checks: what the writer does with `Drifted(keys)` from the
//! drift watch (through the inbox).
//!
//! ```text
//!  Drifted(keys) ─▶ due at now + max(drift_delay, coalesce_window)
//!    due ─▶ write pending / in flight? ─ yes ─▶ parked (a set, no timer);
//!           │                                   rescheduled drift_settle after that write
//!           │ no
//!           ├─ its last write finished < drift_settle ago ─▶ later (the watch event is on its way)
//!           ├─ no desired state and the cluster not listed ─▶ nothing (the barrier decides)
//!           └─ Sink::drift(key, desired)
//!                Ok ─▶ nothing   Stale ─▶ later   Drift(kind) ─▶ forget known[key], queue the key
//! ```
//!
//! Only a real difference causes a write, so late watch events of our own
//! writes never do. Parking instead of re-timing keeps a first start cheap:
//! the drift sweep then reports every key while its first write is pending,
//! and re-timing all of them every `drift_delay` would be O(pending) per tick.
//! Completion times older than `drift_settle` decide nothing and are dropped
//! ([`DriftChecks::prune`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use tokio::time::Instant;

use super::Writer;
use super::compact::{PackedKey, Version, trim_map, trim_set};
use crate::drift::DriftCheck;
use crate::sink::Sink;

/// Drift checks waiting for their time, and when each key's last write finished.
#[derive(Default)]
pub(super) struct DriftChecks {
    pub(super) due: BTreeMap<(Instant, u64), PackedKey>,
    pub(super) keys: HashSet<PackedKey>,
    seq: u64,
    /// When a key's last write finished, for the keys whose write finished
    /// less than `drift_settle` ago (older entries mean nothing to
    /// `check_drift` and are dropped by [`DriftChecks::prune`]).
    pub(super) last_done: HashMap<PackedKey, Instant>,
    /// When [`DriftChecks::prune`] runs next (`None`: `last_done` is empty).
    prune_at: Option<Instant>,
    /// Checks waiting for the key's pending / in-flight write.
    pub(super) parked: HashSet<PackedKey>,
}

impl DriftChecks {
    /// Schedules a check of `key` at `at` unless one is already scheduled.
    pub(super) fn schedule(&mut self, key: PackedKey, at: Instant) {
        if self.keys.insert(key.clone()) {
            self.seq += 1;
            self.due.insert((at, self.seq), key);
        }
    }

    /// The next time the writer must wake for drift: a due check, or the
    /// pruning of `last_done`.
    pub(super) fn first_due(&self) -> Option<Instant> {
        let check = self.due.first_key_value().map(|((t, _), _)| *t);
        match (check, self.prune_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub(super) fn pop_due(&mut self, now: Instant) -> Option<PackedKey> {
        let (&(t, seq), _) = self.due.first_key_value()?;
        if t > now {
            return None;
        }
        let key = self.due.remove(&(t, seq))?;
        self.keys.remove(&key);
        Some(key)
    }

    pub(super) fn done(&mut self, key: &PackedKey, at: Instant, settle: Duration) {
        self.last_done.insert(key.clone(), at);
        if self.prune_at.is_none() {
            self.prune_at = Some(at + settle);
        }
    }

    /// Whether a write of `key` finished less than `settle` before `now`;
    /// if so, when that stops being the case.
    pub(super) fn settling(
        &self,
        key: &PackedKey,
        now: Instant,
        settle: Duration,
    ) -> Option<Instant> {
        self.last_done
            .get(key)
            .map(|t| *t + settle)
            .filter(|until| *until > now)
    }

    /// Drops the completions older than `settle` (at most once per `settle`,
    /// so an entry lives less than twice `settle`) and gives back the
    /// memory of drained tables.
    pub(super) fn prune(&mut self, now: Instant, settle: Duration) {
        if self.prune_at.is_some_and(|t| t <= now) {
            self.last_done.retain(|_, t| *t + settle > now);
            self.prune_at = (!self.last_done.is_empty()).then_some(now + settle);
        }
        trim_map(&mut self.last_done);
        trim_set(&mut self.keys);
        trim_set(&mut self.parked);
    }
}

impl<S: Sink> Writer<S> {
    /// Runs the drift checks that are due (see the module docs).
    pub(super) fn check_drift(&mut self) {
        let now = Instant::now();
        let delay = self.opts.drift_delay.max(self.opts.coalesce_window);
        let mut later = Vec::new();
        while let Some(key) = self.drift_checks.pop_due(now) {
            if self.pending.busy(&key) {
                // Scheduled again when the write is done (`unpark`).
                self.drift_checks.parked.insert(key);
                continue;
            }
            if let Some(until) = self
                .drift_checks
                .settling(&key, now, self.opts.drift_settle)
            {
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
            self.drift_checks.schedule(key, at);
        }
    }

    /// `key`'s write finished or was skipped: a parked drift check of it is
    /// scheduled (unless another write of it is pending or in flight).
    pub(super) fn unpark(&mut self, key: &PackedKey, now: Instant) {
        if self.pending.busy(key) {
            return;
        }
        if self.drift_checks.parked.remove(key) {
            self.drift_checks
                .schedule(key.clone(), now + self.opts.drift_settle);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube_discovery_core::ServiceKey;

    #[test]
    fn completions_are_forgotten_once_older_than_the_settle_time() {
        let settle = Duration::from_millis(750);
        let t0 = Instant::now();
        let k = PackedKey::new(&ServiceKey::new("", "ns", "a"));
        let mut d = DriftChecks::default();
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
        let k2 = PackedKey::new(&ServiceKey::new("", "ns", "b"));
        d.done(&k, t0 + settle * 2, settle);
        d.done(&k2, t0 + settle * 3 - Duration::from_millis(1), settle);
        d.prune(t0 + settle * 3, settle);
        assert_eq!(d.last_done.len(), 1);
        assert!(d.settling(&k2, t0 + settle * 3, settle).is_some());
        assert_eq!(d.prune_at, Some(t0 + settle * 4));
    }
}
