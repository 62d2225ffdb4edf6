// Attention over a KV cache of f16, f32, q8_0 or q4_0 rows, head_dim 256, GQA (q head h reads kv
// head h / group).
//
// Cache layout by strides (in cache elements: halves, floats, or bytes for q8_0/q4_0): the row of
// kv head g at position j starts at j*pos_stride + g*head_stride. A row is 256 values (f16/f32),
// 8 Q8_0 blocks of 32 (272 bytes) or 8 Q4_0 blocks (144 bytes). Head-major [n_kv][cap][row]:
// (row, cap*row); token-major [cap][n_kv][row] (the CPU backend's): (n_kv*row, row). f16/f32
// rows 16-byte aligned, q8_0/q4_0 rows 2-byte aligned.
// Split-K ("flash decoding"): grid (n_head, n_split, T). Split s of query t covers positions
// [s*chunk, min(n_ctx_t, (s+1)*chunk)) with n_ctx_t = p0 + t + 1 (causal; T = 1 is decode).
// Each warp takes every 8th position; lane l holds dims 8l..8l+8 (one 16-byte load per row), an
// online softmax per warp, then the 8 warps are merged; attn_combine merges the splits.
// Scores, softmax and the weighted sum are fp32; only K and V are stored in reduced precision.
#include "common.cuh"
#include "kv_blocks.cuh"

#define ATT_D 256
#define ATT_WARPS 8

// kv_store_*: K and V rows of token t, kv head g, into the caches at position p0 + t. Grid
// (n_kv, min(n_tokens, 65535)): grid y strides over the tokens (a prefill chunk may pass the
// grid's y limit). With
// v == vc == nullptr only K goes to kc (a single cache, e.g. the backend's row copy); the branch
// is uniform over the launch, so the warp-wide shuffles of the quantizers stay converged.

extern "C" __global__ void __launch_bounds__(256) kv_store_f16(const float* __restrict__ k, const float* __restrict__ v, long long tok_stride,
                                                    __half* __restrict__ kc, __half* __restrict__ vc, long long pos_stride, long long head_stride, int p0, int n_tokens) {
    const int g = blockIdx.x, d = threadIdx.x;
    for (int t = blockIdx.y; t < n_tokens; t += gridDim.y) {
        const long long dst = (long long)(p0 + t) * pos_stride + (long long)g * head_stride + d;
        kc[dst] = __float2half_rn(k[t * tok_stride + g * ATT_D + d]);
        if (vc != nullptr) vc[dst] = __float2half_rn(v[t * tok_stride + g * ATT_D + d]);
    }
}
extern "C" __global__ void __launch_bounds__(256) kv_store_f32(const float* __restrict__ k, const float* __restrict__ v, long long tok_stride,
                                                    float* __restrict__ kc, float* __restrict__ vc, long long pos_stride, long long head_stride, int p0, int n_tokens) {
    const int g = blockIdx.x, d = threadIdx.x;
    for (int t = blockIdx.y; t < n_tokens; t += gridDim.y) {
        const long long dst = (long long)(p0 + t) * pos_stride + (long long)g * head_stride + d;
        kc[dst] = k[t * tok_stride + g * ATT_D + d];
        if (vc != nullptr) vc[dst] = v[t * tok_stride + g * ATT_D + d];
    }
}
// Q8_0 rows as ggml's reference quantizer writes them: per 32 values d = amax/127, stored as
// f16; q = round(x / d) (half away from zero, computed as x * (1/d) with d in f32).
PN_DEV void kv_q8_0_store_one(const float* src, pn_u8* row, int d) {
    const float x = src[d];
    float amax = fabsf(x);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float dd = amax / 127.0f;
    const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
    pn_u8* blk = row + (d >> 5) * 34;
    blk[2 + (d & 31)] = (pn_u8)(pn_i8)roundf(x * id);
    if ((d & 31) == 0) *reinterpret_cast<pn_u16*>(blk) = __half_as_ushort(__float2half_rn(dd));
}
extern "C" __global__ void __launch_bounds__(256) kv_store_q8_0(const float* __restrict__ k, const float* __restrict__ v, long long tok_stride,
                                                               pn_u8* __restrict__ kc, pn_u8* __restrict__ vc, long long pos_stride,
                                                               long long head_stride, int p0, int n_tokens) {
    const int g = blockIdx.x, d = threadIdx.x;
    for (int t = blockIdx.y; t < n_tokens; t += gridDim.y) {
        const long long dst = (long long)(p0 + t) * pos_stride + (long long)g * head_stride;
        kv_q8_0_store_one(k + t * tok_stride + g * ATT_D, kc + dst, d);
        if (vc != nullptr) kv_q8_0_store_one(v + t * tok_stride + g * ATT_D, vc + dst, d);
    }
}

