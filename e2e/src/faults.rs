//! Fault injection: the rules `POST /_sim/faults` installs and the answers
//! they produce.
//!
//! A [`FaultRequest`] is validated ([`validate_faults`]) and applied to the
//! server state ([`crate::state::SimState::apply_faults`]); the request
//! handlers then consume matching rules per request ([`Faults::take_failure`],
//! [`Faults::take_latency`]). The fault-injecting proxy in front of a real API
//! server (`kd-testenv`) reuses the same types and [`injected_failure_response`],
//! so both backends fail in the same shape.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use hyper::Response;
use serde::Deserialize;

use crate::response::error_response;
use crate::status::ApiError;

/// A fault that fails matching requests.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FailRule {
    /// Verb the rule matches (`get`, `list`, `watch`, `create`, ...; `*` for all).
    #[serde(default = "star")]
    pub verb: String,
    /// Resource the rule matches (plural, `resource/subresource` for subresources; `*` for all).
    #[serde(default = "star")]
    pub resource: String,
    /// How many matching requests fail (default 1).
    #[serde(default = "one")]
    pub count: u64,
    /// HTTP status of the failure (400-599).
    pub code: u16,
    /// `Retry-After` header (seconds) of the answer, for 429/503.
    #[serde(default)]
    pub retry_after_seconds: Option<u64>,
    /// Fail only this fraction of the matching requests (0 < f <= 1),
    /// spread evenly and deterministically: `0.5` fails every second one,
    /// `0.25` every fourth. `count` still bounds the failures. Default: all.
    #[serde(default)]
    pub fraction: Option<f64>,
    /// Matching requests seen so far (for `fraction`).
    #[serde(skip)]
    pub seen: u64,
}

/// The requests whose arrival times are recorded (`recordArrivals`).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArrivalRule {
    /// Verb (`*` for all).
    #[serde(default = "star")]
    pub verb: String,
    /// Resource (`*` for all).
    #[serde(default = "star")]
    pub resource: String,
}

/// A fault that delays matching requests.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LatencyRule {
    /// Verb the rule matches (`*` for all).
    #[serde(default = "star")]
    pub verb: String,
    /// Resource the rule matches (`*` for all).
    #[serde(default = "star")]
    pub resource: String,
    /// Delay added before each matching request is handled.
    pub millis: u64,
    /// Number of requests to delay; absent = until cleared.
    #[serde(default)]
    pub count: Option<u64>,
}

fn star() -> String {
    "*".into()
}
fn one() -> u64 {
    1
}

/// Body of `POST /_sim/faults`; every present field is applied.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FaultRequest {
    /// Remove every fault rule in force (applied first).
    #[serde(default)]
    pub clear: bool,
    /// End every open watch stream now.
    #[serde(default)]
    pub drop_watches: bool,
    /// Watch streams send nothing for this many seconds.
    #[serde(default)]
    pub stall_watches_seconds: Option<f64>,
    /// Compact the event history: watches from older revisions get 410 Gone.
    #[serde(default)]
    pub compact: bool,
    /// Add a failure rule.
    #[serde(default)]
    pub fail: Option<FailRule>,
    /// Add a latency rule.
    #[serde(default)]
    pub latency: Option<LatencyRule>,
    /// Close new connections at once for this many seconds (state is kept).
    #[serde(default)]
    pub refuse_connections_seconds: Option<f64>,
    /// A network partition whose open connections never recover: every
    /// connection open now stops sending for good (nothing closed: answers
    /// in progress and to come never arrive, watches send nothing more), and
    /// so does every connection accepted during the next this many seconds;
    /// later connections are served. kube-sim exempts connections that
    /// carried a request with its admin token (the test's own client).
    #[serde(default)]
    pub freeze_connections_seconds: Option<f64>,
    /// The next this many lists that carry a `continue` token are answered
    /// `410 Expired`, as when the token's revision was compacted away
    /// between two pages.
    #[serde(default)]
    pub expire_continue_tokens: Option<u64>,
    /// From now on, record when each matching request arrives (after a
    /// `latency` delay, when the `fail` rules are consulted: injected
    /// failures included), replacing an earlier rule and its record. Read
    /// with `Sim::arrivals` / `FaultProxy::arrivals`: a server-side view of
    /// a client's request rate, on both backends.
    #[serde(default)]
    pub record_arrivals: Option<ArrivalRule>,
}

