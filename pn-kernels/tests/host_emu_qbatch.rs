//! The small-batch stock GEMVs (`q4_k_gemv_b2` .. `_b8`, `q8_0_gemv_b2` .. `_b8`,
//! kernels/q4k_batch.cu) run on the host by the SIMT emulator with the launch geometry of
//! `pn_kernels::launch::{q4_k_batch, q8_0_batch}`: for T = 2..8 activation rows each equals T
//! runs of the single-row kernel (`q4_k_gemv_f32`, `q8_0_gemv_f32`) bit for bit and the f64
//! reference over the CPU decode within the GPU tests' 1e-5; the weights are requested once for
//! all T rows (the loads of one single-row pass; for Q4_K a footprint of exactly the tensor);
//! the Q4_K kernel's shared accesses are conflict-free, its weight loads within 1.1x of the
//! minimum sectors (the single-row kernel's pattern), and x is read from L2 once per tile of
//! weight rows (`launch::q4_k_batch_x_bytes`).
mod common;

use common::*;
use pn_kernels::emu::{self, region, StockType};
use pn_kernels::launch::{self, Launch, QuantBatchLaunch, PN_BATCH_MAX_T, Q4K_MAX_K};
use pn_kernels::WeightType;

/// T activation rows of k, each at its own magnitude; in `adversarial` a zero row, a row of
/// subnormal-range products and a row near the fp32 sum limit of a long dot product.
fn batch_x(seed: u64, t: usize, k: usize, adversarial: bool) -> Vec<f32> {
    let mut r = rng(seed);
    let mut x = Vec::with_capacity(t * k);
    for row in 0..t {
        let scale = [1.0f32, 1e-3, 40.0, 1e-6, 3.0, 1e4, 0.5, 7e-2][row % 8];
        let mut v = activation_like(&mut r, k);
        v.iter_mut().for_each(|a| *a *= scale);
        if adversarial {
            match row {
                1 => v.iter_mut().for_each(|a| *a = 0.0),
                2 => v.iter_mut().for_each(|a| *a *= 1e-38),
                3 => v.iter_mut().for_each(|a| *a *= 1e30),
                _ => {}
            }
        }
        x.extend(v);
    }
    x
}

/// The single-row launch of `ty` for `n` rows of `k`, as `Gpu::gemv` sizes it.
fn single(ty: StockType, n: usize, k: usize) -> Launch {
    match ty {
        StockType::Q4K => launch::q4_k(n, k).unwrap(),
        _ => Launch {
            kernel: "q8_0_gemv_f32",
            grid: n.div_ceil(8) as u32,
            threads: 256,
            smem: 0,
            rows_per_warp: 1,
        },
    }
}

