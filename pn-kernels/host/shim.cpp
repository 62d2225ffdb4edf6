// Host build of the kernels' __host__ __device__ headers, exposed to Rust tests through extern "C".
// Nothing here runs in production: it proves that the layout math the kernels use decodes the
// bytes the way the Rust reference does.
#include "ggml_blocks.cuh"
#include "kv_blocks.cuh"
#include "pn_block.cuh"
#include "delta_rule_chunked.cuh"
#include "hadamard.cuh"
#include <vector>

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

extern "C" {
// The q4_0 KV cache block: quantize 32 values into 18 bytes, and decode values 8*part.. (the
// attention loader's unit); the f32 -> f16 conversion its scale uses.
void pn_shim_q4_0_kv_quantize(const float* x, pn_u8* blk18) { q4_0_kv_quantize(x, blk18); }
void pn_shim_q4_0_kv_part8(const pn_u8* blk18, int part, float* out) { q4_0_kv_part8(blk18, part, out); }
pn_u16 pn_shim_f32_to_f16_bits(float f) { return pn_f32_to_f16_bits(f); }
}

extern "C" {
// The chunked delta rule's gate values and chunk size, as the kernel computes them.
void pn_shim_gdn_gate(float b, float al, float dt_bias, float a, float* beta, float* g) { pn_gdn_gate(b, al, dt_bias, a, beta, g); }
int pn_shim_gdn_chunk() { return PN_GDN_C; }
int pn_shim_gdn_tri_row(int idx) { return pn_gdn_tri_row(idx); }
// Forward substitution of one value column of one chunk, split 8 ways as the kernel's lanes do:
// `mc` is the PN_GDN_C x PN_GDN_MLD coefficient matrix (kk terms at pn_gdn_mkk), `u` holds the
// right-hand sides on entry and U on return (stride 1).
void pn_shim_gdn_solve(const float* mc, const float* beta, float* u, int c) {
    for (int t = 0; t < c; ++t) {
        float sum = 0.0f;
        for (int r = 0; r < 8; ++r) sum += pn_gdn_solve_partial(mc, u, 1, t, r, 8);
        u[t] = pn_gdn_solve_finish(beta[t], u[t], sum);
    }
}
// The kernel's algorithm for one value head over T tokens, serially on the host: chunks of
// PN_GDN_C, the tail shorter; same argument meaning as delta_rule_chunked_f32 with the head's
// pointers already applied (q/k/v at the head, b/al at the head's column, state 128 x 128 with
// row j holding S[.][j]).
void pn_shim_gdn_chunked_head(const float* q, const float* k, long long qk_stride, const float* v, long long v_stride,
                              const float* b, const float* al, long long ab_stride, float dt_bias, float a,
                              float* state, float* out, long long out_stride, int T) {
    const int D = PN_GDN_D, C = PN_GDN_C;
    std::vector<float> mc(C * PN_GDN_MLD), u(C * D), o(C * D), beta(C), g(C), gcum(C);
    for (int t0 = 0; t0 < T; t0 += C) {
        const int c = T - t0 < C ? T - t0 : C;
        for (int t = 0; t < c; ++t) pn_gdn_gate(b[(t0 + t) * ab_stride], al[(t0 + t) * ab_stride], dt_bias, a, &beta[t], &g[t]);
        pn_gdn_cumsum(g.data(), gcum.data(), c);
        for (int t = 0; t < c; ++t) {
            const float* kt = k + (t0 + t) * qk_stride;
            const float* qt = q + (t0 + t) * qk_stride;
            for (int s = 0; s <= t; ++s) {
                const float* ks = k + (t0 + s) * qk_stride;
                float dkk = 0.0f, dqk = 0.0f;
                for (int d = 0; d < D; ++d) {
                    dkk += kt[d] * ks[d];
                    dqk += qt[d] * ks[d];
                }
                if (s < t) mc[pn_gdn_mkk(t, s)] = pn_gdn_coef(gcum[t], gcum[s], dkk);
                mc[pn_gdn_mqk(t, s)] = pn_gdn_coef(gcum[t], gcum[s], dqk);
            }
        }
        for (int j = 0; j < D; ++j) {
            const float* sj = state + j * D;
            for (int t = 0; t < c; ++t) {
                const float* kt = k + (t0 + t) * qk_stride;
                const float* qt = q + (t0 + t) * qk_stride;
                float xk = 0.0f, xq = 0.0f;
                for (int i = 0; i < D; ++i) {
                    xk += sj[i] * kt[i];
                    xq += sj[i] * qt[i];
                }
                const float eg = pn_gdn_exp(gcum[t]);
                u[t * D + j] = v[(t0 + t) * v_stride + j] - eg * xk;
                o[t * D + j] = eg * xq;
            }
            for (int t = 0; t < c; ++t) {
                float sum = 0.0f;
                for (int r = 0; r < 8; ++r) sum += pn_gdn_solve_partial(mc.data(), u.data() + j, D, t, r, 8);
                u[t * D + j] = pn_gdn_solve_finish(beta[t], u[t * D + j], sum);
            }
            for (int t = 0; t < c; ++t) out[(t0 + t) * out_stride + j] = o[t * D + j] + pn_gdn_out_intra(mc.data(), u.data() + j, D, t);
        }
        const float glast = gcum[c - 1], el = pn_gdn_exp(glast);
        for (int j = 0; j < D; ++j) {
            float* sj = state + j * D;
            for (int i = 0; i < D; ++i) sj[i] *= el;
            for (int t = 0; t < c; ++t) {
                const float w = pn_gdn_coef(glast, gcum[t], u[t * D + j]);
                const float* kt = k + (t0 + t) * qk_stride;
                for (int i = 0; i < D; ++i) sj[i] += w * kt[i];
            }
        }
    }
}
}

