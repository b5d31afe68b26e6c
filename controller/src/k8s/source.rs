//! The sources of one cluster: `v1/Endpoints` or
//! `discovery.k8s.io/v1/EndpointSlice` through the watch loop
//! ([`crate::k8s::watch`]) into the pure core [`Index`].
//!
//! ```text
//!  watch::run(watcher(LeanEndpoints | LeanEndpointSlice))   (topology on: the k8s-openapi types)
//!    │
//!    ├─ init .. init_apply* .. init_done   (first list, and every relist: restart / 410 Gone)
//!    │     └─ Index::begin_reset, reset_add_*(obj) each, finish_reset_*
//!    │                                   vanished services reported, unchanged ones NOT
//!    ├─ apply(obj)  ─ Index::apply_*
//!    ├─ delete(obj) ─ Index::delete_*
//!    └─ background: the Service watch (ports for aliases/appProtocols, the
//!       export annotations, ExternalNames; owner UIDs in Endpoints mode)
//!          │ changed keys (held back until BOTH first lists are complete;
//!          │ then every key of the index, `listed`, and the `Synced` barrier)
//!          ▼
//!    ControllerState::set_desired_arc(key, index.get_arc(key)) ; WriterHandle::changed(keys)
//! ```
//!
//! The watch decodes [`LeanEndpoints`] / [`LeanEndpointSlice`]: only what the
//! conversion reads (no managedFields, annotations, targetRefs ... are ever
//! allocated; see [`kube_discovery_core::source::lean`]). With topology output on
//! (`nodeName`, `zone`, `targetRef` of every node) it watches the k8s-openapi
//! types instead, stripped of managedFields and annotations, and the index
//! reduces each object to the same lean form.
//!
//! A (re)list is not buffered: each listed object goes straight into the
//! index's pending relist, which the index swaps in at `InitDone` and which
//! reuses every object whose resourceVersion it already holds, so a relist
//! costs O(changed objects). [`ControllerState`] holds the index's own `Arc` of each
//! service, not a copy.
//!
//! `label_selector` and `namespace_selector.equal/not_equal` go to the server
//! (label and `metadata.namespace` field selectors); `match/not_match` (and,
//! again, the others) are applied by the index.
//!
//! The first-list barrier: nothing of a cluster is published (desired
//! state, changed keys) until both its first endpoint list and its first
//! Service list are complete. Before that the index cannot tell what is
//! desired: an unknown Service would count as exported under `export: all`
//! (publishing one annotated `"false"`) and as not exported under
//! `export: opt-in`, and an ExternalName Service not yet listed has no
//! object; the writer's `Synced` barrier deletes every object of the
//! cluster without desired state. So once both are in, the whole index is
//! published, the cluster is `listed`, and the writer gets the `Synced`
//! barrier (readiness); a Service list that fails keeps being retried with
//! backoff, logged, and keeps the cluster unready. A relist later (410 Gone,
//! a list error) replaces the index only at its end, each watch its own
//! part, so a relist that fails half-way changes nothing.
//!
//! Services: a second watch on `v1/Services` (same namespace field selector,
//! NO label selector: a Service's labels need not match its endpoints'), in
//! every mode and cluster, feeds the index from the same task (one owner of
//! the index, no locking): each Service is reduced at once to its ports
//! (`ServiceInfo`: name, port, targetPort, appProtocol; the object is not
//! kept) for the Service-port aliases and appProtocols
//! (`Index::reset_services` / `Index::set_service`). Where objects can carry
//! an ownerReference but the endpoint objects do not name their Service
//! (single cluster, `namespace_mode: source`, Endpoints mode:
//! [`SourceParams::watch_services`]) it also feeds the owner UIDs
//! (`Index::reset_service_uids` / `Index::set_service_uid`). Both watches
//! start at once; a Service watch that fails (e.g. `services` not granted)
//! logs and retries, and until its first list is complete the cluster
//! publishes nothing (see the barrier above).
//!
//! Health is per watch: the endpoint watch and the Service watch of a cluster
//! each report their own failures ([`ControllerState::watch_failed`], under
//! their kind) and their own successes (a complete list, an event, a watch
//! request answered 2xx: [`ControllerState::watch_ok`]); one that has failed
//! for longer than `unready_after` makes `/readyz` 503. Errors are reported
//! as safe summaries ([`crate::k8s::redact`]), never as their raw text.
//!
//! Gauges and counters: `kube_discovery_services` / `kube_discovery_nodes`
//! read the index's running totals (O(1)); parts of source objects the index
//! skips with a warning are counted in
//! `kube_discovery_source_skipped_total{cluster,kind,reason}`.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use kube_discovery_core::crd::ObjectNaming;
use kube_discovery_core::source::lean::{LeanEndpointSlice, LeanEndpoints, LeanService};
use kube_discovery_core::source::service::ServiceInfo;
use kube_discovery_core::{Index, ServiceKey, SourceKind};
use serde::de::DeserializeOwned;
use tokio::sync::watch as tokio_watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::k8s::events::Events;
use crate::k8s::leader::Leadership;
use crate::k8s::watch::{self, Watch, WatchBackoff, WatchIndex};
use crate::serve::metrics::Metrics;
use crate::state::ControllerState;
use crate::write::inbox::WriterHandle;

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
    /// The one watched namespace (`namespace_selector: {equal: ns}`): the
    /// watches are then namespaced requests. `None`: cluster-wide.
    pub namespace: Option<String>,
    /// Server-side watch timeout.
    pub watch_timeout: Duration,
    /// Use the watched Services' UIDs as owner UIDs (see the module docs).
    pub watch_services: bool,
}

