// Host build of the kernels' __host__ __device__ headers, exposed to Rust tests through extern "C".
// Nothing here runs in production: it proves that the layout math the kernels use decodes the
// bytes the way the Rust reference does.
#include "ggml_blocks.cuh"
#include "pn_block.cuh"

extern "C" {
// Decode block `blk` (0/1) of a pair of PN blocks (68 bytes, copied into 17 aligned words).
int pn_shim_pn_dequant_pair_block(int bits, const pn_u8* pair68, int blk, float* out) {
    pn_u32 p[PN_PAIR_WORDS];
    std::memcpy(p, pair68, 68);
    if (bits == 3) pn_dequant_block<3>(p, blk, out);
    else if (bits == 4) pn_dequant_block<4>(p, blk, out);
    else return -1;
    return 0;
}
// Scale-factored fp32 block dot in element order.
float pn_shim_pn_block_dot_f32(int bits, const pn_u8* pair68, int blk, const float* x) {
    pn_u32 p[PN_PAIR_WORDS];
    std::memcpy(p, pair68, 68);
    return bits == 3 ? pn_block_dot_f32<3>(p, blk, x) : pn_block_dot_f32<4>(p, blk, x);
}
// Element e of a block at any byte address.
float pn_shim_pn_elem_bytes(int bits, const pn_u8* blk, int e) {
    return bits == 3 ? pn_elem_bytes<3>(blk, e) : pn_elem_bytes<4>(blk, e);
}
// Word i of block `blk` of a pair, as the kernels extract it.
pn_u32 pn_shim_pn_pair_word(const pn_u8* pair68, int blk, int i) {
    pn_u32 p[PN_PAIR_WORDS];
    std::memcpy(p, pair68, 68);
    return pn_pair_word(p, blk, i);
}
pn_u16 pn_shim_pn_pair_scale_bits(const pn_u8* pair68, int blk) {
    pn_u32 p[PN_PAIR_WORDS];
    std::memcpy(p, pair68, 68);
    return pn_pair_scale_bits(p, blk);
}
pn_u32 pn_shim_pn_code_pair_h2bits(int bits, pn_u32 w, int j) {
    return bits == 3 ? pn_code_pair_h2bits<3>(w, j) : pn_code_pair_h2bits<4>(w, j);
}
pn_u32 pn_shim_pn_zero_h2bits(int bits) { return bits == 3 ? pn_zero_h2bits<3>() : pn_zero_h2bits<4>(); }
// Pair range of a row and membership of a block, as the any-shape kernels iterate.
void pn_shim_pn_row_pairs(pn_u64 g0, pn_u64 nb, pn_u64* first, pn_u64* end) {
    *first = pn_row_first_pair(g0);
    *end = pn_row_end_pair(g0, nb);
}
int pn_shim_pn_block_in_row(pn_u64 q, int blk, pn_u64 g0, pn_u64 nb) { return pn_block_in_row(q, blk, g0, nb) ? 1 : 0; }
float pn_shim_f16_to_f32(pn_u16 h) { return pn_f16_to_f32(h); }
float pn_shim_q8_0_elem(const pn_u8* b, int e) { return q8_0_elem(b, e); }
float pn_shim_q4_k_elem(const pn_u8* b, int e) { return q4_k_elem(b, e); }
float pn_shim_q3_k_elem(const pn_u8* b, int e) { return q3_k_elem(b, e); }
}

extern "C" {
// Q4_K scale/min from the three scale words (the form the gemv kernel uses) vs from bytes.
void pn_shim_q4_k_scale_min_words(pn_u32 s0, pn_u32 s1, pn_u32 s2, int j, int* sc, int* m) { q4_k_scale_min_words(s0, s1, s2, j, sc, m); }
void pn_shim_q4_k_scale_min(const pn_u8* s, int j, int* sc, int* m) { q4_k_scale_min(s, j, sc, m); }
}
