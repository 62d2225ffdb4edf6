// Partial NeoX RoPE, in place: for each token t and head h, dims (i, i + n_rot/2) for
// i < n_rot/2 are rotated by theta = pos[t] * base^(-2i/n_rot); dims >= n_rot pass through.
// The angle and its sine/cosine are computed in double (full-rate fp64 on the P100; positions up
// to 2^20 keep ~1e-10 absolute angle error), then rounded to f32.
#include "common.cuh"

extern "C" {
// grid (n_heads, T), block n_rot/2 threads. Positions: pos[t] when pos is not null, else pos0 + t.
__global__ void rope_neox_f32(float* __restrict__ x, long long tok_stride, long long head_stride,
                              const int* __restrict__ pos, int pos0, int n_rot, float base) {
    const int i = threadIdx.x, half = n_rot / 2;
    if (i >= half) return;
    float* v = x + blockIdx.y * tok_stride + blockIdx.x * head_stride;
    const double inv_freq = pow((double)base, -2.0 * (double)i / (double)n_rot);
    const double theta = (double)(pos ? pos[blockIdx.y] : pos0 + (int)blockIdx.y) * inv_freq;
    const float c = (float)cos(theta), s = (float)sin(theta);
    const float a = v[i], b = v[i + half];
    v[i] = a * c - b * s;
    v[i + half] = a * s + b * c;
}
}
