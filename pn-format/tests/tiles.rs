//! The tiled (AMX, AVX-512 VNNI, AVX2 int8) matrix product: each kernel == its portable reference on random rows (odd block
//! counts, row counts that are not a multiple of 16, 1..=40 input rows, unaligned weights,
//! adversarial activations; the AMX kernels bit-identical), the reference == the decode kernel
//! (`matvec` on decode's int16 activations: the same integer block sums) within f32 rounding,
//! and typed errors for every shape mismatch. Each fast kernel's half runs where the CPU has
//! its instructions (AMX; AVX-512 VNNI; AVX2).

mod common;

use common::{magnitude, random_rows, Rng};
use pn_format::dot::{
    amx_available, matmul_tiled_kernel, matmul_tiled_with, vnni_tiles_available, TileActs,
    TileKernel, TilePrecision,
};
use pn_format::{dequantize_row, matvec, PnError, PnType, PreparedI16};
use proptest::prelude::*;

fn tiled(amx: bool, ty: PnType, w: &[u8], rows: usize, acts: &TileActs) -> Vec<Vec<f32>> {
    let mut outs = vec![vec![f32::NAN; rows]; acts.n_rows()];
    let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
    matmul_tiled_with(amx, ty, w, rows, acts, &mut refs).unwrap();
    outs
}

/// The decode kernel on decode's own int16 activations, one input row at a time.
fn decode(ty: PnType, w: &[u8], rows: usize, xs: &[Vec<f32>]) -> Vec<Vec<f32>> {
    xs.iter()
        .map(|x| {
            let mut out = vec![0f32; rows];
            matvec(ty, w, rows, &PreparedI16::new(ty, x).unwrap(), &mut out).unwrap();
            out
        })
        .collect()
}

fn flat(xs: &[Vec<f32>]) -> Vec<f32> {
    xs.concat()
}

/// Activations with adversarial blocks mixed in: all zero, one huge value, +-max everywhere.
fn activations(rng: &mut Rng, ty: PnType, nb: usize, kind: u8) -> Vec<f32> {
    let bpw = ty.weights_per_block();
    let mut x = rng.normals(nb * bpw, 3.0);
    for (b, xb) in x.chunks_exact_mut(bpw).enumerate() {
        match (kind as usize + b) % 5 {
            0 => xb.fill(0.0),
            1 => xb[b % bpw] = 1e30,
            2 => xb.iter_mut().enumerate().for_each(|(i, v)| {
                *v = if i % 2 == 0 { -7.5 } else { 7.5 };
            }),
            _ => {}
        }
    }
    x
}

