//! Live drift correction: the controller watches its OWN DiscoveredServices
//! and puts back whatever someone else changed.
//!
//! ```text
//!  watcher(DiscoveredService as Watched, managed-by label; all namespaces or the fixed one)
//!    → Cache: (namespace, name) -> Slot      a slim entry per object, plus a key index
//!    ├─ Apply(obj)   obj == wanted?  ── no ─▶ WriterHandle::drifted([key])
//!    ├─ Delete(obj)  still wanted?   ── yes ▶ WriterHandle::drifted([key])
//!    └─ InitDone     sweep: every desired key and every cached object (after a relist,
//!                    and once every cluster is listed)
//!
//!  writer (leader only), `drift_delay` later, key not pending / in flight,
//!  no write of it finished within `drift_settle`:
//!    Sink::drift(key, desired) ─ DriftView::check against the cache's latest entries
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
//! against the cache's latest entry; and the sink records the resourceVersion
//! of every object it wrote ([`DriftView::note_written`]), so a cached entry
//! older than our last write is `Stale`, never `Drift`, and a watch event
//! carrying our own write (or an older state) is dismissed without comparing
//! anything (cheap even for a sharded service of megabytes).
//!
//! Orphans: an object with our label whose service has no desired state, once
//! that service's cluster is listed, is deleted (kind `orphan`; also a stray
//! shard of a service that needs fewer). Objects of clusters that are not
//! configured are left alone.
//!
//! # The cache: one slim entry per object
//!
//! Nothing here needs an object's content, only whether it equals what we
//! want. So the watch reduces every object to its [`Facts`] while decoding
//! ([`Watched`]; `managedFields`, annotations and status are skipped by the
//! parser, the nodes are hashed and dropped), and the cache keeps, per
//! object, a `Slot`:
//!
//! * `namespace + name` (one allocation) and, only when it cannot be derived
//!   from them, the service its spec describes (`cluster ""`, same namespace,
//!   same name: the common case with the default naming, no allocation);
//! * a 64-bit digest of the WHOLE spec (`SpecView`: every field including
//!   the nodes; built by exhaustive destructuring, so a new spec field does
//!   not compile until it is hashed);
//! * whether OUR labels are present with our values. "Ours" is a function of
//!   the spec ([`labels_for`] of the service it describes, plus
//!   [`LABEL_SHARD`] with the shard index when sharded); two objects with
//!   equal spec digests therefore want the same labels, and one bit answers
//!   "our labels present" for any wanted object the spec digest matches.
//!   Labels others add are never looked at;
//! * digests of its ownerReferences (`apiVersion, kind, name, uid`; usually
//!   one, stored inline): ours must be among them, others are tolerated;
//! * the resourceVersion of the cached copy and that of our last write of it
//!   (`note_written`; the same slot, so no second map of names). A slot that
//!   only carries our write (the watch has not shown the object, or it was
//!   deleted) is not "cached" and invisible to every check.
//!
//! That is 72 bytes inline, plus the name (~32 bytes) and a key-index entry
//! (24 bytes) per object, about 170-200 bytes with the hash tables' spare
//! room (heaptrack, 10,000 services: 1.95 MB for the whole cache); the
//! kube-runtime `Store` of compact `DiscoveredService` copies it replaces
//! held ~2.4 KB per object (ObjectMeta, label maps, `Arc`s, a separate
//! `ServiceKey` index and a map of written versions: 23.6 MB). Objects
//! whose service cannot be derived from their name (multi-cluster ids,
//! the fixed-namespace naming, shards `name.N`) carry a boxed `ServiceKey`
//! (~120 bytes more).
//!
//! The table is a `hashbrown::HashTable` of slots hashed by name, so the
//! name is stored once; the key index maps a key digest to the name hashes
//! of its objects and never trusts itself: a hit counts only when the slot
//! is cached and its own service equals the key asked for.
//!
//! Relists: `Init` starts a new cache, `InitApply` fills it, `InitDone`
//! swaps it in (what kube-runtime's store does), carrying over the versions
//! of our writes; until then checks use the old cache.
//!
//! # Comparing without copies of the nodes
//!
//! The wanted side is reduced to the same form (`Want`): for a service
//! that fits one object (`kube_discovery_core::crd::ports_fit`, the size
//! estimate `split_ports` uses), the spec digest is computed straight from
//! `ServiceNodes` (borrowed, no node cloned); only a service that needs
//! shards is expanded with `desired_objects` and each shard reduced. A
//! sweep over 10,000 services therefore clones no node.
//!
//! Cost: [`DriftView::objects_of`] (every check, every repair) is a lookup
//! in the key index, O(objects of that service), never a scan.

use std::borrow::Cow;
use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{BuildHasher, Hash, Hasher, RandomState};
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use hashbrown::HashTable;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Api, Client, Resource};
use kube_discovery_core::crd::{
    DiscoveredService, DiscoveredServiceSpec, LABEL_SHARD, MANAGED_BY_SELECTOR,
    MAX_OBJECT_PORTS_BYTES, NamespaceMode, ObjectNaming, Shard, desired_objects_with_limit,
    labels_for, ports_fit,
};
use kube_discovery_core::{PortMap, ServiceKey, ServiceNodes, SourceKind};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::source::{WatchBackoff, is_gone, next_after};
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

// ---------------------------------------------------------------------------
// Digests
// ---------------------------------------------------------------------------

/// A 64-bit fingerprint of a port map (every port key and every field of
/// every node). Process-local: only ever compared with another digest of the
/// same process (std's `DefaultHasher::new()` has fixed keys).
pub fn ports_digest(ports: &PortMap) -> u64 {
    let mut h = DefaultHasher::new();
    ports.hash(&mut h);
    h.finish()
}

/// A spec by reference: what [`SpecView::digest`] hashes. Built from an
/// object's spec ([`SpecView::of`], exhaustive destructuring) or straight
/// from a `ServiceNodes` ([`wanted_with_limit`], a struct literal): a new
/// spec field fails to compile in both until it is added here.
struct SpecView<'a> {
    cluster: &'a str,
    service: &'a str,
    source_namespace: &'a str,
    source_name: &'a str,
    source: SourceKind,
    ports: &'a PortMap,
    version: &'a str,
    /// `(index, count)`.
    shard: Option<(u32, u32)>,
}

impl<'a> SpecView<'a> {
    fn of(spec: &'a DiscoveredServiceSpec) -> Self {
        let DiscoveredServiceSpec {
            cluster,
            service,
            source_namespace,
            source_name,
            source,
            ports,
            version,
            shard,
        } = spec;
        SpecView {
            cluster,
            service,
            source_namespace,
            source_name,
            source: *source,
            ports,
            version,
            shard: shard
                .as_ref()
                .map(|Shard { index, count }| (*index, *count)),
        }
    }

    /// 64-bit digest of every field.
    fn digest(&self) -> u64 {
        let SpecView {
            cluster,
            service,
            source_namespace,
            source_name,
            source,
            ports,
            version,
            shard,
        } = self;
        let mut h = DefaultHasher::new();
        cluster.hash(&mut h);
        service.hash(&mut h);
        source_namespace.hash(&mut h);
        source_name.hash(&mut h);
        source.hash(&mut h);
        ports.hash(&mut h);
        version.hash(&mut h);
        shard.hash(&mut h);
        h.finish()
    }
}

