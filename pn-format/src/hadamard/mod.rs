//! The blockwise orthonormal Walsh-Hadamard transform (decisions page, section 6).
//!
//! `H` is block-diagonal: Sylvester-ordered Hadamard blocks of size `R` (a power of two), scaled
//! by `1/sqrt(R)`, so `H` is symmetric and `H H = I` (up to rounding when `R` is an odd power of
//! two, where `1/sqrt(R)` is not exact). The SIMD paths do the same additions in the same order as
//! the scalar one (a butterfly lane computes `a + b` or `a - b` exactly once, via an FMA with
//! +-1), so every path gives bit-identical results.

#[cfg(target_arch = "x86_64")]
mod x86;

use crate::error::PnError;
use crate::isa::Isa;

fn check(len: usize, r: usize) -> Result<(), PnError> {
    if r < 2 || !r.is_power_of_two() {
        return Err(PnError::HadamardSize { r });
    }
    if !len.is_multiple_of(r) {
        return Err(PnError::HadamardLength { len, r });
    }
    Ok(())
}

/// The normalisation factor `1/sqrt(R)` in f32.
pub fn hadamard_scale(r: usize) -> f32 {
    (1.0 / (r as f64).sqrt()) as f32
}

/// Transforms `x` in place, block by block: every aligned run of `r` values is replaced by
/// `H_r x / sqrt(r)`. `r` must be a power of two >= 2 dividing `x.len()`.
pub fn fwht_blocks_inplace(x: &mut [f32], r: usize) -> Result<(), PnError> {
    fwht_blocks_inplace_with(Isa::detect(), x, r)
}

/// [`fwht_blocks_inplace`] on a chosen instruction set (falls back to scalar if unavailable).
pub fn fwht_blocks_inplace_with(isa: Isa, x: &mut [f32], r: usize) -> Result<(), PnError> {
    check(x.len(), r)?;
    match isa.or_scalar() {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Avx512Vnni => {
            // SAFETY: the CPU supports the features (checked by `or_scalar`).
            unsafe { x86::fwht_avx512(x, r) }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => {
            // SAFETY: as above.
            unsafe { x86::fwht_avx2(x, r) }
        }
        _ => fwht_scalar(x, r),
    }
    Ok(())
}

/// Scalar butterflies for whole blocks of `x` (`x.len()` a multiple of `r`, already checked).
pub(crate) fn fwht_scalar(x: &mut [f32], r: usize) {
    let scale = hadamard_scale(r);
    for blk in x.chunks_exact_mut(r) {
        let mut h = 1;
        while h < r {
            for pair in blk.chunks_exact_mut(2 * h) {
                let (a, b) = pair.split_at_mut(h);
                for (u, v) in a.iter_mut().zip(b.iter_mut()) {
                    let (p, q) = (*u, *v);
                    *u = p + q;
                    *v = p - q;
                }
            }
            h *= 2;
        }
        blk.iter_mut().for_each(|v| *v *= scale);
    }
}

/// Rotates the rows of a row-major weight matrix with `k` columns: `W <- W H`. Because `H` is
/// symmetric, each row is transformed like an activation vector. `k` must be a multiple of `r`.
pub fn rotate_rows(w: &mut [f32], k: usize, r: usize) -> Result<(), PnError> {
    check(k, r)?;
    if !w.len().is_multiple_of(k) {
        return Err(PnError::LengthMismatch {
            what: "rotate_rows matrix (a whole number of rows)",
            expected: w.len() / k * k,
            got: w.len(),
        });
    }
    // Blocks never straddle rows because r divides k.
    fwht_blocks_inplace(w, r)
}
