// kernels/attention.cu (split-K decode attention, attn_combine, kv_store_*) run on the host by
// the SIMT emulator (see emu_pn_gemv.cpp).
#include "common.cuh"
#include "kv_blocks.cuh"

namespace katt {
#include "attention.cu"
}

extern "C" {
// attn_partial_* (kv_type 0 f32, 1 f16 bits, 2 q8_0 bytes, 3 q4_0 bytes) on grid
// (n_head, n_split, grid_t), 256 threads, then attn_combine on (n_head, grid_t): grid_t <= T
// blocks stride over the T query tokens. part_o / part_ml are the
// caller's scratch (T*n_head*n_split*256 and *2 floats). Returns 0, -1 deadlock, -2 bad type.
int pn_emu_attention_grid(int kv_type, const float* q, long long q_tok_stride, long long q_head_stride, const void* kc,
                          const void* vc, long long pos_stride, long long head_stride, int n_head, int group, int p0, int T,
                          int n_split, int chunk, float scale, float* part_o, float* part_ml, float* o,
                          long long o_tok_stride, unsigned grid_t) {
    using namespace katt;
    std::function<void()> body;
    switch (kv_type) {
    case 0: body = [&] { attn_partial_f32kv(q, q_tok_stride, q_head_stride, (const float*)kc, (const float*)vc, pos_stride, head_stride, group, p0, chunk, scale, part_o, part_ml, T); }; break;
    case 1: body = [&] { attn_partial_f16kv(q, q_tok_stride, q_head_stride, (const __half*)kc, (const __half*)vc, pos_stride, head_stride, group, p0, chunk, scale, part_o, part_ml, T); }; break;
    case 2: body = [&] { attn_partial_q8_0kv(q, q_tok_stride, q_head_stride, (const pn_q8kv*)kc, (const pn_q8kv*)vc, pos_stride, head_stride, group, p0, chunk, scale, part_o, part_ml, T); }; break;
    case 3: body = [&] { attn_partial_q4_0kv(q, q_tok_stride, q_head_stride, (const pn_q4kv*)kc, (const pn_q4kv*)vc, pos_stride, head_stride, group, p0, chunk, scale, part_o, part_ml, T); }; break;
    default: return -2;
    }
    if (!emu::launch3(EmuDim3{(unsigned)n_head, (unsigned)n_split, grid_t}, 256, 0, body)) return -1;
    std::function<void()> comb = [&] { attn_combine(part_o, part_ml, n_split, o, o_tok_stride, T); };
    return emu::launch3(EmuDim3{(unsigned)n_head, grid_t, 1}, 256, 0, comb) ? 0 : -1;
}
// As pn_emu_attention_grid with one block per query token on grid z (combine: y).
int pn_emu_attention(int kv_type, const float* q, long long q_tok_stride, long long q_head_stride, const void* kc,
                     const void* vc, long long pos_stride, long long head_stride, int n_head, int group, int p0, int T,
                     int n_split, int chunk, float scale, float* part_o, float* part_ml, float* o, long long o_tok_stride) {
    return pn_emu_attention_grid(kv_type, q, q_tok_stride, q_head_stride, kc, vc, pos_stride, head_stride, n_head, group, p0,
                                 T, n_split, chunk, scale, part_o, part_ml, o, o_tok_stride, (unsigned)T);
}
// kv_store_* (kv_type as above) of T tokens' K and V rows (n_kv heads) at positions p0.., on
// grid (n_kv, grid_t) (grid_t <= T: the kernels stride over the tokens).
int pn_emu_kv_store_grid(int kv_type, const float* k, const float* v, long long tok_stride, void* kc, void* vc,
                         long long pos_stride, long long head_stride, int p0, int n_kv, int T, unsigned grid_t) {
    using namespace katt;
    std::function<void()> body;
    switch (kv_type) {
    case 0: body = [&] { kv_store_f32(k, v, tok_stride, (float*)kc, (float*)vc, pos_stride, head_stride, p0, T); }; break;
    case 1: body = [&] { kv_store_f16(k, v, tok_stride, (__half*)kc, (__half*)vc, pos_stride, head_stride, p0, T); }; break;
    case 2: body = [&] { kv_store_q8_0(k, v, tok_stride, (pn_u8*)kc, (pn_u8*)vc, pos_stride, head_stride, p0, T); }; break;
    case 3: body = [&] { kv_store_q4_0(k, v, tok_stride, (pn_u8*)kc, (pn_u8*)vc, pos_stride, head_stride, p0, T); }; break;
    default: return -2;
    }
    return emu::launch3(EmuDim3{(unsigned)n_kv, grid_t, 1}, 256, 0, body) ? 0 : -1;
}
int pn_emu_kv_store(int kv_type, const float* k, const float* v, long long tok_stride, void* kc, void* vc,
                    long long pos_stride, long long head_stride, int p0, int n_kv, int T) {
    return pn_emu_kv_store_grid(kv_type, k, v, tok_stride, kc, vc, pos_stride, head_stride, p0, n_kv, T, (unsigned)T);
}
}
