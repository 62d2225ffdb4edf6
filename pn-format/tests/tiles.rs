//! The tiled (AMX) matrix product: AMX == its portable reference on random rows (odd block
//! counts, row counts that are not a multiple of 16, 1..=40 input rows, unaligned weights,
//! adversarial activations), the reference == the int16 decode kernels' scalar reference, and
//! typed errors for every shape mismatch. The AMX half runs where the CPU has AMX.

mod common;

use common::{magnitude, Rng};
use pn_format::dot::{amx_available, matmul_tiled_with, matvec_multi_with, TileActs};
use pn_format::{Isa, PnError, PnType, PreparedI16};
use proptest::prelude::*;

/// Random blocks with finite scales of any sign and random words (reserved bits included).
fn random_rows(nb: usize, rows: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed);
    let mut out = Vec::with_capacity(nb * rows * 34);
    for _ in 0..nb * rows {
        let mut d = rng.next_u64() as u16;
        if d & 0x7c00 == 0x7c00 {
            d &= 0xbfff;
        }
        out.extend_from_slice(&d.to_le_bytes());
        for _ in 0..8 {
            out.extend_from_slice(&(rng.next_u64() as u32).to_le_bytes());
        }
    }
    out
}

fn tiled(amx: bool, ty: PnType, w: &[u8], rows: usize, acts: &TileActs) -> Vec<Vec<f32>> {
    let mut outs = vec![vec![f32::NAN; rows]; acts.n_rows()];
    let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
    matmul_tiled_with(amx, ty, w, rows, acts, &mut refs).unwrap();
    outs
}

fn multi_scalar(ty: PnType, w: &[u8], rows: usize, acts: &[PreparedI16]) -> Vec<Vec<f32>> {
    let mut outs = vec![vec![f32::NAN; rows]; acts.len()];
    let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
    matvec_multi_with(Isa::Scalar, ty, w, rows, acts, &mut refs).unwrap();
    outs
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
    ty: PnType,
    w: &[u8],
    rows: usize,
    xs: &[Vec<f32>],
    got: &[Vec<f32>],
    want: &[Vec<f32>],
    what: &str,
) -> Result<(), TestCaseError> {
    let rb = w.len() / rows;
    let nb = rb / 34;
    for r in 0..rows {
        let row = &w[r * rb..(r + 1) * rb];
        for (t, x) in xs.iter().enumerate() {
            // Only the f32 order of the per-block sums differs.
            let tol = 2e-5 * magnitude(ty, row, x) + 1e-30;
            prop_assert!(
                (got[t][r] as f64 - want[t][r] as f64).abs() <= tol,
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
        rows in 1usize..37,
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
        let xs: Vec<Vec<f32>> = (0..m).map(|i| activations(&mut rng, ty, nb, kind.wrapping_add(i as u8))).collect();
        let acts: Vec<PreparedI16> = xs.iter().map(|x| PreparedI16::new(ty, x).unwrap()).collect();
        let tiles = TileActs::new(ty, &acts).unwrap();
        let reference = tiled(false, ty, w, rows, &tiles);
        let decode = multi_scalar(ty, w, rows, &acts);
        check(ty, w, rows, &xs, &reference, &decode, "reference vs decode")?;
        if amx_available() {
            let got = tiled(true, ty, w, rows, &tiles);
            check(ty, w, rows, &xs, &got, &reference, "amx vs reference")?;
        }
    }
}

#[test]
fn update_reuses_buffers_for_new_inputs() {
    let ty = PnType::Pn3t;
    let (nb, rows) = (7, 18);
    let w = random_rows(nb, rows, 5);
    let mut rng = Rng(8);
    let xs: Vec<Vec<f32>> = (0..20).map(|_| rng.normals(nb * 80, 1.0)).collect();
    let acts: Vec<PreparedI16> = xs
        .iter()
        .map(|x| PreparedI16::new(ty, x).unwrap())
        .collect();
    let mut tiles = TileActs::new(ty, &acts[..3]).unwrap();
    tiles.update(&acts).unwrap();
    assert_eq!(tiles.n_rows(), 20);
    let fresh = TileActs::new(ty, &acts).unwrap();
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
    let x = vec![0.5f32; 160];
    let acts = vec![PreparedI16::new(ty, &x).unwrap(); 2];
    let tiles = TileActs::new(ty, &acts).unwrap();
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
    let mixed = vec![
        PreparedI16::new(ty, &x).unwrap(),
        PreparedI16::new(ty, &x[..80]).unwrap(),
    ];
    assert!(matches!(
        TileActs::new(ty, &mixed),
        Err(PnError::LengthMismatch { .. })
    ));
    let other = vec![PreparedI16::new(PnType::Pn4t, &x[..128]).unwrap()];
    assert!(matches!(
        TileActs::new(ty, &other),
        Err(PnError::TypeMismatch { .. })
    ));
    let p4 = TileActs::new(PnType::Pn4t, &other).unwrap();
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
    let acts = vec![
        PreparedI16::new(ty, &vec![1.0; 192]).unwrap(),
        PreparedI16::new(ty, &x).unwrap(),
    ];
    let tiles = TileActs::new(ty, &acts).unwrap();
    for amx in [false, true] {
        let got = tiled(amx, ty, &w, 17, &tiles);
        assert!(got[0].iter().all(|v| v.is_finite()), "amx {amx}");
        assert!(got[1].iter().all(|v| v.is_nan()), "amx {amx}");
    }
}
