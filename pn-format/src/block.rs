//! Safe views of PN blocks inside byte buffers, and block packing.
//!
//! A block starts at byte `34*b`, so its words are 4-byte aligned only in every other block
//! (see the alignment erratum in the decisions page). Every access here reads bytes with
//! `from_le_bytes`, which assumes no alignment at all.

use crate::error::PnError;
use crate::types::{PnType, BLOCK_BYTES, WORDS_PER_BLOCK};
use half::f16;

/// A read-only view of one 34-byte block.
#[derive(Clone, Copy, Debug)]
pub struct BlockRef<'a> {
    ty: PnType,
    bytes: &'a [u8; BLOCK_BYTES],
}

impl<'a> BlockRef<'a> {
    /// Views `bytes` (exactly 34 of them) as a block of type `ty`.
    pub fn new(ty: PnType, bytes: &'a [u8]) -> Result<Self, PnError> {
        let bytes: &[u8; BLOCK_BYTES] = bytes.try_into().map_err(|_| PnError::RaggedBytes {
            ty,
            len: bytes.len(),
        })?;
        Ok(BlockRef { ty, bytes })
    }

    /// The block type.
    pub fn ty(&self) -> PnType {
        self.ty
    }

    /// The raw bytes of the block.
    pub fn bytes(&self) -> &'a [u8; BLOCK_BYTES] {
        self.bytes
    }

    /// The raw fp16 bits of the scale `d`.
    pub fn scale_bits(&self) -> u16 {
        u16::from_le_bytes([self.bytes[0], self.bytes[1]])
    }

    /// The scale `d` as stored (fp16).
    pub fn scale_f16(&self) -> f16 {
        f16::from_bits(self.scale_bits())
    }

    /// The scale `d` widened to f32 (exact).
    pub fn scale(&self) -> f32 {
        self.scale_f16().to_f32()
    }

    /// Word `i` (0..8) of the code area, read without any alignment assumption.
    ///
    /// # Panics
    /// If `i >= 8`, like slice indexing.
    pub fn word(&self, i: usize) -> u32 {
        let o = 2 + 4 * i;
        u32::from_le_bytes([
            self.bytes[o],
            self.bytes[o + 1],
            self.bytes[o + 2],
            self.bytes[o + 3],
        ])
    }

    /// The code `n` of element `e` (0..weights_per_block) of the block: word `e / codes_per_word`,
    /// local index `t = e % codes_per_word`, at bit `BITS*(t>>1) + 16*(t&1)`.
    ///
    /// # Panics
    /// If `e >= weights_per_block`, like slice indexing.
    pub fn code(&self, e: usize) -> u8 {
        let cpw = self.ty.codes_per_word();
        assert!(e < self.ty.weights_per_block(), "element {e} out of block");
        let w = self.word(e / cpw);
        ((w >> self.ty.code_shift(e % cpw)) & u32::from(self.ty.max_code())) as u8
    }

    /// The decoded value of element `e`: `d * (n - z)` in f32 (exact).
    ///
    /// # Panics
    /// If `e >= weights_per_block`.
    pub fn value(&self, e: usize) -> f32 {
        self.scale() * (i32::from(self.code(e)) - self.ty.zero_point()) as f32
    }

    /// Checks this block (index `block` in its row): the scale must be finite and, for pn3t, the
    /// reserved bits 15 and 31 of every word must be zero.
    pub fn validate(&self, block: usize) -> Result<(), PnError> {
        let bits = self.scale_bits();
        // fp16 NaN and infinity both have an all-ones exponent.
        if bits & 0x7c00 == 0x7c00 {
            return Err(PnError::NonFiniteScale { block, bits });
        }
        let mask = self.ty.reserved_mask();
        if mask != 0 {
            for word in 0..WORDS_PER_BLOCK {
                let value = self.word(word);
                if value & mask != 0 {
                    return Err(PnError::ReservedBits { block, word, value });
                }
            }
        }
        Ok(())
    }
}

/// Whether every block of `src` (whole 34-byte blocks; a ragged tail is ignored) passes
/// [`BlockRef::validate`], without locating a failure: one OR of the scale's all-ones-exponent
/// test and of the reserved bits over 8-byte loads per block, no branch, so that checking a
/// 12 GB file costs about one read of it instead of dominating the load (`validate` reads every
/// word byte by byte and branches per block). [`crate::validate_row`] uses it first and walks
/// the blocks only when it fails.
pub fn all_valid(ty: PnType, src: &[u8]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if crate::Isa::detect() >= crate::Isa::Avx512 {
        // SAFETY: AVX-512F/BW detected (and not capped away by `PN_ISA`).
        let (ok, done) =
            unsafe { crate::block_x86::all_valid_periods(src, ty.reserved_mask() != 0) };
        return ok && all_valid_scalar(ty, &src[done..]);
    }
    all_valid_scalar(ty, src)
}

/// [`all_valid`] without SIMD.
pub fn all_valid_scalar(ty: PnType, src: &[u8]) -> bool {
    // A type without reserved bits (pn4t) needs only the scale test: one load per block
    // instead of five.
    if ty.reserved_mask() == 0 {
        return all_valid_with::<false>(src, 0);
    }
    let mask = u64::from(ty.reserved_mask());
    // Two code words per u64 (the words at bytes 2 + 8k and 6 + 8k, little-endian).
    all_valid_with::<true>(src, mask | (mask << 32))
}

/// [`all_valid`] with the reserved-bit test of the code words (`mask`) only when `CODES`.
#[inline(always)]
fn all_valid_with<const CODES: bool>(src: &[u8], mask: u64) -> bool {
    let mut bad = 0u64;
    for b in src.chunks_exact(BLOCK_BYTES) {
        let scale = u16::from_le_bytes([b[0], b[1]]);
        bad |= u64::from(scale & 0x7c00 == 0x7c00);
        if CODES {
            for k in 0..WORDS_PER_BLOCK / 2 {
                let o = 2 + 8 * k;
                let w = u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
                bad |= w & mask;
            }
        }
    }
    bad == 0
}

/// Views a row (or any run of whole blocks) as blocks. Errors if the length is ragged.
pub fn blocks(
    ty: PnType,
    row: &[u8],
) -> Result<impl ExactSizeIterator<Item = BlockRef<'_>> + '_, PnError> {
    if !row.len().is_multiple_of(BLOCK_BYTES) {
        return Err(PnError::RaggedBytes { ty, len: row.len() });
    }
    Ok(row.chunks_exact(BLOCK_BYTES).map(move |c| BlockRef {
        ty,
        bytes: c.try_into().expect("chunks_exact yields whole blocks"),
    }))
}

/// Packs one block from its scale and its codes (one per element, in element order).
/// Codes are masked to the type's width; the pn3t reserved bits stay zero.
///
/// # Panics
/// If `codes.len() != weights_per_block`.
pub fn pack_block(ty: PnType, d: f16, codes: &[u8]) -> [u8; BLOCK_BYTES] {
    assert_eq!(codes.len(), ty.weights_per_block(), "codes for one block");
    let cpw = ty.codes_per_word();
    let mask = u32::from(ty.max_code());
    let mut out = [0u8; BLOCK_BYTES];
    out[0..2].copy_from_slice(&d.to_bits().to_le_bytes());
    for (i, chunk) in codes.chunks_exact(cpw).enumerate() {
        let w = chunk.iter().enumerate().fold(0u32, |w, (t, &n)| {
            w | ((u32::from(n) & mask) << ty.code_shift(t))
        });
        out[2 + 4 * i..6 + 4 * i].copy_from_slice(&w.to_le_bytes());
    }
    out
}
