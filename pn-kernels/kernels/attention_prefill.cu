// Tiled causal prefill attention (issue #6): the same inputs, output and semantics as the split-K
// kernels of attention.cu (attn_partial_* + attn_combine) for T query tokens at positions
// p0..p0+T over a cache already holding positions 0..p0+T, head_dim 256, GQA (query head h reads
// kv head h / group), scores scaled by `scale`, no gate (the caller gates the output).
//
// Why: the split-K kernels give every query token its own blocks, so each token re-reads the
// whole K/V prefix (O(T^2) cache traffic). Here one block owns AP_BQ consecutive query tokens of
// one query head and walks the causal prefix in tiles of AP_BK positions staged in shared memory
// once for all its rows: the cache is read T/AP_BQ times instead of T times.
//
// Block of 256 threads, thread (r, c) = (tid / 16, tid % 16):
//  - scores: thread (r, c) computes q_r . k_c for the tile (fp32, whole 256-dim dot from shared
//    memory; the dims are walked from a per-lane rotation so the 32 lanes of a warp hit 32
//    distinct banks for both Q and K);
//  - online softmax per row in fp32 (running max m and sum l, identical in the 16 lanes of the
//    row, reduced with xor shuffles inside the half warp);
//  - output: thread (r, c) accumulates dims c + 16 i (i < 16) of row r in registers; p_{r,c'} is
//    fetched from lane c' of the same half warp by a shuffle.
// Shared memory: Q, K and V tiles as f32, 3 x 16 KB = the 48 KB static limit of sm_60 (one block
// per SM; the K/V reuse, not occupancy, is what this kernel is for). With 8 warps per SM, the
// next K/V tile is loaded into registers while the current one is computed on.
// The host emulator runs this source with scalar stand-ins for the `__CUDA_ARCH__` vector
// loads/stores (same addresses, same values).
//
// Grid (ceil(T / AP_BQ), n_head); block x takes query tile n_tiles-1-x so the longest tiles
// (latest tokens, longest prefix) start first.
#include "common.cuh"
#include "kv_blocks.cuh"

#define AP_D 256
#define AP_BQ 16
#define AP_BK 16
#define AP_THREADS 256

// The host build (host/shim.cpp runs this source under host/simt_emu.h) has no PN_INF / PN_DEV.
#if defined(__CUDACC__)
#define AP_NEG_INF (-PN_INF)
#define AP_FN PN_DEV
#define AP_UNROLL _Pragma("unroll")
#define AP_UNROLL_BY8 _Pragma("unroll 8")
#define AP_ALIGN16 __align__(16)
#else
#define AP_NEG_INF (-INFINITY)
#define AP_FN inline
#define AP_UNROLL
#define AP_UNROLL_BY8
#define AP_ALIGN16
#endif

// Byte-addressed quantized caches, as in attention.cu: the wrapper type selects the loader.
struct ap_q8kv {
    pn_u8 b;
};
struct ap_q4kv {
    pn_u8 b;
};

// Values 8*part .. 8*part+8 (part < 32) of the 256-value row at `row`, as f32.
AP_FN void ap_load8(const float* row, int part, float* out) {
    const float* p = row + part * 8;
#if defined(__CUDA_ARCH__)
    const float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
    out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
    out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
#else
    for (int i = 0; i < 8; ++i) out[i] = p[i];
#endif
}
// f16 cache rows, passed as their bits (the same pointer as attention.cu's __half*).
AP_FN void ap_load8(const pn_u16* row, int part, float* out) {
    const pn_u16* p = row + part * 8;
#if defined(__CUDA_ARCH__)
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const __half2* h2 = reinterpret_cast<const __half2*>(&raw);
    AP_UNROLL
    for (int i = 0; i < 4; ++i) {
        const float2 f = __half22float2(h2[i]);
        out[2 * i] = f.x;
        out[2 * i + 1] = f.y;
    }
#else
    for (int i = 0; i < 8; ++i) out[i] = pn_f16_to_f32(p[i]);
#endif
}
// Q8_0 row: block part/4 (34 bytes: f16 d, 32 x i8), quants 8*(part%4) ..; value = d * q.
AP_FN void ap_load8(const ap_q8kv* row, int part, float* out) {
    const pn_u8* blk = reinterpret_cast<const pn_u8*>(row) + (part >> 2) * 34;
    const float d = pn_f16_to_f32(pn_load_u16(blk));
    const pn_u8* q = blk + 2 + (part & 3) * 8;
    AP_UNROLL
    for (int i = 0; i < 8; ++i) out[i] = d * (float)(pn_i8)q[i];
}
// Q4_0 row: block part/4 (18 bytes), values 8*(part%4) .. (kv_blocks.cuh's decoder).
AP_FN void ap_load8(const ap_q4kv* row, int part, float* out) {
    q4_0_kv_part8(reinterpret_cast<const pn_u8*>(row) + (part >> 2) * PN_Q4_0_KV_BYTES, part & 3, out);
}

