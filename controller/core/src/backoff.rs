//! The reconnect policy of every watcher kube-discovery runs (source
//! watchers, its own DiscoveredService/ConfigMap watches, the gateways'
//! reflector): `250 ms` doubling to a `1 s` cap, jittered, never giving up.
//!
//! Not kube-runtime's `DefaultBackoff` (800 ms doubling to 30 s): after an
//! outage the first retry once the API server answers again must come within
//! about a second, not tens of seconds. Pure policy (a clock read, no I/O),
//! plugged into kube-runtime with `WatchStreamExt::backoff`, or driven by
//! hand where the caller can tell errors apart ([`WatchBackoff::next_after_gone`]).
//!
//! A watch that ends with `410 Gone` (its resourceVersion was compacted away)
//! is not a failing server: it answered, and the watcher's next request is a
//! fresh list. Waiting 125-250 ms before it only delays reconvergence, so the
//! first such retry after a healthy stretch goes at once; a 410 again within
//! [`RESET_AFTER`] gets the ordinary delays (a server that keeps answering
//! 410 is never hammered).

use std::hash::{BuildHasher, Hasher, RandomState};
use std::time::Duration;

use kube::runtime::utils::Backoff;

/// Reconnect backoff of the watchers: `min`, doubling up to `max`,
/// each delay jittered down to between half and all of it; never gives up.
/// [`Backoff::reset`] (called by kube-runtime on every successful event)
/// starts again from `min`.
#[derive(Debug, Clone)]
pub struct WatchBackoff {
    min: Duration,
    max: Duration,
    next: Duration,
    rng: RandomState,
    draws: u64,
    /// When the last delay was handed out (see [`Backoff::reset`] below).
    last: Option<std::time::Instant>,
}

impl WatchBackoff {
    /// The watchers' policy: 250 ms doubling to 1 s.
    pub fn new() -> Self {
        Self::with_bounds(Duration::from_millis(250), Duration::from_secs(1))
    }

    /// A custom policy (`max` is raised to `min` if smaller).
    pub fn with_bounds(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max: max.max(min),
            next: min,
            rng: RandomState::new(),
            draws: 0,
            last: None,
        }
    }

    /// A uniform-ish fraction in [0.5, 1.0] from a randomly keyed hasher.
    fn jitter(&mut self) -> f64 {
        self.draws = self.draws.wrapping_add(1);
        let mut h = self.rng.build_hasher();
        h.write_u64(self.draws);
        let bits = h.finish() >> 11; // 53 bits
        #[allow(clippy::cast_precision_loss)]
        let unit = bits as f64 / (1u64 << 53) as f64;
        0.5 + 0.5 * unit
    }
}

impl WatchBackoff {
    /// The delay before retrying a watch that ended with `410 Gone`: none
    /// after a healthy stretch (no retry for [`RESET_AFTER`]), else the
    /// ordinary next delay. See the module docs.
    pub fn next_after_gone(&mut self) -> Duration {
        if self.last.is_none_or(|t| t.elapsed() >= RESET_AFTER) {
            self.last = Some(std::time::Instant::now());
            Duration::ZERO
        } else {
            Iterator::next(self).unwrap_or(self.max)
        }
    }
}

impl Default for WatchBackoff {
    fn default() -> Self {
        Self::new()
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        self.last = Some(std::time::Instant::now());
        let base = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        Some(base.mul_f64(self.jitter()))
    }
}

impl Backoff for WatchBackoff {
    /// kube-runtime's `StreamBackoff` calls this on every `Ok` item, and a
    /// failing relist yields `Event::Init` (an `Ok`) before its error: a plain
    /// reset would retry a persistent failure (a rejected token) every
    /// 125-250 ms forever. So a reset only counts once the stream has run
    /// without a retry for [`RESET_AFTER`]; a persistent failure settles at the
    /// 1 s cap, and a watch that ran fine reconnects after 250 ms again.
    fn reset(&mut self) {
        if self.last.is_none_or(|t| t.elapsed() >= RESET_AFTER) {
            self.next = self.min;
        }
    }
}

/// How long a watch must run without a retry before the backoff starts over.
pub const RESET_AFTER: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_backoff_is_capped_jittered_and_resets() {
        let mut b = WatchBackoff::new();
        let first: Vec<Duration> = b.by_ref().take(20).collect();
        for (i, d) in first.iter().enumerate() {
            let base = Duration::from_millis(250)
                .saturating_mul(1 << i.min(2))
                .min(Duration::from_secs(1));
            assert!(
                *d >= base / 2 && *d <= base,
                "delay {i} = {d:?}, base {base:?}"
            );
        }
        assert!(
            first[5..].iter().any(|d| *d < Duration::from_millis(990)),
            "no jitter: {first:?}"
        );
        // A reset right after a retry (a failing relist's `Init`) is ignored ...
        b.reset();
        let d = b.next().unwrap();
        assert!(d >= Duration::from_millis(500), "reset too early: {d:?}");
        // ... one after RESET_AFTER without a retry starts over.
        b.last = std::time::Instant::now().checked_sub(RESET_AFTER + Duration::from_millis(1));
        b.reset();
        let d = b.next().unwrap();
        assert!(d <= Duration::from_millis(250), "not reset: {d:?}");
    }

    #[test]
    fn gone_after_a_healthy_stretch_retries_at_once_but_only_once() {
        let mut b = WatchBackoff::new();
        // Never retried before: the relist goes at once.
        assert_eq!(b.next_after_gone(), Duration::ZERO);
        // 410 again right away (or any error): ordinary, growing delays.
        let d1 = b.next_after_gone();
        assert!(
            d1 >= Duration::from_millis(125) && d1 <= Duration::from_millis(250),
            "{d1:?}"
        );
        let d2 = b.next_after_gone();
        assert!(
            d2 >= Duration::from_millis(250) && d2 <= Duration::from_millis(500),
            "{d2:?}"
        );
        let d3 = b.next().unwrap();
        assert!(d3 >= Duration::from_millis(500), "{d3:?}");
        // A reset within RESET_AFTER of those retries changes nothing ...
        b.reset();
        assert!(b.next_after_gone() >= Duration::from_millis(500));
        // ... after a healthy stretch a 410 goes at once again, and the
        // delays after it start over from the minimum.
        b.last = std::time::Instant::now().checked_sub(RESET_AFTER + Duration::from_millis(1));
        b.reset();
        assert_eq!(b.next_after_gone(), Duration::ZERO);
        let d = b.next().unwrap();
        assert!(d <= Duration::from_millis(250), "not reset: {d:?}");
    }
}
