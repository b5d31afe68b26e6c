//! The pure per-cluster index, in the style of linkerd's policy-controller:
//! watch events go in, the keys whose DESIRED nodes changed come out.
//!
//! ```text
//!  apply_* / delete_* / reset_*  ──▶  Index  ──▶  Vec<ServiceKey> (changed)
//!                                       │
//!                                       └── get(key) -> Some(desired) | None (delete the object)
//! ```
//!
//! * Endpoints: one object per Service, converted with
//!   [`from_endpoints`].
//! * EndpointSlices: tracked per slice name (endpoints move between slices,
//!   and a slice can even be relabelled to another Service); every change
//!   re-merges all slices of the affected Service(s), in slice-name order. A
//!   slice without the `kubernetes.io/service-name` label is skipped with a
//!   warning.
//! * A change is reported only when the resulting [`ServiceNodes`] differs
//!   (nodes, version or owner UID), so annotation edits, `resourceVersion`
//!   bumps or a not-ready endpoint flapping report nothing.
//! * `reset_*` (after a relist) replaces the whole state: services that vanished
//!   are reported (and `get` returns `None`), unchanged ones are not.
//! * A relist costs O(changed objects) of conversion, not O(all): the API
//!   server bumps `metadata.resourceVersion` on every write, so a listed object
//!   whose (non-empty) resourceVersion equals the one the index holds for the
//!   same object is unchanged. Its kept contribution (slice) or desired
//!   service (Endpoints) is reused as is (no conversion, no new hash), and at
//!   the finish only the services with an added, removed, modified or
//!   relabelled slice (or whose Service UID changed meanwhile) are merged
//!   again. Objects without a resourceVersion are always converted. The
//!   result is exactly that of converting everything again (unit-tested
//!   against a fresh index): after a 410 Gone, the relist of 10,000 slices
//!   with 10 changed recomputes 10 services, not 10,000.
//! * The namespace filter and the label selector are applied here too; an
//!   object that stops matching is treated like a delete.
//! * Owner UID: from the object's ownerReferences of kind Service, else from
//!   [`Index::set_service_uid`] / [`Index::reset_service_uids`] (the runtime
//!   feeds Service UIDs from its Service watch in Endpoints mode: Endpoints
//!   objects carry no ownerReferences).
//! * Services ([`Index::set_service`] / [`Index::reset_services`], kept as a
//!   small [`ServiceInfo`], never the object): their ports give each desired
//!   state its [`crate::service::PortExtras`] (Service-port aliases,
//!   appProtocols, [`Index::unresolved_ports`]); `kubediscovery.io/weight`
//!   sets every node's weight; `kubediscovery.io/export` (and the opt-in
//!   mode) withholds a service: its desired state is kept aside, so exporting
//!   it again needs no new list; an allowed ExternalName Service (opt-in)
//!   is its own desired state, one node per port, and its endpoint objects
//!   are ignored. Invalid annotations and refused ExternalNames are warned
//!   and counted like bad endpoint data. A Service that is unknown means no
//!   owner UID and no extras; it holds a service back only in opt-in mode.
//!
//! Memory: a slice is kept as its [`SliceContribution`] (validated ports,
//! the first valid address and conditions of each endpoint packed into one
//! text block, its warnings, the owner UID), not as the object; the maps a
//! relist builds get full B-tree leaves (`compacted`); every desired
//! [`ServiceNodes`] is held in an [`Arc`] so the runtime's `ControllerState`
//! can hold the same allocation ([`Index::get_arc`]) instead of a second
//! copy; the node total is kept as a running sum ([`Index::node_count`] is
//! O(1)).
//!
//! A relist can be fed one object at a time ([`Index::begin_reset`],
//! [`Index::reset_add_endpoints`] / [`Index::reset_add_slice`], then
//! [`Index::finish_reset_endpoints`] / [`Index::finish_reset_slices`]): each
//! object is reduced as it arrives, so the runtime never buffers the raw list.
//! Until the finish, the current state stays as it was (reads and Service UID
//! updates see the old state); `reset_endpoints` / `reset_slices` are the same
//! over a slice of objects. Conversion warnings are
//! logged once per object and change (not on every event, not again on a
//! relist that finds the same bad object) and can be read with
//! [`Index::warnings`]. Each logged warning is also counted by
//! [`SkipReason`]; [`Index::take_skipped`] drains those counts (the runtime's
//! `kube_discovery_source_skipped_total` metric).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use compact_str::CompactString;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use litemap::LiteMap;

use crate::convert::{
    ConvertOptions, MergeState, Patch, SkipReason, SliceContribution, from_endpoints, merge_slices,
    owner_service_uid,
};
use crate::filter::{LabelSelector, NamespaceFilter};
use crate::lean::{AsLeanEndpoints, AsLeanSlice, LeanEndpointSlice, LeanEndpoints};
use crate::model::{PortExtras, PortMap, ServiceKey, ServiceNodes, SourceKind};
use crate::service::{ServiceInfo, port_extras};
use crate::shards::Buckets;

/// A Service whose annotations or ExternalName were skipped, as news
/// ([`Index::take_service_news`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceNews {
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name.
    pub name: String,
    /// What was skipped, each with its reason, naming the annotation or field.
    pub warnings: Vec<(SkipReason, String)>,
}

/// The slice names of one service, in name order (the merge order): a sorted
/// vector instead of a `BTreeSet`, whose first insert allocated a ~270-byte
/// B-tree leaf per service for what is usually one name. Names are
/// [`CompactString`]s, like [`SliceId`]'s parts.
type SliceNames = LiteMap<CompactString, ()>;

/// An EndpointSlice's `(namespace, name)`: [`CompactString`]s, so the index's
/// two copies of a slice name of up to 24 bytes (here and in [`SliceNames`])
/// need no heap block each (issue 19, item 1: two blocks per slice, ~6 MB at
/// 100,000 slices).
type SliceId = (CompactString, CompactString);

/// From this many slices on, a Service's merge is kept as a [`MergeState`]
/// and a slice change updates it (O(slice)) instead of merging every slice
/// again (O(Service)); below half of it the state is dropped again. A
/// Service of a few slices merges in microseconds and is the usual case:
/// it keeps no second copy of its hosts (issue 19, items 1 and 2).
pub const INCREMENTAL_MIN_SLICES: usize = 16;

/// The incremental merge of one big Service (see [`INCREMENTAL_MIN_SLICES`]).
#[derive(Debug, Clone)]
struct BigService {
    merge: MergeState,
    /// The owner UID its slices carry (the first in name order that has one).
    obj_owner: Option<String>,
    /// The service's previous value and the patch that turned it into the
    /// current one ([`Index::update_incrementally`]).
    ///
    /// Why: the runtime's `ControllerState` holds the current value
    /// ([`Index::get_arc`]) until the index hands it the next one, so a
    /// change met a shared value and `Arc::make_mut` copied every node
    /// (about 1 ms of the 2 ms one change may cost at 100,000 endpoints,
    /// issue 19 item 2). Once the runtime has taken the current value, the
    /// previous one is ours alone again: replaying its patch brings it up to
    /// date in O(change), it takes the next change and becomes current. The
    /// price is a second copy of a big service's node lists (and buckets).
    spare: Option<(Arc<ServiceNodes>, Patch)>,
}

/// Label linking an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Desired state of one cluster. See the module docs.
#[derive(Debug, Clone)]
pub struct Index {
    cluster: String,
    source: SourceKind,
    opts: ConvertOptions,
    filter: NamespaceFilter,
    labels: LabelSelector,
    services: BTreeMap<ServiceKey, Arc<ServiceNodes>>,
    /// Desired states of services their Service keeps unpublished
    /// (`kubediscovery.io/export`, `kube_discovery.export: opt-in`): kept so
    /// that exporting them again needs no new list (Endpoints mode keeps no
    /// other copy of the nodes).
    withheld: BTreeMap<ServiceKey, Arc<ServiceNodes>>,
    /// Services whose desired state comes from an allowed ExternalName
    /// Service, not from endpoint objects (which are then ignored).
    external: BTreeSet<ServiceKey>,
    /// Sum of `node_count` over `services`.
    node_total: usize,
    /// Endpoints mode: what the index remembers of each selected Endpoints
    /// object (owner UID found on it, resourceVersion).
    endpoints_owner: BTreeMap<ServiceKey, EndpointsMeta>,
    /// Slices mode: (namespace, slice name) -> what the slice contributes
    /// (shared with a pending relist that finds the slice unchanged).
    slices: BTreeMap<SliceId, Arc<StoredSlice>>,
    /// Slices mode: service -> its slice names.
    by_service: BTreeMap<ServiceKey, SliceNames>,
    /// Slices mode: the incremental merge of each Service with many slices
    /// ([`INCREMENTAL_MIN_SLICES`]); always the merge of exactly its slices
    /// in `slices` (every path that changes them updates or drops it).
    big: BTreeMap<ServiceKey, BigService>,
    /// UIDs of Services learned via `set_service_uid`.
    service_uids: BTreeMap<(String, String), String>,
    /// What is kept of each Service (its ports), learned via `set_service`.
    service_info: BTreeMap<(String, String), ServiceInfo>,
    /// Current warnings per object ("Kind ns/name").
    warnings: BTreeMap<String, Vec<String>>,
    /// Logged warnings per reason, not yet taken by [`Index::take_skipped`].
    skipped: BTreeMap<SkipReason, u64>,
    /// Services whose warnings were logged (new or changed), not yet taken
    /// by [`Index::take_service_news`].
    service_news: Vec<ServiceNews>,
    /// A relist being fed object by object (see the module docs).
    reset: Option<PendingReset>,
    /// Test-only: the conversion work done so far.
    #[cfg(test)]
    work: std::cell::Cell<Work>,
}

/// Test-only: objects converted and services merged, so tests can check
/// that a relist does O(changed) work.
#[cfg(test)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Work {
    converted: usize,
    merged: usize,
}

/// One EndpointSlice as the index keeps it (one per slice for as long as
/// it lives; its texts are `CompactString`s, inline up to 24 bytes).
#[derive(Debug, Clone)]
struct StoredSlice {
    service: ServiceKey,
    owner_uid: Option<CompactString>,
    /// `metadata.resourceVersion` of the object this was built from.
    resource_version: Option<CompactString>,
    contribution: SliceContribution,
}

impl StoredSlice {
    /// The owner UID the slice carries.
    fn owner(&self) -> Option<String> {
        self.owner_uid.as_ref().map(CompactString::to_string)
    }
}

/// What the index remembers of one selected Endpoints object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct EndpointsMeta {
    /// Owner UID from the object's ownerReferences.
    owner: Option<String>,
    /// `metadata.resourceVersion` of the object.
    resource_version: Option<Box<str>>,
}

/// The object's resourceVersion, `None` when absent or empty (never reused).
fn resource_version(meta: &ObjectMeta) -> Option<&str> {
    meta.resource_version.as_deref().filter(|rv| !rv.is_empty())
}

/// Whether the kept `stored` resourceVersion proves the object unchanged.
fn same_version(stored: Option<&str>, meta: &ObjectMeta) -> bool {
    matches!((stored, resource_version(meta)), (Some(a), Some(b)) if a == b)
}

/// Sets (`Some`) or removes (`None`) the entry `id`; whether it changed.
fn set_entry<V: PartialEq>(
    map: &mut BTreeMap<(String, String), V>,
    id: &(String, String),
    value: Option<V>,
) -> bool {
    match value {
        Some(v) if map.get(id) == Some(&v) => false,
        Some(v) => {
            map.insert(id.clone(), v);
            true
        }
        None => map.remove(id).is_some(),
    }
}

/// The ids whose value differs between `old` and `new` (changed, added or
/// removed): what a Service relist touched.
fn changed_ids<V: PartialEq>(
    old: &BTreeMap<(String, String), V>,
    new: &BTreeMap<(String, String), V>,
) -> BTreeSet<(String, String)> {
    let differs = |a: &BTreeMap<(String, String), V>, b: &BTreeMap<(String, String), V>| {
        a.iter()
            .filter(|(id, v)| b.get(*id) != Some(*v))
            .map(|(id, _)| id.clone())
            .collect::<Vec<_>>()
    };
    differs(old, new)
        .into_iter()
        .chain(differs(new, old))
        .collect()
}

/// `map` with full B-tree leaves, for the maps a relist builds or fills.
///
/// Why (issue 19, item 1): a `BTreeMap` filled one insert at a time in key
/// order, as a list arrives, splits every full leaf in the middle and so
/// ends with leaves about half full: heaptrack counted ~6 entries per
/// 11-entry leaf in the index's per-slice and per-service maps, ~440 bytes
/// per service over three maps. Collecting a sorted iterator bulk-builds
/// full leaves instead (the standard library sorts the already sorted
/// entries in one pass). O(n) moves of the map's entries, no conversion, on
/// a relist that is O(n) already; later single inserts split as before.
fn compacted<K: Ord, V>(map: BTreeMap<K, V>) -> BTreeMap<K, V> {
    map.into_iter().collect()
}

/// The next state, built while a relist arrives.
#[derive(Debug, Clone, Default)]
struct PendingReset {
    /// Warning keys ("Kind ns/name") of the listed objects.
    present: BTreeSet<String>,
    /// Endpoints mode: the desired services.
    desired: BTreeMap<ServiceKey, Arc<ServiceNodes>>,
    /// Endpoints mode: what is remembered of the listed objects.
    endpoints_owner: BTreeMap<ServiceKey, EndpointsMeta>,
    /// Slices mode (an unchanged slice shares the current state's value).
    slices: BTreeMap<SliceId, Arc<StoredSlice>>,
    by_service: BTreeMap<ServiceKey, SliceNames>,
    /// Services whose known UID or ports changed while the relist was arriving.
    uid_touched: BTreeSet<(String, String)>,
}

impl Index {
    /// An empty index for `cluster` (`""` in single-cluster mode).
    pub fn new(
        cluster: String,
        source: SourceKind,
        opts: ConvertOptions,
        filter: NamespaceFilter,
    ) -> Self {
        Self {
            cluster,
            source,
            opts,
            filter,
            labels: LabelSelector::default(),
            services: BTreeMap::new(),
            withheld: BTreeMap::new(),
            external: BTreeSet::new(),
            node_total: 0,
            endpoints_owner: BTreeMap::new(),
            slices: BTreeMap::new(),
            by_service: BTreeMap::new(),
            big: BTreeMap::new(),
            service_uids: BTreeMap::new(),
            service_info: BTreeMap::new(),
            warnings: BTreeMap::new(),
            skipped: BTreeMap::new(),
            service_news: Vec::new(),
            reset: None,
            #[cfg(test)]
            work: std::cell::Cell::default(),
        }
    }

    /// Also filter by `label_selector` client-side.
    pub fn with_label_selector(mut self, labels: LabelSelector) -> Self {
        self.labels = labels;
        self
    }

