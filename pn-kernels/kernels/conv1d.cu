// Causal depthwise conv1d (kernel 4, no bias) + SiLU over T tokens, with the rolling state of the
// last 3 PRE-conv inputs (qwen38-architecture.md 4.3 step 2). state[k*C + c] holds u(t-3+k);
// weights w[c*4 + k] (ne0 = tap). One thread per channel walks the tokens in order.
#include "conv1d.cuh"

extern "C" {
__global__ void conv1d_silu_f32(const float* __restrict__ u, long long u_stride, float* __restrict__ state,
                                const float* __restrict__ w, float* __restrict__ y, long long y_stride, int C, int T) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s0 = state[c], s1 = state[C + c], s2 = state[2 * C + c];
    const float w0 = w[4 * c], w1 = w[4 * c + 1], w2 = w[4 * c + 2], w3 = w[4 * c + 3];
    for (int t = 0; t < T; ++t) {
        const float ut = u[t * u_stride + c];
        y[t * y_stride + c] = pn_conv4_silu(w0, w1, w2, w3, s0, s1, s2, ut);
        s0 = s1; s1 = s2; s2 = ut;
    }
    state[c] = s0; state[C + c] = s1; state[2 * C + c] = s2;
}
}
