//! The fused producers of kernels/fuse.cu run on the host by the SIMT emulator: each equals, bit
//! for bit, the unfused kernels it replaces (residual add, `rms_norm_hadamard_f32` with the
//! wrapper's 256 threads or `swiglu_hadamard_f32`, then `pn_prepare_x_h2` per row; the
//! unrotated rows `rms_norm_f32` with its wrapper's 256 threads), at the 27B
//! row lengths (hidden 5120, FFN 17408) with few rows, a grid smaller than the row count (the
//! grid-stride loop) and adversarial rows (zeros, huge and tiny values); and no shared-memory
//! bank conflict.
mod common;

use common::*;
use pn_kernels::emu::{self, FuseShape, Norm, NormOut, Rotation};

/// The residual add of `add_inplace_f32` (one f32 add per element).
fn added(x: &[f32], r: &[f32]) -> Vec<f32> {
    x.iter().zip(r).map(|(a, b)| a + b).collect()
}

/// Rows with the magnitudes that stress the fp16 exponent choice: one all-zero row (amax 0),
/// one of 1e30-scale and one of 1e-30-scale values, the rest random.
fn adversarial(rows: usize, n: usize, seed: u64) -> Vec<f32> {
    let mut r = rng(seed);
    let mut x = random_vec(&mut r, rows * n, 3.0);
    for (t, row) in x.chunks_mut(n).enumerate() {
        match t % 4 {
            1 => row.fill(0.0),
            2 => row.iter_mut().for_each(|v| *v *= 1e30),
            3 => row.iter_mut().for_each(|v| *v *= 1e-30),
            _ => {}
        }
    }
    x
}

fn assert_conflict_free(what: &str, s: &emu::EmuStats) {
    assert!(s.smem_instr > 0, "{what}: no shared access recorded");
    assert_eq!(
        s.smem_max_degree, 1.0,
        "{what}: bank conflict ({} of {} instructions)",
        s.smem_bad_instr, s.smem_instr
    );
}

#[test]
fn add_norm_rotation_and_fp16_copy_equal_the_unfused_kernels() {
    let eps = 1e-6f32;
    // (rows, n, R, grid): the 27B hidden size with 256-chunks; small rows; 1024-chunks.
    for (rows, n, rr, grid) in [
        (3, 5120, 256, 2),
        (1, 5120, 256, 1),
        (5, 64, 64, 3),
        (4, 2048, 1024, 4),
    ] {
        let mut r = rng(7 + n as u64);
        let x0 = if rows >= 4 {
            adversarial(rows, n, n as u64)
        } else {
            random_vec(&mut r, rows * n, 3.0)
        };
        let res = random_vec(&mut r, rows * n, 1.0);
        let w = random_vec(&mut r, n, 1.0);
        let shape = FuseShape {
            rows,
            n,
            r: rr,
            grid,
            threads: 256,
        };
        for with_add in [false, true] {
            let what = format!("{rows} x {n}, R {rr}, grid {grid}, add {with_add}");
            let mut x = x0.clone();
            let mut y = vec![f32::NAN; rows * n];
            let add = with_add.then_some(&res[..]);
            let out = NormOut {
                rot: Some(&mut y),
                plain: None,
                prep: true,
            };
            let (s, p) =
                emu::add_rms_norm_hadamard_prep(&mut x, add, (&w, eps), out, shape).unwrap();
            // Unfused: add, rms_norm_hadamard_f32 (256 threads), pn_prepare_x_h2 per row.
            let want_x = if with_add {
                added(&x0, &res)
            } else {
                x0.clone()
            };
            assert_eq!(x, want_x, "{what}: residual");
            let mut want_y = vec![f32::NAN; rows * n];
            emu::hadamard(
                Rotation::RmsNorm { w: &w, n, eps },
                &want_x,
                &mut want_y,
                rr,
                256,
            )
            .unwrap();
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&y), bits(&want_y), "{what}: normed rows");
            let (xh, e) = emu::pn_prepare_rows(&want_y, rows, n).unwrap();
            let p = p.unwrap();
            assert_eq!(p.e, e, "{what}: exponents");
            assert!(p.xh == xh, "{what}: fp16 copy differs");
            assert_conflict_free(&what, &s);
            // Without the copy: the same f32 rows.
            let mut x = x0.clone();
            let mut y2 = vec![f32::NAN; rows * n];
            let out = NormOut {
                rot: Some(&mut y2),
                plain: None,
                prep: false,
            };
            let (_, none) =
                emu::add_rms_norm_hadamard_prep(&mut x, add, (&w, eps), out, shape).unwrap();
            assert!(none.is_none());
            assert_eq!(bits(&y2), bits(&want_y), "{what}: rows without the copy");
        }
    }
}