    /// The cluster id.
    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// The configured source kind.
    pub fn source(&self) -> SourceKind {
        self.source
    }

    /// The conversion options.
    pub fn options(&self) -> &ConvertOptions {
        &self.opts
    }

    fn selected(&self, meta: &ObjectMeta) -> bool {
        let ns = meta.namespace.as_deref().unwrap_or("");
        let empty = BTreeMap::new();
        self.filter.matches(ns) && self.labels.matches(meta.labels.as_ref().unwrap_or(&empty))
    }

    #[cfg(test)]
    fn note(&self, f: impl FnOnce(&mut Work)) {
        let mut w = self.work.get();
        f(&mut w);
        self.work.set(w);
    }

    /// Test-only: the work done since the last call.
    #[cfg(test)]
    fn take_work(&self) -> Work {
        self.work.take()
    }

    fn key(&self, ns: &str, name: &str) -> ServiceKey {
        ServiceKey::new(&self.cluster, ns, name)
    }

    /// Records the current warnings of `object`; they are logged and counted
    /// only when they differ from the ones recorded before. `true` when they
    /// were logged.
    fn set_warnings(
        &mut self,
        object: String,
        warnings: Vec<String>,
        skipped: &BTreeMap<SkipReason, u64>,
    ) -> bool {
        if warnings.is_empty() {
            self.warnings.remove(&object);
            return false;
        }
        if self.warnings.get(&object) == Some(&warnings) {
            return false;
        }
        for w in &warnings {
            tracing::warn!(cluster = %self.cluster, "{w}");
        }
        self.count_skipped(skipped);
        self.warnings.insert(object, warnings);
        true
    }

    fn count_skipped(&mut self, skipped: &BTreeMap<SkipReason, u64>) {
        for (reason, n) in skipped {
            let c = self.skipped.entry(*reason).or_insert(0);
            *c = c.saturating_add(*n);
        }
    }

    fn skipped_nameless(&mut self, kind: &str, ns: &str) {
        tracing::warn!(cluster = %self.cluster, namespace = ns, "{kind} without metadata.name; skipped");
        self.count_skipped(&BTreeMap::from([(SkipReason::MissingName, 1)]));
    }

    /// Whether `key` is published: its Service's export annotation, else
    /// the export mode (an unknown Service counts as unannotated).
    fn exported(&self, key: &ServiceKey) -> bool {
        self.service_info
            .get(&(key.namespace.to_string(), key.name.to_string()))
            .map_or(!self.opts.export_opt_in, |i| {
                i.exported(self.opts.export_opt_in)
            })
    }

    /// The desired state of `key`, published or withheld.
    fn current(&self, key: &ServiceKey) -> Option<&Arc<ServiceNodes>> {
        self.services.get(key).or_else(|| self.withheld.get(key))
    }

    /// Stores `new` (or removes the key when `None`); returns whether the
    /// published state changed. A value its Service keeps unpublished is
    /// stored as withheld (and its published object removed).
    fn store(&mut self, key: &ServiceKey, new: Option<ServiceNodes>) -> bool {
        let new = match new {
            Some(n) if !self.exported(key) => {
                self.withheld.insert(key.clone(), Arc::new(n));
                None
            }
            other => {
                self.withheld.remove(key);
                other
            }
        };
        match new {
            Some(n) => {
                if self.services.get(key).is_some_and(|old| **old == n) {
                    false
                } else {
                    self.node_total = self.node_total.saturating_add(n.node_count());
                    if let Some(old) = self.services.insert(key.clone(), Arc::new(n)) {
                        self.node_total = self.node_total.saturating_sub(old.node_count());
                    }
                    true
                }
            }
            None => match self.services.remove(key) {
                Some(old) => {
                    self.node_total = self.node_total.saturating_sub(old.node_count());
                    true
                }
                None => false,
            },
        }
    }

    fn owner(&self, key: &ServiceKey, from_object: Option<String>) -> Option<String> {
        from_object.or_else(|| {
            self.service_uids
                .get(&(key.namespace.to_string(), key.name.to_string()))
                .cloned()
        })
    }

    /// Why the ExternalName host of `info` is not published (`None`: it is,
    /// or the Service is no ExternalName, or ExternalName is disabled).
    fn external_refusal(&self, object: &str, info: &ServiceInfo) -> Option<(SkipReason, String)> {
        let (Some(allow), Some(host)) = (&self.opts.external_name, &info.external_name) else {
            return None;
        };
        let bare = host.strip_suffix('.').unwrap_or(host);
        if !k8s_syntax::is_dns_name(bare) {
            return Some((
                SkipReason::InvalidExternalName,
                format!("{object}: spec.externalName {host:?} is not a DNS name; Service skipped"),
            ));
        }
        if !allow.iter().any(|r| r.is_match(host)) {
            return Some((
                SkipReason::ExternalNameRefused,
                format!(
                    "{object}: spec.externalName {host:?} matches no kube_discovery.external_name.allow regex; Service skipped"
                ),
            ));
        }
        None
    }

    /// The desired state of an allowed ExternalName Service: one node per
    /// Service port, its host the external name and its port the Service
    /// port (what a client of the Service connects to). `None` when `key` is
    /// no such Service.
    fn external_desired(&self, key: &ServiceKey) -> Option<ServiceNodes> {
        let info = self
            .service_info
            .get(&(key.namespace.to_string(), key.name.to_string()))?;
        let host = info.external_name.as_ref()?;
        self.opts.external_name.as_ref()?;
        if self.external_refusal("", info).is_some() {
            return None;
        }
        let ports: PortMap = info
            .ports
            .iter()
            .filter(|p| (1..=65535).contains(&p.port))
            .map(|p| {
                let key = crate::convert::port_key(Some(&p.name), p.port);
                (key, vec![crate::model::Node::new(host.clone(), p.port, 0)])
            })
            .collect();
        Some(self.build(key.clone(), self.source, ports, None, Vec::new()))
    }

    /// The desired state of `key` from its endpoints' `ports` and the
    /// warnings of what was `skipped` converting them: with the
    /// Service-derived extras (aliases, appProtocols) when the Service is
    /// known. One hash of the service for its version.
    fn build(
        &self,
        key: ServiceKey,
        source: SourceKind,
        ports: PortMap,
        owner: Option<String>,
        skipped: Vec<String>,
    ) -> ServiceNodes {
        let (ports, extras) = self.build_parts(&key, ports);
        ServiceNodes::with_buckets(key, source, ports, owner, extras, skipped, None)
    }

    /// The weight every node of `key` gets: its Service's annotation, else
    /// `default_weight`.
    fn weight(&self, key: &ServiceKey) -> u32 {
        self.service_info
            .get(&(key.namespace.to_string(), key.name.to_string()))
            .and_then(|i| i.weight)
            .unwrap_or(self.opts.default_weight)
    }

    /// The extras of `key` for `ports` (empty when its Service is unknown).
    fn extras(&self, key: &ServiceKey, ports: &PortMap) -> PortExtras {
        self.service_info
            .get(&(key.namespace.to_string(), key.name.to_string()))
            .map(|i| port_extras(i, ports, self.opts.service_port_aliases))
            .unwrap_or_default()
    }

    /// `ports` with [`Index::weight`] set, and the extras of `key`.
    fn build_parts(&self, key: &ServiceKey, ports: PortMap) -> (PortMap, PortExtras) {
        let mut ports = ports;
        // Every node has the weight of the Service's annotation, else
        // `default_weight` (what the converters give; so rebuilding from a
        // kept value after the annotation went away restores it).
        let weight = self.weight(key);
        for node in ports.values_mut().flatten() {
            // `drain_terminating: always` publishes draining nodes with
            // weight 0 (no new traffic); the annotation does not lift that.
            let drained = self.opts.drain_terminating == crate::convert::Drain::Always
                && node.draining == Some(true);
            if !drained {
                node.weight = weight;
            }
        }
        let extras = self.extras(key, &ports);
        (ports, extras)
    }

    // ----- Endpoints -----

    /// The desired state of one Endpoints object; its owner UID and
    /// resourceVersion are recorded in `owners` (the live map, or a pending
    /// relist's).
    fn endpoints_desired(
        &mut self,
        ep: &LeanEndpoints,
        owners: &mut BTreeMap<ServiceKey, EndpointsMeta>,
    ) -> Option<(ServiceKey, Option<ServiceNodes>)> {
        let ns = ep.metadata.namespace.as_deref().unwrap_or("");
        let Some(name) = ep.metadata.name.as_deref() else {
            self.skipped_nameless("Endpoints", ns);
            return None;
        };
        let object = format!("Endpoints {ns}/{name}");
        if !k8s_syntax::is_dns1035_label(name) {
            let warning = format!(
                "{object}: the name is not a valid Service name (a DNS-1035 label), so no Service owns it; skipped"
            );
            self.set_warnings(
                object,
                vec![warning],
                &BTreeMap::from([(SkipReason::InvalidServiceName, 1)]),
            );
            return None;
        }
        let key = self.key(ns, name);
        if !self.selected(&ep.metadata) {
            self.set_warnings(object, Vec::new(), &BTreeMap::new());
            owners.remove(&key);
            return Some((key, None));
        }
        #[cfg(test)]
        self.note(|w| w.converted += 1);
        let conv = from_endpoints(ep, &self.opts);
        let skipped = conv.warnings.clone();
        self.set_warnings(object, conv.warnings, &conv.skipped);
        let obj_owner = owner_service_uid(&ep.metadata);
        owners.insert(
            key.clone(),
            EndpointsMeta {
                owner: obj_owner.clone(),
                resource_version: resource_version(&ep.metadata).map(Box::from),
            },
        );
        let owner = self.owner(&key, obj_owner);
        Some((
            key.clone(),
            Some(self.build(key, SourceKind::Endpoints, conv.ports, owner, skipped)),
        ))
    }

    /// An Endpoints object was added or modified.
    pub fn apply_endpoints(&mut self, ep: &(impl AsLeanEndpoints + ?Sized)) -> Vec<ServiceKey> {
        let ep = ep.lean();
        let mut owners = std::mem::take(&mut self.endpoints_owner);
        let desired = self.endpoints_desired(&ep, &mut owners);
        self.endpoints_owner = owners;
        match desired {
            Some((key, _)) if self.external.contains(&key) => Vec::new(),
            Some((key, new)) => {
                if self.store(&key, new) {
                    vec![key]
                } else {
                    Vec::new()
                }
            }
            None => Vec::new(),
        }
    }

    /// An Endpoints object was deleted.
    pub fn delete_endpoints(&mut self, ep: &(impl Resource + ?Sized)) -> Vec<ServiceKey> {
        let ns = ep.meta().namespace.as_deref().unwrap_or("");
        let Some(name) = ep.meta().name.as_deref() else {
            return Vec::new();
        };
        self.warnings.remove(&format!("Endpoints {ns}/{name}"));
        if !k8s_syntax::is_dns1035_label(name) {
            // Never indexed (see `endpoints_desired`); its key may name
            // another service's shard.
            return Vec::new();
        }
        let key = self.key(ns, name);
        self.endpoints_owner.remove(&key);
        if self.external.contains(&key) {
            return Vec::new();
        }
        if self.store(&key, None) {
            vec![key]
        } else {
            Vec::new()
        }
    }

    /// A relist of all Endpoints: afterwards the index holds exactly `all`.
    /// Returns the keys that changed or vanished (unchanged ones are not reported).
    pub fn reset_endpoints<E: AsLeanEndpoints>(&mut self, all: &[E]) -> Vec<ServiceKey> {
        self.begin_reset();
        for ep in all {
            self.reset_add_endpoints(ep);
        }
        self.finish_reset_endpoints()
    }

    /// Starts a relist (kube-runtime's `Event::Init`); drops a relist that
    /// was being fed and never finished.
    pub fn begin_reset(&mut self) {
        self.reset = Some(PendingReset::default());
    }

    /// One Endpoints object of the relist started by [`Index::begin_reset`]
    /// (started implicitly if it was not).
    pub fn reset_add_endpoints(&mut self, ep: &(impl AsLeanEndpoints + ?Sized)) {
        let ep = ep.lean();
        let mut p = self.reset.take().unwrap_or_default();
        if let Some(name) = ep.metadata.name.as_deref() {
            let ns = ep.metadata.namespace.as_deref().unwrap_or("");
            p.present.insert(format!("Endpoints {ns}/{name}"));
            // The very object the index holds (same resourceVersion): its
            // desired state, owner and warnings stay as they are.
            let key = self.key(ns, name);
            if let (Some(meta), Some(current)) =
                (self.endpoints_owner.get(&key), self.current(&key))
                && same_version(meta.resource_version.as_deref(), &ep.metadata)
            {
                p.endpoints_owner.insert(key.clone(), meta.clone());
                p.desired.insert(key, Arc::clone(current));
                self.reset = Some(p);
                return;
            }
        }
        if let Some((key, Some(nodes))) = self.endpoints_desired(&ep, &mut p.endpoints_owner) {
            // An unchanged service keeps sharing its current allocation.
            let value = match self.current(&key) {
                Some(old) if **old == nodes => Arc::clone(old),
                _ => Arc::new(nodes),
            };
            p.desired.insert(key, value);
        }
        self.reset = Some(p);
    }

    /// Ends an Endpoints relist: afterwards the index holds exactly the objects
    /// added since [`Index::begin_reset`] (none added: empty). Returns the
    /// keys that changed or vanished.
    pub fn finish_reset_endpoints(&mut self) -> Vec<ServiceKey> {
        let mut p = self.reset.take().unwrap_or_default();
        // A Service UID that changed while the list arrived: the live state
        // already has it (`set_service_uid`), the listed desired states that
        // were built before it must get it too.
        for (ns, name) in &p.uid_touched {
            let key = self.key(ns, name);
            let Some(desired) = p.desired.get_mut(&key) else {
                continue;
            };
            let obj_owner = p.endpoints_owner.get(&key).and_then(|m| m.owner.clone());
            let owner = self.owner(&key, obj_owner);
            let next = self.build(
                key,
                desired.source,
                desired.ports.clone(),
                owner,
                desired.skipped.clone(),
            );
            if **desired != next {
                *desired = Arc::new(next);
            }
        }
        self.endpoints_owner = compacted(p.endpoints_owner);
        // Warnings of objects still present were compared (not re-logged when
        // unchanged); those of vanished objects are dropped.
        self.warnings
            .retain(|k, _| !k.starts_with("Endpoints ") || p.present.contains(k));
        self.replace_all(p.desired)
    }

