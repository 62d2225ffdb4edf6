// Matrix-vector products for the stock types the model uses: Q4_K (the LM head), Q8_0
// (ssm_alpha, ssm_beta), F16 and F32. One warp per output row, fp32 accumulation, activations
// read through the read-only cache (x is small and shared by every row).
#include "q4k_lane.cuh"

// Q4_K: a row is K/256 super-blocks of 144 bytes (16-byte multiple, so with a 16-byte aligned
// base every u32 field below is aligned). x is staged once per block in shared memory (K floats,
// K <= 12288) and the block's warps loop over rows (grid-stride; the grid is a few blocks per SM,
// so x is read from L2 a few hundred times per call instead of once per 8 rows). Lane l reads qs
// bytes 4*(l%8).. of chunk c = l/8 (the warp's 32 loads are 128 consecutive bytes): four low
// nibbles (sub-block 2c) and four high nibbles (sub-block 2c+1), and x as float4 from shared
// memory (the 8 lanes of a chunk read 32 consecutive words: no bank conflict). The lane's
// loads and arithmetic are q4k_lane.cuh's, shared with the small-batch q4k_batch.cu.
__device__ void q4_k_gemv(const pn_u8* __restrict__ w, const float* __restrict__ x, float* __restrict__ y, int N, int K) {
    PN_DYN_SMEM(float4, xs4);
    const float4* x4 = reinterpret_cast<const float4*>(x);
    for (int i = threadIdx.x; i < K / 4; i += blockDim.x) xs4[i] = __ldg(x4 + i);
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
    const int nsb = K / PN_QK_K;
    const int c = lane >> 3, i0 = 4 * (lane & 7);
    for (int row = blockIdx.x * nwarps + warp; row < N; row += gridDim.x * nwarps) {
        const pn_u8* rowp = w + (pn_u64)row * nsb * PN_Q4_K_BYTES;
        float acc = 0.0f;
        for (int sb = 0; sb < nsb; ++sb) {
            const Q4kLane L = q4_k_lane_load(rowp + (pn_u64)sb * PN_Q4_K_BYTES, c, i0);
            const float4 xl = xs4[(sb * PN_QK_K + 64 * c + i0) / 4];
            const float4 xh = xs4[(sb * PN_QK_K + 64 * c + 32 + i0) / 4];
            acc += q4_k_lane_term(L, xl, xh);
        }
        acc = pn_warp_sum(acc);
        if (lane == 0) y[row] = acc;
    }
}

// Q8_0: 34-byte blocks (unaligned fields), lane per block.
__device__ void q8_0_gemv(const pn_u8* __restrict__ w, const float* __restrict__ x, float* __restrict__ y, int N, int K) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + warp;
    if (row >= N) return;
    const int nb = K / 32;
    const pn_u8* rowp = w + (pn_u64)row * nb * PN_Q8_0_BYTES;
    float acc = 0.0f;
    for (int b = lane; b < nb; b += 32) {
        const pn_u8* blk = rowp + (pn_u64)b * PN_Q8_0_BYTES;
        float s = 0.0f;
#pragma unroll 8
        for (int e = 0; e < 32; ++e) s += (float)(pn_i8)__ldg(blk + 2 + e) * __ldg(x + b * 32 + e);
        acc += pn_f16_to_f32(pn_load_u16(blk)) * s;
    }
    acc = pn_warp_sum(acc);
    if (lane == 0) y[row] = acc;
}

// F16 weights (K even, rows 4-byte aligned): half2 loads, converted to fp32.
__device__ void f16_gemv(const __half* __restrict__ w, const float* __restrict__ x, float* __restrict__ y, int N, int K) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + warp;
    if (row >= N) return;
    const __half2* r2 = reinterpret_cast<const __half2*>(w + (pn_u64)row * K);
    const float2* x2 = reinterpret_cast<const float2*>(x);
    float acc = 0.0f;
    for (int i = lane; i < K / 2; i += 32) {
        const float2 wv = __half22float2(r2[i]);
        const float2 xv = __ldg(x2 + i);
        acc += wv.x * xv.x + wv.y * xv.y;
    }
    acc = pn_warp_sum(acc);
    if (lane == 0) y[row] = acc;
}

// F32 weights.
__device__ void f32_gemv(const float* __restrict__ w, const float* __restrict__ x, float* __restrict__ y, int N, int K) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + warp;
    if (row >= N) return;
    const float* r = w + (pn_u64)row * K;
    float acc = 0.0f;
    for (int i = lane; i < K; i += 32) acc += __ldg(r + i) * __ldg(x + i);
    acc = pn_warp_sum(acc);
    if (lane == 0) y[row] = acc;
}

extern "C" {
__global__ void __launch_bounds__(256) q4_k_gemv_f32(const pn_u8* w, const float* x, float* y, int N, int K) { q4_k_gemv(w, x, y, N, K); }
__global__ void __launch_bounds__(256) q8_0_gemv_f32(const pn_u8* w, const float* x, float* y, int N, int K) { q8_0_gemv(w, x, y, N, K); }
__global__ void __launch_bounds__(256) f16_gemv_f32(const __half* w, const float* x, float* y, int N, int K) { f16_gemv(w, x, y, N, K); }
__global__ void __launch_bounds__(256) f32_gemv_f32(const float* w, const float* x, float* y, int N, int K) { f32_gemv(w, x, y, N, K); }
}
