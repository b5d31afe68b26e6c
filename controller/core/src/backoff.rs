//! The backoffs of kube-discovery's watchers and planners, built with
//! [`backon`]'s [`ExponentialBuilder`]: the watchers' reconnect delays
//! ([`WatchBackoff`]) and the write and snapshot planners' retry delays
//! ([`RetryDelays`]).
//!
//! The watchers (source watchers, the drift watch of our DiscoveredServices,
//! the gateways' reflector) wait `250 ms` doubling to a `1 s` cap, jittered,
//! never giving up. Not kube-runtime's `DefaultBackoff` (800 ms doubling to
//! 30 s): after an outage the first retry once the API server answers again
//! must come within about a second, not tens of seconds. Plugged into
//! kube-runtime with `WatchStreamExt::backoff`, or driven by hand where the
//! caller can tell errors apart ([`WatchBackoff::next_after_gone`]).
//!
//! A watch that ends with `410 Gone` (its resourceVersion was compacted away)
//! is not a failing server: it answered, and the watcher's next request is a
//! fresh list. Waiting 125-250 ms before it only delays reconvergence, so the
//! first such retry after a healthy stretch goes at once; a 410 again within
//! [`RESET_AFTER`] gets the ordinary delays (a server that keeps answering
//! 410 is never hammered).
//!
//! The planners are pure and scripted by golden files: their delays have no
//! jitter and depend on the attempt number alone.

use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use kube::runtime::utils::Backoff;

/// Reconnect backoff of the watchers: `min`, doubling up to `max`,
/// each delay jittered down to between half and all of it; never gives up.
///
/// A wrapper around backon's backoff because backon cannot express the two
/// rules of the module docs: a reset only after a healthy stretch, and a
/// `410 Gone` retried at once.
#[derive(Debug)]
pub struct WatchBackoff {
    builder: ExponentialBuilder,
    delays: ExponentialBackoff,
    /// The longest delay (what `next` falls back to).
    max: Duration,
    /// When the last delay was handed out (see [`Backoff::reset`] below).
    last: Option<Instant>,
}

impl WatchBackoff {
    /// The watchers' policy: 250 ms doubling to 1 s.
    pub fn new() -> Self {
        Self::with_bounds(Duration::from_millis(250), Duration::from_secs(1))
    }

    /// A custom policy (`max` is raised to `min` if smaller).
    pub fn with_bounds(min: Duration, max: Duration) -> Self {
        // backon's jitter adds up to the delay itself: half the bounds,
        // jittered up, are the bounds jittered down to half.
        let builder = ExponentialBuilder::new()
            .with_min_delay(min / 2)
            .with_max_delay(max.max(min) / 2)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times();
        Self {
            builder,
            delays: builder.build(),
            max: max.max(min),
            last: None,
        }
    }
}

impl WatchBackoff {
    /// The delay before retrying a watch that ended with `410 Gone`: none
    /// after a healthy stretch (no retry for [`RESET_AFTER`]), else the
    /// ordinary next delay. See the module docs.
    pub fn next_after_gone(&mut self) -> Duration {
        if self.last.is_none_or(|t| t.elapsed() >= RESET_AFTER) {
            self.last = Some(Instant::now());
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
        self.last = Some(Instant::now());
        Some(self.delays.next().unwrap_or(self.max))
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
            self.delays = self.builder.build();
        }
    }
}

/// How long a watch must run without a retry before the backoff starts over.
pub const RESET_AFTER: Duration = Duration::from_secs(5);

/// The planners' retry delays: `min` doubling per failed attempt, at most
/// `max`, no jitter. A wrapper because the planners keep an attempt number
/// per key (and report it), not a backoff iterator, and because backon
/// multiplies in `f32` seconds (200 ms doubles to 400.000006 ms): delays of
/// a millisecond or more are rounded to whole milliseconds, so they add up
/// and compare exactly.
#[derive(Debug, Clone, Copy)]
pub struct RetryDelays {
    builder: ExponentialBuilder,
}

impl RetryDelays {
    /// `min` doubling to `max` (`max` is raised to `min` if smaller).
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            builder: ExponentialBuilder::new()
                .with_min_delay(min)
                .with_max_delay(max.max(min))
                .with_factor(2.0)
                .without_max_times(),
        }
    }

    /// The delay after failed attempt `attempt` (1: the first failure).
    pub fn delay(&self, attempt: u32) -> Duration {
        // 63 doublings reach any `max` from any nonzero `min`.
        let step = attempt.saturating_sub(1).min(63) as usize;
        let d = self.builder.build().nth(step).unwrap_or_default();
        if d < Duration::from_millis(1) {
            return d;
        }
        Duration::from_secs_f64((d.as_secs_f64() * 1000.0).round() / 1000.0)
    }
}

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

    #[test]
    fn custom_bounds_are_jittered_down_to_half() {
        let mut b = WatchBackoff::with_bounds(Duration::from_millis(500), Duration::from_secs(10));
        for (i, d) in b.by_ref().take(12).enumerate() {
            let base = Duration::from_millis(500)
                .saturating_mul(1 << i.min(5))
                .min(Duration::from_secs(10));
            assert!(
                d >= base / 2 && d <= base,
                "delay {i} = {d:?}, base {base:?}"
            );
        }
    }

    #[test]
    fn retry_delays_double_to_the_cap_in_whole_milliseconds() {
        let ms = |v: &[u64]| {
            v.iter()
                .map(|m| Duration::from_millis(*m))
                .collect::<Vec<_>>()
        };
        let r = RetryDelays::new(Duration::from_millis(200), Duration::from_millis(800));
        let got: Vec<Duration> = (1..=5).map(|a| r.delay(a)).collect();
        assert_eq!(got, ms(&[200, 400, 800, 800, 800]));
        // 20 ms is not exact in f32 (backon's arithmetic): still whole milliseconds.
        let r = RetryDelays::new(Duration::from_millis(20), Duration::from_millis(200));
        let got: Vec<Duration> = (1..=6).map(|a| r.delay(a)).collect();
        assert_eq!(got, ms(&[20, 40, 80, 160, 200, 200]));
        // Attempt 0 is the first delay; a key failing forever stays at the cap.
        let r = RetryDelays::new(Duration::from_millis(500), Duration::from_secs(30));
        assert_eq!(r.delay(0), Duration::from_millis(500));
        assert_eq!(r.delay(u32::MAX), Duration::from_secs(30));
        // `max` below `min` is raised to it.
        let r = RetryDelays::new(Duration::from_secs(2), Duration::from_secs(1));
        assert_eq!(r.delay(3), Duration::from_secs(2));
    }
}
