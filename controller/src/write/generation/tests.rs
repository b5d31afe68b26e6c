use super::*;

#[test]
fn a_refused_stamp_pauses_stamping() {
    let g = Stamping::default();
    assert!(g.on());
    assert!(g.refused(), "the first refusal is news");
    assert!(!g.on());
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
