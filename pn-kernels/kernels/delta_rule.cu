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

// The recurrence of both kernels below. NORM: q and k arrive raw and are L2-normalised here
// (q also scaled by q_scale), as norm.cu's l2_norm_f32 would: x * (scale / max(||x||, eps)), the
// squares summed by the four warps that load the head (a fixed order), so decode needs no
// separate norm launches.
template <bool NORM>
PN_DEV void delta_rule_body(const float* __restrict__ q, const float* __restrict__ k, long long qk_stride,
                            const float* __restrict__ v, long long v_stride, const float* __restrict__ b,
                            const float* __restrict__ al, long long ab_stride, const float* __restrict__ dt_bias,
                            const float* __restrict__ ssm_a, float* __restrict__ state, float* __restrict__ out,
                            long long out_stride, int n_k_heads, int T, float q_scale, float eps) {
    __shared__ float qs[DR_D], ks[DR_D], vs[DR_D];
    // Per-warp partial sums of q^2 (row 0) and k^2 (row 1) of the head (NORM only).
    __shared__ float nrm[2][DR_D / 32];
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
        float fq = 1.0f, fk = 1.0f;
        if (NORM) {
            if (threadIdx.x < DR_D) {
                const float qq = pn_warp_sum(qs[threadIdx.x] * qs[threadIdx.x]);
                const float kk = pn_warp_sum(ks[threadIdx.x] * ks[threadIdx.x]);
                if (lane == 0) { nrm[0][warp] = qq; nrm[1][warp] = kk; }
            }
            __syncthreads();
            float sq = 0.0f, sk = 0.0f;
#pragma unroll
            for (int w = 0; w < DR_D / 32; ++w) { sq += nrm[0][w]; sk += nrm[1][w]; }
            fq = q_scale / fmaxf(sqrtf(sq), eps);
            fk = 1.0f / fmaxf(sqrtf(sk), eps);
        }
        const float beta = pn_sigmoid(b[t * ab_stride + p]);
        const float decay = expf(pn_softplus(al[t * ab_stride + p] + dt_bias[p]) * ssm_a[p]);
        float kr[4], qr[4];
#pragma unroll
        for (int m = 0; m < 4; ++m) {
            kr[m] = NORM ? ks[lane + 32 * m] * fk : ks[lane + 32 * m];
            qr[m] = NORM ? qs[lane + 32 * m] * fq : qs[lane + 32 * m];
        }
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
    delta_rule_body<false>(q, k, qk_stride, v, v_stride, b, al, ab_stride, dt_bias, ssm_a, state, out, out_stride, n_k_heads, T,
                           1.0f, 0.0f);
}
// delta_rule_f32 on raw q and k (read, not written): each head normalised in the block,
// q to q_scale / max(||q||, eps), k to 1 / max(||k||, eps).
__global__ void __launch_bounds__(256) delta_rule_l2_f32(const float* __restrict__ q, const float* __restrict__ k, long long qk_stride,
                                                         const float* __restrict__ v, long long v_stride,
                                                         const float* __restrict__ b, const float* __restrict__ al, long long ab_stride,
                                                         const float* __restrict__ dt_bias, const float* __restrict__ ssm_a,
                                                         float* __restrict__ state, float* __restrict__ out, long long out_stride,
                                                         int n_k_heads, int T, float q_scale, float eps) {
    delta_rule_body<true>(q, k, qk_stride, v, v_stride, b, al, ab_stride, dt_bias, ssm_a, state, out, out_stride, n_k_heads, T,
                          q_scale, eps);
}
}
