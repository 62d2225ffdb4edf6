// Per-element math of the chunked gated delta rule (delta_rule_chunked.cu), shared with the host
// test shim (host/shim.cpp) so that the gate, coefficient and triangular-solve pieces are checked
// on the CPU against the Rust references in qwen-model (cpu/kernels.rs: gdn_gates,
// gdn_chunked_heads, gdn_recurrent_heads).
//
// Algebra (the CPU's chunked form): within a chunk of c tokens with inclusive cumulative
// log-decay G_t and chunk-start state S,
//   U_t = beta_t * (v_t - e^{G_t} S^T k_t - sum_{s<t} e^{G_t-G_s} (k_t.k_s) U_s)
//   o_t = e^{G_t} S^T q_t + sum_{s<=t} e^{G_t-G_s} (q_t.k_s) U_s
//   S  <- e^{G_last} S + sum_s e^{G_last-G_s} k_s U_s^T
// Every exponent is a difference G_t - G_s with s <= t, so it is <= 0 whenever the gates decay
// (ssm_a < 0): nothing overflows, strong decay underflows to 0 as the recurrence does.
#pragma once
#include "common.cuh"

// Key and value head dim (GDN_HEAD_DIM in pn-runtime).
#define PN_GDN_D 128
// Tokens per chunk. 32, not the CPU's 64: one block keeps the chunk's keys and queries (2 x C x
// 128 floats), the coefficient matrix (C x (C+1)) and U/O tiles in shared memory; at C = 64 the
// keys alone are 32 KB and keys + the two coefficient triangles already fill sm_60's 48 KB.
#define PN_GDN_C 32
// Value columns per block (the grid's y dim covers PN_GDN_D / PN_GDN_JB slices of a head).
#define PN_GDN_JB 32
// Row stride of the coefficient matrix: kk terms (s < t) at [t][s], qk terms (s <= t) at [s][t+1].
#define PN_GDN_MLD (PN_GDN_C + 1)
// Row stride of the U / O tiles (C x JB): 36 spreads the 8 lanes of a column, which read rows
// s = r + 8i, over distinct banks (4 * r + column).
#define PN_GDN_ULD (PN_GDN_JB + 4)

// Unroll hints for the kernel, spelled as _Pragma so that the host build (the test shim runs the
// kernel source through host/simt_emu.h) sees nothing instead of an unknown pragma.
#if defined(__CUDACC__)
#define PN_GDN_UNROLL _Pragma("unroll")
#define PN_GDN_UNROLL8 _Pragma("unroll 8")
#else
#define PN_GDN_UNROLL
#define PN_GDN_UNROLL8
#endif

PN_HD float pn_gdn_exp(float x) {
#if defined(__CUDA_ARCH__)
    return expf(x);
#else
    return std::exp(x);
#endif
}

PN_HD float pn_gdn_log1p(float x) {
#if defined(__CUDA_ARCH__)
    return log1pf(x);
#else
    return std::log1p(x);
#endif
}

// Gate values of one token and value head: beta = sigmoid(b), g = softplus(al + dt_bias) * a,
// the log of the token's decay (a = ssm_a = -exp(A_log)).
PN_HD void pn_gdn_gate(float b, float al, float dt_bias, float a, float* beta, float* g) {
    *beta = 1.0f / (1.0f + pn_gdn_exp(-b));
    const float u = al + dt_bias;
    const float sp = u > 20.0f ? u : pn_gdn_log1p(pn_gdn_exp(u));
    *g = sp * a;
}

// Inclusive running sum of the log-decays of a chunk, in token order (as the CPU accumulates).
PN_HD void pn_gdn_cumsum(const float* g, float* gcum, int c) {
    float acc = 0.0f;
    for (int t = 0; t < c; ++t) {
        acc += g[t];
        gcum[t] = acc;
    }
}

// Weight of token s's contribution in row t (s <= t): the decay from s to t times a dot product.
PN_HD float pn_gdn_coef(float gt, float gs, float dot) { return pn_gdn_exp(gt - gs) * dot; }

// Row t of entry `idx` of a lower triangle stored row by row with the diagonal (row t starts at
// t (t + 1) / 2); the column is idx - t (t + 1) / 2. The float root is only a first guess, fixed
// up by the integer checks, so the result is exact for every idx.
PN_HD int pn_gdn_tri_row(int idx) {
#if defined(__CUDA_ARCH__)
    int t = (int)((sqrtf(8.0f * (float)idx + 1.0f) - 1.0f) * 0.5f);
#else
    int t = (int)((std::sqrt(8.0f * (float)idx + 1.0f) - 1.0f) * 0.5f);
#endif
    if (t < 0) t = 0;
    while ((t + 1) * (t + 2) / 2 <= idx) ++t;
    while (t * (t + 1) / 2 > idx) --t;
    return t;
}

// Index of the kk coefficient (s < t) and of the qk coefficient (s <= t) in the shared matrix.
PN_HD int pn_gdn_mkk(int t, int s) { return t * PN_GDN_MLD + s; }
PN_HD int pn_gdn_mqk(int t, int s) { return s * PN_GDN_MLD + t + 1; }

// Forward-substitution partial sum for row t of one value column: sum over s < t with
// s = r (mod step) of kk[t][s] * U[s]. The kernel splits a column over 8 lanes (step 8) and adds
// the partials; the host calls it the same way.
PN_HD float pn_gdn_solve_partial(const float* m, const float* u, int ldu, int t, int r, int step) {
    float acc = 0.0f;
    for (int s = r; s < t; s += step) acc += m[pn_gdn_mkk(t, s)] * u[s * ldu];
    return acc;
}

// Row t of U from its right-hand side rhs = v_t - e^{G_t} S^T k_t and the substitution sum.
PN_HD float pn_gdn_solve_finish(float beta, float rhs, float sum) { return beta * (rhs - sum); }

// Intra-chunk part of output row t of one value column: sum over s <= t of qk[t][s] * U[s].
PN_HD float pn_gdn_out_intra(const float* m, const float* u, int ldu, int t) {
    float acc = 0.0f;
    for (int s = 0; s <= t; ++s) acc += m[pn_gdn_mqk(t, s)] * u[s * ldu];
    return acc;
}
