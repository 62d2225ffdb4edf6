// Fused kernels inside the mixers of the decode path (issue #23: launches per token). Each one
// replaces a sequence of single-purpose launches and keeps the arithmetic of that sequence
// (same operations in the same order, the same block sizes for the reductions), so its results
// are those of the unfused kernels:
// - qk_norm_rope_f32: the per-head RMSNorm of the q and k heads (norm.cu rms_norm_f32, 256
//   threads) and NeoX RoPE (rope.cu) of both, one launch instead of four;
// - sigmoid_gate_hadamard_f32: the attention output gate (elementwise.cu sigmoid_gate_f32) and
//   the rotation of its result into the o-projection's input (hadamard.cu), one launch instead of
//   three (gate, copy, rotation);
// - gated_rms_norm_hadamard_f32: the GDN output norm (norm.cu gated_rms_norm_f32, 128 threads)
//   and the rotation of ssm_out's input, one launch instead of three;
// - attn_combine_gate_hadamard_f32: the merge of the split-K attention partials (attention.cu
//   attn_combine), the output gate and the rotation, one launch instead of two.
// (The GDN input norm's rotated and unrotated rows come from fuse.cu's
// add_rms_norm_hadamard_prep_f32, with the residual add and the fp16 copy.)
// The two kernels that produce a PN projection's rotated input (the attention merge and the GDN
// gated norm) also write its prepared fp16 copy when `xh` is given (rows of row_len values: the
// o-projection's / ssm_out's K), with the bits of pn_prepare_x_h2 on the f32 rows they write:
// the blocks of a row publish their maximum and the last one converts the row
// (rowsync.cuh), so the projection needs no prepare launch.
#include "hadamard.cuh"
#include "rowsync.cuh"

extern "C" {
// Per-head RMSNorm (weights wq / wk of n floats) then partial NeoX RoPE (the first n_rot dims,
// positions pos0 + t, frequency base) of the q heads (q + t*q_ts + h*q_hs, h < n_q) and the k
// heads (k + t*k_ts + h*k_hs, h < n_k), in place. Grid (n_q + n_k, min(T, 65535)): block x is a
// q head below n_q, else k head x - n_q; grid y strides over the T tokens. 256 threads (the
// block size of rms_norm_f32, so the sum of squares reduces in its order); dynamic shared memory
// n floats holding the normalised head, so each rotated pair reads both of its inputs before
// either is written. Consecutive threads take consecutive words: conflict-free.
__global__ void __launch_bounds__(256) qk_norm_rope_f32(float* q, long long q_ts, long long q_hs, float* k, long long k_ts,
                                                        long long k_hs, const float* __restrict__ wq,
                                                        const float* __restrict__ wk, int n_q, int n, float eps, int pos0,
                                                        int n_rot, float base, int n_tokens) {
    PN_DYN_SMEM(float, buf);
    PN_SMEM(float, scratch, 32);
    const bool is_q = (int)blockIdx.x < n_q;
    const int h = is_q ? (int)blockIdx.x : (int)blockIdx.x - n_q;
    const float* __restrict__ w = is_q ? wq : wk;
    const int half = n_rot / 2;
    for (int t = blockIdx.y; t < n_tokens; t += gridDim.y) {
        float* x = is_q ? q + t * q_ts + h * q_hs : k + t * k_ts + h * k_hs;
        float ss = 0.0f;
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const float v = x[i];
            buf[i] = v;
            ss += v * v;
        }
        ss = pn_block_sum(ss, scratch);
        const float inv = 1.0f / sqrtf(ss / (float)n + eps);
        for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = buf[i] * inv * w[i];
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            if (i < n_rot) {
                // Pair (j, j + half): thread j writes the first, thread j + half the second,
                // each with the angle of rope.cu (double, then rounded to f32).
                const int j = i < half ? i : i - half;
                const double inv_freq = pow((double)base, -2.0 * (double)j / (double)n_rot);
                const double theta = (double)(pos0 + t) * inv_freq;
                const float c = (float)cos(theta), s = (float)sin(theta);
                const float a = buf[j], b = buf[j + half];
                x[i] = i < half ? a * c - b * s : a * s + b * c;
            } else {
                x[i] = buf[i];
            }
        }
        // The next token reuses buf.
        __syncthreads();
    }
}

// out = H_R(x * sigmoid(g)) over the chunk of R values of block x (R a power of two): x
// [T][n_heads][hd] contiguous, its gate at g[t*g_ts + h*g_hs + i]; x is not written. Threads
// R/2 (32..512); dynamic shared memory R floats.
__global__ void __launch_bounds__(512) sigmoid_gate_hadamard_f32(const float* __restrict__ x, const float* __restrict__ g,
                                                                 float* __restrict__ out, int hd, int n_heads,
                                                                 long long g_ts, long long g_hs, int R, float scale) {
    PN_DYN_SMEM(float, buf);
    const long long base = (long long)blockIdx.x * R;
    for (int i = threadIdx.x; i < R; i += blockDim.x) {
        const long long e = base + i, row = e / hd, t = row / n_heads, h = row % n_heads;
        buf[i] = x[e] * pn_sigmoid(g[t * g_ts + h * g_hs + e % hd]);
    }
    __syncthreads();
    pn_fwht_smem(buf, R, R);
    for (int i = threadIdx.x; i < R; i += blockDim.x) out[base + i] = buf[i] * scale;
}