/// Digest of one ownerReference as [`matches()`] compares it.
fn owner_digest(api_version: &str, kind: &str, name: &str, uid: &str) -> u64 {
    let mut h = DefaultHasher::new();
    api_version.hash(&mut h);
    kind.hash(&mut h);
    name.hash(&mut h);
    uid.hash(&mut h);
    h.finish()
}

/// Owner-reference digests of an object; one inline (the usual case).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Owners {
    None,
    One(u64),
    // A thin pointer keeps the slot small; more than one owner is rare.
    #[allow(clippy::box_collection)]
    Many(Box<Vec<u64>>),
}

impl Owners {
    fn of(refs: &[OwnerReference]) -> Self {
        let mut digests: Vec<u64> = refs
            .iter()
            .map(|o| owner_digest(&o.api_version, &o.kind, &o.name, &o.uid))
            .collect();
        match digests.len() {
            0 => Owners::None,
            1 => Owners::One(digests[0]),
            _ => {
                digests.sort_unstable();
                digests.dedup();
                Owners::Many(Box::new(digests))
            }
        }
    }

    fn contains(&self, d: u64) -> bool {
        match self {
            Owners::None => false,
            Owners::One(o) => *o == d,
            Owners::Many(v) => v.binary_search(&d).is_ok(),
        }
    }
}

/// Whether `labels` carry our labels for `spec` with our values: the
/// labels of [`labels_for`] the service the spec describes, plus
/// [`LABEL_SHARD`] = index when the spec is a shard (what
/// `desired_objects` sets).
fn our_labels_present(
    labels: Option<&BTreeMap<String, String>>,
    spec: &DiscoveredServiceSpec,
) -> bool {
    let key = ServiceKey::new(&spec.cluster, &spec.source_namespace, &spec.source_name);
    let get = |k: &str| labels.and_then(|l| l.get(k));
    labels_for(&key).iter().all(|(k, v)| get(k) == Some(v))
        && spec
            .shard
            .as_ref()
            .is_none_or(|s| get(LABEL_SHARD).is_some_and(|v| *v == s.index.to_string()))
}

/// What drift compares of an object (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    spec: u64,
    owners: Owners,
    labels_ok: bool,
}

impl Facts {
    fn of(
        labels: Option<&BTreeMap<String, String>>,
        owners: Option<&[OwnerReference]>,
        spec: &DiscoveredServiceSpec,
    ) -> Self {
        Facts {
            spec: SpecView::of(spec).digest(),
            owners: Owners::of(owners.unwrap_or(&[])),
            labels_ok: our_labels_present(labels, spec),
        }
    }

    fn of_object(o: &DiscoveredService) -> Self {
        Facts::of(
            o.metadata.labels.as_ref(),
            o.metadata.owner_references.as_deref(),
            &o.spec,
        )
    }

    fn satisfies(&self, w: &Want) -> bool {
        satisfies(self.spec, &self.owners, self.labels_ok, w)
    }
}

fn satisfies(spec: u64, owners: &Owners, labels_ok: bool, w: &Want) -> bool {
    spec == w.spec && labels_ok && w.owners.iter().all(|o| owners.contains(*o))
}

/// One object we want, reduced like a cached one: its name, the digest of
/// its spec and its owner references (its labels are ours for that spec).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Want {
    ns: String,
    name: String,
    spec: u64,
    owners: Vec<u64>,
}

impl Want {
    fn of(o: &DiscoveredService) -> Self {
        Want {
            ns: o.metadata.namespace.clone().unwrap_or_default(),
            name: o.metadata.name.clone().unwrap_or_default(),
            spec: SpecView::of(&o.spec).digest(),
            owners: o
                .metadata
                .owner_references
                .iter()
                .flatten()
                .map(|r| owner_digest(&r.api_version, &r.kind, &r.name, &r.uid))
                .collect(),
        }
    }
}

/// Whether `actual` is what `want` (an object of `desired_objects`) says:
/// equal spec (by digest, nodes included), our labels and owner references
/// present (others' additions tolerated).
pub fn matches(actual: &DiscoveredService, want: &DiscoveredService) -> bool {
    Facts::of_object(actual).satisfies(&Want::of(want))
}

/// The objects wanted for `d`, reduced ([`Want`]), in `desired_objects` order.
fn wanted(d: &ServiceNodes, naming: &ObjectNaming, max_ports_bytes: usize) -> Vec<Want> {
    if !ports_fit(&d.ports, max_ports_bytes) {
        return desired_objects_with_limit(d, naming, max_ports_bytes)
            .iter()
            .map(Want::of)
            .collect();
    }
    // One object: `desired_object` without building it (no node cloned).
    let key = &d.key;
    let service = key.to_string();
    let spec = SpecView {
        cluster: &key.cluster,
        service: &service,
        source_namespace: &key.namespace,
        source_name: &key.name,
        source: d.source,
        ports: &d.ports,
        version: &d.version,
        shard: None,
    };
    let owners = match &d.owner_uid {
        Some(uid) if naming.owner_references_allowed(key) => {
            vec![owner_digest("v1", "Service", &key.name, uid)]
        }
        _ => Vec::new(),
    };
    vec![Want {
        ns: naming.namespace(key),
        name: naming.name(key),
        spec: spec.digest(),
        owners,
    }]
}

// ---------------------------------------------------------------------------
// The cache
// ---------------------------------------------------------------------------

/// A resourceVersion as kept: `rv + 1`, so `None` costs no extra word
/// (`u64::MAX`, never a real version, counts as unknown).
type Rv = Option<NonZeroU64>;

fn pack_rv(rv: Option<u64>) -> Rv {
    rv.and_then(|v| v.checked_add(1)).and_then(NonZeroU64::new)
}

fn parse_rv(s: Option<&str>) -> Rv {
    pack_rv(s.and_then(|s| s.parse().ok()))
}

/// One object (see the module docs for the memory budget).
struct Slot {
    /// `namespace` followed by `name`; split at `ns_len`.
    text: Box<str>,
    /// The service its spec describes; `None`: `("", namespace, name)`.
    key: Option<Box<ServiceKey>>,
    owners: Owners,
    spec: u64,
    /// resourceVersion of the cached copy.
    rv: Rv,
    /// resourceVersion of our last write.
    written: Rv,
    ns_len: u32,
    labels_ok: bool,
    /// Whether the watch shows the object (else only `written` is known).
    cached: bool,
}

impl Slot {
    fn new(ns: &str, name: &str) -> Self {
        Slot {
            text: format!("{ns}{name}").into_boxed_str(),
            key: None,
            owners: Owners::None,
            spec: 0,
            rv: None,
            written: None,
            ns_len: u32::try_from(ns.len()).unwrap_or(u32::MAX),
            labels_ok: false,
            cached: false,
        }
    }

    fn ns(&self) -> &str {
        self.text.get(..self.ns_len as usize).unwrap_or("")
    }

    fn name(&self) -> &str {
        self.text.get(self.ns_len as usize..).unwrap_or("")
    }

    fn is(&self, ns: &str, name: &str) -> bool {
        self.ns() == ns && self.name() == name
    }

    fn obj_name(&self) -> ObjName {
        (self.ns().to_string(), self.name().to_string())
    }

    fn key_is(&self, key: &ServiceKey) -> bool {
        match &self.key {
            None => key.cluster.is_empty() && key.namespace == self.ns() && key.name == self.name(),
            Some(k) => **k == *key,
        }
    }

