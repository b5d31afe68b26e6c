//! Building a kube [`Client`] for one cluster from the configuration.
//!
//! Two ways in, as the issue asks:
//! * APISIX style: `service: {schema, host, port, ssl_verify, ca_file}` plus
//!   `client: {token | token_file}`. TLS verification is ON by default
//!   (APISIX defaults it off); `ca_file` adds the API server's CA. A
//!   `token_file` is handed to kube as a token FILE, which kube re-reads
//!   periodically, so rotating bound ServiceAccount tokens keep working.
//! * A kubeconfig (path and optional context; `--kubeconfig`/`KUBECONFIG`),
//!   which brings contexts, client certificates and exec plugins.
//!
//! Every request is bounded ([`client`], [`ClientLimits`]):
//!
//! ```text
//!  in-flight counter ─▶ auth errors ─▶ on_watch_served ─▶ CappedRetry (429/503/504: ≤3 retries,
//!  (whole request)      reduced         (a watch request    each wait ≤ MAX_RETRY_AFTER; the
//!                       (redact)         answered 2xx)      writer's client: no 429 retries)
//!    ─▶ 429 observer (the writer's client: every answer, retries included,
//!       ─▶ ThrottleSignal ─▶ the writer's limiter)
//!    ─▶ buffer ─▶ kube's stack (auth, ...) ─▶ hyper, HTTP/1.1: connect, write
//!                                              and read timeouts = request_timeout
//! ```
//!
//! kube 5 sets no read timeout (an accepted request that is never answered
//! waits forever) and retries with the server's whole `Retry-After`; both are
//! configured here rather than wrapped around each call. kube-rs speaks
//! HTTP/1.1 (one request per connection at a time), so a dead connection is
//! found by the read timeout of the request on it; watches are renewed by the
//! server within the timeout ([`watch_renewal`]), so a silent watch is a dead
//! one.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http::{Request, Response};
use kube::client::retry::RetryPolicy;
use kube::client::{Body, ClientBuilder};
use kube::{Client, Config};
use tower::BoxError;
use tower::buffer::BufferLayer;
use tower::retry::{Policy, RetryLayer};
use tower::util::{MapErrLayer, MapResponseLayer};
use tower_http::metrics::in_flight_requests::{InFlightRequestsCounter, InFlightRequestsLayer};

use crate::{Result, SettingError};

pub use kube_discovery_core::config::{Connection, Credentials};

/// Objects per page of every list the controller makes (sources, its own
/// DiscoveredServices, snapshot ConfigMaps). kube-runtime's default is 500.
/// A page is received and decoded whole, so its size bounds the transient
/// memory of a (re)list: 500 EndpointSlices of 100 endpoints would be
/// 50,000 decoded endpoints at once, and 500 sharded DiscoveredServices up to
/// 500 times [`kube_discovery_core::crd::MAX_OBJECT_PORTS_BYTES`] of JSON.
/// The price is five times the requests per list (BENCHMARKS.md, issue 6,
/// has the measured effect of both).
pub const LIST_PAGE_SIZE: u32 = 100;

/// Formats a host for a URL (IPv6 literals get brackets).
fn url_host(host: &str) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

/// Builds the kube [`Config`] for `conn`.
pub async fn kube_config(conn: &Connection) -> Result<Config> {
    match conn {
        Connection::Service {
            schema,
            host,
            port,
            ssl_verify,
            ca_file,
            credentials,
        } => {
            let url = format!("{}://{}:{port}", schema.as_str(), url_host(host));
            let uri: http::Uri = url
                .parse()
                .map_err(|source| SettingError::ServiceUrl { url, source })?;
            let mut cfg = Config::new(uri);
            cfg.accept_invalid_certs = !ssl_verify;
            if let Some(ca) = ca_file {
                if !ca.exists() {
                    return Err(SettingError::MissingFile {
                        setting: "discovery.kubernetes.service.ca_file",
                        path: ca.clone(),
                    }
                    .into());
                }
                cfg.root_cert_file = Some(ca.clone());
            }
            match credentials {
                Credentials::Token(t) => {
                    cfg.auth_info.token = Some(t.expose().trim().to_string().into());
                }
                Credentials::TokenFile(f) => {
                    if !f.exists() {
                        return Err(SettingError::MissingFile {
                            setting: "discovery.kubernetes.client.token_file",
                            path: f.clone(),
                        }
                        .into());
                    }
                    cfg.auth_info.token_file = Some(f.display().to_string());
                }
            }
            Ok(cfg)
        }
        Connection::Kubeconfig { path, context } => Ok(
            kube_discovery_client::connect::kube_config(path.as_deref(), context.as_deref())
                .await?,
        ),
    }
}

