//! The decode (one input row) matrix-vector products at the 27B shapes, each next to a read of
//! the same bytes in the same run, on 1 and 2 threads, with the working set in L3 (one matrix)
//! and in DRAM (a ring of copies past 1 GiB; see `common/clock.rs`). Report ratios
//! `read time / kernel time` (the goal of issue #16 is >= 0.85), never bare times.
//!
//! Shapes: `ffn_gate`/`ffn_up` are pn3t with 17408 rows x K=5120 (37.9 MB); `ffn_down` is pn4t
//! with 5120 rows x K=17408 (47.4 MB). Activations are prepared once (as the model does per
//! input vector); the kernel is `matvec` on the best ISA and capped at AVX2. On Zen 4 the
//! AVX-512 levels' decode kernel hands over to the AVX2 one (`PN_DECODE_256=0` measures the
//! 512-bit one there). `i8_*` is the int8 kernel (AVX-512 VNNI) on the int8 grid
//! (`TilePrecision::I8`), what the model takes with `PN_DECODE_ACTS=8`
//! (`pn_format::dot::decode_precision`).
//!
//! `PN_BENCH_CLOCK=cpu` measures the threads' CPU time instead of the wall clock (a loaded
//! machine); `PN_BENCH_MODES` lists the working sets (default `l3,dram`; `l2` adds the compute
//! ceiling, on the first `PN_BENCH_L2_BYTES` bytes of rows, default 1 MiB: use 262144 where L2
//! is 1 MB, as on Zen 5). `PN_PREFETCH_BYTES` overrides the kernels' prefetch distance.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use pn_format::dot::{int8_decode_available, matvec_with, TilePrecision};
use pn_format::{Isa, PnType, PreparedI16};
use std::hint::black_box;
use std::time::Duration;

mod common;
use common::{clock, random_weights, read_sum};

/// Working sets: `l2` (the first `PN_BENCH_L2_BYTES`, default 1 MiB, of rows: the kernel's
/// compute ceiling, not a goal),
/// `l3` (the whole matrix) and `dram` (a ring of copies).
fn modes() -> Vec<(&'static str, bool)> {
    let want = std::env::var("PN_BENCH_MODES").unwrap_or_else(|_| "l3,dram".into());
    [("l2", false), ("l3", false), ("dram", true)]
        .into_iter()
        .filter(|(m, _)| want.contains(m))
        .collect()
}

fn bench_shape(c: &mut Criterion, ty: PnType, rows: usize, k: usize) {
    let one = random_weights(ty, rows, k);
    let rb = one.len() / rows;
    let x: Vec<f32> = (0..k)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let acts = PreparedI16::new(ty, &x).unwrap();
    // The int8 grid: the int8 kernel where the CPU has it (`int8_decode_available`).
    let acts8 = PreparedI16::with_precision(ty, TilePrecision::I8, &x).unwrap();
    for (mode, dram) in modes() {
        let l2: usize = std::env::var("PN_BENCH_L2_BYTES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1 << 20);
        let rows = if mode == "l2" { l2 / rb } else { rows };
        let one = &one[..rows * rb];
        let copies = if dram {
            clock::dram_copies(one.len())
        } else {
            1
        };
        let ring: Vec<Vec<u8>> = (0..copies).map(|_| one.to_vec()).collect();
        let mut g = c.benchmark_group(format!("decode_{ty}_{rows}x{k}_{mode}"));
        g.throughput(Throughput::Bytes(one.len() as u64));
        for threads in [1usize, 2] {
            let read = |m: usize, t: usize| {
                let (r0, r1) = clock::part(rows, t, threads);
                black_box(read_sum(&ring[m][r0 * rb..r1 * rb]));
            };
            g.bench_function(format!("read_{threads}t"), |b| {
                b.iter_custom(|n| clock::run_split(n, threads, copies, &read))
            });
            let variants = [
                ("i16", Isa::detect(), &acts),
                ("i16", Isa::Avx2, &acts),
                ("i8", Isa::detect(), &acts8),
            ];
            for (name, isa, acts) in variants {
                if !isa.is_available()
                    || (isa == Isa::Avx2 && Isa::detect() == Isa::Avx2)
                    || (name == "i8" && !int8_decode_available())
                {
                    continue;
                }
                let kernel = |m: usize, t: usize| {
                    let (r0, r1) = clock::part(rows, t, threads);
                    let mut out = vec![0f32; r1 - r0];
                    matvec_with(isa, ty, &ring[m][r0 * rb..r1 * rb], r1 - r0, acts, &mut out)
                        .unwrap();
                    black_box(&out);
                };
                g.bench_function(format!("{name}_{}_{threads}t", isa.name()), |b| {
                    b.iter_custom(|n| clock::run_split(n, threads, copies, &kernel))
                });
            }
        }
        g.finish();
    }
}

fn dots(c: &mut Criterion) {
    bench_shape(c, PnType::Pn3t, 17408, 5120);
    bench_shape(c, PnType::Pn4t, 5120, 17408);
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! { name = benches; config = config(); targets = dots }
criterion_main!(benches);
