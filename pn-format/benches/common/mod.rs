//! Helpers the PN benches share: random valid weight blocks and the memory-read baseline every
//! kernel time is divided by (ratios within one run, never bare times).

use pn_format::PnType;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

// The matrix-vector harness and the read baseline (also included by gguf-io's decode bench).
#[allow(dead_code)]
#[path = "clock.rs"]
pub mod clock;
pub use clock::read_sum;

/// `rows` rows of `k` weights of random valid blocks of type `ty` (pn3t's reserved bits clear).
#[allow(dead_code)] // pn_dot makes its weights its own way
pub fn random_weights(ty: PnType, rows: usize, k: usize) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(7);
    let nb = rows * k / ty.weights_per_block();
    let reserved = if ty == PnType::Pn3t { 0x8000_8000 } else { 0 };
    let mut out = Vec::with_capacity(nb * 34);
    for _ in 0..nb {
        let d = half::f16::from_f32(rng.random_range(-0.01f32..0.01));
        out.extend_from_slice(&d.to_le_bytes());
        for _ in 0..8 {
            out.extend_from_slice(&(rng.random::<u32>() & !reserved).to_le_bytes());
        }
    }
    out
}
