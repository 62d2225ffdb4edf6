//! The few-row AMX kernel (`matvec_small`: 1..=16 input rows, decode's int16 activations):
//! bit-identical to its portable reference on random rows (odd block counts, row counts that
//! are not a multiple of 16, unaligned weights, adversarial activations), the reference equal
//! to the decode kernel (`matvec`, the same integer block sums) within f32 rounding, and typed
//! errors for every shape mismatch. The AMX half runs where the CPU has AMX.

mod common;

use common::{magnitude, random_rows, Rng};
use pn_format::dot::{matvec_small, matvec_small_reference, SmallActs, SMALL_MAX_ROWS};
use pn_format::{matvec, PnError, PnType, PreparedI16};
use proptest::prelude::*;

/// Activations with adversarial blocks: all zero, one huge value, +-max everywhere.
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

fn run(amx: bool, ty: PnType, w: &[u8], rows: usize, acts: &SmallActs) -> Option<Vec<Vec<f32>>> {
    let mut outs = vec![vec![f32::NAN; rows]; acts.n_rows()];
    let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
    if amx {
        matvec_small(ty, w, rows, acts, &mut refs)
            .unwrap()
            .then_some(())?;
    } else {
        matvec_small_reference(ty, w, rows, acts, &mut refs);
    }
    Some(outs)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn small_tiles_match_reference_and_decode(
        pn4 in any::<bool>(),
        nb in 1usize..24,
        rows in 1usize..70,
        m in 1usize..=SMALL_MAX_ROWS,
        offset in 0usize..4,
        kind in any::<u8>(),
        seed in any::<u64>(),
    ) {
        let ty = if pn4 { PnType::Pn4t } else { PnType::Pn3t };
        let mut buf = vec![0u8; offset];
        buf.extend(random_rows(nb, rows, seed));
        let w = &buf[offset..];
        let rb = w.len() / rows;
        let mut rng = Rng(seed ^ 0x5151);
        let xs: Vec<Vec<f32>> = (0..m)
            .map(|i| activations(&mut rng, ty, nb, kind.wrapping_add(i as u8)))
            .collect();
        let acts: Vec<PreparedI16> = xs.iter().map(|x| PreparedI16::new(ty, x).unwrap()).collect();
        let mut small = SmallActs::default();
        small.update(&acts).unwrap();
        prop_assert_eq!(small.n_rows(), m);
        let reference = run(false, ty, w, rows, &small).unwrap();
        // The decode kernel: the same int16 values and integer block sums, f32 rounding apart.
        for (t, (x, a)) in xs.iter().zip(&acts).enumerate() {
            let mut want = vec![0f32; rows];
            matvec(ty, w, rows, a, &mut want).unwrap();
            for r in 0..rows {
                // f32 sums of the same exact block terms in another order (the decode kernel
                // keeps the zero-point term in a separate sum): a few ulps of their magnitude.
                let mag = magnitude(ty, &w[r * rb..(r + 1) * rb], x);
                if mag > 1e37 {
                    // Sums that may overflow f32: either order may give inf or NaN.
                    continue;
                }
                let tol = 1e-5 * mag + 1e-30;
                let (got, want) = (reference[t][r], want[r]);
                prop_assert!(
                    got == want
                        || (got as f64 - want as f64).abs() <= tol
                        || (got.is_nan() && want.is_nan()),
                    "{} nb {} input {} row {}: reference {} vs decode {}", ty, nb, t, r, got, want
                );
            }
        }
        if let Some(got) = run(true, ty, w, rows, &small) {
            for (t, (g, w)) in got.iter().zip(&reference).enumerate() {
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                prop_assert_eq!(bits(g), bits(w), "{} nb {} input {}", ty, nb, t);
            }
        }
    }
}

#[test]
fn bad_shapes_are_typed_errors() {
    let ty = PnType::Pn3t;
    let x = vec![0.5f32; 160];
    let a = PreparedI16::new(ty, &x).unwrap();
    let mut small = SmallActs::default();
    assert!(matches!(
        small.update(&[]),
        Err(PnError::LengthMismatch { got: 0, .. })
    ));
    let many = vec![a.clone(); SMALL_MAX_ROWS + 1];
    assert!(matches!(
        small.update(&many),
        Err(PnError::LengthMismatch { got: 17, .. })
    ));
    let other = PreparedI16::new(PnType::Pn4t, &x[..128]).unwrap();
    assert!(matches!(
        small.update(&[a.clone(), other]),
        Err(PnError::TypeMismatch { .. })
    ));
    let short = PreparedI16::new(ty, &x[..80]).unwrap();
    assert!(matches!(
        small.update(&[a.clone(), short]),
        Err(PnError::LengthMismatch { .. })
    ));
    small.update(&[a.clone(), a]).unwrap();
    let w = random_rows(2, 3, 1);
    let (mut o0, mut o1) = (vec![0f32; 3], vec![0f32; 3]);
    // One output for two inputs; a short output; the wrong weight bytes; the wrong type.
    assert!(matches!(
        matvec_small(ty, &w, 3, &small, &mut [&mut o0]),
        Err(PnError::LengthMismatch { .. })
    ));
    let mut short_out = vec![0f32; 2];
    assert!(matches!(
        matvec_small(ty, &w, 3, &small, &mut [&mut o0, &mut short_out]),
        Err(PnError::LengthMismatch { .. })
    ));
    assert!(matches!(
        matvec_small(ty, &w[..100], 3, &small, &mut [&mut o0, &mut o1]),
        Err(PnError::LengthMismatch { .. })
    ));
    assert!(matches!(
        matvec_small(PnType::Pn4t, &w, 3, &small, &mut [&mut o0, &mut o1]),
        Err(PnError::TypeMismatch { .. })
    ));
    assert!(matvec_small(ty, &w, 3, &small, &mut [&mut o0, &mut o1]).is_ok());
}

/// Rows of no blocks (`k = 0`) are zero dot products, not a fault in the pipelined block loop.
#[test]
fn zero_blocks_give_zeros() {
    for ty in PnType::ALL {
        let acts = [PreparedI16::new(ty, &[]).unwrap()];
        let mut small = SmallActs::default();
        small.update(&acts).unwrap();
        for amx in [false, true] {
            if let Some(got) = run(amx, ty, &[], 5, &small) {
                assert_eq!(got, vec![vec![0f32; 5]], "{ty} amx {amx}");
            }
        }
    }
}
