//! The pending keys with the indexes that keep scheduling O(log n) per key.
//!
//! ```text
//!  entries: key -> Pending{due, first_event, seq, attempts}
//!  due:     (due, seq) -> key        only keys NOT in flight: the first entry is the next wake-up
//!  seqs:    cluster -> {seq}         a barrier (cluster, bseq) waits while a seq <= bseq is pending
//!  inflight, inflight_per_cluster    ... or while a write of the cluster is in flight
//! ```
//!
//! A key changed while its write is in flight is "parked": in `entries`, not
//! in `due`, until that write finishes.
//!
//! `recent` remembers when each key's last write started, for the keys
//! whose write started less than a coalescing window ago (while in flight,
//! the in-flight entry's `due` is its start): a change of such a key waits
//! for the window's end, any other change is due at once (leading and
//! trailing edge, see [`super::Planner`]). Older entries decide nothing and
//! are dropped ([`Queue::prune_recent`]); the key is the one the in-flight
//! table held, moved, not copied.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use super::At as Instant;

use super::compact::{PackedKey, trim_map};

#[derive(Debug, Clone)]
pub(crate) struct Pending {
    pub(crate) due: Instant,
    pub(crate) first_event: Instant,
    pub(crate) seq: u64,
    pub(crate) attempts: u32,
}

/// The pending keys with the indexes that keep scheduling O(log n).
///
/// Invariants: every entry's `seq` is in `seqs[cluster]`; an entry is in
/// `due` (under `(due, seq)`) exactly when its key is not in `inflight`.
/// Sequence numbers are unique among pending entries (one per enqueue, and a
/// failed write merges back with the minimum of two distinct ones).
#[derive(Default)]
pub(crate) struct Queue {
    pub(crate) entries: HashMap<PackedKey, Pending>,
    pub(crate) due: BTreeMap<(Instant, u64), PackedKey>,
    seqs: HashMap<String, BTreeSet<u64>>,
    /// Keys in flight, with the entry they were started from (its `due`:
    /// when the write started).
    pub(crate) inflight: HashMap<PackedKey, Pending>,
    inflight_per_cluster: HashMap<String, usize>,
    /// When the last write of a key started, for the keys whose write
    /// finished and started less than a window ago (older ones until the
    /// next prune).
    pub(crate) recent: HashMap<PackedKey, Instant>,
    /// When [`Queue::prune_recent`] runs next (`None`: `recent` is empty).
    recent_prune_at: Option<Instant>,
    /// The coalescing window.
    window: Duration,
}

impl Queue {
    /// An empty queue coalescing over `window`.
    pub(crate) fn new(window: Duration) -> Self {
        Queue {
            window,
            ..Queue::default()
        }
    }

