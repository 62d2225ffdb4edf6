//! Decode-speed comparison of the stock types with fused AVX2 dot products against Q4_K, on
//! one 17408 x 5120 matrix (the 27B model's `ffn_up`: 17408 rows of K = 5120) per type, one
//! thread, f32 activations: a whole matrix-vector product per iteration, as one decoded token
//! does. The rows are random valid blocks (speed does not depend on the values). The
//! `portable` entries are the block-at-a-time path the fused kernels replace.
//!
//! `cargo bench -p gguf-io --bench stock_types`; compare each type's time with Q4_K's from the
//! same run (the machine may be shared: check its load).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use gguf_io::quants::{reference, vec_dot_f32};
use gguf_io::GgmlType;
use pn_tests::ggml::random_row;
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::hint::black_box;

const K: usize = 5120;
const ROWS: usize = 17408;

fn bench(c: &mut Criterion) {
    let x: Vec<f32> = (0..K).map(|i| (i * 31 % 97) as f32 / 48.0 - 1.0).collect();
    let mut rng = StdRng::seed_from_u64(1);
    use GgmlType::*;
    for ty in [Q4K, Q5_0, Q5_1, Q5K, Q6K, Iq4Xs, Iq3S, Q8_0, Iq2Xxs] {
        let blocks = K / ty.block_size() * ROWS;
        let w = random_row(ty, blocks, 0.02, &mut rng);
        let rb = ty.row_bytes(K as u64).unwrap() as usize;
        let mut g = c.benchmark_group(format!("matvec_{ROWS}x{K}"));
        g.throughput(Throughput::Elements((K * ROWS) as u64));
        g.sample_size(10);
        g.bench_function(format!("{}_fast", ty.name()), |b| {
            b.iter(|| {
                w.chunks_exact(rb)
                    .map(|r| vec_dot_f32(ty, r, black_box(&x)).unwrap())
                    .sum::<f32>()
            })
        });
        if ty != Q4K {
            g.bench_function(format!("{}_portable", ty.name()), |b| {
                b.iter(|| {
                    w.chunks_exact(rb)
                        .map(|r| reference::vec_dot_f32_portable(ty, r, black_box(&x)).unwrap())
                        .sum::<f32>()
                })
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
