// kernels/norm.cu and kernels/hadamard.cu run on the host by the SIMT emulator (see
// emu_pn_gemv.cpp).
#include "common.cuh"
#include "hadamard.cuh"

namespace knorm {
#include "norm.cu"
}
namespace khad {
#include "hadamard.cu"
}

extern "C" {
// Arguments as the kernels, plus the grid (x, y), block and dynamic shared memory.
// kind 0 rms_norm_f32 (a, n), 1 l2_norm_f32 (x, y, n, eps, scale), 2 gated_rms_norm_f32 (o, z, y, w).
// n_tokens rows along grid y, strided over the gy blocks (gy <= n_tokens).
int pn_emu_norm_grid(int kind, const float* x, long long x_ts, long long x_hs, const float* z, long long z_ts,
                     long long z_hs, float* y, long long y_ts, long long y_hs, const float* w, int n, float eps, float scale,
                     unsigned gx, unsigned gy, unsigned threads, int n_tokens) {
    std::function<void()> body;
    switch (kind) {
    case 0: body = [&] { knorm::rms_norm_f32(x, x_ts, x_hs, y, y_ts, y_hs, w, n, eps, n_tokens); }; break;
    case 1: body = [&] { knorm::l2_norm_f32(x, x_ts, x_hs, y, y_ts, y_hs, n, eps, scale, n_tokens); }; break;
    case 2: body = [&] { knorm::gated_rms_norm_f32(x, x_ts, x_hs, z, z_ts, z_hs, y, y_ts, y_hs, w, n, eps, n_tokens); }; break;
    default: return -2;
    }
    return emu::launch3(EmuDim3{gx, gy, 1}, threads, 0, body) ? 0 : -1;
}
// One block per token row (gy = n_tokens).
int pn_emu_norm(int kind, const float* x, long long x_ts, long long x_hs, const float* z, long long z_ts, long long z_hs,
                float* y, long long y_ts, long long y_hs, const float* w, int n, float eps, float scale, unsigned gx,
                unsigned gy, unsigned threads) {
    return pn_emu_norm_grid(kind, x, x_ts, x_hs, z, z_ts, z_hs, y, y_ts, y_hs, w, n, eps, scale, gx, gy, threads, (int)gy);
}
// kind 0 rms_norm_hadamard_f32 (x, x_stride, y, y_stride, w, n, eps, R, scale; grid = rows),
// 1 swiglu_hadamard_f32 (gate = x, up = z, out = y, R, scale; grid = chunks),
// 2 hadamard_f32 (x, y, R, scale; grid = chunks).
int pn_emu_hadamard(int kind, const float* x, long long x_stride, const float* z, float* y, long long y_stride,
                    const float* w, int n, float eps, int R, float scale, unsigned grid, unsigned threads, unsigned smem) {
    std::function<void()> body;
    switch (kind) {
    case 0: body = [&] { khad::rms_norm_hadamard_f32(x, x_stride, y, y_stride, w, n, eps, R, scale); }; break;
    case 1: body = [&] { khad::swiglu_hadamard_f32(x, z, y, R, scale); }; break;
    case 2: body = [&] { khad::hadamard_f32(x, y, R, scale); }; break;
    default: return -2;
    }
    return emu::launch3(EmuDim3{grid, 1, 1}, threads, smem, body) ? 0 : -1;
}
}