    fn service_key(&self) -> ServiceKey {
        match &self.key {
            None => ServiceKey::new("", self.ns(), self.name()),
            Some(k) => (**k).clone(),
        }
    }

    /// Whether the cached copy is older than our last write of it.
    fn older_than_our_write(&self) -> bool {
        matches!((self.rv, self.written), (Some(have), Some(ours)) if have < ours)
    }

    fn satisfies(&self, w: &Want) -> bool {
        satisfies(self.spec, &self.owners, self.labels_ok, w)
    }
}

/// Name hashes of the objects of one service (usually one).
#[derive(Debug)]
enum Names {
    One(u64),
    #[allow(clippy::box_collection)]
    Many(Box<Vec<u64>>),
}

impl Names {
    fn as_slice(&self) -> &[u64] {
        match self {
            Names::One(h) => std::slice::from_ref(h),
            Names::Many(v) => v,
        }
    }
}

/// The slots of every object plus the key index (see the module docs).
struct Cache {
    hasher: RandomState,
    slots: HashTable<Slot>,
    /// Key digest -> name hashes of the cached objects describing it.
    by_key: HashMap<u64, Names>,
}

fn name_hash(s: &RandomState, ns: &str, name: &str) -> u64 {
    let mut h = s.build_hasher();
    ns.hash(&mut h);
    name.hash(&mut h);
    h.finish()
}

fn key_hash(s: &RandomState, cluster: &str, ns: &str, name: &str) -> u64 {
    let mut h = s.build_hasher();
    cluster.hash(&mut h);
    ns.hash(&mut h);
    name.hash(&mut h);
    h.finish()
}

fn slot_key_hash(s: &RandomState, slot: &Slot) -> u64 {
    match &slot.key {
        None => key_hash(s, "", slot.ns(), slot.name()),
        Some(k) => key_hash(s, &k.cluster, &k.namespace, &k.name),
    }
}

impl Cache {
    fn new() -> Self {
        Cache {
            hasher: RandomState::new(),
            slots: HashTable::new(),
            by_key: HashMap::new(),
        }
    }

    fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.cached).count()
    }

    fn slot(&self, ns: &str, name: &str) -> Option<&Slot> {
        let h = name_hash(&self.hasher, ns, name);
        self.slots.find(h, |s| s.is(ns, name))
    }

    /// The slot of a cached object.
    fn cached(&self, ns: &str, name: &str) -> Option<&Slot> {
        self.slot(ns, name).filter(|s| s.cached)
    }

    fn written(&self, ns: &str, name: &str) -> Rv {
        self.slot(ns, name).and_then(|s| s.written)
    }

    /// The slot of `ns/name`, created (not cached) when missing.
    fn slot_mut(&mut self, ns: &str, name: &str) -> &mut Slot {
        let Cache { hasher, slots, .. } = self;
        let h = name_hash(hasher, ns, name);
        slots
            .entry(
                h,
                |s| s.is(ns, name),
                |s| name_hash(hasher, s.ns(), s.name()),
            )
            .or_insert_with(|| Slot::new(ns, name))
            .into_mut()
    }

    fn link(&mut self, kh: u64, h: u64) {
        match self.by_key.get_mut(&kh) {
            None => {
                self.by_key.insert(kh, Names::One(h));
            }
            Some(Names::One(o)) if *o == h => {}
            Some(names @ Names::One(_)) => {
                let first = names.as_slice()[0];
                *names = Names::Many(Box::new(vec![first, h]));
            }
            Some(Names::Many(v)) => {
                if !v.contains(&h) {
                    v.push(h);
                }
            }
        }
    }

    /// Drops `h` from the objects of `kh`, unless another cached slot with
    /// the same name hash still describes `kh` (a 64-bit collision).
    fn unlink(&mut self, kh: u64, h: u64) {
        let still = self.slots.iter_hash(h).any(|s| {
            s.cached
                && name_hash(&self.hasher, s.ns(), s.name()) == h
                && slot_key_hash(&self.hasher, s) == kh
        });
        if still {
            return;
        }
        let empty = match self.by_key.get_mut(&kh) {
            None => false,
            Some(Names::One(o)) => *o == h,
            Some(Names::Many(v)) => {
                v.retain(|x| *x != h);
                v.is_empty()
            }
        };
        if empty {
            self.by_key.remove(&kh);
        }
    }

    /// The watch shows `w` (Apply / InitApply).
    fn apply(&mut self, w: &Watched) {
        let (ns, name) = (w.ns(), w.name());
        let h = name_hash(&self.hasher, ns, name);
        let new_kh = key_hash(&self.hasher, &w.key.cluster, &w.key.namespace, &w.key.name);
        let hasher = self.hasher.clone();
        let slot = self.slot_mut(ns, name);
        let old_kh = slot.cached.then(|| slot_key_hash(&hasher, slot));
        slot.key = (!(w.key.cluster.is_empty() && w.key.namespace == ns && w.key.name == name))
            .then(|| Box::new(w.key.clone()));
        slot.spec = w.facts.spec;
        slot.owners = w.facts.owners.clone();
        slot.labels_ok = w.facts.labels_ok;
        slot.rv = parse_rv(w.meta.resource_version.as_deref());
        slot.cached = true;
        if old_kh != Some(new_kh) {
            self.link(new_kh, h);
            if let Some(old) = old_kh {
                self.unlink(old, h);
            }
        }
    }

    /// The watch shows `ns/name` deleted; our last write is remembered.
    fn delete(&mut self, ns: &str, name: &str) {
        let Cache { hasher, slots, .. } = self;
        let h = name_hash(hasher, ns, name);
        let Ok(mut entry) = slots.find_entry(h, |s| s.is(ns, name)) else {
            return;
        };
        let slot = entry.get_mut();
        if !slot.cached {
            return;
        }
        let kh = slot_key_hash(hasher, slot);
        if slot.written.is_some() {
            slot.cached = false;
            slot.key = None;
            slot.owners = Owners::None;
        } else {
            entry.remove();
        }
        self.unlink(kh, h);
    }

    fn note_written(&mut self, ns: &str, name: &str, rv: Rv) {
        match rv {
            Some(_) => self.slot_mut(ns, name).written = rv,
            None => {
                let h = name_hash(&self.hasher, ns, name);
                if let Ok(mut entry) = self.slots.find_entry(h, |s| s.is(ns, name)) {
                    if entry.get().cached {
                        entry.get_mut().written = None;
                    } else {
                        entry.remove();
                    }
                }
            }
        }
    }

    /// Cached objects whose spec describes `key`, in the order they came.
    fn objects_of(&self, key: &ServiceKey) -> Vec<ObjName> {
        let kh = key_hash(&self.hasher, &key.cluster, &key.namespace, &key.name);
        let Some(names) = self.by_key.get(&kh) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for &h in names.as_slice() {
            for s in self.slots.iter_hash(h) {
                if s.cached && s.key_is(key) && name_hash(&self.hasher, s.ns(), s.name()) == h {
                    out.push(s.obj_name());
                }
            }
        }
        out
    }

    /// Takes over the versions of our writes from `old` (a relist replaces
    /// what the watch showed, not what we wrote).
    fn adopt_written(&mut self, old: &Cache) {
        for s in old.slots.iter() {
            if s.written.is_some() {
                self.slot_mut(s.ns(), s.name()).written = s.written;
            }
        }
    }
}

/// The live cache and the relist being received.
struct Caches {
    live: Cache,
    /// `Init` .. `InitDone`, like the store's buffer.
    relist: Option<Cache>,
}