    /// Makes `desired` the state; returns the keys that changed or vanished.
    /// An unchanged service keeps the current allocation (the one the
    /// runtime's `ControllerState` holds).
    fn replace_all(
        &mut self,
        mut desired: BTreeMap<ServiceKey, Arc<ServiceNodes>>,
    ) -> Vec<ServiceKey> {
        // ExternalName services do not come from the listed objects.
        for k in &self.external {
            if let Some(current) = self.current(k) {
                desired.insert(k.clone(), Arc::clone(current));
            }
        }
        let (mut desired, withheld): (BTreeMap<_, _>, BTreeMap<_, _>) =
            desired.into_iter().partition(|(k, _)| self.exported(k));
        self.withheld = withheld;
        let mut changed: BTreeSet<ServiceKey> = self
            .services
            .keys()
            .filter(|k| !desired.contains_key(*k))
            .cloned()
            .collect();
        for (k, v) in &mut desired {
            match self.services.get(k) {
                Some(current) if current == v => *v = Arc::clone(current),
                _ => {
                    changed.insert(k.clone());
                }
            }
        }
        self.services = compacted(desired);
        self.node_total = self.services.values().map(|s| s.node_count()).sum();
        changed.into_iter().collect()
    }

    // ----- EndpointSlices -----

    /// What the index keeps of a slice of service `service`.
    fn stored_slice(&self, service: ServiceKey, s: &LeanEndpointSlice) -> Arc<StoredSlice> {
        #[cfg(test)]
        self.note(|w| w.converted += 1);
        Arc::new(StoredSlice {
            service,
            owner_uid: owner_service_uid(&s.metadata).map(CompactString::from),
            resource_version: resource_version(&s.metadata).map(CompactString::from),
            contribution: SliceContribution::new(s, &self.opts),
        })
    }

    /// Where a slice belongs: `Err(())` when it has no name; `Ok(None)` when it
    /// is not selected or has no service-name label (warned).
    fn slice_target(
        &mut self,
        s: &LeanEndpointSlice,
    ) -> Result<(CompactString, CompactString, Option<ServiceKey>), ()> {
        let ns = CompactString::from(s.metadata.namespace.as_deref().unwrap_or_default());
        let Some(name) = s.metadata.name.as_deref().map(CompactString::from) else {
            self.skipped_nameless("EndpointSlice", &ns);
            return Err(());
        };
        let object = format!("EndpointSlice {ns}/{name}");
        let service = s
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SERVICE_NAME_LABEL))
            .filter(|v| !v.is_empty())
            .cloned();
        let Some(service) = service else {
            let warning = format!("{object}: no {SERVICE_NAME_LABEL} label; slice skipped");
            self.set_warnings(
                object,
                vec![warning],
                &BTreeMap::from([(SkipReason::MissingServiceLabel, 1)]),
            );
            return Ok((ns, name, None));
        };
        if !k8s_syntax::is_dns1035_label(&service) {
            let warning = format!(
                "{object}: {SERVICE_NAME_LABEL}={service:?} is not a valid Service name (a DNS-1035 label); slice skipped"
            );
            self.set_warnings(
                object,
                vec![warning],
                &BTreeMap::from([(SkipReason::InvalidServiceName, 1)]),
            );
            return Ok((ns, name, None));
        }
        // Any earlier "no label" warning of this slice is obsolete now.
        self.set_warnings(object, Vec::new(), &BTreeMap::new());
        if !self.selected(&s.metadata) {
            return Ok((ns, name, None));
        }
        let key = self.key(&ns, &service);
        Ok((ns, name, Some(key)))
    }

    fn recompute_service(&mut self, key: &ServiceKey) -> bool {
        // Rebuilt below when still big.
        self.big.remove(key);
        if self.external.contains(key) {
            return false;
        }
        let names = self.by_service.get(key).cloned().unwrap_or_default();
        if names.is_empty() {
            self.by_service.remove(key);
            self.warnings.remove(&merge_warnings_key(key));
            return self.store(key, None);
        }
        let slices: Vec<(&CompactString, &Arc<StoredSlice>)> = names
            .keys()
            .filter_map(|n| Some((n, self.slices.get(&(key.namespace.clone(), n.clone()))?)))
            .collect();
        #[cfg(test)]
        self.note(|w| w.merged += 1);
        let conv = merge_slices(slices.iter().map(|(_, s)| &s.contribution), &self.opts);
        let obj_owner = slices.iter().find_map(|(_, s)| s.owner());
        let owner = self.owner(key, obj_owner.clone());
        let (ports, extras) = self.build_parts(key, conv.ports);
        let big = (slices.len() >= INCREMENTAL_MIN_SLICES).then(|| BigService {
            merge: MergeState::new(
                &self.opts,
                self.weight(key),
                slices.iter().map(|(n, s)| (n.as_str(), &s.contribution)),
            ),
            obj_owner,
            spare: None,
        });
        // Kept next to the nodes of a big Service (its version, the writer's
        // shard count and versions), updated per changed node below.
        let buckets = big.as_ref().map(|_| Buckets::of(&ports));
        let nodes = ServiceNodes::with_buckets(
            key.clone(),
            SourceKind::EndpointSlice,
            ports,
            owner,
            extras,
            conv.warnings.clone(),
            buckets,
        );
        if let Some(big) = big {
            self.big.insert(key.clone(), big);
        }
        self.set_warnings(merge_warnings_key(key), conv.warnings, &conv.skipped);
        self.store(key, Some(nodes))
    }

    fn untrack_slice(&mut self, ns: &str, name: &str) -> Option<Arc<StoredSlice>> {
        let old = self.slices.remove(&(ns.into(), name.into()))?;
        if let Some(set) = self.by_service.get_mut(&old.service) {
            set.remove(name);
        }
        Some(old)
    }

    /// Service `key` after its slice `name` changed from `old` to `new`
    /// (each `Some` only when it belongs to `key`): the incremental update
    /// when `key` keeps a [`MergeState`], else the full merge. Whether the
    /// published state changed.
    fn slice_changed(
        &mut self,
        key: &ServiceKey,
        name: &str,
        old: Option<&Arc<StoredSlice>>,
        new: Option<&Arc<StoredSlice>>,
    ) -> bool {
        match self.update_incrementally(key, name, old, new) {
            Some(changed) => changed,
            None => self.recompute_service(key),
        }
    }

    /// The incremental path of [`Index::slice_changed`]: `None` when `key`
    /// has no [`MergeState`] (or no longer qualifies), so the caller merges
    /// in full. Gives what [`Index::recompute_service`] would (unit-tested
    /// against it): nodes, owner, extras, skipped data, warnings, version.
    fn update_incrementally(
        &mut self,
        key: &ServiceKey,
        name: &str,
        old: Option<&Arc<StoredSlice>>,
        new: Option<&Arc<StoredSlice>>,
    ) -> Option<bool> {
        let slices = self.by_service.get(key).map_or(0, LiteMap::len);
        if self.external.contains(key) || slices < INCREMENTAL_MIN_SLICES / 2 {
            self.big.remove(key);
            return None;
        }
        let mut big = self.big.remove(key)?;
        let current = self.current(key)?;
        let patch = big.merge.replace_slice(
            name,
            old.map(|s| &s.contribution),
            new.map(|s| &s.contribution),
        );
        // The owner and the warnings come from all slices in name order;
        // a slice change that does not touch its own can only keep them.
        let slice_list = |me: &Self| -> Vec<Arc<StoredSlice>> {
            me.by_service
                .get(key)
                .into_iter()
                .flat_map(LiteMap::keys)
                .filter_map(|n| me.slices.get(&(key.namespace.clone(), n.clone())))
                .cloned()
                .collect()
        };
        if old.and_then(|s| s.owner_uid.as_ref()) != new.and_then(|s| s.owner_uid.as_ref()) {
            big.obj_owner = slice_list(self).iter().find_map(|s| s.owner());
        }
        let has_warnings =
            |s: Option<&Arc<StoredSlice>>| s.is_some_and(|s| !s.contribution.warnings().is_empty());
        let warnings = (has_warnings(old) || has_warnings(new)).then(|| {
            let mut messages = Vec::new();
            let mut skipped: BTreeMap<SkipReason, u64> = BTreeMap::new();
            for s in slice_list(self) {
                for (reason, message) in s.contribution.warnings() {
                    messages.push(message.clone());
                    *skipped.entry(*reason).or_insert(0) += 1;
                }
            }
            (messages, skipped)
        });
        let owner = self.owner(key, big.obj_owner.clone());
        if patch.is_empty()
            && owner == current.owner_uid
            && warnings.as_ref().is_none_or(|(w, _)| *w == current.skipped)
        {
            self.big.insert(key.clone(), big);
            return Some(false);
        }
        if let Some((messages, skipped)) = &warnings {
            self.set_warnings(merge_warnings_key(key), messages.clone(), skipped);
        }
        let info = self
            .service_info
            .get(&(key.namespace.to_string(), key.name.to_string()))
            .cloned();
        let aliases = self.opts.service_port_aliases;
        let published = self.services.contains_key(key);
        let map = if published {
            &mut self.services
        } else {
            &mut self.withheld
        };
        let arc = map.get_mut(key)?;
        // In place when no reader holds the value (moved, not copied, when
        // only `Weak`s do). Else on the previous value when nobody holds
        // that any more, not even a `Weak` (see `BigService::spare`; the
        // snapshot builder's cache trusts a `Weak`'s pointer to mean its
        // content), and only when that fails one copy, keeping the held
        // value as the next change's spare.
        let spare = big.spare.take();
        if Arc::strong_count(arc) > 1 {
            let mut reused = false;
            if let Some((mut old, replay)) = spare
                && let Some(value) = Arc::get_mut(&mut old)
                && catch_up(value, replay, arc)
            {
                std::mem::swap(arc, &mut old);
                big.spare = Some((old, patch.clone()));
                reused = true;
            }
            if !reused {
                big.spare = Some((Arc::clone(arc), patch.clone()));
            }
        }
        let svc = Arc::make_mut(arc);
        let before = svc.node_count();
        let Some(buckets) = svc.buckets.0.as_mut() else {
            // Built without buckets (not by `recompute_service`): merge in full.
            return None;
        };
        let mut changed = patch.apply(&mut svc.ports, Arc::make_mut(buckets));
        let after = svc.node_count();
        if svc.owner_uid != owner {
            svc.owner_uid = owner;
            changed = true;
        }
        if let Some((messages, _)) = warnings
            && svc.skipped != messages
        {
            svc.skipped = messages;
            changed = true;
        }
        let extras = info
            .map(|i| port_extras(&i, &svc.ports, aliases))
            .unwrap_or_default();
        if svc.extras != extras {
            svc.extras = extras;
            changed = true;
        }
        if changed {
            svc.refresh_version();
        }
        if published {
            self.node_total = self.node_total.saturating_add(after).saturating_sub(before);
        }
        self.big.insert(key.clone(), big);
        Some(changed && published)
    }

    /// An EndpointSlice was added or modified.
    pub fn apply_slice(&mut self, s: &(impl AsLeanSlice + ?Sized)) -> Vec<ServiceKey> {
        let s = &*s.lean();
        let Ok((ns, name, key)) = self.slice_target(s) else {
            return Vec::new();
        };
        let old = self.untrack_slice(&ns, &name);
        let new = key.map(|k| {
            let stored = self.stored_slice(k.clone(), s);
            self.slices.insert((ns, name.clone()), Arc::clone(&stored));
            self.by_service
                .entry(k)
                .or_insert_with(|| SliceNames::with_capacity(1))
                .insert(name.clone(), ());
            stored
        });
        let affected: BTreeSet<ServiceKey> = old
            .iter()
            .chain(new.iter())
            .map(|s| s.service.clone())
            .collect();
        affected
            .into_iter()
            .filter(|k| {
                let mine = |s: &Option<Arc<StoredSlice>>| s.clone().filter(|s| s.service == *k);
                self.slice_changed(k, &name, mine(&old).as_ref(), mine(&new).as_ref())
            })
            .collect()
    }

    /// An EndpointSlice was deleted.
    pub fn delete_slice(&mut self, s: &(impl Resource + ?Sized)) -> Vec<ServiceKey> {
        let ns = s.meta().namespace.clone().unwrap_or_default();
        let Some(name) = s.meta().name.clone() else {
            return Vec::new();
        };
        self.warnings.remove(&format!("EndpointSlice {ns}/{name}"));
        match self.untrack_slice(&ns, &name) {
            Some(old) if self.slice_changed(&old.service.clone(), &name, Some(&old), None) => {
                vec![old.service.clone()]
            }
            _ => Vec::new(),
        }
    }

    /// A relist of all EndpointSlices: afterwards the index holds exactly `all`.
    /// Returns the keys that changed or vanished (unchanged ones are not reported).
    pub fn reset_slices<S: AsLeanSlice>(&mut self, all: &[S]) -> Vec<ServiceKey> {
        self.begin_reset();
        for s in all {
            self.reset_add_slice(s);
        }
        self.finish_reset_slices()
    }

    /// One EndpointSlice of the relist started by [`Index::begin_reset`]
    /// (started implicitly if it was not). Only its contribution is kept.
    pub fn reset_add_slice(&mut self, s: &(impl AsLeanSlice + ?Sized)) {
        let s = &*s.lean();
        let mut p = self.reset.take().unwrap_or_default();
        if let Some(name) = s.metadata.name.as_deref() {
            let ns = s.metadata.namespace.as_deref().unwrap_or("");
            p.present.insert(format!("EndpointSlice {ns}/{name}"));
        }
        if let Ok((ns, name, Some(k))) = self.slice_target(s) {
            let id = (ns, name.clone());
            // The very slice the index holds (same resourceVersion, same
            // Service): share its contribution instead of converting again.
            let stored = match self.slices.get(&id) {
                Some(old)
                    if old.service == k
                        && old
                            .resource_version
                            .as_ref()
                            .zip(resource_version(&s.metadata))
                            .is_some_and(|(old, new)| old == new) =>
                {
                    Arc::clone(old)
                }
                _ => self.stored_slice(k.clone(), s),
            };
            if let Some(old) = p.slices.insert(id, stored) {
                // Listed twice (not from a real API server): the last wins.
                if let Some(set) = p.by_service.get_mut(&old.service) {
                    set.remove(&name);
                }
            }
            p.by_service
                .entry(k)
                .or_insert_with(|| SliceNames::with_capacity(1))
                .insert(name, ());
        }
        self.reset = Some(p);
    }

    /// Ends an EndpointSlice relist: afterwards the index holds exactly the
    /// slices added since [`Index::begin_reset`] (none added: empty). Returns
    /// the keys that changed or vanished (unchanged ones are not reported).
    pub fn finish_reset_slices(&mut self) -> Vec<ServiceKey> {
        let p = self.reset.take().unwrap_or_default();
        // A service needs a new merge when one of its slices is not the very
        // value it was (added, removed, modified, relabelled; both its old and
        // its new service), or its Service UID changed while the list arrived.
        // Every other service has the same slices, unchanged, so its current
        // desired state (and per-service warnings) is already the merge of them.
        let mut dirty: BTreeSet<ServiceKey> = BTreeSet::new();
        for (id, old) in &self.slices {
            if !p.slices.get(id).is_some_and(|new| Arc::ptr_eq(old, new)) {
                dirty.insert(old.service.clone());
            }
        }
        for (id, new) in &p.slices {
            if !self.slices.get(id).is_some_and(|old| Arc::ptr_eq(old, new)) {
                dirty.insert(new.service.clone());
            }
        }
        for (ns, name) in &p.uid_touched {
            dirty.insert(self.key(ns, name));
        }
        self.slices = compacted(p.slices);
        self.by_service = compacted(p.by_service);
        // Per-slice warnings of slices still present were compared (not
        // re-logged when unchanged), those of vanished slices are dropped; the
        // per-service ones are recomputed below for every dirty service.
        self.warnings
            .retain(|k, _| !k.starts_with("EndpointSlice ") || p.present.contains(k));
        let changed: Vec<ServiceKey> = dirty
            .into_iter()
            .filter(|k| self.recompute_service(k))
            .collect();
        // The merges above inserted every new service one at a time.
        if !changed.is_empty() {
            self.services = compacted(std::mem::take(&mut self.services));
        }
        changed
    }

    // ----- Services -----

    /// Tells the index the UID of Service `namespace/name` (`None`: unknown or
    /// deleted). Used as the owner UID when the endpoint objects carry no
    /// ownerReference. Returns the keys whose desired state changed.
    pub fn set_service_uid(
        &mut self,
        namespace: &str,
        name: &str,
        uid: Option<String>,
    ) -> Vec<ServiceKey> {
        let id = (namespace.to_string(), name.to_string());
        let uid = uid.filter(|u| !u.is_empty() && self.filter.matches(namespace));
        if !set_entry(&mut self.service_uids, &id, uid) {
            return Vec::new();
        }
        self.service_touched(id)
    }

    /// After the known UID or ports of Service `id` changed: a relist being
    /// received must rebuild it too; the live state is refreshed now.
    fn service_touched(&mut self, id: (String, String)) -> Vec<ServiceKey> {
        if let Some(p) = &mut self.reset {
            p.uid_touched.insert(id.clone());
        }
        self.refresh_owner(&id.0, &id.1)
    }

    /// After a (re)list of all Services: afterwards the known UIDs are exactly
    /// `all` (`(namespace, name, uid)`). Returns the keys whose desired state
    /// changed (a Service re-created with a new UID, or gone).
    pub fn reset_service_uids(
        &mut self,
        all: impl IntoIterator<Item = (String, String, String)>,
    ) -> Vec<ServiceKey> {
        let mut next: BTreeMap<(String, String), String> = all
            .into_iter()
            .filter(|(ns, _, uid)| !uid.is_empty() && self.filter.matches(ns))
            .map(|(ns, name, uid)| ((ns, name), uid))
            .collect();
        let touched = changed_ids(&self.service_uids, &next);
        std::mem::swap(&mut self.service_uids, &mut next);
        touched
            .into_iter()
            .flat_map(|id| self.service_touched(id))
            .collect()
    }

    /// Tells the index the ports of Service `namespace/name` (`None`:
    /// unknown or deleted), from which its aliases and appProtocols are
    /// derived ([`crate::service`]). Returns the keys whose desired state
    /// changed.
    pub fn set_service(
        &mut self,
        namespace: &str,
        name: &str,
        info: Option<ServiceInfo>,
    ) -> Vec<ServiceKey> {
        let id = (namespace.to_string(), name.to_string());
        let object = format!("Service {namespace}/{name}");
        let info = info.filter(|_| self.filter.matches(namespace));
        if self.service_info.get(&id) == info.as_ref() {
            return Vec::new();
        }
        match &info {
            Some(i) => self.service_warnings(namespace, name, object, i),
            None => {
                self.warnings.remove(&object);
            }
        }
        set_entry(&mut self.service_info, &id, info);
        self.service_touched(id)
    }

    /// After a (re)list of all Services: afterwards the known Service ports
    /// are exactly `all` (`(namespace, name, info)`). Returns the keys whose
    /// desired state changed.
    pub fn reset_services(
        &mut self,
        all: impl IntoIterator<Item = (String, String, ServiceInfo)>,
    ) -> Vec<ServiceKey> {
        let mut next: BTreeMap<(String, String), ServiceInfo> = all
            .into_iter()
            .filter(|(ns, _, _)| self.filter.matches(ns))
            .map(|(ns, name, info)| ((ns, name), info))
            .collect();
        // Annotation warnings: logged and counted when new or changed (not
        // again for the same bad Service on a relist), dropped with the Service.
        self.warnings.retain(|k, _| {
            k.strip_prefix("Service ")
                .and_then(|s| s.split_once('/'))
                .is_none_or(|(ns, name)| next.contains_key(&(ns.to_string(), name.to_string())))
        });
        for ((ns, name), info) in &next {
            let news = self.service_news_of(ns, name, format!("Service {ns}/{name}"), info);
            self.service_news.extend(news);
        }
        let touched = changed_ids(&self.service_info, &next);
        std::mem::swap(&mut self.service_info, &mut next);
        touched
            .into_iter()
            .flat_map(|id| self.service_touched(id))
            .collect()
    }

    /// Records the annotation and ExternalName warnings of a Service (see
    /// `set_warnings`); when they are news, also for
    /// [`Index::take_service_news`].
    fn service_warnings(
        &mut self,
        namespace: &str,
        name: &str,
        object: String,
        info: &ServiceInfo,
    ) {
        let news = self.service_news_of(namespace, name, object, info);
        self.service_news.extend(news);
    }

    /// [`Index::service_warnings`] without recording the news: returns it.
    fn service_news_of(
        &mut self,
        namespace: &str,
        name: &str,
        object: String,
        info: &ServiceInfo,
    ) -> Option<ServiceNews> {
        let mut warnings: Vec<(SkipReason, String)> = info
            .invalid
            .iter()
            .map(|w| (SkipReason::InvalidAnnotation, w.clone()))
            .collect();
        let mut skipped = BTreeMap::new();
        if !warnings.is_empty() {
            let n = u64::try_from(warnings.len()).unwrap_or(u64::MAX);
            skipped.insert(SkipReason::InvalidAnnotation, n);
        }
        if let Some((reason, message)) = self.external_refusal(&object, info) {
            warnings.push((reason, message));
            skipped.insert(reason, 1);
        }
        let texts = warnings.iter().map(|(_, w)| w.clone()).collect();
        self.set_warnings(object, texts, &skipped)
            .then(|| ServiceNews {
                namespace: namespace.to_string(),
                name: name.to_string(),
                warnings,
            })
    }

    /// The Services whose skipped annotations or refused ExternalName were
    /// logged since the last call: new or changed, never again for the same
    /// bad Service on a relist (the runtime turns them into Events).
    pub fn take_service_news(&mut self) -> Vec<ServiceNews> {
        std::mem::take(&mut self.service_news)
    }

    /// Number of Services whose ports are known.
    pub fn service_count(&self) -> usize {
        self.service_info.len()
    }

    /// Recomputes the desired state of service `namespace/name` after its
    /// known UID or ports changed.
    fn refresh_owner(&mut self, namespace: &str, name: &str) -> Vec<ServiceKey> {
        let key = self.key(namespace, name);
        if let Some(ext) = self.external_desired(&key) {
            self.external.insert(key.clone());
            // Its slices are ignored from now on, so what their merge
            // skipped is no current warning: drop it, as an index that
            // learned the Service before the slices never records it
            // (`recompute_service` stops at an external key). Merged again,
            // with their warnings, when it stops being ExternalName.
            self.warnings.remove(&merge_warnings_key(&key));
            return if self.store(&key, Some(ext)) {
                vec![key]
            } else {
                Vec::new()
            };
        }
        if self.external.remove(&key) {
            // No longer an allowed ExternalName: its nodes go. Slices are
            // merged again now; Endpoints (not kept) are published again on
            // their next event or relist.
            let changed = if self.source == SourceKind::EndpointSlice {
                self.recompute_service(&key)
            } else {
                self.store(&key, None)
            };
            return if changed { vec![key] } else { Vec::new() };
        }
        let Some(current) = self.current(&key) else {
            return Vec::new();
        };
        let changed = if current.source == SourceKind::Endpoints {
            let obj_owner = self.endpoints_owner.get(&key).and_then(|m| m.owner.clone());
            let owner = self.owner(&key, obj_owner);
            let next = self.build(
                key.clone(),
                current.source,
                current.ports.clone(),
                owner,
                current.skipped.clone(),
            );
            self.store(&key, Some(next))
        } else {
            self.recompute_service(&key)
        };
        if changed { vec![key] } else { Vec::new() }
    }

    // ----- Reads -----

    /// Desired state of `key`; `None` means the service is gone (delete its object).
    pub fn get(&self, key: &ServiceKey) -> Option<&ServiceNodes> {
        self.services.get(key).map(|s| &**s)
    }

    /// Desired state of `key` as the index's own `Arc` (hand
    /// this to other holders instead of cloning the nodes).
    pub fn get_arc(&self, key: &ServiceKey) -> Option<Arc<ServiceNodes>> {
        self.services.get(key).cloned()
    }

    /// All services, ordered by key.
    pub fn iter(&self) -> impl Iterator<Item = &ServiceNodes> {
        self.services.values().map(|s| &**s)
    }

    /// Number of services.
    pub fn len(&self) -> usize {
        self.services.len()
    }

    /// Whether there is no service.
    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
    }

    /// Number of nodes over all services and ports (a running total, O(1)).
    pub fn node_count(&self) -> usize {
        self.node_total
    }

    /// The Service ports of `key` that resolve to no port key (e.g. a
    /// `targetPort` naming a container port no endpoint has), one message
    /// each: those ports have no nodes. Data for status conditions (empty
    /// when the service or its Service is unknown).
    pub fn unresolved_ports(&self, key: &ServiceKey) -> &[String] {
        self.current(key)
            .map_or(&[][..], |s| s.extras.unresolved.as_slice())
    }

    /// Current conversion warnings, per object.
    pub fn warnings(&self) -> impl Iterator<Item = (&String, &Vec<String>)> {
        self.warnings.iter()
    }

    /// The warnings logged since the last call, counted per reason (each
    /// logged warning line counts once; an unchanged bad object seen again,
    /// e.g. on a relist, is not counted again).
    pub fn take_skipped(&mut self) -> BTreeMap<SkipReason, u64> {
        std::mem::take(&mut self.skipped)
    }
}

