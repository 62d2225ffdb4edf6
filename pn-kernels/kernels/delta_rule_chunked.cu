// Gated delta rule, chunked form, for prefill (qwen38-architecture.md 4.3 steps 5-6): the same
// inputs, outputs and final state as delta_rule_f32 (delta_rule.cu) up to fp32 rounding, but the
// per-token chain of block-wide steps is replaced by, per chunk of PN_GDN_C tokens, two C x C
// coefficient triangles, a warp-local forward substitution and rank-C state updates. The algebra
// and the host-checked per-element pieces are in delta_rule_chunked.cuh.
//
// Layout: value columns j of the state are independent in the delta rule (S[:, j] only ever
// meets v_j), so a head is split over gridDim.y = 128 / PN_GDN_JB blocks of PN_GDN_JB columns,
// which also gives sm_60's 56 SMs 4x the blocks of the one-block-per-head sequential kernel.
// Warp w owns local columns 4w .. 4w+3; the 8 lanes of a column (r = lane & 7) hold
// S[i][j] for i = r + 8m, m < 16, in registers for the whole call. Every per-column step
// (S^T k, S^T q, the substitution, the outputs, the state update) is then warp-local: its
// reductions are 3 shuffles within the 8 lanes and only the chunk loads and the coefficient
// matrix need block barriers. fp32 accumulation throughout.
#include "delta_rule_chunked.cuh"

#define DRC_THREADS 256
#define DRC_LANES_PER_COL 8
#define DRC_ROWS (PN_GDN_D / DRC_LANES_PER_COL)

// Sum over the 8 lanes of a column group (xor offsets below 8 stay inside the group).
__device__ __forceinline__ float drc_group_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    v += __shfl_xor_sync(0xffffffffu, v, 4);
    return v;
}

