use super::*;
use kube_discovery_core::{PortMap, SourceKind};

#[test]
fn listed_answers_per_cluster_without_a_snapshot() {
    let s = ControllerState::new(["", "east"]);
    assert!(!s.listed("") && !s.listed("east") && !s.listed("nowhere"));
    s.update_cluster("east", |c| c.listed = true);
    assert!(s.listed("east") && !s.listed(""));
    assert_eq!(s.listed("east"), s.clusters()["east"].listed);
}

#[test]
fn a_watch_failing_longer_than_unready_after_makes_it_unready() {
    let s = ControllerState::new(["", "east"]);
    for c in ["", "east"] {
        s.update_cluster(c, |st| st.synced = true);
    }
    assert!(s.ready());
    let t0 = std::time::Instant::now();
    s.watch_failed("east", "EndpointSlice", "list failed: 403 Forbidden".into());
    // Without unready_after: ready whatever the failure.
    let much_later = t0 + std::time::Duration::from_secs(3600);
    assert!(s.failing_too_long(much_later).is_empty());
    s.set_unready_after(std::time::Duration::from_secs(60));
    assert!(s.failing_too_long(t0).is_empty(), "not yet");
    let late = s.failing_too_long(much_later);
    assert_eq!(late.len(), 1);
    assert_eq!(late[0].cluster.as_deref(), Some("east"));
    assert_eq!(late[0].watch, "EndpointSlice");
    assert_eq!(
        late[0].to_string(),
        format!(
            "cluster \"east\": watch failing for {}s: EndpointSlice watch: list failed: 403 Forbidden",
            late[0].failing_for.as_secs()
        )
    );
    // A second error keeps the first one's start.
    let since = s.clusters()["east"].failing_watches["EndpointSlice"].failing_since;
    s.watch_failed("east", "EndpointSlice", "still 403".into());
    let w = &s.clusters()["east"].failing_watches["EndpointSlice"];
    assert_eq!(
        (w.failing_since, w.last_error.as_str()),
        (since, "still 403")
    );
    // Served again: recovered.
    s.watch_ok("east", "EndpointSlice");
    assert!(s.failing_too_long(much_later).is_empty());
    assert!(s.clusters()["east"].failing_watches.is_empty());
    assert!(s.ready());
}

/// Issue 29, item 3: health is per watch. The Service watch of a cluster
/// working (and any other request of its client) does not clear the
/// failure of its endpoint watch, nor one cluster's another's.
#[test]
fn another_watch_succeeding_does_not_clear_a_failing_one() {
    let s = ControllerState::new(["", "east"]);
    for c in ["", "east"] {
        s.update_cluster(c, |st| st.synced = true);
    }
    s.set_unready_after(std::time::Duration::from_secs(60));
    let t0 = std::time::Instant::now();
    s.watch_failed("", "EndpointSlice", "list failed: 403 Forbidden".into());
    s.watch_failed("", "Service", "watch start failed: 500".into());
    s.watch_ok("", "Service");
    s.watch_ok("east", "EndpointSlice");
    let late = s.failing_too_long(t0 + std::time::Duration::from_secs(61));
    assert_eq!(late.len(), 1, "{late:?}");
    assert_eq!(
        (late[0].cluster.as_deref(), late[0].watch.as_str()),
        (Some(""), "EndpointSlice")
    );
    assert_eq!(
        s.clusters()[""].failing_for(t0 + std::time::Duration::from_secs(61)),
        Some(late[0].failing_for)
    );
    // Two failing watches of one cluster are each reported.
    s.watch_failed("", "Service", "watch start failed: 500".into());
    let late = s.failing_too_long(std::time::Instant::now() + std::time::Duration::from_secs(61));
    let kinds: Vec<&str> = late.iter().map(|u| u.watch.as_str()).collect();
    assert_eq!(kinds, ["EndpointSlice", "Service"]);
    // The cluster's state is serialized with its failing watches.
    let json = serde_json::to_value(&s.clusters()[""]).unwrap();
    assert_eq!(
        json["failing_watches"]["EndpointSlice"]["last_error"],
        "list failed: 403 Forbidden"
    );
    assert!(serde_json::to_value(&s.clusters()["east"]).unwrap()["failing_watches"].is_null());
}

/// Issue 29, item 3: a replica whose leader election rounds fail (the
/// Lease cannot be read or written) for longer than `unready_after` is
/// unready, standby or not; a healthy standby stays ready.
#[test]
fn a_lease_failing_longer_than_unready_after_makes_it_unready() {
    let s = ControllerState::new([""]);
    s.update_cluster("", |c| c.listed = true);
    s.set_standby(true);
    s.set_unready_after(std::time::Duration::from_secs(60));
    assert!(s.ready(), "a listed standby is ready");
    let t0 = std::time::Instant::now();
    assert!(s.lease_failed("403 Forbidden".into()), "a change");
    assert!(!s.lease_failed("403 Forbidden".into()), "no change");
    assert!(s.lease_failing());
    assert!(s.ready(), "not for longer than unready_after yet");
    let late = s.failing_too_long(t0 + std::time::Duration::from_secs(61));
    assert_eq!(late.len(), 1);
    assert_eq!(
        (late[0].cluster.as_deref(), late[0].watch.as_str()),
        (None, "Lease")
    );
    assert!(
        late[0].to_string().starts_with("leader election: "),
        "{}",
        late[0]
    );
    assert!(s.lease_ok(), "a change");
    assert!(!s.lease_ok(), "no change");
    assert!(!s.lease_failing());
    assert!(
        s.failing_too_long(t0 + std::time::Duration::from_secs(61))
            .is_empty()
    );
    assert!(s.ready());
}

