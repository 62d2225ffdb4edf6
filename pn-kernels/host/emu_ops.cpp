// The remaining kernel sources run on the host by the SIMT emulator (see emu_pn_gemv.cpp for
// the scheme): matmul.cu (tiled prefill product), rope.cu, conv1d.cu, delta_rule.cu,
// get_rows.cu, elementwise.cu, topk.cu and q4k_batch.cu (the small-batch Q4_K / Q8_0 GEMVs). Each file sits in its own namespace; `__global__` is
// `static` here so that these copies of the entry points have internal linkage and cannot clash
// with another host file that includes the same source.
#include "common.cuh"
// Before the namespaces: conv1d.cu and delta_rule.cu both use these headers.
#include "conv1d.cuh"
#include "ggml_blocks.cuh"
#include "rowsync.cuh"
#include "pn_block.cuh"
#include "q4k_lane.cuh"
#include <cstring>

#undef __global__
// inline: a kernel no launch below calls (delta_rule.cu's conv variant, emu_delta_conv.cpp's)
// is no unused-function warning.
#define __global__ static inline

namespace kmm {
#include "matmul.cu"
}
namespace krope {
#include "rope.cu"
}
namespace kconv {
#include "conv1d.cu"
}
namespace kdr {
#include "delta_rule.cu"
}
namespace kgr {
#include "get_rows.cu"
}
namespace kew {
#include "elementwise.cu"
}
namespace ktk {
#include "topk.cu"
}
namespace kqb {
#include "q4k_batch.cu"
}

#undef __global__
#define __global__

