//! Test helpers, built only for tests and benchmarks (`cfg(test)` or the `testing` feature, which
//! only dev-dependencies enable): deterministic pseudo-random values, here, and tiny model files
//! with random weights ([`model`]).
//!
//! The values are the same numbers on every machine and every run, with no crate. A 64-bit linear congruential generator with the multiplier and
//! increment of Knuth's MMIX; its top 24 bits make an f32 in [-1, 1) exactly.
//!
//! Not for sampling: the sampler's draws come from [`crate::sampler::Rng`] (SplitMix64), whose
//! low bits are as good as its high ones.

pub mod model;
pub mod reference_json;

/// One step of the generator: advances `seed`, returns a value in [-1, 1).
pub fn lcg(seed: &mut u64) -> f32 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

/// `n` values in [-1, 1) continuing `seed`'s stream.
pub fn next_values(n: usize, seed: &mut u64) -> Vec<f32> {
    (0..n).map(|_| lcg(seed)).collect()
}

/// `n` values in [-1, 1) from `seed` (stepped once first, so that seeds 0, 1, 2 ... start apart).
pub fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    lcg(&mut s);
    next_values(n, &mut s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_in_range_and_repeat() {
        let v = values(1000, 7);
        assert!(v.iter().all(|&x| (-1.0..1.0).contains(&x)));
        assert_eq!(v, values(1000, 7));
        assert_ne!(v, values(1000, 8));
    }
}
