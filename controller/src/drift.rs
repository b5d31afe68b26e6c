//! Live drift correction: the controller watches its OWN DiscoveredServices
//! and puts back whatever someone else changed.
//!
//! ```text
//!  watcher(DiscoveredService, managed-by label; all namespaces or the fixed one)
//!    → store + key index                      the LATEST copy of every object we manage
//!    ├─ Apply(obj)   obj == wanted?  ── no ─▶ WriterHandle::drifted([key])
//!    ├─ Delete(obj)  still wanted?   ── yes ▶ WriterHandle::drifted([key])
//!    └─ InitDone     sweep: every desired key and every cached object (after a relist,
//!                    and once every cluster is listed)
//!
//!  writer (leader only), `drift_delay` later, key not pending / in flight,
//!  no write of it finished within `drift_settle`:
//!    Sink::drift(key, desired) ─ DriftView::check against the store's latest copy
//!      Ok     ─▶ nothing (it was the late watch event of our own write)
//!      Stale  ─▶ look again later (the cache has not seen our last write yet)
//!      Drift  ─▶ forget known[key], rewrite every shard / delete (sink removes strays)
//! ```
//!
//! "Wanted" for an object is the entry of `desired_objects(Shared::desired(key))`
//! with the same namespace/name: its `spec` equal, our labels present with our
//! values, our ownerReferences present. Labels, annotations or owner
//! references that others ADD are tolerated (server-side apply would never
//! remove them, so demanding their absence would rewrite forever). An object
//! that loses the managed-by label leaves the watch's selection: to us it is
//! deleted, and the rewrite puts the label back.
//!
//! Own writes: every watch event of our own writes arrives after the write, and
//! may show an older state than `Shared` already has (a newer change pending).
//! Those events never cause writes: the writer re-checks only after the key has
//! no pending or in-flight write and its last write finished `drift_settle` ago,
//! against the store's latest copy; and the sink records the resourceVersion of
//! every object it wrote, so a cached copy older than our last write is `Stale`,
//! never `Drift`, and a watch event carrying our own write (or an older state)
//! is dismissed without comparing anything (cheap even for a sharded service
//! of megabytes).
//!
//! Orphans: an object with our label whose service has no desired state, once
//! that service's cluster is listed, is deleted (kind `orphan`; also a stray
//! shard of a service that needs fewer). Objects of clusters that are not
//! configured are left alone.
//!
//! Cost: [`DriftView::objects_of`] (every check, every repair) is a lookup in
//! a `ServiceKey -> [(namespace, name)]` index kept next to the store, fed by
//! the same watch events (Apply/Delete; a relist builds a new index between
//! Init and InitDone and swaps it in, as the store does). A check is therefore
//! O(objects of that service), never a scan of the cache: a first start with
//! 10,000 services made 10,000 checks of 10,000 cached objects each before.
//! The index never trusts itself: an entry is returned only while the store
//! holds that object AND its spec still names the service, so an object whose
//! spec someone re-pointed at another service (an old entry stays until the
//! next relist) is never reported twice.
//!
//! The watch decodes a lean copy ([`Lean`]): `managedFields`, annotations
//! and status are skipped while parsing (every write of ours comes back as
//! an event, so this decode runs once per write).
//!
//! Memory: the cache keeps a [`compact`] copy of each object: no
//! `managedFields`, annotations or status (nothing here compares them), and
//! instead of the nodes a 64-bit digest of `spec.ports`. Comparing digests
//! finds every edit of the nodes (short of a hash collision) without holding
//! a second copy of every node: at 100,000 endpoints that copy was ~10-20 MB.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use kube_discovery_core::crd::{
    DiscoveredService, DiscoveredServiceSpec, MANAGED_BY_SELECTOR, NamespaceMode, ObjectNaming,
    desired_objects, key_of, labels_for,
};
use kube_discovery_core::{Node, ServiceKey, ServiceNodes};
use tokio_util::sync::CancellationToken;

use crate::state::Shared;
use crate::writer::WriterHandle;

/// What was wrong with a service's objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriftKind {
    /// An object exists but differs from what we want.
    Edited,
    /// An object we want is missing (deleted, or lost our label).
    Deleted,
    /// An object we manage that we do not want (no source, or a stray shard).
    Orphan,
}

impl DriftKind {
    /// Metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            DriftKind::Edited => "edited",
            DriftKind::Deleted => "deleted",
            DriftKind::Orphan => "orphan",
        }
    }
}