impl Caches {
    fn apply(&mut self, ev: &Event<Watched>) {
        match ev {
            Event::Init => self.relist = Some(Cache::new()),
            Event::InitApply(o) => self.relist.get_or_insert_with(Cache::new).apply(o),
            Event::InitDone => {
                let mut next = self.relist.take().unwrap_or_else(Cache::new);
                next.adopt_written(&self.live);
                self.live = next;
            }
            Event::Apply(o) => self.live.apply(o),
            Event::Delete(o) => self.live.delete(o.ns(), o.name()),
        }
    }
}

// ---------------------------------------------------------------------------
// The view
// ---------------------------------------------------------------------------

/// The cache of our own objects plus the resourceVersions of our last writes.
#[derive(Clone)]
pub struct DriftView {
    naming: ObjectNaming,
    ready: Arc<AtomicBool>,
    caches: Arc<Mutex<Caches>>,
    /// The object size bound of `desired_objects` (tests use small ones).
    max_ports_bytes: usize,
}

/// The feeding half of a [`DriftView`]: the watch task.
pub struct DriftFeed {
    view: DriftView,
}

impl DriftView {
    /// An empty view and its feed (start the feed with [`DriftFeed::run`]).
    pub fn new(naming: ObjectNaming) -> (DriftView, DriftFeed) {
        let view = DriftView {
            naming,
            ready: Arc::new(AtomicBool::new(false)),
            caches: Arc::new(Mutex::new(Caches {
                live: Cache::new(),
                relist: None,
            })),
            max_ports_bytes: MAX_OBJECT_PORTS_BYTES,
        };
        (view.clone(), DriftFeed { view })
    }

    fn lock(&self) -> MutexGuard<'_, Caches> {
        self.caches.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The object naming.
    pub fn naming(&self) -> &ObjectNaming {
        &self.naming
    }

    /// Whether the first list is in the cache.
    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Number of objects in the (live) cache.
    pub fn len(&self) -> usize {
        self.lock().live.len()
    }

    /// Whether the (live) cache holds no object.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records the resourceVersion the API server returned for our write of
    /// `ns/name` (or forgets it after a delete).
    pub fn note_written(&self, ns: &str, name: &str, rv: Option<u64>) {
        self.lock().live.note_written(ns, name, pack_rv(rv));
    }

    /// Whether the watch event `w` is our own last write of it or older:
    /// it needs no comparison (a change of the desired state since then is
    /// queued as a write anyway).
    fn ours_or_older(&self, w: &Watched) -> bool {
        let ours = self.lock().live.written(w.ns(), w.name());
        let have = parse_rv(w.meta.resource_version.as_deref());
        matches!((have, ours), (Some(have), Some(ours)) if have <= ours)
    }

    /// Whether the object `want` names is intact in the cache: cached, not
    /// older than our last write of it, and [`matches()`] `want` (status is not
    /// compared). A repair skips such objects (the sink's apply would only
    /// move their `lastSyncTime`); unknown or stale counts as not intact.
    pub fn intact(&self, want: &DiscoveredService) -> bool {
        let w = Want::of(want);
        self.lock()
            .live
            .cached(&w.ns, &w.name)
            .is_some_and(|s| !s.older_than_our_write() && s.satisfies(&w))
    }

    /// Every cached object that describes `key` (by its spec): an index
    /// lookup, O(objects of `key`).
    pub fn objects_of(&self, key: &ServiceKey) -> Vec<ObjName> {
        self.lock().live.objects_of(key)
    }

    /// Compares the cache with the desired state of `key` (`None`: no source).
    pub fn check(&self, key: &ServiceKey, desired: Option<&ServiceNodes>) -> DriftCheck {
        if !self.ready() {
            return DriftCheck::Stale;
        }
        self.check_among(desired, &self.objects_of(key))
    }

    /// [`DriftView::check`] with the cached objects of `key` given.
    fn check_among(&self, desired: Option<&ServiceNodes>, present: &[ObjName]) -> DriftCheck {
        let wanted = desired
            .map(|d| wanted(d, &self.naming, self.max_ports_bytes))
            .unwrap_or_default();
        let caches = self.lock();
        let mut verdict = DriftCheck::Ok;
        for w in &wanted {
            match caches.live.cached(&w.ns, &w.name) {
                None => return DriftCheck::Drift(DriftKind::Deleted),
                Some(have) if have.older_than_our_write() => verdict = DriftCheck::Stale,
                Some(have) if !have.satisfies(w) => return DriftCheck::Drift(DriftKind::Edited),
                Some(_) => {}
            }
        }
        drop(caches);
        if verdict == DriftCheck::Stale {
            return verdict;
        }
        let names: BTreeSet<(&str, &str)> = wanted
            .iter()
            .map(|w| (w.ns.as_str(), w.name.as_str()))
            .collect();
        if present
            .iter()
            .any(|(ns, name)| !names.contains(&(ns.as_str(), name.as_str())))
        {
            return DriftCheck::Drift(DriftKind::Orphan);
        }
        DriftCheck::Ok
    }

