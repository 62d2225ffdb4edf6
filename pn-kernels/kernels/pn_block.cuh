// PN block layout (pn3t, pn4t) as __host__ __device__ functions: the host shim tests them against
// the Rust reference, the kernels use them unchanged.
//
// Two consecutive blocks are 68 bytes = 17 aligned u32 words ("a pair"); a tensor base is 4-byte
// aligned, so pair p starts at word 17*p. Block 0 of the pair: scale = low half of word 0, its
// word i = bytes 2+4i.. = funnel shift of words i and i+1 by 16. Block 1: scale = high half of
// word 8, its word i = word 9+i (aligned).
#pragma once
#include "common.cuh"

#define PN_PAIR_WORDS 17

template <int BITS> struct PnTraits;
template <> struct PnTraits<3> {
    static constexpr int Z = 4;            // zero point
    static constexpr int WEIGHTS = 80;     // per block
    static constexpr int PER_WORD = 10;    // codes per u32 word
    static constexpr int PAIRS = 5;        // code pairs per word
    static constexpr pn_u32 MASK = 0x00070007u;
};
template <> struct PnTraits<4> {
    static constexpr int Z = 8;
    static constexpr int WEIGHTS = 64;
    static constexpr int PER_WORD = 8;
    static constexpr int PAIRS = 4;
    static constexpr pn_u32 MASK = 0x000F000Fu;
};

// (lo >> 16) | (hi << 16): on sm_60 one SHF instruction.
PN_HD pn_u32 pn_funnel_r16(pn_u32 lo, pn_u32 hi) {
#if defined(__CUDA_ARCH__)
    return __funnelshift_r(lo, hi, 16);
#else
    return (lo >> 16) | (hi << 16);
#endif
}

// Word i (0..8) of block `blk` (0 = even, 1 = odd) of a pair held as 17 words.
PN_HD pn_u32 pn_pair_word(const pn_u32* p, int blk, int i) {
    return blk == 0 ? pn_funnel_r16(p[i], p[i + 1]) : p[9 + i];
}

// f16 bits of the scale of block `blk` of a pair.
PN_HD pn_u16 pn_pair_scale_bits(const pn_u32* p, int blk) {
    return blk == 0 ? (pn_u16)(p[0] & 0xffffu) : (pn_u16)(p[8] >> 16);
}

// Code of local index t (0..PER_WORD) of a word: shift BITS*(t>>1) + 16*(t&1).
template <int BITS> PN_HD int pn_code(pn_u32 w, int t) {
    return (int)((w >> (BITS * (t >> 1) + 16 * (t & 1))) & ((1u << BITS) - 1u));
}

// Code pair j (elements 2j, 2j+1 of the word) as the bits of a half2 holding (1024+n0, 1024+n1):
// the exponent trick, 0x6400 is fp16 1024 whose ulp is 1, so OR-ing n into the mantissa adds n.
template <int BITS> PN_HD pn_u32 pn_code_pair_h2bits(pn_u32 w, int j) {
    return ((w >> (BITS * j)) & PnTraits<BITS>::MASK) | 0x64006400u;
}

// f16 bits of 1024 + z in both halves: subtracting it from the pair above gives n - z exactly.
template <int BITS> PN_HD pn_u32 pn_zero_h2bits() {
    return 0x64006400u | ((pn_u32)PnTraits<BITS>::Z << 16) | (pn_u32)PnTraits<BITS>::Z;
}

// Decode block `blk` of a pair: out[e] = d * (n - z), exact in f32.
template <int BITS> PN_HD void pn_dequant_block(const pn_u32* p, int blk, float* out) {
    typedef PnTraits<BITS> T;
    const float d = pn_f16_to_f32(pn_pair_scale_bits(p, blk));
    for (int i = 0; i < 8; ++i) {
        const pn_u32 w = pn_pair_word(p, blk, i);
        for (int t = 0; t < T::PER_WORD; ++t)
            out[i * T::PER_WORD + t] = pn_mul(d, (float)(pn_code<BITS>(w, t) - T::Z));
    }
}

// Element e (0..WEIGHTS) of block `blk` of a pair, for gathers and tiled loads.
template <int BITS> PN_HD float pn_block_elem(const pn_u32* p, int blk, int e) {
    typedef PnTraits<BITS> T;
    const float d = pn_f16_to_f32(pn_pair_scale_bits(p, blk));
    const pn_u32 w = pn_pair_word(p, blk, e / T::PER_WORD);
    return pn_mul(d, (float)(pn_code<BITS>(w, e % T::PER_WORD) - T::Z));
}

// Element e of a block given by its byte address (any alignment): for kernels that do not work
// in pairs (the prefill matmul tiles).
template <int BITS> PN_HD float pn_elem_bytes(const pn_u8* blk, int e) {
    typedef PnTraits<BITS> T;
    const float d = pn_f16_to_f32(pn_load_u16(blk));
    const pn_u32 w = pn_load_u32(blk + 2 + 4 * (e / T::PER_WORD));
    return pn_mul(d, (float)(pn_code<BITS>(w, e % T::PER_WORD) - T::Z));
}

// Exact-order f32 block dot with the scale factored out: d * sum_e (n_e - z) * x_e, the sum a
// chain of FMAs in element order. The reference the fast half2 path is measured against, and the
// per-block step of the `pn_gemv_*_f32` kernels.
template <int BITS> PN_HD float pn_block_dot_f32(const pn_u32* p, int blk, const float* x) {
    typedef PnTraits<BITS> T;
    const float d = pn_f16_to_f32(pn_pair_scale_bits(p, blk));
    float s = 0.0f;
    for (int i = 0; i < 8; ++i) {
        const pn_u32 w = pn_pair_word(p, blk, i);
        for (int t = 0; t < T::PER_WORD; ++t)
            s = pn_fma((float)(pn_code<BITS>(w, t) - T::Z), x[i * T::PER_WORD + t], s);
    }
    return pn_mul(d, s);
}

// Pair index math for a row that starts at global block g0 and has nb blocks: the pairs it
// touches are [g0/2, (g0+nb+1)/2); block `blk` of pair q belongs to the row when
// g0 <= 2q+blk < g0+nb, and its first activation index is (2q+blk-g0)*WEIGHTS.
PN_HD pn_u64 pn_row_first_pair(pn_u64 g0) { return g0 >> 1; }
PN_HD pn_u64 pn_row_end_pair(pn_u64 g0, pn_u64 nb) { return (g0 + nb + 1) >> 1; }
PN_HD bool pn_block_in_row(pn_u64 q, int blk, pn_u64 g0, pn_u64 nb) {
    const pn_u64 g = 2 * q + (pn_u64)blk;
    return g >= g0 && g < g0 + nb;
}