/// Result of comparing the cache with the desired state of one service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriftCheck {
    /// The objects are what we want.
    Ok,
    /// The cache has not seen our last write yet (or is not listed): ask later.
    Stale,
    /// Something must be rewritten or deleted.
    Drift(DriftKind),
}

/// `(namespace, name)` of an object.
pub type ObjName = (String, String);

/// The cache of our own objects plus the resourceVersions of our last writes.
#[derive(Clone)]
pub struct DriftView {
    store: Store<DiscoveredService>,
    naming: ObjectNaming,
    ready: Arc<AtomicBool>,
    written: Arc<Mutex<HashMap<ObjName, u64>>>,
    index: Arc<Mutex<KeyIndex>>,
}

/// Object names by the service their spec describes (see the module docs).
#[derive(Default)]
struct KeyIndex {
    live: HashMap<ServiceKey, Vec<ObjName>>,
    /// The relist being received (Init .. InitDone), like the store's buffer.
    relist: Option<HashMap<ServiceKey, Vec<ObjName>>>,
}

fn index_add(map: &mut HashMap<ServiceKey, Vec<ObjName>>, obj: &DiscoveredService) {
    let name = (obj.namespace().unwrap_or_default(), obj.name_any());
    let key = key_of(obj);
    match map.get_mut(&key) {
        Some(names) => {
            if !names.contains(&name) {
                names.push(name);
            }
        }
        None => {
            map.insert(key, vec![name]);
        }
    }
}

fn index_remove(map: &mut HashMap<ServiceKey, Vec<ObjName>>, obj: &DiscoveredService) {
    let key = key_of(obj);
    let (ns, name) = (obj.namespace().unwrap_or_default(), obj.name_any());
    if let Some(names) = map.get_mut(&key) {
        names.retain(|(n, m)| *n != ns || *m != name);
        if names.is_empty() {
            map.remove(&key);
        }
    }
}

impl KeyIndex {
    fn apply(&mut self, ev: &Event<DiscoveredService>) {
        match ev {
            Event::Init => self.relist = Some(HashMap::new()),
            Event::InitApply(o) => index_add(self.relist.get_or_insert_with(HashMap::new), o),
            Event::InitDone => {
                if let Some(next) = self.relist.take() {
                    self.live = next;
                }
            }
            Event::Apply(o) => index_add(&mut self.live, o),
            Event::Delete(o) => index_remove(&mut self.live, o),
        }
    }
}

/// Whether `obj`'s spec describes `key` (no allocation).
fn describes(obj: &DiscoveredService, key: &ServiceKey) -> bool {
    obj.spec.cluster == key.cluster
        && obj.spec.source_namespace == key.namespace
        && obj.spec.source_name == key.name
}

/// The feeding half of a [`DriftView`]: the watch task.
pub struct DriftFeed {
    writer: reflector::store::Writer<DiscoveredService>,
    view: DriftView,
}

fn rv_of(ds: &DiscoveredService) -> Option<u64> {
    ds.metadata
        .resource_version
        .as_deref()
        .and_then(|s| s.parse().ok())
}

/// Cache-only annotation holding [`ports_digest`] of a cached object's
/// `spec.ports`, which the cache drops (see [`compact`]). Never written to the
/// API server: the cache clears every real annotation first.
pub const PORTS_DIGEST: &str = "kubediscovery.io/cached-ports-digest";

/// A 64-bit fingerprint of `spec.ports` (hex). Process-local: it is only ever
/// compared with another digest computed by the same process.
pub fn ports_digest(ports: &BTreeMap<String, Vec<Node>>) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    ports.hash(&mut h);
    format!("{:016x}", h.finish())
}

/// What the cache keeps of a watched object: no `managedFields`,
/// annotations, status or nodes; the nodes are replaced by their digest
/// ([`PORTS_DIGEST`]). A second full copy of every node (the index holds the
/// first) would cost as much memory as the nodes themselves.
pub fn compact(o: &mut DiscoveredService) {
    let digest = ports_digest(&o.spec.ports);
    o.managed_fields_mut().clear();
    let annotations = o.annotations_mut();
    annotations.clear();
    annotations.insert(PORTS_DIGEST.to_string(), digest);
    o.spec.ports = BTreeMap::new();
    o.status = None;
}

