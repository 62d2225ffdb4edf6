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
//! - i8 (the int8 decode kernel, `x86_i8`): per pair of blocks, per extraction `m` (3 for pn3t,
//!   2 for pn4t), 64 bytes, one per byte of the two blocks' 8 code qwords (even block first).
//!   Extraction `m` puts into byte `k` of every qword one code of that qword
//!   ([`i8_slot_offset`]); the kernel multiplies it with the activation byte at the same place.
//!   pn3t's 20 codes per qword fill 20 of its 24 slots (the other 4 hold activation 0).

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

/// Extractions (byte picks per code qword) of the int8 kernel: 20 pn3t codes per qword take
/// three picks of 8 bytes (the third half empty), 16 pn4t codes two.
pub const fn i8_extractions(ty: PnType) -> usize {
    match ty {
        PnType::Pn3t => 3,
        PnType::Pn4t => 2,
    }
}

/// pn3t: the local code index `t` (in its word) that byte `r` of each dword takes in
/// extraction `m` (`None`: unused). Each half's low byte holds codes 0 and 1 (`t` = `h`,
/// `2 + h` for half `h`) at bits 0 and 3; its high byte, after a 16-bit shift by one, codes 3
/// and 4 (`6 + h`, `8 + h`) at bits 0 and 3. Extraction 0 takes the codes at bit 0 of those
/// four bytes, extraction 1 those at bit 3; extraction 2 takes code 2 (`4 + h`), which
/// straddles the bytes, from each plain half shifted by 6. (The kernel implements it; the tests
/// check it against [`i8_index`].)
#[cfg(test)]
const PN3T_I8_CODES: [[Option<usize>; 4]; 3] = [
    [Some(0), Some(6), Some(1), Some(7)],
    [Some(2), Some(8), Some(3), Some(9)],
    [Some(4), None, Some(5), None],
];

/// The inverse of [`PN3T_I8_CODES`]: `(m, r)` of local code `t` (checked by the tests).
const PN3T_I8_SLOTS: [(usize, usize); 10] = [
    (0, 0),
    (0, 2),
    (1, 0),
    (1, 2),
    (2, 0),
    (2, 2),
    (0, 1),
    (0, 3),
    (1, 1),
    (1, 3),
];

/// Bit offset, within its qword, of the code that byte `k` of extraction `m` takes (`None`: an
/// unused slot, whose activation is 0). pn4t: `8k + 4m`, the low then the high nibble of each
/// byte (a byte mask, then a 16-bit shift by 4 and the mask). pn3t: see [`PN3T_I8_CODES`].
#[cfg(test)]
pub fn i8_slot_offset(ty: PnType, m: usize, k: usize) -> Option<u32> {
    if k >= 8 || m >= i8_extractions(ty) {
        return None;
    }
    match ty {
        PnType::Pn4t => Some(8 * k as u32 + 4 * m as u32),
        PnType::Pn3t => PN3T_I8_CODES[m][k % 4].map(|t| 32 * (k / 4) as u32 + ty.code_shift(t)),
    }
}

/// Global index of element `e` of block `b` in the i8 buffer (the inverse of
/// [`i8_slot_offset`]).
pub fn i8_index(ty: PnType, b: usize, e: usize) -> usize {
    let cpw = ty.codes_per_word();
    let (i, t) = (e / cpw, e % cpw);
    let (q, w) = (i / 2, i % 2);
    let (m, k) = match ty {
        PnType::Pn4t => {
            let o = 32 * w + ty.code_shift(t) as usize;
            ((o % 8) / 4, o / 8)
        }
        PnType::Pn3t => {
            let (m, r) = PN3T_I8_SLOTS[t];
            (m, 4 * w + r)
        }
    };
    (b >> 1) * i8_extractions(ty) * 64 + m * 64 + (b & 1) * 32 + q * 8 + k
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element of a block pair has its own i8 slot, and the slot's offset points back at
    /// the element's code: the layout the kernel and the preparation share is a bijection.
    #[test]
    fn i8_slots_hold_every_code_once() {
        for ty in PnType::ALL {
            let bpw = ty.weights_per_block();
            let e_count = i8_extractions(ty);
            let mut seen = vec![false; e_count * 64];
            for b in 0..2 {
                for e in 0..bpw {
                    let idx = i8_index(ty, b, e);
                    assert!(!seen[idx], "{ty}: slot {idx} taken twice");
                    seen[idx] = true;
                    let (m, byte) = (idx / 64, idx % 64);
                    assert_eq!(byte / 32, b, "{ty}: element in the wrong block half");
                    let (q, k) = ((byte % 32) / 8, byte % 8);
                    let cpw = ty.codes_per_word();
                    let (i, t) = (e / cpw, e % cpw);
                    let want = 32 * (i % 2) as u32 + ty.code_shift(t);
                    assert_eq!(q, i / 2, "{ty}: element {e} in the wrong qword");
                    assert_eq!(i8_slot_offset(ty, m, k), Some(want), "{ty}: e={e}");
                }
            }
            let used = seen.iter().filter(|&&s| s).count();
            assert_eq!(used, 2 * bpw);
            let slots = (0..e_count)
                .flat_map(|m| (0..8).map(move |k| (m, k)))
                .filter(|&(m, k)| i8_slot_offset(ty, m, k).is_some())
                .count();
            assert_eq!(slots * 8, 2 * bpw, "{ty}: used slots per qword");
        }
    }

    /// Both layouts place an element at its block's offset plus its own offset in the block,
    /// whatever the block: `PreparedI16::update` computes the second once per call.
    #[test]
    fn slots_are_block_offset_plus_element_offset() {
        type Index = fn(PnType, usize, usize) -> usize;
        let layouts: [(&str, Index); 2] = [("i16", i16_index), ("i8", i8_index)];
        for ty in PnType::ALL {
            for (name, index) in layouts {
                for b in 0..7 {
                    for e in 0..ty.weights_per_block() {
                        assert_eq!(
                            index(ty, b, e),
                            index(ty, b, 0) - index(ty, 0, 0) + index(ty, 0, e),
                            "{ty} {name}: block {b} element {e}"
                        );
                    }
                }
            }
        }
    }
}
