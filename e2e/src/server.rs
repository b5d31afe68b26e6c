//! Shared server state, the accept loop (plain TCP or TLS) and the `/_sim/` hooks.
//!
//! The accept loop can be taken down for a while (`refuseConnectionsSeconds` fault):
//! the listener is closed, every open connection is cut, and the same address is
//! bound again afterwards; the store is untouched.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::SimConfig;
use crate::machinery::User;
use crate::store::Store;

/// A fault that fails matching requests.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FailRule {
    #[serde(default = "star")]
    pub verb: String,
    #[serde(default = "star")]
    pub resource: String,
    #[serde(default = "one")]
    pub count: u64,
    pub code: u16,
    #[serde(default)]
    pub retry_after_seconds: Option<u64>,
}

/// A fault that delays matching requests.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LatencyRule {
    #[serde(default = "star")]
    pub verb: String,
    #[serde(default = "star")]
    pub resource: String,
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
    #[serde(default)]
    pub clear: bool,
    #[serde(default)]
    pub drop_watches: bool,
    #[serde(default)]
    pub stall_watches_seconds: Option<f64>,
    #[serde(default)]
    pub compact: bool,
    #[serde(default)]
    pub fail: Option<FailRule>,
    #[serde(default)]
    pub latency: Option<LatencyRule>,
    #[serde(default)]
    pub refuse_connections_seconds: Option<f64>,
}

#[derive(Debug, Default)]
pub struct Faults {
    pub fail: Vec<FailRule>,
    pub latency: Vec<LatencyRule>,
    pub stall_until: Option<Instant>,
}

fn rule_matches(rule_verb: &str, rule_res: &str, verb: &str, resource: &str) -> bool {
    (rule_verb == "*" || rule_verb == verb) && (rule_res == "*" || rule_res == resource)
}

impl Faults {
    /// Consume one matching failure, if any: (code, retry-after).
    pub fn take_failure(&mut self, verb: &str, resource: &str) -> Option<(u16, Option<u64>)> {
        let idx = self
            .fail
            .iter()
            .position(|r| r.count > 0 && rule_matches(&r.verb, &r.resource, verb, resource))?;
        let rule = &mut self.fail[idx];
        rule.count -= 1;
        let out = (rule.code, rule.retry_after_seconds);
        if rule.count == 0 {
            self.fail.remove(idx);
        }
        Some(out)
    }

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

#[derive(Debug, Default)]
pub struct Stats {
    /// verb -> resource (`resource/subresource` for subresources) -> count
    pub requests: BTreeMap<String, BTreeMap<String, u64>>,
    /// user -> verb -> resource -> count (resource requests only)
    pub requests_by_user: BTreeMap<String, BTreeMap<String, BTreeMap<String, u64>>>,
    /// resource -> count
    pub writes: BTreeMap<String, u64>,
}

/// State shared by all connections.
pub struct Shared {
    pub cfg: SimConfig,
    pub store: Mutex<Store>,
    /// Current revision, for watch streams to wake up on.
    pub rv_tx: watch::Sender<u64>,
    /// Bumped to end every open watch.
    pub drop_tx: watch::Sender<u64>,
    pub tokens: RwLock<HashMap<String, User>>,
    pub faults: Mutex<Faults>,
    pub stats: Mutex<Stats>,
    pub open_watches: AtomicI64,
    pub shutdown: CancellationToken,
    /// Refuse connections until this instant (fault).
    pub refuse_tx: watch::Sender<Option<Instant>>,
    pub url: String,
}

impl Shared {
    pub fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn faults(&self) -> std::sync::MutexGuard<'_, Faults> {
        self.faults.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn count_request(&self, verb: &str, resource: &str) {
        let mut s = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        *s.requests
            .entry(verb.to_string())
            .or_default()
            .entry(resource.to_string())
            .or_default() += 1;
    }

    /// [`Self::count_request`] that also counts under the user's name.
    pub fn count_user_request(&self, user: &str, verb: &str, resource: &str) {
        self.count_request(verb, resource);
        let mut s = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        *s.requests_by_user
            .entry(user.to_string())
            .or_default()
            .entry(verb.to_string())
            .or_default()
            .entry(resource.to_string())
            .or_default() += 1;
    }

