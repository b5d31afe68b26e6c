//! The cache of our own objects: nothing here needs an object's content,
//! only whether it equals what we want, so the cache keeps, per object, a
//! slim `Slot` of its `Facts` and versions, plus a key index.
//!
//! ```text
//!  Cache
//!   ├─ slots: HashTable<Slot>, hashed by (namespace, name)   the name stored once
//!   │    Slot { namespace+name, service (only when not derivable from the name),
//!   │           spec digest, our labels present?, owner digests,
//!   │           rv of the cached copy, rv of our last write, cached? }
//!   └─ by_key: key digest -> name hashes of the objects describing that service
//!  Caches { live, relist }   Init: new relist; InitApply: fill it; InitDone: swap it in
//! ```
//!
//! * The service a slot's spec describes is kept only when it cannot be
//!   derived from the object's name (`cluster ""`, same namespace, same name:
//!   the common case with the default naming costs nothing); multi-cluster
//!   ids, the fixed-namespace naming and shards `name.N` carry a boxed
//!   `ServiceKey`.
//! * Owner references (usually one) are stored inline as digests of
//!   `apiVersion, kind, name, uid`.
//! * The resourceVersion of our last write of an object (`note_written`) is
//!   in the same slot, so there is no second map of names. A slot that only
//!   carries our write (the watch has not shown the object, or it was
//!   deleted) is not "cached" and invisible to every check.
//! * The key index never trusts itself: a hit counts only when the slot is
//!   cached and its own service equals the key asked for (64-bit collisions).
//!   A lookup (`Cache::objects_of`) is O(objects of that service), never a
//!   scan.
//! * A relist is swapped in at `InitDone` (what kube-runtime's store does),
//!   carrying over the versions of our writes; until then checks use the old
//!   cache.
//!
//! A slot is kept at 72 bytes or less (a unit test holds it there);
//! BENCHMARKS.md (issue 6) has the measured size of the whole cache.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher, RandomState};
use std::num::NonZeroU64;

use hashbrown::HashTable;
use kube::runtime::watcher::Event;
use kube_discovery_core::ServiceKey;
use kube_discovery_core::crd::{Owner, adopted};
use kube_discovery_core::write_plan::SeenObject;

use super::ObjName;
#[cfg(doc)]
use super::decode::OwnerMark;
use super::decode::Watched;
use super::facts::{Owners, WantedObject, satisfies};

/// A resourceVersion as kept: `rv + 1`, so `None` costs no extra word
/// (`u64::MAX`, never a real version, counts as unknown).
pub(super) type Rv = Option<NonZeroU64>;

pub(super) fn pack_rv(rv: Option<u64>) -> Rv {
    rv.and_then(|v| v.checked_add(1)).and_then(NonZeroU64::new)
}

pub(super) fn parse_rv(s: Option<&str>) -> Rv {
    pack_rv(s.and_then(|s| s.parse().ok()))
}

/// One object (see the module docs).
pub(super) struct Slot {
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
    /// [`super::facts::Facts::stamp_ok`].
    stamp_ok: bool,
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
            stamp_ok: false,
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

    /// The cluster of the service its spec describes.
    pub(super) fn cluster(&self) -> &str {
        self.key.as_ref().map_or("", |k| k.cluster.as_str())
    }

    pub(super) fn service_key(&self) -> ServiceKey {
        match &self.key {
            None => ServiceKey::new("", self.ns(), self.name()),
            Some(k) => (**k).clone(),
        }
    }

    /// Whether the cached copy is older than our last write of it.
    pub(super) fn older_than_our_write(&self) -> bool {
        matches!((self.rv, self.written), (Some(have), Some(ours)) if have < ours)
    }

    pub(super) fn satisfies(&self, w: &WantedObject) -> bool {
        satisfies(self.spec, &self.owners, self.labels_ok && self.stamp_ok, w)
    }

