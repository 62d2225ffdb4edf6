//! Seeded random test data (`rand`'s `StdRng`, so a seed gives the same values every run).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A deterministic rng for a test.
pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// `n` values uniform in `[-a, a)` (`random_range`).
pub fn random_vec(rng: &mut StdRng, n: usize, a: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-a..a)).collect()
}

/// [`random_vec`] from a fresh [`rng`]`(seed)`.
pub fn seeded_vec(seed: u64, n: usize, a: f32) -> Vec<f32> {
    random_vec(&mut rng(seed), n, a)
}

/// `n` values `(2u - 1) * scale` for `u = rng.random::<f32>()` in `[0, 1)`: uniform in
/// `[-scale, scale)`, a different stream from [`random_vec`] (the CPU-op tests' inputs).
pub fn random_signed(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| (rng.random::<f32>() * 2.0 - 1.0) * scale)
        .collect()
}
