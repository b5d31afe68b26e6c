//! Watching the sources of one cluster: one kube-runtime [`watcher()`] on
//! `v1/Endpoints` or `discovery.k8s.io/v1/EndpointSlice` feeding the pure core
//! [`Index`].
//!
//! ```text
//!  watcher(Config{label selector, field selector, timeout, bookmarks})
//!    .modify(strip)               managedFields + annotations dropped
//!    + WatchBackoff (by hand)     250 ms doubling to a 1 s cap, jittered, reset after 5 s of
//!                                 success; a 410 Gone after a healthy stretch relists at once
//!    │
//!    ├─ Init .. InitApply* .. InitDone   (first list, and every relist: restart / 410 Gone)
//!    │     └─ Index::begin_reset, reset_add_*(obj) each, finish_reset_*
//!    │                                   vanished services reported, unchanged ones NOT
//!    ├─ Apply(obj)  ─ Index::apply_*
//!    └─ Delete(obj) ─ Index::delete_*
//!          │ changed keys
//!          ▼
//!    Shared::set_desired_shared(key, index.get_shared(key)) ; WriterHandle::changed(keys)
//! ```
//!
//! Memory: a (re)list is not buffered; each `InitApply` object goes straight
//! into the index's pending relist, which keeps only what the conversion
//! reads, and the index swaps it in at `InitDone`. The desired nodes are
//! shared with [`Shared`] (one `Arc` per service, not a copy).
//!
//! `label_selector` and `namespace_selector.equal/not_equal` go to the server
//! (label and `metadata.namespace` field selectors); `match/not_match` (and,
//! again, the others) are applied by the index. After the first complete list
//! the writer receives a `Synced` barrier, which drives readiness.
//!
//! Reconnects use [`WatchBackoff`], not kube-runtime's `DefaultBackoff`
//! (800 ms doubling to 30 s): after an outage the first retry once the API
//! server answers again must come within about a second, not tens of seconds.
//! The source loop applies it itself (instead of `WatchStreamExt::backoff`)
//! because it tells errors apart: a watch that ended with `410 Gone` (history
//! compacted) is followed by a relist without delay (once per healthy
//! stretch, see `WatchBackoff::next_after_gone`); every other error waits the
//! ordinary delay, during which the watcher is not polled (so sends nothing).
//! Every successful event resets it, as kube-runtime's `StreamBackoff` does.
//! The relist itself costs O(changed objects): the index reuses every object
//! whose resourceVersion it already holds (see `Index`).
//!
//! The `kube_discovery_nodes` gauge reads the index's running node total
//! (`Index::node_count` is O(1)), so an event costs O(changed services), not a
//! walk over every service of the index.
//!
//! Owner UIDs in Endpoints mode ([`SourceParams::watch_services`]): core/v1
//! Endpoints carry no ownerReferences, so a second, metadata-only watcher on
//! `v1/Services` (same namespace field selector, NO label selector: a
//! Service's labels need not match its Endpoints') feeds
//! `Index::reset_service_uids` / `Index::set_service_uid` in the same task
//! (one owner of the index, no locking). It only runs where objects can carry
//! an ownerReference at all: single cluster, `namespace_mode: source`,
//! Endpoints mode (EndpointSlices carry the owner UID themselves). The first
//! Service list is awaited for at most [`SERVICE_LIST_WAIT`] before the
//! Endpoints watch starts, so the first writes already carry the owner; a
//! Service watch that fails (e.g. `services` not granted) only logs and
//! retries: objects are then published without an ownerReference.
//!
//! Bad parts of source objects that the index skips with a warning are counted
//! in `kube_discovery_source_skipped_total{cluster,kind,reason}` (drained from
//! `Index::take_skipped` after every index operation).

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::utils::Backoff as _;
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
    /// Also watch Service metadata for owner UIDs (see the module docs).
    pub watch_services: bool,
}

