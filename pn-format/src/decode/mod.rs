//! Bit-exact decoding and validation of whole rows.

#[cfg(target_arch = "x86_64")]
mod x86;

use crate::block::blocks;
use crate::error::PnError;
use crate::isa::Isa;
use crate::types::{PnType, BLOCK_BYTES, WORDS_PER_BLOCK};
use half::f16;

/// Decodes a row: `dst[e] = d * (n - z)` in f32, exact. `dst.len()` must be the row's weight
/// count. No validity check: a NaN or infinite scale decodes to NaN/inf (call [`validate_row`]).
///
/// A zero result carries the IEEE sign of the product: code `z` with a negative `d` gives `-0.0`,
/// as the spec requires; with `d = ±0` and `n != z` the sign is `sign(d) * sign(n - z)`.
pub fn dequantize_row(ty: PnType, src: &[u8], dst: &mut [f32]) -> Result<(), PnError> {
    dequantize_row_with(Isa::detect(), ty, src, dst)
}

/// [`dequantize_row`] on a chosen instruction set (falls back to scalar if unavailable). Every
/// path gives bit-identical results.
pub fn dequantize_row_with(
    isa: Isa,
    ty: PnType,
    src: &[u8],
    dst: &mut [f32],
) -> Result<(), PnError> {
    let blocks = blocks(ty, src)?;
    let expected = blocks.len() * ty.weights_per_block();
    if dst.len() != expected {
        return Err(PnError::LengthMismatch {
            what: "dequantize_row output",
            expected,
            got: dst.len(),
        });
    }
    match (isa.or_scalar(), ty) {
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx512 | Isa::Avx512Vnni, _) => {
            // SAFETY: the CPU has AVX-512F (checked by `or_scalar`); lengths checked above.
            unsafe { x86::dequantize_avx512(ty, src, dst) }
        }
        (_, PnType::Pn3t) => decode_blocks::<3, 10>(src, dst),
        (_, PnType::Pn4t) => decode_blocks::<4, 8>(src, dst),
    }
    Ok(())
}

/// Decodes whole blocks with the type's constants known at compile time (unrolled shifts).
fn decode_blocks<const BITS: u32, const CPW: usize>(src: &[u8], dst: &mut [f32]) {
    let mask = (1u32 << BITS) - 1;
    let z = 1i32 << (BITS - 1);
    for (blk, out) in src
        .chunks_exact(BLOCK_BYTES)
        .zip(dst.chunks_exact_mut(WORDS_PER_BLOCK * CPW))
    {
        let d = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
        for (i, o) in out.chunks_exact_mut(CPW).enumerate() {
            let w = u32::from_le_bytes([
                blk[2 + 4 * i],
                blk[3 + 4 * i],
                blk[4 + 4 * i],
                blk[5 + 4 * i],
            ]);
            for j in 0..CPW / 2 {
                let lo = (w >> (BITS * j as u32)) & mask;
                let hi = (w >> (16 + BITS * j as u32)) & mask;
                o[2 * j] = d * (lo as i32 - z) as f32;
                o[2 * j + 1] = d * (hi as i32 - z) as f32;
            }
        }
    }
}

/// Checks a row: every block's scale is finite and (pn3t) no reserved bit is set. The error names
/// the first bad block and the reason; callers add the tensor name and row.
pub fn validate_row(ty: PnType, src: &[u8]) -> Result<(), PnError> {
    // The fast check passes almost every row of a good file at memory speed; only a failing
    // row is walked block by block to name the first bad block and the reason.
    if src.len().is_multiple_of(crate::types::BLOCK_BYTES) && crate::block::all_valid(ty, src) {
        return Ok(());
    }
    blocks(ty, src)?
        .enumerate()
        .try_for_each(|(b, blk)| blk.validate(b))
}
