//! The pure per-cluster index: watch events go in, the keys whose DESIRED
//! nodes changed come out; `get(key)` answers the desired state (`None`:
//! delete the object).
//!
//! ```text
//!  apply_* / delete_* / reset_*  ──▶  Index  ──▶  Vec<ServiceKey> (changed)
//! ```
//!
//! * A change is reported only when the resulting [`ServiceNodes`] differs
//!   (nodes, version or owner UID): annotation edits, `resourceVersion`
//!   bumps or a not-ready endpoint flapping report nothing.
//! * `reset_*` (after a relist) replaces the whole state: vanished services
//!   are reported, unchanged ones are not. A listed object whose
//!   resourceVersion equals the one held is reused unconverted, so a relist
//!   costs O(changed objects), with exactly the result of converting
//!   everything again (tested). It can be fed one object at a time
//!   ([`Index::begin_reset`], `reset_add_*`, `finish_reset_*`), so the
//!   runtime never buffers the raw list; until the finish, reads see the old
//!   state.
//! * The namespace filter and the label selector apply here too: an object
//!   that stops matching is treated like a delete.
//! * Services (kept as a small [`ServiceInfo`], never the object) give the
//!   owner UID when the endpoint objects carry none, the port extras, the
//!   weight, export (withheld services are kept aside, so exporting them
//!   again needs no new list) and ExternalName desired states.
//! * Warnings are logged once per object and change, readable with
//!   [`Index::warnings`] and counted by [`SkipReason`]
//!   ([`Index::take_skipped`]).
//! * Memory: a slice is kept as its [`SliceContribution`], not the object;
//!   each desired state is an [`Arc`] the runtime shares
//!   ([`Index::get_arc`]).
//!
//! Files: `endpoints` and `slices` (one per source kind), `services`,
//! `relist` (what a relist shares), `desired` (building and storing a
//! desired state), `warnings`.

use std::collections::{BTreeMap, BTreeSet};

use std::sync::Arc;

use compact_str::CompactString;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use kube::Resource;

use litemap::LiteMap;

use crate::source::convert::{
    ConvertOptions, MergeState, Patch, SkipReason, SliceContribution, from_endpoints, merge_slices,
    owner_service_uid,
};

use crate::source::filter::{LabelSelector, NamespaceFilter};

use crate::source::lean::{AsLeanEndpoints, AsLeanSlice, LeanEndpointSlice, LeanEndpoints};

use crate::model::{PortExtras, PortMap, ServiceKey, ServiceNodes, SourceKind};

use crate::source::service::{ServiceInfo, port_extras};

use crate::crd::shards::Buckets;

mod desired;
mod endpoints;
mod relist;
mod services;
mod slices;
mod warnings;

use relist::{compacted, replace_ids};
use warnings::merge_warnings_key;

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
}

#[cfg(test)]
mod incremental_tests;
#[cfg(test)]
mod small_merge_tests;
#[cfg(test)]
mod tests;
