//! GPU test of the small-batch PN GEMV (`Gpu::pn_prepare_rows` + `Gpu::pn_gemv_batch`): on the
//! device, row r of the batch equals the single-row prepared GEMV on row r bit for bit, and the
//! host emulator's result (tests/host_emu_batch.rs runs the same kernel source). Needs a CUDA
//! device, so `#[ignore]`d: `cargo test -p pn-kernels --test gpu_batch -- --ignored`.
#![cfg(feature = "cuda")]

mod common;

use common::*;
use half::f16;
use pn_kernels::emu;
use pn_kernels::launch::{self, PN_BATCH_MAX_T};
use pn_kernels::{MatrixShape, WeightType};

#[test]
#[ignore = "needs a CUDA GPU"]
fn small_batch_gemv_equals_single_row_gemvs_on_the_device() {
    let g = match pn_kernels::gpu_or_reason(0) {
        Ok(g) => g,
        Err(why) => {
            eprintln!("SKIPPED (no GPU): {why}");
            return;
        }
    };
    let s = g.stream().clone();
    let mut r = rng(77);
    for (ty, bits, n, k) in [
        (WeightType::Pn3t, 3u32, 1000usize, 5120usize),
        (WeightType::Pn4t, 4, 300, 17408),
        (WeightType::Pn4t, 4, 77, 4736),
    ] {
        let w = random_pn_weights(&mut r, bits, n, k);
        let dw = s.clone_htod(&w).unwrap();
        for t in 2..=PN_BATCH_MAX_T {
            let x: Vec<f32> = (0..t).flat_map(|_| activation_like(&mut r, k)).collect();
            let dx = s.clone_htod(&x).unwrap();
            let mut xh = s.alloc_zeros::<f16>(t * k).unwrap();
            let mut e = s.alloc_zeros::<i32>(t).unwrap();
            g.pn_prepare_rows(
                &dx.as_view(),
                (t, k),
                &mut xh.as_view_mut(),
                &mut e.as_view_mut(),
            )
            .unwrap();
            let mut y = s.alloc_zeros::<f32>(t * n).unwrap();
            let m = MatrixShape { ty, n, k };
            g.pn_gemv_batch(
                m,
                t,
                &dw.as_view(),
                (&xh.as_view(), &e.as_view()),
                &mut y.as_view_mut(),
            )
            .unwrap();
            let got = s.clone_dtoh(&y).unwrap();
            // The host emulator runs the same source: the same bits.
            let (hxh, he) = emu::pn_prepare_rows(&x, t, k).unwrap();
            let b = launch::pn_batch(bits, t, n, k).unwrap();
            let mut want = vec![0f32; t * n];
            emu::pn_gemv_batch(&b, &w, (&hxh, &he), &mut want, n, k).unwrap();
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{} t {t} {n}x{k} [{i}]: device {a} vs emulator {b}",
                    ty.name()
                );
            }
            for row in 0..t {
                let row_h: Vec<f16> = hxh[row * k..(row + 1) * k]
                    .iter()
                    .map(|&b| f16::from_bits(b))
                    .collect();
                let (xh1, e1) = (
                    s.clone_htod(&row_h).unwrap(),
                    s.clone_htod(&[he[row]]).unwrap(),
                );
                let mut y1 = s.alloc_zeros::<f32>(n).unwrap();
                g.pn_gemv_prepared(
                    m,
                    &dw.as_view(),
                    &xh1.as_view(),
                    &e1.as_view(),
                    &mut y1.as_view_mut(),
                )
                .unwrap();
                let single = s.clone_dtoh(&y1).unwrap();
                assert_eq!(
                    single.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    got[row * n..(row + 1) * n]
                        .iter()
                        .map(|v| v.to_bits())
                        .collect::<Vec<_>>(),
                    "{} t {t} {n}x{k}: row {row} batch vs single",
                    ty.name()
                );
            }
        }
    }
}

/// The small-batch Q4_K / Q8_0 GEMVs (`Gpu::gemv_batch`, kernels/q4k_batch.cu) on the device:
/// row r equals the single-row `Gpu::gemv` on row r bit for bit (the same lane arithmetic,
/// q4k_lane.cuh), at the LM head's K with enough rows for several tiles per block.
#[test]
#[ignore = "needs a CUDA GPU"]
fn small_batch_stock_gemv_equals_single_row_gemvs_on_the_device() {
    let g = match pn_kernels::gpu_or_reason(0) {
        Ok(g) => g,
        Err(why) => {
            eprintln!("SKIPPED (no GPU): {why}");
            return;
        }
    };
    let s = g.stream().clone();
    let mut r = rng(78);
    for (ty, n, k) in [
        (WeightType::Q4K, 20_000usize, 5120usize),
        (WeightType::Q4K, 333, 1792),
        (WeightType::Q8_0, 48, 5120),
    ] {
        let w = random_weights(&mut r, ty, n, k);
        let dw = s.clone_htod(&w).unwrap();
        let m = MatrixShape { ty, n, k };
        for t in 2..=PN_BATCH_MAX_T {
            let x: Vec<f32> = (0..t).flat_map(|_| activation_like(&mut r, k)).collect();
            let dx = s.clone_htod(&x).unwrap();
            let mut y = s.alloc_zeros::<f32>(t * n).unwrap();
            g.gemv_batch(m, t, &dw.as_view(), &dx.as_view(), &mut y.as_view_mut())
                .unwrap();
            let got = s.clone_dtoh(&y).unwrap();
            for row in 0..t {
                let x1 = s.clone_htod(&x[row * k..(row + 1) * k]).unwrap();
                let mut y1 = s.alloc_zeros::<f32>(n).unwrap();
                g.gemv(m, &dw.as_view(), &x1.as_view(), &mut y1.as_view_mut())
                    .unwrap();
                let single = s.clone_dtoh(&y1).unwrap();
                for (i, (a, b)) in got[row * n..(row + 1) * n].iter().zip(&single).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{} t {t} {n}x{k} row {row} [{i}]: batch {a} vs single {b}",
                        ty.name()
                    );
                }
            }
        }
    }
}
