//! The multi-vector matrix product: SIMD == scalar reference on random rows (odd block counts,
//! unaligned weights, 1..=8 vectors and more), agreement with one `matvec` per vector, and typed
//! errors for every shape mismatch.

mod common;

use common::{magnitude, random_rows, Rng};
use pn_format::dot::{matvec_multi, matvec_multi_with, matvec_with, MAX_ACTS};
use pn_format::{dot_ref_f64, Isa, PnError, PnType, PreparedI16};
use proptest::prelude::*;

fn run(isa: Isa, ty: PnType, w: &[u8], rows: usize, acts: &[PreparedI16]) -> Vec<Vec<f32>> {
    let mut outs = vec![vec![f32::NAN; rows]; acts.len()];
    let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
    matvec_multi_with(isa, ty, w, rows, acts, &mut refs).unwrap();
    outs
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn simd_matches_scalar_reference(
        pn4 in any::<bool>(),
        nb in 1usize..24,
        rows in 1usize..5,
        m in 1usize..=11,
        offset in 0usize..4,
        seed in any::<u64>(),
    ) {
        let ty = if pn4 { PnType::Pn4t } else { PnType::Pn3t };
        let bpw = ty.weights_per_block();
        let mut buf = vec![0u8; offset];
        buf.extend(random_rows(nb, rows, seed));
        let w = &buf[offset..];
        let mut rng = Rng(seed ^ 0x5555);
        let xs: Vec<Vec<f32>> = (0..m).map(|_| rng.normals(nb * bpw, 3.0)).collect();
        let acts: Vec<PreparedI16> =
            xs.iter().map(|x| PreparedI16::new(ty, x).unwrap()).collect();
        let reference = run(Isa::Scalar, ty, w, rows, &acts);
        let rb = nb * 34;
        for r in 0..rows {
            let row = &w[r * rb..(r + 1) * rb];
            for (a, x) in xs.iter().enumerate() {
                let mag = magnitude(ty, row, x);
                let exact = dot_ref_f64(ty, row, x).unwrap();
                // int16 activations: at most half a step per activation, times |w| <= mag.
                prop_assert!((reference[a][r] as f64 - exact).abs() <= 4e-5 * mag + 1e-30);
            }
        }
        for isa in Isa::available() {
            let got = run(isa, ty, w, rows, &acts);
            for r in 0..rows {
                let row = &w[r * rb..(r + 1) * rb];
                for a in 0..m {
                    let tol = 2e-5 * magnitude(ty, row, &xs[a]) + 1e-30;
                    prop_assert!(
                        (got[a][r] as f64 - reference[a][r] as f64).abs() <= tol,
                        "{:?} {} nb {} vector {} row {}: {} vs {}",
                        isa, ty, nb, a, r, got[a][r], reference[a][r]
                    );
                }
            }
        }
    }
}