/// Brings `spare`, a big service's previous value, up to `current` by
/// replaying `replay`, the patch that made `current` of it (see
/// `BigService::spare`). `false` when that does not give `current`'s nodes
/// (a path other than the incremental one replaced the value meanwhile):
/// checked in O(buckets) by the kept digest, the port keys and list lengths,
/// so a stale spare is never published.
fn catch_up(spare: &mut ServiceNodes, replay: Patch, current: &ServiceNodes) -> bool {
    let (Some(mine), Some(theirs)) = (spare.buckets.0.as_mut(), current.buckets.0.as_ref()) else {
        return false;
    };
    let mine = Arc::make_mut(mine);
    replay.apply(&mut spare.ports, mine);
    let same = mine.digest() == theirs.digest()
        && mine.size == theirs.size
        && spare.ports.len() == current.ports.len()
        && spare
            .ports
            .iter()
            .zip(current.ports.iter())
            .all(|((k, a), (l, b))| k == l && a.len() == b.len());
    if same {
        spare.key.clone_from(&current.key);
        spare.source = current.source;
        spare.owner_uid.clone_from(&current.owner_uid);
        spare.version.clone_from(&current.version);
        spare.skipped.clone_from(&current.skipped);
        spare.extras.clone_from(&current.extras);
    }
    same
}

#[cfg(test)]
mod incremental_tests;
#[cfg(test)]
mod small_merge_tests;

