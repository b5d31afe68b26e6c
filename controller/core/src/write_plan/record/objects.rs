//! Per object, one slim `Slot`: what the API server holds of it as far as
//! drift needs (whether it equals what we want: digests, not content), the
//! resourceVersions of the copy the watch showed and of our last write, and
//! its `metadata.generation`; plus a key index.
//!
//! ```text
//!  Objects
//!   ├─ slots: HashTable<Slot>, hashed by (namespace, name)   the name stored once
//!   │    Slot { namespace+name, service (only when not derivable from the name),
//!   │           spec digest, our labels present?, stamp agrees?, owner digests,
//!   │           rv of the watched copy, rv of our last write, generation, watched? }
//!   ├─ by_key: key digest -> name hashes of the objects describing that service
//!   └─ foreign: names held by others (another instance, hand-made), usually empty
//! ```
//!
//! * The service a slot's spec describes is kept only when it cannot be
//!   derived from the object's name (`cluster ""`, same namespace, same name:
//!   the common case with the default naming costs nothing); multi-cluster
//!   ids, the fixed-namespace naming and shards `name.N` carry a boxed
//!   `ServiceKey`.
//! * Owner references (usually one) are stored inline as digests of
//!   `apiVersion, kind, name, uid`.
//! * A slot the watch has not shown (only our write's answer or the
//!   start-up list's generation is known, or it was deleted) is not
//!   "cached" and invisible to every check.
//! * The key index never trusts itself: a hit counts only when the slot is
//!   cached and its own service equals the key asked for (64-bit collisions).
//!   A lookup (`Objects::objects_of`) is O(objects of that service), never a
//!   scan.
//!
//! A slot is kept at 80 bytes or less (a unit test holds it there: the 72
//! of the drift cache's slot plus the generation, which had a map of its
//! own before).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher, RandomState};
use std::num::NonZeroU64;

use super::ObjectSeen;
use super::facts::{Owners, WantedObject, satisfies};
use crate::ServiceKey;
use crate::crd::Owner;
use crate::write_plan::{ObjName, SeenObject};
use hashbrown::HashTable;

/// A resourceVersion as kept: `rv + 1`, so `None` costs no extra word
/// (`u64::MAX`, never a real version, counts as unknown).
pub(super) type Rv = Option<NonZeroU64>;

pub(super) fn pack_rv(rv: Option<u64>) -> Rv {
    rv.and_then(|v| v.checked_add(1)).and_then(NonZeroU64::new)
}

/// A `metadata.generation` as kept (`None`: unknown; a real one is at least 1).
pub(super) type Generation = Option<NonZeroU64>;

fn pack_generation(g: Option<i64>) -> Generation {
    g.and_then(|g| u64::try_from(g).ok())
        .and_then(NonZeroU64::new)
}

/// One object as the record keeps it (see the module docs).
pub struct Slot {
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
    /// `metadata.generation` as last answered, listed or watched.
    generation: Generation,
    ns_len: u32,
    labels_ok: bool,
    /// [`super::Facts::stamp_ok`].
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
            generation: None,
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
    pub fn cluster(&self) -> &str {
        self.key.as_ref().map_or("", |k| k.cluster.as_str())
    }

    /// The service its spec describes.
    pub fn service_key(&self) -> ServiceKey {
        match &self.key {
            None => ServiceKey::new("", self.ns(), self.name()),
            Some(k) => (**k).clone(),
        }
    }

    /// Nothing is known of it: the slot can go.
    fn is_empty(&self) -> bool {
        !self.cached && self.written.is_none() && self.generation.is_none()
    }

    /// Whether the cached copy is older than our last write of it.
    pub fn older_than_our_write(&self) -> bool {
        matches!((self.rv, self.written), (Some(have), Some(ours)) if have < ours)
    }

    /// Whether it is what `w` wants (spec, our labels and owners, the stamp).
    pub fn satisfies(&self, w: &WantedObject) -> bool {
        satisfies(self.spec, &self.owners, self.labels_ok && self.stamp_ok, w)
    }

