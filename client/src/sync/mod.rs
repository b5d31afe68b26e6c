//! Gateways that follow DiscoveredServices without anyone touching their
//! config: what `kube-discovery sync nginx|haproxy` runs (feature `sync`).
//!
//! ```text
//!  DiscoveredServices ──NodesResolver (label selector)──▶ nodes ──changed──┐
//!                                                                        ▼
//!   policy.rs  per service: nodes -> usable nodes (invalid ones dropped, empty/missing per EmptyPolicy)
//!        │                                             │
//!        ▼                                             ▼
//!   nginx.rs   render upstream blocks (pure)     haproxy.rs  desired slots -> Runtime API commands (pure)
//!              if changed: candidate, `nginx -t`,            `set server b/s addr|weight|state` over the
//!              rename over the live file, reload             stats socket; reload only to grow the slots
//! ```
//!
//! Everything that decides *what* to write or send is a pure function with
//! unit tests ([`nginx::render`], [`haproxy::plan`], [`haproxy::render`],
//! [`crate::policy::usable_nodes`]); [`nginx::run_nginx`] and
//! [`haproxy::run_haproxy`] only do I/O around them. The end-to-end proof
//! (both API servers, the controller, real nginx/HAProxy processes and real
//! backends) lives in `e2e/tests/gateway_*.rs`.

use std::path::PathBuf;

use kube::Client;
use kube_discovery_core::crd::MANAGED_BY_SELECTOR;

pub mod haproxy;
pub mod nginx;

pub use haproxy::{HaproxyArgs, run_haproxy};
pub use nginx::{NginxArgs, run_nginx};

/// Where the syncs read DiscoveredServices from.
#[derive(Debug, Clone, clap::Args)]
pub struct KubeArgs {
    /// Kubeconfig file (default: `KUBECONFIG`, `~/.kube/config`, or in-cluster).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context.
    #[arg(long)]
    pub context: Option<String>,
    /// Only DiscoveredServices in this namespace (default: all namespaces).
    #[arg(long)]
    pub namespace: Option<String>,
    /// Label selector of the DiscoveredServices to watch.
    #[arg(long, default_value = MANAGED_BY_SELECTOR)]
    pub selector: String,
}

impl KubeArgs {
    /// A client for these flags ([`crate::connect::client`]).
    pub async fn client(&self) -> crate::Result<Client> {
        crate::connect::client(self.kubeconfig.as_deref(), self.context.as_deref()).await
    }

    /// A [`crate::NodesResolver`] over the DiscoveredServices these flags select.
    pub async fn resolver(&self) -> crate::Result<crate::NodesResolver> {
        Ok(crate::NodesResolver::start_with_selector(
            self.client().await?,
            self.namespace.as_deref(),
            &self.selector,
        ))
    }
}
