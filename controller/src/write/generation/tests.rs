use super::*;

#[test]
fn a_refused_stamp_pauses_stamping() {
    let g = Stamping::default();
    assert!(g.on());
    assert!(g.refused(), "the first refusal is news");
    assert!(!g.on());
    assert!(!g.refused(), "a second one within the pause is not");
}
