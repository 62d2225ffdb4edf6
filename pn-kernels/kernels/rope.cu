// Partial NeoX RoPE, in place: for each token t and head h, dims (i, i + n_rot/2) for
// i < n_rot/2 are rotated by theta = pos[t] * base^(-2i/n_rot); dims >= n_rot pass through.
// The angle and its sine/cosine are computed in double (full-rate fp64 on the P100; positions up
// to 2^20 keep ~1e-10 absolute angle error), then rounded to f32.
#include "common.cuh"

extern "C" {
// grid (n_heads, min(T, 65535)), block n_rot/2 threads; grid y strides over the T tokens (a
// prefill chunk may pass the grid's y limit). Positions: pos[t] when pos is not null, else
// pos0 + t.
__global__ void rope_neox_f32(float* __restrict__ x, long long tok_stride, long long head_stride,
                              const int* __restrict__ pos, int pos0, int n_rot, float base, int n_tokens) {
    const int i = threadIdx.x, half = n_rot / 2;
    if (i >= half) return;
    const double inv_freq = pow((double)base, -2.0 * (double)i / (double)n_rot);
    for (int t = blockIdx.y; t < n_tokens; t += gridDim.y) {
        float* v = x + (long long)t * tok_stride + (long long)blockIdx.x * head_stride;
        const double theta = (double)(pos ? pos[t] : pos0 + t) * inv_freq;
        const float c = (float)cos(theta), s = (float)sin(theta);
        const float a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = a * s + b * c;
    }
}
}