    /// What the planner's drift check compares of the cached copy.
    pub(super) fn seen(&self) -> SeenObject {
        let unpack = |rv: Rv| rv.map(|v| v.get() - 1);
        SeenObject {
            resource_version: unpack(self.rv),
            written: unpack(self.written),
            spec: self.spec,
            owners: self.owners.to_vec(),
            labels_ok: self.labels_ok,
            stamp_ok: self.stamp_ok,
        }
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
pub(super) struct Cache {
    hasher: RandomState,
    slots: HashTable<Slot>,
    /// Key digest -> name hashes of the cached objects describing it.
    by_key: HashMap<u64, Names>,
    /// Objects that are not ours ([`OwnerMark::owner`]): another instance's
    /// or hand-made. Never compared, repaired or deleted; their names are
    /// taken ([`Cache::taken`]). Usually empty.
    foreign: HashMap<ObjName, Owner>,
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
            foreign: HashMap::new(),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.cached_slots().count()
    }

    /// The slots of cached objects, in no particular order.
    pub(super) fn cached_slots(&self) -> impl Iterator<Item = &Slot> {
        self.slots.iter().filter(|s| s.cached)
    }

    fn slot(&self, ns: &str, name: &str) -> Option<&Slot> {
        let h = name_hash(&self.hasher, ns, name);
        self.slots.find(h, |s| s.is(ns, name))
    }

    /// The slot of a cached object.
    pub(super) fn cached(&self, ns: &str, name: &str) -> Option<&Slot> {
        self.slot(ns, name).filter(|s| s.cached)
    }

    pub(super) fn written(&self, ns: &str, name: &str) -> Rv {
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

    /// Who holds `ns/name` when it is not ours (`None`: ours or absent).
    pub(super) fn taken(&self, ns: &str, name: &str) -> Option<&Owner> {
        if self.foreign.is_empty() {
            return None;
        }
        self.foreign.get(&(ns.to_string(), name.to_string()))
    }

    /// The watch shows `w` (Apply / InitApply); `instance` is ours, and so
    /// are the objects of the instances we `adopt`.
    fn apply(&mut self, w: &Watched, instance: &str, adopt: &[String]) {
        let (ns, name) = (w.ns(), w.name());
        match adopted(w.mark.owner(instance), adopt) {
            Owner::Us => {
                if !self.foreign.is_empty() {
                    self.foreign.remove(&(ns.to_string(), name.to_string()));
                }
            }
            other => {
                // Not (or no longer) ours: out of every comparison.
                self.delete(ns, name);
                self.foreign
                    .insert((ns.to_string(), name.to_string()), other);
                return;
            }
        }
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
        slot.stamp_ok = w.facts.stamp_ok;
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
        if !self.foreign.is_empty() {
            self.foreign.remove(&(ns.to_string(), name.to_string()));
        }
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

    pub(super) fn note_written(&mut self, ns: &str, name: &str, rv: Rv) {
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
    pub(super) fn objects_of(&self, key: &ServiceKey) -> Vec<ObjName> {
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
pub(super) struct Caches {
    pub(super) live: Cache,
    /// `Init` .. `InitDone`, like the store's buffer.
    relist: Option<Cache>,
    /// Our instance name: objects of others are kept apart.
    instance: String,
    /// Instances whose objects are ours (`kube_discovery.adopt_instances`).
    adopt: Vec<String>,
}

impl Caches {
    pub(super) fn new(instance: &str, adopt: &[String]) -> Self {
        Caches {
            live: Cache::new(),
            relist: None,
            instance: instance.to_string(),
            adopt: adopt.to_vec(),
        }
    }

    /// `Init`: a relist starts.
    pub(super) fn init(&mut self) {
        self.relist = Some(Cache::new());
    }

    /// `InitApply`: one object of the relist.
    pub(super) fn init_apply(&mut self, o: &Watched) {
        self.relist
            .get_or_insert_with(Cache::new)
            .apply(o, &self.instance, &self.adopt);
    }

    /// `InitDone`: the relist replaces the live cache, keeping our writes.
    pub(super) fn init_done(&mut self) {
        let mut next = self.relist.take().unwrap_or_else(Cache::new);
        next.adopt_written(&self.live);
        self.live = next;
    }

    /// `Apply`.
    pub(super) fn apply(&mut self, o: &Watched) {
        self.live.apply(o, &self.instance, &self.adopt);
    }

    /// `Delete`.
    pub(super) fn delete(&mut self, o: &Watched) {
        self.live.delete(o.ns(), o.name());
    }

    /// One watch event, whichever it is.
    pub(super) fn apply_event(&mut self, ev: &Event<Watched>) {
        match ev {
            Event::Init => self.init(),
            Event::InitApply(o) => self.init_apply(o),
            Event::InitDone => self.init_done(),
            Event::Apply(o) => self.apply(o),
            Event::Delete(o) => self.delete(o),
        }
    }
}

#[cfg(test)]
mod tests;