/// `spec.ports` of `o` as a digest: the cached one, else computed.
fn digest_of(o: &DiscoveredService) -> String {
    o.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(PORTS_DIGEST).cloned())
        .unwrap_or_else(|| ports_digest(&o.spec.ports))
}

/// Whether two specs are equal apart from `ports` (compared by digest).
fn equal_but_ports(a: &DiscoveredServiceSpec, b: &DiscoveredServiceSpec) -> bool {
    // Exhaustive: a new spec field must be added here.
    let DiscoveredServiceSpec {
        cluster,
        service,
        source_namespace,
        source_name,
        source,
        ports: _,
        version,
        shard,
    } = a;
    *cluster == b.cluster
        && *service == b.service
        && *source_namespace == b.source_namespace
        && *source_name == b.source_name
        && *source == b.source
        && *version == b.version
        && *shard == b.shard
}

/// Whether `actual` (a cached, [`compact`]ed copy, or a full object) is what
/// `want` says: equal spec (nodes by digest), our labels and owner references
/// present (others' additions tolerated).
pub fn matches(actual: &DiscoveredService, want: &DiscoveredService) -> bool {
    if !equal_but_ports(&actual.spec, &want.spec)
        || digest_of(actual) != ports_digest(&want.spec.ports)
    {
        return false;
    }
    let labels = actual.metadata.labels.as_ref();
    let labels_ok = want
        .metadata
        .labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.and_then(|l| l.get(k)).is_some_and(|have| have == v));
    let owners = actual.metadata.owner_references.as_deref().unwrap_or(&[]);
    let owners_ok = want.metadata.owner_references.iter().flatten().all(|w| {
        owners.iter().any(|o| {
            o.uid == w.uid && o.kind == w.kind && o.name == w.name && o.api_version == w.api_version
        })
    });
    labels_ok && owners_ok
}

impl DriftView {
    /// An empty view and its feed (start the feed with [`DriftFeed::run`]).
    pub fn new(naming: ObjectNaming) -> (DriftView, DriftFeed) {
        let (store, writer) = reflector::store();
        let view = DriftView {
            store,
            naming,
            ready: Arc::new(AtomicBool::new(false)),
            written: Arc::new(Mutex::new(HashMap::new())),
            index: Arc::new(Mutex::new(KeyIndex::default())),
        };
        (view.clone(), DriftFeed { writer, view })
    }

    /// The object naming.
    pub fn naming(&self) -> &ObjectNaming {
        &self.naming
    }

    /// Whether the first list is in the cache.
    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Records the resourceVersion the API server returned for our write of
    /// `ns/name` (or forgets it after a delete).
    pub fn note_written(&self, ns: &str, name: &str, rv: Option<u64>) {
        let mut w = self.written.lock().unwrap_or_else(PoisonError::into_inner);
        let k = (ns.to_string(), name.to_string());
        match rv {
            Some(rv) => {
                w.insert(k, rv);
            }
            None => {
                w.remove(&k);
            }
        }
    }

