//! The adaptive write limiter: how many writes per second the planner
//! starts. Pure: time is an [`At`], the caller reports successes and 429s.
//!
//! ```text
//!            success: +1 w/s each              success: +start/rate w/s each
//!  start ──────────────────────────▶ threshold ─────────────────────────────▶ ceiling
//!  (slow start: doubles per second    (additive: +start w/s per second        (never above)
//!   of writing at the full rate)       of writing at the full rate)
//!
//!  429 (Retry-After r) ─▶ rate = max(rate / 2, MIN_RATE), threshold = rate,
//!                         no write starts for min(r or 1 s, max_pause);
//!                         another 429 before the pause ended + 1 s only extends the pause
//! ```
//!
//! Why this shape (TCP's, per write instead of per packet):
//! * A fixed limit is wrong in both directions: 50 writes/s made a first sync
//!   of 10,000 services take 200 s, and no fixed number is safe for every API
//!   server. The API server says when it has too much: API Priority and
//!   Fairness (and the older max-in-flight filter) answer 429 with a
//!   `Retry-After` (kube-apiserver 1.34: 1 s from max-in-flight, 1..32 s from
//!   APF, growing while it keeps dropping requests of the priority level).
//!   The `X-Kubernetes-PF-FlowSchema-UID` / `-PriorityLevel-UID` headers come
//!   with every classified answer, successes included: they say which flow
//!   schema matched, not how loaded it is, so the 429 is the only signal.
//! * Slow start gets from a safe start to what the server takes in a few
//!   seconds (50 -> 2,000 writes/s in about 3.7 s of successes), which is what
//!   makes a 30 s first sync possible; after a 429 the threshold remembers
//!   where trouble began and growth above it is additive, so the limiter
//!   probes slowly instead of doubling into the next 429.
//! * Halving on a 429 (once per pause: the writes already in flight when the
//!   first 429 came are likely refused too and say nothing new) drains the
//!   server's queues quickly; the pause honours `Retry-After` but at most
//!   `max_pause`, so a server saying 3600 (or a broken proxy) cannot stop
//!   the writer for an hour.
//! * The spacing is strict (at most 20 ms of catch-up after a late wake-up,
//!   no bucket of a second's worth): any 1 s window holds at most
//!   `ceiling * 1.02 + 1` starts, so a throttled server never sees more than
//!   the configured ceiling.
//!
//! Growth counts successes, not time: a writer that is bound by its
//! concurrency (the server is slow, not refusing) still grows up to the
//! ceiling. That is by design: the ceiling is what the operator allows, and
//! the 429 is what stops growth below it.

use std::time::Duration;

use super::At;

/// The lowest rate a 429 can push the limiter to: it never stops for good
/// (the pause is what honours a long `Retry-After`).
pub const MIN_RATE: f64 = 1.0;

/// The pause after a 429 without a `Retry-After` (kube-apiserver's
/// max-in-flight filter sends 1 s).
pub const DEFAULT_PAUSE: Duration = Duration::from_secs(1);

/// After a late wake-up, at most this much of the missed time is caught up
/// (timers fire late by about a millisecond; at 2,000 writes/s that is two
/// writes).
const CATCH_UP: Duration = Duration::from_millis(20);

/// After a decrease, 429s do not decrease again until the pause ended and
/// this much more passed: they answer writes sent before the decrease.
const HOLD: Duration = Duration::from_secs(1);

/// The limiter's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateOptions {
    /// Writes per second at the start (`kube_discovery.write_qps_start`).
    pub start: f64,
    /// Writes per second it never exceeds (`kube_discovery.write_qps`);
    /// `0`: no limit at all (tests; the configuration refuses it).
    pub ceiling: f64,
    /// The longest pause a `Retry-After` causes.
    pub max_pause: Duration,
}

impl Default for RateOptions {
    fn default() -> Self {
        RateOptions {
            start: 50.0,
            ceiling: 2000.0,
            max_pause: Duration::from_secs(10),
        }
    }
}

/// The limiter (see the module docs).
#[derive(Debug, Clone)]
pub struct Limiter {
    opts: RateOptions,
    /// Writes per second now.
    rate: f64,
    /// Above it growth is additive (the ceiling until the first 429).
    threshold: f64,
    /// The earliest start of the next write.
    next: At,
    /// No write starts before it.
    paused_until: At,
    /// 429s before it do not decrease the rate.
    hold_until: At,
    /// 429s seen.
    throttled: u64,
}

