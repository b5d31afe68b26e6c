//! The view of the cache that the writer and the sink ask ([`DriftView`]):
//! is what the API server holds for a service what we want? Also the checks
//! the drift watch makes per event (`suspicious`) and after a relist
//! (`sweep`).
//!
//! ```text
//!  facts(key, desired)   wanted_objects(desired) next to the cached objects of key (key index):
//!                        names, resourceVersions (cached, our last write), digests
//!    ─▶ judged by the planner (write_plan::judge_drift): Deleted / Edited / Stale / Orphan / Ok
//! ```

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use kube_discovery_core::crd::{
    DesiredObjects, DiscoveredService, MAX_OBJECT_PORTS_BYTES, ObjectNaming, Owner,
};
use kube_discovery_core::write_plan::{DriftFacts, DriftResult, judge_drift};
use kube_discovery_core::{ServiceKey, ServiceNodes};

use super::cache::{Caches, pack_rv, parse_rv};
use super::decode::Watched;
use super::facts::{WantedObject, wanted_objects};
use super::{DriftCheck, ObjName};
use crate::state::ControllerState;
use crate::write::generation::Generations;

/// The cache of our own objects plus the resourceVersions of our last writes.
#[derive(Clone)]
pub struct DriftView {
    pub(super) naming: ObjectNaming,
    pub(super) ready: Arc<AtomicBool>,
    caches: Arc<Mutex<Caches>>,
    /// The object size bound of `desired_objects` (tests use small ones).
    pub(super) max_ports_bytes: usize,
    /// The generations the watch shows, shared with the sink
    /// ([`crate::write::generation`]).
    pub(super) generations: Generations,
    /// The wanted form of shards `i > 0` by `(namespace, name)`, with the
    /// service and `spec.version` it was built for ([`DriftView::intact_of`]).
    shard_wants: Arc<Mutex<ShardWants>>,
}

/// [`DriftView::shard_wants`]: `(namespace, name)` -> (service, shard
/// version, wanted form).
type ShardWants = HashMap<ObjName, (ServiceKey, String, WantedObject)>;

/// [`DriftView::shard_wants`] is emptied when it grows beyond this many
/// shards (a memo: entries of deleted services are never looked up again,
/// and any entry is rebuilt on demand).
const SHARD_WANTS_MAX: usize = 65_536;

impl DriftView {
    /// An empty, unlisted view (`DriftView::new` pairs it with its feed).
    pub(super) fn empty(naming: ObjectNaming) -> DriftView {
        let caches = Arc::new(Mutex::new(Caches::new(&naming.instance, &naming.adopt)));
        DriftView {
            naming,
            ready: Arc::new(AtomicBool::new(false)),
            caches,
            max_ports_bytes: MAX_OBJECT_PORTS_BYTES,
            generations: Generations::default(),
            shard_wants: Arc::default(),
        }
    }

