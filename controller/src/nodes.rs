//! Library API for Rust gateways: resolve `[id/]namespace/name:port` to nodes
//! in-process, from a reflector over the DiscoveredServices on the API server
//! (the same objects every other gateway reads).
//!
//! ```no_run
//! # async fn f(client: kube::Client) -> kube_discovery::Result<()> {
//! let resolver = kube_discovery::nodes::NodesResolver::start(client, None);
//! resolver.wait_ready().await;
//! let nodes = resolver.nodes("default/plat-dev:port")?; // Option<Vec<Node>>
//! # Ok(()) }
//! ```
//!
//! The reflector is the one the `sync nginx|haproxy` commands use
//! ([`kube_discovery_gateways::watch::DsWatch`]); lookups go through the
//! core's `lookup`, which merges the shards of a big service.

use std::path::PathBuf;

use kube::Client;
use kube_discovery_core::crd::MANAGED_BY_SELECTOR;
use kube_discovery_core::{Node, parse_service_name};
use kube_discovery_gateways::watch::DsWatch;

use crate::{Error, Result};

/// A live, in-memory view of the DiscoveredServices.
pub struct NodesResolver {
    watch: DsWatch,
}

impl NodesResolver {
    /// Starts a reflector over DiscoveredServices in `namespace` (all when `None`).
    pub fn start(client: Client, namespace: Option<&str>) -> Self {
        Self {
            watch: DsWatch::start(client, namespace, MANAGED_BY_SELECTOR),
        }
    }

    /// Waits until the first list is in the cache.
    pub async fn wait_ready(&self) {
        self.watch.wait_ready().await;
    }

    /// Nodes of `service_name` (`[id/]ns/name:port`): `Ok(None)` when the
    /// service or port is unknown, `Err` when the name is malformed.
    pub fn nodes(&self, service_name: &str) -> Result<Option<Vec<Node>>> {
        // Validate here so a malformed name is an input error, not an I/O one.
        parse_service_name(service_name).map_err(|e| Error::Input(e.to_string()))?;
        self.watch
            .nodes(service_name)
            .map_err(|e| Error::Input(e.to_string()))
    }
}

/// Where `kube-discovery nodes` reads.
#[derive(Debug, Clone)]
pub enum NodesFrom {
    /// The DiscoveredServices on the API server (every namespace).
    DiscoveredServices,
    /// The ConfigMap snapshot `namespace/name` on the API server.
    Snapshot(String),
    /// A snapshot mounted as files in this directory.
    SnapshotDir(PathBuf),
}

/// `kube-discovery nodes`: one read, one lookup, JSON out.
pub async fn nodes_command(
    service: &str,
    kubeconfig: Option<PathBuf>,
    context: Option<String>,
    from: NodesFrom,
) -> Result<String> {
    let q = parse_service_name(service).map_err(|e| Error::Input(e.to_string()))?;
    let connect = || async {
        crate::client::client(&crate::client::Connection::Kubeconfig {
            path: kubeconfig.clone(),
            context: context.clone(),
        })
        .await
    };
    let nodes: Option<Vec<Node>> = match from {
        NodesFrom::DiscoveredServices => {
            let objs = crate::sink::list_managed(&connect().await?).await?;
            kube_discovery_core::render::lookup(&objs, &q)
        }
        NodesFrom::Snapshot(at) => {
            let (ns, name) = at
                .split_once('/')
                .filter(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains('/'))
                .ok_or_else(|| {
                    Error::Input(format!("--snapshot {at:?}: expected NAMESPACE/NAME"))
                })?;
            let dump = crate::snapshot::read(&connect().await?, ns, name).await?;
            dump.lookup(&q).map(<[Node]>::to_vec)
        }
        NodesFrom::SnapshotDir(dir) => {
            let dump = crate::snapshot::read_dir(&dir)?;
            dump.lookup(&q).map(<[Node]>::to_vec)
        }
    };
    match nodes {
        Some(nodes) => Ok(serde_json::to_string_pretty(&nodes)?),
        None => Err(Error::NotFound(format!(
            "no nodes for {q}: no such service and port"
        ))),
    }
}
