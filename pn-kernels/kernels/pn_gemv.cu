// PN matrix-vector product (pn3t, pn4t): the decode hot path.
//
// y[r] = sum_k W[r,k] x[k] for W of N rows by K columns, stored as N*K/WEIGHTS consecutive 34-byte
// blocks (row r starts at global block r*nb). The tensor base must be 4-byte aligned; pairs of
// blocks are then 17 aligned words.
//
// Fast kernels (`*_gemv_h2_*`): the activation vector is staged once per thread block in shared
// memory as half2, pre-scaled by a power of two so that no fp16 partial sum can overflow (exact,
// undone at the end). Each lane owns one pair of blocks per row: 17 word loads in flight, codes to
// half2 by the exponent trick, n - z exact in fp16, products summed in fp16 over one word's
// code pairs only (<= 5 products), then in fp32 across words, blocks, lanes; the block scale is
// factored out and applied in fp32.
// Exact kernels (`*_gemv_f32`): the same layout with fp32 products in element order, the
// reference for the fast path and a fallback when fp16 activations are not wanted.
#include "pn_block.cuh"

union pn_h2u {
    pn_u32 u;
    __half2 h;
};

// Power-of-two factor that brings max|x| into [512, 1024): then a word's fp16 partial sum is at
// most PAIRS * 8 * 1024 < 65504 for both types.
PN_DEV float pn_x_scale_exp(float amax, int* e_out) {
    int e = 0;
    if (amax > 0.0f && amax < PN_INF) frexpf(amax, &e); // amax = m * 2^e, m in [0.5, 1)
    // The cap keeps the factor a finite f32 for tiny (subnormal) activations.
    const int se = (amax > 0.0f && amax < PN_INF) ? min(10 - e, 120) : 0; // NaN/inf: no scaling
    *e_out = se;
    return ldexpf(1.0f, se);
}

// Stages x[0..K) into xs as half2 times 2^e; returns e (undo with ldexpf(y, -e)).
PN_DEV int pn_stage_x_h2(const float* __restrict__ x, int K, __half2* xs, float* scratch) {
    float amax = 0.0f;
    for (int i = threadIdx.x; i < K; i += blockDim.x) amax = fmaxf(amax, fabsf(__ldg(x + i)));
    amax = pn_block_max(amax, scratch);
    int e;
    const float s = pn_x_scale_exp(amax, &e);
    const float2* x2 = reinterpret_cast<const float2*>(x);
    for (int i = threadIdx.x; i < K / 2; i += blockDim.x) {
        float2 v = __ldg(x2 + i);
        xs[i] = __floats2half2_rn(v.x * s, v.y * s); // exact scaling, one rounding to fp16
    }
    __syncthreads();
    return e;
}

// Stages a prepared copy (see pn_prepare_x_h2) with 16-byte loads; returns its exponent. K is a
// multiple of 16 (80 | K or 64 | K), so K/2 half2 are K/8 uint4.
PN_DEV int pn_stage_prepared(const __half2* __restrict__ xh, const int* __restrict__ e, int K, __half2* xs) {
    const uint4* src = reinterpret_cast<const uint4*>(xh);
    uint4* dst = reinterpret_cast<uint4*>(xs);
    for (int i = threadIdx.x; i < K / 8; i += blockDim.x) dst[i] = __ldg(src + i);
    __syncthreads();
    return __ldg(e);
}

// Loads pair q (17 words). The tensor's last pair may hold one block only (odd block count):
// then only its first 34 bytes are read.
PN_DEV void pn_load_pair(const pn_u32* __restrict__ w, pn_u64 q, pn_u64 total_blocks, pn_u32* p) {
    const pn_u32* pp = w + (pn_u64)PN_PAIR_WORDS * q;
    if (2 * q + 1 < total_blocks) {
#pragma unroll
        for (int i = 0; i < PN_PAIR_WORDS; ++i) p[i] = __ldg(pp + i);
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) p[i] = __ldg(pp + i);
        p[8] = __ldg(reinterpret_cast<const unsigned short*>(pp + 8));
#pragma unroll
        for (int i = 9; i < PN_PAIR_WORDS; ++i) p[i] = 0;
    }
}

