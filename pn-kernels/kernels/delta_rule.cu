// Gated delta rule (Gated DeltaNet recurrent form), fp32 state, T tokens in order
// (qwen38-architecture.md 4.3 steps 5-6). Decode is T = 1; prefill runs the exact recurrence.
//
// State of value head p: s[p*D*D + j*D + i] = S[i][j] (ggml's layout: contiguous over the key
// dim i). One thread block per value head, 8 warps; warp w owns value columns j = w*16 .. +16 and
// lane l holds S[i][j] for i = l, l+32, l+64, l+96 in registers for all tokens: the state is read
// and written once per call, coalesced.
#include "common.cuh"

#define DR_D 128
#define DR_WARPS 8
#define DR_COLS (DR_D / DR_WARPS)

PN_DEV float pn_softplus(float u) { return u > 20.0f ? u : log1pf(expf(u)); }

extern "C" {
// q, k: L2-normalised key heads (q already scaled), head kh = p % n_k_heads at q + t*qk_stride +
// kh*D; v at v + t*v_stride + p*D; b, al raw projections at [t*ab_stride + p].
// out[t*out_stride + p*D + j] = o_j. beta = sigmoid(b); g = softplus(al + dt_bias) * ssm_a.
__global__ void __launch_bounds__(256) delta_rule_f32(const float* __restrict__ q, const float* __restrict__ k, long long qk_stride,
                                                      const float* __restrict__ v, long long v_stride,
                                                      const float* __restrict__ b, const float* __restrict__ al, long long ab_stride,
                                                      const float* __restrict__ dt_bias, const float* __restrict__ ssm_a,
                                                      float* __restrict__ state, float* __restrict__ out, long long out_stride,
                                                      int n_k_heads, int T) {
    __shared__ float qs[DR_D], ks[DR_D], vs[DR_D];
    const int p = blockIdx.x, kh = p % n_k_heads;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float* sp = state + (long long)p * DR_D * DR_D;
    float S[DR_COLS][4];
#pragma unroll
    for (int c = 0; c < DR_COLS; ++c)
#pragma unroll
        for (int m = 0; m < 4; ++m) S[c][m] = sp[(warp * DR_COLS + c) * DR_D + lane + 32 * m];
    for (int t = 0; t < T; ++t) {
        __syncthreads();
        if (threadIdx.x < DR_D) {
            qs[threadIdx.x] = q[t * qk_stride + kh * DR_D + threadIdx.x];
            ks[threadIdx.x] = k[t * qk_stride + kh * DR_D + threadIdx.x];
            vs[threadIdx.x] = v[t * v_stride + p * DR_D + threadIdx.x];
        }
        __syncthreads();
        const float beta = pn_sigmoid(b[t * ab_stride + p]);
        const float decay = expf(pn_softplus(al[t * ab_stride + p] + dt_bias[p]) * ssm_a[p]);
        float kr[4], qr[4];
#pragma unroll
        for (int m = 0; m < 4; ++m) { kr[m] = ks[lane + 32 * m]; qr[m] = qs[lane + 32 * m]; }
#pragma unroll
        for (int c = 0; c < DR_COLS; ++c) {
            const int j = warp * DR_COLS + c;
            float pred = 0.0f;
#pragma unroll
            for (int m = 0; m < 4; ++m) { S[c][m] *= decay; pred += S[c][m] * kr[m]; }
            pred = pn_warp_sum(pred);
            const float d = beta * (vs[j] - pred);
            float o = 0.0f;
#pragma unroll
            for (int m = 0; m < 4; ++m) { S[c][m] += kr[m] * d; o += S[c][m] * qr[m]; }
            o = pn_warp_sum(o);
            if (lane == 0) out[t * out_stride + p * DR_D + j] = o;
        }
    }
#pragma unroll
    for (int c = 0; c < DR_COLS; ++c)
#pragma unroll
        for (int m = 0; m < 4; ++m) sp[(warp * DR_COLS + c) * DR_D + lane + 32 * m] = S[c][m];
}
}