// out = H_R(rms(o) * w * silu(z)) per row of n values (w shared by the rows), over the span of
// max(n, R) values of block x (span a multiple of both; the rows of the span are normalised one
// after the other, each by a block-wide sum). o and z contiguous and alike; o is not written.
// 128 threads (the block size of gated_rms_norm_f32); dynamic shared memory span floats.
// With xh: the fp16 copy of each row of row_len values (a multiple of span) into xh + row *
// row_len / 2 and e_out[row]; sync: 2 zeroed words per row.
__global__ void __launch_bounds__(128) gated_rms_norm_hadamard_f32(const float* __restrict__ o, const float* __restrict__ z,
                                                                   const float* __restrict__ w, float* out, int n,
                                                                   float eps, int span, int R, float scale,
                                                                   __half2* __restrict__ xh, int* __restrict__ e_out,
                                                                   unsigned* sync, int row_len) {
    PN_DYN_SMEM(float, buf);
    PN_SMEM(float, scratch, 32);
    PN_SMEM(unsigned, bc, 2);
    const long long base = (long long)blockIdx.x * span;
    for (int r0 = 0; r0 < span; r0 += n) {
        const float* orow = o + base + r0;
        const float* zr = z + base + r0;
        float ss = 0.0f;
        for (int i = threadIdx.x; i < n; i += blockDim.x) ss += orow[i] * orow[i];
        ss = pn_block_sum(ss, scratch);
        const float inv = 1.0f / sqrtf(ss / (float)n + eps);
        for (int i = threadIdx.x; i < n; i += blockDim.x) buf[r0 + i] = orow[i] * inv * w[i] * pn_silu(zr[i]);
    }
    __syncthreads();
    pn_fwht_smem(buf, span, R);
    float amax = 0.0f;
    for (int i = threadIdx.x; i < span; i += blockDim.x) {
        const float v = buf[i] * scale;
        out[base + i] = v;
        amax = fmaxf(amax, fabsf(v));
    }
    if (xh) {
        const long long row = base / row_len;
        amax = pn_block_max(amax, scratch);
        pn_row_prepare(out + row * row_len, row_len, amax, sync + 2 * row, (unsigned)(row_len / span), xh + row * (row_len / 2),
                       e_out + row, bc);
    }
}

// attn_combine (attention.cu) of the split-K partials, then the output gate, then the rotation:
// out = H_R(combine(part) * sigmoid(g)) over the chunk of R values of block x of the attention
// output [T][n_head][256]; part_o [T][n_head][n_split][256], part_ml [T][n_head][n_split][2]
// (max, sum; a sum of 0 marks a split past the query's causal end); the gate of value (t, h, d)
// at g[t*g_ts + h*g_hs + d]. Each value merges its splits in attn_combine's order. Threads R/2
// (32..512); dynamic shared memory R floats. With xh: the fp16 copy of each token's row
// (n_head * 256 values, a multiple of R) into xh + t * n_head * 128 and e_out[t]; sync: 2
// zeroed words per token.
__global__ void __launch_bounds__(512) attn_combine_gate_hadamard_f32(const float* __restrict__ part_o,
                                                                      const float* __restrict__ part_ml, int n_split,
                                                                      int n_head, const float* __restrict__ g,
                                                                      long long g_ts, long long g_hs, float* out,
                                                                      int R, float scale, __half2* __restrict__ xh,
                                                                      int* __restrict__ e_out, unsigned* sync) {
    PN_DYN_SMEM(float, buf);
    PN_SMEM(float, scratch, 32);
    PN_SMEM(unsigned, bc, 2);
    const long long base = (long long)blockIdx.x * R;
    for (int i = threadIdx.x; i < R; i += blockDim.x) {
        const long long e = base + i, row = e / 256, t = row / n_head, h = row % n_head;
        const int d = (int)(e % 256);
        const long long pb = row * n_split;
        float M = -PN_INF;
        for (int s = 0; s < n_split; ++s) if (part_ml[2 * (pb + s) + 1] > 0.0f) M = fmaxf(M, part_ml[2 * (pb + s)]);
        float L = 0.0f, A = 0.0f;
        for (int s = 0; s < n_split; ++s) {
            const float ls = part_ml[2 * (pb + s) + 1];
            if (ls == 0.0f) continue;
            const float f = expf(part_ml[2 * (pb + s)] - M);
            L += ls * f;
            A += part_o[(pb + s) * 256 + d] * f;
        }
        const float o = L > 0.0f ? A / L : 0.0f;
        buf[i] = o * pn_sigmoid(g[t * g_ts + h * g_hs + d]);
    }
    __syncthreads();
    pn_fwht_smem(buf, R, R);
    float amax = 0.0f;
    for (int i = threadIdx.x; i < R; i += blockDim.x) {
        const float v = buf[i] * scale;
        out[base + i] = v;
        amax = fmaxf(amax, fabsf(v));
    }
    if (xh) {
        const int row_len = n_head * 256;
        const long long t = base / row_len;
        amax = pn_block_max(amax, scratch);
        pn_row_prepare(out + t * row_len, row_len, amax, sync + 2 * t, (unsigned)(row_len / R), xh + t * (row_len / 2),
                       e_out + t, bc);
    }
}
}
