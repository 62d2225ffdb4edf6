//! AVX-512 decode: 16 weights per register, straight into element order. Each lane picks its
//! word with `vpermd` and its code with a per-lane shift (`vpsrlvd`); the lane tables are fixed
//! per type. Same arithmetic as the scalar path (`d * (n - z) as f32`), so results are identical.
//!
//! Safety contract: the CPU has AVX-512F; `src` holds whole blocks and `dst` exactly their weights.

use crate::types::{PnType, BLOCK_BYTES};
use std::arch::x86_64::*;

/// Word index and bit shift of each of the `weights_per_block` elements, as i32 lane tables.
fn tables(ty: PnType) -> ([i32; 80], [i32; 80]) {
    let cpw = ty.codes_per_word();
    let mut word = [0i32; 80];
    let mut shift = [0i32; 80];
    for e in 0..ty.weights_per_block() {
        word[e] = (e / cpw) as i32;
        shift[e] = ty.code_shift(e % cpw) as i32;
    }
    (word, shift)
}

pub unsafe fn dequantize_avx512(ty: PnType, src: &[u8], dst: &mut [f32]) {
    match ty {
        PnType::Pn3t => decode::<5>(ty, src, dst),
        PnType::Pn4t => decode::<4>(ty, src, dst),
    }
}

/// `V` registers of 16 weights per block (5 for pn3t, 4 for pn4t).
#[target_feature(enable = "avx512f,avx2,f16c")]
unsafe fn decode<const V: usize>(ty: PnType, src: &[u8], dst: &mut [f32]) {
    let (word, shift) = tables(ty);
    let idx: [__m512i; V] =
        std::array::from_fn(|v| _mm512_loadu_si512(word.as_ptr().add(16 * v) as *const _));
    let sh: [__m512i; V] =
        std::array::from_fn(|v| _mm512_loadu_si512(shift.as_ptr().add(16 * v) as *const _));
    let mask = _mm512_set1_epi32(i32::from(ty.max_code()));
    let z = _mm512_set1_epi32(ty.zero_point());
    let bpw = 16 * V;
    for (blk, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(bpw)) {
        let p = blk.as_ptr();
        let h = std::ptr::read_unaligned(p as *const u16);
        let d = _mm512_set1_ps(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h)))));
        let w = _mm512_zextsi256_si512(_mm256_loadu_si256(p.add(2) as *const __m256i));
        let o = out.as_mut_ptr();
        for v in 0..V {
            let words = _mm512_permutexvar_epi32(idx[v], w);
            let n = _mm512_and_si512(_mm512_srlv_epi32(words, sh[v]), mask);
            let vals = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(n, z)));
            _mm512_storeu_ps(o.add(16 * v), vals);
        }
    }
}
