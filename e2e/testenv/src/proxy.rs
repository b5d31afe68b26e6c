//! A fault-injecting TLS proxy in front of a real kube-apiserver.
//!
//! It takes the same fault requests as kube-sim's `POST /_sim/faults`
//! ([`kube_sim::faults::FaultRequest`]) and applies them to the traffic it
//! forwards, so the fault suite runs unchanged on the real server:
//!
//! * `fail` / `latency`: matching resource requests (by verb and plural
//!   resource, kube-sim's own routing) are answered with kube-sim's `Status`
//!   error (and `Retry-After`), or delayed, instead of / before forwarding;
//!   the proxy counts both ([`FaultProxy::failures_served`],
//!   [`FaultProxy::delays_started`]): the API server never sees an injected
//!   failure, and audits a delayed request only once it is answered; a
//!   delayed request is held with its body received, so one whose client
//!   gives up during the delay is dropped, never forwarded (as kube-sim);
//! * `dropWatches`: every watch answer in flight ends now (a clean end, as
//!   kube-sim's; the client connection stays usable);
//! * `stallWatchesSeconds`: watch answers keep their connection but forward
//!   nothing, not even their end, until the stall ends (then what was held
//!   back follows), as kube-sim's stalled watches outlive their timeout;
//! * `refuseConnectionsSeconds`: the listener closes and every connection is
//!   cut; the same port is bound again afterwards;
//! * `hangSeconds` (proxy only): requests accepted in that window are never
//!   answered (nothing is closed either), the network partition of a dead
//!   peer.
//! * `recordArrivals`: the arrival time of every matching request is kept
//!   ([`FaultProxy::arrivals`]), failed ones included;
//! * `expireContinueTokens`: the next lists carrying a `continue` token are
//!   answered kube-sim's `410 Expired` (an etcd compaction between pages,
//!   [`crate::real::ControlPlane::compact`], is the real one);
//! * `freezeConnectionsSeconds`: every client connection open now, and every
//!   one accepted in that window, never sends the client anything again (no
//!   answer, no watch event, not even a TLS handshake), nothing closed
//!   (kube-sim's [`kube_sim::faults::Freezer`]): a partition after which the
//!   open connections never recover. A request on a frozen connection may
//!   still reach the API server.
//!
//! `compact` is not the proxy's: the control plane compacts etcd itself
//! ([`crate::real::ControlPlane::fault`]).
//!
//! Each client connection gets its own upstream TLS connection with the same
//! ALPN protocol (HTTP/2 for Go clients, HTTP/1.1 for kube-rs), so cutting a
//! client connection cuts exactly its upstream one, and an upstream
//! connection the API server closes closes its client connection. The one
//! exception is an HTTP/1.1 watch the proxy ends itself (`dropWatches`): its
//! upstream connection cannot carry another request (the answer was not read
//! to its end), so the next request of that client connection gets a new one.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use kube_sim::faults::{FaultRequest, Faults};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How long an upstream connect may take before the client gets a 502.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

struct ProxyState {
    upstream: SocketAddr,
    server_tls: Arc<rustls::ServerConfig>,
    client_h2: Arc<rustls::ClientConfig>,
    client_h1: Arc<rustls::ClientConfig>,
    faults: Mutex<Faults>,
    /// `(verb, resource, code)` -> injected failures answered.
    failures_served: Mutex<BTreeMap<(String, String, u16), u64>>,
    /// `(verb, resource)` -> injected delays begun.
    delays_started: Mutex<BTreeMap<(String, String), u64>>,
    hang_until: Mutex<Option<Instant>>,
    /// Freezes client connections (`freezeConnectionsSeconds`).
    freezer: Arc<kube_sim::faults::Freezer>,
    /// Bumped to end every watch answer in flight.
    drop_tx: watch::Sender<u64>,
    /// Set while connections are refused.
    refuse_tx: watch::Sender<Option<Instant>>,
    /// Cancelled to cut every open connection (replaced afterwards).
    cut: Mutex<CancellationToken>,
    shutdown: CancellationToken,
}

