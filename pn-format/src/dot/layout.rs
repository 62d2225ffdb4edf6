//! Where each activation goes in the prepared (kernel-order) buffers.
//!
//! Element `e` of a block sits in word `i = e / codes_per_word` at local index `t = e %
//! codes_per_word`, pair `j = t >> 1`, half `h = t & 1` (low or high 16 bits).
//!
//! - f32: per block, per pair `j`, 16 lanes: lanes 0..8 are the low-half codes of words 0..7,
//!   lanes 8..16 the high-half codes. The kernels mask the code in place (`w & (mask << BITS*j)`
//!   for the low half; the same after `w >> 16` for the high half), which yields `n * 2^(BITS*j)`,
//!   so the activation is stored pre-multiplied by `2^-(BITS*j)` (exact unless it is subnormal).
//! - i16: per pair of blocks, per pair `j`, 32 lanes: 16 for the even block then 16 for the odd
//!   block; within a block lane `2i + h` (the order of the 16-bit halves of words 0..7), which is
//!   what `(w >> BITS*j) & (mask * 0x10001)` produces.

use crate::types::PnType;

/// Index of element `e` within its block's 80/64 f32 slots, and the factor it is stored with.
pub fn f32_slot(ty: PnType, e: usize) -> (usize, f32) {
    let cpw = ty.codes_per_word();
    let (i, t) = (e / cpw, e % cpw);
    let (j, h) = (t >> 1, t & 1);
    let scale = f32::from_bits((127 - ty.bits() * j as u32) << 23);
    (16 * j + 8 * h + i, scale)
}

/// Global index of element `e` of block `b` in the i16 buffer.
pub fn i16_index(ty: PnType, b: usize, e: usize) -> usize {
    let cpw = ty.codes_per_word();
    let s = ty.pairs_per_word();
    let (i, t) = (e / cpw, e % cpw);
    let (j, h) = (t >> 1, t & 1);
    (b >> 1) * s * 32 + j * 32 + (b & 1) * 16 + 2 * i + h
}
