//! The HTTP server's connection handling: hyper's HTTP/1.1 server under a
//! connection cap, with every phase of a connection bounded in time.
//!
//! | phase | bound |
//! |---|---|
//! | a request's header (also: a new or keep-alive connection sending nothing) | [`ServerLimits::header_read_timeout`] (hyper's timer) |
//! | handling it | [`ServerLimits::request_timeout`] (408) |
//! | writing its answer to the client | [`ServerLimits::write_timeout`] ([`ConnIo`]) |
//! | open connections | [`ServerLimits::max_connections`] |
//!
//! Why probes never starve: at the cap, the connection that has waited
//! longest for a request (a half-sent header, an idle keep-alive) is closed
//! to make room, else the one writing an answer longest (a client that does
//! not read); a new connection is refused only when every one is in a
//! handler (in memory, bounded by the request timeout). A prober sends its
//! request at once, so thousands of trickling or idle connections cannot
//! keep it out, while a reserved share of the cap would need to know a
//! connection's path before it has sent one. The dump is built off the
//! async workers and capped (`MAX_CONCURRENT_DUMPS` in the parent module),
//! so `/healthz` answers while dumps are built, and the listen backlog is
//! deep enough that a burst of connections does not drop a prober's SYN.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;
use tower_http::timeout::TimeoutLayer;

/// How the server bounds its clients (the defaults are what `run` uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// The longest a client may take to send a request's header, counted
    /// from when the server waits for one: on a new connection, and on a
    /// keep-alive connection after an answer (so an idle connection is
    /// closed after it too).
    pub header_read_timeout: Duration,
    /// The longest a request may be handled (then `408`).
    pub request_timeout: Duration,
    /// The longest writing one answer may take (a client that does not
    /// read it is disconnected).
    pub write_timeout: Duration,
    /// Open connections at most.
    pub max_connections: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(20),
            max_connections: 1024,
        }
    }
}

/// How long a connection may finish its answer once the server stops.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// [`Conn::phase`] of a connection whose request is being handled (never
/// closed to make room: handlers are in memory and bounded by the request
/// timeout).
const HANDLING: u64 = u64::MAX;
/// [`Conn::phase`] bit of a connection writing an answer (closed to make
/// room only when no connection waits for a request).
const WRITING: u64 = 1 << 62;

/// One open connection, as the accept loop and the handlers see it.
#[derive(Debug)]
pub struct Conn {
    id: u64,
    /// What it does, and since when (milliseconds since the server
    /// started): waiting for a request (the plain time), writing an answer
    /// ([`WRITING`] | the time), or [`HANDLING`] one. The smallest value is
    /// the one closed to make room at the cap.
    phase: AtomicU64,
    /// Cancelled to close it (evicted at the cap).
    close: CancellationToken,
    /// A permit that must live until the answer is written (a dump's: the
    /// answer is memory until then).
    held: Mutex<Option<OwnedSemaphorePermit>>,
}

impl Conn {
    /// Keeps `permit` until the current answer is written to the client.
    pub fn hold_until_written(&self, permit: OwnedSemaphorePermit) {
        *self.held.lock().unwrap_or_else(PoisonError::into_inner) = Some(permit);
    }
}

/// The open connections.
struct Conns {
    start: Instant,
    max: usize,
    next_id: AtomicU64,
    open: Mutex<HashMap<u64, Arc<Conn>>>,
    /// When the cap was last logged (ms since `start`), to log it once a minute.
    warned: AtomicU64,
}

impl Conns {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis())
            .map_or(WRITING - 1, |ms| ms.min(WRITING - 1))
    }

    /// Registers a new connection; at the cap, first closes the one that has
    /// waited longest for a request. `None`: every connection is busy, the
    /// new one is refused.
    fn admit(&self) -> Option<Arc<Conn>> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if open.len() >= self.max {
            if !evict_oldest_idle(&mut open) {
                self.warn_cap("refusing a new connection: every open one is being answered");
                return None;
            }
            self.warn_cap("closing the connections that wait longest for a request");
        }
        let conn = Arc::new(Conn {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            phase: AtomicU64::new(self.now_ms()),
            close: CancellationToken::new(),
            held: Mutex::new(None),
        });
        open.insert(conn.id, conn.clone());
        Some(conn)
    }

    /// Frees a descriptor after a failed accept (EMFILE and the like).
    fn evict_one(&self) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        evict_oldest_idle(&mut open);
    }

    fn remove(&self, id: u64) {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
    }

    fn warn_cap(&self, what: &str) {
        let now = self.now_ms();
        let last = self.warned.load(Ordering::Relaxed);
        if (last == 0 || now.saturating_sub(last) >= 60_000)
            && self
                .warned
                .compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                max_connections = self.max,
                "HTTP server at its connection cap: {what}"
            );
        }
    }
}