impl SourceParams {
    /// The kube-runtime watcher configuration.
    pub fn watcher_config(&self) -> watcher::Config {
        let mut cfg = watch::config(Some(self.watch_timeout));
        if let Some(l) = self.label_selector.as_deref().filter(|s| !s.is_empty()) {
            cfg = cfg.labels(l);
        }
        if let Some(f) = self.field_selector.as_deref().filter(|s| !s.is_empty()) {
            cfg = cfg.fields(f);
        }
        cfg
    }

    /// The Service watcher's configuration: the namespace field
    /// selector and timeout of the source, but no label selector.
    pub fn service_watcher_config(&self) -> watcher::Config {
        let mut cfg = self.watcher_config();
        cfg.label_selector = None;
        cfg
    }
}

/// The watch kind of a watched resource (plural), as
/// [`ControllerState::watch_failed`] names it: `endpointslices` ->
/// `EndpointSlice`, `endpoints` -> `Endpoints`, `services` -> `Service`.
pub fn watch_kind(resource: &str) -> Option<&'static str> {
    match resource {
        "endpointslices" => Some(SourceKind::EndpointSlice.as_str()),
        "endpoints" => Some(SourceKind::Endpoints.as_str()),
        "services" => Some(SERVICE_WATCH),
        _ => None,
    }
}

/// The kind the Service watch is reported under.
pub const SERVICE_WATCH: &str = "Service";

/// A source object type the index understands.
pub trait SourceObject:
    Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
    + Clone
    + DeserializeOwned
    + Debug
    + Send
    + Sync
    + 'static
{
    /// Whether the watcher should drop managedFields and annotations as
    /// they arrive (the full k8s-openapi types; a lean type never has them).
    const STRIP: bool = false;
    /// Index an added/modified object.
    fn apply(index: &mut Index, o: &Self) -> Vec<ServiceKey>;
    /// Index a deleted object.
    fn delete(index: &mut Index, o: &Self) -> Vec<ServiceKey>;
    /// One object of a (re)list (after `Index::begin_reset`).
    fn reset_add(index: &mut Index, o: &Self);
    /// The (re)list is complete: swap it in.
    fn reset_finish(index: &mut Index) -> Vec<ServiceKey>;
}