/// The [`Index::warnings`] entry of what the merge of `key`'s EndpointSlices
/// skipped (one per service, not per slice: the merge decides).
fn merge_warnings_key(key: &ServiceKey) -> String {
    format!("EndpointSlices of {}/{}", key.namespace, key.name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filter::AnchoredRegex;
    use k8s_openapi::api::core::v1::Endpoints;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use serde_json::{Value, json};

    /// A fresh resourceVersion, as the API server assigns one on every write
    /// (every object a test builds is a new write unless it sets its own).
    fn next_rv() -> String {
        static RV: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1000);
        RV.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .to_string()
    }

    fn ep(ns: &str, name: &str, ips: &[&str], extra_meta: Value) -> Endpoints {
        let mut meta = json!({"name": name, "namespace": ns, "resourceVersion": next_rv()});
        if let (Some(m), Some(e)) = (meta.as_object_mut(), extra_meta.as_object()) {
            m.extend(e.clone());
        }
        let addrs: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip})).collect();
        serde_json::from_value(json!({
            "metadata": meta,
            "subsets": [{"addresses": addrs, "notReadyAddresses": [], "ports": [{"name": "http", "port": 80}]}]
        }))
        .unwrap()
    }

    fn slice(ns: &str, name: &str, svc: Option<&str>, eps: Value) -> EndpointSlice {
        let mut labels =
            json!({"endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"});
        if let Some(s) = svc {
            labels["kubernetes.io/service-name"] = json!(s);
        }
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns, "labels": labels, "resourceVersion": next_rv(),
                          "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": svc.unwrap_or(""), "uid": "svc-uid"}]},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 80}],
            "endpoints": eps,
        }))
        .unwrap()
    }

    /// An index with Service-port aliases on (off by default).
    fn idx(source: SourceKind) -> Index {
        Index::new(
            String::new(),
            source,
            ConvertOptions {
                service_port_aliases: true,
                ..ConvertOptions::default()
            },
            NamespaceFilter::All,
        )
    }

    fn k(ns: &str, name: &str) -> ServiceKey {
        ServiceKey::new("", ns, name)
    }

    fn hosts(i: &Index, key: &ServiceKey) -> Vec<String> {
        i.get(key).unwrap().ports["http"]
            .iter()
            .map(|n| n.host.to_string())
            .collect()
    }

    #[test]
    fn endpoints_apply_change_noop_delete() {
        let mut i = idx(SourceKind::Endpoints);
        assert_eq!(
            i.apply_endpoints(&ep("ns", "web", &["10.0.0.1"], json!({}))),
            vec![k("ns", "web")]
        );
        assert_eq!(i.len(), 1);
        assert_eq!(i.node_count(), 1);
        // resourceVersion bump + annotation: nothing relevant changed.
        let noisy = ep(
            "ns",
            "web",
            &["10.0.0.1"],
            json!({"resourceVersion": "2", "annotations": {"a": "b"}}),
        );
        assert!(i.apply_endpoints(&noisy).is_empty());
        // A not-ready address flapping: no change.
        let mut flap = ep("ns", "web", &["10.0.0.1"], json!({}));
        flap.subsets.as_mut().unwrap()[0].not_ready_addresses = Some(vec![
            serde_json::from_value(json!({"ip": "10.0.0.9"})).unwrap(),
        ]);
        assert!(i.apply_endpoints(&flap).is_empty());
        // Scale up.
        assert_eq!(
            i.apply_endpoints(&ep("ns", "web", &["10.0.0.2", "10.0.0.1"], json!({}))),
            vec![k("ns", "web")]
        );
        assert_eq!(hosts(&i, &k("ns", "web")), vec!["10.0.0.1", "10.0.0.2"]);
        // Scale to zero: still present, with an empty port.
        assert_eq!(
            i.apply_endpoints(&ep("ns", "web", &[], json!({}))),
            vec![k("ns", "web")]
        );
        assert!(i.get(&k("ns", "web")).unwrap().ports["http"].is_empty());
        // Delete.
        assert_eq!(
            i.delete_endpoints(&ep("ns", "web", &[], json!({}))),
            vec![k("ns", "web")]
        );
        assert!(i.get(&k("ns", "web")).is_none());
        assert!(
            i.delete_endpoints(&ep("ns", "web", &[], json!({})))
                .is_empty()
        );
    }

    #[test]
    fn endpoints_reset_reports_only_changed_and_vanished() {
        let mut i = idx(SourceKind::Endpoints);
        i.apply_endpoints(&ep("ns", "a", &["10.0.0.1"], json!({})));
        i.apply_endpoints(&ep("ns", "b", &["10.0.0.2"], json!({})));
        i.apply_endpoints(&ep("ns", "c", &["10.0.0.3"], json!({})));
        let changed = i.reset_endpoints(&[
            ep("ns", "a", &["10.0.0.1"], json!({"resourceVersion": "9"})),
            ep("ns", "b", &["10.0.0.22"], json!({})),
            ep("ns", "d", &["10.0.0.4"], json!({})),
        ]);
        assert_eq!(changed, vec![k("ns", "b"), k("ns", "c"), k("ns", "d")]);
        assert!(i.get(&k("ns", "c")).is_none());
        assert_eq!(i.len(), 3);
        assert!(
            i.reset_endpoints(&[
                ep("ns", "a", &["10.0.0.1"], json!({})),
                ep("ns", "b", &["10.0.0.22"], json!({})),
                ep("ns", "d", &["10.0.0.4"], json!({})),
            ])
            .is_empty()
        );
    }

    #[test]
    fn namespace_and_label_filters() {
        let filter = NamespaceFilter::Match(vec![AnchoredRegex::new("dev").unwrap()]);
        let mut i = Index::new(
            String::new(),
            SourceKind::Endpoints,
            ConvertOptions::default(),
            filter,
        )
        .with_label_selector(LabelSelector::parse("app=web").unwrap());
        let labelled = json!({"labels": {"app": "web"}});
        assert!(
            i.apply_endpoints(&ep("dev-2", "web", &["10.0.0.1"], labelled.clone()))
                .is_empty()
        );
        assert!(
            i.apply_endpoints(&ep("dev", "web", &["10.0.0.1"], json!({})))
                .is_empty()
        );
        assert_eq!(
            i.apply_endpoints(&ep("dev", "web", &["10.0.0.1"], labelled)),
            vec![k("dev", "web")]
        );
        // Label removed: the object leaves the selection -> treated as delete.
        assert_eq!(
            i.apply_endpoints(&ep("dev", "web", &["10.0.0.1"], json!({}))),
            vec![k("dev", "web")]
        );
        assert!(i.is_empty());
    }

    #[test]
    fn cluster_id_goes_into_keys() {
        let mut i = Index::new(
            "c1".into(),
            SourceKind::Endpoints,
            ConvertOptions::default(),
            NamespaceFilter::All,
        );
        assert_eq!(
            i.apply_endpoints(&ep("ns", "web", &["10.0.0.1"], json!({}))),
            vec![ServiceKey::new("c1", "ns", "web")]
        );
        assert_eq!(i.iter().next().unwrap().key.to_string(), "c1/ns/web");
    }

    #[test]
    fn owner_uid_from_owner_refs_or_service_lookup() {
        let mut i = idx(SourceKind::Endpoints);
        let owned = json!({"ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": "web", "uid": "u-own"}]});
        i.apply_endpoints(&ep("ns", "web", &["10.0.0.1"], owned));
        assert_eq!(
            i.get(&k("ns", "web")).unwrap().owner_uid.as_deref(),
            Some("u-own")
        );
        i.apply_endpoints(&ep("ns", "api", &["10.0.0.1"], json!({})));
        assert_eq!(i.get(&k("ns", "api")).unwrap().owner_uid, None);
        assert_eq!(
            i.set_service_uid("ns", "api", Some("u-api".into())),
            vec![k("ns", "api")]
        );
        assert_eq!(
            i.get(&k("ns", "api")).unwrap().owner_uid.as_deref(),
            Some("u-api")
        );
        assert!(
            i.set_service_uid("ns", "api", Some("u-api".into()))
                .is_empty()
        );
        // Survives later updates of the Endpoints.
        assert!(
            i.apply_endpoints(&ep("ns", "api", &["10.0.0.1"], json!({})))
                .is_empty()
        );
        // An explicit ownerReference wins over the looked-up UID.
        assert!(
            i.set_service_uid("ns", "web", Some("other".into()))
                .is_empty()
        );
        // A UID for a Service with no endpoints object yet is remembered.
        assert!(
            i.set_service_uid("ns", "later", Some("u-later".into()))
                .is_empty()
        );
        i.apply_endpoints(&ep("ns", "later", &[], json!({})));
        assert_eq!(
            i.get(&k("ns", "later")).unwrap().owner_uid.as_deref(),
            Some("u-later")
        );
    }

    #[test]
    fn service_uids_relist_recreate_and_vanish() {
        let mut i = Index::new(
            String::new(),
            SourceKind::Endpoints,
            ConvertOptions::default(),
            NamespaceFilter::NotEqual("kube-system".into()),
        );
        i.apply_endpoints(&ep("ns", "web", &["10.0.0.1"], json!({})));
        i.apply_endpoints(&ep("ns", "api", &["10.0.0.2"], json!({})));
        let uids = |v: &[(&str, &str, &str)]| -> Vec<(String, String, String)> {
            v.iter()
                .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
                .collect()
        };
        // First list: both owners appear; a Service in an unselected namespace is ignored.
        assert_eq!(
            i.reset_service_uids(uids(&[
                ("ns", "web", "u1"),
                ("ns", "api", "u2"),
                ("kube-system", "dns", "u3"),
            ])),
            vec![k("ns", "api"), k("ns", "web")]
        );
        assert_eq!(i.service_uids.len(), 2);
        // The same relist again changes nothing.
        assert!(
            i.reset_service_uids(uids(&[("ns", "web", "u1"), ("ns", "api", "u2")]))
                .is_empty()
        );
        // web re-created with a new UID, api gone: both change.
        assert_eq!(
            i.reset_service_uids(uids(&[("ns", "web", "u1b")])),
            vec![k("ns", "api"), k("ns", "web")]
        );
        assert_eq!(
            i.get(&k("ns", "web")).unwrap().owner_uid.as_deref(),
            Some("u1b")
        );
        // A missing Service never holds the service back: published, no owner.
        assert_eq!(i.get(&k("ns", "api")).unwrap().owner_uid, None);
        assert_eq!(hosts(&i, &k("ns", "api")), vec!["10.0.0.2"]);
        // Incremental: delete, then re-create with another UID.
        assert_eq!(i.set_service_uid("ns", "web", None), vec![k("ns", "web")]);
        assert!(i.set_service_uid("ns", "web", None).is_empty());
        assert_eq!(
            i.set_service_uid("ns", "web", Some("u1c".into())),
            vec![k("ns", "web")]
        );
        assert_eq!(
            i.get(&k("ns", "web")).unwrap().owner_uid.as_deref(),
            Some("u1c")
        );
        assert!(
            i.set_service_uid("kube-system", "dns", Some("u3".into()))
                .is_empty()
        );
    }

    #[test]
    fn skipped_counts_follow_logged_warnings_not_events() {
        let mut i = idx(SourceKind::Endpoints);
        let bad: Endpoints = serde_json::from_value(json!({
            "metadata": {"name": "bad", "namespace": "ns"},
            "subsets": [{"addresses": [{"ip": "999.1.1.1"}, {"ip": "10.0.0.1"}],
                         "ports": [{"name": "a", "port": 0}, {"name": "b", "port": 80}, {"name": "b", "port": 81}]}]
        }))
        .unwrap();
        i.apply_endpoints(&bad);
        let want = BTreeMap::from([
            (SkipReason::InvalidAddress, 1),
            (SkipReason::InvalidPort, 1),
            (SkipReason::DuplicatePortName, 1),
        ]);
        assert_eq!(i.take_skipped(), want);
        assert!(i.take_skipped().is_empty(), "drained");
        // The same object again, and a relist finding it unchanged: not counted again.
        i.apply_endpoints(&bad);
        i.reset_endpoints(std::slice::from_ref(&bad));
        assert!(i.take_skipped().is_empty());
        // A relist without it drops its warnings; when it comes back it counts again.
        i.reset_endpoints::<Endpoints>(&[]);
        assert_eq!(i.warnings().count(), 0);
        i.apply_endpoints(&bad);
        assert_eq!(i.take_skipped(), want);
        // A nameless object counts every time (there is no object to remember).
        let nameless: Endpoints =
            serde_json::from_value(json!({"metadata": {"namespace": "ns"}})).unwrap();
        i.apply_endpoints(&nameless);
        i.apply_endpoints(&nameless);
        assert_eq!(
            i.take_skipped(),
            BTreeMap::from([(SkipReason::MissingName, 2)])
        );

        let mut s = idx(SourceKind::EndpointSlice);
        let orphan = slice("ns", "orphan", None, json!([{"addresses": ["10.0.0.1"]}]));
        s.apply_slice(&orphan);
        s.reset_slices(std::slice::from_ref(&orphan));
        assert_eq!(
            s.take_skipped(),
            BTreeMap::from([(SkipReason::MissingServiceLabel, 1)])
        );
        let v6_in_v4 = slice(
            "ns",
            "w",
            Some("web"),
            json!([{"addresses": ["fd00::1"]}, {"addresses": []}, {"addresses": ["10.0.0.2"]}]),
        );
        s.apply_slice(&v6_in_v4);
        s.reset_slices(&[orphan, v6_in_v4]);
        assert_eq!(
            s.take_skipped(),
            BTreeMap::from([
                (SkipReason::InvalidAddress, 1),
                (SkipReason::MissingAddress, 1)
            ])
        );
        assert_eq!(hosts(&s, &k("ns", "web")), vec!["10.0.0.2"]);
    }

    /// `web.1` is the object name of shard 1 of `web` (and `x.web` that of
    /// `web` of cluster `x` in a fixed namespace): a slice labelled, or an
    /// Endpoints named, so belongs to no Service and must never be indexed,
    /// nor delete what `web` published. Skipped, warned once, counted.
    #[test]
    fn invalid_service_names_are_skipped_and_never_touch_another_service() {
        let mut s = idx(SourceKind::EndpointSlice);
        let web = slice(
            "ns",
            "web-a",
            Some("web"),
            json!([{"addresses": ["10.0.0.1"]}]),
        );
        assert_eq!(s.apply_slice(&web), vec![k("ns", "web")]);
        for (n, label) in ["web.1", "Web", "1web", "web_1", &"w".repeat(64)]
            .iter()
            .enumerate()
        {
            let bad = slice(
                "ns",
                &format!("bad-{n}"),
                Some(label),
                json!([{"addresses": ["10.9.9.9"]}]),
            );
            assert!(s.apply_slice(&bad).is_empty(), "{label}: indexed");
            assert!(
                s.delete_slice(&bad).is_empty(),
                "{label}: delete touched a service"
            );
        }
        let bad = slice(
            "ns",
            "bad",
            Some("web.1"),
            json!([{"addresses": ["10.9.9.9"]}]),
        );
        s.apply_slice(&bad);
        s.apply_slice(&bad);
        s.reset_slices(&[web.clone(), bad.clone()]);
        assert_eq!(
            s.take_skipped(),
            BTreeMap::from([(SkipReason::InvalidServiceName, 6)]),
            "five labels, and the sixth slice once although seen three times"
        );
        assert!(
            s.warnings().any(|(_, w)| w
                .iter()
                .any(|w| w.contains("\"web.1\" is not a valid Service name"))),
            "the warning names the label value"
        );
        assert_eq!(s.len(), 1);
        assert_eq!(hosts(&s, &k("ns", "web")), vec!["10.0.0.1"]);
        // A slice whose label becomes invalid leaves its old service.
        let moved = slice(
            "ns",
            "web-a",
            Some("web.2"),
            json!([{"addresses": ["10.0.0.1"]}]),
        );
        assert_eq!(s.apply_slice(&moved), vec![k("ns", "web")]);
        assert_eq!(s.len(), 0);

        let mut e = idx(SourceKind::Endpoints);
        assert_eq!(
            e.apply_endpoints(&ep("ns", "web", &["10.0.0.1"], json!({}))),
            vec![k("ns", "web")]
        );
        let bad = ep("ns", "web.1", &["10.9.9.9"], json!({}));
        assert!(e.apply_endpoints(&bad).is_empty());
        assert!(e.delete_endpoints(&bad).is_empty());
        assert!(
            e.reset_endpoints(&[ep("ns", "web", &["10.0.0.1"], json!({})), bad.clone()])
                .is_empty()
        );
        assert_eq!(e.len(), 1);
        assert_eq!(
            e.take_skipped(),
            BTreeMap::from([(SkipReason::InvalidServiceName, 2)]),
            "once, and once more when the deleted object is listed again"
        );
    }

    #[test]
    fn slices_merge_move_and_delete() {
        let mut i = idx(SourceKind::EndpointSlice);
        let web = k("ns", "web");
        assert_eq!(
            i.apply_slice(&slice(
                "ns",
                "web-a",
                Some("web"),
                json!([{"addresses": ["10.0.0.1"]}])
            )),
            vec![web.clone()]
        );
        assert_eq!(
            i.apply_slice(&slice(
                "ns",
                "web-b",
                Some("web"),
                json!([{"addresses": ["10.0.0.2"]}])
            )),
            vec![web.clone()]
        );
        assert_eq!(hosts(&i, &web), vec!["10.0.0.1", "10.0.0.2"]);
        assert_eq!(i.get(&web).unwrap().source, SourceKind::EndpointSlice);
        assert_eq!(i.get(&web).unwrap().owner_uid.as_deref(), Some("svc-uid"));
        // Endpoint moves from slice b to slice a: two events, but the final state
        // equals the start, and the intermediate one is reported honestly.
        let c1 = i.apply_slice(&slice(
            "ns",
            "web-a",
            Some("web"),
            json!([{"addresses": ["10.0.0.1"]}, {"addresses": ["10.0.0.2"]}]),
        ));
        assert!(
            c1.is_empty(),
            "10.0.0.2 is now in both slices: deduplicated, no change"
        );
        let c2 = i.apply_slice(&slice("ns", "web-b", Some("web"), json!([])));
        assert!(c2.is_empty());
        assert_eq!(hosts(&i, &web), vec!["10.0.0.1", "10.0.0.2"]);
        // Deleting one slice keeps the service while another slice exists.
        assert!(
            i.delete_slice(&slice("ns", "web-b", Some("web"), json!([])))
                .is_empty()
        );
        assert_eq!(
            i.delete_slice(&slice("ns", "web-a", Some("web"), json!([]))),
            vec![web.clone()]
        );
        assert!(i.get(&web).is_none());
        assert!(i.is_empty());
    }

    #[test]
    fn slice_relabelled_to_another_service_updates_both() {
        let mut i = idx(SourceKind::EndpointSlice);
        i.apply_slice(&slice(
            "ns",
            "s1",
            Some("a"),
            json!([{"addresses": ["10.0.0.1"]}]),
        ));
        i.apply_slice(&slice(
            "ns",
            "s2",
            Some("a"),
            json!([{"addresses": ["10.0.0.2"]}]),
        ));
        let changed = i.apply_slice(&slice(
            "ns",
            "s2",
            Some("b"),
            json!([{"addresses": ["10.0.0.2"]}]),
        ));
        assert_eq!(changed, vec![k("ns", "a"), k("ns", "b")]);
        assert_eq!(hosts(&i, &k("ns", "a")), vec!["10.0.0.1"]);
        assert_eq!(hosts(&i, &k("ns", "b")), vec!["10.0.0.2"]);
    }

    #[test]
    fn slice_without_service_label_is_skipped_with_warning() {
        let mut i = idx(SourceKind::EndpointSlice);
        assert!(
            i.apply_slice(&slice(
                "ns",
                "orphan",
                None,
                json!([{"addresses": ["10.0.0.1"]}])
            ))
            .is_empty()
        );
        assert!(i.is_empty());
        let w: Vec<_> = i.warnings().collect();
        assert_eq!(w.len(), 1);
        assert!(w[0].1[0].contains("no kubernetes.io/service-name label"));
        // Once labelled, the warning is gone.
        i.apply_slice(&slice(
            "ns",
            "orphan",
            Some("web"),
            json!([{"addresses": ["10.0.0.1"]}]),
        ));
        assert_eq!(i.warnings().count(), 0);
        assert!(i.get(&k("ns", "web")).is_some());
        // If a tracked slice loses its label, its service is recomputed.
        i.apply_slice(&slice(
            "ns",
            "s1",
            Some("a"),
            json!([{"addresses": ["10.0.0.1"]}]),
        ));
        assert_eq!(
            i.apply_slice(&slice(
                "ns",
                "s1",
                None,
                json!([{"addresses": ["10.0.0.1"]}])
            )),
            vec![k("ns", "a")]
        );
        assert!(i.get(&k("ns", "a")).is_none());
    }

    #[test]
    fn slice_irrelevant_changes_report_nothing() {
        let mut i = idx(SourceKind::EndpointSlice);
        let eps = json!([{"addresses": ["10.0.0.1"], "conditions": {"ready": true}},
                         {"addresses": ["10.0.0.9"], "conditions": {"ready": false, "serving": false}}]);
        i.apply_slice(&slice("ns", "s1", Some("web"), eps));
        let mut s = slice(
            "ns",
            "s1",
            Some("web"),
            json!([{"addresses": ["10.0.0.1"], "conditions": {"ready": true}},
                                                         {"addresses": ["10.0.0.9"], "conditions": {"ready": false, "serving": true}}]),
        );
        s.metadata.annotations = Some(BTreeMap::from([("x".to_string(), "y".to_string())]));
        s.metadata.resource_version = Some("77".into());
        assert!(i.apply_slice(&s).is_empty());
    }

    #[test]
    fn slices_reset_removes_vanished_keeps_unchanged() {
        let mut i = idx(SourceKind::EndpointSlice);
        i.apply_slice(&slice(
            "ns",
            "a-1",
            Some("a"),
            json!([{"addresses": ["10.0.0.1"]}]),
        ));
        i.apply_slice(&slice(
            "ns",
            "b-1",
            Some("b"),
            json!([{"addresses": ["10.0.0.2"]}]),
        ));
        i.apply_slice(&slice(
            "ns",
            "c-1",
            Some("c"),
            json!([{"addresses": ["10.0.0.3"]}]),
        ));
        let changed = i.reset_slices(&[
            slice("ns", "a-1", Some("a"), json!([{"addresses": ["10.0.0.1"]}])),
            slice(
                "ns",
                "b-2",
                Some("b"),
                json!([{"addresses": ["10.0.0.2"]}, {"addresses": ["10.0.0.5"]}]),
            ),
        ]);
        assert_eq!(changed, vec![k("ns", "b"), k("ns", "c")]);
        assert!(i.get(&k("ns", "c")).is_none());
        assert_eq!(hosts(&i, &k("ns", "b")), vec!["10.0.0.2", "10.0.0.5"]);
        // The replaced slice b-1 is really gone: deleting b-2 removes b.
        assert_eq!(
            i.delete_slice(&slice("ns", "b-2", Some("b"), json!([]))),
            vec![k("ns", "b")]
        );
    }

    /// The index keeps each slice's contribution, not the object: what it
    /// publishes equals the conversion of the raw objects, with topology
    /// fields kept only when topology output is on.
    #[test]
    fn kept_slices_give_what_the_objects_give() {
        let mut s = slice(
            "ns",
            "s1",
            Some("web"),
            json!([{"addresses": ["10.0.0.1"], "hostname": "h", "zone": "z", "nodeName": "n"},
                   {"addresses": ["bad", "10.0.0.2"], "conditions": {"ready": false, "serving": true, "terminating": true}}]),
        );
        s.metadata.annotations = Some(BTreeMap::from([("big".to_string(), "x".repeat(1000))]));
        s.metadata.managed_fields = Some(vec![Default::default()]);
        for topology in [false, true] {
            let opts = ConvertOptions {
                topology,
                drain_terminating: crate::convert::Drain::Fallback,
                ..Default::default()
            };
            let mut i = Index::new(
                String::new(),
                SourceKind::EndpointSlice,
                opts.clone(),
                NamespaceFilter::All,
            );
            i.apply_slice(&s);
            let want = crate::convert::from_slices([&s], &opts);
            let got = i.get(&k("ns", "web")).unwrap();
            assert_eq!(got.ports, want.ports);
            assert_eq!(got.owner_uid.as_deref(), Some("svc-uid"));
            assert_eq!(
                got.ports["http"][0].zone(),
                topology.then_some("z"),
                "topology {topology}"
            );
            let (_, w) = i.warnings().next().unwrap();
            assert_eq!(w, &want.warnings);
        }
    }

    /// A relist fed object by object: the old state stays readable until the
    /// finish, an unfinished relist is dropped by the next `begin_reset`, and
    /// the result equals `reset_slices` of the same objects.
    #[test]
    fn streamed_relist_swaps_at_the_end() {
        let a1 = slice("ns", "a-1", Some("a"), json!([{"addresses": ["10.0.0.1"]}]));
        let b1 = slice("ns", "b-1", Some("b"), json!([{"addresses": ["10.0.1.1"]}]));
        let a1_new = slice("ns", "a-1", Some("a"), json!([{"addresses": ["10.0.0.9"]}]));
        let c1 = slice("ns", "c-1", Some("c"), json!([{"addresses": ["10.0.2.1"]}]));
        let mut i = idx(SourceKind::EndpointSlice);
        assert_eq!(i.reset_slices(&[a1.clone(), b1.clone()]).len(), 2);
        // An interrupted relist that saw only c-1 ...
        i.begin_reset();
        i.reset_add_slice(&c1);
        assert_eq!(hosts(&i, &k("ns", "a")), vec!["10.0.0.1"]);
        assert!(i.get(&k("ns", "c")).is_none());
        // ... is dropped by the next one.
        i.begin_reset();
        i.reset_add_slice(&a1_new);
        i.reset_add_slice(&b1);
        assert_eq!(
            hosts(&i, &k("ns", "a")),
            vec!["10.0.0.1"],
            "old state until the finish"
        );
        assert_eq!(i.finish_reset_slices(), vec![k("ns", "a")]);
        assert_eq!(hosts(&i, &k("ns", "a")), vec!["10.0.0.9"]);
        assert!(i.get(&k("ns", "c")).is_none());
        let mut reference = idx(SourceKind::EndpointSlice);
        reference.reset_slices(&[a1_new, b1]);
        assert_eq!(
            i.iter().cloned().collect::<Vec<_>>(),
            reference.iter().cloned().collect::<Vec<_>>()
        );
        assert_eq!(i.node_count(), 2);
        // An empty relist removes everything.
        i.begin_reset();
        assert_eq!(i.finish_reset_slices(), vec![k("ns", "a"), k("ns", "b")]);
        assert_eq!((i.len(), i.node_count()), (0, 0));
    }

    /// Endpoints relist: unchanged services keep their shared allocation, and a
    /// Service UID learned while the list arrives is not lost.
    #[test]
    fn streamed_endpoints_relist_shares_unchanged_and_keeps_uid_updates() {
        let mut i = idx(SourceKind::Endpoints);
        i.reset_endpoints(&[
            ep("ns", "a", &["10.0.0.1"], json!({})),
            ep("ns", "b", &["10.0.0.2"], json!({})),
        ]);
        let a_before = i.get_arc(&k("ns", "a")).unwrap();
        i.begin_reset();
        i.reset_add_endpoints(&ep("ns", "a", &["10.0.0.1"], json!({})));
        i.reset_add_endpoints(&ep("ns", "b", &["10.0.0.2", "10.0.0.3"], json!({})));
        // The Service watch reports b's UID before the list is complete.
        assert_eq!(
            i.set_service_uid("ns", "b", Some("uid-b".into())),
            vec![k("ns", "b")]
        );
        assert_eq!(i.finish_reset_endpoints(), vec![k("ns", "b")]);
        let b = i.get(&k("ns", "b")).unwrap();
        assert_eq!(b.owner_uid.as_deref(), Some("uid-b"));
        assert_eq!(b.node_count(), 2);
        assert!(Arc::ptr_eq(&a_before, &i.get_arc(&k("ns", "a")).unwrap()));
        assert_eq!(i.node_count(), 3);
    }

    /// Incremental updates and a relist must agree: applying the same slices in
    /// any order (with redundant re-applies and a delete of a slice that is later
    /// re-created) ends in the state `reset_slices(final set)` produces.
    #[test]
    fn incremental_equals_relist_in_any_order() {
        let all: Vec<EndpointSlice> = vec![
            slice(
                "ns",
                "a-1",
                Some("a"),
                json!([{"addresses": ["10.0.0.1"]}, {"addresses": ["10.0.0.2"], "conditions": {"ready": false}}]),
            ),
            slice(
                "ns",
                "a-2",
                Some("a"),
                json!([{"addresses": ["10.0.0.2"]}, {"addresses": ["10.0.0.3"], "conditions": {"terminating": true, "ready": false, "serving": true}}]),
            ),
            slice("ns", "a-3", Some("a"), json!([{"addresses": ["10.0.0.3"]}])),
            slice("ns", "b-1", Some("b"), json!([{"addresses": ["10.0.1.1"]}])),
            slice(
                "other",
                "a-1",
                Some("a"),
                json!([{"addresses": ["10.0.2.1"]}]),
            ),
            slice("ns", "c-1", Some("c"), json!([])),
        ];
        let mut reference = idx(SourceKind::EndpointSlice);
        reference.reset_slices(&all);
        let want: Vec<ServiceNodes> = reference.iter().cloned().collect();
        assert_eq!(want.len(), 4);
        // Every rotation of the order, forwards and backwards.
        for rot in 0..all.len() {
            for reverse in [false, true] {
                let mut order: Vec<&EndpointSlice> =
                    all.iter().cycle().skip(rot).take(all.len()).collect();
                if reverse {
                    order.reverse();
                }
                let mut i = idx(SourceKind::EndpointSlice);
                for s in &order {
                    i.apply_slice(s);
                }
                // Redundant events change nothing.
                for s in &order {
                    assert!(i.apply_slice(s).is_empty());
                }
                // Delete and re-create one slice.
                i.delete_slice(order[0]);
                i.apply_slice(order[0]);
                let got: Vec<ServiceNodes> = i.iter().cloned().collect();
                assert_eq!(got, want, "rotation {rot}, reverse {reverse}");
                let sum: usize = got.iter().map(ServiceNodes::node_count).sum();
                assert_eq!(i.node_count(), sum, "running node total");
                // A relist of the same state reports nothing.
                assert!(i.reset_slices(&all).is_empty());
            }
        }
    }

    /// `n` services `s0..`, each with slices `-a` and `-b` of one endpoint each.
    fn slice_fleet(n: usize) -> Vec<EndpointSlice> {
        (0..n)
            .flat_map(|i| {
                ["a", "b"].into_iter().enumerate().map(move |(j, part)| {
                    slice(
                        "ns",
                        &format!("s{i}-{part}"),
                        Some(&format!("s{i}")),
                        json!([{"addresses": [format!("10.{j}.0.{i}")]}]),
                    )
                })
            })
            .collect()
    }

    fn fresh_relist(list: &[EndpointSlice]) -> Index {
        let mut reference = idx(SourceKind::EndpointSlice);
        reference.reset_slices(list);
        reference
    }

    fn same_state(got: &Index, want: &Index) {
        assert_eq!(
            got.iter().cloned().collect::<Vec<_>>(),
            want.iter().cloned().collect::<Vec<_>>()
        );
        assert_eq!(got.node_count(), want.node_count());
        assert_eq!(
            got.warnings().collect::<Vec<_>>(),
            want.warnings().collect::<Vec<_>>()
        );
    }

    /// A relist converts only the objects whose resourceVersion changed and
    /// merges only the services they touch; the result equals a fresh index.
    #[test]
    fn slice_relist_converts_and_merges_only_what_changed() {
        let fleet = slice_fleet(20);
        let mut i = idx(SourceKind::EndpointSlice);
        assert_eq!(i.reset_slices(&fleet).len(), 20);
        assert_eq!(
            i.take_work(),
            Work {
                converted: 40,
                merged: 20
            }
        );
        let before: BTreeMap<ServiceKey, Arc<ServiceNodes>> = i.services.clone();

        // The same list again (same resourceVersions): no conversion, no merge.
        assert!(i.reset_slices(&fleet).is_empty());
        assert_eq!(i.take_work(), Work::default());

        let by_name = |n: &str| {
            fleet
                .iter()
                .find(|s| s.metadata.name.as_deref() == Some(n))
                .unwrap()
                .clone()
        };
        let mut list: Vec<EndpointSlice> = fleet
            .iter()
            .filter(|s| {
                let n = s.metadata.name.as_deref().unwrap();
                // s5-b dropped (s5 keeps s5-a); s9 dropped entirely; s11-b relabelled.
                !["s5-b", "s9-a", "s9-b", "s11-b", "s3-a"].contains(&n)
            })
            .cloned()
            .collect();
        // s3-a modified (a new write: new resourceVersion).
        list.push(slice(
            "ns",
            "s3-a",
            Some("s3"),
            json!([{"addresses": ["10.9.9.3"]}]),
        ));
        // s7-c added.
        list.push(slice(
            "ns",
            "s7-c",
            Some("s7"),
            json!([{"addresses": ["10.9.9.7"]}]),
        ));
        // s11-b moved to service s12.
        let mut moved = by_name("s11-b");
        moved
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(SERVICE_NAME_LABEL.to_string(), "s12".to_string());
        moved.metadata.resource_version = Some(next_rv());
        list.push(moved);
        // A real list is in name order; the index must not depend on it.
        list.reverse();

        let changed = i.reset_slices(&list);
        assert_eq!(
            changed,
            ["s11", "s12", "s3", "s5", "s7", "s9"]
                .map(|n| k("ns", n))
                .to_vec()
        );
        assert_eq!(
            i.take_work(),
            Work {
                converted: 3,
                merged: 5
            },
            "3 new objects converted; s3, s5, s7, s11, s12 merged (s9 only removed)"
        );
        assert!(i.get(&k("ns", "s9")).is_none());
        assert_eq!(
            hosts(&i, &k("ns", "s12")),
            vec!["10.0.0.12", "10.1.0.11", "10.1.0.12"]
        );
        same_state(&i, &fresh_relist(&list));
        // Unchanged services keep their very allocation (nothing to publish).
        for (key, old) in &before {
            if !changed.contains(key) {
                assert!(Arc::ptr_eq(old, &i.get_arc(key).unwrap()), "{key}");
            }
        }
        // The dropped slices are really gone: deleting s5-a now removes s5.
        assert_eq!(i.delete_slice(&by_name("s5-a")), vec![k("ns", "s5")]);
    }

    /// What resourceVersion equality does and does not prove.
    #[test]
    fn slice_relist_reuse_needs_equal_nonempty_version_and_same_service() {
        let a = slice("ns", "a-1", Some("a"), json!([{"addresses": ["10.0.0.1"]}]));
        let mut i = idx(SourceKind::EndpointSlice);
        i.reset_slices(std::slice::from_ref(&a));
        i.take_work();

        // Equal resourceVersion: the API server guarantees the same object, so
        // the kept contribution is used even if (only a fake server could do
        // this) the content differs.
        let mut forged = slice(
            "ns",
            "a-1",
            Some("a"),
            json!([{"addresses": ["10.0.0.99"]}]),
        );
        forged.metadata.resource_version = a.metadata.resource_version.clone();
        assert!(i.reset_slices(std::slice::from_ref(&forged)).is_empty());
        assert_eq!(hosts(&i, &k("ns", "a")), vec!["10.0.0.1"]);
        assert_eq!(i.take_work(), Work::default());

        // Equal resourceVersion but another Service label: converted, both merged.
        let mut relabelled = a.clone();
        relabelled
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(SERVICE_NAME_LABEL.to_string(), "b".to_string());
        assert_eq!(
            i.reset_slices(std::slice::from_ref(&relabelled)),
            vec![k("ns", "a"), k("ns", "b")]
        );
        assert_eq!(
            i.take_work(),
            Work {
                converted: 1,
                merged: 1
            }
        );

        // No (or an empty) resourceVersion proves nothing: always converted.
        for rv in [None, Some(String::new())] {
            let mut bare = slice("ns", "c-1", Some("c"), json!([{"addresses": ["10.0.0.3"]}]));
            bare.metadata.resource_version = rv.clone();
            i.reset_slices(std::slice::from_ref(&bare));
            i.take_work();
            bare.endpoints[0].addresses = vec!["10.0.0.4".into()];
            assert_eq!(
                i.reset_slices(std::slice::from_ref(&bare)),
                vec![k("ns", "c")],
                "resourceVersion {rv:?}"
            );
            assert_eq!(hosts(&i, &k("ns", "c")), vec!["10.0.0.4"]);
            assert_eq!(
                i.take_work(),
                Work {
                    converted: 1,
                    merged: 1
                }
            );
        }

        // An unchanged slice whose Service UID changes while the list arrives
        // (slices without an ownerReference use the looked-up UID).
        let mut orphan = slice("ns", "d-1", Some("d"), json!([{"addresses": ["10.0.0.5"]}]));
        orphan.metadata.owner_references = None;
        i.reset_slices(std::slice::from_ref(&orphan));
        i.begin_reset();
        i.reset_add_slice(&orphan);
        assert_eq!(
            i.set_service_uid("ns", "d", Some("uid-d".into())),
            vec![k("ns", "d")]
        );
        assert!(
            i.finish_reset_slices().is_empty(),
            "already published when the UID arrived"
        );
        assert_eq!(
            i.get(&k("ns", "d")).unwrap().owner_uid.as_deref(),
            Some("uid-d")
        );
        let mut reference = idx(SourceKind::EndpointSlice);
        reference.set_service_uid("ns", "d", Some("uid-d".into()));
        reference.reset_slices(std::slice::from_ref(&orphan));
        same_state(&i, &reference);
    }

    /// Warnings and skip counts stay right when slices are reused: an
    /// unchanged bad slice is neither re-logged nor re-counted, a dropped one
    /// takes its warnings along, a new bad one is counted.
    #[test]
    fn slice_relist_reuse_keeps_warnings_and_skip_counts_right() {
        let good = slice(
            "ns",
            "w-1",
            Some("web"),
            json!([{"addresses": ["10.0.0.1"]}]),
        );
        let bad = slice(
            "ns",
            "w-2",
            Some("web"),
            json!([{"addresses": ["fd00::1"]}, {"addresses": ["10.0.0.2"]}]),
        );
        let orphan = slice("ns", "o-1", None, json!([{"addresses": ["10.0.0.3"]}]));
        let mut i = idx(SourceKind::EndpointSlice);
        i.reset_slices(&[good.clone(), bad.clone(), orphan.clone()]);
        assert_eq!(
            i.take_skipped(),
            BTreeMap::from([
                (SkipReason::InvalidAddress, 1),
                (SkipReason::MissingServiceLabel, 1)
            ])
        );
        assert_eq!(i.warnings().count(), 2);
        // Unchanged: nothing logged or counted again.
        assert!(
            i.reset_slices(&[good.clone(), bad.clone(), orphan.clone()])
                .is_empty()
        );
        assert!(i.take_skipped().is_empty());
        assert_eq!(i.warnings().count(), 2);
        // The bad slice and the orphan dropped: their warnings go, web changes.
        assert_eq!(
            i.reset_slices(std::slice::from_ref(&good)),
            vec![k("ns", "web")]
        );
        assert_eq!(i.warnings().count(), 0);
        assert_eq!(hosts(&i, &k("ns", "web")), vec!["10.0.0.1"]);
        // Back again (same objects): logged and counted again.
        i.reset_slices(&[good.clone(), bad.clone(), orphan.clone()]);
        assert_eq!(
            i.take_skipped(),
            BTreeMap::from([
                (SkipReason::InvalidAddress, 1),
                (SkipReason::MissingServiceLabel, 1)
            ])
        );
        same_state(&i, &fresh_relist(&[good, bad, orphan]));
    }

    /// Endpoints mode: a relist converts only objects with a new
    /// resourceVersion, drops vanished ones, keeps warnings, owners and shared
    /// allocations of the unchanged ones.
    #[test]
    fn endpoints_relist_converts_only_what_changed() {
        let owned = json!({"ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": "x", "uid": "u-own"}]});
        let all: Vec<Endpoints> = (0..10)
            .map(|n| {
                ep(
                    "ns",
                    &format!("e{n}"),
                    &[&format!("10.0.0.{n}")],
                    owned.clone(),
                )
            })
            .collect();
        let bad: Endpoints = serde_json::from_value(json!({
            "metadata": {"name": "bad", "namespace": "ns", "resourceVersion": "b1"},
            "subsets": [{"addresses": [{"ip": "999.1.1.1"}, {"ip": "10.0.1.1"}], "ports": [{"name": "http", "port": 80}]}]
        }))
        .unwrap();
        let mut list = all.clone();
        list.push(bad.clone());
        let mut i = idx(SourceKind::Endpoints);
        assert_eq!(i.reset_endpoints(&list).len(), 11);
        assert_eq!(i.take_work().converted, 11);
        assert_eq!(
            i.take_skipped(),
            BTreeMap::from([(SkipReason::InvalidAddress, 1)])
        );
        let e1 = i.get_arc(&k("ns", "e1")).unwrap();

        // e3 changed, e7 gone, the rest (and the bad one) unchanged.
        let mut next: Vec<Endpoints> = list
            .iter()
            .filter(|e| !matches!(e.metadata.name.as_deref(), Some("e3" | "e7")))
            .cloned()
            .collect();
        next.push(ep("ns", "e3", &["10.0.0.33"], owned.clone()));
        assert_eq!(i.reset_endpoints(&next), vec![k("ns", "e3"), k("ns", "e7")]);
        assert_eq!(i.take_work().converted, 1);
        assert!(
            i.take_skipped().is_empty(),
            "the unchanged bad object is not counted again"
        );
        assert_eq!(i.warnings().count(), 1);
        assert!(Arc::ptr_eq(&e1, &i.get_arc(&k("ns", "e1")).unwrap()));
        assert_eq!(
            i.get(&k("ns", "e1")).unwrap().owner_uid.as_deref(),
            Some("u-own")
        );
        let mut reference = idx(SourceKind::Endpoints);
        reference.reset_endpoints(&next);
        same_state(&i, &reference);
        // The kept owner survives a Service UID update after the relist:
        // the ownerReference on the object still wins.
        assert!(
            i.set_service_uid("ns", "e1", Some("other".into()))
                .is_empty()
        );

        // An unchanged object whose Service UID arrives while the list does.
        let bare = ep("ns", "u", &["10.0.2.1"], json!({}));
        i.reset_endpoints(std::slice::from_ref(&bare));
        i.begin_reset();
        i.reset_add_endpoints(&bare);
        assert_eq!(
            i.set_service_uid("ns", "u", Some("uid-u".into())),
            vec![k("ns", "u")]
        );
        assert!(i.finish_reset_endpoints().is_empty());
        assert_eq!(
            i.get(&k("ns", "u")).unwrap().owner_uid.as_deref(),
            Some("uid-u")
        );
        assert_eq!(
            i.take_work().converted,
            1,
            "the first relist converted it, the second reused it"
        );
        // Deselected objects are not reused: with a label selector the same
        // object (same resourceVersion) that does not match is dropped.
        let mut sel = Index::new(
            String::new(),
            SourceKind::Endpoints,
            ConvertOptions::default(),
            NamespaceFilter::All,
        )
        .with_label_selector(LabelSelector::parse("app=web").unwrap());
        sel.reset_endpoints(std::slice::from_ref(&bare));
        assert!(sel.is_empty());
        assert!(sel.reset_endpoints(std::slice::from_ref(&bare)).is_empty());
        assert!(sel.is_empty());
    }

    fn service_info(ports: Value) -> ServiceInfo {
        let s: k8s_openapi::api::core::v1::Service = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns"},
            "spec": {"ports": ports}
        }))
        .unwrap();
        ServiceInfo::from_service(&s)
    }

    /// The Service's ports give aliases and appProtocols in both modes,
    /// whichever of Service and endpoints comes first; without a Service
    /// the value (and its version) is exactly what it was before Services
    /// were read.
    #[test]
    fn service_ports_give_aliases_and_app_protocols_in_both_modes() {
        let http = service_info(json!([
            {"name": "http", "port": 8000, "targetPort": "web", "appProtocol": "kubernetes.io/h2c"}
        ]));
        for source in [SourceKind::Endpoints, SourceKind::EndpointSlice] {
            let mut i = idx(source);
            let apply = |i: &mut Index| match source {
                SourceKind::Endpoints => {
                    i.apply_endpoints(&ep("ns", "web", &["10.0.0.1"], json!({})))
                }
                SourceKind::EndpointSlice => i.apply_slice(&slice(
                    "ns",
                    "web-1",
                    Some("web"),
                    json!([{"addresses": ["10.0.0.1"]}]),
                )),
            };
            assert_eq!(apply(&mut i), vec![k("ns", "web")]);
            let plain = i.get(&k("ns", "web")).unwrap().clone();
            assert!(plain.extras.is_empty());
            assert_eq!(
                plain.version,
                crate::model::object_version(source, &plain.ports, plain.owner_uid.as_deref())
            );
            // The Service arrives: same nodes, aliases and appProtocol added.
            assert_eq!(
                i.set_service("ns", "web", Some(http.clone())),
                vec![k("ns", "web")]
            );
            let with = i.get(&k("ns", "web")).unwrap().clone();
            assert_eq!(with.ports, plain.ports);
            assert_eq!(with.extras.aliases["8000"], "http");
            assert_eq!(with.extras.app_protocols["http"], "kubernetes.io/h2c");
            assert_ne!(with.version, plain.version);
            assert_eq!(with.nodes("8000"), with.nodes("http"));
            assert!(with.nodes("8000").is_some() && with.nodes("9999").is_none());
            // Same Service again: nothing changed.
            assert!(i.set_service("ns", "web", Some(http.clone())).is_empty());
            // An endpoint change keeps the extras.
            let _ = apply(&mut i);
            assert_eq!(i.get(&k("ns", "web")).unwrap().extras, with.extras);
            // Service deleted: back to the plain value, same version as before.
            assert_eq!(i.set_service("ns", "web", None), vec![k("ns", "web")]);
            assert_eq!(i.get(&k("ns", "web")).unwrap(), &plain);
            // Service first, endpoints after: the same result.
            let mut j = idx(source);
            assert!(j.set_service("ns", "web", Some(http.clone())).is_empty());
            let _ = apply(&mut j);
            assert_eq!(j.get(&k("ns", "web")).unwrap().extras, with.extras);
        }
    }

    /// A Service (re)list replaces the known Services: changed and vanished
    /// ones are reported, unchanged ones not; a Service change while an
    /// endpoints relist is arriving ends up in the relist's result.
    #[test]
    fn service_relists_and_changes_during_an_endpoints_relist() {
        let mut i = idx(SourceKind::Endpoints);
        i.apply_endpoints(&ep("ns", "web", &["10.0.0.1"], json!({})));
        i.apply_endpoints(&ep("ns", "api", &["10.0.0.2"], json!({})));
        let http80 = service_info(json!([{"name": "http", "port": 80}]));
        let http81 = service_info(json!([{"name": "http", "port": 81}]));
        let all = |web: &ServiceInfo| {
            vec![
                ("ns".to_string(), "web".to_string(), web.clone()),
                ("ns".to_string(), "api".to_string(), http81.clone()),
            ]
        };
        assert_eq!(
            i.reset_services(all(&http80)),
            vec![k("ns", "api"), k("ns", "web")]
        );
        assert_eq!(i.service_count(), 2);
        assert_eq!(i.get(&k("ns", "web")).unwrap().extras.aliases["80"], "http");
        assert!(i.reset_services(all(&http80)).is_empty());
        // The Service changes while an endpoints relist is arriving.
        i.begin_reset();
        i.reset_add_endpoints(&ep("ns", "web", &["10.0.0.1"], json!({})));
        i.reset_add_endpoints(&ep("ns", "api", &["10.0.0.2"], json!({})));
        // Reported at once (the live state has it), and the relist built
        // before it does not undo it.
        assert_eq!(
            i.set_service("ns", "web", Some(http81.clone())),
            vec![k("ns", "web")]
        );
        assert!(i.finish_reset_endpoints().is_empty());
        assert_eq!(i.get(&k("ns", "web")).unwrap().extras.aliases["81"], "http");
        // Gone from the list: its extras go.
        assert_eq!(
            i.reset_services([("ns".to_string(), "api".to_string(), http81.clone())]),
            vec![k("ns", "web")]
        );
        assert!(i.get(&k("ns", "web")).unwrap().extras.is_empty());
        // A Service outside the namespace filter is not kept.
        let mut f = Index::new(
            String::new(),
            SourceKind::Endpoints,
            ConvertOptions::default(),
            NamespaceFilter::Match(vec![AnchoredRegex::new("dev").unwrap()]),
        );
        assert!(f.set_service("ns", "web", Some(http81.clone())).is_empty());
        assert_eq!(f.service_count(), 0);
    }

    /// `service_port_aliases: false`: no aliases, appProtocols still.
    #[test]
    fn aliases_can_be_turned_off() {
        let mut i = Index::new(
            String::new(),
            SourceKind::Endpoints,
            ConvertOptions {
                service_port_aliases: false,
                ..ConvertOptions::default()
            },
            NamespaceFilter::All,
        );
        i.apply_endpoints(&ep("ns", "web", &["10.0.0.1"], json!({})));
        i.set_service(
            "ns",
            "web",
            Some(service_info(
                json!([{"name": "http", "port": 8000, "appProtocol": "grpc"}]),
            )),
        );
        let s = i.get(&k("ns", "web")).unwrap();
        assert!(s.extras.aliases.is_empty());
        assert_eq!(s.extras.app_protocols["http"], "grpc");
        assert!(s.nodes("8000").is_none());
    }

    fn annotated(annotations: Value) -> ServiceInfo {
        let s: k8s_openapi::api::core::v1::Service = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns", "annotations": annotations},
            "spec": {"ports": [{"name": "http", "port": 80}]}
        }))
        .unwrap();
        ServiceInfo::from_service(&s)
    }

    /// `kubediscovery.io/export` and `kubediscovery.io/weight`, in both
    /// modes and both export modes: "false" deletes the object and "true"
    /// brings it back without a new endpoint event (Endpoints mode keeps
    /// the nodes); the weight applies to every node and goes back to
    /// `default_weight` without it; invalid values are skipped, warned once
    /// and counted, never guessed.
    #[test]
    fn export_and_weight_annotations() {
        for source in [SourceKind::Endpoints, SourceKind::EndpointSlice] {
            for opt_in in [false, true] {
                let mut i = Index::new(
                    String::new(),
                    source,
                    ConvertOptions {
                        export_opt_in: opt_in,
                        ..ConvertOptions::default()
                    },
                    NamespaceFilter::All,
                );
                let web = k("ns", "web");
                let _ = match source {
                    SourceKind::Endpoints => {
                        i.apply_endpoints(&ep("ns", "web", &["10.0.0.1"], json!({})))
                    }
                    SourceKind::EndpointSlice => i.apply_slice(&slice(
                        "ns",
                        "web-1",
                        Some("web"),
                        json!([{"addresses": ["10.0.0.1"]}]),
                    )),
                };
                // No Service known: published unless opt-in.
                assert_eq!(i.get(&web).is_some(), !opt_in, "{source} opt_in={opt_in}");
                // Unannotated Service: the same.
                let _ = i.set_service("ns", "web", Some(annotated(json!({}))));
                assert_eq!(i.get(&web).is_some(), !opt_in);
                // "true": published, with its nodes.
                let _ = i.set_service(
                    "ns",
                    "web",
                    Some(annotated(json!({"kubediscovery.io/export": "true"}))),
                );
                assert_eq!(hosts(&i, &web), vec!["10.0.0.1"]);
                assert_eq!(i.len(), 1);
                // "false": gone (reported), nodes kept aside.
                assert_eq!(
                    i.set_service(
                        "ns",
                        "web",
                        Some(annotated(json!({"kubediscovery.io/export": "false"})))
                    ),
                    vec![web.clone()]
                );
                assert!(i.get(&web).is_none() && i.is_empty() && i.node_count() == 0);
                // A relist while withheld keeps it withheld.
                match source {
                    SourceKind::Endpoints => {
                        assert!(
                            i.reset_endpoints(&[ep("ns", "web", &["10.0.0.1"], json!({}))])
                                .is_empty()
                        )
                    }
                    SourceKind::EndpointSlice => assert!(
                        i.reset_slices(&[slice(
                            "ns",
                            "web-1",
                            Some("web"),
                            json!([{"addresses": ["10.0.0.1"]}]),
                        )])
                        .is_empty()
                    ),
                }
                assert!(i.get(&web).is_none());
                // Weight 7 and "true": back, every node weighs 7.
                assert_eq!(
                    i.set_service(
                        "ns",
                        "web",
                        Some(annotated(json!({"kubediscovery.io/export": "true",
                                               "kubediscovery.io/weight": "7"})))
                    ),
                    vec![web.clone()]
                );
                let s = i.get(&web).unwrap();
                assert_eq!(s.ports["http"][0].weight, 7);
                assert_eq!(i.node_count(), 1);
                assert!(i.take_skipped().is_empty());
                // Invalid values: skipped (as if absent), warned and counted once.
                let bad = annotated(json!({"kubediscovery.io/export": "yes",
                                           "kubediscovery.io/weight": "-1"}));
                let _ = i.set_service("ns", "web", Some(bad.clone()));
                assert_eq!(i.get(&web).is_some(), !opt_in);
                if let Some(s) = i.get(&web) {
                    assert_eq!(s.ports["http"][0].weight, 50);
                }
                let w: Vec<&String> = i.warnings().flat_map(|(_, w)| w).collect();
                assert_eq!(w.len(), 2, "{w:?}");
                assert!(
                    w[0].contains("Service ns/web")
                        && w[0].contains("kubediscovery.io/export=\"yes\""),
                    "{w:?}"
                );
                assert!(w[1].contains("kubediscovery.io/weight=\"-1\""), "{w:?}");
                assert_eq!(
                    i.take_skipped(),
                    BTreeMap::from([(SkipReason::InvalidAnnotation, 2)])
                );
                // The news for an Event: once, naming each annotation.
                let news = i.take_service_news();
                assert_eq!(news.len(), 1, "{news:?}");
                assert_eq!(
                    (news[0].namespace.as_str(), news[0].name.as_str()),
                    ("ns", "web")
                );
                assert_eq!(
                    news[0].warnings.iter().map(|(r, _)| *r).collect::<Vec<_>>(),
                    [SkipReason::InvalidAnnotation, SkipReason::InvalidAnnotation]
                );
                // The same bad Service again (event or relist): not counted again.
                let _ = i.set_service("ns", "web", Some(bad.clone()));
                let _ = i.reset_services([("ns".into(), "web".into(), bad)]);
                assert!(i.take_skipped().is_empty());
                assert!(i.take_service_news().is_empty());
                // Another bad value: news again.
                let worse = annotated(json!({"kubediscovery.io/weight": "heavy"}));
                let _ = i.reset_services([("ns".into(), "web".into(), worse)]);
                let news = i.take_service_news();
                assert_eq!(news.len(), 1, "{news:?}");
                assert!(news[0].warnings[0].1.contains("heavy"), "{news:?}");
                // Fixed, then gone: the warnings go.
                let _ = i.reset_services([("ns".into(), "web".into(), annotated(json!({})))]);
                assert_eq!(i.warnings().count(), 0);
                let _ = i.set_service("ns", "web", None);
                assert_eq!(i.get(&web).is_some(), !opt_in);
            }
        }
    }

    fn external(name: &str, host: &str) -> ServiceInfo {
        let s: k8s_openapi::api::core::v1::Service = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"type": "ExternalName", "externalName": host,
                     "ports": [{"name": "https", "port": 443}, {"port": 80}]}
        }))
        .unwrap();
        ServiceInfo::from_service(&s)
    }

    /// ExternalName Services: ignored unless enabled; allowed hosts (full
    /// match) become one node per port in both modes and survive endpoint
    /// relists; a host outside the allowlist or not a DNS name is skipped
    /// with a warning and counted; a Service that stops being ExternalName
    /// loses those nodes.
    #[test]
    fn external_name_services() {
        let allow = vec![AnchoredRegex::new(r"[a-z0-9-]+\.example\.com").unwrap()];
        for source in [SourceKind::Endpoints, SourceKind::EndpointSlice] {
            // Disabled (default): nothing, no warning.
            let mut off = idx(source);
            assert!(
                off.set_service("ns", "ext", Some(external("ext", "db.example.com")))
                    .is_empty()
            );
            assert!(off.is_empty() && off.warnings().count() == 0);

            let mut i = Index::new(
                String::new(),
                source,
                ConvertOptions {
                    external_name: Some(allow.clone()),
                    service_port_aliases: true,
                    ..ConvertOptions::default()
                },
                NamespaceFilter::All,
            );
            let ext = k("ns", "ext");
            assert_eq!(
                i.set_service("ns", "ext", Some(external("ext", "db.example.com"))),
                vec![ext.clone()]
            );
            let s = i.get(&ext).unwrap();
            assert_eq!(
                serde_json::to_value(&s.ports).unwrap(),
                json!({"80": [{"host": "db.example.com", "port": 80, "weight": 50}],
                       "https": [{"host": "db.example.com", "port": 443, "weight": 50}]})
            );
            assert_eq!(s.extras.aliases["443"], "https");
            // An endpoints relist does not drop it.
            match source {
                SourceKind::Endpoints => assert!(i.reset_endpoints::<Endpoints>(&[]).is_empty()),
                SourceKind::EndpointSlice => {
                    assert!(i.reset_slices::<EndpointSlice>(&[]).is_empty())
                }
            }
            assert!(i.get(&ext).is_some());
            // Outside the allowlist ("evil.example.com.attacker.io" does not
            // fully match) and not a DNS name: skipped, warned, counted.
            assert_eq!(
                i.set_service(
                    "ns",
                    "ext",
                    Some(external("ext", "db.example.com.attacker.io"))
                ),
                vec![ext.clone()]
            );
            assert!(i.get(&ext).is_none());
            let _ = i.set_service("ns", "bad", Some(external("bad", "not a host")));
            assert!(i.get(&k("ns", "bad")).is_none());
            assert_eq!(
                i.take_skipped(),
                BTreeMap::from([
                    (SkipReason::InvalidExternalName, 1),
                    (SkipReason::ExternalNameRefused, 1)
                ])
            );
            let w: Vec<&String> = i.warnings().flat_map(|(_, w)| w).collect();
            assert!(
                w.iter().any(|m| m.contains("Service ns/ext")
                    && m.contains("db.example.com.attacker.io")
                    && m.contains("external_name.allow")),
                "{w:?}"
            );
            // Allowed again, then turned into a ClusterIP Service: gone.
            let _ = i.set_service("ns", "ext", Some(external("ext", "db.example.com")));
            assert!(i.get(&ext).is_some());
            assert_eq!(
                i.set_service(
                    "ns",
                    "ext",
                    Some(service_info(json!([{"name": "http", "port": 80}])))
                ),
                vec![ext.clone()]
            );
            assert!(i.get(&ext).is_none());
        }
    }

    /// An allowed ExternalName Service ignores its EndpointSlices, so the
    /// warnings of what its slices skipped are not current: they must not
    /// stay in `Index::warnings` when the Service becomes ExternalName after
    /// its slices arrived (the other order never records them). Found by
    /// `tests/order_independence.rs`.
    #[test]
    fn an_external_name_service_drops_the_warnings_of_its_slices_in_either_order() {
        let new = || {
            Index::new(
                String::new(),
                SourceKind::EndpointSlice,
                ConvertOptions {
                    external_name: Some(vec![AnchoredRegex::new(r"db\.example\.com").unwrap()]),
                    ..ConvertOptions::default()
                },
                NamespaceFilter::All,
            )
        };
        let bad = slice(
            "ns",
            "ext-1",
            Some("ext"),
            json!([{"addresses": ["999.0.0.1"]}]),
        );
        let info = external("ext", "db.example.com");
        let objects = |i: &Index| -> Vec<String> { i.warnings().map(|(o, _)| o.clone()).collect() };
        // Its slice while a plain Service: the skipped address is warned.
        let mut late = new();
        late.apply_slice(&bad);
        assert_eq!(objects(&late), ["EndpointSlices of ns/ext"]);
        let _ = late.set_service("ns", "ext", Some(info.clone()));
        // The Service first.
        let mut early = new();
        let _ = early.set_service("ns", "ext", Some(info));
        early.apply_slice(&bad);
        let ext = k("ns", "ext");
        assert!(late.get(&ext).is_some() && late.get(&ext) == early.get(&ext));
        assert!(objects(&early).is_empty(), "{:?}", objects(&early));
        assert_eq!(objects(&late), objects(&early), "the order does not matter");
        // No longer ExternalName: its slices count again, with their warnings.
        let _ = late.set_service("ns", "ext", None);
        assert_eq!(objects(&late), ["EndpointSlices of ns/ext"]);
    }

    /// A Service port whose targetPort no endpoint has: no port key, no
    /// alias, lookups find nothing, and the index says why.
    #[test]
    fn unresolved_service_ports_are_exposed_as_data() {
        let mut i = idx(SourceKind::Endpoints);
        i.apply_endpoints(&ep("ns", "web", &["10.0.0.1"], json!({})));
        let _ = i.set_service(
            "ns",
            "web",
            Some(service_info(json!([
                {"name": "http", "port": 80},
                {"name": "admin", "port": 9000, "targetPort": "admin"}
            ]))),
        );
        let web = k("ns", "web");
        let s = i.get(&web).unwrap();
        assert!(s.nodes("admin").is_none() && s.nodes("9000").is_none());
        assert!(s.nodes("80").is_some());
        assert_eq!(
            i.unresolved_ports(&web),
            ["Service port 9000 (admin): no endpoint has targetPort admin; the port has no nodes"]
        );
        assert!(i.unresolved_ports(&k("ns", "nope")).is_empty());
    }
}