impl SourceParams {
    /// The kube-runtime watcher configuration.
    pub fn watcher_config(&self) -> watcher::Config {
        let secs = u32::try_from(self.watch_timeout.as_secs())
            .unwrap_or(u32::MAX)
            .clamp(1, 3600);
        let mut cfg = watcher::Config::default()
            .timeout(secs)
            .page_size(crate::client::LIST_PAGE_SIZE);
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

    /// The Service metadata watcher's configuration: the namespace field
    /// selector and timeout of the source, but no label selector.
    pub fn service_watcher_config(&self) -> watcher::Config {
        let mut cfg = self.watcher_config();
        cfg.label_selector = None;
        cfg
    }
}

/// How long the first Service list may delay the Endpoints watch.
pub const SERVICE_LIST_WAIT: Duration = Duration::from_secs(5);

type ServiceEvents = BoxStream<'static, watcher::Result<Event<PartialObjectMeta<Service>>>>;

/// `(namespace, name, uid)` of a Service's metadata.
fn service_id(o: &PartialObjectMeta<Service>) -> Option<(String, String, String)> {
    let m = &o.metadata;
    Some((
        m.namespace.clone()?,
        m.name.clone()?,
        m.uid.clone().filter(|u| !u.is_empty())?,
    ))
}

/// Next event of the optional Service watch (pending forever without one).
async fn next_service(
    s: &mut Option<ServiceEvents>,
) -> Option<watcher::Result<Event<PartialObjectMeta<Service>>>> {
    match s {
        Some(s) => s.next().await,
        None => std::future::pending().await,
    }
}

/// The reconnect policy of every watcher (sources, drift, gateways).
pub use kube_discovery_core::backoff::WatchBackoff;

/// Whether a watcher error is a `410 Gone` (the watch's resourceVersion was
/// compacted away; kube-runtime relists next).
pub(crate) fn is_gone(e: &watcher::Error) -> bool {
    matches!(e, watcher::Error::WatchError(status) if status.code == 410)
}

/// The next item of `stream`, not polled before `until` (a backoff pause).
pub(crate) async fn next_after<S: futures::Stream + Unpin>(
    until: Option<Instant>,
    stream: &mut S,
) -> Option<S::Item> {
    if let Some(t) = until {
        tokio::time::sleep_until(t).await;
    }
    stream.next().await
}

/// A source object type the index understands.
pub trait SourceObject:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
    /// Index an added/modified object.
    fn apply(index: &mut Index, o: &Self) -> Vec<ServiceKey>;
    /// Index a deleted object.
    fn delete(index: &mut Index, o: &Self) -> Vec<ServiceKey>;
    /// One object of a (re)list (after `Index::begin_reset`).
    fn reset_add(index: &mut Index, o: &Self);
    /// The (re)list is complete: swap it in.
    fn reset_finish(index: &mut Index) -> Vec<ServiceKey>;
}

impl SourceObject for Endpoints {
    fn apply(index: &mut Index, o: &Self) -> Vec<ServiceKey> {
        index.apply_endpoints(o)
    }
    fn delete(index: &mut Index, o: &Self) -> Vec<ServiceKey> {
        index.delete_endpoints(o)
    }
    fn reset_add(index: &mut Index, o: &Self) {
        index.reset_add_endpoints(o);
    }
    fn reset_finish(index: &mut Index) -> Vec<ServiceKey> {
        index.finish_reset_endpoints()
    }
}

