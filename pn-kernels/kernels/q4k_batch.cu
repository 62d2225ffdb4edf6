// Small-batch GEMVs of the stock types (T = 2..8 activation rows: the MTP verify's LM head and
// GDN alpha/beta, batched decode): each weight byte is loaded once for all T rows. x: T rows of
// K floats (row t at x + t K), y: T rows of N (row t at y + t N).
#include "q4k_lane.cuh"

// Q4_K (review finding 5: the verify ran the 248320 x 5120 head once per row, re-reading the
// 715 MB of weights T times). Blocks of 8 warps; each warp owns R consecutive weight rows of a
// tile of 8 R rows, and the block loops over tiles (grid-stride). Per tile, x is staged in chunks
// of S super-blocks (S x 256 floats of each of the T rows: T S KB of dynamic shared memory, row
// t's chunk at float4 t S 64); per chunk each warp, for each of its rows and each super-block of
// the chunk, loads the lane's share of the super-block once (q4_k_lane_load: the single-row
// kernel's loads, 128 consecutive qs bytes per warp) and applies it to all T rows
// (q4_k_lane_term, reading x as float4: the 8 lanes of a chunk read 32 consecutive words, no
// bank conflict). Lane l sums the same super-blocks in the same order per row and activation
// row as q4_k_gemv_f32, then the same warp sum: row t of y equals the single-row kernel on row t
// of x, bit for bit. x is read from L2 once per tile: T K 4 bytes per 8 R weight rows, so R
// (the accumulators are R x T registers) is as large as the register budget allows.
template <int T, int R>
__device__ void q4_k_gemv_batch(const pn_u8* __restrict__ w, const float* __restrict__ x, float* __restrict__ y, int N,
                                int K, int S) {
    PN_DYN_SMEM(float4, xs4);
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
    const int nsb = K / PN_QK_K, row_words = K / 4, chunk4 = S * PN_QK_K / 4;
    const int c = lane >> 3, i0 = 4 * (lane & 7);
    // Every warp runs every iteration (rows past N compute nothing): the staging barriers need
    // the whole block.
    for (int tile = blockIdx.x; tile * nwarps * R < N; tile += gridDim.x) {
        const int row0 = (tile * nwarps + warp) * R;
        float acc[R][T];
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int t = 0; t < T; ++t) acc[r][t] = 0.0f;
        for (int sb0 = 0; sb0 < nsb; sb0 += S) {
            const int ns = min(S, nsb - sb0), words = ns * PN_QK_K / 4;
            __syncthreads(); // the previous chunk's reads of xs4 are done
            for (int i = threadIdx.x; i < T * words; i += blockDim.x) {
                const int t = i / words, j = i - t * words;
                xs4[t * chunk4 + j] = __ldg(x4 + (pn_u64)t * row_words + sb0 * (PN_QK_K / 4) + j);
            }
            __syncthreads();
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const int row = row0 + r;
                if (row >= N) continue; // warp-uniform; no barrier inside
                const pn_u8* rowp = w + ((pn_u64)row * nsb + sb0) * PN_Q4_K_BYTES;
                for (int s = 0; s < ns; ++s) {
                    const Q4kLane L = q4_k_lane_load(rowp + (pn_u64)s * PN_Q4_K_BYTES, c, i0);
#pragma unroll
                    for (int t = 0; t < T; ++t) {
                        const float4 xl = xs4[t * chunk4 + (s * PN_QK_K + 64 * c + i0) / 4];
                        const float4 xh = xs4[t * chunk4 + (s * PN_QK_K + 64 * c + 32 + i0) / 4];
                        acc[r][t] += q4_k_lane_term(L, xl, xh);
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            if (row0 + r >= N) continue; // warp-uniform
#pragma unroll
            for (int t = 0; t < T; ++t) {
                const float v = pn_warp_sum(acc[r][t]);
                if (lane == 0) y[(pn_u64)t * N + row0 + r] = v;
            }
        }
    }
}

// Q8_0 (ssm_alpha, ssm_beta: 48 x 5120 per GDN layer): q8_0_gemv_f32's layout (one warp per
// row, lane per 34-byte block, x through the read-only cache) with each block's 32 codes loaded
// once and applied to all T rows; per row and activation row the same products and sums in the
// same order, so row t equals the single-row kernel on row t, bit for bit. (The byte loads are
// as uncoalesced as the single-row kernel's; these matrices are 0.25 MB a layer.)
template <int T>
__device__ void q8_0_gemv_batch(const pn_u8* __restrict__ w, const float* __restrict__ x, float* __restrict__ y, int N,
                                int K) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + warp;
    if (row >= N) return;
    const int nb = K / 32;
    const pn_u8* rowp = w + (pn_u64)row * nb * PN_Q8_0_BYTES;
    float acc[T];
#pragma unroll
    for (int t = 0; t < T; ++t) acc[t] = 0.0f;
    for (int b = lane; b < nb; b += 32) {
        const pn_u8* blk = rowp + (pn_u64)b * PN_Q8_0_BYTES;
        float s[T];
#pragma unroll
        for (int t = 0; t < T; ++t) s[t] = 0.0f;
#pragma unroll 8
        for (int e = 0; e < 32; ++e) {
            const float q = (float)(pn_i8)__ldg(blk + 2 + e);
#pragma unroll
            for (int t = 0; t < T; ++t) s[t] += q * __ldg(x + (pn_u64)t * K + b * 32 + e);
        }
        const float d = pn_f16_to_f32(pn_load_u16(blk));
#pragma unroll
        for (int t = 0; t < T; ++t) acc[t] += d * s[t];
    }
#pragma unroll
    for (int t = 0; t < T; ++t) {
        const float v = pn_warp_sum(acc[t]);
        if (lane == 0) y[(pn_u64)t * N + row] = v;
    }
}

// Rows per warp of the Q4_K kernel for T activation rows: R x T <= 32 accumulators (launch.rs
// `q4_k_batch_rows` keeps the same table).
#define PN_Q4KB_ROWS(t) ((t) == 2 ? 16 : (t) == 3 ? 10 : (t) == 4 ? 8 : (t) == 5 ? 6 : (t) == 6 ? 5 : 4)
#define PN_QB_ARGS const pn_u8 *__restrict__ w, const float *__restrict__ x, float *__restrict__ y, int N, int K
extern "C" {
// One kernel per macro: the kernel tests' source scan (`tests/common`) takes one kernel
// name per expanded macro call.
#define PN_Q4KB(t)                                                                                                    \
    __global__ void __launch_bounds__(256) q4_k_gemv_b##t(PN_QB_ARGS, int S) {                                         \
        q4_k_gemv_batch<t, PN_Q4KB_ROWS(t)>(w, x, y, N, K, S);                                                          \
    }
#define PN_Q8B(t) \
    __global__ void __launch_bounds__(256) q8_0_gemv_b##t(PN_QB_ARGS) { q8_0_gemv_batch<t>(w, x, y, N, K); }
PN_Q4KB(2) PN_Q4KB(3) PN_Q4KB(4) PN_Q4KB(5) PN_Q4KB(6) PN_Q4KB(7) PN_Q4KB(8)
PN_Q8B(2) PN_Q8B(3) PN_Q8B(4) PN_Q8B(5) PN_Q8B(6) PN_Q8B(7) PN_Q8B(8)
#undef PN_Q4KB
#undef PN_Q8B
}
