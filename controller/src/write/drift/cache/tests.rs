use super::*;

#[test]
fn a_slot_stays_small() {
    // The bound of the module docs (72 bytes inline).
    assert!(
        std::mem::size_of::<Slot>() <= 72,
        "{}",
        std::mem::size_of::<Slot>()
    );
    assert!(std::mem::size_of::<Names>() <= 16);
}
