//! Decoding, dot products and reference quantization of the stock ggml types.
//!
//! * [`dequantize_row`]: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K,
//!   Q6_K, IQ4_NL, IQ4_XS, IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M, TQ1_0, TQ2_0,
//!   bit-identical to ggml's and gguf-py's reference decoders.
//! * [`vec_dot_f32`]: one weight row times f32 activations, AVX2/FMA when the CPU has it (fused
//!   kernels for Q4_K, Q5_K, Q6_K, Q5_0, Q5_1, Q8_0, IQ4_XS, IQ3_S, F32, F16; other types
//!   decode a block at a time).
//!   [`reference::vec_dot_f32`] is the scalar reference it is tested against.
//! * [`vec_dot_f32_multi`]: one weight row times several activation vectors, each block decoded
//!   once (AVX2 when the CPU has it); tested against [`reference::vec_dot_f32_multi`].
//! * [`quantize_activations`] + [`vec_dot_q`]: the int8-activation path (Q8_K for K-quants,
//!   Q8_0 for Q4_0/Q8_0), as ggml's CPU backend does it.
//! * [`quantize_row`]: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q3_K, Q4_K, Q5_K, Q6_K.
//! * [`quantize_row_weighted`]: Q3_K, Q4_K, Q5_K, Q6_K, Q8_0 minimising an importance-weighted
//!   error (an imatrix); other types as [`quantize_row`].
//!
//! The PN types are decoded by `pn-format`; here they are `QuantError::Unsupported`.

mod fp;
mod i16acts;
mod iq1_grid;
mod iq_tables;
mod iquants;
mod kquantize;
mod kquantize_w;
mod kquants;
mod legacy;
mod multi;
mod q8;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
mod x86_avx512;
#[cfg(target_arch = "x86_64")]
mod x86_i16;
#[cfg(target_arch = "x86_64")]
mod x86_i16_multi;
#[cfg(target_arch = "x86_64")]
mod x86_multi;
#[cfg(target_arch = "x86_64")]
mod x86_stock;

pub use i16acts::{
    has_i16_kernel, vec_dot_i16, vec_dot_i16_multi, ActsI16, GROUP as I16_GROUP, I16_MULTI,
};
pub use multi::vec_dot_f32_multi;
pub use q8::{quantize_activations, vec_dot_q, ActFormat, QuantizedActs};

use crate::types::GgmlType;

/// Errors of the quantization functions.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QuantError {
    /// The operation is not implemented for this type (PN types live in `pn-format`).
    #[error("{op} is not supported for type {ty}")]
    Unsupported {
        /// The type.
        ty: GgmlType,
        /// The operation.
        op: &'static str,
    },
    /// The element count is not a whole number of blocks.
    #[error("{ty}: {n} elements is not a multiple of the block size {block_size}")]
    NotBlockMultiple {
        /// The type.
        ty: GgmlType,
        /// The element count.
        n: usize,
        /// The type's block size.
        block_size: usize,
    },
    /// A buffer has the wrong length.
    #[error("{ty}: {what} has length {got}, expected {expected}")]
    Length {
        /// The type.
        ty: GgmlType,
        /// Which buffer.
        what: &'static str,
        /// The length needed.
        expected: usize,
        /// The length given.
        got: usize,
    },
    /// The activations were quantized for a weight type with another activation format.
    #[error("activations were quantized as {prepared}, weights of type {ty} need {needed}")]
    ActsMismatch {
        /// The weight type.
        ty: GgmlType,
        /// The activation format the weights need.
        needed: &'static str,
        /// The activation format given.
        prepared: &'static str,
    },
}

/// The types [`dequantize_row`] and [`vec_dot_f32`] accept.
pub const DECODABLE: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::Iq4Nl,
    GgmlType::Iq4Xs,
    GgmlType::Iq3Xxs,
    GgmlType::Iq3S,
    GgmlType::Iq2Xxs,
    GgmlType::Iq2Xs,
    GgmlType::Iq2S,
    GgmlType::Iq1S,
    GgmlType::Iq1M,
    GgmlType::Tq1_0,
    GgmlType::Tq2_0,
];

/// The types [`quantize_row`] accepts.
pub const QUANTIZABLE: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
];

type Decoder = fn(&[u8], &mut [f32]);

