//! A/B of the tiled kernels on a loaded machine: the kernels alternate, each timed on the
//! thread's CPU clock, and the minimum of many short runs is kept per kernel (interference only
//! adds time). `cargo run --release -p pn-format --example tiled_ab [reps]`; `PN_AB_FULL=1`
//! takes the whole 27B `ffn_up`/`ffn_down` shapes, `PN_AB_INPUTS` the input rows (64),
//! `PN_AB_ROWS` caps the weight rows (a matrix that stays in L2: the compute ceiling). The
//! VNNI kernel runs on int16 and on int8 activations (`Vnni/I8`), the AVX2 one on int8
//! (`Avx2/I8`); the fused multi-vector int16 kernels (`fused x8`, what CPUs without a tile
//! kernel run) are timed too. `PN_ISA=avx2` shows an AVX2-only host.

use pn_format::dot::{
    amx_available, matmul_tiled_kernel, matvec_multi, matvec_small, SmallActs, TileActs,
    TileKernel, TilePrecision, SMALL_MAX_ROWS,
};
use pn_format::PnType;
use pn_format::PreparedI16;
use std::time::Duration;

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write into.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn main() {
    let reps: usize = std::env::args()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(15);
    let kernels: Vec<TileKernel> = [
        TileKernel::AmxOneTile,
        TileKernel::AmxBlocked,
        TileKernel::Vnni,
    ]
    .into_iter()
    .filter(|k| k.is_available())
    .collect();
    // Every int16 kernel on int16; the VNNI and AVX2 ones on int8.
    let variants: Vec<(TileKernel, TilePrecision)> = kernels
        .iter()
        .map(|&k| (k, TilePrecision::I16))
        .chain(
            [TileKernel::Vnni, TileKernel::Avx2]
                .into_iter()
                .filter(|k| k.is_available())
                .map(|k| (k, TilePrecision::I8)),
        )
        .collect();
    if variants.is_empty() {
        println!("no tile kernel (neither AMX nor AVX-512 VNNI nor AVX2)");
        return;
    }
    let mut s = 1u64;
    let mut next = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 33) as u32
    };
    let full = std::env::var("PN_AB_FULL").is_ok();
    let shapes = if full {
        [(PnType::Pn3t, 17408, 5120), (PnType::Pn4t, 5120, 17408)]
    } else {
        [(PnType::Pn3t, 4096, 5120), (PnType::Pn4t, 1024, 17408)]
    };
    let rows_cap: usize = std::env::var("PN_AB_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(usize::MAX);
    for (ty, rows, k) in shapes {
        let rows = rows.min(rows_cap);
        let nb = k / ty.weights_per_block();
        let mut w = vec![0u8; rows * nb * 34];
        for blk in w.chunks_exact_mut(34) {
            blk[0..2].copy_from_slice(
                &half::f16::from_f32(0.01 + (next() % 100) as f32 * 1e-4)
                    .to_bits()
                    .to_le_bytes(),
            );
            for b in &mut blk[2..] {
                *b = next() as u8;
            }
            if ty == PnType::Pn3t {
                // Reserved top bits of each word clear.
                for wd in blk[2..].chunks_exact_mut(4) {
                    wd[3] &= 0x3f;
                }
            }
        }
        let n: usize = std::env::var("PN_AB_INPUTS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(64);
        let x: Vec<f32> = (0..n * k)
            .map(|_| (next() % 2000) as f32 / 1000.0 - 1.0)
            .collect();
        let acts = TileActs::new(ty, &x, n).unwrap();
        let acts8 = TileActs::with_precision(ty, TilePrecision::I8, &x, n).unwrap();
        let mut best = vec![Duration::MAX; variants.len()];
        let mut outs = vec![vec![0f32; rows]; n];
        let mut first: Vec<Vec<Vec<f32>>> = Vec::new();
        for _ in 0..reps {
            for (i, &(kern, precision)) in variants.iter().enumerate() {
                let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
                let a = match precision {
                    TilePrecision::I16 => &acts,
                    TilePrecision::I8 => &acts8,
                };
                let t0 = thread_cpu();
                matmul_tiled_kernel(kern, ty, &w, rows, a, &mut refs).unwrap();
                best[i] = best[i].min(thread_cpu() - t0);
                if first.len() <= i {
                    first.push(outs.clone());
                } else {
                    assert_eq!(first[i], outs);
                }
            }
        }
        let same_precision = |i: usize| variants[i].1 == TilePrecision::I16;
        assert!(
            (0..variants.len())
                .filter(|&i| same_precision(i))
                .all(|i| first[i] == first[0]),
            "int16 kernels differ"
        );
        let mac = (rows * k * n) as f64;
        print!("{ty} {rows}x{k} x{n}:");
        for ((kern, precision), b) in variants.iter().zip(&best) {
            let tag = match precision {
                TilePrecision::I16 => "",
                TilePrecision::I8 => "/I8",
            };
            print!(
                "  {kern:?}{tag} {:.2} ms ({:.0} GMAC/s)",
                b.as_secs_f64() * 1e3,
                mac / b.as_secs_f64() / 1e9
            );
        }
        // The fused multi-vector kernels, 8 inputs per pass over 1 MiB row tiles (the CPU
        // matmul's fused path).
        let prepared: Vec<PreparedI16> = x
            .chunks_exact(k)
            .map(|xt| PreparedI16::new(ty, xt).unwrap())
            .collect();
        let rb = nb * 34;
        let tile_rows = ((1 << 20) / rb).max(16);
        let mut best_fused = Duration::MAX;
        for _ in 0..reps.min(3) {
            let t0 = thread_cpu();
            for r0 in (0..rows).step_by(tile_rows) {
                let r1 = (r0 + tile_rows).min(rows);
                for (g, o) in prepared.chunks(8).zip(outs.chunks_mut(8)) {
                    let mut refs: Vec<&mut [f32]> = o.iter_mut().map(|o| &mut o[r0..r1]).collect();
                    matvec_multi(ty, &w[r0 * rb..r1 * rb], r1 - r0, g, &mut refs).unwrap();
                }
            }
            best_fused = best_fused.min(thread_cpu() - t0);
        }
        print!(
            "  fused x8 {:.2} ms ({:.0} GMAC/s)",
            best_fused.as_secs_f64() * 1e3,
            mac / best_fused.as_secs_f64() / 1e9
        );
        if !amx_available() {
            println!();
            continue;
        }
        // The few-row kernel (inputs in the A tile), in groups of 16 inputs.
        let smalls: Vec<SmallActs> = prepared
            .chunks(SMALL_MAX_ROWS)
            .map(|g| {
                let mut s = SmallActs::default();
                s.update(g).unwrap();
                s
            })
            .collect();
        let mut best_small = Duration::MAX;
        for _ in 0..reps {
            let t0 = thread_cpu();
            for (s, o) in smalls.iter().zip(outs.chunks_mut(SMALL_MAX_ROWS)) {
                let mut refs: Vec<&mut [f32]> = o.iter_mut().map(|o| o.as_mut_slice()).collect();
                matvec_small(ty, &w, rows, s, &mut refs).unwrap();
            }
            best_small = best_small.min(thread_cpu() - t0);
        }
        println!(
            "  small x{} {:.2} ms ({:.0} GMAC/s)",
            SMALL_MAX_ROWS,
            best_small.as_secs_f64() * 1e3,
            mac / best_small.as_secs_f64() / 1e9
        );
    }
}