/// The `freezeConnectionsSeconds` fault: wraps each accepted connection
/// ([`Freezer::wrap`]); a freeze stops every connection open at that moment
/// and every one accepted before its window ends, unless exempted. A frozen
/// connection's writes stay pending forever (no waker is kept: nothing wakes
/// them) while it still reads, so the client's requests may reach the
/// server but no answer, not even a TLS handshake, comes back: a peer behind
/// a partition whose connection state is lost.
#[derive(Debug, Default)]
pub struct Freezer {
    /// Bumped by every freeze: a connection from an older generation is frozen.
    generation: AtomicU64,
    /// New connections are frozen at once until this instant.
    until: Mutex<Option<Instant>>,
}

impl Freezer {
    /// Freezes every open connection, and new ones for `secs` seconds.
    pub fn freeze(&self, secs: f64) {
        *self.until.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(Instant::now() + Duration::from_secs_f64(secs.max(0.0)));
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// Ends the window for new connections (frozen ones stay frozen).
    pub fn clear(&self) {
        *self.until.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// `io` of a connection accepted now, frozen by the next freeze (or at
    /// once, inside a freeze's window) unless its [`Freezable::exempt`]
    /// flag is set first.
    pub fn wrap<I>(self: &Arc<Self>, io: I) -> Freezable<I> {
        let in_window = self
            .until
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|t| t > Instant::now());
        Freezable {
            io,
            freezer: self.clone(),
            generation: self.generation.load(Ordering::SeqCst),
            frozen: in_window,
            exempt: Arc::default(),
        }
    }
}

/// A connection's IO under a [`Freezer`].
#[derive(Debug)]
pub struct Freezable<I> {
    io: I,
    freezer: Arc<Freezer>,
    generation: u64,
    frozen: bool,
    exempt: Arc<AtomicBool>,
}

impl<I> Freezable<I> {
    /// Set it and the connection is never frozen.
    pub fn exempt(&self) -> Arc<AtomicBool> {
        self.exempt.clone()
    }

    fn frozen(&mut self) -> bool {
        if self.exempt.load(Ordering::SeqCst) {
            return false;
        }
        if !self.frozen && self.freezer.generation.load(Ordering::SeqCst) != self.generation {
            self.frozen = true;
        }
        self.frozen
    }
}

impl<I: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Freezable<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<I: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Freezable<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.frozen() {
            return Poll::Pending;
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if self.frozen() {
            return Poll::Pending;
        }
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if self.frozen() {
            return Poll::Pending;
        }
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The fault rules in force: what the request handlers and watch streams consult.
#[derive(Debug, Default)]
pub struct Faults {
    /// Failure rules, consumed in order.
    pub fail: Vec<FailRule>,
    /// Latency rules, first match wins.
    pub latency: Vec<LatencyRule>,
    /// Watch streams stay silent until this instant.
    pub stall_until: Option<Instant>,
    /// Continued lists still to answer `410 Expired`.
    pub expire_continue: u64,
    /// Whose arrivals are recorded, and when they arrived.
    pub record: Option<ArrivalRule>,
    /// Arrival times of the requests `record` matches.
    pub arrivals: Vec<Instant>,
}

fn rule_matches(rule_verb: &str, rule_res: &str, verb: &str, resource: &str) -> bool {
    (rule_verb == "*" || rule_verb == verb) && (rule_res == "*" || rule_res == resource)
}

impl Faults {
    /// Consume one matching failure, if any: (code, retry-after). Called
    /// once per request on both backends, so it also records the request's
    /// arrival ([`FaultRequest::record_arrivals`]).
    pub fn take_failure(&mut self, verb: &str, resource: &str) -> Option<(u16, Option<u64>)> {
        if self
            .record
            .as_ref()
            .is_some_and(|r| rule_matches(&r.verb, &r.resource, verb, resource))
        {
            self.arrivals.push(Instant::now());
        }
        let idx = self
            .fail
            .iter()
            .position(|r| r.count > 0 && rule_matches(&r.verb, &r.resource, verb, resource))?;
        let rule = &mut self.fail[idx];
        rule.seen += 1;
        if let Some(f) = rule.fraction {
            // Fails when `seen * f` crosses an integer: evenly spread.
            let crossed = (rule.seen as f64 * f).floor() > ((rule.seen - 1) as f64 * f).floor();
            if !crossed {
                return None;
            }
        }
        rule.count -= 1;
        let out = (rule.code, rule.retry_after_seconds);
        if rule.count == 0 {
            self.fail.remove(idx);
        }
        Some(out)
    }

    /// Whether a list with a `continue` token is to be answered `410
    /// Expired` (consumes one).
    pub fn take_expired_continue(&mut self) -> bool {
        if self.expire_continue == 0 {
            return false;
        }
        self.expire_continue -= 1;
        true
    }