impl Limiter {
    /// A limiter at `opts.start` (at most the ceiling, at least
    /// [`MIN_RATE`]).
    pub fn new(opts: RateOptions) -> Self {
        let rate = if opts.ceiling > 0.0 {
            opts.start.clamp(MIN_RATE.min(opts.ceiling), opts.ceiling)
        } else {
            f64::INFINITY
        };
        Limiter {
            opts,
            rate,
            threshold: if opts.ceiling > 0.0 {
                opts.ceiling
            } else {
                f64::INFINITY
            },
            next: At::ZERO,
            paused_until: At::ZERO,
            hold_until: At::ZERO,
            throttled: 0,
        }
    }

    fn unlimited(&self) -> bool {
        self.opts.ceiling <= 0.0
    }

    /// Writes per second now (infinite without a ceiling).
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// 429s reported so far.
    pub fn throttled_count(&self) -> u64 {
        self.throttled
    }

    /// The earliest time a write may start.
    pub fn ready_at(&self) -> At {
        if self.unlimited() {
            At::ZERO
        } else {
            self.next.max(self.paused_until)
        }
    }

    /// Takes the permission to start one write at `now`, if there is one.
    pub fn try_take(&mut self, now: At) -> bool {
        if self.unlimited() {
            return true;
        }
        if now < self.ready_at() {
            return false;
        }
        let step = Duration::from_secs_f64(1.0 / self.rate);
        self.next = self.next.max(now.saturating_sub(CATCH_UP)) + step;
        true
    }

    /// A write succeeded: the server takes what we send, grow.
    pub fn succeeded(&mut self) {
        if self.unlimited() {
            return;
        }
        let gain = if self.rate < self.threshold {
            1.0
        } else {
            self.opts.start / self.rate
        };
        self.rate = (self.rate + gain).min(self.opts.ceiling);
    }

    /// The server answered 429 at `now`, with `retry_after` if it said.
    pub fn throttled(&mut self, now: At, retry_after: Option<Duration>) {
        self.throttled += 1;
        if self.unlimited() {
            return;
        }
        let pause = retry_after
            .unwrap_or(DEFAULT_PAUSE)
            .min(self.opts.max_pause);
        self.paused_until = self.paused_until.max(now + pause);
        if now < self.hold_until {
            return;
        }
        self.rate = (self.rate / 2.0).max(MIN_RATE.min(self.opts.ceiling));
        self.threshold = self.rate;
        self.hold_until = self.paused_until + HOLD;
        // The next write waits for the pause and then a step of the new rate.
        self.next = self.next.max(self.paused_until);
    }
}

