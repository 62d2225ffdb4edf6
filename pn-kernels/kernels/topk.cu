// Device argmax / top-k over a row of logits, so that a decode step downloads k (id, logit) pairs
// (one id for greedy decoding) instead of the whole row (1 MB at the 27B vocabulary).
//
// Order: the CPU sampler's (pn-runtime sampling: `argmax`, `by_logit_desc`): only finite values
// take part (NaN and +-inf are skipped, as the sampler masks NaN to -inf and keeps finite
// candidates), higher value first, equal values by lower index. The result is exact (no
// approximation): the k best in that total order, best first; slots past the number of finite
// values hold index -1 and value -inf.
//
// Two launches:
//  1. topk_partial_f32, grid ceil(n / TK_SLICE), TK_THREADS threads: block b keeps the TK_PER
//     values of each thread of its slice [b*TK_SLICE, (b+1)*TK_SLICE) in registers (coalesced
//     loads: thread t reads t + TK_THREADS*m) and picks its k best by k rounds of a block-wide
//     arg-best over the values strictly after the previous pick in the order, written to
//     cand[b*k + r].
//  2. topk_merge_f32, one block: the same rounds over the gridDim(1)*k candidates (from global
//     memory: a few thousand, L1/L2-resident), written to out[0..k).
// k is at most TK_MAX (registers: none depend on k; the bound keeps the candidate list small).
#include "common.cuh"

#define TK_THREADS 256
#define TK_PER 16
#define TK_SLICE (TK_THREADS * TK_PER)
#define TK_MAX 64
#define TK_WARPS (TK_THREADS / 32)

// Whether (va, ia) comes before (vb, ib): higher value, then lower index; index -1 (no value)
// comes after everything.
PN_DEV bool tk_before(float va, int ia, float vb, int ib) {
    if (ia < 0) return false;
    if (ib < 0) return true;
    return va > vb || (va == vb && ia < ib);
}
PN_DEV bool tk_finite(float v) { return (pn_as_u32(v) & 0x7f800000u) != 0x7f800000u; }

// Block-wide best of each thread's (v, i); every thread gets the result. `sv`/`si` hold
// TK_WARPS + 1 entries.
PN_DEV void tk_block_best(float* v, int* i, PN_SPTR(float) sv, PN_SPTR(int) si) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, *v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, *i, o);
        if (tk_before(ov, oi, *v, *i)) { *v = ov; *i = oi; }
    }
    if (lane == 0) { sv[warp] = *v; si[warp] = *i; }
    __syncthreads();
    if (warp == 0) {
        float bv = lane < TK_WARPS ? (float)sv[lane] : 0.0f;
        int bi = lane < TK_WARPS ? (int)si[lane] : -1;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (tk_before(ov, oi, bv, bi)) { bv = ov; bi = oi; }
        }
        if (lane == 0) { sv[TK_WARPS] = bv; si[TK_WARPS] = bi; }
    }
    __syncthreads();
    *v = sv[TK_WARPS];
    *i = si[TK_WARPS];
    __syncthreads(); // the next round's writes of sv/si wait for these reads
}

extern "C" {
// x[0..n): the logits row; cand_v / cand_i: gridDim.x * k entries.
__global__ void __launch_bounds__(TK_THREADS) topk_partial_f32(const float* __restrict__ x, int n, int k,
                                                             float* __restrict__ cand_v, int* __restrict__ cand_i) {
    PN_SMEM(float, sv, TK_WARPS + 1);
    PN_SMEM(int, si, TK_WARPS + 1);
    const int base = blockIdx.x * TK_SLICE + threadIdx.x;
    float v[TK_PER];
#pragma unroll
    for (int m = 0; m < TK_PER; ++m) {
        const int e = base + TK_THREADS * m;
        v[m] = e < n ? __ldg(x + e) : 0.0f;
        if (e >= n || !tk_finite(v[m])) v[m] = -PN_INF; // -inf marks "not a candidate" below
    }
    float pv = PN_INF;
    int pi = -1; // the previous pick; -1: none yet
    for (int r = 0; r < k; ++r) {
        float bv = 0.0f;
        int bi = -1;
#pragma unroll
        for (int m = 0; m < TK_PER; ++m) {
            const int e = base + TK_THREADS * m;
            // Candidates: finite, strictly after the previous pick in the order.
            const bool after = pi < 0 || v[m] < pv || (v[m] == pv && e > pi);
            if (v[m] != -PN_INF && after && tk_before(v[m], e, bv, bi)) { bv = v[m]; bi = e; }
        }
        tk_block_best(&bv, &bi, sv, si);
        if (threadIdx.x == 0) {
            cand_v[blockIdx.x * k + r] = bi < 0 ? -PN_INF : bv;
            cand_i[blockIdx.x * k + r] = bi;
        }
        if (bi < 0) {
            // Nothing left in this slice: the remaining slots say so.
            for (int q = r + 1 + (int)threadIdx.x; q < k; q += TK_THREADS) {
                cand_v[blockIdx.x * k + q] = -PN_INF;
                cand_i[blockIdx.x * k + q] = -1;
            }
            return; // uniform over the block (bi is the block's result)
        }
        pv = bv;
        pi = bi;
    }
}

// One block: the k best of the m candidates (index -1: empty) into out_v / out_i[0..k).
__global__ void __launch_bounds__(TK_THREADS) topk_merge_f32(const float* __restrict__ cand_v, const int* __restrict__ cand_i, int m,
                                                           int k, float* __restrict__ out_v, int* __restrict__ out_i) {
    PN_SMEM(float, sv, TK_WARPS + 1);
    PN_SMEM(int, si, TK_WARPS + 1);
    float pv = PN_INF;
    int pi = -1;
    for (int r = 0; r < k; ++r) {
        float bv = 0.0f;
        int bi = -1;
        for (int c = threadIdx.x; c < m; c += TK_THREADS) {
            const int e = cand_i[c];
            const float cv = cand_v[c];
            const bool after = pi < 0 || cv < pv || (cv == pv && e > pi);
            if (e >= 0 && after && tk_before(cv, e, bv, bi)) { bv = cv; bi = e; }
        }
        tk_block_best(&bv, &bi, sv, si);
        if (threadIdx.x == 0) {
            out_v[r] = bi < 0 ? -PN_INF : bv;
            out_i[r] = bi;
        }
        if (bi < 0) {
            for (int q = r + 1 + (int)threadIdx.x; q < k; q += TK_THREADS) {
                out_v[q] = -PN_INF;
                out_i[q] = -1;
            }
            return;
        }
        pv = bv;
        pi = bi;
    }
}
}