// Q4_0 rows as the CPU KV cache writes them (kv_blocks.cuh): lane d of warp w quantizes value d
// of block w; every lane finds the block's scale by the same serial scan of its 32 inputs (cached
// broadcast loads) so that the order of the CPU's fold is kept; lanes 0..15 pack their code with
// the one of lane + 16.
PN_DEV void kv_q4_0_store_one(const float* src, pn_u8* row, int d) {
    const float dd = q4_0_kv_scale(q4_0_kv_signed_absmax(src + (d & ~31)));
    const int c = q4_0_kv_code(src[d], q4_0_kv_inv_scale(dd));
    const int c_hi = __shfl_down_sync(0xffffffffu, c, 16);
    pn_u8* blk = row + (d >> 5) * PN_Q4_0_KV_BYTES;
    const int l = d & 31;
    if (l < 16) blk[2 + l] = q4_0_kv_pack(c, c_hi);
    if (l == 0) *reinterpret_cast<pn_u16*>(blk) = pn_f32_to_f16_bits(dd);
}
extern "C" __global__ void __launch_bounds__(256) kv_store_q4_0(const float* __restrict__ k, const float* __restrict__ v, long long tok_stride,
                                                               pn_u8* __restrict__ kc, pn_u8* __restrict__ vc, long long pos_stride,
                                                               long long head_stride, int p0, int n_tokens) {
    const int g = blockIdx.x, d = threadIdx.x;
    for (int t = blockIdx.y; t < n_tokens; t += gridDim.y) {
        const long long dst = (long long)(p0 + t) * pos_stride + (long long)g * head_stride;
        kv_q4_0_store_one(k + t * tok_stride + g * ATT_D, kc + dst, d);
        if (vc != nullptr) kv_q4_0_store_one(v + t * tok_stride + g * ATT_D, vc + dst, d);
    }
}

// Q8_0 and Q4_0 KV caches are addressed in bytes; these wrapper types select their loaders.
struct pn_q8kv {
    pn_u8 b;
};
struct pn_q4kv {
    pn_u8 b;
};

// Values 8*lane .. 8*lane+8 of the row starting at `row`, as f32.
PN_DEV void att_load8(const __half* row, int lane, float* out) {
    const __half* p = row + lane * 8;
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const __half2* h2 = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 f = __half22float2(h2[i]);
        out[2 * i] = f.x;
        out[2 * i + 1] = f.y;
    }
}
PN_DEV void att_load8(const float* row, int lane, float* out) {
    const float* p = row + lane * 8;
    const float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
    out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
    out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
}
// Q8_0 row: block lane/4 (34 bytes: f16 d, 32 x i8), quants 8*(lane%4).. read as 4 aligned u16.
PN_DEV void att_load8(const pn_q8kv* row, int lane, float* out) {
    const pn_u8* blk = reinterpret_cast<const pn_u8*>(row) + (lane >> 2) * 34;
    const float d = pn_f16_to_f32(*reinterpret_cast<const pn_u16*>(blk));
    const pn_u16* q = reinterpret_cast<const pn_u16*>(blk + 2 + (lane & 3) * 8);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const pn_u16 v = q[i];
        out[2 * i] = d * (float)(pn_i8)(v & 0xff);
        out[2 * i + 1] = d * (float)(pn_i8)(v >> 8);
    }
}
// Q4_0 row: block lane/4 (18 bytes), values 8*(lane%4).. : the low (lane%4 < 2) or high nibbles
// of bytes 8*(lane&1).., read as 4 aligned u16 (blocks are 2-byte aligned).
PN_DEV void att_load8(const pn_q4kv* row, int lane, float* out) {
    const pn_u8* blk = reinterpret_cast<const pn_u8*>(row) + (lane >> 2) * PN_Q4_0_KV_BYTES;
    const pn_u16* q = reinterpret_cast<const pn_u16*>(blk + 2 + (lane & 1) * 8);
    const pn_u32 w0 = (pn_u32)q[0] | ((pn_u32)q[1] << 16), w1 = (pn_u32)q[2] | ((pn_u32)q[3] << 16);
    q4_0_kv_decode8(pn_f16_to_f32(*reinterpret_cast<const pn_u16*>(blk)), w0, w1, (lane >> 1) & 1, out);
}