    /// What the planner's drift check compares of the watched copy.
    pub fn seen(&self) -> SeenObject {
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
pub(super) struct Objects {
    hasher: RandomState,
    slots: HashTable<Slot>,
    /// Key digest -> name hashes of the cached objects describing it.
    by_key: HashMap<u64, Names>,
    /// Objects that are not ours ([`ObjectSeen::owner`]): another instance's
    /// or hand-made. Never compared, repaired or deleted; their names are
    /// taken ([`Objects::taken`]). Usually empty.
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

impl Objects {
    pub(super) fn new() -> Self {
        Objects {
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

    pub(super) fn generation(&self, ns: &str, name: &str) -> Generation {
        self.slot(ns, name).and_then(|s| s.generation)
    }

    /// The slot of `ns/name`, created (not cached) when missing.
    fn slot_mut(&mut self, ns: &str, name: &str) -> &mut Slot {
        let Objects { hasher, slots, .. } = self;
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

    /// The watch shows `o` (Apply / InitApply).
    pub(super) fn apply(&mut self, o: &ObjectSeen<'_>) {
        let (ns, name) = (o.ns, o.name);
        // Only a higher generation is taken: the event may be older than
        // our last write's answer (a recreated object was first seen deleted).
        let seen_generation = pack_generation(o.generation);
        if *o.owner != Owner::Us {
            // Not (or no longer) ours: out of every comparison.
            self.uncache(ns, name);
            self.foreign
                .insert((ns.to_string(), name.to_string()), o.owner.clone());
            if seen_generation.is_some() {
                let slot = self.slot_mut(ns, name);
                slot.generation = slot.generation.max(seen_generation);
            }
            return;
        }
        if !self.foreign.is_empty() {
            self.foreign.remove(&(ns.to_string(), name.to_string()));
        }
        let key = o.key;
        let h = name_hash(&self.hasher, ns, name);
        let new_kh = key_hash(&self.hasher, &key.cluster, &key.namespace, &key.name);
        let hasher = self.hasher.clone();
        let slot = self.slot_mut(ns, name);
        let old_kh = slot.cached.then(|| slot_key_hash(&hasher, slot));
        slot.key = (!(key.cluster.is_empty() && key.namespace == ns && key.name == name))
            .then(|| Box::new(key.clone()));
        slot.spec = o.facts.spec;
        slot.owners = o.facts.owners.clone();
        slot.labels_ok = o.facts.labels_ok;
        slot.stamp_ok = o.facts.stamp_ok;
        slot.rv = pack_rv(o.resource_version);
        slot.generation = slot.generation.max(seen_generation);
        slot.cached = true;
        if old_kh != Some(new_kh) {
            self.link(new_kh, h);
            if let Some(old) = old_kh {
                self.unlink(old, h);
            }
        }
    }

    /// The watch shows `ns/name` deleted: its generation is forgotten, our
    /// last write is remembered.
    pub(super) fn delete(&mut self, ns: &str, name: &str) {
        self.uncache(ns, name);
        self.update(ns, name, |s| s.generation = None);
    }

    /// Takes `ns/name` out of every comparison (and off the foreign names).
    fn uncache(&mut self, ns: &str, name: &str) {
        if !self.foreign.is_empty() {
            self.foreign.remove(&(ns.to_string(), name.to_string()));
        }
        let Objects { hasher, slots, .. } = self;
        let h = name_hash(hasher, ns, name);
        let Ok(mut entry) = slots.find_entry(h, |s| s.is(ns, name)) else {
            return;
        };
        let slot = entry.get_mut();
        if !slot.cached {
            return;
        }
        let kh = slot_key_hash(hasher, slot);
        slot.cached = false;
        slot.key = None;
        slot.owners = Owners::None;
        if slot.is_empty() {
            entry.remove();
        }
        self.unlink(kh, h);
    }

    /// Changes the slot of `ns/name` if there is one; drops it when nothing
    /// is known of it any more.
    fn update(&mut self, ns: &str, name: &str, f: impl FnOnce(&mut Slot)) {
        let h = name_hash(&self.hasher, ns, name);
        if let Ok(mut entry) = self.slots.find_entry(h, |s| s.is(ns, name)) {
            f(entry.get_mut());
            if entry.get().is_empty() {
                entry.remove();
            }
        }
    }

    /// Our write of `ns/name` was answered with `rv` and `generation`
    /// (both `None`: deleted).
    pub(super) fn note_written(&mut self, ns: &str, name: &str, rv: Rv, generation: Option<i64>) {
        let generation = pack_generation(generation);
        if rv.is_some() || generation.is_some() {
            let slot = self.slot_mut(ns, name);
            slot.written = rv;
            slot.generation = generation;
        } else {
            self.update(ns, name, |s| {
                s.written = None;
                s.generation = None;
            });
        }
    }

    /// The start-up list found these generations of our objects: every
    /// other generation is forgotten.
    pub(super) fn listed_generations(&mut self, found: &[(ObjName, i64)]) {
        self.slots.iter_mut().for_each(|s| s.generation = None);
        self.slots.retain(|s| !s.is_empty());
        for ((ns, name), g) in found {
            let g = pack_generation(Some(*g));
            if g.is_some() {
                self.slot_mut(ns, name).generation = g;
            }
        }
    }

    /// Replaces the names held by others.
    pub(super) fn set_foreign(&mut self, foreign: HashMap<ObjName, Owner>) {
        self.foreign = foreign;
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

    /// Takes over the versions of our writes and the generations from
    /// `old` (a relist replaces what the watch showed, not what we wrote;
    /// a generation is only ever raised by the watch).
    pub(super) fn adopt_written(&mut self, old: &Objects) {
        for s in old.slots.iter() {
            if s.written.is_some() || s.generation.is_some() {
                let slot = self.slot_mut(s.ns(), s.name());
                if s.written.is_some() {
                    slot.written = s.written;
                }
                slot.generation = slot.generation.max(s.generation);
            }
        }
    }
}

#[cfg(test)]
mod tests;