/// The longest the client's retry layer sleeps before retrying a 429, 503
/// or 504, whatever the server's `Retry-After` says. kube 5's own
/// `RetryPolicy::server_retry` (its `Config::default_retry`) sleeps the
/// whole `Retry-After` (a server saying 3600 holds the request, and with it
/// a write slot or a watch, for an hour) and retries 15 times with delays
/// growing to 1000 s.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(5);

/// Retries of a 429, 503 or 504 answer by the client itself (after that the
/// caller sees the error: the writer retries with its own backoff, a watch
/// with the watch backoff).
pub const MAX_RETRIES: u32 = 3;

/// How every API request of a [`client`] is bounded.
#[derive(Clone)]
pub struct ClientLimits {
    /// kube's read timeout: the longest a request (a list page, a watch
    /// start, a write, a lease request, ...) waits for the next byte from
    /// the API server, counted from the last byte sent
    /// (`reset_reader_on_write`) or received; also the connect and write
    /// timeout. A watch is renewed within it ([`watch_renewal`]), so a live
    /// watch never stays silent this long and a silent one is a dead
    /// connection: it is dropped and the watch restarts.
    pub request_timeout: Duration,
    /// Counts the client's requests in flight, each from its start until its
    /// answer's body is consumed (an open watch counts while it streams):
    /// `kube_discovery_api_requests_in_flight`.
    pub in_flight: InFlightRequestsCounter,
    /// Called with the resource (plural, `endpointslices`) of every WATCH
    /// request the API server answered 2xx: that watch is served again (a
    /// renewed watch that sees no change produces no event to tell; see
    /// [`crate::state::ControllerState::watch_ok`]). Other requests of the
    /// client (another resource's watch, a list page) say nothing about it.
    pub on_watch_served: Option<OnWatchServed>,
    /// The writer's client: every 429 answer (each attempt) is reported
    /// here, and the client does not retry 429s itself (a retry would be a
    /// request the writer's limiter did not admit; the writer writes the key
    /// again when its limiter allows).
    pub throttle: Option<ThrottleSignal>,
}

/// The 429s the writer's client saw, for the writer's limiter: the tower
/// layer that sees every answer records them, the writer drains them
/// ([`ThrottleSignal::take`]) and turns them into planner inputs.
#[derive(Clone, Default)]
pub struct ThrottleSignal(Arc<Mutex<Throttles>>);

/// What [`ThrottleSignal::take`] returns: the 429s since the last take.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Throttles {
    /// 429s rejected by API Priority and Fairness (the answer names the
    /// matched priority level: `X-Kubernetes-PF-PriorityLevel-UID`).
    pub apf: u64,
    /// Other 429s (kube-apiserver's max-in-flight filter, a proxy, kube-sim).
    pub other: u64,
    /// The longest `Retry-After` among them (seconds, as the API server sends
    /// it; `None`: none had one).
    pub retry_after: Option<Duration>,
}

impl Throttles {
    /// 429s in all.
    pub fn count(&self) -> u64 {
        self.apf + self.other
    }
}

impl ThrottleSignal {
    /// Records one 429 answer.
    pub fn record<B>(&self, resp: &Response<B>) {
        let retry_after = resp
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let apf = resp
            .headers()
            .contains_key("x-kubernetes-pf-prioritylevel-uid");
        let mut t = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if apf {
            t.apf += 1;
        } else {
            t.other += 1;
        }
        t.retry_after = t.retry_after.max(retry_after);
    }