extern "C" {
// matmul_*w (type 0 f32, 1 f16, 2 q8_0, 3 q4_K, 4 q3_K, 5 pn3t, 6 pn4t) on the wrapper's grid
// (ceil(N/64), ceil(T/64)), 256 threads. Returns 0, -1 deadlock, -2 bad type.
int pn_emu_matmul(int type, const void* w, long long row_bytes, const float* x, long long x_stride, float* y,
                  long long y_stride, int N, int K, int T) {
    using namespace kmm;
    const pn_u8* wb = (const pn_u8*)w;
    std::function<void()> body;
    switch (type) {
    case 0: body = [&] { matmul_f32w(wb, row_bytes, x, x_stride, y, y_stride, N, K, T); }; break;
    case 1: body = [&] { matmul_f16w(wb, row_bytes, x, x_stride, y, y_stride, N, K, T); }; break;
    case 2: body = [&] { matmul_q8_0w(wb, row_bytes, x, x_stride, y, y_stride, N, K, T); }; break;
    case 3: body = [&] { matmul_q4_kw(wb, row_bytes, x, x_stride, y, y_stride, N, K, T); }; break;
    case 4: body = [&] { matmul_q3_kw(wb, row_bytes, x, x_stride, y, y_stride, N, K, T); }; break;
    case 5: body = [&] { matmul_pn3tw(wb, row_bytes, x, x_stride, y, y_stride, N, K, T); }; break;
    case 6: body = [&] { matmul_pn4tw(wb, row_bytes, x, x_stride, y, y_stride, N, K, T); }; break;
    default: return -2;
    }
    const unsigned gx = (unsigned)((N + 63) / 64), gy = (unsigned)((T + 63) / 64);
    return emu::launch3(EmuDim3{gx, gy, 1}, 256, 0, body) ? 0 : -1;
}

// rope_neox_f32 on grid (n_heads, grid_y), n_rot/2 threads (grid_y may be below n_tokens: the
// kernel strides).
int pn_emu_rope(float* x, long long tok_stride, long long head_stride, const int* pos, int pos0, int n_rot, float base,
                int n_tokens, int n_heads, unsigned grid_y) {
    std::function<void()> body = [&] { krope::rope_neox_f32(x, tok_stride, head_stride, pos, pos0, n_rot, base, n_tokens); };
    return emu::launch3(EmuDim3{(unsigned)n_heads, grid_y, 1}, (unsigned)(n_rot / 2), 0, body) ? 0 : -1;
}

// conv1d_silu_f32 on the wrapper's grid ceil(C/256) x 256 threads.
int pn_emu_conv1d(const float* u, long long u_stride, float* state, const float* w, float* y, long long y_stride, int C,
                  int T) {
    std::function<void()> body = [&] { kconv::conv1d_silu_f32(u, u_stride, state, w, y, y_stride, C, T); };
    return emu::launch3(EmuDim3{(unsigned)((C + 255) / 256), 1, 1}, 256, 0, body) ? 0 : -1;
}

// delta_rule_f32: one block of 256 threads per value head.
int pn_emu_delta_rule(const float* q, const float* k, long long qk_stride, const float* v, long long v_stride,
                      const float* b, const float* al, long long ab_stride, const float* dt_bias, const float* ssm_a,
                      float* state, float* out, long long out_stride, int n_v_heads, int n_k_heads, int T) {
    std::function<void()> body = [&] {
        kdr::delta_rule_f32(q, k, qk_stride, v, v_stride, b, al, ab_stride, dt_bias, ssm_a, state, out, out_stride, n_k_heads, T);
    };
    return emu::launch3(EmuDim3{(unsigned)n_v_heads, 1, 1}, 256, 0, body) ? 0 : -1;
}

// delta_rule_l2_f32 (raw q/k, normalised in the block): one block of 256 threads per value head.
int pn_emu_delta_rule_l2(const float* q, const float* k, long long qk_stride, const float* v, long long v_stride,
                         const float* b, const float* al, long long ab_stride, const float* dt_bias, const float* ssm_a,
                         float* state, float* out, long long out_stride, int n_v_heads, int n_k_heads, int T, float q_scale,
                         float eps) {
    std::function<void()> body = [&] {
        kdr::delta_rule_l2_f32(q, k, qk_stride, v, v_stride, b, al, ab_stride, dt_bias, ssm_a, state, out, out_stride,
                               n_k_heads, T, q_scale, eps);
    };
    return emu::launch3(EmuDim3{(unsigned)n_v_heads, 1, 1}, 256, 0, body) ? 0 : -1;
}

// *_get_rows (type 0 f32, 1 f16, 2 q8_0, 4 q3_K): one block of 256 threads per id.
int pn_emu_get_rows(int type, const void* w, const int* ids, int n_ids, float* out, int K, int n_rows) {
    using namespace kgr;
    std::function<void()> body;
    switch (type) {
    case 0: body = [&] { f32_get_rows((const float*)w, ids, out, K, n_rows); }; break;
    case 1: body = [&] { f16_get_rows((const pn_u16*)w, ids, out, K, n_rows); }; break;
    case 2: body = [&] { q8_0_get_rows((const pn_u8*)w, ids, out, K, n_rows); }; break;
    case 4: body = [&] { q3_k_get_rows((const pn_u8*)w, ids, out, K, n_rows); }; break;
    default: return -2;
    }
    return emu::launch3(EmuDim3{(unsigned)n_ids, 1, 1}, 256, 0, body) ? 0 : -1;
}

// elementwise.cu: kind 0 swiglu_f32 (a = gate, b = up, out), 1 sigmoid_gate_f32 (a = x in place,
// b = g, hd, n_heads, g_ts, g_hs), 2 add_inplace_f32 (a += b); grid blocks of 256 threads.
int pn_emu_elementwise(int kind, float* a, const float* b, float* out, long long n, int hd, int n_heads, long long g_ts,
                       long long g_hs, unsigned grid) {
    using namespace kew;
    std::function<void()> body;
    switch (kind) {
    case 0: body = [&] { swiglu_f32(a, b, out, n); }; break;
    case 1: body = [&] { sigmoid_gate_f32(a, b, n, hd, n_heads, g_ts, g_hs); }; break;
    case 2: body = [&] { add_inplace_f32(a, b, n); }; break;
    default: return -2;
    }
    return emu::launch3(EmuDim3{grid, 1, 1}, 256, 0, body) ? 0 : -1;
}

// topk_partial_f32 on ceil(n / TK_SLICE) blocks, then topk_merge_f32 on one: the k best of x
// into out_v / out_i. cand_v / cand_i: ceil(n / TK_SLICE) * k entries (the caller's scratch).
int pn_emu_topk(const float* x, int n, int k, float* cand_v, int* cand_i, float* out_v, int* out_i) {
    using namespace ktk;
    if (k < 1 || k > TK_MAX || n < 1) return -2;
    const int g = (n + TK_SLICE - 1) / TK_SLICE;
    std::function<void()> part = [&] { topk_partial_f32(x, n, k, cand_v, cand_i); };
    if (!emu::launch3(EmuDim3{(unsigned)g, 1, 1}, TK_THREADS, 0, part)) return -1;
    std::function<void()> merge = [&] { topk_merge_f32(cand_v, cand_i, g * k, k, out_v, out_i); };
    return emu::launch3(EmuDim3{1, 1, 1}, TK_THREADS, 0, merge) ? 0 : -1;
}
int pn_emu_topk_slice() { return TK_SLICE; }
int pn_emu_topk_max() { return TK_MAX; }
// q4k_batch.cu: q4_k_gemv_b<t> (type 3; S super-blocks of x staged per chunk) or q8_0_gemv_b<t>
// (type 2) for t = 2..8 activation rows, on `grid` blocks of `threads` with `smem` bytes of
// dynamic shared memory. The arguments in one struct (layout of QuantBatchArgs in
// src/emu/quant_batch.rs). Returns 0, -1 deadlock, -2 bad type or t.
struct PnQuantBatchArgs {
    int type, t;
    const void* w;
    const float* x;
    float* y;
    int N, K, S;
    unsigned grid, threads, smem;
};
int pn_emu_quant_gemv_batch(const PnQuantBatchArgs* a) {
    const int type = a->type, t = a->t, N = a->N, K = a->K, S = a->S;
    const float* x = a->x;
    float* y = a->y;
    using namespace kqb;
    const pn_u8* wb = (const pn_u8*)a->w;
    std::function<void()> body;
#define PN_EMU_QB(tt)                                                        \
    else if (t == tt && type == 3) body = [&] { q4_k_gemv_b##tt(wb, x, y, N, K, S); }; \
    else if (t == tt && type == 2) body = [&] { q8_0_gemv_b##tt(wb, x, y, N, K); };
    if (false) {
    }
    PN_EMU_QB(2) PN_EMU_QB(3) PN_EMU_QB(4) PN_EMU_QB(5) PN_EMU_QB(6) PN_EMU_QB(7) PN_EMU_QB(8)
    else return -2;
#undef PN_EMU_QB
    return emu::launch3(EmuDim3{a->grid, 1, 1}, a->threads, a->smem, body) ? 0 : -1;
}
}
