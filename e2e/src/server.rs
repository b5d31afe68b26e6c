//! The accept loop: plain TCP or TLS connections, each served by HTTP/1.1
//! with [`crate::handler::handle`] for every request.
//!
//! The accept loop can be taken down for a while (`refuseConnectionsSeconds` fault):
//! the listener is closed, every open connection is cut, and the same address is
//! bound again afterwards; the store is untouched.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::handler;
use crate::state::SimState;

/// Run the accept loop until shutdown.
pub async fn accept_loop(
    shared: Arc<SimState>,
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
                let stream = shared.freezer.wrap(stream);
                let exempt = stream.exempt();
                let shared = shared.clone();
                let token = conn_token.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    match tls {
                        Some(acceptor) => {
                            let Ok(Ok(stream)) = tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream)).await else { return };
                            serve_conn(shared, TokioIo::new(stream), token, exempt).await;
                        }
                        None => serve_conn(shared, TokioIo::new(stream), token, exempt).await,
                    }
                });
            }
        }
    }
}

/// Serves one connection; a request with the admin token sets `exempt`:
/// the test's own client is never frozen (`freezeConnectionsSeconds`).
async fn serve_conn<I>(
    shared: Arc<SimState>,
    io: I,
    token: CancellationToken,
    exempt: Arc<AtomicBool>,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let admin = format!("Bearer {}", shared.cfg.admin_token);
    let svc = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        if req
            .headers()
            .get(http::header::AUTHORIZATION)
            .is_some_and(|v| v.as_bytes() == admin.as_bytes())
        {
            exempt.store(true, Ordering::SeqCst);
        }
        let shared = shared.clone();
        async move { Ok::<_, Infallible>(handler::handle(shared, req).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .serve_connection(io, svc);
    tokio::select! {
        _ = conn => {}
        _ = token.cancelled() => {}
    }
}
