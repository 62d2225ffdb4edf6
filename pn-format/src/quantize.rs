//! The reference quantizer, exactly as pinned down in the decisions page (section 2).
//!
//! The 36 candidate errors are summed in element order per candidate, in f64, with no fused
//! multiply-add: the loop runs over elements outside and candidates inside, so the compiler can
//! vectorise across candidates without changing any candidate's summation order. The result is
//! therefore bit-identical whatever instruction set the loop is compiled for.

use crate::block::pack_block;
use crate::error::PnError;
use crate::types::{PnType, BLOCK_BYTES};
use half::f16;

/// Number of candidate scales per group.
pub const CANDIDATES: usize = 36;

/// The candidate multiplier `m_i = (50 + 2 i) / 100` (i in 0..36), computed by exactly this
/// expression so that the grid is the same on every machine.
pub fn candidate_multiplier(i: usize) -> f64 {
    (50 + 2 * i) as f64 / 100.0
}

/// The candidate scale for multiplier index `i`: `fp16((sigma * m * amax / z) as f32)`, rounding
/// f64 -> f32 -> f16 to nearest-even, as a C implementation converts.
pub fn candidate_scale(ty: PnType, sigma: f64, amax: f64, i: usize) -> f16 {
    let z = f64::from(ty.zero_point());
    f16::from_f32((sigma * candidate_multiplier(i) * amax / z) as f32)
}

/// 1.5 * 2^52: adding and subtracting it rounds an f64 of magnitude < 2^51 to an integer,
/// ties to even (the default rounding mode), in two vectorisable additions.
const RINT_MAGIC: f64 = 6_755_399_441_055_744.0;

/// `rint(q)` for any finite q; |q| is first clamped well inside the exact range. Clamping changes
/// nothing downstream because the code is clamped to `0..2z` anyway.
#[inline(always)]
fn rint(q: f64) -> f64 {
    let q = q.clamp(-1.0e12, 1.0e12);
    (q + RINT_MAGIC) - RINT_MAGIC
}

/// The code of weight `v` for scale `s`: `clamp(rint(v / s) + z, 0, 2z - 1)`, as an f64.
#[inline(always)]
pub(crate) fn code_of(v: f64, s: f64, z: f64) -> f64 {
    (rint(v / s) + z).clamp(0.0, 2.0 * z - 1.0)
}

/// A code computed from `v * (1/s)` is the exact `rint(v / s)` unless the product lies within a
/// few ulps of a half-integer; |q| stays below ~64 for every non-skipped candidate, so this margin
/// is many orders of magnitude wider than the product's rounding error.
const NEAR_HALF: f64 = 0.5 - 1e-9;

/// Squared-error sums of every candidate. `s[c]` must be finite and non-zero (callers put 1.0 in
/// the slots of skipped candidates and ignore their result).
///
/// With `FAST`, `w / s` is replaced by `w * inv[c]` (no division in the hot loop) and `near[c]`
/// records the largest `|q - rint(q)|` seen; if it is within [`NEAR_HALF`] of a tie the caller
/// recomputes with exact division. Without `FAST`, `near` is all zero.
#[inline(always)]
fn group_errors_generic<const FAST: bool>(
    w: &[f32],
    s: &[f64; CANDIDATES],
    inv: &[f64; CANDIDATES],
    z: f64,
) -> ([f64; CANDIDATES], [f64; CANDIDATES]) {
    // All candidates side by side in LANES lanes (padded with scale 1.0, results dropped),
    // elements in order: each candidate's sum stays sequential, the lanes map onto a few vector
    // registers, and the independent lanes hide the latency of the running sums.
    const LANES: usize = 40;
    let pad = |a: &[f64; CANDIDATES]| -> [f64; LANES] {
        std::array::from_fn(|l| a.get(l).copied().unwrap_or(1.0))
    };
    let (sc, iv) = (pad(s), pad(inv));
    let mut e = [0.0f64; LANES];
    let mut nr = [0.0f64; LANES];
    for &v in w {
        let v = f64::from(v);
        for l in 0..LANES {
            let n = if FAST {
                let q = (v * iv[l]).clamp(-1.0e12, 1.0e12);
                let r = (q + RINT_MAGIC) - RINT_MAGIC;
                let d = (q - r).abs();
                // A compare-select (not f64::max) vectorises simply; every input is finite.
                nr[l] = if d > nr[l] { d } else { nr[l] };
                (r + z).clamp(0.0, 2.0 * z - 1.0)
            } else {
                code_of(v, sc[l], z)
            };
            let r = v - sc[l] * (n - z);
            e[l] += r * r;
        }
    }
    let err: [f64; CANDIDATES] = std::array::from_fn(|c| e[c]);
    let near: [f64; CANDIDATES] = std::array::from_fn(|c| nr[c]);
    (err, near)
}