/// `rms(x) * w` in f64 per row (the CPU's RMSNorm without its rounding).
fn rms_norm_ref(x: &[f32], w: &[f32], n: usize, eps: f32) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(n) {
        let ms = row.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / n as f64;
        let inv = 1.0 / (ms + eps as f64).sqrt();
        out.extend(row.iter().zip(w).map(|(v, w)| *v as f64 * inv * *w as f64));
    }
    out
}

/// The GDN's input norm (rotated rows + fp16 copy for the PN qkv/gate, unrotated rows for the
/// Q8_0 alpha/beta) and the final norm before an unrotated head (unrotated rows alone), each with
/// and without the residual add, from one launch: the rotated rows and the copy as before, the
/// unrotated rows bit for bit `rms_norm_f32` (256 threads) on the added residual and within
/// 1e-5 relative of the f64 CPU norm; no bank conflict.
#[test]
fn the_unrotated_rows_beside_or_instead_of_the_rotated_equal_rms_norm() {
    let eps = 1e-6f32;
    // (rows, n, R, grid): the 27B hidden size (3 rows: the verify; 1: decode), a grid smaller
    // than the rows, a short row.
    for (rows, n, rr, grid) in [
        (3, 5120, 256, 2),
        (1, 5120, 256, 1),
        (4, 5120, 256, 3),
        (5, 96, 32, 2),
    ] {
        let mut r = rng(31 + rows as u64);
        let x0 = if rows >= 4 {
            adversarial(rows, n, 17)
        } else {
            random_vec(&mut r, rows * n, 3.0)
        };
        let res = random_vec(&mut r, rows * n, 1.0);
        let w = random_vec(&mut r, n, 1.0);
        let shape = FuseShape {
            rows,
            n,
            r: rr,
            grid,
            threads: 256,
        };
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        for with_add in [false, true] {
            let what = format!("{rows} x {n}, R {rr}, grid {grid}, add {with_add}");
            let add = with_add.then_some(&res[..]);
            let want_x = if with_add {
                added(&x0, &res)
            } else {
                x0.clone()
            };
            // Unfused: rms_norm_f32 (256 threads) and rms_norm_hadamard_f32 of the residual.
            let mut want_plain = vec![f32::NAN; rows * n];
            let ws = emu::norm(
                Norm::Rms { w: Some(&w), eps },
                &want_x,
                &mut want_plain,
                n,
                256,
            )
            .unwrap();
            assert_eq!(ws.smem_max_degree, 1.0, "{what}: rms_norm_f32 conflicts");
            let mut want_rot = vec![f32::NAN; rows * n];
            emu::hadamard(
                Rotation::RmsNorm { w: &w, n, eps },
                &want_x,
                &mut want_rot,
                rr,
                256,
            )
            .unwrap();
            // Against the CPU: adversarial rows of 1e30 scale overflow v * v in f32 (as the
            // CPU's f32 norm does), so only the finite rows are compared.
            let cpu = rms_norm_ref(&want_x, &w, n, eps);
            for (t, (got, want)) in want_plain.chunks(n).zip(cpu.chunks(n)).enumerate() {
                if want_x[t * n..(t + 1) * n]
                    .iter()
                    .any(|v| (v * v).is_infinite())
                {
                    continue;
                }
                for (g, c) in got.iter().zip(want) {
                    let tol = 1e-5 * c.abs().max(1e-30) + 1e-38;
                    assert!((*g as f64 - c).abs() <= tol, "{what}: row {t}: {g} vs {c}");
                }
            }
            // Both outputs and the fp16 copy in one launch.
            let mut x = x0.clone();
            let (mut y, mut yp) = (vec![f32::NAN; rows * n], vec![f32::NAN; rows * n]);
            let out = NormOut {
                rot: Some(&mut y),
                plain: Some(&mut yp),
                prep: true,
            };
            let (s, p) =
                emu::add_rms_norm_hadamard_prep(&mut x, add, (&w, eps), out, shape).unwrap();
            assert_eq!(x, want_x, "{what}: residual");
            assert_eq!(bits(&yp), bits(&want_plain), "{what}: unrotated rows");
            assert_eq!(bits(&y), bits(&want_rot), "{what}: rotated rows");
            let (xh, e) = emu::pn_prepare_rows(&want_rot, rows, n).unwrap();
            let p = p.unwrap();
            assert!(p.xh == xh && p.e == e, "{what}: fp16 copy differs");
            assert_conflict_free(&what, &s);
            // The unrotated rows alone.
            let mut x = x0.clone();
            let mut yp = vec![f32::NAN; rows * n];
            let out = NormOut {
                rot: None,
                plain: Some(&mut yp),
                prep: false,
            };
            let (s, none) =
                emu::add_rms_norm_hadamard_prep(&mut x, add, (&w, eps), out, shape).unwrap();
            assert!(none.is_none());
            assert_eq!(x, want_x, "{what}: residual (unrotated alone)");
            assert_eq!(bits(&yp), bits(&want_plain), "{what}: unrotated rows alone");
            assert_conflict_free(&what, &s);
        }
    }
}

