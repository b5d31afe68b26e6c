use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;
use crate::crd::conditions::{DEGRADED, conditions, degraded_news};
use crate::crd::{DiscoveredService, desired_object};
use crate::{Node, PortMap, ServiceNodes, SourceKind};

fn name(ns: &str, name: &str) -> ObjName {
    (ns.to_string(), name.to_string())
}

fn svc(nodes: usize) -> ServiceNodes {
    let mut ports = PortMap::new();
    ports.insert(
        "http".into(),
        (0..nodes)
            .map(|i| Node::new(format!("10.0.0.{}", i + 1), 80, 50))
            .collect(),
    );
    ServiceNodes::new(
        ServiceKey::new("", "ns", "web"),
        SourceKind::EndpointSlice,
        ports,
        None,
    )
}

/// The record as the drift watch feeds it: `o` at `rv` and `generation`.
fn watch(r: &mut Record, o: &DiscoveredService, owner: &Owner, rv: u64, generation: i64) {
    seen(o, owner, rv, generation, |s| r.apply(s));
}

/// `o` at `rv` and `generation` as the drift watch hands it over.
fn seen(
    o: &DiscoveredService,
    owner: &Owner,
    rv: u64,
    generation: i64,
    f: impl FnOnce(&ObjectSeen<'_>),
) {
    let key = ServiceKey::new(
        &o.spec.cluster,
        &o.spec.source_namespace,
        &o.spec.source_name,
    );
    let facts = Facts::of_object(o);
    f(&ObjectSeen {
        ns: o.metadata.namespace.as_deref().unwrap_or_default(),
        name: o.metadata.name.as_deref().unwrap_or_default(),
        key: &key,
        owner,
        facts: &facts,
        resource_version: Some(rv),
        generation: Some(generation),
    });
}

#[test]
fn generations_are_remembered_per_object_and_forgotten() {
    let mut r = Record::default();
    assert_eq!(r.next_generation("ns", "web"), 1, "unknown: a new object");
    r.written("ns", "web", Some(10), Some(4));
    r.written("ns", "web.1", Some(11), Some(9));
    assert_eq!(
        (
            r.next_generation("ns", "web"),
            r.next_generation("ns", "web.1")
        ),
        (5, 10)
    );
    r.removed("ns", "web");
    assert_eq!(r.next_generation("ns", "web"), 1);
    r.written("ns", "web", Some(12), Some(4));
    let o = desired_object(&svc(1), &crate::crd::ObjectNaming::source());
    watch(&mut r, &o, &Owner::Us, 12, 3);
    assert_eq!(
        r.next_generation("ns", "web"),
        5,
        "an older watch event changes nothing"
    );
    watch(&mut r, &o, &Owner::Us, 13, 6);
    assert_eq!(r.next_generation("ns", "web"), 7, "someone else's write");
    let mut found = Listing::default();
    found.ours(name("other", "web"), 2);
    let ticket = r.list_begins();
    r.listed(ticket, found);
    assert_eq!(
        (
            r.next_generation("other", "web"),
            r.next_generation("ns", "web.1")
        ),
        (3, 1)
    );
    // A watched delete forgets the generation, the watched copy goes.
    watch(&mut r, &o, &Owner::Us, 14, 6);
    assert_eq!(r.len(), 1);
    r.delete("ns", "web");
    assert_eq!((r.next_generation("ns", "web"), r.len()), (1, 0));
}

#[test]
fn a_relist_keeps_our_writes_and_the_generations() {
    let mut r = Record::default();
    let o = desired_object(&svc(1), &crate::crd::ObjectNaming::source());
    r.written("ns", "web", Some(20), Some(4));
    r.init();
    seen(&o, &Owner::Us, 19, 3, |s| r.init_apply(s));
    assert!(
        !r.watched() && r.is_empty(),
        "not swapped in before init_done"
    );
    r.init_done();
    assert!(r.watched());
    assert!(
        r.cached("ns", "web")
            .is_some_and(Slot::older_than_our_write)
    );
    assert!(r.ours_or_older("ns", "web", Some(20)));
    assert!(!r.ours_or_older("ns", "web", Some(21)));
    assert_eq!(r.next_generation("ns", "web"), 5);
}

#[test]
fn names_held_by_others_come_from_the_list_until_the_watch_has_listed() {
    let mut r = Record::default();
    let mut found = Listing::default();
    found.foreign(name("ns", "web"), Owner::Unmanaged);
    let ticket = r.list_begins();
    r.listed(ticket, found);
    assert_eq!(r.taken("ns", "web"), Some(&Owner::Unmanaged));
    r.init();
    r.init_done();
    assert_eq!(r.taken("ns", "web"), None, "the watch knows better");
    let o = desired_object(&svc(1), &crate::crd::ObjectNaming::source());
    let other = Owner::Instance("b".into());
    watch(&mut r, &o, &other, 5, 1);
    assert_eq!(r.taken("ns", "web"), Some(&other));
    assert!(r.cached("ns", "web").is_none(), "never compared");
    let mut found = Listing::default();
    found.foreign(name("ns", "x"), Owner::Unmanaged);
    let ticket = r.list_begins();
    r.listed(ticket, found);
    assert_eq!(
        r.taken("ns", "x"),
        None,
        "a later list does not override the watch"
    );
    watch(&mut r, &o, &Owner::Us, 6, 1);
    assert_eq!(r.taken("ns", "web"), None);
    assert_eq!(r.objects_of(&svc(1).key), vec![name("ns", "web")]);
}

fn at(secs: i64) -> Time {
    Time(jiff::Timestamp::from_second(secs).unwrap())
}

/// What is kept gives the same decisions as the whole conditions: the
/// times of conditions whose status stays, and Degraded news.
#[test]
fn kept_conditions_decide_like_the_whole_ones() {
    let s = svc(2);
    let key = s.key.clone();
    let mut first = conditions(&s, &[], &at(100));
    let degraded = first.iter_mut().find(|c| c.type_ == DEGRADED).unwrap();
    degraded.status = "True".into();
    degraded.message = "1 item(s) skipped: slice ns/web-a ports[1]".into();
    first.push(Condition {
        type_: "SomethingElse".into(),
        status: "True".into(),
        reason: "Hand".into(),
        message: "ignored".into(),
        last_transition_time: at(5),
        observed_generation: Some(3),
    });
    let mut r = Record::default();
    let mut found = Listing::default();
    found.conditions(&key, &first);
    let ticket = r.list_begins();
    r.listed(ticket, found);
    let back = r.conditions(&key);
    assert_eq!(back.len(), 2, "{back:?}");
    // The same times for an unchanged status, the same news verdict.
    let later = at(200);
    assert_eq!(
        conditions(&s, &back, &later),
        conditions(&s, &first, &later)
    );
    for new in [conditions(&s, &first, &later), first.clone()] {
        assert_eq!(
            degraded_news(&back, &new).is_some(),
            degraded_news(&first, &new).is_some()
        );
    }
    r.service_removed(&key);
    assert!(r.conditions(&key).is_empty());
    r.conditions_written(&key, &first);
    assert_eq!(r.conditions(&key), back);
    assert!(
        std::mem::size_of::<Kept>() <= 64,
        "{}",
        std::mem::size_of::<Kept>()
    );
}

fn held(version: &str, shards: u32) -> Held {
    Held {
        version: version.to_string(),
        shards,
    }
}

fn listing(services: &[(&str, &str, u32)]) -> Listing {
    let mut l = Listing::default();
    for (n, v, shards) in services {
        l.service(&ServiceKey::new("", "ns", *n), &held(v, *shards));
    }
    l
}

/// The start-up list replaces the versions and shard slots, the answers to
/// our writes update them.
#[test]
fn services_come_from_the_list_and_the_answers() {
    let k = |n: &str| ServiceKey::new("", "ns", n);
    let mut r = Record::default();
    assert_eq!(r.held(&k("a")), None);
    let t = r.list_begins();
    r.listed(t, listing(&[("a", "v1", 1), ("b", "", 3)]));
    assert_eq!(r.held(&k("a")), Some(held("v1", 1)));
    assert_eq!(r.held(&k("b")), Some(held("", 3)));
    r.service_written(&k("b"), "00000000000000ff", 2);
    assert_eq!(r.held(&k("b")), Some(held("00000000000000ff", 2)));
    r.service_removed(&k("a"));
    assert_eq!(r.held(&k("a")), None);
    assert_eq!(r.services_len(), 1);
    // A later list replaces everything.
    let t = r.list_begins();
    r.listed(t, listing(&[("c", "v3", 1)]));
    assert_eq!(r.held(&k("b")), None);
    assert_eq!(r.held(&k("c")), Some(held("v3", 1)));
}

/// A list reads a while: the answers to writes that land meanwhile are
/// newer than what it read and stay; a list that began before the last one
/// landed is dropped whole (an older list never overwrites a newer one).
#[test]
fn an_older_list_never_overwrites_newer_answers() {
    let k = |n: &str| ServiceKey::new("", "ns", n);
    let mut r = Record::default();
    let first = r.list_begins();
    // Answers while the list runs: `a` applied, `b` deleted.
    r.service_written(&k("a"), "v2", 2);
    r.service_removed(&k("b"));
    r.listed(
        first,
        listing(&[("a", "v1", 1), ("b", "v1", 1), ("c", "v1", 1)]),
    );
    assert_eq!(r.held(&k("a")), Some(held("v2", 2)), "written since");
    assert_eq!(r.held(&k("b")), None, "deleted since");
    assert_eq!(r.held(&k("c")), Some(held("v1", 1)));
    // Two lists overlap (a new leadership epoch); the newer lands first.
    let older = r.list_begins();
    let newer = r.list_begins();
    r.listed(newer, listing(&[("c", "v4", 1)]));
    r.listed(older, listing(&[("c", "v3", 1), ("d", "v3", 1)]));
    assert_eq!(r.held(&k("c")), Some(held("v4", 1)));
    assert_eq!(r.held(&k("d")), None);
    // A write answered before a list began is what that list read.
    r.service_written(&k("c"), "v5", 1);
    let t = r.list_begins();
    r.listed(t, listing(&[("c", "v6", 1)]));
    assert_eq!(r.held(&k("c")), Some(held("v6", 1)));
}
