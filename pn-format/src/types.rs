//! The two PN block types and their constants.

use std::fmt;

/// Bytes in every PN block: a 2-byte fp16 scale followed by eight little-endian u32 words.
pub const BLOCK_BYTES: usize = 34;

/// Number of u32 code words in a block.
pub const WORDS_PER_BLOCK: usize = 8;

/// A PN weight type (PNX-FORMAT-v0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PnType {
    /// 3-bit codes, 80 weights per 34-byte block (3.40 bits per weight), ggml id 124.
    Pn3t,
    /// 4-bit codes, 64 weights per 34-byte block (4.25 bits per weight), ggml id 125.
    Pn4t,
}

impl PnType {
    /// Both types, in id order.
    pub const ALL: [PnType; 2] = [PnType::Pn3t, PnType::Pn4t];

    /// Weights per block: 80 (pn3t) or 64 (pn4t).
    pub const fn weights_per_block(self) -> usize {
        match self {
            PnType::Pn3t => 80,
            PnType::Pn4t => 64,
        }
    }

    /// Bytes per block: always 34.
    pub const fn block_bytes(self) -> usize {
        BLOCK_BYTES
    }

    /// Bits per code: 3 or 4.
    pub const fn bits(self) -> u32 {
        match self {
            PnType::Pn3t => 3,
            PnType::Pn4t => 4,
        }
    }

    /// Zero point `z = 2^(bits-1)`: 4 or 8. A code `n` decodes to `d * (n - z)`.
    pub const fn zero_point(self) -> i32 {
        1 << (self.bits() - 1)
    }

    /// Largest code, `2z - 1`: 7 or 15.
    pub const fn max_code(self) -> u8 {
        (2 * self.zero_point() - 1) as u8
    }

    /// Codes per u32 word: 10 (pn3t, five pairs) or 8 (pn4t, four pairs).
    pub const fn codes_per_word(self) -> usize {
        self.weights_per_block() / WORDS_PER_BLOCK
    }

    /// Code pairs per word (one even code in the low half, one odd code in the high half).
    pub const fn pairs_per_word(self) -> usize {
        self.codes_per_word() / 2
    }

    /// Bits of every word that must be zero: bits 15 and 31 for pn3t, none for pn4t.
    pub const fn reserved_mask(self) -> u32 {
        match self {
            PnType::Pn3t => 0x8000_8000,
            PnType::Pn4t => 0,
        }
    }

    /// The type id in this engine's ggml fork: 124 (pn3t) or 125 (pn4t).
    pub const fn ggml_id(self) -> u32 {
        match self {
            PnType::Pn3t => 124,
            PnType::Pn4t => 125,
        }
    }

    /// The type for a ggml id, if it is a PN id.
    pub const fn from_ggml_id(id: u32) -> Option<PnType> {
        match id {
            124 => Some(PnType::Pn3t),
            125 => Some(PnType::Pn4t),
            _ => None,
        }
    }

    /// The type's name as GGUF tools print it: `"pn3t"` or `"pn4t"`.
    pub const fn name(self) -> &'static str {
        match self {
            PnType::Pn3t => "pn3t",
            PnType::Pn4t => "pn4t",
        }
    }

    /// Bit position of the code with local index `t` (0..codes_per_word) inside its word:
    /// `BITS * (t >> 1) + 16 * (t & 1)`. Even codes fill the low half-word, odd codes the high.
    pub const fn code_shift(self, t: usize) -> u32 {
        self.bits() * (t as u32 >> 1) + 16 * (t as u32 & 1)
    }

    /// Bytes of a row of `k` weights, or `None` if `k` is not a whole number of blocks.
    pub const fn row_bytes(self, k: usize) -> Option<usize> {
        if !k.is_multiple_of(self.weights_per_block()) {
            return None;
        }
        Some(k / self.weights_per_block() * BLOCK_BYTES)
    }
}

impl fmt::Display for PnType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
