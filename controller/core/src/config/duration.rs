//! Durations in the configuration: `100ms`, `5s`, `1m 30s` in, `5s` or
//! `250ms` out (the effective configuration and error messages).

use std::time::Duration;

/// Parses `100ms`, `5s`, `1m 30s` (jiff's friendly format, non-negative).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d: jiff::SignedDuration = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (examples: 100ms, 5s, 1m 30s)"))?;
    Duration::try_from(d).map_err(|_| format!("{s:?} must not be negative"))
}

/// `5s`, or `250ms` when not a whole number of seconds.
pub(super) fn format_duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}