type Errors = ([f64; CANDIDATES], [f64; CANDIDATES]);

#[inline(always)]
fn errors_any(
    w: &[f32],
    s: &[f64; CANDIDATES],
    inv: &[f64; CANDIDATES],
    z: f64,
    fast: bool,
) -> Errors {
    if fast {
        group_errors_generic::<true>(w, s, inv, z)
    } else {
        group_errors_generic::<false>(w, s, inv, z)
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn errors_avx2(
    w: &[f32],
    s: &[f64; CANDIDATES],
    inv: &[f64; CANDIDATES],
    z: f64,
    fast: bool,
) -> Errors {
    // FMA is enabled for the target but Rust never contracts `a * b + c` by itself, so the
    // arithmetic is the same as the generic version.
    errors_any(w, s, inv, z, fast)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn errors_avx512(
    w: &[f32],
    s: &[f64; CANDIDATES],
    inv: &[f64; CANDIDATES],
    z: f64,
    fast: bool,
) -> Errors {
    errors_any(w, s, inv, z, fast)
}

fn group_errors(
    w: &[f32],
    s: &[f64; CANDIDATES],
    inv: &[f64; CANDIDATES],
    z: f64,
    fast: bool,
) -> Errors {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports the features the function was compiled for.
            return unsafe { errors_avx512(w, s, inv, z, fast) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: as above.
            return unsafe { errors_avx2(w, s, inv, z, fast) };
        }
    }
    errors_any(w, s, inv, z, fast)
}

/// The canonical zero group: `d = +0.0`, every code `z`.
pub(crate) fn zero_block(ty: PnType) -> [u8; BLOCK_BYTES] {
    let codes = [ty.zero_point() as u8; 80];
    pack_block(ty, f16::from_bits(0), &codes[..ty.weights_per_block()])
}

/// Quantizes one group of `weights_per_block` weights to one block. `group` is only used to
/// name the group in errors.
///
/// # Panics
/// If `w.len() != weights_per_block` (an internal contract; the row functions check lengths).
pub fn quantize_group_ref(
    ty: PnType,
    w: &[f32],
    group: usize,
) -> Result<[u8; BLOCK_BYTES], PnError> {
    assert_eq!(w.len(), ty.weights_per_block(), "one group");
    let z = f64::from(ty.zero_point());
    let (mut amax, mut max, mut min) = (0.0f64, f64::NEG_INFINITY, f64::INFINITY);
    for (index, &v) in w.iter().enumerate() {
        if !v.is_finite() {
            return Err(PnError::NonFiniteWeight {
                group,
                index,
                value: v,
            });
        }
        let v = f64::from(v);
        amax = amax.max(v.abs());
        max = max.max(v);
        min = min.min(v);
    }
    if amax == 0.0 {
        return Ok(zero_block(ty));
    }
    // The largest magnitude maps to code 0, at the end with the larger magnitude.
    let sigma = if min.abs() > max { 1.0 } else { -1.0 };

    let mut scales = [1.0f64; CANDIDATES];
    let mut valid = [false; CANDIDATES];
    let mut overflowed = false;
    for (i, (s, ok)) in scales.iter_mut().zip(valid.iter_mut()).enumerate() {
        let h = candidate_scale(ty, sigma, amax, i);
        if !h.is_finite() {
            overflowed = true;
        } else if h.to_f32() != 0.0 {
            *s = h.to_f64();
            *ok = true;
        }
    }
    let inv = scales.map(|s| 1.0 / s);
    let (mut err, near) = group_errors(w, &scales, &inv, z, true);
    if (0..CANDIDATES).any(|c| valid[c] && near[c] > NEAR_HALF) {
        // Some w/s may sit on a rounding tie: redo this group with exact division.
        err = group_errors(w, &scales, &inv, z, false).0;
    }
    // Scan m upward and accept `<=`, so a tie goes to the larger m.
    let mut best: Option<usize> = None;
    for c in (0..CANDIDATES).filter(|&c| valid[c]) {
        if best.is_none_or(|b| err[c] <= err[b]) {
            best = Some(c);
        }
    }
    let Some(best) = best else {
        return if overflowed {
            Err(PnError::ScaleOverflow { group, amax })
        } else {
            // Every candidate underflowed to zero.
            Ok(zero_block(ty))
        };
    };
    let s = scales[best];
    let mut codes = [0u8; 80];
    for (c, &v) in codes.iter_mut().zip(w) {
        *c = code_of(f64::from(v), s, z) as u8;
    }
    Ok(pack_block(
        ty,
        f16::from_f64(s),
        &codes[..ty.weights_per_block()],
    ))
}

/// Quantizes a row into `dst` (exactly `row_bytes(x.len())` bytes).
pub fn quantize_row_into(ty: PnType, x: &[f32], dst: &mut [u8]) -> Result<(), PnError> {
    let bpw = ty.weights_per_block();
    if !x.len().is_multiple_of(bpw) {
        return Err(PnError::RaggedWeights {
            ty,
            len: x.len(),
            block: bpw,
        });
    }
    let expected = x.len() / bpw * BLOCK_BYTES;
    if dst.len() != expected {
        return Err(PnError::LengthMismatch {
            what: "quantized row bytes",
            expected,
            got: dst.len(),
        });
    }
    for (g, (w, out)) in x
        .chunks_exact(bpw)
        .zip(dst.chunks_exact_mut(BLOCK_BYTES))
        .enumerate()
    {
        out.copy_from_slice(&quantize_group_ref(ty, w, g)?);
    }
    Ok(())
}

/// The reference quantizer for one row of `x.len()` weights (a multiple of the block size).
/// Errors name the group; callers add the row and tensor.
pub fn quantize_row_ref(ty: PnType, x: &[f32]) -> Result<Vec<u8>, PnError> {
    let bpw = ty.weights_per_block();
    let mut out = vec![0u8; x.len() / bpw * BLOCK_BYTES];
    quantize_row_into(ty, x, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scales_for(amax: f64, sigma: f64, ty: PnType) -> [f64; CANDIDATES] {
        std::array::from_fn(|i| {
            let h = candidate_scale(ty, sigma, amax, i);
            if h.is_finite() && h.to_f32() != 0.0 {
                h.to_f64()
            } else {
                1.0
            }
        })
    }

    /// The multiply path flags every exact rounding tie, so the exact path takes over there.
    #[test]
    fn fast_path_flags_exact_ties() {
        let ty = PnType::Pn3t;
        let s = scales_for(4.0, -1.0, ty);
        let inv = s.map(|v| 1.0 / v);
        for c in [0, 17, 25, 35] {
            // (k + 0.5) * s is exact in f32 for these small k and 11-bit s.
            let w: Vec<f32> = (0..80)
                .map(|i| ((i % 7) as f64 - 3.5) * s[c])
                .map(|v| v as f32)
                .collect();
            let (_, near) = group_errors(&w, &s, &inv, 4.0, true);
            assert!(
                near[c] > NEAR_HALF,
                "candidate {c}: tie not flagged ({})",
                near[c]
            );
        }
    }

    /// Away from ties, multiply and divide give identical errors (bit for bit).
    #[test]
    fn fast_path_equals_exact_path_off_ties() {
        let mut state = 1u64;
        let mut next = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        };
        let mut checked = 0;
        for g in 0..2000 {
            let amax_scale = 10f64.powi(g % 9 - 4);
            let w: Vec<f32> = (0..64).map(|_| (next() * amax_scale) as f32).collect();
            let amax = w.iter().fold(0.0f64, |a, v| a.max(f64::from(v.abs())));
            let s = scales_for(amax, -1.0, PnType::Pn4t);
            let inv = s.map(|v| 1.0 / v);
            let (fast, near) = group_errors(&w, &s, &inv, 8.0, true);
            if near.iter().all(|&n| n <= NEAR_HALF) {
                let (exact, _) = group_errors(&w, &s, &inv, 8.0, false);
                assert_eq!(fast.map(f64::to_bits), exact.map(f64::to_bits), "group {g}");
                checked += 1;
            }
        }
        assert!(checked > 1500);
    }
}