    /// Consume one matching delay, if any.
    pub fn take_latency(&mut self, verb: &str, resource: &str) -> Option<Duration> {
        let idx = self.latency.iter().position(|r| {
            r.count != Some(0) && rule_matches(&r.verb, &r.resource, verb, resource)
        })?;
        let rule = &mut self.latency[idx];
        let d = Duration::from_millis(rule.millis);
        if let Some(c) = rule.count.as_mut() {
            *c -= 1;
            if *c == 0 {
                self.latency.remove(idx);
            }
        }
        Some(d)
    }
}

/// Validate a fault request's codes before applying it.
pub fn validate_faults(req: &FaultRequest) -> Result<(), String> {
    if let Some(f) = &req.fail
        && !(400..=599).contains(&f.code)
    {
        return Err(format!(
            "fail.code: must be an HTTP error code (400-599), got {}",
            f.code
        ));
    }
    if let Some(fr) = req.fail.as_ref().and_then(|f| f.fraction)
        && !(fr > 0.0 && fr <= 1.0)
    {
        return Err(format!(
            "fail.fraction: must be above 0 and at most 1, got {fr}"
        ));
    }
    for s in [
        req.stall_watches_seconds,
        req.refuse_connections_seconds,
        req.freeze_connections_seconds,
    ]
    .into_iter()
    .flatten()
    {
        if !(0.0..=3600.0).contains(&s) {
            return Err(format!("seconds must be between 0 and 3600, got {s}"));
        }
    }
    Ok(())
}

/// The `Status` error a `fail` fault answers with (`Retry-After` 1 s by
/// default for 429).
pub(crate) fn injected_failure(
    code: u16,
    retry_after: Option<u64>,
    verb: &str,
    resource: &str,
) -> ApiError {
    let reason = match code {
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        409 => "Conflict",
        404 => "NotFound",
        403 => "Forbidden",
        _ => "Unknown",
    };
    let mut e = ApiError::new(
        code,
        reason,
        format!("kube-sim injected fault: {code} for {verb} {resource}"),
    );
    e.retry_after = retry_after.or(if code == 429 { Some(1) } else { None });
    e
}

/// The `410 Expired` of a list whose `continue` token's revision was
/// compacted away (the real API server's message).
pub(crate) fn expired_continue() -> ApiError {
    ApiError::new(
        410,
        "Expired",
        "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
    )
}

/// The HTTP answer of [`expired_continue`], for a fault-injecting proxy.
pub fn expired_continue_response() -> Response<Body> {
    error_response(&expired_continue())
}

/// The HTTP answer of a `fail` fault, for a fault-injecting proxy in front of
/// another API server (the same body and headers kube-sim itself sends).
pub fn injected_failure_response(
    code: u16,
    retry_after: Option<u64>,
    verb: &str,
    resource: &str,
) -> Response<Body> {
    error_response(&injected_failure(code, retry_after, verb, resource))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(fraction: Option<f64>, count: u64) -> FailRule {
        FailRule {
            verb: "patch".into(),
            resource: "discoveredservices".into(),
            count,
            code: 429,
            retry_after_seconds: Some(2),
            fraction,
            seen: 0,
        }
    }

    #[test]
    fn a_fraction_fails_evenly_spread_requests_and_count_bounds_them() {
        let mut f = Faults::default();
        f.fail.push(rule(Some(0.5), 3));
        let failed: Vec<bool> = (0..10)
            .map(|_| f.take_failure("patch", "discoveredservices").is_some())
            .collect();
        assert_eq!(
            failed,
            [
                false, true, false, true, false, true, false, false, false, false
            ]
        );
        let mut f = Faults::default();
        f.fail.push(rule(Some(0.25), 100));
        let n = (0..100)
            .filter(|_| f.take_failure("patch", "discoveredservices").is_some())
            .count();
        assert_eq!(n, 25);
        assert_eq!(f.take_failure("get", "discoveredservices"), None);
    }

    #[test]
    fn arrivals_of_matching_requests_are_recorded_failed_or_not() {
        let mut f = Faults {
            record: Some(ArrivalRule {
                verb: "patch".into(),
                resource: "*".into(),
            }),
            ..Faults::default()
        };
        f.fail.push(rule(None, 1));
        assert!(f.take_failure("patch", "discoveredservices").is_some());
        assert!(f.take_failure("patch", "discoveredservices").is_none());
        assert!(f.take_failure("get", "discoveredservices").is_none());
        assert_eq!(f.arrivals.len(), 2);
    }

    #[test]
    fn a_fraction_outside_0_to_1_is_refused_naming_the_field() {
        let req: FaultRequest =
            serde_json::from_str(r#"{"fail": {"code": 429, "fraction": 1.5}}"#).unwrap();
        let e = validate_faults(&req).unwrap_err();
        assert!(e.contains("fail.fraction"), "{e}");
    }
}