    /// The generations of our objects as the watch shows them (the sink
    /// stamps `observedGeneration` from them).
    pub fn generations(&self) -> &Generations {
        &self.generations
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Caches> {
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
    pub(super) fn ours_or_older(&self, w: &Watched) -> bool {
        let ours = self.lock().live.written(w.ns(), w.name());
        let have = parse_rv(w.meta.resource_version.as_deref());
        matches!((have, ours), (Some(have), Some(ours)) if have <= ours)
    }

    /// Whether the object `want` names is intact in the cache: cached, not
    /// older than our last write of it, and [`matches()`](super::matches) `want` (status is not
    /// compared). A repair skips such objects (the sink's apply would only
    /// move their `lastSyncTime`); unknown or stale counts as not intact.
    pub fn intact(&self, want: &DiscoveredService) -> bool {
        let w = WantedObject::of(want);
        self.lock()
            .live
            .cached(&w.ns, &w.name)
            .is_some_and(|s| !s.older_than_our_write() && s.satisfies(&w))
    }

    /// [`DriftView::intact`] of object `index` of `desired`, building it
    /// only when the answer needs it: not for an object the cache does not
    /// hold (or holds older than our write), and not for a shard `i > 0`
    /// whose wanted form is remembered for its `spec.version`.
    ///
    /// Why remembering is exact: a shard `i > 0` carries the version of its
    /// own content (`kube_discovery_core::crd::shards::shard_version`: its nodes,
    /// index, count, source, owner and extras), and everything else of it
    /// follows from its service and the naming, so the same service and
    /// version mean the same wanted object, which is compared with the
    /// cached copy as before (a hand edit of its nodes is still seen). Why
    /// it matters: a write of one change in a 100,000-endpoint service asks
    /// this of 15 shards; building them copied every node (issue 19 item 2).
    pub fn intact_of(&self, desired: &DesiredObjects<'_>, index: u32) -> bool {
        let (ns, name) = desired.name(index);
        let current = |caches: &Caches| {
            caches
                .live
                .cached(&ns, &name)
                .is_some_and(|s| !s.older_than_our_write())
        };
        if !current(&self.lock()) {
            return false;
        }
        let want = if desired.is_later_shard(index) {
            self.shard_want(desired, index, (ns.clone(), name.clone()))
        } else {
            desired.object(index).map(|o| WantedObject::of(&o))
        };
        let Some(want) = want else { return false };
        self.lock()
            .live
            .cached(&ns, &name)
            .is_some_and(|s| !s.older_than_our_write() && s.satisfies(&want))
    }

    /// The wanted form of shard `index > 0` of `desired` named `at`,
    /// remembered per service and version ([`DriftView::intact_of`]).
    fn shard_want(
        &self,
        desired: &DesiredObjects<'_>,
        index: u32,
        at: ObjName,
    ) -> Option<WantedObject> {
        let key = &desired.service().key;
        let version = desired.version(index);
        let lock = || {
            self.shard_wants
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
        };
        if let Some((k, v, w)) = lock().get(&at)
            && k == key
            && v == version
        {
            return Some(w.clone());
        }
        let want = WantedObject::of(&desired.object(index)?);
        let mut wants = lock();
        if wants.len() >= SHARD_WANTS_MAX {
            wants.clear();
        }
        wants.insert(at, (key.clone(), version.to_string(), want.clone()));
        Some(want)
    }

    /// Who holds `ns/name` when that is not this instance (another
    /// instance, or a hand-made object), as the watch last showed it.
    pub fn taken(&self, ns: &str, name: &str) -> Option<Owner> {
        self.lock().live.taken(ns, name).cloned()
    }

    /// Every cached object that describes `key` (by its spec): an index
    /// lookup, O(objects of `key`).
    pub fn objects_of(&self, key: &ServiceKey) -> Vec<ObjName> {
        self.lock().live.objects_of(key)
    }

    /// What the cache shows of `key`'s objects next to what the desired
    /// state (`None`: no source) wants, for the planner to judge
    /// ([`kube_discovery_core::write_plan::judge_drift`]): gathered, not
    /// decided.
    pub fn facts(&self, key: &ServiceKey, desired: Option<&ServiceNodes>) -> DriftFacts {
        if !self.ready() {
            return DriftFacts {
                listed: false,
                wanted: Vec::new(),
                present: Vec::new(),
            };
        }
        self.facts_among(desired, self.objects_of(key))
    }

    /// [`DriftView::facts`] with the cached objects of the key given.
    fn facts_among(&self, desired: Option<&ServiceNodes>, present: Vec<ObjName>) -> DriftFacts {
        let wanted = desired
            .map(|d| wanted_objects(d, &self.naming, self.max_ports_bytes))
            .unwrap_or_default();
        let caches = self.lock();
        let wanted = wanted
            .iter()
            .map(|w| w.facts(caches.live.cached(&w.ns, &w.name).map(|s| s.seen())))
            .collect();
        DriftFacts {
            listed: true,
            wanted,
            present,
        }
    }

    /// The planner's verdict on the cache and the desired state of `key`
    /// (`None`: no source), as the drift watch's sweep and tests ask it.
    pub fn check(&self, key: &ServiceKey, desired: Option<&ServiceNodes>) -> DriftCheck {
        DriftCheck::from(judge_drift(&self.facts(key, desired)))
    }

    /// Whether a watch event about `obj` needs a closer look by the writer:
    /// `Some(true)` yes, `Some(false)` no, `None` not decidable yet (its
    /// cluster is not listed).
    pub(super) fn suspicious(
        &self,
        obj: &Watched,
        deleted: bool,
        shared: &ControllerState,
    ) -> Option<bool> {
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
                let wanted = wanted_objects(&d, &self.naming, self.max_ports_bytes);
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
    pub(super) fn sweep(&self, shared: &ControllerState) -> Vec<ServiceKey> {
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
                if judge_drift(&self.facts_among(Some(&svc), here)) != DriftResult::Intact {
                    out.insert(svc.key.clone());
                }
            }
        }
        // Orphans: one pass over the slots, a key is built only for objects
        // of listed clusters. (ControllerState's locks are only ever taken inside its
        // own methods, so calling it under the cache lock cannot deadlock.)
        let caches = self.lock();
        for s in caches.live.cached_slots() {
            if !clusters.get(s.cluster()).is_some_and(|c| c.listed) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::write::drift::DriftKind;
    use crate::write::drift::test_support::*;
    use kube::runtime::watcher::Event;
    use kube_discovery_core::crd::{desired_object, desired_objects_with_limit, shard_name};

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

    /// A status edit bumps `metadata.generation` (no status subresource) and
    /// leaves `observedGeneration` behind: drift, though the spec is ours.
    /// An object without the stamp (written by an older version) is not
    /// (the start-up list has it rewritten without a repair).
    #[test]
    fn an_observed_generation_behind_the_generation_is_drift() {
        let (view, mut w) = listed(ObjectNaming::source());
        let s = svc(&["10.0.0.1"]);
        let want = desired_object(&s, &ObjectNaming::source());
        let at = |rv: u64, generation: i64, stamp: Option<i64>| {
            let mut o = with_rv(want.clone(), rv);
            o.metadata.generation = Some(generation);
            kube_discovery_core::crd::stamp_generation(&mut o, stamp);
            // Decoded the way the watch decodes it, from JSON.
            serde_json::from_value::<Watched>(serde_json::to_value(&o).unwrap()).unwrap()
        };
        view.note_written("ns", "web", Some(5));
        w.apply(&Event::Apply(at(5, 3, Some(3))));
        assert_eq!(view.check(&s.key, Some(&s)), DriftCheck::Ok);
        w.apply(&Event::Apply(at(6, 4, Some(3))));
        assert_eq!(
            view.check(&s.key, Some(&s)),
            DriftCheck::Drift(DriftKind::Edited)
        );
        w.apply(&Event::Apply(at(7, 4, None)));
        assert_eq!(view.check(&s.key, Some(&s)), DriftCheck::Ok);
    }

    /// `intact_of` (lazy objects, a shard `i > 0` remembered by version)
    /// answers what `intact` answers of the built object, in every state:
    /// not cached, cached as wanted, a shard's nodes edited under the same
    /// version (remembered or not), the service changed, our write newer.
    #[test]
    fn intact_of_the_lazy_objects_is_intact_of_the_built_ones() {
        use kube_discovery_core::crd::DesiredObjects;
        let (view, mut w) = listed(ObjectNaming::source());
        let naming = ObjectNaming::source();
        let s = big(40);
        let t = big(41);
        let lazy = DesiredObjects::with_limit(&s, &naming, 600);
        let objs = lazy.all();
        let n = u32::try_from(objs.len()).unwrap();
        assert!(n > 2);
        let agree = |d: &DesiredObjects<'_>, what: &str| {
            let built = d.all();
            for i in 0..d.len() {
                assert_eq!(
                    view.intact_of(d, i),
                    view.intact(&built[i as usize]),
                    "{what}: object {i}"
                );
            }
        };
        agree(&lazy, "not cached");
        assert!((0..n).all(|i| !view.intact_of(&lazy, i)));
        for (i, o) in objs.iter().enumerate() {
            w.apply(&apply(&with_rv(o.clone(), 10 + i as u64)));
        }
        agree(&lazy, "cached");
        assert!((0..n).all(|i| view.intact_of(&lazy, i)));
        // Remembered now; a shard's nodes edited, its version kept.
        let mut edited = with_rv(objs[1].clone(), 100);
        edited.spec.ports.values_mut().for_each(|v| v.truncate(0));
        w.apply(&apply(&edited));
        agree(&lazy, "edited");
        assert!(!view.intact_of(&lazy, 1) && view.intact_of(&lazy, 2));
        w.apply(&apply(&with_rv(objs[1].clone(), 101)));
        agree(&lazy, "restored");
        // Another state of the service: its changed shards are not intact.
        let other = DesiredObjects::with_limit(&t, &naming, 600);
        agree(&other, "changed");
        assert!(!view.intact_of(&other, 0));
        // Our write is newer than the cache.
        view.note_written("ns", &lazy.name(2).1, Some(1_000));
        agree(&lazy, "stale");
        assert!(!view.intact_of(&lazy, 2));
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
            Vec::new(),
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
        let shared = ControllerState::new([""]);
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
        let unlisted = ControllerState::new([""]);
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
        let shared = ControllerState::new(["", "c1"]);
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
