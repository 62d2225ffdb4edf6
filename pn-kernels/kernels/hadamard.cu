// Block-diagonal Walsh-Hadamard rotation of activations (pn-format-decisions.md section 6):
// each consecutive chunk of R values (R a power of two <= 1024) is replaced by H_R x / sqrt(R),
// H_R Sylvester-ordered (the natural-order butterfly). One thread block per chunk; rows are
// contiguous chunks, so T rows of K values are T*K/R chunks.
#include "hadamard.cuh"

// pn_fwht_smem (the in-place FWHT of shared memory) lives in hadamard.cuh: the fused producers
// of fuse.cu and mixer.cu use it too.

extern "C" {
// Fused producer of a rotated activation: y = H(rms(x) * w) for one row per block
// (blockIdx.x = row); dynamic shared memory n floats (n <= 12256: with the 128-byte static
// scratch that is the 48 KB a block gets without an opt-in).
// y may be null: then the result overwrites x (each block reads its row fully before writing).
__global__ void __launch_bounds__(512) rms_norm_hadamard_f32(const float* x, long long x_stride, float* y,
                                                             long long y_stride, const float* __restrict__ w, int n, float eps,
                                                             int R, float scale) {
    PN_DYN_SMEM(float, buf);
    PN_SMEM(float, scratch, 32);
    const float* xr = x + blockIdx.x * x_stride;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = xr[i];
        buf[i] = v;
        ss += v * v;
    }
    ss = pn_block_sum(ss, scratch);
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = buf[i] * inv * w[i];
    __syncthreads();
    pn_fwht_smem(buf, n, R);
    float* yr = y ? y + blockIdx.x * y_stride : const_cast<float*>(xr);
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = buf[i] * scale;
}

// Fused producer of the rotated ffn_down input: out = H(silu(gate) * up), one R-chunk per block;
// dynamic shared memory R floats.
__global__ void __launch_bounds__(512) swiglu_hadamard_f32(const float* __restrict__ gate, const float* __restrict__ up,
                                                           float* __restrict__ out, int R, float scale) {
    PN_DYN_SMEM(float, buf);
    const long long base = (long long)blockIdx.x * R;
    for (int i = threadIdx.x; i < R; i += blockDim.x) buf[i] = pn_silu(gate[base + i]) * up[base + i];
    __syncthreads();
    pn_fwht_smem(buf, R, R);
    for (int i = threadIdx.x; i < R; i += blockDim.x) out[base + i] = buf[i] * scale;
}

// Block R/2 threads (at most 512); dynamic shared memory R floats. y may be null: in place.
__global__ void __launch_bounds__(512) hadamard_f32(const float* x, float* y, int R, float scale) {
    PN_DYN_SMEM(float, buf);
    if (!y) y = const_cast<float*>(x);
    const long long base = (long long)blockIdx.x * R;
    for (int i = threadIdx.x; i < R; i += blockDim.x) buf[i] = x[base + i];
    __syncthreads();
    pn_fwht_smem(buf, R, R);
    for (int i = threadIdx.x; i < R; i += blockDim.x) y[base + i] = buf[i] * scale;
}
}