impl ProxyState {
    fn faults(&self) -> std::sync::MutexGuard<'_, Faults> {
        self.faults.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn cut_token(&self) -> CancellationToken {
        self.cut.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn cut_all(&self) {
        let mut t = self.cut.lock().unwrap_or_else(|p| p.into_inner());
        t.cancel();
        *t = CancellationToken::new();
    }

    fn stalled_until(&self) -> Option<Instant> {
        self.faults().stall_until.filter(|t| *t > Instant::now())
    }
}

/// A running proxy; dropping it stops it.
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<ProxyState>,
}

impl FaultProxy {
    /// Listens on 127.0.0.1 (a free port) and forwards to `upstream`, which must
    /// present a certificate that `client_tls` verifies.
    pub async fn start(
        upstream: SocketAddr,
        server_tls: Arc<rustls::ServerConfig>,
        client_h2: Arc<rustls::ClientConfig>,
        client_h1: Arc<rustls::ClientConfig>,
    ) -> crate::Result<FaultProxy> {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(|e| crate::Error::io("binding the fault proxy", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| crate::Error::io("proxy address", e))?;
        let shared = Arc::new(ProxyState {
            upstream,
            server_tls,
            client_h2,
            client_h1,
            faults: Mutex::new(Faults::default()),
            failures_served: Mutex::new(BTreeMap::new()),
            delays_started: Mutex::new(BTreeMap::new()),
            hang_until: Mutex::new(None),
            freezer: Arc::default(),
            drop_tx: watch::channel(0).0,
            refuse_tx: watch::channel(None).0,
            cut: Mutex::new(CancellationToken::new()),
            shutdown: CancellationToken::new(),
        });
        tokio::spawn(accept_loop(shared.clone(), listener, addr));
        Ok(FaultProxy { addr, shared })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Applies a kube-sim fault request (all but `compact`).
    pub fn apply(&self, req: &FaultRequest) {
        let sh = &self.shared;
        if req.clear {
            let mut f = sh.faults();
            f.fail.clear();
            f.latency.clear();
            f.stall_until = None;
            f.expire_continue = 0;
            f.record = None;
            f.arrivals.clear();
            drop(f);
            *sh.hang_until.lock().unwrap_or_else(|p| p.into_inner()) = None;
            sh.freezer.clear();
        }
        if let Some(s) = req.freeze_connections_seconds {
            sh.freezer.freeze(s);
        }
        if let Some(n) = req.expire_continue_tokens {
            sh.faults().expire_continue = n;
        }
        if let Some(r) = &req.record_arrivals {
            let mut f = sh.faults();
            f.record = Some(r.clone());
            f.arrivals.clear();
        }
        if let Some(r) = &req.fail {
            sh.faults().fail.push(r.clone());
        }
        if let Some(r) = &req.latency {
            sh.faults().latency.push(r.clone());
        }
        if req.drop_watches {
            sh.drop_tx.send_modify(|v| *v += 1);
        }
        if let Some(s) = req.stall_watches_seconds {
            sh.faults().stall_until = Some(Instant::now() + Duration::from_secs_f64(s.max(0.0)));
        }
        if let Some(s) = req.refuse_connections_seconds {
            sh.refuse_tx
                .send_replace(Some(Instant::now() + Duration::from_secs_f64(s.max(0.0))));
            sh.cut_all();
        }
    }

    /// Requests accepted during the next `secs` seconds are never answered.
    pub fn hang(&self, secs: f64) {
        *self
            .shared
            .hang_until
            .lock()
            .unwrap_or_else(|p| p.into_inner()) =
            Some(Instant::now() + Duration::from_secs_f64(secs.max(0.0)));
    }

    /// Cuts every open client connection (and its upstream connection).
    pub fn cut_connections(&self) {
        self.shared.cut_all();
    }

    /// `(verb, resource, code)` -> how many requests a `fail` fault answered
    /// so far (kube-sim counts these as requests; the API server never sees
    /// them).
    pub fn failures_served(&self) -> BTreeMap<(String, String, u16), u64> {
        self.shared
            .failures_served
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// When each request a `recordArrivals` rule matches reached the proxy
    /// (injected failures included: the API server never sees those).
    pub fn arrivals(&self) -> Vec<std::time::Instant> {
        self.shared.faults().arrivals.clone()
    }

    /// `(verb, resource)` -> how many requests a `latency` fault began to
    /// delay so far (a request counted here is in flight until answered).
    pub fn delays_started(&self) -> BTreeMap<(String, String), u64> {
        self.shared
            .delays_started
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.shutdown.cancel();
        self.shared.cut_all();
    }
}

async fn accept_loop(sh: Arc<ProxyState>, listener: TcpListener, addr: SocketAddr) {
    let mut listener = Some(listener);
    let mut refuse = sh.refuse_tx.subscribe();
    loop {
        let until = *refuse.borrow_and_update();
        if let Some(until) = until.filter(|t| *t > Instant::now()) {
            listener = None;
            tokio::select! {
                () = sh.shutdown.cancelled() => return,
                () = tokio::time::sleep_until(until.into()) => {}
                _ = refuse.changed() => continue,
            }
            sh.refuse_tx.send_if_modified(|v| {
                let done = v.is_some_and(|t| t <= Instant::now());
                if done {
                    *v = None;
                }
                done
            });
            continue;
        }
        let l = match listener.take() {
            Some(l) => l,
            None => match bind_again(addr, &sh.shutdown).await {
                Some(l) => l,
                None => return,
            },
        };
        tokio::select! {
            () = sh.shutdown.cancelled() => return,
            _ = refuse.changed() => { drop(l); }
            r = l.accept() => {
                if let Ok((tcp, _)) = r {
                    tokio::spawn(serve_connection(sh.clone(), tcp));
                }
                listener = Some(l);
            }
        }
    }
}

async fn bind_again(addr: SocketAddr, shutdown: &CancellationToken) -> Option<TcpListener> {
    loop {
        if let Ok(l) = TcpListener::bind(addr).await {
            return Some(l);
        }
        tokio::select! {
            () = shutdown.cancelled() => return None,
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
}

/// One client connection and its current upstream connection.
struct ClientConn {
    h2: bool,
    /// Cancelled to close the client connection (a child of the proxy-wide
    /// cut token).
    cut: CancellationToken,
    upstream: tokio::sync::Mutex<Option<Up>>,
}

/// An upstream connection of a [`ClientConn`].
struct Up {
    send: Upstream,
    /// Set when the proxy gave up on an answer of this HTTP/1.1 connection
    /// (a dropped watch): the connection is then replaced, and its end does
    /// not close the client connection.
    abandoned: Arc<AtomicBool>,
}

async fn serve_connection(sh: Arc<ProxyState>, tcp: tokio::net::TcpStream) {
    let cut = sh.cut_token();
    let tcp = sh.freezer.wrap(tcp);
    let acceptor = tokio_rustls::TlsAcceptor::from(sh.server_tls.clone());
    let Ok(Ok(tls)) = tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await
    else {
        return;
    };
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    // This connection ends with its upstream connection, or when all are cut.
    let cut = cut.child_token();
    let upstream = match tokio::time::timeout(
        UPSTREAM_CONNECT_TIMEOUT,
        connect_upstream(&sh, h2, cut.clone()),
    )
    .await
    {
        Ok(Ok(u)) => u,
        // The API server is down (restarting): the client sees its
        // connection closed, as it would without the proxy.
        _ => return,
    };
    let conn = Arc::new(ClientConn {
        h2,
        cut: cut.clone(),
        upstream: tokio::sync::Mutex::new(Some(upstream)),
    });
    let svc_sh = sh.clone();
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let (sh, conn) = (svc_sh.clone(), conn.clone());
        async move { Ok::<_, std::convert::Infallible>(forward(sh, conn, req).await) }
    });
    let io = TokioIo::new(tls);
    if h2 {
        let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .serve_connection(io, svc);
        tokio::select! {
            _ = conn => {}
            () = cut.cancelled() => {}
        }
    } else {
        let conn = hyper::server::conn::http1::Builder::new().serve_connection(io, svc);
        tokio::select! {
            _ = conn => {}
            () = cut.cancelled() => {}
        }
    }
}

enum Upstream {
    H1(hyper::client::conn::http1::SendRequest<Body>),
    H2(hyper::client::conn::http2::SendRequest<Body>),
}

/// A new upstream connection; when it ends (the API server closed it) the
/// client connection `cut` is closed too, unless it was abandoned.
async fn connect_upstream(
    sh: &Arc<ProxyState>,
    h2: bool,
    cut: CancellationToken,
) -> crate::Result<Up> {
    let tcp = tokio::net::TcpStream::connect(sh.upstream)
        .await
        .map_err(|e| crate::Error::io("connecting to the API server", e))?;
    let _ = tcp.set_nodelay(true);
    let cfg = if h2 { &sh.client_h2 } else { &sh.client_h1 };
    let name = rustls::pki_types::ServerName::IpAddress(sh.upstream.ip().into());
    let tls = tokio_rustls::TlsConnector::from(cfg.clone())
        .connect(name, tcp)
        .await
        .map_err(|e| crate::Error::io("TLS to the API server", e))?;
    let io = TokioIo::new(tls);
    let abandoned = Arc::new(AtomicBool::new(false));
    let gone = abandoned.clone();
    if h2 {
        let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .map_err(|source| crate::Error::Http {
                what: "HTTP/2 handshake",
                source,
            })?;
        tokio::spawn(async move {
            tokio::select! { _ = conn => {}, () = cut.cancelled() => {} }
            cut.cancel();
        });
        Ok(Up {
            send: Upstream::H2(send),
            abandoned,
        })
    } else {
        let (send, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|source| crate::Error::Http {
                what: "HTTP/1.1 handshake",
                source,
            })?;
        tokio::spawn(async move {
            tokio::select! { _ = conn.with_upgrades() => {}, () = cut.cancelled() => {} }
            if !gone.load(Ordering::SeqCst) {
                cut.cancel();
            }
        });
        Ok(Up {
            send: Upstream::H1(send),
            abandoned,
        })
    }
}

fn bad_gateway(msg: String) -> Response<Body> {
    let body = serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": msg, "reason": "ServiceUnavailable", "code": 503});
    let mut r = Response::new(Body::from(body.to_string()));
    *r.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

fn bump<K: Ord>(m: &Mutex<BTreeMap<K, u64>>, k: K) {
    *m.lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(k)
        .or_default() += 1;
}

async fn forward(
    sh: Arc<ProxyState>,
    conn: Arc<ClientConn>,
    req: Request<Incoming>,
) -> Response<Body> {
    let hang = *sh.hang_until.lock().unwrap_or_else(|p| p.into_inner());
    if hang.is_some_and(|t| t > Instant::now()) {
        // Accepted, never answered: only the client's own timeout ends this.
        futures::future::pending::<()>().await;
    }
    let target = kube_sim::handler::fault_target(
        req.method(),
        req.uri().path(),
        req.uri().query().unwrap_or(""),
    );
    let is_watch = target.as_ref().is_some_and(|(v, _)| *v == "watch");
    let continued = req
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .any(|kv| kv.strip_prefix("continue=").is_some_and(|v| !v.is_empty()));
    if target.as_ref().is_some_and(|(v, _)| *v == "list")
        && continued
        && sh.faults().take_expired_continue()
    {
        return kube_sim::faults::expired_continue_response();
    }
    let (mut parts, body) = req.into_parts();
    let mut body = Body::new(body);
    if let Some((verb, resource)) = &target {
        let latency = sh.faults().take_latency(verb, resource);
        if let Some(d) = latency {
            bump(&sh.delays_started, ((*verb).to_string(), resource.clone()));
            // Held in transit: the whole request is received first, so a
            // client that gives up during the hold closes its connection
            // and the request is dropped, never forwarded (as kube-sim,
            // which reads the body before a delay).
            let (got, ()) = tokio::join!(body.collect(), tokio::time::sleep(d));
            let Ok(got) = got else {
                return bad_gateway("proxy: reading the request body failed".into());
            };
            body = Body::from(got.to_bytes());
        }
        let failure = sh.faults().take_failure(verb, resource);
        if let Some((code, retry_after)) = failure {
            bump(
                &sh.failures_served,
                ((*verb).to_string(), resource.clone(), code),
            );
            return kube_sim::faults::injected_failure_response(code, retry_after, verb, resource);
        }
    }
    let path_and_query = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let authority = sh.upstream.to_string();
    let mut slot = conn.upstream.lock().await;
    // An HTTP/1.1 connection whose watch answer the proxy ended cannot be
    // used again: the request goes on a new one.
    let replace = match slot.as_ref() {
        None => true,
        Some(up) => up.abandoned.load(Ordering::SeqCst),
    };
    if replace {
        *slot = None;
        match tokio::time::timeout(
            UPSTREAM_CONNECT_TIMEOUT,
            connect_upstream(&sh, conn.h2, conn.cut.clone()),
        )
        .await
        {
            Ok(Ok(u)) => *slot = Some(u),
            _ => {
                // The API server is gone: so is this connection.
                conn.cut.cancel();
                return bad_gateway("proxy: cannot reach the API server".into());
            }
        }
    }
    let Some(up) = slot.as_mut() else {
        return bad_gateway("proxy: no upstream connection".into());
    };
    let abandoned = up.abandoned.clone();
    let fut = match &mut up.send {
        Upstream::H2(send) => {
            parts.uri = match format!("https://{authority}{path_and_query}").parse() {
                Ok(u) => u,
                Err(e) => return bad_gateway(format!("proxy: bad URI: {e}")),
            };
            if send.ready().await.is_err() {
                return bad_gateway("proxy: upstream connection closed".into());
            }
            futures::future::Either::Left(send.send_request(Request::from_parts(parts, body)))
        }
        Upstream::H1(send) => {
            parts.uri = match path_and_query.parse() {
                Ok(u) => u,
                Err(e) => return bad_gateway(format!("proxy: bad URI: {e}")),
            };
            if let Ok(h) = http::HeaderValue::from_str(&authority) {
                parts.headers.insert(http::header::HOST, h);
            }
            if send.ready().await.is_err() {
                return bad_gateway("proxy: upstream connection closed".into());
            }
            futures::future::Either::Right(send.send_request(Request::from_parts(parts, body)))
        }
    };
    // HTTP/1.1 sends one request at a time on a connection (the client's
    // next one waits for this answer); the future is awaited outside the
    // lock, as its answer may stream.
    drop(slot);
    let h1 = !conn.h2;
    let resp = match fut.await {
        Ok(r) => r,
        Err(e) => return bad_gateway(format!("proxy: upstream request failed: {e}")),
    };
    let (parts, body) = resp.into_parts();
    if !is_watch {
        return Response::from_parts(parts, Body::new(body));
    }
    let abandon = h1.then_some(abandoned);
    Response::from_parts(
        parts,
        watch_body(sh.clone(), conn.cut.clone(), abandon, body),
    )
}

/// Waits while a stall is on; `false` when the watch must end meanwhile
/// (dropped, or the connection cut).
async fn wait_out_stall(
    sh: &ProxyState,
    drops: &mut watch::Receiver<u64>,
    cut: &CancellationToken,
) -> bool {
    // A stall can be extended, cleared or followed by a drop meanwhile.
    while let Some(until) = sh.stalled_until() {
        tokio::select! {
            () = tokio::time::sleep_until(until.min(Instant::now() + Duration::from_millis(100)).into()) => {}
            _ = drops.changed() => return false,
            () = cut.cancelled() => return false,
        }
    }
    true
}

/// A watch answer that ends on `dropWatches` (marking an HTTP/1.1 upstream
/// connection `abandon`ed first: it cannot be reused), holds its frames and
/// its end back while a stall is on, and ends when the connection is cut.
fn watch_body(
    sh: Arc<ProxyState>,
    cut: CancellationToken,
    abandon: Option<Arc<AtomicBool>>,
    body: Incoming,
) -> Body {
    let mut drops = sh.drop_tx.subscribe();
    drops.borrow_and_update();
    let frames = body.into_data_stream();
    let give_up = move || {
        if let Some(a) = &abandon {
            a.store(true, Ordering::SeqCst);
        }
    };
    let stream = futures::stream::unfold(
        (frames, drops, cut, sh, give_up),
        |(mut frames, mut drops, cut, sh, give_up)| async move {
            let next = tokio::select! {
                f = frames.next() => Some(f),
                _ = drops.changed() => None,
                () = cut.cancelled() => None,
            };
            let Some(next) = next else {
                give_up();
                return None;
            };
            // Hold the frame, or the end of the answer, while a stall is on.
            if !wait_out_stall(&sh, &mut drops, &cut).await {
                give_up();
                return None;
            }
            match next {
                Some(Ok(d)) => Some((
                    Ok::<_, std::io::Error>(Frame::data(d)),
                    (frames, drops, cut, sh, give_up),
                )),
                Some(Err(e)) => Some((
                    Err(std::io::Error::other(e)),
                    (frames, drops, cut, sh, give_up),
                )),
                None => None,
            }
        },
    );
    Body::new(http_body_util::StreamBody::new(stream).map_frame(|f: Frame<Bytes>| f))
}

#[cfg(test)]
mod tests {
    //! The proxy against a small in-process upstream (TLS, HTTP/1.1, as
    //! kube-rs clients talk): a watch path streams one line and then stays
    //! open (or ends after `end=<ms>`), every other path answers `ok`.

    use std::sync::atomic::AtomicUsize;

    use super::*;
    use crate::pki::Pki;

    type Send1 = hyper::client::conn::http1::SendRequest<http_body_util::Empty<Bytes>>;

    struct Fixture {
        proxy: FaultProxy,
        pki: Pki,
        upstream_conns: Arc<AtomicUsize>,
    }

    async fn upstream(pki: &Pki) -> (SocketAddr, Arc<AtomicUsize>) {
        let l = TcpListener::bind(("127.0.0.1", 0)).await.expect("bind");
        let addr = l.local_addr().expect("addr");
        let conns = Arc::new(AtomicUsize::new(0));
        let acceptor = tokio_rustls::TlsAcceptor::from(pki.server_config().expect("tls"));
        let counted = conns.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = l.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let svc = hyper::service::service_fn(|req: Request<Incoming>| async move {
                        let q = req.uri().query().unwrap_or("").to_string();
                        let body = if q.contains("watch=1") {
                            let end = q
                                .split('&')
                                .find_map(|kv| kv.strip_prefix("end="))
                                .and_then(|v| v.parse::<u64>().ok());
                            let first = futures::stream::once(async {
                                Ok::<_, std::io::Error>(Frame::data(Bytes::from("line\n")))
                            });
                            // Then nothing, until the answer ends (no more frames).
                            let rest = futures::stream::once(async move {
                                match end {
                                    Some(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                                    None => futures::future::pending::<()>().await,
                                }
                            })
                            .filter_map(|()| async { None });
                            Body::new(http_body_util::StreamBody::new(first.chain(rest)))
                        } else {
                            Body::from("ok")
                        };
                        Ok::<_, std::convert::Infallible>(Response::new(body))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                });
            }
        });
        (addr, conns)
    }

    async fn fixture() -> Fixture {
        let pki = Pki::generate().expect("pki");
        let (up, upstream_conns) = upstream(&pki).await;
        let proxy = FaultProxy::start(
            up,
            pki.server_config().expect("tls"),
            pki.client_config(&[b"h2"]).expect("tls"),
            pki.client_config(&[b"http/1.1"]).expect("tls"),
        )
        .await
        .expect("proxy");
        Fixture {
            proxy,
            pki,
            upstream_conns,
        }
    }

    /// One HTTP/1.1 client connection to the proxy.
    async fn client(f: &Fixture) -> Send1 {
        let tcp = tokio::net::TcpStream::connect(f.proxy.addr())
            .await
            .expect("connect");
        let name = rustls::pki_types::ServerName::IpAddress(f.proxy.addr().ip().into());
        let tls =
            tokio_rustls::TlsConnector::from(f.pki.client_config(&[b"http/1.1"]).expect("tls"))
                .connect(name, tcp)
                .await
                .expect("TLS to the proxy");
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .expect("handshake");
        tokio::spawn(conn);
        send
    }

    async fn get(send: &mut Send1, path: &str) -> Response<Incoming> {
        send.ready().await.expect("connection usable");
        let req = Request::get(path)
            .header("host", "kube")
            .body(http_body_util::Empty::new())
            .expect("request");
        send.send_request(req).await.expect("answer")
    }

    fn apply(f: &Fixture, body: serde_json::Value) {
        f.proxy
            .apply(&serde_json::from_value(body).expect("fault request"));
    }

    const WATCH: &str = "/api/v1/namespaces/a/pods?watch=1";

    #[tokio::test]
    async fn a_dropped_watch_ends_cleanly_and_its_connection_stays_usable() {
        let f = fixture().await;
        let mut send = client(&f).await;
        let mut body = get(&mut send, WATCH).await.into_body();
        let first = body.frame().await.expect("a frame").expect("data");
        assert_eq!(first.into_data().expect("data"), Bytes::from("line\n"));
        apply(&f, serde_json::json!({"dropWatches": true}));
        let rest = tokio::time::timeout(Duration::from_secs(5), body.collect())
            .await
            .expect("the watch ended")
            .expect("a clean end, not an error");
        assert!(rest.to_bytes().is_empty());
        // The next request on the same client connection is answered by the
        // API server (over a new upstream connection), not by the proxy.
        let resp = get(&mut send, "/api/v1/namespaces/a/pods").await;
        assert_eq!(resp.status(), 200);
        let text = resp.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(text, Bytes::from("ok"));
        assert_eq!(f.upstream_conns.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_stall_holds_the_frames_and_the_end_of_a_watch() {
        let f = fixture().await;
        let mut send = client(&f).await;
        // A frame: held while the stall is on.
        apply(&f, serde_json::json!({"stallWatchesSeconds": 0.6}));
        let started = Instant::now();
        let mut body = get(&mut send, &format!("{WATCH}&end=900"))
            .await
            .into_body();
        let first = body.frame().await.expect("a frame").expect("data");
        assert_eq!(first.into_data().expect("data"), Bytes::from("line\n"));
        assert!(
            started.elapsed() >= Duration::from_millis(550),
            "a stalled frame came after {:?}",
            started.elapsed()
        );
        // The end (the upstream ends the answer 900 ms after its line, i.e.
        // during this stall): held too, as kube-sim's stalled watches outlive
        // their timeout.
        apply(&f, serde_json::json!({"stallWatchesSeconds": 1.0}));
        let stalled = Instant::now();
        let rest = tokio::time::timeout(Duration::from_secs(5), body.collect())
            .await
            .expect("the watch ended after the stall")
            .expect("a clean end")
            .to_bytes();
        assert!(rest.is_empty());
        assert!(
            stalled.elapsed() >= Duration::from_millis(900),
            "the stalled watch ended after {:?}",
            stalled.elapsed()
        );
    }

    #[tokio::test]
    async fn injected_failures_and_delays_are_counted() {
        let f = fixture().await;
        let mut send = client(&f).await;
        apply(
            &f,
            serde_json::json!({"fail": {"verb": "list", "resource": "pods", "count": 1, "code": 429, "retryAfterSeconds": 2}}),
        );
        apply(
            &f,
            serde_json::json!({"latency": {"verb": "list", "resource": "pods", "count": 1, "millis": 300}}),
        );
        let started = Instant::now();
        let resp = get(&mut send, "/api/v1/namespaces/a/pods").await;
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert_eq!(resp.status(), 429);
        assert_eq!(
            resp.headers().get("retry-after").map(|v| v.as_bytes()),
            Some(&b"2"[..])
        );
        let _ = resp.into_body().collect().await;
        let resp = get(&mut send, "/api/v1/namespaces/a/pods").await;
        assert_eq!(resp.status(), 200);
        let _ = resp.into_body().collect().await;
        assert_eq!(
            f.proxy.failures_served(),
            BTreeMap::from([(("list".to_string(), "pods".to_string(), 429), 1)])
        );
        assert_eq!(
            f.proxy.delays_started(),
            BTreeMap::from([(("list".to_string(), "pods".to_string()), 1)])
        );
    }

    #[tokio::test]
    async fn a_freeze_silences_open_connections_for_good_and_new_ones_in_its_window() {
        let f = fixture().await;
        let mut open = client(&f).await;
        let mut body = get(&mut open, WATCH).await.into_body();
        let first = body.frame().await.expect("a frame").expect("data");
        assert_eq!(first.into_data().expect("data"), Bytes::from("line\n"));
        let mut idle = client(&f).await;
        apply(&f, serde_json::json!({"freezeConnectionsSeconds": 0.5}));
        // A connection accepted in the window: not even its TLS handshake
        // is answered.
        let tcp = tokio::net::TcpStream::connect(f.proxy.addr())
            .await
            .expect("connect");
        let name = rustls::pki_types::ServerName::IpAddress(f.proxy.addr().ip().into());
        let tls =
            tokio_rustls::TlsConnector::from(f.pki.client_config(&[b"http/1.1"]).expect("tls"))
                .connect(name, tcp);
        assert!(
            tokio::time::timeout(Duration::from_secs(1), tls)
                .await
                .is_err(),
            "a connection accepted during the freeze was served"
        );
        // The open ones stay silent after the window too.
        idle.ready().await.expect("connection usable");
        let req = Request::get("/api/v1/namespaces/a/pods")
            .header("host", "kube")
            .body(http_body_util::Empty::new())
            .expect("request");
        assert!(
            tokio::time::timeout(Duration::from_secs(1), idle.send_request(req))
                .await
                .is_err(),
            "a frozen connection answered"
        );
        // A new connection after the window is served.
        let mut send = client(&f).await;
        let resp = get(&mut send, "/api/v1/namespaces/a/pods").await;
        assert_eq!(resp.status(), 200);
    }

    #[tokio::test]
    async fn expired_continue_tokens_answer_410_only_with_a_continue_token() {
        let f = fixture().await;
        let mut send = client(&f).await;
        apply(&f, serde_json::json!({"expireContinueTokens": 1}));
        let resp = get(&mut send, "/api/v1/namespaces/a/pods?limit=1").await;
        assert_eq!(resp.status(), 200, "a first page has no token");
        let _ = resp.into_body().collect().await;
        let resp = get(&mut send, "/api/v1/namespaces/a/pods?limit=1&continue=abc").await;
        assert_eq!(resp.status(), 410);
        let text = resp.into_body().collect().await.expect("body").to_bytes();
        assert!(String::from_utf8_lossy(&text).contains("\"Expired\""));
        let resp = get(&mut send, "/api/v1/namespaces/a/pods?limit=1&continue=abc").await;
        assert_eq!(resp.status(), 200, "one expiry only");
    }

    #[tokio::test]
    async fn a_hang_accepts_requests_and_never_answers_them() {
        let f = fixture().await;
        let mut hung = client(&f).await;
        f.proxy.hang(0.5);
        hung.ready().await.expect("connection usable");
        let req = Request::get("/api/v1/namespaces/a/pods")
            .header("host", "kube")
            .body(http_body_util::Empty::new())
            .expect("request");
        let pending = hung.send_request(req);
        // Accepted (the connection stays open), never answered: not even
        // after the hang window, only the client's own timeout ends it.
        assert!(
            tokio::time::timeout(Duration::from_secs(1), pending)
                .await
                .is_err(),
            "a request accepted during the hang was answered"
        );
        // After the window, new requests are answered again.
        let mut send = client(&f).await;
        let resp = get(&mut send, "/api/v1/namespaces/a/pods").await;
        assert_eq!(resp.status(), 200);
    }
}