fn decoder(ty: GgmlType) -> Option<Decoder> {
    Some(match ty {
        GgmlType::F32 => fp::dequantize_f32,
        GgmlType::F16 => fp::dequantize_f16,
        GgmlType::BF16 => fp::dequantize_bf16,
        GgmlType::Q4_0 => legacy::dequantize_q4_0,
        GgmlType::Q4_1 => legacy::dequantize_q4_1,
        GgmlType::Q5_0 => legacy::dequantize_q5_0,
        GgmlType::Q5_1 => legacy::dequantize_q5_1,
        GgmlType::Q8_0 => legacy::dequantize_q8_0,
        GgmlType::Q2K => kquants::dequantize_q2_k,
        GgmlType::Q3K => kquants::dequantize_q3_k,
        GgmlType::Q4K => kquants::dequantize_q4_k,
        GgmlType::Q5K => kquants::dequantize_q5_k,
        GgmlType::Q6K => kquants::dequantize_q6_k,
        GgmlType::Iq4Nl => iquants::dequantize_iq4_nl,
        GgmlType::Iq4Xs => iquants::dequantize_iq4_xs,
        GgmlType::Iq3Xxs => iquants::dequantize_iq3_xxs,
        GgmlType::Iq3S => iquants::dequantize_iq3_s,
        GgmlType::Iq2Xxs => iquants::dequantize_iq2_xxs,
        GgmlType::Iq2Xs => iquants::dequantize_iq2_xs,
        GgmlType::Iq2S => iquants::dequantize_iq2_s,
        GgmlType::Iq1S => iquants::dequantize_iq1_s,
        GgmlType::Iq1M => iquants::dequantize_iq1_m,
        GgmlType::Tq1_0 => iquants::dequantize_tq1_0,
        GgmlType::Tq2_0 => iquants::dequantize_tq2_0,
        _ => return None,
    })
}

/// Checks that `n` elements are whole blocks and that `bytes` holds exactly their encoding.
fn check_row(ty: GgmlType, n: usize, bytes: usize, what: &'static str) -> Result<(), QuantError> {
    let blck = ty.block_size();
    if !n.is_multiple_of(blck) {
        return Err(QuantError::NotBlockMultiple {
            ty,
            n,
            block_size: blck,
        });
    }
    let expected = n / blck * ty.type_size();
    if bytes != expected {
        return Err(QuantError::Length {
            ty,
            what,
            expected,
            got: bytes,
        });
    }
    Ok(())
}

/// Decodes `dst.len()` elements of type `ty` from `src` (exactly their encoding) into `dst`.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    let dec = decoder(ty).ok_or(QuantError::Unsupported {
        ty,
        op: "dequantize",
    })?;
    check_row(ty, dst.len(), src.len(), "source bytes")?;
    dec(src, dst);
    Ok(())
}

/// The dot product of one weight row (`x.len()` elements of type `ty`) with `x`, using the
/// fastest implementation the CPU supports.
pub fn vec_dot_f32(ty: GgmlType, row: &[u8], x: &[f32]) -> Result<f32, QuantError> {
    let dec = decoder(ty).ok_or(QuantError::Unsupported {
        ty,
        op: "vec_dot_f32",
    })?;
    check_row(ty, x.len(), row.len(), "weight row")?;
    #[cfg(target_arch = "x86_64")]
    if let Some(v) = x86::vec_dot_f32(ty, row, x) {
        return Ok(v);
    }
    Ok(blockwise_dot(dec, ty, row, x))
}

/// Decodes one block at a time into a stack buffer and accumulates in f32 lanes (which the
/// compiler vectorizes); the portable fast path.
#[inline(always)]
fn blockwise_dot(dec: Decoder, ty: GgmlType, row: &[u8], x: &[f32]) -> f32 {
    // Process several blocks at once for the 1-element types so the buffer is worth it.
    let blck = ty.block_size();
    let per = (256 / blck).max(1);
    let (chunk_elems, chunk_bytes) = (blck * per, ty.type_size() * per);
    let mut buf = [0f32; 256];
    let mut acc = [0f32; 8];
    let mut tail = 0f32;
    for (wb, xb) in row.chunks(chunk_bytes).zip(x.chunks(chunk_elems)) {
        let w = &mut buf[..xb.len()];
        dec(wb, w);
        let mut wc = w.chunks_exact(8);
        let mut xc = xb.chunks_exact(8);
        for (w8, x8) in (&mut wc).zip(&mut xc) {
            for k in 0..8 {
                acc[k] += w8[k] * x8[k];
            }
        }
        tail += wc
            .remainder()
            .iter()
            .zip(xc.remainder())
            .map(|(a, b)| a * b)
            .sum::<f32>();
    }
    acc.iter().sum::<f32>() + tail
}

/// Checks that `n` elements are whole `ty` blocks and reserves their encoding in `dst`.
fn reserve_blocks(ty: GgmlType, n: usize, dst: &mut Vec<u8>) -> Result<(), QuantError> {
    let blck = ty.block_size();
    if !n.is_multiple_of(blck) {
        return Err(QuantError::NotBlockMultiple {
            ty,
            n,
            block_size: blck,
        });
    }
    dst.reserve(n / blck * ty.type_size());
    Ok(())
}

