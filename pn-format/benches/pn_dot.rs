//! Dequantize, dot products (f32 and int16 activations) and the quantizer on real 27B shapes,
//! each next to a plain memory-read baseline over the same bytes (report ratios, not absolutes).
//!
//! Shapes: `ffn_gate`/`ffn_up` are pn3t with 17408 rows x K=5120 (37.9 MB); `ffn_down` is pn4t
//! with 5120 rows x K=17408 (47.4 MB). Weights are built once by quantizing random data.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pn_format::dot::matvec_with;
use pn_format::{dequantize_row, matvec, quantize_rows, Isa, PnType, PreparedF32, PreparedI16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::hint::black_box;
use std::time::{Duration, Instant};

mod common;
use common::read_sum;

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    // Uniform noise with unit variance is as good as normal for timing.
    (0..n).map(|_| rng.random_range(-1.732f32..1.732)).collect()
}

/// Runs `f` on two threads over the two halves of the rows.
fn two_threads(
    weights: &[u8],
    rows: usize,
    out: &mut [f32],
    f: impl Fn(&[u8], usize, &mut [f32]) + Sync,
) {
    let rb = weights.len() / rows;
    let half = rows / 2;
    let (w0, w1) = weights.split_at(half * rb);
    let (o0, o1) = out.split_at_mut(half);
    std::thread::scope(|s| {
        s.spawn(|| f(w0, half, o0));
        f(w1, rows - half, o1);
    });
}

fn bench_shape(c: &mut Criterion, ty: PnType, rows: usize, k: usize) {
    let w = random(rows * k, 1);
    let t = Instant::now();
    let weights = quantize_rows(ty, &w, k, 0).unwrap();
    let secs = t.elapsed().as_secs_f64();
    eprintln!(
        "quantize_rows {ty} {rows}x{k} on {} threads: {:.1} M weights/s ({secs:.2} s)",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        (rows * k) as f64 / secs / 1e6
    );
    drop(w);
    let x = random(k, 2);
    let mut out = vec![0.0f32; rows];
    let mut g = c.benchmark_group(format!("{ty}_{rows}x{k}"));
    g.throughput(Throughput::Bytes(weights.len() as u64));
    g.bench_function("read_baseline", |b| {
        b.iter(|| black_box(read_sum(&weights)))
    });
    g.bench_function("dequantize", |b| {
        let rb = weights.len() / rows;
        let mut row = vec![0.0f32; k];
        b.iter(|| {
            for r in weights.chunks_exact(rb) {
                dequantize_row(ty, r, &mut row).unwrap();
                black_box(&row);
            }
        })
    });
    g.bench_function("dot_f32", |b| {
        b.iter(|| {
            let p = PreparedF32::new(ty, &x).unwrap();
            matvec(ty, &weights, rows, &p, &mut out).unwrap();
            black_box(&out);
        })
    });
    g.bench_function("dot_i16", |b| {
        b.iter(|| {
            let p = PreparedI16::new(ty, &x).unwrap();
            matvec(ty, &weights, rows, &p, &mut out).unwrap();
            black_box(&out);
        })
    });
    if Isa::Avx2.is_available() && Isa::detect() != Isa::Avx2 {
        // The P100-host baseline ISA, for comparison on a newer CPU.
        let pf = PreparedF32::new(ty, &x).unwrap();
        let pq = PreparedI16::new(ty, &x).unwrap();
        g.bench_function(BenchmarkId::new("dot_f32", "avx2"), |b| {
            b.iter(|| matvec_with(Isa::Avx2, ty, &weights, rows, &pf, &mut out).unwrap())
        });
        g.bench_function(BenchmarkId::new("dot_i16", "avx2"), |b| {
            b.iter(|| matvec_with(Isa::Avx2, ty, &weights, rows, &pq, &mut out).unwrap())
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
    g.bench_function("dot_f32_2t", |b| {
        b.iter(|| {
            let p = PreparedF32::new(ty, &x).unwrap();
            two_threads(&weights, rows, &mut out, |w, r, o| {
                matvec(ty, w, r, &p, o).unwrap()
            });
            black_box(&out);
        })
    });
    g.bench_function("dot_i16_2t", |b| {
        b.iter(|| {
            let p = PreparedI16::new(ty, &x).unwrap();
            two_threads(&weights, rows, &mut out, |w, r, o| {
                matvec(ty, w, r, &p, o).unwrap()
            });
            black_box(&out);
        })
    });
    g.finish();
}

fn dots(c: &mut Criterion) {
    bench_shape(c, PnType::Pn3t, 17408, 5120);
    bench_shape(c, PnType::Pn4t, 5120, 17408);
}

fn quantizer(c: &mut Criterion) {
    let mut g = c.benchmark_group("quantize_rows");
    for ty in PnType::ALL {
        let (rows, k) = (32, 5120);
        let w = random(rows * k, 3);
        g.throughput(Throughput::Elements((rows * k) as u64));
        for threads in [1, 2] {
            g.bench_function(BenchmarkId::new(ty.name(), format!("{threads}t")), |b| {
                b.iter(|| black_box(quantize_rows(ty, &w, k, threads).unwrap()))
            });
        }
    }
    g.finish();
}

fn config() -> Criterion {
    // Short runs: the lead re-runs these on a quiet machine with longer times.
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! { name = benches; config = config(); targets = dots, quantizer }
criterion_main!(benches);
