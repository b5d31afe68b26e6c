//! The xDS server (`kube_discovery.xds`): Envoy and proxyless gRPC clients
//! take the discovered endpoints over ADS, state-of-the-world or delta, with
//! no API server access of their own.
//!
//! ```text
//!  ControllerState ──▶ hub (catalog: resources/ + routing) ──▶ server (tonic ADS) ──▶ clients
//!                                         ▲ per stream: the pure core::xds::Stream
//! ```
//!
//! Every replica serves (not only the leader), each from its own watches,
//! and only once every cluster's first list is in. Versions are content
//! hashes, the same on every replica and across restarts, so a client moving
//! between replicas is not sent what it already holds.

pub mod hub;
pub mod resources;
pub mod server;
pub mod wire;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::serve::http::ApiToken;
use crate::serve::metrics::Metrics;
use crate::state::ControllerState;

/// The setting the xDS token errors name.
pub const TOKEN_SETTING: &str = "kube_discovery.xds.auth_token_file";

/// The TLS files of the xDS server (`kube_discovery.xds.cert_file`, ...).
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// PEM certificate chain.
    pub cert_file: PathBuf,
    /// PEM private key.
    pub key_file: PathBuf,
    /// PEM CA bundle client certificates must chain to (mTLS), if any.
    pub client_ca_file: Option<PathBuf>,
}

/// What the xDS server needs to start.
#[derive(Debug, Clone)]
pub struct XdsOptions {
    /// Listen address (port 0: any free port).
    pub addr: SocketAddr,
    /// The bearer token clients must send, if any.
    pub token: Option<Arc<ApiToken>>,
    /// TLS, if any.
    pub tls: Option<TlsFiles>,
}

/// Why the xDS server could not start.
#[derive(Debug, thiserror::Error)]
pub enum XdsError {
    /// The listen address could not be bound.
    #[error("kube_discovery.xds.addr: cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// A TLS file could not be read.
    #[error("{setting}: cannot read {}: {source}", .path.display())]
    TlsFile {
        /// The setting naming the file.
        setting: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The TLS configuration was refused.
    #[error("kube_discovery.xds: TLS: {0}")]
    Tls(String),
}

/// A running xDS server.
#[derive(Debug)]
pub struct Serving {
    /// The bound address.
    pub addr: SocketAddr,
    /// The catalog and the connected streams.
    pub hub: Arc<hub::Hub>,
    /// The catalog follower (ends on `stop`).
    pub follower: tokio::task::JoinHandle<()>,
    /// The gRPC server (ends on `stop`, after its streams ended).
    pub server: tokio::task::JoinHandle<()>,
}

fn read(setting: &'static str, path: &PathBuf) -> Result<Vec<u8>, XdsError> {
    std::fs::read(path).map_err(|source| XdsError::TlsFile {
        setting,
        path: path.clone(),
        source,
    })
}

/// Binds `opts.addr`, starts following `state` and serving ADS until `stop`.
pub async fn serve(
    opts: XdsOptions,
    state: Arc<ControllerState>,
    metrics: Metrics,
    stop: CancellationToken,
) -> Result<Serving, XdsError> {
    use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
    let listener = tokio::net::TcpListener::bind(opts.addr)
        .await
        .map_err(|source| XdsError::Bind {
            addr: opts.addr,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| XdsError::Bind {
        addr: opts.addr,
        source,
    })?;
    let mut builder = Server::builder()
        .http2_keepalive_interval(Some(server::KEEPALIVE.0))
        .http2_keepalive_timeout(Some(server::KEEPALIVE.1))
        .tcp_nodelay(true)
        .max_concurrent_streams(Some(64));
    if let Some(tls) = &opts.tls {
        let identity = Identity::from_pem(
            read("kube_discovery.xds.cert_file", &tls.cert_file)?,
            read("kube_discovery.xds.key_file", &tls.key_file)?,
        );
        let mut cfg = ServerTlsConfig::new().identity(identity);
        if let Some(ca) = &tls.client_ca_file {
            cfg = cfg.client_ca_root(Certificate::from_pem(read(
                "kube_discovery.xds.client_ca_file",
                ca,
            )?));
        }
        builder = builder
            .tls_config(cfg)
            .map_err(|e| XdsError::Tls(e.to_string()))?;
    }
    let hub = Arc::new(hub::Hub::default());
    let follower = tokio::spawn(hub.clone().follow(state, stop.clone()));
    let ads = server::Ads::new(hub.clone(), metrics, stop.clone()).into_service();
    let token = opts.token.clone();
    let svc =
        tonic::service::interceptor::InterceptedService::new(ads, move |req: tonic::Request<()>| {
            if let Some(t) = &token {
                server::check_token(t, &req)?;
            }
            Ok(req)
        });
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let router = builder.add_service(svc);
    let server = tokio::spawn(async move {
        if let Err(e) = router
            .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
            .await
        {
            tracing::error!(error = %e, "xDS server failed");
        }
    });
    tracing::info!(%addr, tls = opts.tls.is_some(), token = opts.token.is_some(), "xDS server listening");
    Ok(Serving {
        addr,
        hub,
        follower,
        server,
    })
}