/// Appends the encoding of `src` as type `ty` to `dst`.
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut Vec<u8>) -> Result<(), QuantError> {
    if !QUANTIZABLE.contains(&ty) {
        return Err(QuantError::Unsupported { ty, op: "quantize" });
    }
    reserve_blocks(ty, src.len(), dst)?;
    match ty {
        GgmlType::F32 => fp::quantize_f32(src, dst),
        GgmlType::F16 => fp::quantize_f16(src, dst),
        GgmlType::BF16 => fp::quantize_bf16(src, dst),
        GgmlType::Q4_0 => legacy::quantize_symmetric(4, src, dst),
        GgmlType::Q5_0 => legacy::quantize_symmetric(5, src, dst),
        GgmlType::Q4_1 => legacy::quantize_affine(4, src, dst),
        GgmlType::Q5_1 => legacy::quantize_affine(5, src, dst),
        GgmlType::Q8_0 => legacy::quantize_q8_0(src, dst),
        GgmlType::Q3K => kquantize::quantize_q3_k(src, dst),
        GgmlType::Q4K => kquantize::quantize_q4_k(src, dst),
        // No separate unweighted Q5_K search: the weighted one with uniform weights.
        GgmlType::Q5K => kquantize_w::quantize_weighted(ty, src, &vec![1.0; src.len()], dst),
        GgmlType::Q6K => kquantize::quantize_q6_k(src, dst),
        _ => unreachable!("checked against QUANTIZABLE"),
    }
    Ok(())
}

/// The types [`quantize_row_weighted`] weights (the others it quantizes as [`quantize_row`]).
pub const WEIGHTED: &[GgmlType] = &[
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::Q8_0,
];

/// Quantizes `src` like [`quantize_row`], but for the [`WEIGHTED`] types chooses each block's
/// scales, mins and codes to minimise `sum_i importance[i] * (src[i] - decoded[i])^2` (e.g. an
/// imatrix's mean squared activation per input column, repeated for every row). Per block the
/// result is never worse on that error than [`quantize_row`]'s (it is one of the candidates).
/// Negative or non-finite importances count as 0; a block of all-zero importance is weighted
/// uniformly. `importance.len()` must equal `src.len()`.
pub fn quantize_row_weighted(
    ty: GgmlType,
    src: &[f32],
    importance: &[f32],
    dst: &mut Vec<u8>,
) -> Result<(), QuantError> {
    if importance.len() != src.len() {
        return Err(QuantError::Length {
            ty,
            what: "importance",
            expected: src.len(),
            got: importance.len(),
        });
    }
    if !WEIGHTED.contains(&ty) {
        return quantize_row(ty, src, dst);
    }
    reserve_blocks(ty, src.len(), dst)?;
    kquantize_w::quantize_weighted(ty, src, importance, dst);
    Ok(())
}

/// Scalar references that the fast paths are tested against.
pub mod reference {
    use super::*;

    pub use super::i16acts::reference::vec_dot_i16;
    pub use super::q8::vec_dot_q_scalar as vec_dot_q;

    /// Dot product by full dequantization and f64 accumulation: slow, exact up to the final
    /// rounding to f32.
    pub fn vec_dot_f32(ty: GgmlType, row: &[u8], x: &[f32]) -> Result<f32, QuantError> {
        let mut w = vec![0f32; x.len()];
        dequantize_row(ty, row, &mut w)?;
        Ok(w.iter()
            .zip(x)
            .map(|(&a, &b)| f64::from(a) * f64::from(b))
            .sum::<f64>() as f32)
    }

    /// [`vec_dot_f32`] (full decode, f64 sums) once per vector: the reference of
    /// [`super::vec_dot_f32_multi`].
    pub fn vec_dot_f32_multi(
        ty: GgmlType,
        row: &[u8],
        xs: &[&[f32]],
        out: &mut [f32],
    ) -> Result<(), QuantError> {
        super::multi::reference(ty, row, xs, out)
    }

    /// The portable block-at-a-time dot product (no explicit SIMD).
    pub fn vec_dot_f32_portable(ty: GgmlType, row: &[u8], x: &[f32]) -> Result<f32, QuantError> {
        let dec = decoder(ty).ok_or(QuantError::Unsupported {
            ty,
            op: "vec_dot_f32",
        })?;
        check_row(ty, x.len(), row.len(), "weight row")?;
        Ok(blockwise_dot(dec, ty, row, x))
    }
}