fn check(
    tol: f64,
    ty: PnType,
    w: &[u8],
    xs: &[Vec<f32>],
    got: &[Vec<f32>],
    want: &[Vec<f32>],
    what: &str,
) -> Result<(), TestCaseError> {
    let rows = want[0].len();
    let rb = w.len() / rows;
    let nb = rb / 34;
    for r in 0..rows {
        let row = &w[r * rb..(r + 1) * rb];
        for (t, x) in xs.iter().enumerate() {
            let mag = magnitude(ty, row, x);
            if mag > 1e37 {
                // Sums that may overflow f32: either order may give inf or NaN.
                continue;
            }
            let tol = tol * mag + 1e-30;
            let (g, w) = (got[t][r], want[t][r]);
            prop_assert!(
                g == w || (g as f64 - w as f64).abs() <= tol || (g.is_nan() && w.is_nan()),
                "{} {} nb {} input {} row {}: {} vs {}",
                what,
                ty,
                nb,
                t,
                r,
                got[t][r],
                want[t][r]
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn amx_matches_reference_and_decode_numerics(
        pn4 in any::<bool>(),
        nb in 1usize..20,
        rows in 1usize..110,
        m in 1usize..=40,
        offset in 0usize..4,
        kind in any::<u8>(),
        seed in any::<u64>(),
    ) {
        let ty = if pn4 { PnType::Pn4t } else { PnType::Pn3t };
        let mut buf = vec![0u8; offset];
        buf.extend(random_rows(nb, rows, seed));
        let w = &buf[offset..];
        let mut rng = Rng(seed ^ 0x7777);
        let xs: Vec<Vec<f32>> = (0..m)
            .map(|i| activations(&mut rng, ty, nb, kind.wrapping_add(i as u8)))
            .collect();
        let tiles = TileActs::new(ty, &flat(&xs), m).unwrap();
        let reference = tiled(false, ty, w, rows, &tiles);
        // Decode's int16 values and integer block sums: f32 sums in another order apart (the
        // decode kernel keeps the zero-point term in a separate sum).
        let want = decode(ty, w, rows, &xs);
        check(1e-5, ty, w, &xs, &reference, &want, "reference vs decode")?;
        // The AVX-512 VNNI kernel: the same integer sums per block, scaled and summed in the
        // reference's order (bit-identical).
        if vnni_tiles_available() {
            let mut got = vec![vec![f32::NAN; rows]; m];
            let mut refs: Vec<&mut [f32]> = got.iter_mut().map(|o| o.as_mut_slice()).collect();
            matmul_tiled_kernel(TileKernel::Vnni, ty, w, rows, &tiles, &mut refs).unwrap();
            for (t, (g, r)) in got.iter().zip(&reference).enumerate() {
                for (i, (a, b)) in g.iter().zip(r).enumerate() {
                    prop_assert!(
                        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                        "vnni vs reference {} nb {} input {} row {}: {} vs {}", ty, nb, t, i, a, b
                    );
                }
            }
        }
        if amx_available() {
            let got = tiled(true, ty, w, rows, &tiles);
            // The same integer sums; fma vs mul-add rounding only.
            check(1e-6, ty, w, &xs, &got, &reference, "amx vs reference")?;
            // The one-tile and the register-blocked (default) kernels only reorder tile loads
            // and stores: bit-identical.
            for kernel in [TileKernel::AmxOneTile, TileKernel::AmxBlocked] {
                let mut one = vec![vec![f32::NAN; rows]; m];
                let mut refs: Vec<&mut [f32]> =
                    one.iter_mut().map(|o| o.as_mut_slice()).collect();
                matmul_tiled_kernel(kernel, ty, w, rows, &tiles, &mut refs).unwrap();
                prop_assert_eq!(&got, &one, "{:?}", kernel);
            }
        }
    }
}

/// The int8 tile product written from its definition, in f64: per block `sx = amax / 127`
/// (f32, as the quantizer), `q = round(x * (127 / amax))` clamped to +-127, and the dequantized
/// weights times `sx q`. Also returns, per output, the sum of the terms' magnitudes (the scale
/// of f32 rounding) and the int8 error bound against the exact `sum w x`: `sum |w| amax / 254`
/// per block.
fn int8_definition(ty: PnType, row: &[u8], x: &[f32]) -> (f64, f64, f64) {
    let bpw = ty.weights_per_block();
    let mut w = vec![0f32; x.len()];
    dequantize_row(ty, row, &mut w).unwrap();
    let (mut sum, mut mag, mut bound) = (0f64, 0f64, 0f64);
    for (wb, xb) in w.chunks_exact(bpw).zip(x.chunks_exact(bpw)) {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
        let sx = f64::from(amax / 127.0);
        for (&wk, &xk) in wb.iter().zip(xb) {
            let q = f64::from((xk * inv).round().clamp(-127.0, 127.0));
            sum += f64::from(wk) * sx * q;
            mag += (f64::from(wk) * sx * q).abs();
            bound += f64::from(wk).abs() * f64::from(amax) / 254.0;
        }
    }
    (sum, mag, bound)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Int8 activations: the reference equals the int8 definition within f32 rounding, the
    /// VNNI kernel equals the reference bit for bit, and both stay within the int8 bound of
    /// the exact product (`sum w x` in f64).
    #[test]
    fn int8_tiles_match_reference_and_definition(
        pn4 in any::<bool>(),
        nb in 1usize..20,
        rows in 1usize..60,
        m in 1usize..=70,
        offset in 0usize..4,
        seed in any::<u64>(),
    ) {
        let ty = if pn4 { PnType::Pn4t } else { PnType::Pn3t };
        let bpw = ty.weights_per_block();
        let mut buf = vec![0u8; offset];
        buf.extend(random_rows(nb, rows, seed));
        let w = &buf[offset..];
        let mut rng = Rng(seed ^ 0x5151);
        let mut xs: Vec<Vec<f32>> = (0..m).map(|_| rng.normals(nb * bpw, 2.0)).collect();
        // Adversarial blocks: all zero, one outlier, exact halves after scaling.
        for (t, x) in xs.iter_mut().enumerate() {
            let b = t % nb;
            match t % 4 {
                0 => x[b * bpw..(b + 1) * bpw].fill(0.0),
                1 => x[b * bpw + t % bpw] = 1e4,
                2 => x[b * bpw..(b + 1) * bpw]
                    .iter_mut()
                    .enumerate()
                    .for_each(|(i, v)| *v = (i as f32 - 40.0) * 0.5),
                _ => {}
            }
        }
        let tiles = TileActs::with_precision(ty, TilePrecision::I8, &flat(&xs), m).unwrap();
        prop_assert_eq!(tiles.precision(), TilePrecision::I8);
        let reference = tiled(false, ty, w, rows, &tiles);
        let rb = w.len() / rows;
        for r in 0..rows {
            let row = &w[r * rb..(r + 1) * rb];
            for (t, x) in xs.iter().enumerate() {
                let (want, mag, bound) = int8_definition(ty, row, x);
                let got = f64::from(reference[t][r]);
                prop_assert!(
                    (got - want).abs() <= 1e-5 * mag + 1e-30,
                    "{} nb {} input {} row {}: {} vs definition {}", ty, nb, t, r, got, want
                );
                let exact: f64 = {
                    let mut wf = vec![0f32; x.len()];
                    dequantize_row(ty, row, &mut wf).unwrap();
                    wf.iter().zip(x).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum()
                };
                prop_assert!(
                    (got - exact).abs() <= bound * (1.0 + 1e-4) + 1e-5 * mag + 1e-30,
                    "{} input {} row {}: {} vs exact {} (bound {})", ty, t, r, got, exact, bound
                );
            }
        }
        // Every fast kernel named runs int8 activations on the best int8 kernel (VNNI, else
        // AVX2, else the reference), the AVX2 one named on the AVX2 kernel: bit-identical to
        // the reference.
        let kernels = [TileKernel::Vnni, TileKernel::AmxBlocked, TileKernel::AmxOneTile];
        for kernel in kernels.into_iter().chain([TileKernel::Avx2]) {
            let mut got = vec![vec![f32::NAN; rows]; m];
            let mut refs: Vec<&mut [f32]> = got.iter_mut().map(|o| o.as_mut_slice()).collect();
            matmul_tiled_kernel(kernel, ty, w, rows, &tiles, &mut refs).unwrap();
            for (t, (g, r)) in got.iter().zip(&reference).enumerate() {
                for (i, (a, b)) in g.iter().zip(r).enumerate() {
                    prop_assert!(
                        a.to_bits() == b.to_bits(),
                        "{:?} int8 vs reference {} nb {} input {} row {}: {} vs {}",
                        kernel, ty, nb, t, i, a, b
                    );
                }
            }
        }
    }
}

/// Int8 activations with non-finite values: NaN results for the input that has them, finite
/// ones for the others, on the reference and on the fast kernel.
#[test]
fn int8_non_finite_activations_give_nan() {
    let ty = PnType::Pn3t;
    let w = random_rows(3, 19, 4);
    let mut x = vec![0.25f32; 240];
    x[100] = f32::NAN;
    let mut both = vec![-1.0f32; 240];
    both.extend_from_slice(&x);
    let tiles = TileActs::with_precision(ty, TilePrecision::I8, &both, 2).unwrap();
    for kernel in [TileKernel::Reference, TileKernel::Vnni, TileKernel::Avx2] {
        let mut got = vec![vec![0f32; 19]; 2];
        let mut refs: Vec<&mut [f32]> = got.iter_mut().map(|o| o.as_mut_slice()).collect();
        matmul_tiled_kernel(kernel, ty, &w, 19, &tiles, &mut refs).unwrap();
        assert!(got[0].iter().all(|v| v.is_finite()), "{kernel:?}");
        assert!(got[1].iter().all(|v| v.is_nan()), "{kernel:?}");
    }
}

#[test]
fn update_reuses_buffers_for_new_inputs() {
    let ty = PnType::Pn3t;
    let (nb, rows) = (7, 18);
    let w = random_rows(nb, rows, 5);
    let mut rng = Rng(8);
    let xs: Vec<Vec<f32>> = (0..20).map(|_| rng.normals(nb * 80, 1.0)).collect();
    let x = flat(&xs);
    let mut tiles = TileActs::new(ty, &x[..3 * nb * 80], 3).unwrap();
    tiles.update(&x, 20).unwrap();
    assert_eq!(tiles.n_rows(), 20);
    let fresh = TileActs::new(ty, &x, 20).unwrap();
    for amx in [false, true] {
        assert_eq!(
            tiled(amx, ty, &w, rows, &tiles),
            tiled(amx, ty, &w, rows, &fresh)
        );
    }
}

#[test]
fn shape_errors_are_typed() {
    let ty = PnType::Pn3t;
    let w = random_rows(2, 3, 1);
    let x = vec![0.5f32; 320];
    let tiles = TileActs::new(ty, &x, 2).unwrap();
    let (mut o0, mut o1, mut short) = (vec![0.0; 3], vec![0.0; 3], vec![0.0; 2]);
    let call = |w: &[u8], outs: &mut [&mut [f32]]| matmul_tiled_with(true, ty, w, 3, &tiles, outs);
    assert!(call(&w, &mut [&mut o0, &mut o1]).is_ok());
    assert!(matches!(
        call(&w, &mut [&mut o0]),
        Err(PnError::LengthMismatch { .. })
    ));
    assert!(matches!(
        call(&w, &mut [&mut o0, &mut short]),
        Err(PnError::LengthMismatch { .. })
    ));
    assert!(matches!(
        call(&w[1..], &mut [&mut o0, &mut o1]),
        Err(PnError::LengthMismatch { .. })
    ));
    // Not a whole number of rows, no rows, a ragged row length.
    assert!(matches!(
        TileActs::new(ty, &x[..319], 2),
        Err(PnError::LengthMismatch { .. })
    ));
    assert!(matches!(
        TileActs::new(ty, &x, 0),
        Err(PnError::LengthMismatch { .. })
    ));
    assert!(matches!(
        TileActs::new(ty, &x[..300], 2),
        Err(PnError::RaggedWeights { .. })
    ));
    let p4 = TileActs::new(PnType::Pn4t, &x[..128], 1).unwrap();
    assert!(matches!(
        matmul_tiled_with(true, ty, &w, 3, &p4, &mut [&mut o0]),
        Err(PnError::TypeMismatch { .. })
    ));
}

#[test]
fn non_finite_activations_give_nan_not_panic() {
    let ty = PnType::Pn4t;
    let w = random_rows(3, 17, 9);
    let mut x = vec![1.0f32; 192];
    x[70] = f32::INFINITY;
    let mut both = vec![1.0f32; 192];
    both.extend_from_slice(&x);
    let tiles = TileActs::new(ty, &both, 2).unwrap();
    for amx in [false, true] {
        let got = tiled(amx, ty, &w, 17, &tiles);
        assert!(got[0].iter().all(|v| v.is_finite()), "amx {amx}");
        assert!(got[1].iter().all(|v| v.is_nan()), "amx {amx}");
    }
}

#[test]
fn update_in_parallel_parts_equals_serial() {
    let ty = PnType::Pn4t;
    let (nb, rows, m) = (5, 50, 37);
    let w = random_rows(nb, rows, 11);
    let mut rng = Rng(12);
    let x = flat(
        &(0..m)
            .map(|_| rng.normals(nb * 64, 2.0))
            .collect::<Vec<_>>(),
    );
    let serial = TileActs::new(ty, &x, m).unwrap();
    let want = tiled(false, ty, &w, rows, &serial);
    for parts in [1, 2, 3, 7, 15, 1000] {
        let mut t = TileActs::new(ty, &x[..nb * 64], 1).unwrap();
        t.update_with(&x, m, parts, &|n, f| {
            std::thread::scope(|s| {
                for i in 0..n {
                    s.spawn(move || f(i));
                }
            })
        })
        .unwrap();
        assert_eq!(t.n_rows(), m);
        assert_eq!(tiled(false, ty, &w, rows, &t), want, "parts {parts}");
        assert_eq!(
            tiled(true, ty, &w, rows, &t),
            tiled(true, ty, &w, rows, &serial)
        );
    }
}

/// Rows long enough to cross the lane-parallel kernels' chunks (32 blocks) and K panels (a
/// few hundred blocks for 64 inputs), with a row count that leaves a short last pass: every
/// kernel bit-identical to the reference, at both precisions.
#[test]
fn long_rows_cross_chunks_and_panels() {
    let mut rng = Rng(0x600d);
    for (ty, nb) in [(PnType::Pn4t, 272), (PnType::Pn3t, 203)] {
        let bpw = ty.weights_per_block();
        let (rows, m) = (13, 40);
        let w = random_rows(nb, rows, 77);
        let xs: Vec<Vec<f32>> = (0..m).map(|_| rng.normals(nb * bpw, 1.5)).collect();
        for precision in [TilePrecision::I16, TilePrecision::I8] {
            let tiles = TileActs::with_precision(ty, precision, &flat(&xs), m).unwrap();
            let want = tiled(false, ty, &w, rows, &tiles);
            let kernels = [
                TileKernel::Vnni,
                TileKernel::Avx2,
                TileKernel::AmxBlocked,
                TileKernel::AmxOneTile,
            ];
            for kernel in kernels {
                let mut got = vec![vec![f32::NAN; rows]; m];
                let mut refs: Vec<&mut [f32]> = got.iter_mut().map(|o| o.as_mut_slice()).collect();
                matmul_tiled_kernel(kernel, ty, &w, rows, &tiles, &mut refs).unwrap();
                for (t, (g, r)) in got.iter().zip(&want).enumerate() {
                    let same = g.iter().zip(r).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "{kernel:?} {precision:?} {ty} input {t}: {g:?} vs {r:?}"
                    );
                }
            }
        }
    }
}
