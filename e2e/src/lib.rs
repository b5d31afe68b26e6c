//! kube-sim: a small, honest Kubernetes API server for tests and demos.
//!
//! It serves a fixed set of built-in resources plus any custom resources defined by
//! stored CRDs, from memory, over HTTP or HTTPS (self-signed CA), with the real API
//! server's semantics where it claims them: one global resourceVersion, watches
//! backed by a bounded event history (410 when too old), label/field selectors,
//! pagination, JSON/merge/strategic/server-side-apply patches, status subresources,
//! generation, finalizers, ownerReference garbage collection, RBAC, `dryRun=All`,
//! Tables for kubectl, and `Status` errors for everything it does not do.
//!
//! ```text
//!            ┌─ server.rs: accept loop (TCP/TLS, refused connections)
//!  request ─►│  handler/: auth → route → RBAC → faults → verb ─► types.rs (defaults, validation)
//!            │     │  read, watch, create/update, patch, delete, /_sim hooks      machinery.rs
//!            │     └─► store.rs (objects, revisions, history) ─► handler/watch.rs streams
//!            └─ discovery.rs / table.rs (what kubectl and helm read)
//! ```
//!
//! Modules depend on each other in one direction only:
//!
//! ```text
//!  lib.rs (Sim) ─► server ─► handler ─► state ─► store, faults, machinery
//!       │                       └────► types, discovery, table, convert, registry, status
//!       └─► bootstrap ─► state        faults ─► response ─► status
//! ```
//!
//! In-process use:
//! ```no_run
//! # async fn demo() -> kube_sim::Result<()> {
//! let sim = kube_sim::Sim::start(kube_sim::SimConfig::default()).await?;
//! let kubeconfig = sim.kubeconfig_yaml(&sim.admin_token());
//! # drop(kubeconfig); sim.shutdown().await; Ok(()) }
//! ```

#![warn(missing_docs)]

mod bootstrap;
pub mod convert;
pub mod discovery;
mod error;
pub mod events;
pub mod faults;
pub mod handler;
pub mod machinery;
#[cfg(test)]
mod module_graph;
pub mod protobuf;
pub mod registry;
pub mod response;
pub mod server;
pub mod state;
pub mod status;
pub mod store;
pub mod table;
pub mod tls;
pub mod types;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use base64::Engine;
use serde_json::{Value, json};

pub use crate::error::{Error, Result};
use crate::machinery::User;
pub use crate::state::SimConfig;
use crate::state::SimState;

/// A running kube-sim server. Dropping it (or [`Sim::shutdown`]) stops it.
pub struct Sim {
    shared: Arc<SimState>,
    addr: SocketAddr,
    ca_pem: Option<String>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Sim {
    /// Start on `127.0.0.1` with an ephemeral port.
    pub async fn start(cfg: SimConfig) -> Result<Sim> {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), cfg).await
    }

    /// Start on the given address.
    pub async fn start_on(addr: SocketAddr, cfg: SimConfig) -> Result<Sim> {
        if cfg.admin_token.is_empty() {
            return Err(Error::EmptyAdminToken);
        }
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Bind { addr, source })?;
        let addr = listener.local_addr().map_err(Error::LocalAddr)?;
        let (tls, ca_pem) = if cfg.tls {
            let m = tls::generate()?;
            (
                Some(tokio_rustls::TlsAcceptor::from(m.server_config)),
                Some(m.ca_pem),
            )
        } else {
            (None, None)
        };
        let scheme = if cfg.tls { "https" } else { "http" };
        let url = format!("{scheme}://{addr}");
        let shared = Arc::new(SimState::new(cfg, url));
        bootstrap::bootstrap(&shared);
        let task = tokio::spawn(server::accept_loop(
            shared.clone(),
            Some(listener),
            addr,
            tls,
        ));
        Ok(Sim {
            shared,
            addr,
            ca_pem,
            task: Some(task),
        })
    }

    /// `https://127.0.0.1:PORT` or `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        self.shared.url.clone()
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The bearer token that bypasses RBAC.
    pub fn admin_token(&self) -> String {
        self.shared.cfg.admin_token.clone()
    }

    /// The CA certificate (PEM) when serving TLS.
    pub fn ca_pem(&self) -> Option<String> {
        self.ca_pem.clone()
    }

    /// A kubeconfig (cluster `kube-sim`, user `kube-sim-user`, context `kube-sim`)
    /// that authenticates with `user_token`.
    pub fn kubeconfig_yaml(&self, user_token: &str) -> String {
        kubeconfig(&self.url(), self.ca_pem.as_deref(), user_token)
    }

    /// Writes [`Sim::kubeconfig_yaml`] for `token` to `path`.
    pub fn write_kubeconfig(&self, path: &Path, token: &str) -> Result<()> {
        std::fs::write(path, self.kubeconfig_yaml(token)).map_err(|source| Error::Write {
            what: "kubeconfig",
            path: path.to_path_buf(),
            source,
        })
    }

    /// A bearer token for the ServiceAccount `namespace/service_account` (the
    /// ServiceAccount object need not exist; RBAC bindings refer to it by name).
    pub fn issue_token(&self, namespace: &str, service_account: &str) -> String {
        self.shared.issue_token(namespace, service_account)
    }

    /// Register a bearer token for a user with groups (`system:authenticated` is added).
    pub fn add_user_token(&self, token: &str, user: &str, groups: &[&str]) {
        let mut groups: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
        if !groups.iter().any(|g| g == "system:authenticated") {
            groups.push("system:authenticated".into());
        }
        self.shared
            .tokens
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                token.to_string(),
                User {
                    name: user.to_string(),
                    groups,
                    admin: false,
                },
            );
    }

    /// When each request a `recordArrivals` fault rule matches arrived
    /// (injected failures included).
    pub fn arrivals(&self) -> Vec<std::time::Instant> {
        self.shared.faults().arrivals.clone()
    }

    /// Stores `object` without defaults or validation (`POST /_sim/unvalidated`):
    /// what an older or corrupted server could hold, for tests of clients
    /// that must skip such data. Returns the stored object.
    pub fn store_unvalidated(&self, object: Value) -> Result<Value> {
        handler::store_unvalidated(&self.shared, object)
            .map(|(_, stored)| stored)
            .map_err(Error::Refused)
    }

    /// Stop the server: close the listener, end watches and connections.
    pub async fn shutdown(mut self) {
        self.shared.shutdown.cancel();
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        self.shared.shutdown.cancel();
    }
}

/// Render a kubeconfig.
pub fn kubeconfig(url: &str, ca_pem: Option<&str>, token: &str) -> String {
    let mut cluster = json!({"server": url});
    if let Some(ca) = ca_pem {
        cluster["certificate-authority-data"] =
            json!(base64::engine::general_purpose::STANDARD.encode(ca));
    }
    let cfg = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kube-sim", "cluster": cluster}],
        "users": [{"name": "kube-sim-user", "user": {"token": token}}],
        "contexts": [{"name": "kube-sim", "context": {"cluster": "kube-sim", "user": "kube-sim-user", "namespace": "default"}}],
        "current-context": "kube-sim",
        "preferences": {},
    });
    serde_saphyr::to_string(&cfg).unwrap_or_default()
}
