//! A prompt chunk of 64 input rows against the 27B `ffn_up` (pn3t, 17408 x 5120) and
//! `ffn_down` (pn4t, 5120 x 17408) shapes on one thread: the AMX tiles (`matmul_tiled`, where
//! the CPU has AMX: the register-blocked kernel, the one-tile kernel it replaced, and the
//! activation-tile preparation; the AVX-512 VNNI kernel), the int8-activation kernels (AVX-512
//! VNNI, AVX2: the prompt rows whose logits nobody reads, without AMX), the fused int16 kernels
//! in groups of 8 (`matvec_multi`, the logits rows' path without a tile kernel) and a plain
//! read of the same bytes. `PN_ISA=avx2` shows an AVX2-only host. Report ratios within one run
//! (criterion's `estimates.json` medians, divided), never bare times; the time per input row is
//! what a prompt token costs. `PN_BENCH_CLOCK=cpu` times the thread's CPU time instead of the
//! wall clock (a loaded machine).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use pn_format::dot::{
    matmul_tiled_kernel, matvec_multi, tiles_available, TileActs, TileKernel, TilePrecision,
    MAX_ACTS,
};
use pn_format::{PnType, PreparedI16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::hint::black_box;
use std::time::Duration;

mod common;
use common::{clock, random_weights, read_sum};

/// Input rows of the chunk.
const N: usize = 64;

fn bench_shape(c: &mut Criterion, ty: PnType, rows: usize, k: usize) {
    let weights = random_weights(ty, rows, k);
    let mut rng = StdRng::seed_from_u64(2);
    let x: Vec<f32> = (0..N * k).map(|_| rng.random_range(-1.7f32..1.7)).collect();
    let acts: Vec<PreparedI16> = x
        .chunks_exact(k)
        .map(|xt| PreparedI16::new(ty, xt).unwrap())
        .collect();
    let tiles = TileActs::new(ty, &x, N).unwrap();
    let mut outs = vec![vec![0f32; rows]; N];
    let mut g = c.benchmark_group(format!("{ty} {rows}x{k} x {N} inputs"));
    g.throughput(Throughput::Bytes(weights.len() as u64));
    g.bench_function("read_baseline", |b| {
        b.iter_custom(|n| {
            clock::run_split(n, 1, 1, &|_, _| {
                black_box(read_sum(&weights));
            })
        })
    });
    // The register-blocked AMX kernel (the default on AMX), the one-tile kernel it replaced
    // and the AVX-512 VNNI kernel (the default without AMX) on int16 activations; the VNNI and
    // AVX2 kernels on int8 ones (the prompt rows whose logits nobody reads, without AMX): each
    // where the CPU runs it.
    let tiles8 = TileActs::with_precision(ty, TilePrecision::I8, &x, N).unwrap();
    let kernels = [
        ("tiled_amx", TileKernel::AmxBlocked, &tiles),
        ("tiled_amx_one_tile", TileKernel::AmxOneTile, &tiles),
        ("tiled_vnni", TileKernel::Vnni, &tiles),
        ("tiled_vnni_int8", TileKernel::Vnni, &tiles8),
        ("tiled_avx2_int8", TileKernel::Avx2, &tiles8),
    ];
    for (name, kernel, acts) in kernels.into_iter().filter(|(_, k, _)| k.is_available()) {
        g.bench_function(name, |b| {
            let outs = std::sync::Mutex::new(&mut outs);
            b.iter_custom(|n| {
                clock::run_split(n, 1, 1, &|_, _| {
                    let mut o = outs.lock().unwrap();
                    let mut refs: Vec<&mut [f32]> =
                        o.iter_mut().map(|o| o.as_mut_slice()).collect();
                    matmul_tiled_kernel(kernel, ty, &weights, rows, acts, &mut refs).unwrap();
                })
            })
        });
    }
    if tiles_available() {
        g.bench_function("prepare_tiles_one_thread", |b| {
            let t = std::sync::Mutex::new(tiles.clone());
            b.iter_custom(|n| {
                clock::run_split(n, 1, 1, &|_, _| t.lock().unwrap().update(&x, N).unwrap())
            })
        });
    }
    g.bench_function("multi_i16_groups_of_8", |b| {
        b.iter(|| {
            for (a, o) in acts.chunks(MAX_ACTS).zip(outs.chunks_mut(MAX_ACTS)) {
                let mut refs: Vec<&mut [f32]> = o.iter_mut().map(|o| o.as_mut_slice()).collect();
                matvec_multi(ty, &weights, rows, a, &mut refs).unwrap();
            }
        })
    });
    g.finish();
}

fn benches(c: &mut Criterion) {
    bench_shape(c, PnType::Pn3t, 17408, 5120);
    bench_shape(c, PnType::Pn4t, 5120, 17408);
}

criterion_group! {
    name = tiled;
    config = Criterion::default().sample_size(10).warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    targets = benches
}
criterion_main!(tiled);
