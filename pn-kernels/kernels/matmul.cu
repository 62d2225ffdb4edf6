// Batched matrix product for prefill: Y[t][n] = sum_k X[t][k] * W[n][k], W in its stored type,
// decoded per element while a 64x16 tile is loaded into shared memory; fp32 products and sums
// (no tensor cores on sm_60). Block 16x16 threads, each computing a 4x4 patch of a 64x64 tile.
#include "ggml_blocks.cuh"
#include "pn_block.cuh"

#define MM_TILE 64
#define MM_KT 16

enum { WT_F32 = 0, WT_F16 = 1, WT_Q8_0 = 2, WT_Q4_K = 3, WT_Q3_K = 4, WT_PN3T = 5, WT_PN4T = 6 };

template <int WT> PN_DEV float mm_weight(const pn_u8* row, int k) {
    if (WT == WT_F32) return reinterpret_cast<const float*>(row)[k];
    if (WT == WT_F16) return pn_f16_to_f32(reinterpret_cast<const pn_u16*>(row)[k]);
    if (WT == WT_Q8_0) return q8_0_elem(row + (k / 32) * PN_Q8_0_BYTES, k % 32);
    if (WT == WT_Q4_K) return q4_k_elem(row + (k / PN_QK_K) * PN_Q4_K_BYTES, k % PN_QK_K);
    if (WT == WT_Q3_K) return q3_k_elem(row + (k / PN_QK_K) * PN_Q3_K_BYTES, k % PN_QK_K);
    if (WT == WT_PN3T) return pn_elem_bytes<3>(row + (k / 80) * 34, k % 80);
    return pn_elem_bytes<4>(row + (k / 64) * 34, k % 64);
}

// grid (ceil(N/64), ceil(T/64)); X row-major [T][K] (row stride x_stride), Y [T][N] (y_stride).
template <int WT>
__device__ void matmul_tiled(const pn_u8* __restrict__ w, long long row_bytes, const float* __restrict__ x, long long x_stride,
                             float* __restrict__ y, long long y_stride, int N, int K, int T) {
    __shared__ float ws[MM_KT][MM_TILE + 1];
    __shared__ float xs[MM_KT][MM_TILE + 1];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int n0 = blockIdx.x * MM_TILE, t0 = blockIdx.y * MM_TILE;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < K; k0 += MM_KT) {
        for (int i = threadIdx.x; i < MM_TILE * MM_KT; i += blockDim.x) {
            const int r = i / MM_KT, kk = i % MM_KT, k = k0 + kk;
            const int n = n0 + r, t = t0 + r;
            ws[kk][r] = (n < N && k < K) ? mm_weight<WT>(w + n * row_bytes, k) : 0.0f;
            xs[kk][r] = (t < T && k < K) ? x[t * x_stride + k] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < MM_KT; ++kk) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) { a[i] = xs[kk][ty * 4 + i]; b[i] = ws[kk][tx * 4 + i]; }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int t = t0 + ty * 4 + i, n = n0 + tx * 4 + j;
            if (t < T && n < N) y[t * y_stride + n] = acc[i][j];
        }
}

#define MM_ARGS const pn_u8 *__restrict__ w, long long row_bytes, const float *__restrict__ x, long long x_stride, \
                float *__restrict__ y, long long y_stride, int N, int K, int T
#define MM_CALL(WT) matmul_tiled<WT>(w, row_bytes, x, x_stride, y, y_stride, N, K, T)
extern "C" {
__global__ void __launch_bounds__(256) matmul_f32w(MM_ARGS) { MM_CALL(WT_F32); }
__global__ void __launch_bounds__(256) matmul_f16w(MM_ARGS) { MM_CALL(WT_F16); }
__global__ void __launch_bounds__(256) matmul_q8_0w(MM_ARGS) { MM_CALL(WT_Q8_0); }
__global__ void __launch_bounds__(256) matmul_q4_kw(MM_ARGS) { MM_CALL(WT_Q4_K); }
__global__ void __launch_bounds__(256) matmul_q3_kw(MM_ARGS) { MM_CALL(WT_Q3_K); }
__global__ void __launch_bounds__(256) matmul_pn3tw(MM_ARGS) { MM_CALL(WT_PN3T); }
__global__ void __launch_bounds__(256) matmul_pn4tw(MM_ARGS) { MM_CALL(WT_PN4T); }
}
