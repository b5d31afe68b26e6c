//! Helpers shared by the integration tests of the core.

/// Seeded choices, so a failure names a replayable seed: `fastrand`'s
/// generator (already in the tree through `tempfile`) with the two
/// choices the tests make. No distributions and no shrinking are needed, so
/// no `rand` or `proptest` (`order_independence` shrinks: it has proptest).
pub struct Rng(fastrand::Rng);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(fastrand::Rng::with_seed(seed))
    }
    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.0.u64(..n) }
    }
    pub fn pick<'a>(&mut self, v: &[&'a str]) -> &'a str {
        v[self.0.usize(..v.len())]
    }
}
