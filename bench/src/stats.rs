//! Small statistics helpers: nearest-rank percentiles and a seeded xorshift
//! generator (the load is reproducible run to run; no dependency needed).

use serde_json::{Value, json};

/// p50/p90/p99/max/mean/count of `v` (sorted in place), nearest-rank method;
/// `null` values when `v` is empty.
pub fn percentiles(v: &mut [f64]) -> Value {
    if v.is_empty() {
        return json!({"count": 0, "p50": null, "p90": null, "p99": null, "max": null, "mean": null});
    }
    v.sort_by(f64::total_cmp);
    let rank = |q: f64| -> f64 {
        let r = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
        v[r - 1]
    };
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    json!({"count": v.len(), "p50": rank(0.50), "p90": rank(0.90), "p99": rank(0.99), "max": v[v.len() - 1], "mean": mean})
}

/// xorshift64* generator.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (0 is replaced by a constant).
    pub fn new(seed: u64) -> Self {
        Rng(if seed == 0 {
            0x2545_F491_4F6C_DD1D
        } else {
            seed
        })
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (`n` must be > 0; 0 yields 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p && p > 0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let p = percentiles(&mut v);
        assert_eq!(p["p50"], 50.0);
        assert_eq!(p["p90"], 90.0);
        assert_eq!(p["p99"], 99.0);
        assert_eq!(p["max"], 100.0);
        assert_eq!(percentiles(&mut [])["p99"], Value::Null);
        assert_eq!(percentiles(&mut [7.0])["p50"], 7.0);
    }

    #[test]
    fn rng_is_deterministic_and_in_range() {
        let (mut a, mut b) = (Rng::new(5), Rng::new(5));
        for _ in 0..1000 {
            let x = a.below(7);
            assert_eq!(x, b.below(7));
            assert!(x < 7);
        }
        let hits = (0..10_000).filter(|_| a.chance(0.2)).count();
        assert!((1500..2500).contains(&hits), "{hits}");
        assert!(!a.chance(0.0));
    }
}
