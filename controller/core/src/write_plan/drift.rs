//! Drift checks waiting for their time, parked behind a pending write, or
//! settling after one (see [`super::Planner`]): only a real difference
//! causes a write, so late watch events of our own writes never do. Parking
//! instead of re-timing keeps a first start cheap: the drift sweep then
//! reports every key while its first write is pending. Completion times
//! older than `drift_settle` decide nothing and are dropped
//! ([`DriftChecks::prune`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use super::At;
use super::compact::{PackedKey, trim_map, trim_set};

/// Drift checks waiting for their time, and when each key's last write finished.
#[derive(Default)]
pub(crate) struct DriftChecks {
    pub(crate) due: BTreeMap<(At, u64), PackedKey>,
    pub(crate) keys: HashSet<PackedKey>,
    seq: u64,
    /// When a key's last write finished, for the keys whose write finished
    /// less than `drift_settle` ago (older entries mean nothing to
    /// `check_drift` and are dropped by [`DriftChecks::prune`]).
    pub(crate) last_done: HashMap<PackedKey, At>,
    /// When [`DriftChecks::prune`] runs next (`None`: `last_done` is empty).
    prune_at: Option<At>,
    /// Checks waiting for the key's pending / in-flight write.
    pub(crate) parked: HashSet<PackedKey>,
}

impl DriftChecks {
    /// Schedules a check of `key` at `at` unless one is already scheduled.
    pub(crate) fn schedule(&mut self, key: PackedKey, at: At) {
        if self.keys.insert(key.clone()) {
            self.seq += 1;
            self.due.insert((at, self.seq), key);
        }
    }

    /// The next time the writer must wake for drift: a due check, or the
    /// pruning of `last_done`.
    pub(crate) fn first_due(&self) -> Option<At> {
        let check = self.due.first_key_value().map(|((t, _), _)| *t);
        match (check, self.prune_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub(crate) fn pop_due(&mut self, now: At) -> Option<PackedKey> {
        let (&(t, seq), _) = self.due.first_key_value()?;
        if t > now {
            return None;
        }
        let key = self.due.remove(&(t, seq))?;
        self.keys.remove(&key);
        Some(key)
    }

    pub(crate) fn done(&mut self, key: &PackedKey, at: At, settle: Duration) {
        self.last_done.insert(key.clone(), at);
        if self.prune_at.is_none() {
            self.prune_at = Some(at + settle);
        }
    }

    /// Whether a write of `key` finished less than `settle` before `now`;
    /// if so, when that stops being the case.
    pub(crate) fn settling(&self, key: &PackedKey, now: At, settle: Duration) -> Option<At> {
        self.last_done
            .get(key)
            .map(|t| *t + settle)
            .filter(|until| *until > now)
    }

    /// Drops the completions older than `settle` (at most once per `settle`,
    /// so an entry lives less than twice `settle`) and gives back the
    /// memory of drained tables.
    pub(crate) fn prune(&mut self, now: At, settle: Duration) {
        if self.prune_at.is_some_and(|t| t <= now) {
            self.last_done.retain(|_, t| *t + settle > now);
            self.prune_at = (!self.last_done.is_empty()).then_some(now + settle);
        }
        trim_map(&mut self.last_done);
        trim_set(&mut self.keys);
        trim_set(&mut self.parked);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ServiceKey;

    #[test]
    fn completions_are_forgotten_once_older_than_the_settle_time() {
        let settle = Duration::from_millis(750);
        let t0 = At::from_secs(5);
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
