//! Watching the sources of one cluster: one kube-runtime [`watcher`] on
//! `v1/Endpoints` or `discovery.k8s.io/v1/EndpointSlice` feeding the pure core
//! [`Index`].
//!
//! ```text
//!  watcher(Config{label selector, field selector, timeout, bookmarks})
//!    .default_backoff()           exponential, jittered, starting near 1 s
//!    .modify(strip)               managedFields + annotations dropped
//!    │
//!    ├─ Init .. InitApply* .. InitDone   (first list, and every relist: restart / 410 Gone)
//!    │     └─ Index::reset_*(all)        vanished services reported, unchanged ones NOT
//!    ├─ Apply(obj)  ─ Index::apply_*
//!    └─ Delete(obj) ─ Index::delete_*
//!          │ changed keys
//!          ▼
//!    Shared::set_desired(key, index.get(key)) ; WriterHandle::changed(keys)
//! ```
//!
//! `label_selector` and `namespace_selector.equal/not_equal` go to the server
//! (label and `metadata.namespace` field selectors); `match/not_match` (and,
//! again, the others) are applied by the index. After the first complete list
//! the writer receives a `Synced` barrier, which drives readiness.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use kube_discovery_core::{Index, ServiceKey, SourceKind};
use serde::de::DeserializeOwned;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::state::Shared;
use crate::writer::WriterHandle;

/// What to watch in one cluster.
#[derive(Debug, Clone)]
pub struct SourceParams {
    /// Cluster id (`""` single cluster).
    pub cluster: String,
    /// Endpoints or EndpointSlices.
    pub kind: SourceKind,
    /// Server-side label selector.
    pub label_selector: Option<String>,
    /// Server-side field selector (`metadata.namespace=` / `!=`).
    pub field_selector: Option<String>,
    /// Server-side watch timeout.
    pub watch_timeout: Duration,
}

impl SourceParams {
    /// The kube-runtime watcher configuration.
    pub fn watcher_config(&self) -> watcher::Config {
        let secs = u32::try_from(self.watch_timeout.as_secs())
            .unwrap_or(u32::MAX)
            .clamp(1, 3600);
        let mut cfg = watcher::Config::default().timeout(secs);
        if let Some(l) = self.label_selector.as_deref().filter(|s| !s.is_empty()) {
            cfg = cfg.labels(l);
        }
        if let Some(f) = self.field_selector.as_deref().filter(|s| !s.is_empty()) {
            cfg = cfg.fields(f);
        }
        // Bookmarks are on by default in kube-runtime; keep them explicit.
        cfg.bookmarks = true;
        cfg
    }
}

/// A source object type the index understands.
pub trait SourceObject:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
    /// Index an added/modified object.
    fn apply(index: &mut Index, o: &Self) -> Vec<ServiceKey>;
    /// Index a deleted object.
    fn delete(index: &mut Index, o: &Self) -> Vec<ServiceKey>;
    /// Replace the index content after a (re)list.
    fn reset(index: &mut Index, all: &[Self]) -> Vec<ServiceKey>;
}

impl SourceObject for Endpoints {
    fn apply(index: &mut Index, o: &Self) -> Vec<ServiceKey> {
        index.apply_endpoints(o)
    }
    fn delete(index: &mut Index, o: &Self) -> Vec<ServiceKey> {
        index.delete_endpoints(o)
    }
    fn reset(index: &mut Index, all: &[Self]) -> Vec<ServiceKey> {
        index.reset_endpoints(all)
    }
}

impl SourceObject for EndpointSlice {
    fn apply(index: &mut Index, o: &Self) -> Vec<ServiceKey> {
        index.apply_slice(o)
    }
    fn delete(index: &mut Index, o: &Self) -> Vec<ServiceKey> {
        index.delete_slice(o)
    }
    fn reset(index: &mut Index, all: &[Self]) -> Vec<ServiceKey> {
        index.reset_slices(all)
    }
}

/// Everything a source task needs.
pub struct Source {
    /// What to watch.
    pub params: SourceParams,
    /// The cluster's client.
    pub client: Client,
    /// The pure index of this cluster.
    pub index: Index,
    /// Shared desired state.
    pub shared: Arc<Shared>,
    /// Where changed keys go.
    pub writer: WriterHandle,
    /// Metrics.
    pub metrics: Metrics,
}