extern "C" {
// First element of a Walsh-Hadamard butterfly, as hadamard.cu pairs them.
int pn_shim_fwht_first(int k, int R, int h) { return pn_fwht_first(k, R, h); }
// pn_fwht_smem's butterflies over n values in chunks of R, serially (the butterflies of a stage
// touch disjoint pairs, so their order within a stage does not matter), then the kernels' final
// scale.
void pn_shim_fwht_blocks(float* x, int n, int R, float scale) {
    for (int h = 1; h < R; h <<= 1) {
        for (int k = 0; k < n / 2; ++k) {
            const int i = pn_fwht_first(k, R, h), j = i + h;
            const float a = x[i], b = x[j];
            x[i] = a + b;
            x[j] = a - b;
        }
    }
    for (int i = 0; i < n; ++i) x[i] = x[i] * scale;
}
}

// The chunked delta-rule kernel's own source, run on the host by the SIMT emulator (every
// block, every thread, its barriers and shuffles): checks the kernel's thread mapping and
// indexing without a GPU. Last in this file: the emulator's CUDA macros stay out of the rest.
#include "simt_emu.h"
#include "delta_rule_chunked.cu"

extern "C" {
// Arguments as delta_rule_chunked_f32 plus the grid; returns 0, or -1 on a barrier deadlock.
int pn_shim_emu_delta_rule_chunked(const float* q, const float* k, long long qk_stride, const float* v, long long v_stride,
                                   const float* b, const float* al, long long ab_stride, const float* dt_bias,
                                   const float* ssm_a, float* state, float* out, long long out_stride, int n_v_heads,
                                   int n_k_heads, int T) {
    const bool ok = emu::launch((unsigned)n_v_heads, PN_GDN_D / PN_GDN_JB, DRC_THREADS, [&] {
        delta_rule_chunked_f32(q, k, qk_stride, v, v_stride, b, al, ab_stride, dt_bias, ssm_a, state, out, out_stride,
                               n_k_heads, T);
    });
    return ok ? 0 : -1;
}
}

// The tiled prefill attention kernel's own source under the same emulator.
#include "attention_prefill.cu"
#include <mutex>

extern "C" {
// Arguments as attn_prefill_*kv (kv_type 0 f32, 1 f16 bits, 2 q8_0 bytes, 3 q4_0 bytes) plus
// n_head for the grid; returns 0, -1 on a barrier deadlock, -2 on an unknown kv_type.
int pn_shim_emu_attn_prefill(int kv_type, const float* q, long long q_tok_stride, long long q_head_stride, const void* kc,
                             const void* vc, long long pos_stride, long long head_stride, int n_head, int group, int p0,
                             int n_tokens, float scale, float* o, long long o_tok_stride) {
    // The kernel's __shared__ tiles are process-wide statics here; parallel Rust tests take turns.
    static std::mutex lock;
    std::lock_guard<std::mutex> guard(lock);
    const unsigned tiles = (unsigned)((n_tokens + AP_BQ - 1) / AP_BQ);
    std::function<void()> body;
    switch (kv_type) {
    case 0:
        body = [&] { attn_prefill_f32kv(q, q_tok_stride, q_head_stride, (const float*)kc, (const float*)vc, pos_stride, head_stride, group, p0, n_tokens, scale, o, o_tok_stride); };
        break;
    case 1:
        body = [&] { attn_prefill_f16kv(q, q_tok_stride, q_head_stride, (const pn_u16*)kc, (const pn_u16*)vc, pos_stride, head_stride, group, p0, n_tokens, scale, o, o_tok_stride); };
        break;
    case 2:
        body = [&] { attn_prefill_q8_0kv(q, q_tok_stride, q_head_stride, (const ap_q8kv*)kc, (const ap_q8kv*)vc, pos_stride, head_stride, group, p0, n_tokens, scale, o, o_tok_stride); };
        break;
    case 3:
        body = [&] { attn_prefill_q4_0kv(q, q_tok_stride, q_head_stride, (const ap_q4kv*)kc, (const ap_q4kv*)vc, pos_stride, head_stride, group, p0, n_tokens, scale, o, o_tok_stride); };
        break;
    default:
        return -2;
    }
    return emu::launch(tiles, (unsigned)n_head, AP_THREADS, body) ? 0 : -1;
}
}