#[test]
fn swiglu_rotation_and_fp16_copy_equal_the_unfused_kernels() {
    // The 27B FFN width (17408 = 68 chunks of 256) at 2 rows on one block; adversarial rows.
    // (rows, n, R, grid, threads, values per pass): 8192 as the wrapper takes (17408 = 2 full
    // passes and one of 1024), a pass of one chunk, a row in one pass.
    let cases = [
        (2, 17408, 256, 1, 512, 8192),
        (4, 1024, 64, 2, 128, 64),
        (1, 512, 512, 1, 256, 512),
    ];
    for (rows, n, rr, grid, threads, cap) in cases {
        let mut r = rng(11 + n as u64);
        let gate = if rows >= 4 {
            adversarial(rows, n, 5)
        } else {
            random_vec(&mut r, rows * n, 4.0)
        };
        let up = random_vec(&mut r, rows * n, 2.0);
        let what = format!("{rows} x {n}, R {rr}, grid {grid}");
        let mut out = vec![f32::NAN; rows * n];
        let shape = FuseShape {
            rows,
            n,
            r: rr,
            grid,
            threads,
        };
        let (s, p) = emu::swiglu_hadamard_prep((&gate, &up), &mut out, (shape, cap), true).unwrap();
        let mut want = vec![f32::NAN; rows * n];
        let t = (rr as u32 / 2).clamp(32, 512);
        emu::hadamard(Rotation::Swiglu { up: &up }, &gate, &mut want, rr, t).unwrap();
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&out), bits(&want), "{what}: rotated rows");
        let (xh, e) = emu::pn_prepare_rows(&want, rows, n).unwrap();
        let p = p.unwrap();
        assert_eq!(p.e, e, "{what}: exponents");
        assert!(p.xh == xh, "{what}: fp16 copy differs");
        assert_conflict_free(&what, &s);
    }
}

#[test]
fn fused_producers_refuse_bad_shapes_by_kernel_name() {
    let mut x = vec![0f32; 100];
    let mut y = vec![0f32; 100];
    let w = vec![1f32; 100];
    let shape = FuseShape {
        rows: 2,
        n: 64,
        r: 64,
        grid: 1,
        threads: 64,
    };
    let out = NormOut {
        rot: Some(&mut y),
        plain: None,
        prep: true,
    };
    let e = emu::add_rms_norm_hadamard_prep(&mut x, None, (&w, 1e-6), out, shape).unwrap_err();
    assert!(
        e.to_string().contains("add_rms_norm_hadamard_prep_f32"),
        "{e}"
    );
    // An fp16 copy without the rotated rows it copies.
    let mut x = vec![0f32; 128];
    let mut yp = vec![0f32; 128];
    let out = NormOut {
        rot: None,
        plain: Some(&mut yp),
        prep: true,
    };
    let e = emu::add_rms_norm_hadamard_prep(&mut x, None, (&w, 1e-6), out, shape).unwrap_err();
    assert!(
        e.to_string().contains("add_rms_norm_hadamard_prep_f32"),
        "{e}"
    );
    let e = emu::swiglu_hadamard_prep((&x, &w), &mut y, (FuseShape { rows: 1, ..shape }, 48), true)
        .unwrap_err();
    assert!(e.to_string().contains("swiglu_hadamard_prep_f32"), "{e}");
}