impl Source {
    /// Watches until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        match self.params.kind {
            SourceKind::Endpoints => {
                tracing::warn!(
                    cluster = %self.params.cluster,
                    "watching core/v1 Endpoints (deprecated since Kubernetes 1.33); set \
                     `watch_endpoint_slices: true` to use discovery.k8s.io/v1 EndpointSlices"
                );
                self.run_typed::<Endpoints>(shutdown).await;
            }
            SourceKind::EndpointSlice => self.run_typed::<EndpointSlice>(shutdown).await,
        }
    }

    async fn run_typed<K: SourceObject>(mut self, shutdown: CancellationToken) {
        let cluster = self.params.cluster.clone();
        let api: Api<K> = Api::all(self.client.clone());
        let stream = watcher(api, self.params.watcher_config())
            .default_backoff()
            .modify(|o: &mut K| {
                o.managed_fields_mut().clear();
                o.annotations_mut().clear();
            });
        let mut stream = std::pin::pin!(stream);
        let mut buffer: Vec<K> = Vec::new();
        let mut list_started: Option<Instant> = None;
        let mut first_list_done = false;
        tracing::info!(cluster = %cluster, kind = %self.params.kind, "watching");
        loop {
            let ev = tokio::select! {
                () = shutdown.cancelled() => break,
                ev = stream.next() => ev,
            };
            let Some(ev) = ev else { break };
            let now = Instant::now();
            match ev {
                Ok(Event::Init) => {
                    buffer.clear();
                    list_started = Some(now);
                }
                Ok(Event::InitApply(o)) => {
                    self.metrics.event(&cluster, "init_apply");
                    buffer.push(o);
                }
                Ok(Event::InitDone) => {
                    let all = std::mem::take(&mut buffer);
                    let changed = K::reset(&mut self.index, &all);
                    if let Some(t) = list_started.take() {
                        self.metrics
                            .list_duration
                            .get_or_create(&Metrics::cluster(&cluster))
                            .observe(t.elapsed().as_secs_f64());
                    }
                    self.metrics
                        .event(&cluster, if first_list_done { "relist" } else { "list" });
                    tracing::info!(cluster = %cluster, objects = all.len(), services = self.index.len(), changed = changed.len(), "list complete");
                    self.publish(changed, now);
                    self.shared.update_cluster(&cluster, |c| {
                        c.listed = true;
                        c.lists += 1;
                        c.last_error = None;
                    });
                    if !first_list_done {
                        first_list_done = true;
                        self.writer.synced(&cluster);
                    }
                }
                Ok(Event::Apply(o)) => {
                    self.metrics.event(&cluster, "apply");
                    let changed = K::apply(&mut self.index, &o);
                    self.publish(changed, now);
                }
                Ok(Event::Delete(o)) => {
                    self.metrics.event(&cluster, "delete");
                    let changed = K::delete(&mut self.index, &o);
                    self.publish(changed, now);
                }
                Err(e) => {
                    self.metrics
                        .watch_restarts
                        .get_or_create(&Metrics::cluster(&cluster))
                        .inc();
                    tracing::warn!(cluster = %cluster, error = %e, "watch failed; retrying with backoff");
                    let msg = e.to_string();
                    self.shared
                        .update_cluster(&cluster, |c| c.last_error = Some(msg));
                }
            }
        }
        tracing::info!(cluster = %cluster, "watch stopped");
    }

    fn publish(&self, changed: Vec<ServiceKey>, at: Instant) {
        if changed.is_empty() {
            return;
        }
        for key in &changed {
            self.shared.set_desired(key, self.index.get(key).cloned());
        }
        let label = Metrics::cluster(&self.params.cluster);
        self.metrics
            .services
            .get_or_create(&label)
            .set(i64::try_from(self.index.len()).unwrap_or(i64::MAX));
        self.metrics
            .nodes
            .get_or_create(&label)
            .set(i64::try_from(self.index.node_count()).unwrap_or(i64::MAX));
        self.writer.changed(changed, at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watcher_config_carries_selectors_timeout_and_bookmarks() {
        let p = SourceParams {
            cluster: String::new(),
            kind: SourceKind::EndpointSlice,
            label_selector: Some("app=web".into()),
            field_selector: Some("metadata.namespace!=kube-system".into()),
            watch_timeout: Duration::from_secs(120),
        };
        let c = p.watcher_config();
        assert_eq!(c.label_selector.as_deref(), Some("app=web"));
        assert_eq!(
            c.field_selector.as_deref(),
            Some("metadata.namespace!=kube-system")
        );
        assert_eq!(c.timeout, Some(120));
        assert!(c.bookmarks);
        let empty = SourceParams {
            label_selector: Some(String::new()),
            field_selector: None,
            ..p
        };
        assert_eq!(empty.watcher_config().label_selector, None);
    }
}