#[test]
fn matches_one_matvec_per_vector_on_every_isa() {
    let mut rng = Rng(21);
    for ty in PnType::ALL {
        let (nb, rows) = (33, 7);
        let k = nb * ty.weights_per_block();
        let w = random_rows(nb, rows, 3);
        for m in 1..=MAX_ACTS + 2 {
            let xs: Vec<Vec<f32>> = (0..m).map(|_| rng.normals(k, 1.0)).collect();
            let acts: Vec<PreparedI16> = xs
                .iter()
                .map(|x| PreparedI16::new(ty, x).unwrap())
                .collect();
            for isa in Isa::available() {
                let got = run(isa, ty, &w, rows, &acts);
                for (a, p) in acts.iter().enumerate() {
                    let mut single = vec![0.0; rows];
                    matvec_with(isa, ty, &w, rows, p, &mut single).unwrap();
                    for r in 0..rows {
                        let (g, s) = (got[a][r], single[r]);
                        let row = &w[r * nb * 34..(r + 1) * nb * 34];
                        let tol = 2e-5 * magnitude(ty, row, &xs[a]);
                        assert!(
                            (g - s).abs() as f64 <= tol,
                            "{ty} {isa:?} m {m} vector {a} row {r}: {g} vs {s}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn many_rows_and_long_rows_cross_row_and_block_tiles() {
    // The SIMD pass walks 16-row tiles and block tiles of 16..64 blocks (fewer for more
    // vectors), prefetching ahead in that order: 37 rows and 150 blocks end both mid-tile. Two
    // rows at a time (AVX-512, up to 4 vectors) take whole rows where the vectors fit L1
    // (1 vector here, 2 with a 48 KB L1) and tiles otherwise.
    let (nb, rows) = (150, 37);
    let mut rng = Rng(77);
    for ty in PnType::ALL {
        let k = nb * ty.weights_per_block();
        let w = random_rows(nb, rows, 9);
        for m in [1, 2, 3, 4, 8, 11] {
            let xs: Vec<Vec<f32>> = (0..m).map(|_| rng.normals(k, 2.0)).collect();
            let acts: Vec<PreparedI16> = xs
                .iter()
                .map(|x| PreparedI16::new(ty, x).unwrap())
                .collect();
            let reference = run(Isa::Scalar, ty, &w, rows, &acts);
            for isa in Isa::available() {
                let got = run(isa, ty, &w, rows, &acts);
                for r in 0..rows {
                    let row = &w[r * nb * 34..(r + 1) * nb * 34];
                    for a in 0..m {
                        let tol = 2e-5 * magnitude(ty, row, &xs[a]);
                        let (g, e) = (got[a][r], reference[a][r]);
                        assert!(
                            ((g - e).abs() as f64) <= tol,
                            "{ty} {isa:?} m {m} vector {a} row {r}: {g} vs {e}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn shape_errors_are_typed() {
    let ty = PnType::Pn3t;
    let w = random_rows(2, 3, 1);
    let x = vec![0.5f32; 160];
    let acts = vec![PreparedI16::new(ty, &x).unwrap(); 2];
    let mut o0 = vec![0.0; 3];
    let mut o1 = vec![0.0; 3];
    let mut short = vec![0.0; 2];
    let call = |w: &[u8], acts: &[PreparedI16], outs: &mut [&mut [f32]]| {
        matvec_multi(ty, w, 3, acts, outs)
    };
    assert!(call(&w, &acts, &mut [&mut o0, &mut o1]).is_ok());
    assert!(matches!(
        call(&w, &acts, &mut [&mut o0]),
        Err(PnError::LengthMismatch { .. })
    ));
    assert!(matches!(
        call(&w, &acts, &mut [&mut o0, &mut short]),
        Err(PnError::LengthMismatch { .. })
    ));
    assert!(matches!(
        call(&w[1..], &acts, &mut [&mut o0, &mut o1]),
        Err(PnError::LengthMismatch { .. })
    ));
    let mixed = vec![
        PreparedI16::new(ty, &x).unwrap(),
        PreparedI16::new(ty, &x[..80]).unwrap(),
    ];
    assert!(matches!(
        call(&w, &mixed, &mut [&mut o0, &mut o1]),
        Err(PnError::LengthMismatch { .. })
    ));
    let other = vec![PreparedI16::new(PnType::Pn4t, &x[..128]).unwrap()];
    assert!(matches!(
        call(&w, &other, &mut [&mut o0]),
        Err(PnError::TypeMismatch { .. })
    ));
    // No vectors: nothing to do, not an error.
    assert!(call(&w, &[], &mut []).is_ok());
}

#[test]
fn non_finite_activations_give_nan_not_panic() {
    let ty = PnType::Pn4t;
    let w = random_rows(3, 2, 9);
    let mut x = vec![1.0f32; 192];
    x[70] = f32::INFINITY;
    let acts = vec![
        PreparedI16::new(ty, &vec![1.0; 192]).unwrap(),
        PreparedI16::new(ty, &x).unwrap(),
    ];
    for isa in Isa::ALL {
        let got = run(isa, ty, &w, 2, &acts);
        assert!(got[0].iter().all(|v| v.is_finite()), "{isa:?}");
        assert!(got[1].iter().all(|v| v.is_nan()), "{isa:?}");
    }
}
