// The decode delta rule that runs its conv1d itself (delta_rule_conv_f32 in kernels/delta_rule.cu)
// on the host by the SIMT emulator (see emu_pn_gemv.cpp for the scheme). delta_rule.cu is also
// included by emu_ops.cpp: this copy sits in its own namespace with `static` entry points.
#include "common.cuh"
#include "conv1d.cuh"
#include "rowsync.cuh"

#undef __global__
#define __global__ static inline

namespace kdrc {
#include "delta_rule.cu"
}

#undef __global__
#define __global__

extern "C" {
// The conv half of the arguments (layout of `DrConvC` in src/emu_mixer.rs).
struct PnDrConvArgs {
    const float* u;
    long long u_stride;
    const float* w;
    float* state;
    float* y;
    long long y_stride;
    unsigned* sync;
    int C;
    int kd;
};
// delta_rule_conv_f32: one block of 256 threads per value head.
int pn_emu_delta_rule_conv(const PnDrConvArgs* c, const float* b, const float* al, long long ab_stride, const float* dt_bias,
                           const float* ssm_a, float* state, float* out, long long out_stride, int n_v_heads, int n_k_heads,
                           int T, float q_scale, float eps) {
    const kdrc::DrConv cv{c->u, c->u_stride, c->w, c->state, c->y, c->y_stride, c->sync, c->C, c->kd};
    std::function<void()> body = [&] {
        kdrc::delta_rule_conv_f32(cv, b, al, ab_stride, dt_bias, ssm_a, state, out, out_stride, n_k_heads, T, q_scale, eps);
    };
    return emu::launch3(EmuDim3{(unsigned)n_v_heads, 1, 1}, 256, 0, body) ? 0 : -1;
}
}
