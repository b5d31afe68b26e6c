use super::*;
use kube_discovery_core::crd::conditions::{conditions, degraded_news};
use kube_discovery_core::{Node, PortMap, ServiceNodes, SourceKind};

fn at(secs: i64) -> Time {
    Time(jiff::Timestamp::from_second(secs).unwrap())
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
    let e = Explain::default();
    e.listed(HashMap::from([(key.clone(), first.clone())]));
    let back = e.previous(&key);
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
    e.forget(&key);
    assert!(e.previous(&key).is_empty());
    assert!(
        std::mem::size_of::<Kept>() <= 64,
        "{}",
        std::mem::size_of::<Kept>()
    );
}