    /// The 429s since the last call (`None`: none).
    pub fn take(&self) -> Option<Throttles> {
        let mut t = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let taken = std::mem::take(&mut *t);
        (taken.count() > 0).then_some(taken)
    }
}

/// The `map_response` function of [`ClientLimits::throttle`].
fn observe_throttles<B>(signal: ThrottleSignal) -> impl Fn(Response<B>) -> Response<B> + Clone {
    move |resp| {
        if resp.status() == http::StatusCode::TOO_MANY_REQUESTS {
            signal.record(&resp);
        }
        resp
    }
}

/// A callback of [`ClientLimits::on_watch_served`]: the watched resource.
pub type OnWatchServed = Arc<dyn Fn(&str) + Send + Sync>;

/// The resource (plural) of a watch request (`?watch=true`) to `uri`.
fn watched_resource(uri: &http::Uri) -> Option<&str> {
    let watch = uri
        .query()?
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    if !watch {
        return None;
    }
    uri.path().rsplit('/').find(|s| !s.is_empty())
}

/// The layer of [`ClientLimits::on_watch_served`].
#[derive(Clone)]
struct WatchServedLayer(OnWatchServed);

impl<S> tower::Layer<S> for WatchServedLayer {
    type Service = WatchServed<S>;

    fn layer(&self, inner: S) -> Self::Service {
        WatchServed {
            inner,
            on_served: self.0.clone(),
        }
    }
}

/// See [`WatchServedLayer`].
#[derive(Clone)]
struct WatchServed<S> {
    inner: S,
    on_served: OnWatchServed,
}

/// What [`WatchServed`] runs on a watch request's answer.
type OnAnswer<B> = Box<dyn FnOnce(&Response<B>) + Send>;

impl<S, B> tower::Service<Request<Body>> for WatchServed<S>
where
    S: tower::Service<Request<Body>, Response = Response<B>>,
{
    type Response = Response<B>;
    type Error = S::Error;
    type Future = futures::future::InspectOk<S::Future, OnAnswer<B>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::result::Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        use futures::TryFutureExt as _;
        let resource = watched_resource(req.uri()).map(str::to_string);
        let on_served = self.on_served.clone();
        let on_answer: OnAnswer<B> = Box::new(move |resp: &Response<B>| {
            if let Some(r) = resource
                && resp.status().is_success()
            {
                on_served(&r);
            }
        });
        self.inner.call(req).inspect_ok(on_answer)
    }
}

impl std::fmt::Debug for ClientLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientLimits")
            .field("request_timeout", &self.request_timeout)
            .field("in_flight", &self.in_flight.get())
            .finish_non_exhaustive()
    }
}

impl Default for ClientLimits {
    /// The default `kube_discovery.request_timeout` (for the CLI's one-off
    /// commands).
    fn default() -> Self {
        Self::new(kube_discovery_core::config::Settings::default().request_timeout)
    }
}

impl ClientLimits {
    /// `request_timeout` with a fresh counter.
    pub fn new(request_timeout: Duration) -> Self {
        Self {
            request_timeout,
            in_flight: InFlightRequestsCounter::new(),
            on_watch_served: None,
            throttle: None,
        }
    }
}

/// Time between the server-side end of a watch and the client's read
/// timeout: the end must arrive before the client gives up.
const WATCH_RENEWAL_MARGIN: Duration = Duration::from_secs(2);

/// The server-side watch timeout for a `request_timeout` and the configured
/// `watch_timeout`: every watch ends (and is renewed from its
/// resourceVersion, without a relist) before the client's read timeout could
/// take a quiet but live watch for a dead one. The real API server sends a
/// bookmark only about once a minute, so a quiet watch may otherwise stay
/// silent much longer than `request_timeout`.
pub fn watch_renewal(watch_timeout: Duration, request_timeout: Duration) -> Duration {
    watch_timeout
        .min(request_timeout.saturating_sub(WATCH_RENEWAL_MARGIN))
        .max(Duration::from_secs(1))
}

