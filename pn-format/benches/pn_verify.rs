//! The MTP verify pass's PN products: 3 input rows against 1 at the 27B `ffn_up` (pn3t,
//! 17408 x 5120) and `ffn_down` (pn4t, 5120 x 17408) shapes, with the working set in DRAM (a
//! ring of copies past 1 GiB, as the 12 GB model is), on 1 and 2 threads: the decode kernel
//! (`matvec`, 1 row), the fused int16 kernel (`matvec_multi`, 3 rows) and the AMX tiles
//! (`matmul_tiled`, 24-bit, 3 rows) and the few-row AMX kernel (`matvec_small`, decode's int16
//! activations, 3 rows) where the CPU has AMX, next to a read of the same bytes; `_i8` rows
//! are the same products on the int8 grid where the CPU has the int8 decode kernel (what the
//! model takes with `PN_DECODE_ACTS=8`: `pn_format::dot::decode_precision`). Issue #16
//! asks that 3 rows cost at most 1.15x one row: report `time(3 rows) / time(1 row)` from one run
//! (criterion's `estimates.json` medians, divided), never bare times.
//!
//! `PN_BENCH_CLOCK=cpu` measures the threads' CPU time instead of the wall clock (a loaded
//! machine); `PN_VERIFY_ROWS` (default `3`) lists the multi-row counts.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use pn_format::dot::{
    amx_available, int8_decode_available, matmul_tiled, matvec_multi, matvec_small, SmallActs,
    TileActs, TilePrecision,
};
use pn_format::{matvec, PnType, PreparedI16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::hint::black_box;
use std::time::Duration;

mod common;
use common::{clock, random_weights, read_sum};

fn row_counts() -> Vec<usize> {
    std::env::var("PN_VERIFY_ROWS")
        .unwrap_or_else(|_| "3".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .filter(|&n| (2..=8).contains(&n))
        .collect()
}

fn bench_shape(c: &mut Criterion, ty: PnType, rows: usize, k: usize) {
    let one = random_weights(ty, rows, k);
    let rb = one.len() / rows;
    let copies = clock::dram_copies(one.len());
    let ring: Vec<Vec<u8>> = (0..copies).map(|_| one.clone()).collect();
    drop(one);
    let mut rng = StdRng::seed_from_u64(3);
    // Eight input rows (`n x k`, row-major); each count takes the first `n`.
    let x: Vec<f32> = (0..8 * k).map(|_| rng.random_range(-1.7f32..1.7)).collect();
    let acts: Vec<PreparedI16> = x
        .chunks_exact(k)
        .map(|xt| PreparedI16::new(ty, xt).unwrap())
        .collect();
    // The int8 grid (`_i8` rows): the int8 kernels where the CPU has them.
    let acts8: Vec<PreparedI16> = x
        .chunks_exact(k)
        .map(|xt| PreparedI16::with_precision(ty, TilePrecision::I8, xt).unwrap())
        .collect();
    let int8 = int8_decode_available();
    let mut g = c.benchmark_group(format!("verify_{ty}_{rows}x{k}_dram"));
    g.throughput(Throughput::Bytes((rows * rb) as u64));
    for threads in [1usize, 2] {
        let read = |m: usize, t: usize| {
            let (r0, r1) = clock::part(rows, t, threads);
            black_box(read_sum(&ring[m][r0 * rb..r1 * rb]));
        };
        g.bench_function(format!("read_{threads}t"), |b| {
            b.iter_custom(|n| clock::run_split(n, threads, copies, &read))
        });
        let single = |m: usize, t: usize| {
            let (r0, r1) = clock::part(rows, t, threads);
            let mut out = vec![0f32; r1 - r0];
            matvec(ty, &ring[m][r0 * rb..r1 * rb], r1 - r0, &acts[0], &mut out).unwrap();
            black_box(&out);
        };
        g.bench_function(format!("rows1_{threads}t"), |b| {
            b.iter_custom(|n| clock::run_split(n, threads, copies, &single))
        });
        if int8 {
            let single8 = |m: usize, t: usize| {
                let (r0, r1) = clock::part(rows, t, threads);
                let mut out = vec![0f32; r1 - r0];
                matvec(ty, &ring[m][r0 * rb..r1 * rb], r1 - r0, &acts8[0], &mut out).unwrap();
                black_box(&out);
            };
            g.bench_function(format!("rows1_i8_{threads}t"), |b| {
                b.iter_custom(|n| clock::run_split(n, threads, copies, &single8))
            });
        }
        for n_in in row_counts() {
            let multi = |m: usize, t: usize| {
                let (r0, r1) = clock::part(rows, t, threads);
                let mut outs = vec![vec![0f32; r1 - r0]; n_in];
                let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| &mut o[..]).collect();
                let w = &ring[m][r0 * rb..r1 * rb];
                matvec_multi(ty, w, r1 - r0, &acts[..n_in], &mut refs).unwrap();
                black_box(&outs);
            };
            g.bench_function(format!("multi{n_in}_{threads}t"), |b| {
                b.iter_custom(|n| clock::run_split(n, threads, copies, &multi))
            });
            if int8 {
                let multi8 = |m: usize, t: usize| {
                    let (r0, r1) = clock::part(rows, t, threads);
                    let mut outs = vec![vec![0f32; r1 - r0]; n_in];
                    let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| &mut o[..]).collect();
                    let w = &ring[m][r0 * rb..r1 * rb];
                    matvec_multi(ty, w, r1 - r0, &acts8[..n_in], &mut refs).unwrap();
                    black_box(&outs);
                };
                g.bench_function(format!("multi{n_in}_i8_{threads}t"), |b| {
                    b.iter_custom(|n| clock::run_split(n, threads, copies, &multi8))
                });
            }
            if amx_available() {
                let mut small = SmallActs::default();
                small.update(&acts[..n_in]).unwrap();
                let small_run = |m: usize, t: usize| {
                    let (r0, r1) = clock::part(rows, t, threads);
                    let mut outs = vec![vec![0f32; r1 - r0]; n_in];
                    let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| &mut o[..]).collect();
                    let w = &ring[m][r0 * rb..r1 * rb];
                    assert!(matvec_small(ty, w, r1 - r0, &small, &mut refs).unwrap());
                    black_box(&outs);
                };
                g.bench_function(format!("small{n_in}_{threads}t"), |b| {
                    b.iter_custom(|n| clock::run_split(n, threads, copies, &small_run))
                });
                let tiles = TileActs::new(ty, &x[..n_in * k], n_in).unwrap();
                let tiled = |m: usize, t: usize| {
                    let (r0, r1) = clock::part(rows, t, threads);
                    let mut outs = vec![vec![0f32; r1 - r0]; n_in];
                    let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| &mut o[..]).collect();
                    let w = &ring[m][r0 * rb..r1 * rb];
                    matmul_tiled(ty, w, r1 - r0, &tiles, &mut refs).unwrap();
                    black_box(&outs);
                };
                g.bench_function(format!("tiled{n_in}_{threads}t"), |b| {
                    b.iter_custom(|n| clock::run_split(n, threads, copies, &tiled))
                });
            }
        }
    }
    g.finish();
}

fn benches(c: &mut Criterion) {
    bench_shape(c, PnType::Pn3t, 17408, 5120);
    bench_shape(c, PnType::Pn4t, 5120, 17408);
}

criterion_group! {
    name = verify;
    config = Criterion::default().sample_size(10).warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = benches
}
criterion_main!(verify);