impl SourceObject for EndpointSlice {
    fn apply(index: &mut Index, o: &Self) -> Vec<ServiceKey> {
        index.apply_slice(o)
    }
    fn delete(index: &mut Index, o: &Self) -> Vec<ServiceKey> {
        index.delete_slice(o)
    }
    fn reset_add(index: &mut Index, o: &Self) {
        index.reset_add_slice(o);
    }
    fn reset_finish(index: &mut Index) -> Vec<ServiceKey> {
        index.finish_reset_slices()
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

    fn service_stream(&self) -> Option<ServiceEvents> {
        if !self.params.watch_services {
            return None;
        }
        let api: Api<PartialObjectMeta<Service>> = Api::all(self.client.clone());
        Some(
            watcher(api, self.params.service_watcher_config())
                .backoff(WatchBackoff::with_bounds(
                    Duration::from_millis(500),
                    Duration::from_secs(10),
                ))
                .modify(|o: &mut PartialObjectMeta<Service>| {
                    let m = &mut o.metadata;
                    m.managed_fields = None;
                    m.annotations = None;
                    m.labels = None;
                    m.owner_references = None;
                    m.finalizers = None;
                })
                .boxed(),
        )
    }

    /// Handles one Service watch event; `buffer` collects a (re)list.
    fn on_service_event(
        &mut self,
        ev: watcher::Result<Event<PartialObjectMeta<Service>>>,
        buffer: &mut Vec<(String, String, String)>,
    ) {
        let now = Instant::now();
        let changed = match ev {
            Ok(Event::Init) => {
                buffer.clear();
                return;
            }
            Ok(Event::InitApply(o)) => {
                buffer.extend(service_id(&o));
                return;
            }
            Ok(Event::InitDone) => {
                let all = std::mem::take(buffer);
                tracing::info!(cluster = %self.params.cluster, services = all.len(), "Service owner UIDs listed");
                self.index.reset_service_uids(all)
            }
            Ok(Event::Apply(o)) => match service_id(&o) {
                Some((ns, name, uid)) => self.index.set_service_uid(&ns, &name, Some(uid)),
                None => Vec::new(),
            },
            Ok(Event::Delete(o)) => {
                let m = &o.metadata;
                match (m.namespace.as_deref(), m.name.as_deref()) {
                    (Some(ns), Some(name)) => self.index.set_service_uid(ns, name, None),
                    _ => Vec::new(),
                }
            }
            Err(e) => {
                tracing::warn!(cluster = %self.params.cluster, error = %e, "Service watch failed (owner references of DiscoveredServices may be missing); retrying with backoff");
                return;
            }
        };
        self.publish(changed, now);
    }

    /// Feeds the skip counts of the last index operations to the metric.
    fn count_skipped(&mut self) {
        for (reason, n) in self.index.take_skipped() {
            self.metrics.skipped(
                &self.params.cluster,
                self.params.kind.as_str(),
                reason.as_str(),
                n,
            );
        }
    }

    async fn run_typed<K: SourceObject>(mut self, shutdown: CancellationToken) {
        let cluster = self.params.cluster.clone();
        let mut services = self.service_stream();
        let mut service_buffer = Vec::new();
        if services.is_some() {
            // Give the first Service list a head start (bounded), so the first
            // writes already carry the owner; never block on it.
            let deadline = tokio::time::sleep(SERVICE_LIST_WAIT);
            tokio::pin!(deadline);
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = &mut deadline => {
                        tracing::warn!(cluster = %cluster, "Service list not complete after {SERVICE_LIST_WAIT:?}; watching endpoints anyway");
                        break;
                    }
                    ev = next_service(&mut services) => match ev {
                        Some(ev) => {
                            let stop = matches!(ev, Ok(Event::InitDone) | Err(_));
                            self.on_service_event(ev, &mut service_buffer);
                            if stop {
                                break;
                            }
                        }
                        None => {
                            services = None;
                            break;
                        }
                    },
                }
            }
        }
        let api: Api<K> = Api::all(self.client.clone());
        let stream = watcher(api, self.params.watcher_config()).modify(|o: &mut K| {
            o.managed_fields_mut().clear();
            o.annotations_mut().clear();
        });
        let mut stream = std::pin::pin!(stream);
        let mut backoff = WatchBackoff::new();
        // After an error: the watcher is polled again only from this instant.
        let mut paused_until: Option<Instant> = None;
        let mut listed_objects: usize = 0;
        let mut list_started: Option<Instant> = None;
        let mut first_list_done = false;
        tracing::info!(cluster = %cluster, kind = %self.params.kind, "watching");
        loop {
            let ev = tokio::select! {
                () = shutdown.cancelled() => break,
                sev = next_service(&mut services) => {
                    match sev {
                        Some(sev) => self.on_service_event(sev, &mut service_buffer),
                        None => services = None,
                    }
                    continue;
                }
                ev = next_after(paused_until, &mut stream) => ev,
            };
            let Some(ev) = ev else { break };
            paused_until = None;
            let now = Instant::now();
            match &ev {
                Ok(_) => backoff.reset(),
                Err(e) => {
                    let delay = if is_gone(e) {
                        backoff.next_after_gone()
                    } else {
                        backoff.next().unwrap_or(Duration::from_secs(1))
                    };
                    paused_until = Some(now + delay);
                }
            }
            match ev {
                Ok(Event::Init) => {
                    self.index.begin_reset();
                    listed_objects = 0;
                    list_started = Some(now);
                }
                Ok(Event::InitApply(o)) => {
                    self.metrics.event(&cluster, "init_apply");
                    K::reset_add(&mut self.index, &o);
                    listed_objects += 1;
                    // Warnings of listed objects are logged (and counted) as
                    // they arrive.
                    self.count_skipped();
                }
                Ok(Event::InitDone) => {
                    let changed = K::reset_finish(&mut self.index);
                    if let Some(t) = list_started.take() {
                        self.metrics
                            .list_duration
                            .get_or_create(&Metrics::cluster(&cluster))
                            .observe(t.elapsed().as_secs_f64());
                    }
                    self.metrics
                        .event(&cluster, if first_list_done { "relist" } else { "list" });
                    tracing::info!(cluster = %cluster, objects = std::mem::take(&mut listed_objects), services = self.index.len(), changed = changed.len(), "list complete");
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

    fn publish(&mut self, changed: Vec<ServiceKey>, at: Instant) {
        self.count_skipped();
        if changed.is_empty() {
            return;
        }
        for key in &changed {
            self.shared
                .set_desired_shared(key, self.index.get_shared(key));
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
    fn only_a_410_watch_error_counts_as_gone() {
        let status = |code| Box::new(kube::core::Status::failure("x", "Expired").with_code(code));
        assert!(is_gone(&watcher::Error::WatchError(status(410))));
        assert!(!is_gone(&watcher::Error::WatchError(status(500))));
        assert!(!is_gone(&watcher::Error::WatchError(status(403))));
        assert!(!is_gone(&watcher::Error::NoResourceVersion));
    }

    #[test]
    fn watcher_config_carries_selectors_timeout_and_bookmarks() {
        let p = SourceParams {
            cluster: String::new(),
            kind: SourceKind::EndpointSlice,
            label_selector: Some("app=web".into()),
            field_selector: Some("metadata.namespace!=kube-system".into()),
            watch_timeout: Duration::from_secs(120),
            watch_services: true,
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
            ..p.clone()
        };
        assert_eq!(empty.watcher_config().label_selector, None);
        // Services: the namespace selector, never the label selector.
        let svc = p.service_watcher_config();
        assert_eq!(svc.label_selector, None);
        assert_eq!(
            svc.field_selector.as_deref(),
            Some("metadata.namespace!=kube-system")
        );
        assert_eq!(svc.timeout, Some(120));
    }
}
