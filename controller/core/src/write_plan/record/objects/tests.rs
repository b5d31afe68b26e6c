use super::*;

#[test]
fn a_slot_stays_small() {
    // The bound of the module docs: the drift cache's 72 bytes plus the
    // generation (8), which had a map of its own before.
    assert!(
        std::mem::size_of::<Slot>() <= 80,
        "{}",
        std::mem::size_of::<Slot>()
    );
    assert!(std::mem::size_of::<Names>() <= 16);
}
