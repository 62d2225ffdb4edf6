// kernels/mixer.cu (the fused mixer kernels) runs on the host by the SIMT emulator (see
// emu_pn_gemv.cpp for the scheme); launched with the CUDA wrappers' geometry
// (src/gpu/mixer.rs).
#include "common.cuh"
#include "hadamard.cuh"
#include "rowsync.cuh"

namespace kmix {
#include "mixer.cu"
}
// attn_combine of host/emu_attention.cpp (extern "C": one symbol), the reference of the fused
// combine.
extern "C" void attn_combine(const float* part_o, const float* part_ml, int n_split, float* o, long long o_tok_stride,
                             int n_tokens);

extern "C" {
// qk_norm_rope_f32 on grid (n_q + n_k, grid_y), 256 threads, n floats of dynamic shared memory
// (grid_y may be below n_tokens: the kernel strides).
int pn_emu_qk_norm_rope(float* q, long long q_ts, long long q_hs, float* k, long long k_ts, long long k_hs, const float* wq,
                        const float* wk, int n_q, int n_k, int n, float eps, int pos0, int n_rot, float base, int n_tokens,
                        unsigned grid_y) {
    std::function<void()> body = [&] {
        kmix::qk_norm_rope_f32(q, q_ts, q_hs, k, k_ts, k_hs, wq, wk, n_q, n, eps, pos0, n_rot, base, n_tokens);
    };
    return emu::launch3(EmuDim3{(unsigned)(n_q + n_k), grid_y, 1}, 256, (unsigned)(n * 4), body) ? 0 : -1;
}

// sigmoid_gate_hadamard_f32 on len / R blocks of clamp(R/2, 32, 512) threads, R floats of shared
// memory.
int pn_emu_sigmoid_gate_hadamard(const float* x, const float* g, float* out, int hd, int n_heads, long long g_ts,
                                 long long g_hs, int R, float scale, unsigned grid) {
    std::function<void()> body = [&] { kmix::sigmoid_gate_hadamard_f32(x, g, out, hd, n_heads, g_ts, g_hs, R, scale); };
    const unsigned threads = (unsigned)(R / 2 < 32 ? 32 : (R / 2 > 512 ? 512 : R / 2));
    return emu::launch3(EmuDim3{grid, 1, 1}, threads, (unsigned)(R * 4), body) ? 0 : -1;
}

// gated_rms_norm_hadamard_f32 on len / span blocks of 128 threads, span floats of shared memory;
// xh (null: no fp16 copy), e, sync (2 zeroed words per row) and row_len as the kernel takes them.
int pn_emu_gated_rms_norm_hadamard(const float* o, const float* z, const float* w, float* out, int n, float eps, int span,
                                   int R, float scale, unsigned grid, void* xh, int* e, unsigned* sync, int row_len) {
    std::function<void()> body = [&] {
        kmix::gated_rms_norm_hadamard_f32(o, z, w, out, n, eps, span, R, scale, (__half2*)xh, e, sync, row_len);
    };
    return emu::launch3(EmuDim3{grid, 1, 1}, 128, (unsigned)(span * 4), body) ? 0 : -1;
}

// attn_combine_gate_hadamard_f32 on len / R blocks of clamp(R/2, 32, 512) threads, R floats of
// shared memory (len = T * n_head * 256); xh (null: no fp16 copy), e and sync (2 zeroed words
// per token) as the kernel takes them.
int pn_emu_attn_combine_gate_hadamard(const float* part_o, const float* part_ml, int n_split, int n_head, const float* g,
                                      long long g_ts, long long g_hs, float* out, int R, float scale, unsigned grid, void* xh,
                                      int* e, unsigned* sync) {
    std::function<void()> body = [&] {
        kmix::attn_combine_gate_hadamard_f32(part_o, part_ml, n_split, n_head, g, g_ts, g_hs, out, R, scale, (__half2*)xh, e,
                                             sync);
    };
    const unsigned threads = (unsigned)(R / 2 < 32 ? 32 : (R / 2 > 512 ? 512 : R / 2));
    return emu::launch3(EmuDim3{grid, 1, 1}, threads, (unsigned)(R * 4), body) ? 0 : -1;
}
// attn_combine (attention.cu) on (n_head, T) blocks of 256 threads: o [T][n_head][256].
int pn_emu_attn_combine(const float* part_o, const float* part_ml, int n_split, int n_head, float* o, int T) {
    std::function<void()> body = [&] { attn_combine(part_o, part_ml, n_split, o, (long long)n_head * 256, T); };
    return emu::launch3(EmuDim3{(unsigned)n_head, (unsigned)T, 1}, 256, 0, body) ? 0 : -1;
}
}
