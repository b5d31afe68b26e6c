//! Helpers shared by the integration tests of the core.

/// xorshift64*: deterministic, so a failure names a replayable seed. Hand
/// written (a dozen lines) rather than a dev-dependency on `rand` or
/// `proptest`: the tests only need reproducible choices, no distributions
/// and no shrinking.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn pick<'a>(&mut self, v: &[&'a str]) -> &'a str {
        v[usize::try_from(self.below(v.len() as u64)).unwrap_or(0)]
    }
}