/// kube's [`RetryPolicy`] with every sleep capped at `cap`. A wrapper
/// because kube 5's policy has no bound for `Retry-After` (it takes the
/// server's value whenever it exceeds its own backoff).
#[derive(Clone)]
pub struct CappedRetry {
    inner: RetryPolicy,
    cap: Duration,
    /// Whether 429s are retried (not on the writer's client).
    retry_throttled: bool,
}

impl CappedRetry {
    /// Server-aware retries ([`MAX_RETRIES`], backoff from 100 ms), each
    /// sleep at most `cap`.
    pub fn new(cap: Duration) -> Self {
        let inner = RetryPolicy::new(Duration::from_millis(100), cap, MAX_RETRIES, true)
            .unwrap_or_else(|_| RetryPolicy::server_retry());
        Self {
            inner,
            cap,
            retry_throttled: true,
        }
    }

    /// The same, but a 429 goes back to the caller at once.
    pub fn without_throttled(mut self) -> Self {
        self.retry_throttled = false;
        self
    }
}

impl<Res> Policy<Request<Body>, Response<Res>, BoxError> for CappedRetry {
    type Future = tokio::time::Sleep;

    fn retry(
        &mut self,
        req: &mut Request<Body>,
        result: &mut std::result::Result<Response<Res>, BoxError>,
    ) -> Option<Self::Future> {
        if !self.retry_throttled
            && matches!(result, Ok(r) if r.status() == http::StatusCode::TOO_MANY_REQUESTS)
        {
            return None;
        }
        let sleep = self.inner.retry(req, result)?;
        let latest = tokio::time::Instant::now() + self.cap;
        Some(tokio::time::sleep_until(sleep.deadline().min(latest)))
    }

    fn clone_request(&mut self, req: &Request<Body>) -> Option<Request<Body>> {
        Policy::<Request<Body>, Response<Res>, BoxError>::clone_request(&mut self.inner, req)
    }
}

/// Applies `limits` to a kube [`Config`]: the timeouts, and kube's own retry
/// layer off (the client gets [`CappedRetry`] instead).
pub fn bounded_config(mut cfg: Config, limits: &ClientLimits) -> Config {
    cfg.connect_timeout = Some(limits.request_timeout);
    cfg.read_timeout = Some(limits.request_timeout);
    cfg.write_timeout = Some(limits.request_timeout);
    // The read timeout counts from the request, not from when its pooled
    // connection went idle.
    cfg.reset_reader_on_write = true;
    cfg.default_retry = false;
    cfg
}

/// Builds a [`Client`] for `conn` whose requests are bounded by `limits`.
pub async fn client(conn: &Connection, limits: &ClientLimits) -> Result<Client> {
    let cfg = bounded_config(kube_config(conn).await?, limits);
    let retry = match &limits.throttle {
        Some(_) => CappedRetry::new(MAX_RETRY_AFTER).without_throttled(),
        None => CappedRetry::new(MAX_RETRY_AFTER),
    };
    let throttle = limits.throttle.clone().unwrap_or_default();
    // Building the client runs an exec credential plugin once: its error
    // (the plugin's output) is reduced like every later one.
    let builder = ClientBuilder::try_from(cfg)
        .map_err(crate::k8s::redact::kube_credentials)?
        // A retry needs a clonable service, kube's stack is a `BoxService`:
        // a buffer in front of it (as `Client` itself puts one in front of
        // the whole stack, with the same capacity).
        .with_layer(&BufferLayer::new(1024))
        // Inside the retry layer: it sees every attempt's answer.
        .with_layer(&MapResponseLayer::new(observe_throttles(throttle)))
        .with_layer(&RetryLayer::new(retry))
        .with_layer(&WatchServedLayer(
            limits
                .on_watch_served
                .clone()
                .unwrap_or_else(|| Arc::new(|_: &str| {})),
        ))
        // An authentication error (an exec plugin's output) never reaches
        // a caller: it could end in a log line, `/readyz` or an Event.
        .with_layer(&MapErrLayer::new(crate::k8s::redact::credentials))
        // Outermost: a request counts once, retries included.
        .with_layer(&InFlightRequestsLayer::new(limits.in_flight.clone()));
    Ok(builder.build())
}

#[cfg(test)]
mod tests;
