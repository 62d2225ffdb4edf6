//! The int16-activation decode path for the two stock types a PN model reads per token: Q4_K
//! (the 248320 x 5120 output head, the largest single read) and Q8_0. The activations are
//! quantized once per matrix-vector call to int16 with one f32 scale per group of 256
//! (`dx = amax / 32767`, `q = round(x / dx)`), so every element is within `dx / 2` (a relative
//! error of at most 2^-16 of its group's largest magnitude, about 1.5e-5); the weight blocks are
//! then multiplied in exact integer arithmetic (`vpdpwssd` / `vpmaddwd`) and only the per-block
//! sums are scaled in f32. The f32-activation kernels need an int->float conversion and a
//! multiply-add per weight, which made the head compute-bound at about half of the read
//! bandwidth; this needs about a third of the instructions.
//!
//! The scalar reference here ([`reference`]) computes the same exact integer sums in i64 and is
//! what the SIMD kernels (`x86_i16`) are tested against.

use super::fp::f16_at;
use super::kquants::{scale_min_k4, Q4K_BYTES, QK_K};
use super::{check_row, QuantError};
use crate::types::GgmlType;

/// Activations per scale group (one Q4_K super-block, eight Q8_0 blocks).
pub const GROUP: usize = QK_K;

/// Sub-blocks of 32 in a group (the Q4_K sub-block, whose sums the mins term needs).
const SUBS: usize = GROUP / 32;

/// Activations quantized to int16 for [`vec_dot_i16`]: `x[j] ~= d[j / 256] * q[j]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ActsI16 {
    /// One scale per group of [`GROUP`] activations (NaN when the group holds a non-finite value,
    /// so that every product with it is NaN, as with f32 activations).
    pub(crate) d: Vec<f32>,
    /// The quantized values, `|q| <= 32767`.
    pub(crate) q: Vec<i16>,
    /// The sum of each run of 32 quantized values (8 per group; Q4_K's mins term).
    pub(crate) sums: Vec<i32>,
}

impl ActsI16 {
    /// No activations yet (fill with [`ActsI16::update`]).
    pub fn new() -> ActsI16 {
        ActsI16::default()
    }

    /// Number of activations.
    pub fn len(&self) -> usize {
        self.q.len()
    }

    /// Whether there are no activations.
    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }

    /// Quantizes `x` (a multiple of [`GROUP`] long) in place of the previous contents, reusing
    /// the buffers (no allocation once they are large enough).
    pub fn update(&mut self, x: &[f32]) -> Result<(), QuantError> {
        if !x.len().is_multiple_of(GROUP) {
            return Err(QuantError::NotBlockMultiple {
                ty: GgmlType::Q4K,
                n: x.len(),
                block_size: GROUP,
            });
        }
        let groups = x.len() / GROUP;
        self.d.resize(groups, 0.0);
        self.q.resize(x.len(), 0);
        self.sums.resize(groups * SUBS, 0);
        for (g, xg) in x.chunks_exact(GROUP).enumerate() {
            // Lane-wise maxima (vectorizes); a NaN or infinity anywhere poisons the group.
            let mut m = [0f32; 16];
            let mut finite = true;
            for c in xg.chunks_exact(16) {
                for (mk, &v) in m.iter_mut().zip(c) {
                    *mk = mk.max(v.abs());
                    finite &= v.is_finite();
                }
            }
            let amax = m.iter().fold(0f32, |a, &b| a.max(b));
            let d = amax / 32767.0;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            self.d[g] = if finite { d } else { f32::NAN };
            let qg = &mut self.q[g * GROUP..(g + 1) * GROUP];
            for (qk, &v) in qg.iter_mut().zip(xg) {
                // Clamped, then rounded (ties to even); `as` maps NaN to 0 (the group's scale
                // is NaN then). Clamping first gives the same integers: the bounds are.
                *qk = round_ties_even_small((v * id).clamp(-32767.0, 32767.0)) as i16;
            }
            for (s, q32) in self.sums[g * SUBS..(g + 1) * SUBS]
                .iter_mut()
                .zip(qg.chunks_exact(32))
            {
                *s = q32.iter().map(|&v| i32::from(v)).sum();
            }
        }
        Ok(())
    }

    /// The dequantized activations (`d * q`), for error analysis.
    pub fn dequantize(&self) -> Vec<f32> {
        self.q
            .iter()
            .enumerate()
            .map(|(j, &q)| self.d[j / GROUP] * f32::from(q))
            .collect()
    }
}

/// Whether [`vec_dot_i16`] has a SIMD kernel for `ty` on this CPU (Q4_K and Q8_0 with AVX2+FMA;
/// `PN_ISA=scalar` turns it off). Without one, callers should keep the f32-activation kernel,
/// which is then faster than the scalar reference.
pub fn has_i16_kernel(ty: GgmlType) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        matches!(ty, GgmlType::Q4K | GgmlType::Q8_0) && super::x86_i16::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ty;
        false
    }
}

