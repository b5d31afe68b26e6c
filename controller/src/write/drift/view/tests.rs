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
