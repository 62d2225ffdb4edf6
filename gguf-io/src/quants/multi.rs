//! One weight row against several f32 activation vectors: `out[m] = row . xs[m]`.
//!
//! Decoding a row's blocks once and multiplying each with every vector makes a pass over a
//! matrix for a few tokens (speculative verification, small batches) cost about one pass for
//! one token. The AVX2 kernels (Q8_0, Q4_K, F16, F32 fused; every other type decodes a block
//! at a time) are tested against [`super::reference::vec_dot_f32_multi`]. For F32, F16 and Q8_0
//! they do the one-vector kernels' arithmetic in the same order, so each vector gets
//! [`super::vec_dot_f32`]'s exact bits: a pass of a few rows (MTP verification, batched decode)
//! through such weights (widths the int16 kernels do not take) gives each row its decode bits.

use super::{blockwise_dot, check_row, decoder, QuantError};
use crate::types::GgmlType;

/// Checks the row against every vector's length and the output count.
fn check(ty: GgmlType, row: &[u8], xs: &[&[f32]], out: &[f32]) -> Result<(), QuantError> {
    if out.len() != xs.len() {
        return Err(QuantError::Length {
            ty,
            what: "multi-dot outputs (one per vector)",
            expected: xs.len(),
            got: out.len(),
        });
    }
    decoder(ty).ok_or(QuantError::Unsupported {
        ty,
        op: "vec_dot_f32_multi",
    })?;
    for x in xs {
        check_row(ty, x.len(), row.len(), "weight row")?;
    }
    Ok(())
}

/// `out[m] = row . xs[m]` for every vector (each `xs[m].len()` elements of type `ty`), using
/// the fastest implementation the CPU supports.
pub fn vec_dot_f32_multi(
    ty: GgmlType,
    row: &[u8],
    xs: &[&[f32]],
    out: &mut [f32],
) -> Result<(), QuantError> {
    check(ty, row, xs, out)?;
    if let ([x], [o]) = (xs, &mut *out) {
        // One vector: the single-vector kernels (two accumulators, the same numbers as before).
        *o = super::vec_dot_f32(ty, row, x)?;
        return Ok(());
    }
    #[cfg(target_arch = "x86_64")]
    if super::x86_multi::vec_dot_f32_multi(ty, row, xs, out) {
        return Ok(());
    }
    portable(ty, row, xs, out);
    Ok(())
}

/// The portable path: the single-vector block-at-a-time dot product per vector.
pub(crate) fn portable(ty: GgmlType, row: &[u8], xs: &[&[f32]], out: &mut [f32]) {
    if let Some(dec) = decoder(ty) {
        for (o, x) in out.iter_mut().zip(xs) {
            *o = blockwise_dot(dec, ty, row, x);
        }
    }
}

/// The reference: [`super::reference::vec_dot_f32`] (full decode, f64 sums) per vector.
pub(crate) fn reference(
    ty: GgmlType,
    row: &[u8],
    xs: &[&[f32]],
    out: &mut [f32],
) -> Result<(), QuantError> {
    check(ty, row, xs, out)?;
    for (o, x) in out.iter_mut().zip(xs) {
        *o = super::reference::vec_dot_f32(ty, row, x)?;
    }
    Ok(())
}
