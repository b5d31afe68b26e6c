use super::*;
use crate::model::{Node, PortMap, ServiceKey, SourceKind};

fn at(secs: i64) -> Time {
    Time(jiff::Timestamp::from_second(secs).unwrap())
}

fn svc(ports: &[(&str, &[&str])]) -> ServiceNodes {
    let ports: PortMap = ports
        .iter()
        .map(|(k, hosts)| {
            (
                (*k).to_string(),
                hosts.iter().map(|h| Node::new(*h, 80, 1)).collect(),
            )
        })
        .collect();
    ServiceNodes::new(
        ServiceKey::new("", "shop", "web"),
        SourceKind::EndpointSlice,
        ports,
        None,
    )
}

/// `(port key, hosts)` of a test service.
type Ports<'a> = &'a [(&'a str, &'a [&'a str])];

fn summary(c: &[Condition]) -> Vec<(String, String, String)> {
    c.iter()
        .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
        .collect()
}

fn ready(c: &[Condition]) -> &Condition {
    status_of(c, READY).unwrap()
}

#[test]
fn a_service_port_whose_target_port_no_endpoint_has_is_not_ready() {
    let mut extras = crate::source::service::PortExtras::default();
    extras.unresolved.push(
        "Service port 9090 (metrics): no endpoint has targetPort metrics; the port has no nodes"
            .to_string(),
    );
    let plain = svc(&[("http", &["10.0.0.1"])]);
    let s = plain.clone().with_extras(extras);
    let c = conditions(&s, &[], &at(10));
    assert_eq!(ready(&c).status, "False");
    assert_eq!(ready(&c).reason, TARGET_PORT_NOT_FOUND);
    assert!(
        ready(&c).message.contains("9090 (metrics)") && ready(&c).message.contains("http"),
        "{}",
        ready(&c).message
    );
    // Part of the version: the object is rewritten when it appears or goes.
    assert_ne!(s.version, plain.version);
    // The endpoints gain the port: the Service resolves, Ready again.
    let fixed = plain.with_extras(crate::source::service::PortExtras::default());
    let c2 = conditions(&fixed, &c, &at(20));
    assert_eq!(ready(&c2).status, "True");
    assert_eq!(ready(&c2).last_transition_time, at(20));
}

#[test]
fn ready_reasons_follow_the_nodes() {
    let cases: [(Ports, &str, &str); 5] = [
        (&[], "False", NO_ENDPOINTS),
        (&[("http", &[]), ("grpc", &[])], "False", NO_ENDPOINTS),
        (
            &[("http", &["10.0.0.1"]), ("admin", &[])],
            "False",
            PORT_WITHOUT_NODES,
        ),
        (&[("http", &["10.0.0.1"])], "True", ALL_PORTS_HAVE_NODES),
        (
            &[("http", &["10.0.0.1", "10.0.0.2"]), ("grpc", &["10.0.0.1"])],
            "True",
            ALL_PORTS_HAVE_NODES,
        ),
    ];
    for (ports, status, reason) in cases {
        let c = conditions(&svc(ports), &[], &at(10));
        assert_eq!(
            (ready(&c).status.as_str(), ready(&c).reason.as_str()),
            (status, reason),
            "{ports:?}"
        );
        assert_eq!(c[0].last_transition_time, at(10));
        assert_eq!(c[0].observed_generation, None);
    }
    let c = conditions(
        &svc(&[("http", &["10.0.0.1"]), ("admin", &[])]),
        &[],
        &at(1),
    );
    assert_eq!(
        ready(&c).message,
        "port(s) admin have no ready endpoint; 1 node(s) on the other port(s)"
    );
    let c = conditions(&svc(&[("http", &[]), ("grpc", &[])]), &[], &at(1));
    assert_eq!(
        ready(&c).message,
        "no ready endpoint on any port (grpc, http): no pod selected or ready"
    );
}

#[test]
fn only_draining_nodes_are_all_terminating() {
    let mut s = svc(&[("http", &["10.0.0.1", "10.0.0.2"])]);
    for n in s.ports.get_mut("http").unwrap() {
        n.draining = Some(true);
    }
    let c = conditions(&s, &[], &at(1));
    assert_eq!(
        (ready(&c).status.as_str(), ready(&c).reason.as_str()),
        ("False", ALL_TERMINATING)
    );
    // One ready node besides: ready.
    s.ports.get_mut("http").unwrap()[0].draining = None;
    assert_eq!(ready(&conditions(&s, &[], &at(1))).status, "True");
}

#[test]
fn degraded_names_what_was_skipped() {
    let s = svc(&[("http", &["10.0.0.1"])]);
    let c = conditions(&s, &[], &at(1));
    assert_eq!(
        summary(&c),
        vec![
            ("Ready".into(), "True".into(), ALL_PORTS_HAVE_NODES.into()),
            ("Degraded".into(), "False".into(), NOTHING_SKIPPED.into()),
        ]
    );
    let bad = s.with_skipped(vec![
        "EndpointSlice shop/web-1: ports[0] port 0 is out of range; port skipped".into(),
    ]);
    let c = conditions(&bad, &[], &at(1));
    let d = status_of(&c, DEGRADED).unwrap();
    assert_eq!(
        (d.status.as_str(), d.reason.as_str()),
        ("True", SOURCE_DATA_SKIPPED)
    );
    assert_eq!(
        d.message,
        "1 item(s) of the EndpointSlice data skipped: EndpointSlice shop/web-1: ports[0] port 0 is out of range; port skipped"
    );
}

#[test]
fn skipped_data_changes_the_version_only_when_present() {
    let s = svc(&[("http", &["10.0.0.1"])]);
    let same = s.clone().with_skipped(Vec::new());
    assert_eq!(same.version, s.version);
    let a = s.clone().with_skipped(vec!["a".into()]);
    let b = s.clone().with_skipped(vec!["b".into()]);
    assert_ne!(a.version, s.version);
    assert_ne!(a.version, b.version);
    assert_eq!(a.version.len(), 16);
}

#[test]
fn last_transition_time_moves_only_on_a_status_change() {
    let empty = svc(&[("http", &[])]);
    let full = svc(&[("http", &["10.0.0.1"])]);
    let more = svc(&[("http", &["10.0.0.1", "10.0.0.2"])]);
    let c1 = conditions(&empty, &[], &at(10));
    // Still not ready at 20: the time of 10 stays.
    let c2 = conditions(&empty, &c1, &at(20));
    assert_eq!(ready(&c2).last_transition_time, at(10));
    // Ready at 30: a transition.
    let c3 = conditions(&full, &c2, &at(30));
    assert_eq!(ready(&c3).last_transition_time, at(30));
    // More nodes at 40 (message changes, status does not): 30 stays.
    let c4 = conditions(&more, &c3, &at(40));
    assert_eq!(ready(&c4).last_transition_time, at(30));
    assert_ne!(ready(&c4).message, ready(&c3).message);
    // Degraded stayed False all along: its first time stays.
    assert_eq!(
        status_of(&c4, DEGRADED).unwrap().last_transition_time,
        at(10)
    );
    // A reason change within False (NoEndpoints -> PortWithoutNodes) is
    // no transition either.
    let partial = svc(&[("http", &["10.0.0.1"]), ("admin", &[])]);
    let c5 = conditions(&partial, &c1, &at(50));
    assert_eq!(ready(&c5).reason, PORT_WITHOUT_NODES);
    assert_eq!(ready(&c5).last_transition_time, at(10));
}

#[test]
fn degraded_is_news_once_per_change_of_what_was_skipped() {
    let good = svc(&[("http", &["10.0.0.1"])]);
    let bad = good
        .clone()
        .with_skipped(vec!["EndpointSlice shop/web-1: ports[0] x".into()]);
    let worse = good.clone().with_skipped(vec![
        "EndpointSlice shop/web-1: ports[0] x".into(),
        "EndpointSlice shop/web-2: ports[0] y".into(),
    ]);
    let c_good = conditions(&good, &[], &at(1));
    assert_eq!(degraded_news(&[], &c_good), None);
    let c_bad = conditions(&bad, &c_good, &at(2));
    assert_eq!(
        degraded_news(&c_good, &c_bad).map(|c| c.reason.as_str()),
        Some(SOURCE_DATA_SKIPPED)
    );
    // Unknown before (a first write): news too.
    assert!(degraded_news(&[], &c_bad).is_some());
    // The same skipped data again (relist, rewrite, restart): nothing.
    let again = conditions(&bad, &c_bad, &at(3));
    assert_eq!(degraded_news(&c_bad, &again), None);
    // Other skipped data: news; fixed: nothing to say.
    let c_worse = conditions(&worse, &again, &at(4));
    assert!(degraded_news(&again, &c_worse).is_some());
    assert_eq!(
        degraded_news(&c_worse, &conditions(&good, &c_worse, &at(5))),
        None
    );
}

#[test]
fn long_messages_are_cut_on_a_character_boundary() {
    let s = svc(&[("http", &["10.0.0.1"])]).with_skipped(vec!["é".repeat(3000)]);
    let c = conditions(&s, &[], &at(1));
    let m = &status_of(&c, DEGRADED).unwrap().message;
    assert!(m.len() <= MAX_MESSAGE && m.ends_with("..."), "{}", m.len());
}