// d * sum (n - z) x over one block, with fp16 products summed per word and fp32 across words.
template <int BITS, int BLK>
PN_DEV float pn_block_dot_h2(const pn_u32* p, const __half2* xs) {
    typedef PnTraits<BITS> T;
    pn_h2u zz;
    zz.u = pn_zero_h2bits<BITS>();
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const pn_u32 w = pn_pair_word(p, BLK, i);
        __half2 a = __float2half2_rn(0.0f);
#pragma unroll
        for (int j = 0; j < T::PAIRS; ++j) {
            pn_h2u c;
            c.u = pn_code_pair_h2bits<BITS>(w, j);
            a = __hfma2(__hsub2(c.h, zz.h), xs[i * T::PAIRS + j], a);
        }
        const float2 f = __half22float2(a);
        s = pn_add(s, pn_add(f.x, f.y));
    }
    // __fmul_rn / __fadd_rn here and in the callers: no FMA contraction, so the result is
    // reproducible on the host (tests/common emulates this kernel bit for bit).
    return pn_mul(pn_f16_to_f32(pn_pair_scale_bits(p, BLK)), s);
}

// Rows with an even block count: every row starts on a pair, so the ROWS rows of a warp share
// their activation offsets and each lane has ROWS*17 words in flight.
// PREP: x arrives prepared (fp16, scaled, exponent in *e_in) instead of as f32.
template <int BITS, int ROWS, bool PREP>
__device__ void pn_gemv_h2_even(const pn_u32* __restrict__ w, const float* __restrict__ x, const __half2* __restrict__ xh,
                                const int* __restrict__ e_in, float* __restrict__ y, int N, int K) {
    typedef PnTraits<BITS> T;
    extern __shared__ __half2 xs[];
    __shared__ float scratch[32];
    const int e = PREP ? pn_stage_prepared(xh, e_in, K, xs) : pn_stage_x_h2(x, K, xs, scratch);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row0 = (blockIdx.x * (blockDim.x >> 5) + warp) * ROWS;
    if (row0 >= N) return;
    const int nb = K / T::WEIGHTS;
    const int npairs = nb / 2;
    const pn_u64 total = (pn_u64)N * nb;
    float acc[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[r] = 0.0f;
    for (int j = lane; j < npairs; j += 32) {
        pn_u32 p[ROWS][PN_PAIR_WORDS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const int row = min(row0 + r, N - 1); // clamp: a tail row is computed, not stored
            pn_load_pair(w, (pn_u64)row * npairs + j, total, p[r]);
        }
        const __half2* xb = xs + j * T::WEIGHTS; // pair j covers 2*WEIGHTS elements
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
            acc[r] = pn_add(acc[r], pn_add(pn_block_dot_h2<BITS, 0>(p[r], xb), pn_block_dot_h2<BITS, 1>(p[r], xb + T::WEIGHTS / 2)));
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const float v = pn_warp_sum(acc[r]);
        if (lane == 0 && row0 + r < N) y[row0 + r] = ldexpf(v, -e);
    }
}

// Any block count (odd nb: rows alternate between starting on a pair and inside one).
template <int BITS, bool PREP>
__device__ void pn_gemv_h2_any(const pn_u32* __restrict__ w, const float* __restrict__ x, const __half2* __restrict__ xh,
                               const int* __restrict__ e_in, float* __restrict__ y, int N, int K) {
    typedef PnTraits<BITS> T;
    extern __shared__ __half2 xs[];
    __shared__ float scratch[32];
    const int e = PREP ? pn_stage_prepared(xh, e_in, K, xs) : pn_stage_x_h2(x, K, xs, scratch);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + warp;
    if (row >= N) return;
    const pn_u64 nb = (pn_u64)(K / T::WEIGHTS);
    const pn_u64 g0 = (pn_u64)row * nb, total = (pn_u64)N * nb;
    float acc = 0.0f;
    for (pn_u64 q = pn_row_first_pair(g0) + lane; q < pn_row_end_pair(g0, nb); q += 32) {
        pn_u32 p[PN_PAIR_WORDS];
        pn_load_pair(w, q, total, p);
        if (pn_block_in_row(q, 0, g0, nb))
            acc = pn_add(acc, pn_block_dot_h2<BITS, 0>(p, xs + (2 * q - g0) * T::WEIGHTS / 2));
        if (pn_block_in_row(q, 1, g0, nb))
            acc = pn_add(acc, pn_block_dot_h2<BITS, 1>(p, xs + (2 * q + 1 - g0) * T::WEIGHTS / 2));
    }
    acc = pn_warp_sum(acc);
    if (lane == 0) y[row] = ldexpf(acc, -e);
}

// fp32 reference-order kernel: one warp per row, x read through the read-only cache.
template <int BITS>
__device__ void pn_gemv_f32(const pn_u32* __restrict__ w, const float* __restrict__ x,
                            float* __restrict__ y, int N, int K) {
    typedef PnTraits<BITS> T;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + warp;
    if (row >= N) return;
    const pn_u64 nb = (pn_u64)(K / T::WEIGHTS);
    const pn_u64 g0 = (pn_u64)row * nb, total = (pn_u64)N * nb;
    float acc = 0.0f;
    for (pn_u64 q = pn_row_first_pair(g0) + lane; q < pn_row_end_pair(g0, nb); q += 32) {
        pn_u32 p[PN_PAIR_WORDS];
        pn_load_pair(w, q, total, p);
        for (int blk = 0; blk < 2; ++blk)
            if (pn_block_in_row(q, blk, g0, nb))
                acc = pn_add(acc, pn_block_dot_f32<BITS>(p, blk, x + (2 * q + blk - g0) * T::WEIGHTS));
    }
    acc = pn_warp_sum(acc);
    if (lane == 0) y[row] = acc;
}

#define PN_ARGS const pn_u32 *__restrict__ w, const float *__restrict__ x, float *__restrict__ y, int N, int K
#define PN_PARGS const pn_u32 *__restrict__ w, const __half2 *__restrict__ xh, const int *__restrict__ e, float *__restrict__ y, int N, int K
extern "C" {
// One block of 1024 threads: the staging of pn_stage_x_h2 done once, for every matrix that reads
// the same activation: xh[i] = fp16(x * 2^e) as half2, *e_out = e.
__global__ void __launch_bounds__(1024) pn_prepare_x_h2(const float* __restrict__ x, int K, __half2* __restrict__ xh, int* __restrict__ e_out) {
    __shared__ float scratch[32];
    float amax = 0.0f;
    for (int i = threadIdx.x; i < K; i += blockDim.x) amax = fmaxf(amax, fabsf(x[i]));
    amax = pn_block_max(amax, scratch);
    int e;
    const float s = pn_x_scale_exp(amax, &e);
    const float2* x2 = reinterpret_cast<const float2*>(x);
    for (int i = threadIdx.x; i < K / 2; i += blockDim.x) {
        const float2 v = x2[i];
        xh[i] = __floats2half2_rn(v.x * s, v.y * s);
    }
    if (threadIdx.x == 0) *e_out = e;
}
__global__ void __launch_bounds__(256) pn3t_gemv_h2_r1(PN_ARGS) { pn_gemv_h2_even<3, 1, false>(w, x, nullptr, nullptr, y, N, K); }
__global__ void __launch_bounds__(256) pn3t_gemv_h2_r2(PN_ARGS) { pn_gemv_h2_even<3, 2, false>(w, x, nullptr, nullptr, y, N, K); }
__global__ void __launch_bounds__(256) pn4t_gemv_h2_r1(PN_ARGS) { pn_gemv_h2_even<4, 1, false>(w, x, nullptr, nullptr, y, N, K); }
__global__ void __launch_bounds__(256) pn4t_gemv_h2_r2(PN_ARGS) { pn_gemv_h2_even<4, 2, false>(w, x, nullptr, nullptr, y, N, K); }
__global__ void __launch_bounds__(256) pn3t_gemv_h2_any(PN_ARGS) { pn_gemv_h2_any<3, false>(w, x, nullptr, nullptr, y, N, K); }
__global__ void __launch_bounds__(256) pn4t_gemv_h2_any(PN_ARGS) { pn_gemv_h2_any<4, false>(w, x, nullptr, nullptr, y, N, K); }
__global__ void __launch_bounds__(256) pn3t_gemv_h2p_r1(PN_PARGS) { pn_gemv_h2_even<3, 1, true>(w, nullptr, xh, e, y, N, K); }
__global__ void __launch_bounds__(256) pn3t_gemv_h2p_r2(PN_PARGS) { pn_gemv_h2_even<3, 2, true>(w, nullptr, xh, e, y, N, K); }
__global__ void __launch_bounds__(256) pn4t_gemv_h2p_r1(PN_PARGS) { pn_gemv_h2_even<4, 1, true>(w, nullptr, xh, e, y, N, K); }
__global__ void __launch_bounds__(256) pn4t_gemv_h2p_r2(PN_PARGS) { pn_gemv_h2_even<4, 2, true>(w, nullptr, xh, e, y, N, K); }
__global__ void __launch_bounds__(256) pn3t_gemv_h2p_any(PN_PARGS) { pn_gemv_h2_any<3, true>(w, nullptr, xh, e, y, N, K); }
__global__ void __launch_bounds__(256) pn4t_gemv_h2p_any(PN_PARGS) { pn_gemv_h2_any<4, true>(w, nullptr, xh, e, y, N, K); }
__global__ void __launch_bounds__(256) pn3t_gemv_f32(PN_ARGS) { pn_gemv_f32<3>(w, x, y, N, K); }
__global__ void __launch_bounds__(256) pn4t_gemv_f32(PN_ARGS) { pn_gemv_f32<4>(w, x, y, N, K); }
}