/// The lean types are what the watch decodes; the k8s-openapi ones only
/// with topology output on (see the module docs). Both go through the same
/// index calls.
macro_rules! source_object {
    ($ty:ty, $strip:expr, $apply:ident, $delete:ident, $reset_add:ident, $finish:ident) => {
        impl SourceObject for $ty {
            const STRIP: bool = $strip;
            fn apply(index: &mut Index, o: &Self) -> Vec<ServiceKey> {
                index.$apply(o)
            }
            fn delete(index: &mut Index, o: &Self) -> Vec<ServiceKey> {
                index.$delete(o)
            }
            fn reset_add(index: &mut Index, o: &Self) {
                index.$reset_add(o);
            }
            fn reset_finish(index: &mut Index) -> Vec<ServiceKey> {
                index.$finish()
            }
        }
    };
}

source_object!(
    LeanEndpoints,
    false,
    apply_endpoints,
    delete_endpoints,
    reset_add_endpoints,
    finish_reset_endpoints
);
source_object!(
    Endpoints,
    true,
    apply_endpoints,
    delete_endpoints,
    reset_add_endpoints,
    finish_reset_endpoints
);
source_object!(
    LeanEndpointSlice,
    false,
    apply_slice,
    delete_slice,
    reset_add_slice,
    finish_reset_slices
);
source_object!(
    EndpointSlice,
    true,
    apply_slice,
    delete_slice,
    reset_add_slice,
    finish_reset_slices
);

/// Everything a source task needs.
pub struct Source {
    /// What to watch.
    pub params: SourceParams,
    /// The cluster's client.
    pub client: Client,
    /// The pure index of this cluster.
    pub index: Index,
    /// The process-wide desired state.
    pub shared: Arc<ControllerState>,
    /// Where changed keys go.
    pub writer: WriterHandle,
    /// Metrics.
    pub metrics: Metrics,
    /// Events about skipped Service annotations and refused ExternalNames.
    pub events: Events,
    /// Whether this replica leads (`None`: no leader election); only the
    /// leader emits Events.
    pub leader: Option<tokio_watch::Receiver<Leadership>>,
    /// Where DiscoveredServices go (an Event about a remote cluster's
    /// Service regards the DiscoveredService it would have).
    pub naming: ObjectNaming,
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
                if self.index.options().topology {
                    self.run_typed::<Endpoints>(shutdown).await;
                } else {
                    self.run_typed::<LeanEndpoints>(shutdown).await;
                }
            }
            SourceKind::EndpointSlice if self.index.options().topology => {
                self.run_typed::<EndpointSlice>(shutdown).await;
            }
            SourceKind::EndpointSlice => self.run_typed::<LeanEndpointSlice>(shutdown).await,
        }
    }

    async fn run_typed<K: SourceObject>(self, shutdown: CancellationToken) {
        let api: Api<K> = scoped_api(&self.client, self.params.namespace.as_deref());
        let mut objects = Watch::from_config(self.params.watcher_config(), move |cfg| {
            watcher(api.clone(), cfg).modify(|o: &mut K| {
                if K::STRIP {
                    o.managed_fields_mut().clear();
                    o.annotations_mut().clear();
                }
            })
        });
        let mut index = SourceIndex::new(self);
        let cluster = index.params.cluster.clone();
        tracing::info!(cluster = %cluster, kind = %index.params.kind, "watching");
        watch::run::<K, _>(&mut index, &mut objects, &shutdown).await;
        tracing::info!(cluster = %cluster, "watch stopped");
    }
}

/// A namespaced API in `namespace`, or a cluster-wide one.
fn scoped_api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// The Service watch (see the module docs). Objects are decoded as
/// [`LeanService`]s (ports, type, externalName, the `kubediscovery.io/`
/// annotations: nothing else is allocated), reduced to a [`ServiceInfo`] as
/// they arrive, and never stored.
fn service_watch(client: &Client, params: &SourceParams) -> Watch<LeanService> {
    let api: Api<LeanService> = scoped_api(client, params.namespace.as_deref());
    let watch = Watch::from_config(params.service_watcher_config(), move |cfg| {
        watcher(api.clone(), cfg)
    });
    watch.backoff(WatchBackoff::with_bounds(
        Duration::from_millis(500),
        Duration::from_secs(10),
    ))
}

