//! The kernels' `__host__ __device__` headers compiled as host C++ (`host/shim.cpp`), for the
//! CPU-side tests of the layout math. Not a production API.
#![allow(missing_docs)]

extern "C" {
    pub fn pn_shim_pn_dequant_pair_block(
        bits: i32,
        pair68: *const u8,
        blk: i32,
        out: *mut f32,
    ) -> i32;
    pub fn pn_shim_pn_block_dot_f32(bits: i32, pair68: *const u8, blk: i32, x: *const f32) -> f32;
    pub fn pn_shim_pn_elem_bytes(bits: i32, blk: *const u8, e: i32) -> f32;
    pub fn pn_shim_pn_pair_word(pair68: *const u8, blk: i32, i: i32) -> u32;
    pub fn pn_shim_pn_pair_scale_bits(pair68: *const u8, blk: i32) -> u16;
    pub fn pn_shim_pn_code_pair_h2bits(bits: i32, w: u32, j: i32) -> u32;
    pub fn pn_shim_pn_zero_h2bits(bits: i32) -> u32;
    pub fn pn_shim_pn_row_pairs(g0: u64, nb: u64, first: *mut u64, end: *mut u64);
    pub fn pn_shim_pn_block_in_row(q: u64, blk: i32, g0: u64, nb: u64) -> i32;
    pub fn pn_shim_f16_to_f32(h: u16) -> f32;
    pub fn pn_shim_q8_0_elem(b: *const u8, e: i32) -> f32;
    pub fn pn_shim_q4_k_elem(b: *const u8, e: i32) -> f32;
    pub fn pn_shim_q3_k_elem(b: *const u8, e: i32) -> f32;
    pub fn pn_shim_q4_k_scale_min_words(
        s0: u32,
        s1: u32,
        s2: u32,
        j: i32,
        sc: *mut i32,
        m: *mut i32,
    );
    pub fn pn_shim_q4_k_scale_min(s: *const u8, j: i32, sc: *mut i32, m: *mut i32);
}

/// Safe wrappers: each checks the buffer sizes the C side reads.
pub mod safe {
    use super::*;

    /// Decode block `blk` (0/1) of a 68-byte pair of PN blocks (`bits` 3 or 4).
    pub fn pn_dequant_pair_block(bits: u32, pair: &[u8; 68], blk: usize) -> Vec<f32> {
        assert!(bits == 3 || bits == 4);
        let mut out = vec![0.0f32; if bits == 3 { 80 } else { 64 }];
        // SAFETY: pair is 68 bytes, out holds one block's elements.
        unsafe {
            pn_shim_pn_dequant_pair_block(bits as i32, pair.as_ptr(), blk as i32, out.as_mut_ptr())
        };
        out
    }
    /// fp32 block dot in element order with the scale factored out.
    pub fn pn_block_dot_f32(bits: u32, pair: &[u8; 68], blk: usize, x: &[f32]) -> f32 {
        assert!(x.len() >= if bits == 3 { 80 } else { 64 });
        // SAFETY: sizes checked above.
        unsafe { pn_shim_pn_block_dot_f32(bits as i32, pair.as_ptr(), blk as i32, x.as_ptr()) }
    }
    /// Element `e` of one 34-byte block.
    pub fn pn_elem_bytes(bits: u32, block: &[u8; 34], e: usize) -> f32 {
        assert!(e < if bits == 3 { 80 } else { 64 });
        // SAFETY: the block is 34 bytes and e is in range.
        unsafe { pn_shim_pn_elem_bytes(bits as i32, block.as_ptr(), e as i32) }
    }
    /// Word `i` (0..8) of block `blk` of a pair, as the kernels extract it.
    pub fn pn_pair_word(pair: &[u8; 68], blk: usize, i: usize) -> u32 {
        assert!(blk < 2 && i < 8);
        // SAFETY: 68-byte pair, indices in range.
        unsafe { pn_shim_pn_pair_word(pair.as_ptr(), blk as i32, i as i32) }
    }
    /// Scale bits of block `blk` of a pair.
    pub fn pn_pair_scale_bits(pair: &[u8; 68], blk: usize) -> u16 {
        assert!(blk < 2);
        // SAFETY: 68-byte pair.
        unsafe { pn_shim_pn_pair_scale_bits(pair.as_ptr(), blk as i32) }
    }
    /// Half2 bits of code pair `j` of a word (exponent trick).
    pub fn pn_code_pair_h2bits(bits: u32, w: u32, j: usize) -> u32 {
        // SAFETY: pure function.
        unsafe { pn_shim_pn_code_pair_h2bits(bits as i32, w, j as i32) }
    }
    /// Half2 bits of (1024 + z, 1024 + z).
    pub fn pn_zero_h2bits(bits: u32) -> u32 {
        // SAFETY: pure function.
        unsafe { pn_shim_pn_zero_h2bits(bits as i32) }
    }
    /// Pair range `[first, end)` of a row starting at global block `g0` with `nb` blocks.
    pub fn pn_row_pairs(g0: u64, nb: u64) -> (u64, u64) {
        let (mut a, mut b) = (0, 0);
        // SAFETY: writes two u64 outputs.
        unsafe { pn_shim_pn_row_pairs(g0, nb, &mut a, &mut b) };
        (a, b)
    }
    /// Whether block `blk` of pair `q` belongs to the row.
    pub fn pn_block_in_row(q: u64, blk: usize, g0: u64, nb: u64) -> bool {
        // SAFETY: pure function.
        unsafe { pn_shim_pn_block_in_row(q, blk as i32, g0, nb) != 0 }
    }
    /// f16 bits to f32.
    pub fn f16_to_f32(h: u16) -> f32 {
        // SAFETY: pure function.
        unsafe { pn_shim_f16_to_f32(h) }
    }
    /// Element `e` of a Q8_0 block (34 bytes).
    pub fn q8_0_elem(b: &[u8], e: usize) -> f32 {
        assert!(b.len() >= 34 && e < 32);
        // SAFETY: size checked.
        unsafe { pn_shim_q8_0_elem(b.as_ptr(), e as i32) }
    }
    /// Element `e` of a Q4_K block (144 bytes).
    pub fn q4_k_elem(b: &[u8], e: usize) -> f32 {
        assert!(b.len() >= 144 && e < 256);
        // SAFETY: size checked.
        unsafe { pn_shim_q4_k_elem(b.as_ptr(), e as i32) }
    }
    /// Element `e` of a Q3_K block (110 bytes).
    pub fn q3_k_elem(b: &[u8], e: usize) -> f32 {
        assert!(b.len() >= 110 && e < 256);
        // SAFETY: size checked.
        unsafe { pn_shim_q3_k_elem(b.as_ptr(), e as i32) }
    }
    /// Q4_K (scale, min) of sub-block `j` from the 12 scale bytes, and from them as three words.
    pub fn q4_k_scale_min_both(s: &[u8; 12], j: usize) -> ((i32, i32), (i32, i32)) {
        assert!(j < 8);
        let w = |i: usize| u32::from_le_bytes(s[4 * i..4 * i + 4].try_into().unwrap());
        let (mut a, mut b, mut c, mut d) = (0, 0, 0, 0);
        // SAFETY: 12 readable bytes, j in range, four i32 outputs.
        unsafe {
            pn_shim_q4_k_scale_min(s.as_ptr(), j as i32, &mut a, &mut b);
            pn_shim_q4_k_scale_min_words(w(0), w(1), w(2), j as i32, &mut c, &mut d);
        }
        ((a, b), (c, d))
    }
}