    fn written_rv(&self, ns: &str, name: &str) -> Option<u64> {
        self.written
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(ns.to_string(), name.to_string()))
            .copied()
    }

    /// Whether the cached `obj` is older than our last write of it.
    fn older_than_our_write(&self, obj: &DiscoveredService) -> bool {
        let (ns, name) = (obj.namespace().unwrap_or_default(), obj.name_any());
        matches!((rv_of(obj), self.written_rv(&ns, &name)), (Some(have), Some(ours)) if have < ours)
    }

    /// Whether `obj` is our own last write of it or older: the watch event of
    /// something we wrote, which needs no comparison (a change of the desired
    /// state since then is queued as a write anyway).
    fn ours_or_older(&self, obj: &DiscoveredService) -> bool {
        let (ns, name) = (obj.namespace().unwrap_or_default(), obj.name_any());
        matches!((rv_of(obj), self.written_rv(&ns, &name)), (Some(have), Some(ours)) if have <= ours)
    }

    /// Whether the object `want` names is intact in the cache: cached, not
    /// older than our last write of it, and [`matches`] `want` (status is not
    /// compared). A repair skips such objects (the sink's apply would only
    /// move their `lastSyncTime`); unknown or stale counts as not intact.
    pub fn intact(&self, want: &DiscoveredService) -> bool {
        let (ns, name) = (want.namespace().unwrap_or_default(), want.name_any());
        self.get(&ns, &name)
            .is_some_and(|have| !self.older_than_our_write(&have) && matches(&have, want))
    }

    fn get(&self, ns: &str, name: &str) -> Option<Arc<DiscoveredService>> {
        self.store.get(&ObjectRef::new(name).within(ns))
    }

    /// Every cached object that describes `key` (by its spec): an index
    /// lookup, O(objects of `key`), checked against the store.
    pub fn objects_of(&self, key: &ServiceKey) -> Vec<ObjName> {
        let candidates = self
            .index
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .live
            .get(key)
            .cloned()
            .unwrap_or_default();
        candidates
            .into_iter()
            .filter(|(ns, name)| self.get(ns, name).is_some_and(|o| describes(&o, key)))
            .collect()
    }

    /// Compares the cache with the desired state of `key` (`None`: no source).
    pub fn check(&self, key: &ServiceKey, desired: Option<&ServiceNodes>) -> DriftCheck {
        if !self.ready() {
            return DriftCheck::Stale;
        }
        self.check_among(desired, &self.objects_of(key))
    }

    /// Every cached object by the service its spec describes (one scan).
    fn by_key(&self) -> HashMap<ServiceKey, Vec<ObjName>> {
        let mut out: HashMap<ServiceKey, Vec<ObjName>> = HashMap::new();
        for o in self.store.state() {
            out.entry(key_of(&o))
                .or_default()
                .push((o.namespace().unwrap_or_default(), o.name_any()));
        }
        out
    }

    /// [`DriftView::check`] with the cached objects of `key` given.
    fn check_among(&self, desired: Option<&ServiceNodes>, present: &[ObjName]) -> DriftCheck {
        let wanted = desired
            .map(|d| desired_objects(d, &self.naming))
            .unwrap_or_default();
        let mut names = BTreeSet::new();
        let mut verdict = DriftCheck::Ok;
        for w in &wanted {
            let (ns, name) = (w.namespace().unwrap_or_default(), w.name_any());
            match self.get(&ns, &name) {
                None => return DriftCheck::Drift(DriftKind::Deleted),
                Some(have) if self.older_than_our_write(&have) => verdict = DriftCheck::Stale,
                Some(have) if !matches(&have, w) => {
                    return DriftCheck::Drift(DriftKind::Edited);
                }
                Some(_) => {}
            }
            names.insert((ns, name));
        }
        if verdict == DriftCheck::Stale {
            return verdict;
        }
        if present.iter().any(|n| !names.contains(n)) {
            return DriftCheck::Drift(DriftKind::Orphan);
        }
        DriftCheck::Ok
    }

    /// Whether a watch event about `obj` needs a closer look by the writer:
    /// `Some(true)` yes, `Some(false)` no, `None` not decidable yet (its
    /// cluster is not listed).
    fn suspicious(&self, obj: &DiscoveredService, deleted: bool, shared: &Shared) -> Option<bool> {
        if !deleted && self.ours_or_older(obj) {
            // Cheap, and the common case: no copy of the desired objects
            // (megabytes for a big service) per event of our own writes.
            return Some(false);
        }
        let key = key_of(obj);
        let listed = shared.clusters().get(&key.cluster).map(|c| c.listed);
        let (ns, name) = (obj.namespace().unwrap_or_default(), obj.name_any());
        match shared.desired(&key) {
            None => match listed {
                // Another cluster's object (not configured here): not ours to judge.
                None => Some(false),
                Some(false) => None,
                // No source: an orphan (a deleted one is simply gone).
                Some(true) => Some(!deleted),
            },
            Some(d) => {
                let wanted = desired_objects(&d, &self.naming);
                let w = wanted
                    .iter()
                    .find(|w| w.namespace().unwrap_or_default() == ns && w.name_any() == name);
                Some(match (w, deleted) {
                    // Not a name we want: a stray (a deleted stray is fine).
                    (None, d) => !d,
                    (Some(_), true) => true,
                    (Some(w), false) => !matches(obj, w),
                })
            }
        }
    }

    /// Keys to check after a (re)list: every desired key of the listed
    /// clusters, and the keys of cached objects without a source.
    fn sweep(&self, shared: &Shared) -> Vec<ServiceKey> {
        let clusters = shared.clusters();
        let mut out = BTreeSet::new();
        if !self.ready() {
            return Vec::new();
        }
        let present = self.by_key();
        for (id, status) in &clusters {
            if !status.listed {
                continue;
            }
            for svc in shared.desired_of(id) {
                let here = present.get(&svc.key).map_or(&[][..], Vec::as_slice);
                if self.check_among(Some(&svc), here) != DriftCheck::Ok {
                    out.insert(svc.key.clone());
                }
            }
        }
        for key in present.keys() {
            if clusters.get(&key.cluster).is_some_and(|c| c.listed) && !shared.has_desired(key) {
                out.insert(key.clone());
            }
        }
        out.into_iter().collect()
    }
}