    /// When a change of `key` at `now` is due: at once, unless a write of
    /// it started less than a window ago (then when that window ends).
    pub(crate) fn due_of_change(&self, key: &PackedKey, now: Instant) -> Instant {
        let started = match self.inflight.get(key) {
            Some(p) => Some(p.due),
            None => self.recent.get(key).copied(),
        };
        started.map_or(now, |t| now.max(t + self.window))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether `key` has a write pending or in flight.
    pub(crate) fn busy(&self, key: &PackedKey) -> bool {
        self.entries.contains_key(key) || self.inflight.contains_key(key)
    }

    fn index(&mut self, key: &PackedKey, p: &Pending) {
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
        if !self.inflight.contains_key(key) {
            self.due.insert((p.due, p.seq), key.clone());
        }
    }

    fn unindex(&mut self, key: &PackedKey, p: &Pending) {
        if let Some(set) = self.seqs.get_mut(key.cluster()) {
            set.remove(&p.seq);
        }
        self.due.remove(&(p.due, p.seq));
    }

    /// Adds a key that is not pending yet.
    pub(crate) fn insert(&mut self, key: PackedKey, p: Pending) {
        // Callers check first; replacing keeps the indexes consistent anyway.
        self.remove(&key);
        self.index(&key, &p);
        self.entries.insert(key, p);
    }

    /// Changes a pending key in place; `false` if it is not pending.
    pub(crate) fn modify(&mut self, key: &PackedKey, f: impl FnOnce(&mut Pending)) -> bool {
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
    pub(crate) fn remove(&mut self, key: &PackedKey) -> Option<Pending> {
        let p = self.entries.remove(key)?;
        self.unindex(key, &p);
        Some(p)
    }

    /// Earliest due time of a key that is not in flight.
    pub(crate) fn first_due(&self) -> Option<Instant> {
        self.due.first_key_value().map(|((due, _), _)| *due)
    }

    /// The earliest key due at `now` that is not in flight.
    pub(crate) fn first_due_key(&self, now: Instant) -> Option<PackedKey> {
        self.due
            .first_key_value()
            .filter(|((due, _), _)| *due <= now)
            .map(|(_, k)| k.clone())
    }

    /// Takes `key` out of the queue and marks it in flight at `now` (its
    /// entry kept for [`Queue::finished_started`], with `due` = `now`).
    pub(crate) fn start(&mut self, key: &PackedKey, now: Instant) -> Option<&Pending> {
        let mut p = self.remove(key)?;
        p.due = now;
        self.recent.remove(key);
        self.inflight.insert(key.clone(), p);
        let cluster = key.cluster();
        match self.inflight_per_cluster.get_mut(cluster) {
            Some(n) => *n += 1,
            None => {
                self.inflight_per_cluster.insert(cluster.to_string(), 1);
            }
        }
        self.inflight.get(key)
    }

    /// The write of `key` finished: a change that arrived meanwhile becomes
    /// schedulable. The entry the write was started from (`None`: `key`
    /// was not in flight).
    pub(crate) fn finished_started(&mut self, key: &PackedKey) -> Option<Pending> {
        let (key, started) = self.inflight.remove_entry(key)?;
        if let Some(n) = self.inflight_per_cluster.get_mut(key.cluster()) {
            *n = n.saturating_sub(1);
        }
        if let Some(p) = self.entries.get(&key) {
            self.due.insert((p.due, p.seq), key.clone());
        }
        if self.recent_prune_at.is_none() {
            self.recent_prune_at = Some(started.due + self.window);
        }
        self.recent.insert(key, started.due);
        Some(started)
    }

    /// Drops the write starts a window old or older (they delay nothing);
    /// at most once per window, so an entry lives less than two windows.
    pub(crate) fn prune_recent(&mut self, now: Instant) {
        if self.recent_prune_at.is_some_and(|t| t <= now) {
            let window = self.window;
            self.recent.retain(|_, t| *t + window > now);
            self.recent_prune_at = (!self.recent.is_empty()).then_some(now + window);
        }
    }

    /// Whether a barrier `(cluster, bseq)` still waits: a key of `cluster`
    /// queued at or before it is pending, or any write of `cluster` is in flight.
    pub(crate) fn waiting(&self, cluster: &str, bseq: u64) -> bool {
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
    pub(crate) fn trim(&mut self) {
        trim_map(&mut self.entries);
        trim_map(&mut self.inflight);
        trim_map(&mut self.recent);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ServiceKey;
    use std::time::Duration;

    fn pending(due: Instant, seq: u64) -> Pending {
        Pending {
            due,
            first_event: due,
            seq,
            attempts: 0,
        }
    }

    #[test]
    fn queue_orders_by_due_parks_in_flight_keys_and_tracks_barriers() {
        let now = Instant::ZERO;
        let ms = Duration::from_millis;
        let a = PackedKey::new(&ServiceKey::new("", "ns", "a"));
        let b = PackedKey::new(&ServiceKey::new("", "ns", "b"));
        let c = PackedKey::new(&ServiceKey::new("c2", "ns", "c"));
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
        assert_eq!(q.start(&b, now + ms(100)).map(|p| p.seq), Some(1));
        assert_eq!(q.first_due_key(now + ms(100)), Some(c.clone()));
        assert!(q.waiting("", 0), "a write of the cluster is in flight");
        // A change of b while in flight is parked, not schedulable.
        q.insert(b.clone(), pending(now + ms(5), 4));
        assert_eq!(q.first_due(), Some(now + ms(30)));
        assert_eq!(q.finished_started(&b).map(|p| p.seq), Some(1));
        assert_eq!(q.first_due_key(now + ms(100)), Some(b.clone()));
        assert!(!q.waiting("", 1), "b now carries seq 4, a seq 2");
        assert!(q.waiting("", 2), "a (seq 2) is pending");
        assert!(q.remove(&a).is_some() && q.remove(&b).is_some());
        assert!(!q.waiting("", 10));
        assert!(q.waiting("c2", 3) && !q.waiting("c2", 2));
        assert!(q.remove(&c).is_some());
        assert!(q.is_empty() && q.first_due().is_none() && q.due.is_empty());
    }

    #[test]
    fn a_write_start_delays_changes_for_one_window_and_is_then_forgotten() {
        let ms = Duration::from_millis;
        let a = PackedKey::new(&ServiceKey::new("", "ns", "a"));
        let mut q = Queue::new(ms(100));
        let t0 = Instant::from_secs(5);
        assert_eq!(q.due_of_change(&a, t0), t0, "never written: at once");
        q.insert(a.clone(), pending(t0, 1));
        q.start(&a, t0 + ms(10));
        // In flight, and after the answer: the window of the start.
        assert_eq!(q.due_of_change(&a, t0 + ms(20)), t0 + ms(110));
        q.finished_started(&a);
        assert_eq!(q.due_of_change(&a, t0 + ms(50)), t0 + ms(110));
        assert_eq!(q.due_of_change(&a, t0 + ms(110)), t0 + ms(110));
        q.prune_recent(t0 + ms(109));
        assert_eq!(q.recent.len(), 1, "not a window old yet");
        q.prune_recent(t0 + ms(110));
        assert!(q.recent.is_empty() && q.recent_prune_at.is_none());
        assert_eq!(q.due_of_change(&a, t0 + ms(120)), t0 + ms(120));
    }
}