/// Closes the open connection that has waited longest for a request, else
/// the one that has been writing an answer longest; `false`: every one is
/// handling a request.
fn evict_oldest_idle(open: &mut HashMap<u64, Arc<Conn>>) -> bool {
    let oldest = open
        .values()
        .map(|c| (c.phase.load(Ordering::Relaxed), c.id))
        .filter(|(phase, _)| *phase != HANDLING)
        .min();
    match oldest.and_then(|(_, id)| open.remove(&id)) {
        Some(c) => {
            c.close.cancel();
            true
        }
        None => false,
    }
}

/// The socket of one connection: fails a write that has not completed
/// within [`ServerLimits::write_timeout`] (hyper itself has no write
/// timeout), and marks the connection idle again once an answer is written
/// (hyper flushes the socket only when its buffer is empty).
struct ConnIo {
    io: TcpStream,
    conn: Arc<Conn>,
    conns: Arc<Conns>,
    write_timeout: Duration,
    /// Armed at the first write of an answer, disarmed when it is flushed.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl ConnIo {
    /// Arms the deadline (and registers the task's waker with it, so that a
    /// write that stays pending is polled again when it passes); `Err` once
    /// it has passed.
    fn check_deadline(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if self.deadline.is_none() {
            self.deadline = Some(Box::pin(tokio::time::sleep(self.write_timeout)));
            self.conn
                .phase
                .store(WRITING | self.conns.now_ms(), Ordering::Relaxed);
        }
        let Some(deadline) = self.deadline.as_mut() else {
            return Ok(());
        };
        if deadline.as_mut().poll(cx).is_ready() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client did not read the answer in time",
            ));
        }
        Ok(())
    }

    fn written(&mut self) {
        if self.deadline.take().is_some() {
            self.conn
                .held
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            self.conn
                .phase
                .store(self.conns.now_ms(), Ordering::Relaxed);
        }
    }
}

impl AsyncRead for ConnIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for ConnIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.check_deadline(cx)?;
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.check_deadline(cx)?;
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(Pin::new(&mut self.io).poll_flush(cx))?;
        self.written();
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Accepts on `listener` and serves `router` under `limits` until
/// `shutdown`; then stops accepting, lets open requests finish (at most
/// [`SHUTDOWN_GRACE`]) and returns.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ServerLimits,
    shutdown: CancellationToken,
) {
    let router = router.layer(TimeoutLayer::with_status_code(
        StatusCode::REQUEST_TIMEOUT,
        limits.request_timeout,
    ));
    let conns = Arc::new(Conns {
        start: Instant::now(),
        max: limits.max_connections.max(1),
        next_id: AtomicU64::new(0),
        open: Mutex::new(HashMap::new()),
        warned: AtomicU64::new(0),
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let tracker = TaskTracker::new();
    loop {
        let (stream, peer) = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors (or a connection reset before it
                    // was accepted): free one, and do not spin.
                    tracing::debug!(error = %e, "HTTP accept failed");
                    conns.evict_one();
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        let Some(conn) = conns.admit() else {
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let io = ConnIo {
            io: stream,
            conn: conn.clone(),
            conns: conns.clone(),
            write_timeout: limits.write_timeout,
            deadline: None,
        };
        let service = {
            let conn = conn.clone();
            let router = router.clone();
            hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
                conn.phase.store(HANDLING, Ordering::Relaxed);
                req.extensions_mut().insert(conn.clone());
                router.clone().oneshot(req)
            })
        };
        let served = http.serve_connection(TokioIo::new(io), service);
        let (conns, shutdown) = (conns.clone(), shutdown.clone());
        tracker.spawn(async move {
            tokio::pin!(served);
            let res = tokio::select! {
                res = served.as_mut() => res,
                () = conn.close.cancelled() => Ok(()),
                () = shutdown.cancelled() => {
                    // Idle connections close at once, an answer in progress
                    // gets a moment (a half-sent header would get its whole
                    // header timeout otherwise).
                    served.as_mut().graceful_shutdown();
                    tokio::time::timeout(SHUTDOWN_GRACE, served)
                        .await
                        .unwrap_or(Ok(()))
                }
            };
            if let Err(e) = res {
                tracing::debug!(error = %e, %peer, "HTTP connection ended");
            }
            conns.remove(conn.id);
        });
    }
    drop(listener);
    tracker.close();
    tracker.wait().await;
}

#[cfg(test)]
mod tests;
