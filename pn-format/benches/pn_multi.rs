//! One pass over a PN matrix for M activation vectors (`matvec_multi`) against M separate
//! `matvec`s and a plain memory read of the same bytes, on the 27B `ffn_up` (pn3t, 17408 x 5120)
//! and `ffn_down` (pn4t, 5120 x 17408) shapes, on one and two threads. Report ratios to the read
//! baseline of the same run (criterion's `estimates.json` medians, divided), never bare times.
//!
//! The weights are random valid blocks (finite scales, reserved bits clear): the kernels' speed
//! does not depend on the values, and this builds 40 MB in well under a second.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pn_format::dot::{matvec_multi, MAX_ACTS};
use pn_format::{matvec, PnType, PreparedI16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::hint::black_box;
use std::time::Duration;

mod common;
use common::{random_weights, read_sum};

/// `matvec_multi` over `rows` rows split into `threads` contiguous ranges.
fn multi_threads(
    ty: PnType,
    weights: &[u8],
    rows: usize,
    acts: &[PreparedI16],
    outs: &mut [Vec<f32>],
    threads: usize,
) {
    let rb = weights.len() / rows;
    let per = rows.div_ceil(threads);
    // Per thread: its weight range and its slice of every output.
    let mut parts: Vec<Vec<&mut [f32]>> = (0..threads).map(|_| Vec::new()).collect();
    for o in outs.iter_mut() {
        for (t, chunk) in o.chunks_mut(per).enumerate() {
            parts[t].push(chunk);
        }
    }
    std::thread::scope(|s| {
        for (t, mut part) in parts.into_iter().enumerate() {
            let r0 = t * per;
            let n = part.first().map_or(0, |p| p.len());
            let w = &weights[r0 * rb..(r0 + n) * rb];
            s.spawn(move || matvec_multi(ty, w, n, acts, &mut part).unwrap());
        }
    });
}

fn bench_shape(c: &mut Criterion, ty: PnType, rows: usize, k: usize) {
    let weights = random_weights(ty, rows, k);
    let mut rng = StdRng::seed_from_u64(2);
    let acts: Vec<PreparedI16> = (0..MAX_ACTS)
        .map(|_| {
            let x: Vec<f32> = (0..k).map(|_| rng.random_range(-1.7f32..1.7)).collect();
            PreparedI16::new(ty, &x).unwrap()
        })
        .collect();
    let mut outs = vec![vec![0.0f32; rows]; MAX_ACTS];
    let mut g = c.benchmark_group(format!("multi_{ty}_{rows}x{k}"));
    g.throughput(Throughput::Bytes(weights.len() as u64));
    g.bench_function("read_baseline", |b| {
        b.iter(|| black_box(read_sum(&weights)))
    });
    for m in [1, 2, 3, 4, 5, 8] {
        g.bench_function(BenchmarkId::new("multi", m), |b| {
            b.iter(|| {
                let mut refs: Vec<&mut [f32]> =
                    outs[..m].iter_mut().map(|o| o.as_mut_slice()).collect();
                matvec_multi(ty, &weights, rows, &acts[..m], &mut refs).unwrap();
                black_box(&outs);
            })
        });
        g.bench_function(BenchmarkId::new("separate", m), |b| {
            b.iter(|| {
                for (a, o) in acts[..m].iter().zip(outs.iter_mut()) {
                    matvec(ty, &weights, rows, a, o).unwrap();
                }
                black_box(&outs);
            })
        });
    }
    g.bench_function("read_baseline_2t", |b| {
        b.iter(|| {
            let half = weights.len() / 2;
            std::thread::scope(|s| {
                let h = s.spawn(|| read_sum(&weights[..half]));
                black_box(read_sum(&weights[half..]));
                black_box(h.join().unwrap());
            })
        })
    });
    for m in [1, 2, 4, 5] {
        g.bench_function(BenchmarkId::new("multi_2t", m), |b| {
            b.iter(|| multi_threads(ty, &weights, rows, &acts[..m], &mut outs[..m], 2))
        });
    }
    g.finish();
}

fn multi(c: &mut Criterion) {
    bench_shape(c, PnType::Pn3t, 17408, 5120);
    bench_shape(c, PnType::Pn4t, 5120, 17408);
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! { name = benches; config = config(); targets = multi }
criterion_main!(benches);
