use super::*;

#[test]
fn remembers_per_object_and_forgets() {
    let g = Generations::default();
    assert_eq!(g.next("ns", "web"), 1, "unknown: a new object");
    g.note("ns", "web", Some(4));
    g.note("ns", "web.1", Some(9));
    assert_eq!((g.next("ns", "web"), g.next("ns", "web.1")), (5, 10));
    g.note("ns", "web", None);
    assert_eq!(g.next("ns", "web"), 1);
    g.note("ns", "web", Some(4));
    g.seen("ns", "web", Some(3));
    assert_eq!(
        g.next("ns", "web"),
        5,
        "an older watch event changes nothing"
    );
    g.seen("ns", "web", Some(6));
    assert_eq!(g.next("ns", "web"), 7, "someone else's write");
    g.listed([(("other".to_string(), "web".to_string()), 2)]);
    assert_eq!((g.next("other", "web"), g.next("ns", "web.1")), (3, 1));
}

#[test]
fn a_refused_stamp_pauses_stamping() {
    let g = Generations::default();
    assert!(g.stamping());
    assert!(g.refused(), "the first refusal is news");
    assert!(!g.stamping());
    assert!(!g.refused(), "a second one within the pause is not");
    assert!(stamp_undeclared(
        500,
        "failed to create typed patch object (shop/web; kubediscovery.io/v1alpha1, Kind=DiscoveredService): .status.observedGeneration: field not declared in schema"
    ));
    assert!(!stamp_undeclared(
        500,
        ".spec.aliases: field not declared in schema"
    ));
    assert!(!stamp_undeclared(
        422,
        "observedGeneration: field not declared in schema"
    ));
}