/// One case: the batch kernel `b` against `t` single-row runs and the f64 reference, with the
/// counters' assertions.
fn check(
    seed: u64,
    ty: StockType,
    b: &QuantBatchLaunch,
    (n, k): (usize, usize),
    adversarial: bool,
) {
    let t = b.t;
    let wt = if ty == StockType::Q4K {
        WeightType::Q4K
    } else {
        WeightType::Q8_0
    };
    let mut r = rng(seed);
    let w = random_weights(&mut r, wt, n, k);
    let wd = dequant(wt, &w, n, k);
    let x = batch_x(seed + 1, t, k, adversarial);
    let what = format!(
        "{} (S {}) {n}x{k} grid {}",
        b.launch.kernel, b.chunk_sbs, b.launch.grid
    );
    let mut y = vec![f32::NAN; t * n];
    let s = emu::quant_gemv_batch(ty, b, &w, &x, &mut y, (n, k)).unwrap();
    assert_eq!(s.deadlock, 0, "{what}");
    let row_bytes = w.len() / n;
    // Bytes one single-row pass requests: per Q4_K super-block each lane loads 5 words (the
    // scale words are broadcasts), per Q8_0 block its 32 codes (the f16 scale is not an __ldg).
    let one_pass = if ty == StockType::Q4K {
        (n * k / 256 * 32 * 20) as u64
    } else {
        (n * k) as u64
    };
    for row in 0..t {
        let xr = &x[row * k..(row + 1) * k];
        let yb = &y[row * n..(row + 1) * n];
        if ty == StockType::Q8_0 || k <= Q4K_MAX_K {
            let mut y1 = vec![f32::NAN; n];
            let s1 = emu::quant_gemv(ty, &single(ty, n, k), &w, row_bytes, xr, &mut y1, n).unwrap();
            assert_eq!(
                s1.g_bytes[region::WEIGHT],
                one_pass,
                "{what}: single-row requests"
            );
            for (i, (a, c)) in yb.iter().zip(&y1).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    c.to_bits(),
                    "{what}: x row {row}, y {i}: batch {a} vs single {c}"
                );
            }
        }
        for i in 0..n {
            let (mut want, mut sc) = (0f64, 0f64);
            for c in 0..k {
                let p = wd[i * k + c] as f64 * xr[c] as f64;
                want += p;
                sc += p.abs();
            }
            let g = yb[i] as f64;
            let err = (g - want).abs() / sc.max(1e-300);
            // Products below the fp32 normal range lose their low bits: judged absolutely.
            let tiny = sc < 1e-30 && (g - want).abs() < 1e-39;
            assert!(
                err <= 1e-5 || tiny || (sc == 0.0 && g == 0.0),
                "{what}: x row {row} y {i}: {g} vs {want} ({err:.2e})"
            );
        }
    }
    let wbytes = w.len() as u64;
    assert_eq!(
        s.g_bytes[region::WEIGHT],
        one_pass,
        "{what}: weight bytes requested (one single-row pass for all {t} rows)"
    );
    if ty == StockType::Q4K {
        // The tensor's sectors (a 128-byte aligned copy; rows of 144 bytes end mid-sector).
        assert_eq!(
            s.unique_bytes(region::WEIGHT),
            wbytes.div_ceil(32) * 32,
            "{what}: weight footprint"
        );
        assert_eq!(
            s.smem_max_degree, 1.0,
            "{what}: {} of {} shared accesses conflict",
            s.smem_bad_instr, s.smem_instr
        );
        let ratio = s.sector_ratio(region::WEIGHT);
        assert!(
            ratio <= 1.1,
            "{what}: weight loads take {ratio:.3}x the minimum sectors"
        );
        assert_eq!(
            s.g_bytes[region::X],
            launch::q4_k_batch_x_bytes(t, n, k),
            "{what}: x staged once per tile of {} rows",
            8 * launch::q4_k_batch_rows(t)
        );
    }
    eprintln!(
        "{what}: smem degree max {:.2}; weight sectors {:.3}x min; x {} B read ({:.3}x the weights)",
        s.smem_max_degree,
        s.sector_ratio(region::WEIGHT),
        s.g_bytes[region::X],
        s.g_bytes[region::X] as f64 / wbytes as f64
    );
}

#[test]
fn q4_k_batch_equals_t_single_row_gemvs_at_the_27b_head_row_length() {
    // The LM head's K = 5120 (20 super-blocks: chunk tails for S = 3, 6, 7) at reduced rows: a
    // partial tile, and (T = 3, the MTP verify) rows for two tiles on one block.
    for t in 2..=PN_BATCH_MAX_T {
        let n = if t == 3 {
            8 * launch::q4_k_batch_rows(3) + 9
        } else {
            37
        };
        let mut b = launch::q4_k_batch(t, n, 5120).unwrap();
        if t == 3 {
            b.launch.grid = 1;
        }
        check(3000 + t as u64, StockType::Q4K, &b, (n, 5120), false);
    }
}

#[test]
fn q4_k_batch_equals_t_single_row_gemvs_on_adversarial_inputs() {
    // Rows of one super-block (one chunk, S clamped), 7 (S = 5: a 2-super-block tail), a K past
    // the single-row kernel's limit (f64 reference only), a grid of 2 blocks looping over
    // tiles; a zero row, subnormal-range products and a row near the fp32 limit.
    let cases: &[(usize, usize, Option<u32>)] = &[
        (13, 256, None),
        (70, 256 * 7, Some(2)),
        (9, 256 * 50, None),
        (41, 1024, Some(2)),
    ];
    for t in 2..=PN_BATCH_MAX_T {
        for (i, &(n, k, grid)) in cases.iter().enumerate() {
            if t != 3 && t != PN_BATCH_MAX_T && i != t % cases.len() {
                continue;
            }
            let mut b = launch::q4_k_batch(t, n, k).unwrap();
            if let Some(g) = grid {
                b.launch.grid = g;
            }
            check(
                4000 + 10 * t as u64 + i as u64,
                StockType::Q4K,
                &b,
                (n, k),
                true,
            );
        }
    }
}

#[test]
fn q8_0_batch_equals_t_single_row_gemvs() {
    // ssm_alpha / ssm_beta's 48 x 5120 at reduced rows, and a row of 3 blocks (lanes idle).
    for t in 2..=PN_BATCH_MAX_T {
        for (i, &(n, k)) in [(11usize, 5120usize), (9, 96)].iter().enumerate() {
            let b = launch::q8_0_batch(t, n, k).unwrap();
            check(
                5000 + 10 * t as u64 + i as u64,
                StockType::Q8_0,
                &b,
                (n, k),
                i == 1,
            );
        }
    }
}
