//! A reflector over DiscoveredServices (selected by label) that says when
//! something changed, and the Kubernetes connection flags shared by the
//! `sync` commands.
//!
//! Changes are signalled through a `tokio::sync::watch` counter: a consumer
//! that is busy (running `nginx -t`, talking to HAProxy) sees one change for
//! a whole burst of events, which coalesces a rolling update for free. The
//! first signal comes after the initial list (`InitDone`), so nothing is
//! rendered from a half-listed cache. Reconnects follow the controller's
//! policy ([`WatchBackoff`]: at most ~1 s between retries).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use futures::StreamExt;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Config, ResourceExt};
use kube_discovery_core::backoff::WatchBackoff;
use kube_discovery_core::crd::{DiscoveredService, MANAGED_BY_SELECTOR};
use kube_discovery_core::{Node, parse_service_name};

/// Where to read DiscoveredServices from.
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
    /// A client for these flags: the kubeconfig file (and context) when
    /// given, else the default kubeconfig with the context, else inferred
    /// (`KUBECONFIG`, `~/.kube/config`, in-cluster).
    pub async fn client(&self) -> anyhow::Result<Client> {
        let opts = KubeConfigOptions {
            context: self.context.clone(),
            ..KubeConfigOptions::default()
        };
        let config = match (&self.kubeconfig, &self.context) {
            (Some(path), _) => {
                let kc = Kubeconfig::read_from(path)
                    .with_context(|| format!("--kubeconfig {}", path.display()))?;
                Config::from_custom_kubeconfig(kc, &opts)
                    .await
                    .with_context(|| format!("--kubeconfig {}", path.display()))?
            }
            (None, Some(ctx)) => Config::from_kubeconfig(&opts)
                .await
                .with_context(|| format!("--context {ctx}"))?,
            (None, None) => Config::infer()
                .await
                .context("no kubeconfig and not in a cluster")?,
        };
        Ok(Client::try_from(config)?)
    }
}

/// The DiscoveredServices currently known.
pub type Snapshot = Vec<Arc<DiscoveredService>>;

/// A running reflector.
pub struct DsWatch {
    store: Store<DiscoveredService>,
    changed: tokio::sync::watch::Receiver<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for DsWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl DsWatch {
    /// Starts watching DiscoveredServices in `namespace` (all when `None`) matching `selector`.
    pub fn start(client: Client, namespace: Option<&str>, selector: &str) -> Self {
        let api: Api<DiscoveredService> = match namespace {
            Some(ns) => Api::namespaced(client, ns),
            None => Api::all(client),
        };
        let (store, writer) = reflector::store();
        let (tx, changed) = tokio::sync::watch::channel(0u64);
        let stream = watcher(api, watcher::Config::default().labels(selector))
            .backoff(WatchBackoff::new())
            .modify(|o: &mut DiscoveredService| {
                o.managed_fields_mut().clear();
                o.annotations_mut().clear();
            })
            .reflect(writer);
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(watcher::Event::Apply(o) | watcher::Event::Delete(o)) => {
                        // Names the event, so a test (or an operator) can see
                        // that a given write was processed.
                        tracing::debug!(
                            dsvc = %format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any()),
                            resource_version = %o.resource_version().unwrap_or_default(),
                            "DiscoveredService event"
                        );
                        tx.send_modify(|n| *n += 1);
                    }
                    Ok(watcher::Event::InitDone) => {
                        tx.send_modify(|n| *n += 1);
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "DiscoveredService watch failed; retrying")
                    }
                }
            }
        });
        Self {
            store,
            changed,
            task,
        }
    }

    /// Waits for the next change (returns at once if one is pending), then marks it seen.
    /// The first change is the end of the initial list.
    pub async fn changed(&mut self) -> anyhow::Result<()> {
        self.changed
            .changed()
            .await
            .map_err(|_| anyhow::anyhow!("DiscoveredService watch stopped"))?;
        self.changed.borrow_and_update();
        Ok(())
    }

    /// [`Self::changed`] bounded by `limit` (for one-shot runs that must not hang
    /// when the API server or the CRD is unreachable).
    pub async fn changed_within(
        &mut self,
        limit: Option<std::time::Duration>,
    ) -> anyhow::Result<()> {
        match limit {
            None => self.changed().await,
            Some(d) => tokio::time::timeout(d, self.changed()).await.map_err(|_| {
                anyhow::anyhow!("no complete list of DiscoveredServices within {d:?} (API server reachable? CRD installed? RBAC allows list/watch?)")
            })?,
        }
    }

    /// Waits until the first complete list is in the cache (without
    /// consuming a change signal).
    pub async fn wait_ready(&self) {
        // Only fails when the writer side is dropped, i.e. the task stopped.
        let _ = self.store.wait_until_ready().await;
    }

    /// Nodes of `service` (`[id/]ns/name:port`) in the current cache, merged
    /// over the shards of a big service: `None` when the service or port is
    /// unknown.
    pub fn nodes(&self, service: &str) -> anyhow::Result<Option<Vec<Node>>> {
        let q = parse_service_name(service).map_err(|e| anyhow::anyhow!("{service}: {e}"))?;
        let state = self.store.state();
        Ok(kube_discovery_core::render::lookup(
            state.iter().map(AsRef::as_ref),
            &q,
        ))
    }
}