    pub fn count_write(&self, resource: &str) {
        let mut s = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        *s.writes.entry(resource.to_string()).or_default() += 1;
    }

    pub fn user_for_token(&self, token: &str) -> Option<User> {
        if token == self.cfg.admin_token {
            return Some(User {
                name: "kube-sim-admin".into(),
                groups: vec!["system:masters".into(), "system:authenticated".into()],
                admin: true,
            });
        }
        self.tokens
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(token)
            .cloned()
    }

    pub fn stats_json(&self) -> Value {
        let s = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        let rv = self.lock().rv;
        json!({
            "requests": s.requests,
            "requestsByUser": s.requests_by_user,
            "writes": s.writes,
            "resourceVersion": rv.to_string(),
            "openWatches": self.open_watches.load(Ordering::SeqCst),
        })
    }

    pub fn apply_faults(&self, req: FaultRequest) {
        if req.clear {
            let mut f = self.faults();
            *f = Faults::default();
        }
        if req.drop_watches {
            self.drop_tx.send_modify(|v| *v += 1);
        }
        if let Some(s) = req.stall_watches_seconds {
            self.faults().stall_until = Some(Instant::now() + Duration::from_secs_f64(s.max(0.0)));
        }
        if req.compact {
            self.lock().compact();
        }
        if let Some(rule) = req.fail {
            self.faults().fail.push(rule);
        }
        if let Some(rule) = req.latency {
            self.faults().latency.push(rule);
        }
        if let Some(s) = req.refuse_connections_seconds {
            let until = Instant::now() + Duration::from_secs_f64(s.max(0.0));
            self.refuse_tx.send_replace(Some(until));
        }
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
    for s in [req.stall_watches_seconds, req.refuse_connections_seconds]
        .into_iter()
        .flatten()
    {
        if !(0.0..=3600.0).contains(&s) {
            return Err(format!("seconds must be between 0 and 3600, got {s}"));
        }
    }
    Ok(())
}

/// Run the accept loop until shutdown.
pub async fn accept_loop(
    shared: Arc<Shared>,
    mut listener: Option<TcpListener>,
    addr: SocketAddr,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    let mut refuse_rx = shared.refuse_tx.subscribe();
    let mut conn_token = CancellationToken::new();
    loop {
        let Some(l) = listener.as_ref() else {
            // Listener down: wait out the refusal window, then bind again.
            let until = (*refuse_rx.borrow()).unwrap_or_else(Instant::now);
            tokio::select! {
                _ = shared.shutdown.cancelled() => return,
                _ = tokio::time::sleep_until(until.into()) => {}
            }
            shared.refuse_tx.send_replace(None);
            loop {
                match TcpListener::bind(addr).await {
                    Ok(l) => {
                        listener = Some(l);
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(%addr, error = %e, "kube-sim: rebinding listener failed; retrying");
                        tokio::select! {
                            _ = shared.shutdown.cancelled() => return,
                            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                        }
                    }
                }
            }
            continue;
        };
        tokio::select! {
            _ = shared.shutdown.cancelled() => {
                conn_token.cancel();
                return;
            }
            changed = refuse_rx.changed() => {
                if changed.is_err() { return; }
                if refuse_rx.borrow_and_update().is_some() {
                    listener = None;
                    conn_token.cancel();
                    conn_token = CancellationToken::new();
                }
            }
            accepted = l.accept() => {
                let Ok((stream, _peer)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                let shared = shared.clone();
                let token = conn_token.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    match tls {
                        Some(acceptor) => {
                            let Ok(Ok(stream)) = tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream)).await else { return };
                            serve_conn(shared, TokioIo::new(stream), token).await;
                        }
                        None => serve_conn(shared, TokioIo::new(stream), token).await,
                    }
                });
            }
        }
    }
}

async fn serve_conn<I>(shared: Arc<Shared>, io: I, token: CancellationToken)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let shared = shared.clone();
        async move { Ok::<_, Infallible>(crate::handler::handle(shared, req).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .serve_connection(io, svc);
    tokio::select! {
        _ = conn => {}
        _ = token.cancelled() => {}
    }
}

/// A JSON response.
pub fn json_response(code: u16, body: &Value) -> hyper::Response<Body> {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    hyper::Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(bytes))
        .unwrap_or_else(|_| hyper::Response::new(Body::empty()))
}
