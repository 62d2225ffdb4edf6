// Gated delta rule (Gated DeltaNet recurrent form), fp32 state, T tokens in order
// (qwen38-architecture.md 4.3 steps 5-6). Decode is T = 1; prefill runs the exact recurrence.
//
// State of value head p: s[p*D*D + j*D + i] = S[i][j] (ggml's layout: contiguous over the key
// dim i). One thread block per value head, 8 warps; warp w owns value columns j = w*16 .. +16 and
// lane l holds S[i][j] for i = l, l+32, l+64, l+96 in registers for all tokens: the state is read
// and written once per call, coalesced.
#include "conv1d.cuh"
#include "rowsync.cuh"

#define DR_D 128
#define DR_WARPS 8
#define DR_COLS (DR_D / DR_WARPS)

PN_DEV float pn_softplus(float u) { return u > 20.0f ? u : log1pf(expf(u)); }

// The conv1d of the decode delta rule that runs it itself (delta_rule_conv_f32): the raw conv
// input rows u (u + t*u_stride, C channels: q | k | v, kd = n_k_heads * D each for q and k),
// weights w[c*4 + tap], the rolling state [3][C] (read, then shifted), the conv output rows y
// (y + t*y_stride, written as conv1d_silu_f32 writes them), and sync: one zeroed counter per key
// head.
struct DrConv {
    const float* u;
    long long u_stride;
    const float* w;
    float* state;
    float* y;
    long long y_stride;
    unsigned* sync;
    int C;
    int kd;
};

// The recurrence of both kernels below. NORM: q and k arrive raw and are L2-normalised here
// (q also scaled by q_scale), as norm.cu's l2_norm_f32 would: x * (scale / max(||x||, eps)), the
// squares summed by the four warps that load the head (a fixed order), so decode needs no
// separate norm launches.
// CONV: q, k and v come from the conv1d + SiLU of `cv` computed here (conv1d.cuh: the bits of
// conv1d_silu_f32): threads below D own the q and k channels of key head kh, the others the v
// channel of value head p, each with its three state values and four weights in registers for
// all tokens. The v state is this block's alone; the q/k state of kh is read by every value
// head of its group, so the block that arrives last (rowsync.cuh) writes it.
template <bool NORM, bool CONV>
PN_DEV void delta_rule_body(const float* __restrict__ q, const float* __restrict__ k, long long qk_stride,
                            const float* __restrict__ v, long long v_stride, const float* __restrict__ b,
                            const float* __restrict__ al, long long ab_stride, const float* __restrict__ dt_bias,
                            const float* __restrict__ ssm_a, float* __restrict__ state, float* __restrict__ out,
                            long long out_stride, int n_k_heads, int T, float q_scale, float eps, const DrConv cv) {
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
    // CONV: this thread's channels (ch[0] q or v, ch[1] k), their states and weights.
    const bool qk_thr = threadIdx.x < DR_D;
    const int ci = threadIdx.x & (DR_D - 1), nch = qk_thr ? 2 : 1;
    int ch[2] = {0, 0};
    float cs[2][3] = {{0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f}}, cw[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
    if (CONV) {
        ch[0] = qk_thr ? kh * DR_D + ci : 2 * cv.kd + p * DR_D + ci;
        ch[1] = cv.kd + kh * DR_D + ci;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            if (j < nch) {
#pragma unroll
                for (int m = 0; m < 3; ++m) cs[j][m] = cv.state[m * cv.C + ch[j]];
#pragma unroll
                for (int m = 0; m < 4; ++m) cw[j][m] = cv.w[4 * ch[j] + m];
            }
        }
    }
    for (int t = 0; t < T; ++t) {
        __syncthreads();
        if (CONV) {
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                if (j < nch) {
                    const float u = cv.u[t * cv.u_stride + ch[j]];
                    const float y = pn_conv4_silu(cw[j][0], cw[j][1], cw[j][2], cw[j][3], cs[j][0], cs[j][1], cs[j][2], u);
                    cs[j][0] = cs[j][1];
                    cs[j][1] = cs[j][2];
                    cs[j][2] = u;
                    float* dst = qk_thr ? (j == 0 ? qs : ks) : vs;
                    dst[ci] = y;
                    // Every block of a group computes its key head's q/k: the first writes them.
                    if (!qk_thr || p < n_k_heads) cv.y[t * cv.y_stride + ch[j]] = y;
                }
            }
        } else if (threadIdx.x < DR_D) {
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
    if (CONV) {
        PN_SMEM(unsigned, flag, 1);
        if (!qk_thr) {
#pragma unroll
            for (int m = 0; m < 3; ++m) cv.state[m * cv.C + ch[0]] = cs[0][m];
        }
        // The q/k state after every block of the key head has read it (all did, at the start).
        const bool last = pn_arrive_last(cv.sync + kh, (unsigned)(gridDim.x / n_k_heads), flag);
        if (last && qk_thr) {
#pragma unroll
            for (int j = 0; j < 2; ++j)
#pragma unroll
                for (int m = 0; m < 3; ++m) cv.state[m * cv.C + ch[j]] = cs[j][m];
        }
    }
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
    delta_rule_body<false, false>(q, k, qk_stride, v, v_stride, b, al, ab_stride, dt_bias, ssm_a, state, out, out_stride, n_k_heads,
                                  T, 1.0f, 0.0f, DrConv{});
}
// delta_rule_f32 on raw q and k (read, not written): each head normalised in the block,
// q to q_scale / max(||q||, eps), k to 1 / max(||k||, eps).
__global__ void __launch_bounds__(256) delta_rule_l2_f32(const float* __restrict__ q, const float* __restrict__ k, long long qk_stride,
                                                         const float* __restrict__ v, long long v_stride,
                                                         const float* __restrict__ b, const float* __restrict__ al, long long ab_stride,
                                                         const float* __restrict__ dt_bias, const float* __restrict__ ssm_a,
                                                         float* __restrict__ state, float* __restrict__ out, long long out_stride,
                                                         int n_k_heads, int T, float q_scale, float eps) {
    delta_rule_body<true, false>(q, k, qk_stride, v, v_stride, b, al, ab_stride, dt_bias, ssm_a, state, out, out_stride, n_k_heads,
                                 T, q_scale, eps, DrConv{});
}
// conv1d_silu_f32 (kernel 4) then delta_rule_l2_f32 in one launch (decode and short inputs):
// q, k and v are the conv + SiLU of the raw input rows cv.u, written to cv.y as the conv kernel
// writes them, and the conv state is shifted as it shifts it. One block of 256 threads per value
// head; n_v_heads (the grid) a multiple of n_k_heads; cv.sync: n_k_heads zeroed counters (left
// zeroed).
__global__ void __launch_bounds__(256) delta_rule_conv_f32(const DrConv cv, const float* __restrict__ b,
                                                           const float* __restrict__ al, long long ab_stride,
                                                           const float* __restrict__ dt_bias, const float* __restrict__ ssm_a,
                                                           float* __restrict__ state, float* __restrict__ out,
                                                           long long out_stride, int n_k_heads, int T, float q_scale,
                                                           float eps) {
    delta_rule_body<true, true>(nullptr, nullptr, 0, nullptr, 0, b, al, ab_stride, dt_bias, ssm_a, state, out, out_stride,
                                n_k_heads, T, q_scale, eps, cv);
}
}
