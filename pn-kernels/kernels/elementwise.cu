// Element-wise ops of the decode path. Grid-stride loops; n counts elements.
#include "common.cuh"

extern "C" {
// out = silu(gate) * up (SwiGLU: gate first, up second).
__global__ void swiglu_f32(const float* __restrict__ gate, const float* __restrict__ up, float* __restrict__ out, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        out[i] = pn_silu(gate[i]) * up[i];
}
// The attention output gate: x[t][h][i] (x contiguous, n_heads*hd per token) *=
// sigmoid(g[t*g_ts + h*g_hs + i]) for n = T*n_heads*hd values.
__global__ void sigmoid_gate_f32(float* __restrict__ x, const float* __restrict__ g, long long n, int hd, int n_heads,
                                 long long g_ts, long long g_hs) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const long long row = i / hd, t = row / n_heads, h = row % n_heads;
        x[i] *= pn_sigmoid(g[t * g_ts + h * g_hs + i % hd]);
    }
}
// a += b (residual add).
__global__ void add_inplace_f32(float* __restrict__ a, const float* __restrict__ b, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        a[i] += b[i];
}
}