// part_o[((t*n_head + h)*n_split + s)*256 + d], part_ml[((t*n_head + h)*n_split + s)*2 + {0,1}] = (max, sum).
template <typename KV>
__device__ void attn_partial(const float* __restrict__ q, long long q_tok_stride, long long q_head_stride,
                             const KV* __restrict__ kc, const KV* __restrict__ vc, long long pos_stride, long long head_stride,
                             int group, int p0, int chunk, float scale,
                             float* __restrict__ part_o, float* __restrict__ part_ml, int n_tokens) {
    PN_SMEM(float, sm_m, ATT_WARPS);
    PN_SMEM(float, sm_l, ATT_WARPS);
    // Per warp its 256 accumulated dims; dim 8l + i (lane l, i < 8) at word 8l + (i ^ f) with
    // f = (8l / 32) & 7 = bits 2..4 of l: the lanes' stores of one i then hit 32 banks (unswizzled
    // stride 8: 8-way), and the reads by dim d = threadIdx.x (f constant over a warp) a permuted
    // run of 32 words.
    PN_SMEM(float, sm_acc, ATT_WARPS * ATT_D);
    const int h = blockIdx.x, s = blockIdx.y;
    const int n_head = gridDim.x, n_split = gridDim.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = h / group;
    // Grid z strides over the query tokens (at most 65535 blocks on z); the loop bound is
    // uniform over the block, so its barriers stay matched.
    for (int t = blockIdx.z; t < n_tokens; t += gridDim.z) {
        const int n_ctx = p0 + t + 1;
        const int j0 = s * chunk, j1 = min(n_ctx, j0 + chunk);
        const float* qh = q + t * q_tok_stride + h * q_head_stride + lane * 8;
        float qr[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) qr[i] = qh[i] * scale;
        float m = -PN_INF, l = 0.0f, acc[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] = 0.0f;
        const KV* kb = kc + (long long)g * head_stride;
        const KV* vb = vc + (long long)g * head_stride;
        for (int j = j0 + warp; j < j1; j += ATT_WARPS) {
            float kf[8], vf[8];
            att_load8(kb + (long long)j * pos_stride, lane, kf);
            float sc = 0.0f;
#pragma unroll
            for (int i = 0; i < 8; ++i) sc += qr[i] * kf[i];
            sc = pn_warp_sum(sc);
            const float m_new = fmaxf(m, sc);
            const float corr = expf(m - m_new), pj = expf(sc - m_new);
            l = l * corr + pj;
            att_load8(vb + (long long)j * pos_stride, lane, vf);
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[i] = acc[i] * corr + pj * vf[i];
            m = m_new;
        }
        if (lane == 0) { sm_m[warp] = m; sm_l[warp] = l; }
#pragma unroll
        for (int i = 0; i < 8; ++i) sm_acc[warp * ATT_D + lane * 8 + (i ^ ((lane >> 2) & 7))] = acc[i];
        __syncthreads();
        const int d = threadIdx.x;
        float M = -PN_INF;
        for (int w = 0; w < ATT_WARPS; ++w) M = fmaxf(M, sm_m[w]);
        float L = 0.0f, A = 0.0f;
        if (M > -PN_INF) {
            for (int w = 0; w < ATT_WARPS; ++w) {
                if (sm_l[w] == 0.0f) continue; // a warp that saw no position
                const float f = expf(sm_m[w] - M);
                L += sm_l[w] * f;
                A += sm_acc[w * ATT_D + (d & ~7) + ((d & 7) ^ ((d >> 5) & 7))] * f;
            }
        }
        const long long idx = ((long long)t * n_head + h) * n_split + s;
        part_o[idx * ATT_D + d] = A;
        if (d == 0) { part_ml[2 * idx] = M; part_ml[2 * idx + 1] = L; }
        __syncthreads(); // the next token's writes of sm_m / sm_l / sm_acc wait for these reads
    }
}

#define ATT_ARGS(KV) const float *__restrict__ q, long long q_tok_stride, long long q_head_stride, const KV *__restrict__ kc, \
    const KV *__restrict__ vc, long long pos_stride, long long head_stride, int group, int p0, int chunk, float scale, float *__restrict__ part_o, float *__restrict__ part_ml, int n_tokens
#define ATT_CALL attn_partial(q, q_tok_stride, q_head_stride, kc, vc, pos_stride, head_stride, group, p0, chunk, scale, part_o, part_ml, n_tokens)
extern "C" __global__ void __launch_bounds__(256) attn_partial_f16kv(ATT_ARGS(__half)) { ATT_CALL; }
extern "C" __global__ void __launch_bounds__(256) attn_partial_f32kv(ATT_ARGS(float)) { ATT_CALL; }
extern "C" __global__ void __launch_bounds__(256) attn_partial_q8_0kv(ATT_ARGS(pn_q8kv)) { ATT_CALL; }
extern "C" __global__ void __launch_bounds__(256) attn_partial_q4_0kv(ATT_ARGS(pn_q4kv)) { ATT_CALL; }

// grid (n_head, min(T, 65535)), block 256: o[t*o_tok_stride + h*256 + d] = merged attention
// output; grid y strides over the T query tokens.
extern "C" __global__ void __launch_bounds__(256) attn_combine(const float* __restrict__ part_o, const float* __restrict__ part_ml, int n_split,
                                                    float* __restrict__ o, long long o_tok_stride, int n_tokens) {
    const int h = blockIdx.x, n_head = gridDim.x, d = threadIdx.x;
    for (int t = blockIdx.y; t < n_tokens; t += gridDim.y) {
        const long long base = ((long long)t * n_head + h) * n_split;
        float M = -PN_INF;
        for (int s = 0; s < n_split; ++s) if (part_ml[2 * (base + s) + 1] > 0.0f) M = fmaxf(M, part_ml[2 * (base + s)]);
        float L = 0.0f, A = 0.0f;
        for (int s = 0; s < n_split; ++s) {
            const float ls = part_ml[2 * (base + s) + 1];
            if (ls == 0.0f) continue;
            const float f = expf(part_ml[2 * (base + s)] - M);
            L += ls * f;
            A += part_o[(base + s) * ATT_D + d] * f;
        }
        o[t * o_tok_stride + h * ATT_D + d] = L > 0.0f ? A / L : 0.0f;
    }
}
