// Sampling helpers on the device: argmax (greedy), top-k and softmax with temperature.
#include "common.cuh"

// (value, index) max with ties to the lower index; NaN never wins.
PN_DEV void pn_argmax_merge(float& v, int& i, float v2, int i2) {
    if (v2 > v || (v2 == v && i2 < i) || (v != v && v2 == v2)) { v = v2; i = i2; }
}

// Top-k order: value descending, then index ascending. (v, i) comes after (pv, pi) in it when
// v < pv or (v == pv and i > pi); NaN never qualifies.
PN_DEV bool pn_after(float v, int i, float pv, int pi) { return v < pv || (v == pv && i > pi); }

// k rounds over m candidates (values vals[j], indices idx ? idx[j] : base + j): round r picks the
// best candidate after round r-1's pick, so the picks come out in top-k order. One block.
PN_DEV void pn_topk_block(const float* vals, const int* idx, int base, int m, int k, float* out_v, int* out_i) {
    __shared__ float sv[32];
    __shared__ int si[32];
    __shared__ float pick_v;
    __shared__ int pick_i;
    float pv = PN_INF;
    int pi = -1;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    for (int r = 0; r < k; ++r) {
        float bv = -PN_INF;
        int bi = 0x7fffffff;
        for (int j = threadIdx.x; j < m; j += blockDim.x) {
            const float v = vals[j];
            const int i = idx ? idx[j] : base + j;
            if (i != 0x7fffffff && pn_after(v, i, pv, pi) && (v > bv || (v == bv && i < bi))) { bv = v; bi = i; }
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float v2 = __shfl_xor_sync(0xffffffffu, bv, o);
            const int i2 = __shfl_xor_sync(0xffffffffu, bi, o);
            if (v2 > bv || (v2 == bv && i2 < bi)) { bv = v2; bi = i2; }
        }
        if (lane == 0) { sv[warp] = bv; si[warp] = bi; }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int w = 1; w < nw; ++w)
                if (sv[w] > bv || (sv[w] == bv && si[w] < bi)) { bv = sv[w]; bi = si[w]; }
            pick_v = bv;
            pick_i = bi;
            out_v[r] = bv;
            out_i[r] = bi; // 0x7fffffff: fewer than k candidates (or only NaN left)
        }
        __syncthreads();
        pv = pick_v;
        pi = pick_i;
        __syncthreads();
    }
}

extern "C" {
// Top-k, stage 1: block b takes x[b*chunk .. (b+1)*chunk) and writes its own top k to
// cand_v/cand_i[b*k ..]. Stage 2 (one block) merges the gridDim*k candidates.
__global__ void __launch_bounds__(256) topk_stage1_f32(const float* __restrict__ x, int n, int k, int chunk,
                                                       float* __restrict__ cand_v, int* __restrict__ cand_i) {
    const int base = blockIdx.x * chunk;
    pn_topk_block(x + base, nullptr, base, min(chunk, n - base), k, cand_v + blockIdx.x * k, cand_i + blockIdx.x * k);
}
__global__ void __launch_bounds__(1024) topk_stage2_f32(const float* __restrict__ cand_v, const int* __restrict__ cand_i, int m, int k,
                                                        float* __restrict__ out_v, int* __restrict__ out_i) {
    pn_topk_block(cand_v, cand_i, 0, m, k, out_v, out_i);
}

// One block of 1024 threads; out[0] = index of the largest of x[0..n).
__global__ void __launch_bounds__(1024) argmax_f32(const float* __restrict__ x, int n, int* __restrict__ out) {
    __shared__ float sv[32];
    __shared__ int si[32];
    float v = -PN_INF;
    int idx = 0x7fffffff;
    for (int i = threadIdx.x; i < n; i += blockDim.x) pn_argmax_merge(v, idx, x[i], i);
    for (int o = 16; o > 0; o >>= 1) {
        const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
        const int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
        pn_argmax_merge(v, idx, v2, i2);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) { sv[warp] = v; si[warp] = idx; }
    __syncthreads();
    if (warp == 0) {
        const int nw = blockDim.x >> 5;
        v = lane < nw ? sv[lane] : -PN_INF;
        idx = lane < nw ? si[lane] : 0x7fffffff;
        for (int o = 16; o > 0; o >>= 1) {
            const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
            const int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
            pn_argmax_merge(v, idx, v2, i2);
        }
        if (lane == 0) out[0] = idx == 0x7fffffff ? 0 : idx;
    }
}

// One block of 1024 threads: y = softmax(x / temperature) over n values (max-subtracted, fp32).
__global__ void __launch_bounds__(1024) softmax_f32(const float* __restrict__ x, float* __restrict__ y, int n, float inv_temp) {
    __shared__ float scratch[32];
    float m = -PN_INF;
    for (int i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, x[i] * inv_temp);
    m = pn_block_max(m, scratch);
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float e = expf(x[i] * inv_temp - m);
        y[i] = e;
        s += e;
    }
    s = pn_block_sum(s, scratch);
    const float inv = 1.0f / s;
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] *= inv;
}
}