/// `(namespace, name, uid)` of a Service (`uid` empty when unset).
fn service_id(o: &LeanService) -> Option<(String, String, String)> {
    let m = &o.metadata;
    Some((
        m.namespace.clone()?,
        m.name.clone()?,
        m.uid.clone().unwrap_or_default(),
    ))
}

/// The index of one cluster as the watch loop feeds it: the source objects
/// ([`WatchIndex<K>`] for every [`SourceObject`]) and the Services
/// ([`WatchIndex<LeanService>`], stepped as the background of
/// the source watch). Everything that changed is published at once.
struct SourceIndex {
    params: SourceParams,
    index: Index,
    shared: Arc<ControllerState>,
    writer: WriterHandle,
    metrics: Metrics,
    events: Events,
    leader: Option<tokio_watch::Receiver<Leadership>>,
    naming: ObjectNaming,
    /// Objects of the (re)list being received.
    listed_objects: usize,
    list_started: Option<Instant>,
    /// The first endpoint (or slice) list is complete.
    first_list_done: bool,
    /// The first Service list is complete.
    services_listed: bool,
    /// Both first lists are complete and the index was published: changes
    /// reach the desired state and the writer from now on (see the module
    /// docs).
    published: bool,
    services: Option<Watch<LeanService>>,
    /// The Service (re)list being received: `(namespace, name, uid)` and
    /// what is kept of each.
    service_list: Vec<((String, String, String), ServiceInfo)>,
}

impl SourceIndex {
    fn new(source: Source) -> Self {
        let Source {
            params,
            client,
            index,
            shared,
            writer,
            metrics,
            events,
            leader,
            naming,
        } = source;
        SourceIndex {
            services: Some(service_watch(&client, &params)),
            params,
            index,
            shared,
            writer,
            metrics,
            events,
            leader,
            naming,
            listed_objects: 0,
            list_started: None,
            first_list_done: false,
            services_listed: false,
            published: false,
            service_list: Vec::new(),
        }
    }

    /// The endpoint watch delivered an event: it is served (a read lock
    /// when it was not failing).
    fn endpoint_watch_delivered(&self) {
        self.shared
            .watch_ok(&self.params.cluster, self.params.kind.as_str());
    }

    /// Feeds the skip counts of the last index operations to the metric.
    fn count_skipped(&mut self) {
        self.count_skipped_as(self.params.kind.as_str());
    }

    /// [`Self::count_skipped`] under the metric's `kind` label `kind` (the
    /// Service watch's skips, e.g. invalid annotations, are `Service`).
    fn count_skipped_as(&mut self, kind: &str) {
        for (reason, n) in self.index.take_skipped() {
            self.metrics
                .skipped(&self.params.cluster, kind, reason.as_str(), n);
        }
    }

    /// Turns the index's Service news (skipped annotations, refused
    /// ExternalNames: new or changed, never a relist's repeat) into Events on
    /// the Service. Only the leader emits: a standby's index sees the same
    /// Services, and two replicas must not report each one twice. `uid` is
    /// the Service's uid where the caller knows it (`kubectl describe
    /// service` lists only Events that carry it).
    fn report_service_news(&mut self, uid: &dyn Fn(&str, &str) -> Option<String>) {
        let news = self.index.take_service_news();
        let leading = self.leader.as_ref().is_none_or(|l| l.borrow().leading);
        if news.is_empty() || !leading {
            return;
        }
        for n in news {
            let key = ServiceKey::new(
                self.params.cluster.as_str(),
                n.namespace.as_str(),
                n.name.as_str(),
            );
            let regarding =
                crate::k8s::events::service_target(&key, uid(&n.namespace, &n.name), &self.naming);
            for (reason, message) in n.warnings {
                self.events.emit(
                    regarding.clone(),
                    crate::k8s::events::Report {
                        warning: true,
                        reason: reason.event_reason(),
                        action: "Read",
                        note: message,
                    },
                );
            }
        }
    }