/// `ns/name` of `obj` for logs, noting when our labels were changed.
fn describe(obj: &DiscoveredService) -> String {
    let ours = labels_for(&key_of(obj))
        .iter()
        .all(|(k, v)| obj.labels().get(k) == Some(v));
    format!(
        "{}/{}{}",
        obj.namespace().unwrap_or_default(),
        obj.name_any(),
        if ours { "" } else { " (labels changed)" }
    )
}

/// A DiscoveredService as the drift watch decodes it: the same resource,
/// but only the metadata the cache keeps (name, namespace, labels, owner
/// references, uid, resourceVersion) is decoded; `managedFields`,
/// annotations and status are skipped while parsing, and the nodes are
/// digested and dropped ([`compact`]). Every write of ours comes back as a
/// watch event, so this decode runs once per write: skipping the
/// `managedFields` alone saves more CPU than the rest of the drift check.
#[derive(Debug, Clone)]
pub(crate) struct Lean(DiscoveredService);

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct LeanMeta {
    name: Option<String>,
    namespace: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    owner_references: Option<Vec<OwnerReference>>,
    resource_version: Option<String>,
    uid: Option<String>,
}

#[derive(serde::Deserialize)]
struct LeanObject {
    metadata: LeanMeta,
    spec: DiscoveredServiceSpec,
}

impl<'de> serde::Deserialize<'de> for Lean {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let LeanObject { metadata: m, spec } = LeanObject::deserialize(d)?;
        let mut o = DiscoveredService {
            metadata: ObjectMeta {
                name: m.name,
                namespace: m.namespace,
                labels: m.labels,
                owner_references: m.owner_references,
                resource_version: m.resource_version,
                uid: m.uid,
                ..ObjectMeta::default()
            },
            spec,
            status: None,
        };
        compact(&mut o);
        Ok(Lean(o))
    }
}

impl Resource for Lean {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        DiscoveredService::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        DiscoveredService::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        DiscoveredService::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        DiscoveredService::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.0.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.0.metadata
    }
}

impl Lean {
    /// The compact object.
    pub(crate) fn into_inner(self) -> DiscoveredService {
        self.0
    }

    fn into_event(ev: Event<Lean>) -> Event<DiscoveredService> {
        match ev {
            Event::Apply(o) => Event::Apply(o.0),
            Event::Delete(o) => Event::Delete(o.0),
            Event::Init => Event::Init,
            Event::InitApply(o) => Event::InitApply(o.0),
            Event::InitDone => Event::InitDone,
        }
    }
}

impl DriftFeed {
    /// Feeds one watch event to the store and to the key index.
    pub fn apply(&mut self, ev: &Event<DiscoveredService>) {
        self.writer.apply_watcher_event(ev);
        self.view
            .index
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .apply(ev);
    }