/// The most of `times` (sorted) in any window `[t, t + 1 s)`: how a
/// limiter is held to its ceiling (its tests here, and the e2e test that
/// measures the request rate a throttled API server sees).
pub fn busiest_second(times: &[At]) -> usize {
    let mut best = 0;
    let mut lo = 0;
    for hi in 0..times.len() {
        while times[hi] - times[lo] >= Duration::from_secs(1) {
            lo += 1;
        }
        best = best.max(hi - lo + 1);
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> At {
        At::from_millis(n)
    }

    fn opts(start: f64, ceiling: f64) -> RateOptions {
        RateOptions {
            start,
            ceiling,
            max_pause: Duration::from_secs(10),
        }
    }

    /// Drives the limiter as the planner does: every `tick`, start as many
    /// writes as it allows; each succeeds at once. Returns the start times.
    fn run(l: &mut Limiter, from: At, until: At, tick: Duration) -> Vec<At> {
        let mut starts = Vec::new();
        let mut now = from;
        while now < until {
            while l.try_take(now) {
                starts.push(now);
                l.succeeded();
            }
            now += tick;
        }
        starts
    }

    #[test]
    fn slow_start_reaches_the_ceiling_in_seconds_and_never_exceeds_it() {
        let mut l = Limiter::new(opts(50.0, 2000.0));
        assert_eq!(l.rate(), 50.0);
        let starts = run(&mut l, ms(0), ms(10_000), Duration::from_millis(1));
        let first_second = starts.iter().filter(|t| **t < ms(1000)).count();
        assert!(
            (70..=110).contains(&first_second),
            "50 e^t writes/s: 86 in the first second, not 50 and not 100+: {first_second}"
        );
        assert_eq!(l.rate(), 2000.0);
        // From 50 to 2,000 takes ln(40) = 3.7 s of writing at the full rate
        // (1,950 writes), then 2,000/s: about 2,570 by 4 s.
        let by_4s = starts.iter().filter(|t| **t < ms(4000)).count();
        assert!((2300..=2800).contains(&by_4s), "{by_4s}");
        // 1 ms ticks: the ceiling holds in every sliding second (+2 % catch-up, +1).
        let most = busiest_second(&starts);
        assert!(most <= 2041, "{most} starts in one second");
        assert!(most >= 1900, "the ceiling is reached: {most}");
    }

    #[test]
    fn late_wake_ups_catch_up_at_most_20ms() {
        let mut l = Limiter::new(opts(1000.0, 1000.0));
        // Woken every 50 ms: 20 ms of the 50 are caught up (21 starts per
        // wake-up), 30 are lost; never a burst of the whole 50 ms.
        let starts = run(&mut l, ms(0), ms(10_000), Duration::from_millis(50));
        let most = busiest_second(&starts);
        assert!((400..=441).contains(&most), "{most}");
    }

    #[test]
    fn a_429_halves_the_rate_and_pauses_for_the_capped_retry_after() {
        let mut l = Limiter::new(opts(400.0, 400.0));
        assert!(l.try_take(ms(0)));
        l.throttled(ms(5), Some(Duration::from_secs(2)));
        assert_eq!(l.rate(), 200.0);
        assert_eq!(l.ready_at(), ms(2005));
        assert!(!l.try_take(ms(2004)));
        assert!(l.try_take(ms(2005)));
        assert_eq!(l.ready_at(), ms(2010), "a step of 200/s");
        // Retry-After 3600 is capped at max_pause.
        l.throttled(ms(4000), Some(Duration::from_secs(3600)));
        assert_eq!(l.ready_at(), ms(14_000));
        assert_eq!(l.rate(), 100.0);
        // No Retry-After: 1 s.
        l.throttled(ms(20_000), None);
        assert_eq!(l.ready_at(), ms(21_000));
        assert_eq!(l.throttled_count(), 3);
    }

    #[test]
    fn throttles_of_writes_sent_before_the_decrease_decrease_once() {
        let mut l = Limiter::new(opts(400.0, 400.0));
        l.throttled(ms(0), Some(Duration::from_secs(1)));
        for t in [1, 2, 500, 1999] {
            l.throttled(ms(t), Some(Duration::from_secs(1)));
        }
        assert_eq!(l.rate(), 200.0, "one halving for the burst");
        assert_eq!(l.ready_at(), ms(2999), "but the pause follows the latest");
        // After the pause and the hold: a new 429 is news.
        l.throttled(ms(4000), Some(Duration::ZERO));
        assert_eq!(l.rate(), 100.0);
    }

    #[test]
    fn after_a_429_growth_above_the_threshold_is_additive() {
        let mut l = Limiter::new(opts(50.0, 10_000.0));
        run(&mut l, ms(0), ms(3000), Duration::from_millis(1));
        let before = l.rate();
        assert!(before > 800.0, "{before}");
        l.throttled(ms(3000), Some(Duration::ZERO));
        assert_eq!(l.rate(), before / 2.0);
        let threshold = l.rate();
        // 2 s at the full rate: + about 50 writes/s per second, not doubling.
        run(&mut l, ms(3000), ms(5000), Duration::from_millis(1));
        let grown = l.rate() - threshold;
        assert!((60.0..=140.0).contains(&grown), "{grown}");
    }

    #[test]
    fn the_rate_never_drops_below_the_minimum() {
        let mut l = Limiter::new(opts(4.0, 100.0));
        for i in 0..20 {
            l.throttled(ms(i * 10_000), Some(Duration::ZERO));
        }
        assert_eq!(l.rate(), MIN_RATE);
        assert!(l.try_take(ms(300_000)));
        // One step of 1 s after the start (counted from 20 ms of catch-up).
        assert_eq!(l.ready_at(), ms(300_980));
    }

    #[test]
    fn start_is_clamped_to_the_ceiling_and_no_ceiling_is_no_limit() {
        assert_eq!(Limiter::new(opts(500.0, 20.0)).rate(), 20.0);
        let mut l = Limiter::new(opts(50.0, 0.0));
        l.throttled(ms(0), Some(Duration::from_secs(5)));
        assert!((0..10_000).all(|_| l.try_take(ms(1))));
        assert_eq!(l.ready_at(), At::ZERO);
    }
}