extern "C" {
// Arguments as delta_rule_f32. Grid (n_v_heads, PN_GDN_D / PN_GDN_JB), 256 threads.
__global__ void __launch_bounds__(DRC_THREADS) delta_rule_chunked_f32(const float* __restrict__ q, const float* __restrict__ k, long long qk_stride,
                                                                      const float* __restrict__ v, long long v_stride,
                                                                      const float* __restrict__ b, const float* __restrict__ al, long long ab_stride,
                                                                      const float* __restrict__ dt_bias, const float* __restrict__ ssm_a,
                                                                      float* __restrict__ state, float* __restrict__ out, long long out_stride,
                                                                      int n_k_heads, int T) {
    __shared__ float ks[PN_GDN_C * PN_GDN_D];
    __shared__ float qs[PN_GDN_C * PN_GDN_D];
    __shared__ float mc[PN_GDN_C * PN_GDN_MLD];
    __shared__ float us[PN_GDN_C * PN_GDN_ULD];
    __shared__ float os[PN_GDN_C * PN_GDN_ULD];
    __shared__ float graw[PN_GDN_C], gcum[PN_GDN_C], betas[PN_GDN_C];

    const int p = blockIdx.x, kh = p % n_k_heads;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int cl = warp * 4 + (lane >> 3);
    const int r = lane & (DRC_LANES_PER_COL - 1);
    const int j = blockIdx.y * PN_GDN_JB + cl;
    float* sp = state + (long long)p * PN_GDN_D * PN_GDN_D + (long long)j * PN_GDN_D;
    float S[DRC_ROWS];
PN_GDN_UNROLL
    for (int m = 0; m < DRC_ROWS; ++m) S[m] = sp[r + DRC_LANES_PER_COL * m];

    for (int t0 = 0; t0 < T; t0 += PN_GDN_C) {
        const int c = min(PN_GDN_C, T - t0);
        // The previous chunk's readers of ks/qs/mc/gates are done.
        __syncthreads();
        for (int idx = tid; idx < c * PN_GDN_D; idx += DRC_THREADS) {
            const int t = idx / PN_GDN_D, d = idx % PN_GDN_D;
            const long long at = (long long)(t0 + t) * qk_stride + (long long)kh * PN_GDN_D + d;
            ks[idx] = k[at];
            qs[idx] = q[at];
        }
        if (tid < c) {
            const long long at = (long long)(t0 + tid) * ab_stride + p;
            float be, g;
            pn_gdn_gate(b[at], al[at], dt_bias[p], ssm_a[p], &be, &g);
            betas[tid] = be;
            graw[tid] = g;
        }
        __syncthreads();
        if (tid == 0) pn_gdn_cumsum(graw, gcum, c);
        __syncthreads();

        // Coefficient matrix over the c (c + 1) / 2 pairs s <= t, numbered row by row, so no
        // thread idles on the upper triangle. The dot runs from d = s on: lanes on consecutive s
        // read ks[s][d] in distinct banks.
        const int npairs = c * (c + 1) / 2;
        for (int idx = tid; idx < npairs; idx += DRC_THREADS) {
            const int t = pn_gdn_tri_row(idx), s = idx - t * (t + 1) / 2;
            const float* kt = ks + t * PN_GDN_D;
            const float* qt = qs + t * PN_GDN_D;
            const float* kr = ks + s * PN_GDN_D;
            float dkk = 0.0f, dqk = 0.0f;
PN_GDN_UNROLL8
            for (int e = 0; e < PN_GDN_D; ++e) {
                const int d = (e + s) & (PN_GDN_D - 1);
                const float x = kr[d];
                dkk += kt[d] * x;
                dqk += qt[d] * x;
            }
            if (s < t) mc[pn_gdn_mkk(t, s)] = pn_gdn_coef(gcum[t], gcum[s], dkk);
            mc[pn_gdn_mqk(t, s)] = pn_gdn_coef(gcum[t], gcum[s], dqk);
        }
        __syncthreads();

        // S^T k_t and S^T q_t against the chunk-start state: the right-hand sides of the
        // substitution and the inter-chunk part of the outputs.
        for (int t = 0; t < c; ++t) {
            const float* kt = ks + t * PN_GDN_D + r;
            const float* qt = qs + t * PN_GDN_D + r;
            float xk = 0.0f, xq = 0.0f;
PN_GDN_UNROLL
            for (int m = 0; m < DRC_ROWS; ++m) {
                xk += S[m] * kt[DRC_LANES_PER_COL * m];
                xq += S[m] * qt[DRC_LANES_PER_COL * m];
            }
            xk = drc_group_sum(xk);
            xq = drc_group_sum(xq);
            if (r == 0) {
                const float eg = pn_gdn_exp(gcum[t]);
                us[t * PN_GDN_ULD + cl] = v[(long long)(t0 + t) * v_stride + (long long)p * PN_GDN_D + j] - eg * xk;
                os[t * PN_GDN_ULD + cl] = eg * xq;
            }
        }
        __syncwarp();

        // Forward substitution, one row at a time; lane r adds the terms s = r (mod 8).
        for (int t = 0; t < c; ++t) {
            const float part = drc_group_sum(pn_gdn_solve_partial(mc, us + cl, PN_GDN_ULD, t, r, DRC_LANES_PER_COL));
            if (r == 0) us[t * PN_GDN_ULD + cl] = pn_gdn_solve_finish(betas[t], us[t * PN_GDN_ULD + cl], part);
            __syncwarp();
        }

        // Outputs: lane r writes rows t = r (mod 8) of its column.
        for (int t = r; t < c; t += DRC_LANES_PER_COL) {
            out[(long long)(t0 + t) * out_stride + (long long)p * PN_GDN_D + j] =
                os[t * PN_GDN_ULD + cl] + pn_gdn_out_intra(mc, us + cl, PN_GDN_ULD, t);
        }

        // State: decay to the chunk end, plus each token's write decayed from its position.
        const float glast = gcum[c - 1];
        const float el = pn_gdn_exp(glast);
PN_GDN_UNROLL
        for (int m = 0; m < DRC_ROWS; ++m) S[m] *= el;
        for (int t = 0; t < c; ++t) {
            const float w = pn_gdn_coef(glast, gcum[t], us[t * PN_GDN_ULD + cl]);
            const float* kt = ks + t * PN_GDN_D + r;
PN_GDN_UNROLL
            for (int m = 0; m < DRC_ROWS; ++m) S[m] += w * kt[DRC_LANES_PER_COL * m];
        }
        // The next chunk's U/O writes by lane 0 must not overtake this chunk's readers.
        __syncwarp();
    }
PN_GDN_UNROLL
    for (int m = 0; m < DRC_ROWS; ++m) sp[r + DRC_LANES_PER_COL * m] = S[m];
}
}