    /// Watches our DiscoveredServices until `shutdown`, reporting suspicious
    /// keys to `writer`.
    pub async fn run(
        mut self,
        client: Client,
        shared: Arc<Shared>,
        writer: WriterHandle,
        shutdown: CancellationToken,
    ) {
        let view = self.view.clone();
        let api: Api<Lean> = match &view.naming.namespace_mode {
            NamespaceMode::Fixed(ns) => Api::namespaced(client, ns),
            NamespaceMode::Source => Api::all(client),
        };
        let stream = watcher(api, watcher::Config::default().labels(MANAGED_BY_SELECTOR))
            .backoff(crate::source::WatchBackoff::new())
            .map_ok(Lean::into_event);
        let mut stream = std::pin::pin!(stream);
        // A sweep waits until every cluster is listed (desired state known).
        let mut sweep_due = false;
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let ev = tokio::select! {
                () = shutdown.cancelled() => break,
                _ = tick.tick(), if sweep_due => None,
                ev = stream.next() => match ev {
                    Some(ev) => {
                        if let Ok(ev) = &ev {
                            self.apply(ev);
                        }
                        Some(ev)
                    }
                    None => break,
                },
            };
            let Some(ev) = ev else {
                if shared.clusters().values().all(|c| c.listed) {
                    sweep_due = false;
                    let keys = view.sweep(&shared);
                    if !keys.is_empty() {
                        tracing::debug!(keys = keys.len(), "drift sweep found differences");
                    }
                    writer.drifted(keys);
                }
                continue;
            };
            match ev {
                Ok(Event::InitDone) => {
                    view.ready.store(true, Ordering::Release);
                    sweep_due = true;
                }
                Ok(Event::Init | Event::InitApply(_)) => {}
                Ok(Event::Apply(o)) => match view.suspicious(&o, false, &shared) {
                    Some(true) => {
                        tracing::debug!(object = %describe(&o), "DiscoveredService differs from the desired state");
                        writer.drifted(vec![key_of(&o)]);
                    }
                    Some(false) => {}
                    None => sweep_due = true,
                },
                Ok(Event::Delete(o)) => match view.suspicious(&o, true, &shared) {
                    Some(true) => {
                        tracing::debug!(object = %describe(&o), "wanted DiscoveredService deleted");
                        writer.drifted(vec![key_of(&o)]);
                    }
                    Some(false) => {}
                    None => sweep_due = true,
                },
                Err(e) => {
                    tracing::warn!(error = %e, "DiscoveredService watch failed; retrying");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube_discovery_core::crd::desired_object;
    use kube_discovery_core::{Node, PortMap, SourceKind};

    fn svc(hosts: &[&str]) -> ServiceNodes {
        let mut ports = PortMap::new();
        ports.insert(
            "http".into(),
            hosts.iter().map(|h| Node::new(*h, 80, 50)).collect(),
        );
        ServiceNodes::new(
            ServiceKey::new("", "ns", "web"),
            SourceKind::EndpointSlice,
            ports,
            Some("uid-1".into()),
        )
    }

    #[test]
    fn matches_tolerates_additions_but_not_spec_label_or_owner_changes() {
        let want = desired_object(&svc(&["10.0.0.1"]), &ObjectNaming::source());
        assert!(matches(&want, &want));
        let mut extra = want.clone();
        extra
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("team".into(), "blue".into());
        assert!(matches(&extra, &want), "an added label is tolerated");
        let mut edited = want.clone();
        edited.spec.ports.insert("bogus".into(), vec![]);
        assert!(!matches(&edited, &want));
        let mut unlabeled = want.clone();
        unlabeled
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .remove(kube_discovery_core::crd::LABEL_SERVICE_NAME);
        assert!(!matches(&unlabeled, &want));
        let mut orphaned = want.clone();
        orphaned.metadata.owner_references = None;
        assert!(!matches(&orphaned, &want));
    }

    #[test]
    fn a_compact_copy_keeps_no_nodes_but_still_finds_every_edit() {
        let want = desired_object(&svc(&["10.0.0.1", "10.0.0.2"]), &ObjectNaming::source());
        let mut cached = want.clone();
        cached
            .annotations_mut()
            .insert("someone/else".into(), "x".into());
        compact(&mut cached);
        assert!(cached.spec.ports.is_empty(), "nodes dropped");
        assert_eq!(cached.annotations().len(), 1, "only the digest is kept");
        assert!(matches(&cached, &want));
        // Each kind of node edit changes the digest.
        let edits: [fn(&mut DiscoveredService); 4] = [
            |o| {
                o.spec
                    .ports
                    .values_mut()
                    .for_each(|v| v[0].host = "10.9.9.9".into())
            },
            |o| o.spec.ports.values_mut().for_each(|v| v[1].weight += 1),
            |o| o.spec.ports.values_mut().for_each(|v| v.truncate(1)),
            |o| {
                o.spec.ports.insert("extra".into(), vec![]);
            },
        ];
        for (i, edit) in edits.iter().enumerate() {
            let mut edited = want.clone();
            edit(&mut edited);
            compact(&mut edited);
            assert!(!matches(&edited, &want), "edit {i} went unnoticed");
        }
        // Other spec fields are still compared directly.
        let mut repointed = want.clone();
        repointed.spec.version = "0000000000000000".into();
        compact(&mut repointed);
        assert!(!matches(&repointed, &want));
    }

    #[test]
    fn the_watch_decodes_a_lean_compact_copy() {
        let want = desired_object(&svc(&["10.0.0.1"]), &ObjectNaming::source());
        let full = |o: &DiscoveredService| {
            let mut v = serde_json::to_value(o).unwrap();
            v["metadata"]["resourceVersion"] = serde_json::json!("7");
            v["metadata"]["managedFields"] = serde_json::json!([{
                "manager": "kube-discovery", "operation": "Apply",
                "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:ports": {}}}
            }]);
            v["metadata"]["annotations"] = serde_json::json!({"someone/else": "x"});
            v["status"] = serde_json::json!({"nodeCount": 1, "ports": "http"});
            v
        };
        let lean: Lean = serde_json::from_value(full(&want)).unwrap();
        let o = &lean.0;
        assert!(o.managed_fields().is_empty() && o.status.is_none());
        assert!(o.spec.ports.is_empty(), "nodes dropped");
        assert_eq!(o.annotations().len(), 1, "only the digest");
        assert_eq!(o.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(o.labels(), want.labels());
        assert!(matches(o, &want));
        let mut edited = want.clone();
        edited
            .spec
            .ports
            .values_mut()
            .for_each(|v| v[0].weight += 1);
        let lean: Lean = serde_json::from_value(full(&edited)).unwrap();
        assert!(!matches(&lean.0, &want), "a node edit is seen");
        let err = serde_json::from_value::<Lean>(serde_json::json!({"metadata": {}}));
        assert!(
            err.is_err(),
            "no spec: a decode error, not a default object"
        );
    }

    #[test]
    fn an_unlisted_view_never_reports_drift() {
        let (view, _feed) = DriftView::new(ObjectNaming::source());
        let s = svc(&["10.0.0.1"]);
        assert_eq!(view.check(&s.key, Some(&s)), DriftCheck::Stale);
    }

    fn with_rv(mut o: DiscoveredService, rv: u64) -> DiscoveredService {
        o.metadata.resource_version = Some(rv.to_string());
        o
    }

    #[test]
    fn check_reports_deleted_edited_stale_and_stray_objects() {
        let (view, feed) = DriftView::new(ObjectNaming::source());
        let mut w = feed;
        let s = svc(&["10.0.0.1"]);
        let want = desired_object(&s, &ObjectNaming::source());
        w.apply(&Event::Init);
        w.apply(&Event::InitDone);
        view.ready.store(true, Ordering::Release);
        assert_eq!(
            view.check(&s.key, Some(&s)),
            DriftCheck::Drift(DriftKind::Deleted)
        );
        w.apply(&Event::Apply(with_rv(want.clone(), 5)));
        assert_eq!(view.check(&s.key, Some(&s)), DriftCheck::Ok);
        // Someone edits it after our write (rv 5): drift.
        view.note_written("ns", "web", Some(5));
        let mut edited = with_rv(want.clone(), 6);
        edited.spec.ports.clear();
        w.apply(&Event::Apply(edited.clone()));
        assert_eq!(
            view.check(&s.key, Some(&s)),
            DriftCheck::Drift(DriftKind::Edited)
        );
        // We wrote rv 7, the cache still shows 6: not judged yet.
        view.note_written("ns", "web", Some(7));
        assert_eq!(view.check(&s.key, Some(&s)), DriftCheck::Stale);
        w.apply(&Event::Apply(with_rv(want.clone(), 7)));
        assert_eq!(view.check(&s.key, Some(&s)), DriftCheck::Ok);
        // A stray object describing the same service: an orphan.
        let mut stray = with_rv(want.clone(), 8);
        stray.metadata.name = Some("web.9".into());
        w.apply(&Event::Apply(stray));
        assert_eq!(
            view.check(&s.key, Some(&s)),
            DriftCheck::Drift(DriftKind::Orphan)
        );
        // No source at all: whatever is cached is an orphan.
        assert_eq!(
            view.check(&s.key, None),
            DriftCheck::Drift(DriftKind::Orphan)
        );
        assert_eq!(view.objects_of(&s.key).len(), 2);
    }

    #[test]
    fn intact_needs_a_cached_current_matching_copy() {
        let (view, mut w) = DriftView::new(ObjectNaming::source());
        let s = svc(&["10.0.0.1"]);
        let want = desired_object(&s, &ObjectNaming::source());
        let mut written = want.clone();
        written.status = Some(kube_discovery_core::crd::object_status(
            &want,
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH),
        ));
        w.apply(&Event::Init);
        w.apply(&Event::InitDone);
        assert!(!view.intact(&written), "not cached");
        w.apply(&Event::Apply(with_rv(want.clone(), 5)));
        assert!(
            view.intact(&written),
            "cached as wanted (status not compared)"
        );
        view.note_written("ns", "web", Some(6));
        assert!(!view.intact(&written), "the cache is older than our write");
        w.apply(&Event::Apply(with_rv(want.clone(), 6)));
        assert!(view.intact(&written));
        let mut edited = with_rv(want.clone(), 7);
        edited.spec.ports.insert("bogus".into(), vec![]);
        w.apply(&Event::Apply(edited));
        assert!(!view.intact(&written), "edited by someone else");
        w.apply(&Event::Delete(with_rv(want.clone(), 8)));
        assert!(!view.intact(&written), "deleted");
    }

    #[test]
    fn the_key_index_follows_applies_deletes_relists_and_repointed_specs() {
        let (view, mut w) = DriftView::new(ObjectNaming::source());
        let s = svc(&["10.0.0.1"]);
        let want = desired_object(&s, &ObjectNaming::source());
        let mut shard = want.clone();
        shard.metadata.name = Some("web.1".into());
        let web = || ("ns".to_string(), "web".to_string());
        let web1 = || ("ns".to_string(), "web.1".to_string());
        w.apply(&Event::Init);
        w.apply(&Event::InitApply(want.clone()));
        assert!(
            view.objects_of(&s.key).is_empty(),
            "a relist counts once done"
        );
        w.apply(&Event::InitDone);
        assert_eq!(view.objects_of(&s.key), vec![web()]);
        w.apply(&Event::Apply(shard.clone()));
        w.apply(&Event::Apply(shard.clone()));
        assert_eq!(
            view.objects_of(&s.key),
            vec![web(), web1()],
            "no duplicates"
        );
        // Someone points web.1 at another service: it leaves `web`.
        let mut repointed = shard.clone();
        repointed.spec.source_name = "api".into();
        w.apply(&Event::Apply(repointed.clone()));
        let api = ServiceKey::new("", "ns", "api");
        assert_eq!(view.objects_of(&s.key), vec![web()]);
        assert_eq!(view.objects_of(&api), vec![web1()]);
        w.apply(&Event::Delete(repointed));
        assert!(view.objects_of(&api).is_empty());
        assert_eq!(view.objects_of(&s.key), vec![web()]);
        // A relist without `web` replaces the index; one with it brings it back.
        w.apply(&Event::Init);
        w.apply(&Event::InitDone);
        assert!(view.objects_of(&s.key).is_empty());
        w.apply(&Event::Init);
        w.apply(&Event::InitApply(shard));
        w.apply(&Event::InitDone);
        assert_eq!(view.objects_of(&s.key), vec![web1()]);
    }

    #[test]
    fn own_write_events_are_not_suspicious_but_later_edits_are() {
        let (view, feed) = DriftView::new(ObjectNaming::source());
        let mut w = feed;
        w.apply(&Event::Init);
        w.apply(&Event::InitDone);
        view.ready.store(true, Ordering::Release);
        let shared = Shared::new([""]);
        shared.update_cluster("", |c| c.listed = true);
        let old = svc(&["10.0.0.1"]);
        let new = svc(&["10.0.0.2"]);
        shared.set_desired(&new.key, Some(new.clone()));
        // The late event of our write of the OLD state (rv 3, we wrote rv 3).
        let ours = with_rv(desired_object(&old, &ObjectNaming::source()), 3);
        view.note_written("ns", "web", Some(3));
        assert_eq!(view.suspicious(&ours, false, &shared), Some(false));
        // The same content at a later rv is someone else's: it differs.
        let theirs = with_rv(desired_object(&old, &ObjectNaming::source()), 4);
        assert_eq!(view.suspicious(&theirs, false, &shared), Some(true));
        // A delete of a wanted object is always suspicious.
        assert_eq!(view.suspicious(&ours, true, &shared), Some(true));
        // Unknown cluster: not ours to judge; unlisted cluster: later.
        let mut other = theirs.clone();
        other.spec.cluster = "c9".into();
        assert_eq!(view.suspicious(&other, false, &shared), Some(false));
        let unlisted = Shared::new([""]);
        assert_eq!(view.suspicious(&theirs, false, &unlisted), None);
    }
}