/// The dot product of one weight row of `ty` (Q4_K or Q8_0, `a.len()` elements) with int16
/// activations: the SIMD kernel where [`has_i16_kernel`], otherwise the scalar reference.
pub fn vec_dot_i16(ty: GgmlType, row: &[u8], a: &ActsI16) -> Result<f32, QuantError> {
    check(ty, row, a)?;
    #[cfg(target_arch = "x86_64")]
    if let Some(v) = super::x86_i16::dot(ty, row, a) {
        return Ok(v);
    }
    Ok(scalar(ty, row, a))
}

/// Activation sets one call of the multi-set kernel serves at once (more are taken in groups
/// of this many; the row is then re-read from L1).
pub const I16_MULTI: usize = 4;

/// `out[m] = row . acts[m]` for every activation set (each as [`vec_dot_i16`] takes it), the
/// row's blocks unpacked once for up to [`I16_MULTI`] sets (AVX-512); each result is
/// bit-identical to [`vec_dot_i16`] on its set, so a multi-row pass (the MTP verify) gets the
/// numbers of single-row decode.
pub fn vec_dot_i16_multi(
    ty: GgmlType,
    row: &[u8],
    acts: &[&ActsI16],
    out: &mut [f32],
) -> Result<(), QuantError> {
    if out.len() != acts.len() {
        return Err(QuantError::Length {
            ty,
            what: "multi-dot outputs (one per activation set)",
            expected: acts.len(),
            got: out.len(),
        });
    }
    for a in acts {
        check(ty, row, a)?;
    }
    for (a, o) in acts.chunks(I16_MULTI).zip(out.chunks_mut(I16_MULTI)) {
        #[cfg(target_arch = "x86_64")]
        if super::x86_i16_multi::dot_multi(ty, row, a, o).is_some() {
            continue;
        }
        for (v, a) in o.iter_mut().zip(a) {
            *v = vec_dot_i16(ty, row, a)?;
        }
    }
    Ok(())
}

fn check(ty: GgmlType, row: &[u8], a: &ActsI16) -> Result<(), QuantError> {
    if !matches!(ty, GgmlType::Q4K | GgmlType::Q8_0) {
        return Err(QuantError::Unsupported {
            ty,
            op: "vec_dot_i16",
        });
    }
    check_row(ty, a.len(), row.len(), "weight row")
}

/// Exact integer sums per block (i64), each scaled in f32 as the SIMD kernels scale them, summed
/// in f64.
fn scalar(ty: GgmlType, row: &[u8], a: &ActsI16) -> f32 {
    let mut total = 0f64;
    match ty {
        GgmlType::Q4K => {
            for (i, b) in row.chunks_exact(Q4K_BYTES).enumerate() {
                let q = &a.q[GROUP * i..GROUP * (i + 1)];
                let (mut main, mut mins) = (0i64, 0i64);
                for j in 0..SUBS {
                    let (sc, m) = scale_min_k4(j, &b[4..16]);
                    let (c, high) = (j / 2, j % 2 == 1);
                    let dot: i64 = (0..32)
                        .map(|l| {
                            let byte = b[16 + 32 * c + l];
                            let w = if high { byte >> 4 } else { byte & 15 };
                            i64::from(w) * i64::from(q[32 * j + l])
                        })
                        .sum();
                    main += i64::from(sc) * dot;
                    mins += i64::from(m) * i64::from(a.sums[SUBS * i + j]);
                }
                let (d, dmin) = (f16_at(b, 0) * a.d[i], f16_at(b, 2) * a.d[i]);
                total += f64::from(d) * main as f64 - f64::from(dmin) * mins as f64;
            }
        }
        _ => {
            for (i, b) in row.chunks_exact(34).enumerate() {
                let dot: i64 = (0..32)
                    .map(|l| i64::from(b[2 + l] as i8) * i64::from(a.q[32 * i + l]))
                    .sum();
                total += f64::from(f16_at(b, 0) * a.d[i / 8]) * dot as f64;
            }
        }
    }
    total as f32
}

/// The scalar reference the SIMD kernels are tested against.
pub mod reference {
    use super::*;

    /// [`super::vec_dot_i16`] without SIMD: exact integer block sums, f64 accumulation.
    pub fn vec_dot_i16(ty: GgmlType, row: &[u8], a: &ActsI16) -> Result<f32, QuantError> {
        check(ty, row, a)?;
        Ok(scalar(ty, row, a))
    }
}

#[cfg(test)]
#[path = "i16acts_tests.rs"]
mod tests;

/// `v.round_ties_even()` for `|v| <= 2^22` (and NaN), without the libm call that `f32`'s
/// rounding is on baseline x86-64 (it kept the quantizer from vectorizing): `v + 1.5 * 2^23`
/// lies in `[2^23, 2^24)`, where the f32 spacing is 1, so the addition rounds to the nearest
/// integer, ties to even, and the subtraction is exact.
#[inline(always)]
pub(crate) fn round_ties_even_small(v: f32) -> f32 {
    const SHIFT: f32 = 12_582_912.0;
    (v + SHIFT) - SHIFT
}
