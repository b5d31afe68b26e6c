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
//! Lookups use the core's `lookup` (shards of a big service are merged there).

use std::path::PathBuf;
use std::sync::Arc;

use futures::StreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use kube_discovery_core::crd::{DiscoveredService, MANAGED_BY_SELECTOR};
use kube_discovery_core::{Node, NodeQuery, parse_service_name};

use crate::{Error, Result};

/// A live, in-memory view of the DiscoveredServices.
pub struct NodesResolver {
    store: Store<DiscoveredService>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for NodesResolver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Objects of the service `q` (cheap filter over the cached `Arc`s).
fn candidates(objs: &[Arc<DiscoveredService>], q: &NodeQuery) -> Vec<DiscoveredService> {
    objs.iter()
        .filter(|o| {
            o.spec.cluster == q.cluster
                && o.spec.source_namespace == q.namespace
                && o.spec.source_name == q.name
        })
        .map(|o| (**o).clone())
        .collect()
}

impl NodesResolver {
    /// Starts a reflector over DiscoveredServices in `namespace` (all when `None`).
    pub fn start(client: Client, namespace: Option<&str>) -> Self {
        let api: Api<DiscoveredService> = match namespace {
            Some(ns) => Api::namespaced(client, ns),
            None => Api::all(client),
        };
        let (store, writer) = reflector::store();
        let stream = watcher(api, watcher::Config::default().labels(MANAGED_BY_SELECTOR))
            .default_backoff()
            .modify(|o: &mut DiscoveredService| {
                o.managed_fields_mut().clear();
                o.annotations_mut().clear();
            })
            .reflect(writer)
            .applied_objects();
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(ev) = stream.next().await {
                if let Err(e) = ev {
                    tracing::warn!(error = %e, "DiscoveredService watch failed; retrying");
                }
            }
        });
        Self { store, task }
    }

    /// Waits until the first list is in the cache.
    pub async fn wait_ready(&self) {
        let _ = self.store.wait_until_ready().await;
    }

    /// Nodes of `service_name` (`[id/]ns/name:port`): `Ok(None)` when the
    /// service or port is unknown, `Err` when the name is malformed.
    pub fn nodes(&self, service_name: &str) -> Result<Option<Vec<Node>>> {
        let q = parse_service_name(service_name).map_err(|e| Error::Input(e.to_string()))?;
        Ok(kube_discovery_core::render::lookup(
            &candidates(&self.store.state(), &q),
            &q,
        ))
    }
}

/// `kube-discovery nodes`: one list, one lookup, JSON out.
pub async fn nodes_command(
    service: &str,
    kubeconfig: Option<PathBuf>,
    context: Option<String>,
) -> Result<String> {
    let q = parse_service_name(service).map_err(|e| Error::Input(e.to_string()))?;
    let client = crate::client::client(&crate::client::Connection::Kubeconfig {
        path: kubeconfig,
        context,
    })
    .await?;
    let objs: Vec<Arc<DiscoveredService>> = crate::sink::list_managed(&client)
        .await?
        .into_iter()
        .map(Arc::new)
        .collect();
    match kube_discovery_core::render::lookup(&candidates(&objs, &q), &q) {
        Some(nodes) => Ok(serde_json::to_string_pretty(&nodes)?),
        None => Err(Error::NotFound(format!(
            "no nodes for {q}: no DiscoveredService with that service and port"
        ))),
    }
}
