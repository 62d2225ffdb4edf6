//! Dot products of one 5120-wide row (the 27B model's hidden size) and of a 256-row slice of
//! the Q4_K LM head, per implementation.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use gguf_io::quants::{quantize_activations, quantize_row, reference, vec_dot_f32, vec_dot_q};
use gguf_io::GgmlType;
use std::hint::black_box;

const K: usize = 5120;
const ROWS: usize = 256;

fn weights(ty: GgmlType) -> Vec<u8> {
    let w: Vec<f32> = (0..K * ROWS)
        .map(|i| ((i * 7919 % 1013) as f32 / 506.0 - 1.0) * 0.02)
        .collect();
    let mut q = Vec::new();
    quantize_row(ty, &w, &mut q).unwrap();
    q
}

fn bench(c: &mut Criterion) {
    let x: Vec<f32> = (0..K).map(|i| (i * 31 % 97) as f32 / 48.0 - 1.0).collect();
    for ty in [GgmlType::Q4K, GgmlType::Q6K, GgmlType::Q3K, GgmlType::Q8_0] {
        let w = weights(ty);
        let rb = ty.row_bytes(K as u64).unwrap() as usize;
        let mut g = c.benchmark_group(format!("{}_x{ROWS}rows_k{K}", ty.name()));
        g.throughput(Throughput::Bytes(w.len() as u64));
        g.sample_size(20);
        g.bench_function("f32_acts_fast", |b| {
            b.iter(|| {
                w.chunks_exact(rb)
                    .map(|r| vec_dot_f32(ty, r, black_box(&x)).unwrap())
                    .sum::<f32>()
            })
        });
        g.bench_function("f32_acts_portable", |b| {
            b.iter(|| {
                w.chunks_exact(rb)
                    .map(|r| reference::vec_dot_f32_portable(ty, r, black_box(&x)).unwrap())
                    .sum::<f32>()
            })
        });
        let acts = quantize_activations(ty, &x).unwrap();
        g.bench_function("int8_acts_fast", |b| {
            b.iter(|| {
                w.chunks_exact(rb)
                    .map(|r| vec_dot_q(ty, r, black_box(&acts)).unwrap())
                    .sum::<f32>()
            })
        });
        g.bench_function("int8_acts_scalar", |b| {
            b.iter(|| {
                w.chunks_exact(rb)
                    .map(|r| reference::vec_dot_q(ty, r, black_box(&acts)).unwrap())
                    .sum::<f32>()
            })
        });
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