// Sum / max over the 16 lanes of a half warp (xor offsets below 16 stay inside it).
AP_FN float ap_half_max(float v) {
    for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
AP_FN float ap_half_sum(float v) {
    for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// 8-value parts of a K (and of a V) tile per thread.
#define AP_PARTS (AP_BK * 32 / AP_THREADS)

// Parts tid + u * AP_THREADS (u < AP_PARTS) of the K and V tiles at positions j0 .. j0 + AP_BK
// (part idx: row idx / 32, dims 8 * (idx % 32)); positions from n_keys on read as zero.
template <typename KV>
AP_FN void ap_fetch(const KV* kb, const KV* vb, long long pos_stride, int j0, int n_keys, int tid, float (*kf)[8],
                    float (*vf)[8]) {
    AP_UNROLL
    for (int u = 0; u < AP_PARTS; ++u) {
        const int idx = tid + u * AP_THREADS, j = j0 + (idx >> 5), part = idx & 31;
        if (j < n_keys) {
            ap_load8(kb + (long long)j * pos_stride, part, kf[u]);
            ap_load8(vb + (long long)j * pos_stride, part, vf[u]);
        } else {
            AP_UNROLL
            for (int i = 0; i < 8; ++i) kf[u][i] = vf[u][i] = 0.0f;
        }
    }
}

template <typename KV>
__device__ void attn_prefill_tile(const float* __restrict__ q, long long q_tok_stride, long long q_head_stride,
                                  const KV* __restrict__ kc, const KV* __restrict__ vc, long long pos_stride,
                                  long long head_stride, int group, int p0, int n_tokens, float scale, float* __restrict__ o,
                                  long long o_tok_stride) {
    __shared__ float qs[AP_BQ * AP_D];
    __shared__ AP_ALIGN16 float ks[AP_BK * AP_D];
    __shared__ AP_ALIGN16 float vs[AP_BK * AP_D];
    const int tid = threadIdx.x;
    const int n_tiles = (n_tokens + AP_BQ - 1) / AP_BQ;
    const int t0 = (n_tiles - 1 - (int)blockIdx.x) * AP_BQ;
    const int h = blockIdx.y, g = h / group;
    const int rows = min(AP_BQ, n_tokens - t0);
    // Q pre-scaled as the split-K kernel does (q * scale, then the dot); rows past T are zero.
    for (int i = tid; i < AP_BQ * AP_D; i += AP_THREADS) {
        const int r = i / AP_D, d = i % AP_D;
        qs[i] = r < rows ? q[(long long)(t0 + r) * q_tok_stride + (long long)h * q_head_stride + d] * scale : 0.0f;
    }
    const int r = tid >> 4, c = tid & 15;
    // Lane rotation of the dot's dims: lanes 0..31 start at 32 distinct banks.
    const int rot = tid & 31;
    const int qpos = p0 + t0 + r;
    const int n_keys = p0 + t0 + rows;
    const KV* kb = kc + (long long)g * head_stride;
    const KV* vb = vc + (long long)g * head_stride;
    float m = AP_NEG_INF, l = 0.0f, acc[16];
    AP_UNROLL
    for (int i = 0; i < 16; ++i) acc[i] = 0.0f;
    // K/V of the next tile are fetched into registers while the current one is computed on.
    float kf[AP_PARTS][8], vf[AP_PARTS][8];
    ap_fetch(kb, vb, pos_stride, 0, n_keys, tid, kf, vf);
    for (int j0 = 0; j0 < n_keys; j0 += AP_BK) {
        __syncthreads(); // the previous tile's K/V reads are done (and Q is staged)
        AP_UNROLL
        for (int u = 0; u < AP_PARTS; ++u) {
            const int at = (tid + u * AP_THREADS) * 8; // row (idx / 32), dims 8 * (idx % 32)
#if defined(__CUDA_ARCH__)
            // 16-byte stores: 2-way bank conflicts per quarter warp instead of 8-way scalar ones.
            *reinterpret_cast<float4*>(ks + at) = make_float4(kf[u][0], kf[u][1], kf[u][2], kf[u][3]);
            *reinterpret_cast<float4*>(ks + at + 4) = make_float4(kf[u][4], kf[u][5], kf[u][6], kf[u][7]);
            *reinterpret_cast<float4*>(vs + at) = make_float4(vf[u][0], vf[u][1], vf[u][2], vf[u][3]);
            *reinterpret_cast<float4*>(vs + at + 4) = make_float4(vf[u][4], vf[u][5], vf[u][6], vf[u][7]);
#else
            for (int i = 0; i < 8; ++i) {
                ks[at + i] = kf[u][i];
                vs[at + i] = vf[u][i];
            }
#endif
        }
        __syncthreads();
        if (j0 + AP_BK < n_keys) ap_fetch(kb, vb, pos_stride, j0 + AP_BK, n_keys, tid, kf, vf);
        const float* qr = qs + r * AP_D;
        const float* kr = ks + c * AP_D;
        float s = 0.0f;
        AP_UNROLL_BY8
        for (int e = 0; e < AP_D; ++e) {
            const int d = (e + rot) & (AP_D - 1);
            s += qr[d] * kr[d];
        }
        const bool valid = r < rows && j0 + c <= qpos;
        s = valid ? s : AP_NEG_INF;
        const float m_new = fmaxf(m, ap_half_max(s));
        // m_new = -inf only for rows past T (every real row sees key 0 in the first tile).
        const float corr = m_new == AP_NEG_INF ? 1.0f : expf(m - m_new);
        const float p = valid ? expf(s - m_new) : 0.0f;
        l = l * corr + ap_half_sum(p);
        m = m_new;
        AP_UNROLL
        for (int i = 0; i < 16; ++i) acc[i] *= corr;
        for (int cc = 0; cc < AP_BK; ++cc) {
            const float pc = __shfl_xor_sync(0xffffffffu, p, c ^ cc); // p of (r, cc)
            const float* vr = vs + cc * AP_D + c;
            AP_UNROLL
            for (int i = 0; i < 16; ++i) acc[i] += pc * vr[16 * i];
        }
    }
    if (r < rows) {
        float* orow = o + (long long)(t0 + r) * o_tok_stride + (long long)h * AP_D + c;
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        AP_UNROLL
        for (int i = 0; i < 16; ++i) orow[16 * i] = acc[i] * inv;
    }
}

#define AP_ARGS(KV) const float *__restrict__ q, long long q_tok_stride, long long q_head_stride, const KV *__restrict__ kc, \
    const KV *__restrict__ vc, long long pos_stride, long long head_stride, int group, int p0, int n_tokens, float scale, \
    float *__restrict__ o, long long o_tok_stride
#define AP_CALL attn_prefill_tile(q, q_tok_stride, q_head_stride, kc, vc, pos_stride, head_stride, group, p0, n_tokens, scale, o, o_tok_stride)
// Grid (ceil(n_tokens / AP_BQ), n_head), AP_THREADS threads; strides in cache elements as in
// attention.cu; o[t*o_tok_stride + h*256 + d].
extern "C" __global__ void __launch_bounds__(AP_THREADS) attn_prefill_f16kv(AP_ARGS(pn_u16)) { AP_CALL; }
extern "C" __global__ void __launch_bounds__(AP_THREADS) attn_prefill_f32kv(AP_ARGS(float)) { AP_CALL; }
extern "C" __global__ void __launch_bounds__(AP_THREADS) attn_prefill_q8_0kv(AP_ARGS(ap_q8kv)) { AP_CALL; }
extern "C" __global__ void __launch_bounds__(AP_THREADS) attn_prefill_q4_0kv(AP_ARGS(ap_q4kv)) { AP_CALL; }
