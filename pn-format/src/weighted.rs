//! Importance-weighted scale search: the reference quantizer's 36 candidate scales and its sign
//! rule (decisions page section 2), choosing the candidate with the least *weighted* squared
//! error `sum_j imp_j (w_j - q_j)^2` instead of the plain one.
//!
//! This is not the canonical encoder ([`crate::quantize_row_ref`] stays that): it is one more
//! way of choosing codes and scales, and any choice is a valid PN block. Arithmetic is plain f64
//! with exact division in element order, so the result is the same on every machine.

use crate::block::pack_block;
use crate::error::PnError;
use crate::quantize::{candidate_scale, code_of, zero_block, CANDIDATES};
use crate::types::{PnType, BLOCK_BYTES};
use half::f16;

/// The scale the weighted search picks for one group of `weights_per_block` values `w` with
/// per-element importances `imp` (same length; negative or non-finite importances count as
/// zero; an all-zero importance vector falls back to unit weights, i.e. the plain error).
/// `None` means the canonical zero block (all-zero group, or every candidate underflows).
/// `group` only names the group in errors.
pub fn weighted_scale(
    ty: PnType,
    w: &[f64],
    imp: &[f64],
    group: usize,
) -> Result<Option<f64>, PnError> {
    if w.len() != imp.len() {
        return Err(PnError::LengthMismatch {
            what: "importances of a group",
            expected: w.len(),
            got: imp.len(),
        });
    }
    let z = f64::from(ty.zero_point());
    let (mut amax, mut max, mut min) = (0.0f64, f64::NEG_INFINITY, f64::INFINITY);
    for (index, &v) in w.iter().enumerate() {
        if !v.is_finite() {
            return Err(PnError::NonFiniteWeight {
                group,
                index,
                value: v as f32,
            });
        }
        amax = amax.max(v.abs());
        max = max.max(v);
        min = min.min(v);
    }
    if amax == 0.0 {
        return Ok(None);
    }
    // The same sign rule as the reference: the largest magnitude maps to code 0.
    let sigma = if min.abs() > max { 1.0 } else { -1.0 };
    let clean = |i: f64| if i.is_finite() && i > 0.0 { i } else { 0.0 };
    let unit = imp.iter().all(|&i| clean(i) == 0.0);
    let mut best: Option<(f64, f64)> = None;
    let mut overflowed = false;
    for c in 0..CANDIDATES {
        let h = candidate_scale(ty, sigma, amax, c);
        if !h.is_finite() {
            overflowed = true;
            continue;
        }
        if h.to_f32() == 0.0 {
            continue;
        }
        let s = h.to_f64();
        let mut e = 0.0f64;
        for (&v, &i) in w.iter().zip(imp) {
            let r = v - s * (code_of(v, s, z) - z);
            let wgt = if unit { 1.0 } else { clean(i) };
            e += wgt * r * r;
        }
        // Scan m upward and accept `<=`, so a tie goes to the larger m (as the reference).
        if best.is_none_or(|(_, be)| e <= be) {
            best = Some((s, e));
        }
    }
    match best {
        Some((s, _)) => Ok(Some(s)),
        None if overflowed => Err(PnError::ScaleOverflow { group, amax }),
        None => Ok(None),
    }
}

/// Packs the block of `w` at scale `s` (`None`: the zero block) with round-to-nearest codes.
pub fn pack_at_scale(ty: PnType, w: &[f64], s: Option<f64>) -> [u8; BLOCK_BYTES] {
    let Some(s) = s else {
        return zero_block(ty);
    };
    let z = f64::from(ty.zero_point());
    let mut codes = [0u8; 80];
    for (c, &v) in codes.iter_mut().zip(w) {
        *c = code_of(v, s, z) as u8;
    }
    pack_block(ty, f16::from_f64(s), &codes[..ty.weights_per_block()])
}

/// Quantizes a row with the weighted scale search, group by group (`imp` has one importance
/// per element of `x`).
pub fn quantize_row_weighted(ty: PnType, x: &[f32], imp: &[f32]) -> Result<Vec<u8>, PnError> {
    let bpw = ty.weights_per_block();
    if !x.len().is_multiple_of(bpw) {
        return Err(PnError::RaggedWeights {
            ty,
            len: x.len(),
            block: bpw,
        });
    }
    if imp.len() != x.len() {
        return Err(PnError::LengthMismatch {
            what: "importances of a row",
            expected: x.len(),
            got: imp.len(),
        });
    }
    let mut out = Vec::with_capacity(x.len() / bpw * BLOCK_BYTES);
    let (mut w, mut i) = (vec![0f64; bpw], vec![0f64; bpw]);
    for (g, (xs, is)) in x.chunks_exact(bpw).zip(imp.chunks_exact(bpw)).enumerate() {
        for (d, &v) in w.iter_mut().zip(xs) {
            *d = f64::from(v);
        }
        for (d, &v) in i.iter_mut().zip(is) {
            *d = f64::from(v);
        }
        let s = weighted_scale(ty, &w, &i, g)?;
        out.extend_from_slice(&pack_at_scale(ty, &w, s));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{dequantize_row, quantize_row_ref, validate_row};

    fn row(k: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..k)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.2
            })
            .collect()
    }

    fn werr(x: &[f32], q: &[f32], imp: &[f32]) -> f64 {
        x.iter()
            .zip(q)
            .zip(imp)
            .map(|((&a, &b), &i)| f64::from(i) * f64::from(a - b).powi(2))
            .sum()
    }

    /// With unit importances the weighted search makes the reference's choices; with skewed
    /// importances it never has more weighted error than the reference (it searches the same
    /// candidates for the least of exactly that error).
    #[test]
    fn unit_weights_match_reference_and_skewed_weights_do_better() {
        for ty in PnType::ALL {
            let k = ty.weights_per_block() * 20;
            let x = row(k, 11);
            let ones = vec![1.0f32; k];
            assert_eq!(
                quantize_row_weighted(ty, &x, &ones).unwrap(),
                quantize_row_ref(ty, &x).unwrap(),
                "{ty}"
            );
            let imp: Vec<f32> = (0..k).map(|j| 1.0 + (j % 7) as f32 * 3.0).collect();
            let qw = quantize_row_weighted(ty, &x, &imp).unwrap();
            validate_row(ty, &qw).unwrap();
            let qr = quantize_row_ref(ty, &x).unwrap();
            let (mut dw, mut dr) = (vec![0f32; k], vec![0f32; k]);
            dequantize_row(ty, &qw, &mut dw).unwrap();
            dequantize_row(ty, &qr, &mut dr).unwrap();
            let (ew, er) = (werr(&x, &dw, &imp), werr(&x, &dr, &imp));
            assert!(ew <= er, "{ty}: weighted {ew} > reference {er}");
            assert!(ew < er * 0.999, "{ty}: no gain ({ew} vs {er})");
        }
    }

    #[test]
    fn zero_group_and_bad_input() {
        let ty = PnType::Pn3t;
        let q = quantize_row_weighted(ty, &[0.0; 80], &[1.0; 80]).unwrap();
        assert_eq!(q, quantize_row_ref(ty, &[0.0; 80]).unwrap());
        let mut x = vec![0.1f32; 80];
        x[3] = f32::NAN;
        assert!(matches!(
            quantize_row_weighted(ty, &x, &[1.0; 80]),
            Err(PnError::NonFiniteWeight { index: 3, .. })
        ));
        assert!(quantize_row_weighted(ty, &[0.1; 80], &[1.0; 79]).is_err());
    }
}