    /// Whether a watch event about `obj` needs a closer look by the writer:
    /// `Some(true)` yes, `Some(false)` no, `None` not decidable yet (its
    /// cluster is not listed).
    fn suspicious(&self, obj: &Watched, deleted: bool, shared: &Shared) -> Option<bool> {
        if !deleted && self.ours_or_older(obj) {
            // Cheap, and the common case: nothing of the desired state is
            // looked at per event of our own writes.
            return Some(false);
        }
        let key = &obj.key;
        let listed = shared
            .clusters()
            .get(key.cluster.as_str())
            .map(|c| c.listed);
        match shared.desired(key) {
            None => match listed {
                // Another cluster's object (not configured here): not ours to judge.
                None => Some(false),
                Some(false) => None,
                // No source: an orphan (a deleted one is simply gone).
                Some(true) => Some(!deleted),
            },
            Some(d) => {
                let wanted = wanted(&d, &self.naming, self.max_ports_bytes);
                let w = wanted
                    .iter()
                    .find(|w| w.ns == obj.ns() && w.name == obj.name());
                Some(match (w, deleted) {
                    // Not a name we want: a stray (a deleted stray is fine).
                    (None, d) => !d,
                    (Some(_), true) => true,
                    (Some(w), false) => !obj.facts.satisfies(w),
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
        for (id, status) in &clusters {
            if !status.listed {
                continue;
            }
            for svc in shared.desired_of(id) {
                let here = self.objects_of(&svc.key);
                if self.check_among(Some(&svc), &here) != DriftCheck::Ok {
                    out.insert(svc.key.clone());
                }
            }
        }
        // Orphans: one pass over the slots, a key is built only for objects
        // of listed clusters. (Shared's locks are only ever taken inside its
        // own methods, so calling it under the cache lock cannot deadlock.)
        let caches = self.lock();
        for s in caches.live.slots.iter().filter(|s| s.cached) {
            let cluster = s.key.as_ref().map_or("", |k| k.cluster.as_str());
            if !clusters.get(cluster).is_some_and(|c| c.listed) {
                continue;
            }
            let key = s.service_key();
            if !out.contains(&key) && !shared.has_desired(&key) {
                out.insert(key);
            }
        }
        out.into_iter().collect()
    }
}

// ---------------------------------------------------------------------------
// Decoding
// ---------------------------------------------------------------------------

/// A DiscoveredService as the drift watch decodes it: name, namespace and
/// resourceVersion (all the watcher itself needs), the service its spec
/// describes, and its [`Facts`]. `managedFields`, annotations and status
/// are skipped while parsing; the labels, owner references and nodes are
/// reduced and dropped. Every write of ours comes back as a watch event,
/// so this decode runs once per write.
#[derive(Debug, Clone)]
pub struct Watched {
    meta: ObjectMeta,
    key: ServiceKey,
    facts: Facts,
}

impl Watched {
    /// `obj` reduced as the watch reduces it.
    pub fn of(obj: &DiscoveredService) -> Self {
        Watched {
            meta: ObjectMeta {
                name: obj.metadata.name.clone(),
                namespace: obj.metadata.namespace.clone(),
                resource_version: obj.metadata.resource_version.clone(),
                ..ObjectMeta::default()
            },
            key: spec_key(&obj.spec),
            facts: Facts::of_object(obj),
        }
    }

    fn ns(&self) -> &str {
        self.meta.namespace.as_deref().unwrap_or_default()
    }

    fn name(&self) -> &str {
        self.meta.name.as_deref().unwrap_or_default()
    }
}

fn spec_key(spec: &DiscoveredServiceSpec) -> ServiceKey {
    ServiceKey::new(&spec.cluster, &spec.source_namespace, &spec.source_name)
}

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

impl<'de> serde::Deserialize<'de> for Watched {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let LeanObject { metadata: m, spec } = LeanObject::deserialize(d)?;
        Ok(Watched {
            facts: Facts::of(m.labels.as_ref(), m.owner_references.as_deref(), &spec),
            key: spec_key(&spec),
            meta: ObjectMeta {
                name: m.name,
                namespace: m.namespace,
                resource_version: m.resource_version,
                ..ObjectMeta::default()
            },
        })
    }
}

/// `kube::Resource` for a lean view of a DiscoveredService (`$meta` is the
/// path of its `ObjectMeta`): the watch and list URLs are the CRD's.
macro_rules! discovered_service_resource {
    ($ty:ty, $($meta:tt)+) => {
        impl Resource for $ty {
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
                &self.$($meta)+
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.$($meta)+
            }
        }
    };
}

discovered_service_resource!(Watched, meta);

/// A DiscoveredService decoded lean for the sink's start-up list
/// (`Sink::list_versions`, page by page): name, namespace, labels, owner
/// references, uid, resourceVersion and the spec WITHOUT nodes;
/// `managedFields`, annotations and status are skipped while parsing.
#[derive(Debug, Clone)]
pub(crate) struct Lean(DiscoveredService);

impl<'de> serde::Deserialize<'de> for Lean {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let LeanObject {
            metadata: m,
            mut spec,
        } = LeanObject::deserialize(d)?;
        spec.ports = Default::default();
        Ok(Lean(DiscoveredService {
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
        }))
    }
}

discovered_service_resource!(Lean, 0.metadata);

impl Lean {
    /// The object (no nodes, see the type docs).
    pub(crate) fn into_inner(self) -> DiscoveredService {
        self.0
    }
}

// ---------------------------------------------------------------------------
// The watch
// ---------------------------------------------------------------------------

/// `ns/name` of `obj` for logs, noting when our labels were changed.
fn describe(obj: &Watched) -> String {
    format!(
        "{}/{}{}",
        obj.ns(),
        obj.name(),
        if obj.facts.labels_ok {
            ""
        } else {
            " (labels changed)"
        }
    )
}

impl DriftFeed {
    /// Feeds one watch event to the cache.
    pub fn apply(&mut self, ev: &Event<Watched>) {
        self.view.lock().apply(ev);
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
        let api: Api<Watched> = match &view.naming.namespace_mode {
            NamespaceMode::Fixed(ns) => Api::namespaced(client, ns),
            NamespaceMode::Source => Api::all(client),
        };
        let stream = watcher(
            api,
            watcher::Config::default()
                .labels(MANAGED_BY_SELECTOR)
                .page_size(crate::client::LIST_PAGE_SIZE),
        );
        let mut stream = std::pin::pin!(stream);
        // Reconnects: by hand, so that a 410 Gone relists at once (see
        // `WatchBackoff::next_after_gone`); other errors wait 250 ms..1 s.
        let mut backoff = WatchBackoff::new();
        let mut paused_until: Option<Instant> = None;
        // A sweep waits until every cluster is listed (desired state known).
        let mut sweep_due = false;
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let ev = tokio::select! {
                () = shutdown.cancelled() => break,
                _ = tick.tick(), if sweep_due => None,
                ev = next_after(paused_until, &mut stream) => match ev {
                    Some(ev) => {
                        paused_until = None;
                        match &ev {
                            Ok(ev) => {
                                backoff.reset();
                                self.apply(ev);
                            }
                            Err(e) => {
                                let delay = if is_gone(e) {
                                    backoff.next_after_gone()
                                } else {
                                    backoff.next().unwrap_or(Duration::from_secs(1))
                                };
                                paused_until = Some(Instant::now() + delay);
                            }
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
                        writer.drifted(vec![o.key]);
                    }
                    Some(false) => {}
                    None => sweep_due = true,
                },
                Ok(Event::Delete(o)) => match view.suspicious(&o, true, &shared) {
                    Some(true) => {
                        tracing::debug!(object = %describe(&o), "wanted DiscoveredService deleted");
                        writer.drifted(vec![o.key]);
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
    use kube::ResourceExt;
    use kube_discovery_core::crd::{
        LABEL_SERVICE_NAME, desired_object, desired_objects, shard_name,
    };
    use kube_discovery_core::{Node, PortMap, SourceKind};

    fn svc(hosts: &[&str]) -> ServiceNodes {
        svc_at(ServiceKey::new("", "ns", "web"), hosts, Some("uid-1"))
    }

    fn svc_at(key: ServiceKey, hosts: &[&str], uid: Option<&str>) -> ServiceNodes {
        let mut ports = PortMap::new();
        ports.insert(
            "http".into(),
            hosts.iter().map(|h| Node::new(*h, 80, 50)).collect(),
        );
        ServiceNodes::new(key, SourceKind::EndpointSlice, ports, uid.map(String::from))
    }

    /// A service of `n` nodes on two ports (big enough to shard with a
    /// small limit).
    fn big(n: usize) -> ServiceNodes {
        let mut ports = PortMap::new();
        for port in ["grpc", "http"] {
            ports.insert(
                port.into(),
                (0..n)
                    .map(|i| Node::new(format!("10.0.{}.{}", i / 250, i % 250 + 1), 80, 50))
                    .collect(),
            );
        }
        ServiceNodes::new(
            ServiceKey::new("", "ns", "web"),
            SourceKind::EndpointSlice,
            ports,
            Some("uid-1".into()),
        )
    }

    fn with_rv(mut o: DiscoveredService, rv: u64) -> DiscoveredService {
        o.metadata.resource_version = Some(rv.to_string());
        o
    }

    fn apply(o: &DiscoveredService) -> Event<Watched> {
        Event::Apply(Watched::of(o))
    }

    fn init_apply(o: &DiscoveredService) -> Event<Watched> {
        Event::InitApply(Watched::of(o))
    }

    fn delete(o: &DiscoveredService) -> Event<Watched> {
        Event::Delete(Watched::of(o))
    }

    /// A listed, ready view.
    fn listed(naming: ObjectNaming) -> (DriftView, DriftFeed) {
        let (view, mut w) = DriftView::new(naming);
        w.apply(&Event::Init);
        w.apply(&Event::InitDone);
        view.ready.store(true, Ordering::Release);
        (view, w)
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
        extra
            .metadata
            .owner_references
            .as_mut()
            .unwrap()
            .push(OwnerReference {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                name: "other".into(),
                uid: "uid-9".into(),
                ..OwnerReference::default()
            });
        extra
            .annotations_mut()
            .insert("someone/else".into(), "x".into());
        assert!(
            matches(&extra, &want),
            "added labels, owners, annotations are tolerated"
        );
        let mut edited = want.clone();
        edited.spec.ports.insert("bogus".into(), vec![]);
        assert!(!matches(&edited, &want));
        let mut unlabeled = want.clone();
        unlabeled
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .remove(LABEL_SERVICE_NAME);
        assert!(!matches(&unlabeled, &want));
        let mut relabeled = want.clone();
        relabeled
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(LABEL_SERVICE_NAME.into(), "other".into());
        assert!(!matches(&relabeled, &want));
        let mut orphaned = want.clone();
        orphaned.metadata.owner_references = None;
        assert!(!matches(&orphaned, &want));
        // Each field of our owner reference counts.
        let owner_edits: [fn(&mut OwnerReference); 4] = [
            |o| o.uid = "uid-2".into(),
            |o| o.kind = "Pod".into(),
            |o| o.name = "api".into(),
            |o| o.api_version = "v2".into(),
        ];
        for (i, edit) in owner_edits.iter().enumerate() {
            let mut o = want.clone();
            edit(&mut o.metadata.owner_references.as_mut().unwrap()[0]);
            assert!(!matches(&o, &want), "owner edit {i} went unnoticed");
        }
    }

    #[test]
    fn the_spec_digest_finds_an_edit_of_every_spec_field() {
        let want = desired_object(&svc(&["10.0.0.1", "10.0.0.2"]), &ObjectNaming::source());
        let reduced = Watched::of(&want);
        assert!(reduced.facts.satisfies(&Want::of(&want)));
        type Edit = (&'static str, fn(&mut DiscoveredServiceSpec));
        let edits: [Edit; 14] = [
            ("cluster", |s| s.cluster = "c9".into()),
            ("service", |s| s.service = "ns/other".into()),
            ("sourceNamespace", |s| s.source_namespace = "other".into()),
            ("sourceName", |s| s.source_name = "other".into()),
            ("source", |s| s.source = SourceKind::Endpoints),
            ("version", |s| s.version = "0000000000000000".into()),
            ("shard added", |s| {
                s.shard = Some(Shard { index: 0, count: 1 })
            }),
            ("node host", |s| {
                s.ports
                    .values_mut()
                    .for_each(|v| v[0].host = "10.9.9.9".into())
            }),
            ("node port", |s| {
                s.ports.values_mut().for_each(|v| v[0].port += 1)
            }),
            ("node weight", |s| {
                s.ports.values_mut().for_each(|v| v[1].weight += 1)
            }),
            ("node draining", |s| {
                s.ports
                    .values_mut()
                    .for_each(|v| v[1].draining = Some(true))
            }),
            ("node removed", |s| {
                s.ports.values_mut().for_each(|v| v.truncate(1))
            }),
            ("port added", |s| {
                s.ports.insert("extra".into(), vec![]);
            }),
            ("port renamed", |s| {
                let nodes = s.ports.remove("http").unwrap();
                s.ports.insert("web".into(), nodes);
            }),
        ];
        for (field, edit) in edits {
            let mut edited = want.clone();
            edit(&mut edited.spec);
            assert!(
                !matches(&edited, &want),
                "an edit of {field} went unnoticed"
            );
        }
        // A shard's index and count count too.
        let mut shard = want.clone();
        shard.spec.shard = Some(Shard { index: 1, count: 3 });
        shard
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(LABEL_SHARD.into(), "1".into());
        assert!(matches(&shard, &shard));
        for s in [Shard { index: 2, count: 3 }, Shard { index: 1, count: 4 }] {
            let mut o = shard.clone();
            o.spec.shard = Some(s);
            assert!(!matches(&o, &shard));
        }
        // Nodes moved between ports are not the same spec.
        let mut a = PortMap::new();
        a.insert("a".into(), vec![Node::new("10.0.0.1", 80, 1)]);
        a.insert("b".into(), vec![]);
        let mut b = PortMap::new();
        b.insert("a".into(), vec![]);
        b.insert("b".into(), vec![Node::new("10.0.0.1", 80, 1)]);
        assert_ne!(ports_digest(&a), ports_digest(&b));
    }

    #[test]
    fn the_shard_label_is_ours_only_on_shards() {
        let want = desired_object(&svc(&["10.0.0.1"]), &ObjectNaming::source());
        let mut o = want.clone();
        o.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(LABEL_SHARD.into(), "7".into());
        assert!(
            matches(&o, &want),
            "someone's shard label on an unsharded object is tolerated"
        );
        let s = big(40);
        let shards = desired_objects_with_limit(&s, &ObjectNaming::source(), 600);
        assert!(shards.len() > 2);
        let mut relabeled = shards[1].clone();
        relabeled
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(LABEL_SHARD.into(), "0".into());
        assert!(
            !matches(&relabeled, &shards[1]),
            "a shard's label value is ours"
        );
    }

    #[test]
    fn the_wanted_form_equals_the_reduced_desired_objects() {
        let namings = [ObjectNaming::source(), ObjectNaming::fixed("discovery")];
        let keys = [
            ServiceKey::new("", "ns", "web"),
            ServiceKey::new("c1", "ns", "web"),
            ServiceKey::new("", "Bad_NS", "x".repeat(300)),
        ];
        for naming in &namings {
            for key in &keys {
                for uid in [Some("uid-1"), None] {
                    let s = svc_at(key.clone(), &["10.0.0.1", "10.0.0.2"], uid);
                    let reduced: Vec<Want> =
                        desired_objects(&s, naming).iter().map(Want::of).collect();
                    assert_eq!(wanted(&s, naming, MAX_OBJECT_PORTS_BYTES), reduced);
                    for o in desired_objects(&s, naming) {
                        assert!(Watched::of(&o).facts.labels_ok, "{key} {naming:?}");
                    }
                }
            }
            // Sharded: the same, and every shard carries exactly our labels.
            let s = big(40);
            let objs = desired_objects_with_limit(&s, naming, 600);
            assert!(objs.len() > 2, "sharded");
            let reduced: Vec<Want> = objs.iter().map(Want::of).collect();
            assert_eq!(wanted(&s, naming, 600), reduced);
            for o in &objs {
                assert!(Watched::of(o).facts.labels_ok);
                let shard = o.spec.shard.as_ref().unwrap();
                let mut ours = labels_for(&s.key);
                ours.insert(LABEL_SHARD.into(), shard.index.to_string());
                assert_eq!(o.metadata.labels.as_ref(), Some(&ours));
            }
        }
    }

    #[test]
    fn a_slot_stays_small() {
        // The memory budget of the module docs (72 bytes inline).
        assert!(
            std::mem::size_of::<Slot>() <= 72,
            "{}",
            std::mem::size_of::<Slot>()
        );
        assert!(std::mem::size_of::<Names>() <= 16);
    }

    #[test]
    fn the_watch_decodes_only_what_drift_compares() {
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
        let w: Watched = serde_json::from_value(full(&want)).unwrap();
        assert_eq!((w.ns(), w.name()), ("ns", "web"));
        assert_eq!(w.meta.resource_version.as_deref(), Some("7"));
        assert!(w.meta.labels.is_none() && w.meta.managed_fields.is_none());
        assert!(w.meta.annotations.is_none());
        assert_eq!(w.key, ServiceKey::new("", "ns", "web"));
        assert_eq!(w.facts, Watched::of(&want).facts);
        assert!(w.facts.satisfies(&Want::of(&want)));
        let mut edited = want.clone();
        edited
            .spec
            .ports
            .values_mut()
            .for_each(|v| v[0].weight += 1);
        let w: Watched = serde_json::from_value(full(&edited)).unwrap();
        assert!(!w.facts.satisfies(&Want::of(&want)), "a node edit is seen");
        let err = serde_json::from_value::<Watched>(serde_json::json!({"metadata": {}}));
        assert!(
            err.is_err(),
            "no spec: a decode error, not a default object"
        );
        // The sink's lean decode: no nodes, no managedFields, annotations or status.
        let lean: Lean = serde_json::from_value(full(&want)).unwrap();
        let o = lean.into_inner();
        assert!(o.metadata.managed_fields.is_none() && o.status.is_none());
        assert!(o.metadata.annotations.is_none() && o.spec.ports.is_empty());
        assert_eq!(o.metadata.labels, want.metadata.labels);
        assert_eq!(o.spec.version, want.spec.version);
        assert_eq!(o.metadata.resource_version.as_deref(), Some("7"));
    }

    #[test]
    fn an_unlisted_view_never_reports_drift() {
        let (view, _feed) = DriftView::new(ObjectNaming::source());
        let s = svc(&["10.0.0.1"]);
        assert_eq!(view.check(&s.key, Some(&s)), DriftCheck::Stale);
    }

    #[test]
    fn check_reports_deleted_edited_stale_and_stray_objects() {
        let (view, mut w) = listed(ObjectNaming::source());
        let s = svc(&["10.0.0.1"]);
        let want = desired_object(&s, &ObjectNaming::source());
        assert_eq!(
            view.check(&s.key, Some(&s)),
            DriftCheck::Drift(DriftKind::Deleted)
        );
        w.apply(&apply(&with_rv(want.clone(), 5)));
        assert_eq!(view.check(&s.key, Some(&s)), DriftCheck::Ok);
        // Someone edits it after our write (rv 5): drift.
        view.note_written("ns", "web", Some(5));
        let mut edited = with_rv(want.clone(), 6);
        edited.spec.ports.clear();
        w.apply(&apply(&edited));
        assert_eq!(
            view.check(&s.key, Some(&s)),
            DriftCheck::Drift(DriftKind::Edited)
        );
        // We wrote rv 7, the cache still shows 6: not judged yet.
        view.note_written("ns", "web", Some(7));
        assert_eq!(view.check(&s.key, Some(&s)), DriftCheck::Stale);
        w.apply(&apply(&with_rv(want.clone(), 7)));
        assert_eq!(view.check(&s.key, Some(&s)), DriftCheck::Ok);
        // A stray object describing the same service: an orphan.
        let mut stray = with_rv(want.clone(), 8);
        stray.metadata.name = Some("web.9".into());
        w.apply(&apply(&stray));
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
        assert_eq!(view.len(), 2);
        // The stray goes; deleting ours (which we wrote) leaves it unknown.
        w.apply(&delete(&stray));
        assert_eq!(view.check(&s.key, Some(&s)), DriftCheck::Ok);
        w.apply(&delete(&want));
        assert_eq!(
            view.check(&s.key, Some(&s)),
            DriftCheck::Drift(DriftKind::Deleted)
        );
        assert!(view.is_empty() && view.objects_of(&s.key).is_empty());
        // Our written version outlived the delete: a late event of our
        // write is still recognized as ours.
        assert!(view.ours_or_older(&Watched::of(&with_rv(want.clone(), 7))));
        view.note_written("ns", "web", None);
        assert!(!view.ours_or_older(&Watched::of(&with_rv(want, 7))));
    }

    #[test]
    fn sharded_services_are_checked_shard_by_shard() {
        let (mut view, mut w) = listed(ObjectNaming::source());
        view.max_ports_bytes = 600;
        let s = big(40);
        let objs = desired_objects_with_limit(&s, &ObjectNaming::source(), 600);
        let n = objs.len();
        assert!(n > 2);
        for (i, o) in objs.iter().enumerate() {
            w.apply(&apply(&with_rv(o.clone(), 10 + i as u64)));
        }
        assert_eq!(view.check(&s.key, Some(&s)), DriftCheck::Ok);
        assert_eq!(view.objects_of(&s.key).len(), n);
        // A shard's nodes edited.
        let mut edited = with_rv(objs[1].clone(), 100);
        edited.spec.ports.values_mut().for_each(|v| v.truncate(0));
        w.apply(&apply(&edited));
        assert_eq!(
            view.check(&s.key, Some(&s)),
            DriftCheck::Drift(DriftKind::Edited)
        );
        assert!(!view.intact(&objs[1]) && view.intact(&objs[0]));
        w.apply(&apply(&with_rv(objs[1].clone(), 101)));
        // A shard deleted.
        w.apply(&delete(&objs[2]));
        assert_eq!(
            view.check(&s.key, Some(&s)),
            DriftCheck::Drift(DriftKind::Deleted)
        );
        w.apply(&apply(&with_rv(objs[2].clone(), 102)));
        assert_eq!(view.check(&s.key, Some(&s)), DriftCheck::Ok);
        // A surplus shard (left over from a bigger state).
        let mut surplus = with_rv(objs[1].clone(), 103);
        surplus.metadata.name = Some(shard_name("web", u32::try_from(n).unwrap()));
        w.apply(&apply(&surplus));
        assert_eq!(
            view.check(&s.key, Some(&s)),
            DriftCheck::Drift(DriftKind::Orphan)
        );
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
        view.note_written("ns", "web", Some(4));
        assert!(!view.intact(&written), "only our write is known");
        w.apply(&apply(&with_rv(want.clone(), 5)));
        assert!(
            view.intact(&written),
            "cached as wanted (status not compared)"
        );
        view.note_written("ns", "web", Some(6));
        assert!(!view.intact(&written), "the cache is older than our write");
        w.apply(&apply(&with_rv(want.clone(), 6)));
        assert!(view.intact(&written));
        let mut edited = with_rv(want.clone(), 7);
        edited.spec.ports.insert("bogus".into(), vec![]);
        w.apply(&apply(&edited));
        assert!(!view.intact(&written), "edited by someone else");
        w.apply(&delete(&with_rv(want.clone(), 8)));
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
        w.apply(&init_apply(&want));
        assert!(
            view.objects_of(&s.key).is_empty(),
            "a relist counts once done"
        );
        w.apply(&Event::InitDone);
        assert_eq!(view.objects_of(&s.key), vec![web()]);
        w.apply(&apply(&shard));
        w.apply(&apply(&shard));
        assert_eq!(
            view.objects_of(&s.key),
            vec![web(), web1()],
            "no duplicates"
        );
        // Someone points web.1 at another service: it leaves `web`.
        let mut repointed = shard.clone();
        repointed.spec.source_name = "api".into();
        w.apply(&apply(&repointed));
        let api = ServiceKey::new("", "ns", "api");
        assert_eq!(view.objects_of(&s.key), vec![web()]);
        assert_eq!(view.objects_of(&api), vec![web1()]);
        w.apply(&delete(&repointed));
        assert!(view.objects_of(&api).is_empty());
        assert_eq!(view.objects_of(&s.key), vec![web()]);
        // An object whose spec names another cluster / namespace.
        let mut other = want.clone();
        other.metadata.name = Some("x".into());
        other.spec.cluster = "c1".into();
        w.apply(&apply(&other));
        let c1 = ServiceKey::new("c1", "ns", "web");
        assert_eq!(
            view.objects_of(&c1),
            vec![("ns".to_string(), "x".to_string())]
        );
        assert_eq!(view.objects_of(&s.key), vec![web()]);
        // A relist without `web` replaces the index; one with it brings it back.
        w.apply(&Event::Init);
        w.apply(&Event::InitDone);
        assert!(view.objects_of(&s.key).is_empty());
        assert!(view.objects_of(&c1).is_empty());
        w.apply(&Event::Init);
        w.apply(&init_apply(&shard));
        w.apply(&Event::InitDone);
        assert_eq!(view.objects_of(&s.key), vec![web1()]);
    }

    #[test]
    fn a_relist_is_swapped_in_at_init_done_and_keeps_our_written_versions() {
        let (view, mut w) = listed(ObjectNaming::source());
        let s = svc(&["10.0.0.1"]);
        let want = desired_object(&s, &ObjectNaming::source());
        w.apply(&apply(&with_rv(want.clone(), 5)));
        view.note_written("ns", "web", Some(5));
        assert_eq!(view.check(&s.key, Some(&s)), DriftCheck::Ok);
        // A relist that shows an edited copy: until InitDone the old cache answers.
        let mut edited = with_rv(want.clone(), 6);
        edited.spec.version = "0000000000000000".into();
        w.apply(&Event::Init);
        w.apply(&init_apply(&edited));
        assert_eq!(view.check(&s.key, Some(&s)), DriftCheck::Ok);
        assert!(view.intact(&want));
        // Our write during the relist (rv 8) is kept across the swap.
        view.note_written("ns", "web", Some(8));
        w.apply(&Event::InitDone);
        assert_eq!(
            view.check(&s.key, Some(&s)),
            DriftCheck::Stale,
            "the relisted copy (rv 6) is older than our write (rv 8)"
        );
        w.apply(&apply(&with_rv(edited.clone(), 9)));
        assert_eq!(
            view.check(&s.key, Some(&s)),
            DriftCheck::Drift(DriftKind::Edited)
        );
        // A written version of an object the relist did not show survives
        // too (its watch event may still come).
        view.note_written("ns", "api", Some(20));
        w.apply(&Event::Init);
        w.apply(&Event::InitDone);
        let api = desired_object(
            &svc_at(ServiceKey::new("", "ns", "api"), &["10.0.0.1"], None),
            &ObjectNaming::source(),
        );
        assert!(view.ours_or_older(&Watched::of(&with_rv(api.clone(), 20))));
        assert!(!view.ours_or_older(&Watched::of(&with_rv(api, 21))));
        assert!(view.is_empty());
    }

    #[test]
    fn own_write_events_are_not_suspicious_but_later_edits_are() {
        let (view, _w) = listed(ObjectNaming::source());
        let shared = Shared::new([""]);
        shared.update_cluster("", |c| c.listed = true);
        let old = svc(&["10.0.0.1"]);
        let new = svc(&["10.0.0.2"]);
        shared.set_desired(&new.key, Some(new.clone()));
        // The late event of our write of the OLD state (rv 3, we wrote rv 3).
        let ours = Watched::of(&with_rv(desired_object(&old, &ObjectNaming::source()), 3));
        view.note_written("ns", "web", Some(3));
        assert_eq!(view.suspicious(&ours, false, &shared), Some(false));
        // The same content at a later rv is someone else's: it differs.
        let theirs_obj = with_rv(desired_object(&old, &ObjectNaming::source()), 4);
        let theirs = Watched::of(&theirs_obj);
        assert_eq!(view.suspicious(&theirs, false, &shared), Some(true));
        // Someone else's write of exactly the wanted state is fine.
        let same = Watched::of(&with_rv(desired_object(&new, &ObjectNaming::source()), 5));
        assert_eq!(view.suspicious(&same, false, &shared), Some(false));
        // A delete of a wanted object is always suspicious.
        assert_eq!(view.suspicious(&ours, true, &shared), Some(true));
        // A stray name is suspicious, its delete is not.
        let mut stray = theirs_obj.clone();
        stray.metadata.name = Some("web.3".into());
        assert_eq!(
            view.suspicious(&Watched::of(&stray), false, &shared),
            Some(true)
        );
        assert_eq!(
            view.suspicious(&Watched::of(&stray), true, &shared),
            Some(false)
        );
        // Unknown cluster: not ours to judge; unlisted cluster: later.
        let mut other = theirs_obj.clone();
        other.spec.cluster = "c9".into();
        assert_eq!(
            view.suspicious(&Watched::of(&other), false, &shared),
            Some(false)
        );
        let unlisted = Shared::new([""]);
        assert_eq!(view.suspicious(&theirs, false, &unlisted), None);
        // No source in a listed cluster: an orphan (its delete is fine).
        let mut gone = theirs_obj;
        gone.spec.source_name = "gone".into();
        assert_eq!(
            view.suspicious(&Watched::of(&gone), false, &shared),
            Some(true)
        );
        assert_eq!(
            view.suspicious(&Watched::of(&gone), true, &shared),
            Some(false)
        );
    }

    #[test]
    fn a_sweep_reports_drifted_desired_keys_and_orphans_of_listed_clusters() {
        let (view, mut w) = listed(ObjectNaming::source());
        let shared = Shared::new(["", "c1"]);
        shared.update_cluster("", |c| c.listed = true);
        let ok = svc_at(ServiceKey::new("", "ns", "ok"), &["10.0.0.1"], Some("u1"));
        let missing = svc_at(ServiceKey::new("", "ns", "missing"), &["10.0.0.2"], None);
        let edited = svc_at(ServiceKey::new("", "ns", "edited"), &["10.0.0.3"], None);
        for s in [&ok, &missing, &edited] {
            shared.set_desired(&s.key, Some(s.clone()));
        }
        let naming = ObjectNaming::source();
        w.apply(&apply(&with_rv(desired_object(&ok, &naming), 2)));
        let mut e = with_rv(desired_object(&edited, &naming), 3);
        e.spec.version = "x".into();
        w.apply(&apply(&e));
        // An orphan of the listed cluster, one of an unlisted cluster.
        let orphan = svc_at(ServiceKey::new("", "ns", "orphan"), &["10.0.0.4"], None);
        w.apply(&apply(&with_rv(desired_object(&orphan, &naming), 4)));
        let far = svc_at(ServiceKey::new("c1", "ns", "far"), &["10.0.0.5"], None);
        w.apply(&apply(&with_rv(desired_object(&far, &naming), 5)));
        let mut got = view.sweep(&shared);
        got.sort();
        let mut want = vec![edited.key.clone(), missing.key.clone(), orphan.key.clone()];
        want.sort();
        assert_eq!(got, want);
        shared.update_cluster("c1", |c| c.listed = true);
        assert!(view.sweep(&shared).contains(&far.key));
    }
}