    /// Hands `changed` to the desired state and the writer; nothing before
    /// both first lists are complete ([`Self::publish_first`] then
    /// publishes everything at once).
    fn publish(&mut self, changed: Vec<ServiceKey>, at: Instant) {
        self.count_skipped();
        if changed.is_empty() || !self.published {
            return;
        }
        for key in &changed {
            self.shared.set_desired_arc(key, self.index.get_arc(key));
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

    /// Once both first lists are complete: publishes every service of the
    /// index (nothing of this cluster was published before), marks the
    /// cluster listed and sends the writer its first-list barrier. Runs once.
    fn publish_first(&mut self, at: Instant) {
        if self.published {
            return;
        }
        let cluster = &self.params.cluster;
        match (self.first_list_done, self.services_listed) {
            (true, true) => {}
            (true, false) => {
                tracing::info!(cluster = %cluster, "endpoints listed; waiting for the Service list before publishing");
                return;
            }
            (false, _) => return,
        }
        self.published = true;
        let all: Vec<ServiceKey> = self.index.iter().map(|s| s.key.clone()).collect();
        tracing::info!(cluster = %cluster, services = all.len(), "endpoints and Services listed; publishing");
        self.publish(all, at);
        let cluster = self.params.cluster.clone();
        self.shared.update_cluster(&cluster, |c| c.listed = true);
        self.writer.synced(&cluster);
    }
}

impl<K: SourceObject> WatchIndex<K> for SourceIndex {
    fn init(&mut self) {
        self.index.begin_reset();
        self.listed_objects = 0;
        self.list_started = Some(Instant::now());
    }

    fn init_apply(&mut self, obj: K) {
        self.metrics.event(&self.params.cluster, "init_apply");
        K::reset_add(&mut self.index, &obj);
        self.listed_objects += 1;
        // Warnings of listed objects are logged (and counted) as they arrive.
        self.count_skipped();
    }

    fn init_done(&mut self) {
        let now = Instant::now();
        let cluster = self.params.cluster.clone();
        let changed = K::reset_finish(&mut self.index);
        if let Some(t) = self.list_started.take() {
            self.metrics
                .list_duration
                .get_or_create(&Metrics::cluster(&cluster))
                .observe(t.elapsed().as_secs_f64());
        }
        self.metrics.event(
            &cluster,
            if self.first_list_done {
                "relist"
            } else {
                "list"
            },
        );
        tracing::info!(cluster = %cluster, objects = std::mem::take(&mut self.listed_objects), services = self.index.len(), changed = changed.len(), "list complete");
        self.publish(changed, now);
        self.shared.update_cluster(&cluster, |c| {
            c.lists += 1;
        });
        self.shared.watch_ok(&cluster, self.params.kind.as_str());
        self.first_list_done = true;
        self.publish_first(now);
    }

    fn apply(&mut self, obj: K) {
        let now = Instant::now();
        self.endpoint_watch_delivered();
        self.metrics.event(&self.params.cluster, "apply");
        let changed = K::apply(&mut self.index, &obj);
        self.publish(changed, now);
    }

    fn delete(&mut self, obj: K) {
        let now = Instant::now();
        self.endpoint_watch_delivered();
        self.metrics.event(&self.params.cluster, "delete");
        let changed = K::delete(&mut self.index, &obj);
        self.publish(changed, now);
    }

    fn failed(&mut self, err: &watcher::Error) {
        let cluster = &self.params.cluster;
        self.metrics
            .watch_restarts
            .get_or_create(&Metrics::cluster(cluster))
            .inc();
        let kind = self.params.kind.as_str();
        tracing::warn!(cluster = %cluster, kind, error = %crate::k8s::redact::watch_detail(err), "watch failed; retrying with backoff");
        self.shared
            .watch_failed(cluster, kind, crate::k8s::redact::watch(err));
    }

    /// The Service watch, if any: one event of it.
    async fn background(&mut self) {
        let Some(services) = self.services.as_mut() else {
            return std::future::pending().await;
        };
        match services.next().await {
            Some(ev) => watch::dispatch::<LeanService, _>(self, ev),
            None => {
                // A watcher never ends; if it did before its first list,
                // the cluster would never be published: say so.
                if !self.services_listed {
                    tracing::error!(cluster = %self.params.cluster, "the Service watch ended before its first list; the cluster is not published");
                }
                self.services = None;
            }
        }
    }
}

/// The Services: a (re)list replaces them all, events set one.
impl WatchIndex<LeanService> for SourceIndex {
    fn init(&mut self) {
        self.service_list.clear();
    }

    fn init_apply(&mut self, obj: LeanService) {
        if let Some(id) = service_id(&obj) {
            self.service_list
                .push((id, ServiceInfo::from_service(&obj)));
        }
    }

    fn init_done(&mut self) {
        let now = Instant::now();
        let all = std::mem::take(&mut self.service_list);
        tracing::info!(cluster = %self.params.cluster, services = all.len(), "Services listed");
        self.shared.watch_ok(&self.params.cluster, SERVICE_WATCH);
        let mut uids = Vec::with_capacity(all.len());
        let mut infos = Vec::with_capacity(all.len());
        for ((ns, name, uid), info) in all {
            uids.push((ns.clone(), name.clone(), uid));
            infos.push((ns, name, info));
        }
        let mut changed = self.index.reset_services(infos);
        let by_name: std::collections::HashMap<(&str, &str), &str> = uids
            .iter()
            .map(|(ns, name, uid)| ((ns.as_str(), name.as_str()), uid.as_str()))
            .collect();
        self.report_service_news(&|ns, name| {
            by_name
                .get(&(ns, name))
                .filter(|u| !u.is_empty())
                .map(|u| (*u).to_string())
        });
        drop(by_name);
        if self.params.watch_services {
            changed.extend(self.index.reset_service_uids(uids));
        }
        changed.sort();
        changed.dedup();
        self.count_skipped_as("Service");
        self.publish(changed, now);
        self.services_listed = true;
        self.publish_first(now);
    }

    fn apply(&mut self, obj: LeanService) {
        let now = Instant::now();
        self.shared.watch_ok(&self.params.cluster, SERVICE_WATCH);
        let Some((ns, name, uid)) = service_id(&obj) else {
            return;
        };
        let mut changed = self
            .index
            .set_service(&ns, &name, Some(ServiceInfo::from_service(&obj)));
        let known = Some(uid.clone()).filter(|u| !u.is_empty());
        self.report_service_news(&|_, _| known.clone());
        if self.params.watch_services {
            changed.extend(self.index.set_service_uid(&ns, &name, Some(uid)));
        }
        changed.sort();
        changed.dedup();
        self.count_skipped_as("Service");
        self.publish(changed, now);
    }

    fn delete(&mut self, obj: LeanService) {
        let now = Instant::now();
        self.shared.watch_ok(&self.params.cluster, SERVICE_WATCH);
        let m = &obj.metadata;
        let (Some(ns), Some(name)) = (m.namespace.as_deref(), m.name.as_deref()) else {
            return;
        };
        let mut changed = self.index.set_service(ns, name, None);
        if self.params.watch_services {
            changed.extend(self.index.set_service_uid(ns, name, None));
        }
        changed.sort();
        changed.dedup();
        self.count_skipped_as("Service");
        self.publish(changed, now);
    }

    fn failed(&mut self, err: &watcher::Error) {
        let cluster = &self.params.cluster;
        let detail = crate::k8s::redact::watch_detail(err);
        if self.services_listed {
            tracing::warn!(cluster = %cluster, error = %detail, "Service watch failed; retrying with backoff (the Services last listed stay in use)");
        } else {
            tracing::warn!(cluster = %cluster, error = %detail, "Service watch failed before its first list; the cluster is not published (nothing written, not ready) until it succeeds; retrying with backoff");
        }
        self.shared
            .watch_failed(cluster, SERVICE_WATCH, crate::k8s::redact::watch(err));
    }
}

#[cfg(test)]
mod tests;