/// Issue 29 item 5: a name another instance holds keeps the leader
/// unready, with a message naming the object, until it is free or ours;
/// a standby (which writes nothing) forgets it.
#[test]
fn a_name_held_by_another_instance_makes_it_unready() {
    let s = ControllerState::new([""]);
    s.update_cluster("", |st| st.synced = true);
    let (web, api) = (
        ServiceKey::new("", "ns", "web"),
        ServiceKey::new("", "ns", "api"),
    );
    s.set_held_by_other(&web, Some(("ns/web".into(), "a".into())));
    s.set_held_by_other(&api, Some(("ns/api".into(), "a".into())));
    assert!(!s.ready());
    let why = s.held_by_others().unwrap();
    for part in [
        "2 DiscoveredService(s)",
        "ns/web (service ns/web, instance \"a\")",
        "ns/api",
        "adopt_instances",
    ] {
        assert!(why.contains(part), "{part:?} not in {why}");
    }
    s.set_held_by_other(&web, None);
    assert!(!s.ready());
    s.set_held_by_other(&api, None);
    assert!(s.ready() && s.held_by_others().is_none());
    s.set_held_by_other(&api, Some(("ns/api".into(), "a".into())));
    s.set_standby(true);
    assert!(s.ready() && s.held_by_others().is_none());
}

#[test]
fn desired_roundtrip_and_readiness() {
    let s = ControllerState::new(["", "c2"]);
    let k = ServiceKey::new("", "ns", "a");
    assert!(!s.ready());
    s.set_desired(
        &k,
        Some(ServiceNodes::new(
            k.clone(),
            SourceKind::Endpoints,
            PortMap::new(),
            None,
        )),
    );
    assert!(s.has_desired(&k));
    assert_eq!(s.counts(""), (1, 0));
    assert_eq!(s.counts("c2"), (0, 0));
    s.update_cluster("", |c| c.synced = true);
    assert!(!s.ready(), "c2 is not synced yet");
    s.update_cluster("c2", |c| c.synced = true);
    assert!(s.ready());
    s.set_desired(&k, None);
    assert!(s.desired(&k).is_none());
    // An `Arc` handed in is held, not copied.
    let v = Arc::new(ServiceNodes::new(
        k.clone(),
        SourceKind::Endpoints,
        PortMap::new(),
        None,
    ));
    s.set_desired_arc(&k, Some(Arc::clone(&v)));
    assert_eq!(Arc::strong_count(&v), 2);
    assert_eq!(s.desired(&k).as_deref(), Some(&*v));
    assert_eq!(s.desired_of(""), vec![v.clone()]);
    s.set_desired_arc(&k, None);
    assert_eq!(Arc::strong_count(&v), 1);
}

fn svc(key: &ServiceKey, port: &str) -> Arc<ServiceNodes> {
    let mut ports = PortMap::new();
    ports.insert(port.to_string(), Vec::new());
    Arc::new(ServiceNodes::new(
        key.clone(),
        SourceKind::Endpoints,
        ports,
        None,
    ))
}

#[test]
fn desired_values_are_replaced_in_place_and_ordered_by_key() {
    let s = ControllerState::new([""]);
    let keys = [
        ServiceKey::new("west", "a", "x"),
        ServiceKey::new("", "b", "y"),
        ServiceKey::new("", "a", "z"),
        ServiceKey::new("", "a", "y"),
    ];
    for k in &keys {
        s.set_desired_arc(k, Some(svc(k, "old")));
    }
    // A new value of a key replaces the old one (which is released).
    let old = s.desired(&keys[1]).unwrap();
    let new = svc(&keys[1], "new");
    s.set_desired_arc(&keys[1], Some(Arc::clone(&new)));
    assert_eq!(Arc::strong_count(&old), 1, "the old value is released");
    assert!(Arc::ptr_eq(&s.desired(&keys[1]).unwrap(), &new));
    let mut sorted = keys.to_vec();
    sorted.sort();
    s.with_desired(|d| {
        assert_eq!(d.len(), 4);
        let order: Vec<ServiceKey> = d.values().map(|v| v.key.clone()).collect();
        assert_eq!(order, sorted);
    });
    assert_eq!(s.desired_of("").len(), 3);
    assert_eq!(s.counts("west"), (1, 0));
    // A value handed in under another key is kept under the key given.
    let wrong = svc(&ServiceKey::new("", "other", "svc"), "p");
    s.set_desired_arc(&keys[0], Some(wrong));
    let got = s.desired(&keys[0]).unwrap();
    assert_eq!(got.key, keys[0]);
    assert!(got.ports.contains_key("p"));
    assert!(!s.has_desired(&ServiceKey::new("", "other", "svc")));
    s.with_desired(|d| assert_eq!(d.len(), 4));
}
