// PN matrix-vector product (pn3t, pn4t): the decode hot path.
//
// y[r] = sum_k W[r,k] x[k] for W of N rows by K columns, stored as N*K/WEIGHTS consecutive 34-byte
// blocks (row r starts at global block r*nb). The tensor base must be 4-byte aligned; pairs of
// blocks are then 17 aligned words.
//
// Fast kernels (`*_gemv_h2_*`): the activation vector is staged once per thread block in shared
// memory as half2, pre-scaled by a power of two so that no fp16 partial sum can overflow (exact,
// undone at the end). Each lane owns one pair of blocks per row: 17 word loads in flight, codes to
// half2 by the exponent trick, n - z exact in fp16, products summed in fp16 over one word's
// code pairs only (<= 5 products), then in fp32 across words, blocks, lanes; the block scale is
// factored out and applied in fp32.
// Exact kernels (`*_gemv_f32`): the same layout with fp32 products in element order, the
// reference for the fast path and a fallback when fp16 activations are not wanted.
#include "pn_block.cuh"
#include "prepare.cuh"

union pn_h2u {
    pn_u32 u;
    __half2 h;
};

// Staged activations in shared memory, padded: the WEIGHTS half2 words of each pair of blocks
// (2 x WEIGHTS elements) are followed by one unused word, so pair j starts at word
// j * (WEIGHTS + 1). The lanes of a warp work on consecutive pairs, so their reads are
// WEIGHTS + 1 words apart: 65 (pn4t) or 81 (pn3t), odd, hence 32 distinct banks (unpadded, 64 and
// 80 words gave 32- and 16-way bank conflicts). Half2 index h lives at word h + h / WEIGHTS.
template <int BITS> PN_HD int pn_xs_words(int K) {
    const int h = K / 2, w = PnTraits<BITS>::WEIGHTS;
    return h + (h + w - 1) / w;
}

// Stages x[0..K) into xs as half2 times 2^e (padded as above); returns e (undo with
// ldexpf(y, -e)). Thread t writes padded word t + i * blockDim (consecutive words: no bank
// conflict); the pad words are skipped. PREP: x arrives converted (see pn_prepare_x_h2).
template <int BITS, bool PREP>
PN_DEV int pn_stage_x_h2(const float* __restrict__ x, const __half2* __restrict__ xh, const int* __restrict__ e_in, int K,
                         PN_SPTR(__half2) xs, PN_SPTR(float) scratch) {
    const int W = PnTraits<BITS>::WEIGHTS, H = K / 2;
    int e = 0;
    float s = 1.0f;
    if (PREP) {
        e = __ldg(e_in);
    } else {
        float amax = 0.0f;
        for (int i = threadIdx.x; i < K; i += blockDim.x) amax = fmaxf(amax, fabsf(__ldg(x + i)));
        amax = pn_block_max(amax, scratch);
        s = pn_x_scale_exp(amax, &e);
    }
    const float2* x2 = reinterpret_cast<const float2*>(x);
    const int words = pn_xs_words<BITS>(K);
    for (int i = threadIdx.x; i < words; i += blockDim.x) {
        const int pair = i / (W + 1), c = i - pair * (W + 1), h = pair * W + c;
        if (c == W || h >= H) continue;
        if (PREP) {
            xs[i] = __ldg(xh + h);
        } else {
            const float2 v = __ldg(x2 + h);
            xs[i] = __floats2half2_rn(v.x * s, v.y * s); // exact scaling, one rounding to fp16
        }
    }
    __syncthreads();
    return e;
}

// Loads pair q (17 words), one lane alone (the `any` kernels). The tensor's last pair may hold
// one block only (odd block count): then only its first 34 bytes are read.
PN_DEV void pn_load_pair(const pn_u32* __restrict__ w, pn_u64 q, pn_u64 total_blocks, pn_u32* p) {
    const pn_u32* pp = w + (pn_u64)PN_PAIR_WORDS * q;
    if (2 * q + 1 < total_blocks) {
#pragma unroll
        for (int i = 0; i < PN_PAIR_WORDS; ++i) p[i] = __ldg(pp + i);
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) p[i] = __ldg(pp + i);
        p[8] = __ldg(reinterpret_cast<const unsigned short*>(pp + 8));
#pragma unroll
        for (int i = 9; i < PN_PAIR_WORDS; ++i) p[i] = 0;
    }
}

// d * sum (n - z) x over one block, with fp16 products summed per word and fp32 across words.
// xs: the block's WEIGHTS/2 staged half2, consecutive.
template <int BITS, int BLK>
PN_DEV float pn_block_dot_h2(const pn_u32* p, PN_SPTR(const __half2) xs) {
    typedef PnTraits<BITS> T;
    pn_h2u zz;
    zz.u = pn_zero_h2bits<BITS>();
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const pn_u32 w = pn_pair_word(p, BLK, i);
        __half2 a = __float2half2_rn(0.0f);
#pragma unroll
        for (int j = 0; j < T::PAIRS; ++j) {
            pn_h2u c;
            c.u = pn_code_pair_h2bits<BITS>(w, j);
            a = __hfma2(__hsub2(c.h, zz.h), xs[i * T::PAIRS + j], a);
        }
        const float2 f = __half22float2(a);
        s = pn_add(s, pn_add(f.x, f.y));
    }
    // __fmul_rn / __fadd_rn here and in the callers: no FMA contraction, so the result is
    // reproducible on the host (tests/common emulates this kernel bit for bit).
    return pn_mul(pn_f16_to_f32(pn_pair_scale_bits(p, BLK)), s);
}

// Block BLK of pair p[r] for ROWS rows at once: each staged word is read from shared memory once
// and applied to every row (the per-row arithmetic is pn_block_dot_h2's, in the same order).
template <int BITS, int BLK, int ROWS>
PN_DEV void pn_block_dot_h2_rows(const pn_u32 (*p)[PN_PAIR_WORDS], PN_SPTR(const __half2) xs, float* out) {
    typedef PnTraits<BITS> T;
    pn_h2u zz;
    zz.u = pn_zero_h2bits<BITS>();
    float s[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) s[r] = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        __half2 xv[T::PAIRS];
#pragma unroll
        for (int j = 0; j < T::PAIRS; ++j) xv[j] = xs[i * T::PAIRS + j];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const pn_u32 w = pn_pair_word(p[r], BLK, i);
            __half2 a = __float2half2_rn(0.0f);
#pragma unroll
            for (int j = 0; j < T::PAIRS; ++j) {
                pn_h2u c;
                c.u = pn_code_pair_h2bits<BITS>(w, j);
                a = __hfma2(__hsub2(c.h, zz.h), xv[j], a);
            }
            const float2 f = __half22float2(a);
            s[r] = pn_add(s[r], pn_add(f.x, f.y));
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) out[r] = pn_mul(pn_f16_to_f32(pn_pair_scale_bits(p[r], BLK)), s[r]);
}

// Words per warp tile of one row: 32 pairs of 17 words.
#define PN_TILE_WORDS (32 * PN_PAIR_WORDS)

// Chunk c (pairs 32c .. 32c+32) of ROWS rows from row0, as the warp reads it: lane l loads words
// l, l + 32, .. of each row's contiguous chunk (every LDG of the warp is 128 consecutive bytes,
// 32-byte aligned when the row length in bytes is: 4 sectors, the minimum). Rows past N load 0.
template <int ROWS>
PN_DEV void pn_load_chunk(const pn_u32* __restrict__ w, int row0, int N, int npairs, int c, int lane, pn_u32 (*v)[PN_PAIR_WORDS]) {
    const int valid = min(32, npairs - 32 * c) * PN_PAIR_WORDS;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const pn_u32* base = w + ((pn_u64)(row0 + r) * npairs + 32 * c) * PN_PAIR_WORDS;
        const bool row_ok = row0 + r < N;
#pragma unroll
        for (int m = 0; m < PN_PAIR_WORDS; ++m) {
            const int i = lane + 32 * m;
            v[r][m] = row_ok && i < valid ? __ldg(base + i) : 0u;
        }
    }
}

// Rows with an even block count: every row starts on a pair. Block of `nwarps` warps; each warp
// owns ROWS consecutive rows of a row group, the block loops over row groups (grid-stride), so x
// is staged once per block for many rows. Shared memory: the staged x (pn_xs_words words), then
// one tile of ROWS x PN_TILE_WORDS words per warp. Per chunk of 32 pairs the warp loads its rows'
// contiguous weight bytes coalesced into registers, writes them to its tile, and each lane then
// takes its own pair at word stride 17 (odd: no bank conflict) and dots it with its pair of x
// (stride WEIGHTS + 1: no bank conflict). The first chunk's loads are issued before the staging
// barrier (they do not depend on x). Lane l works on pair 32c + l of each row as before, so the
// results are the same bits.
// bx / gx: this block's index and the block count of the launch over this matrix (the grouped
// kernel gives each matrix a range of its grid); -1: blockIdx.x / gridDim.x.
template <int BITS, int ROWS, bool PREP>
__device__ void pn_gemv_h2_even(const pn_u32* __restrict__ w, const float* __restrict__ x, const __half2* __restrict__ xh,
                                const int* __restrict__ e_in, float* __restrict__ y, int N, int K, int bx = -1,
                                int gx = -1) {
    if (bx < 0) {
        bx = blockIdx.x;
        gx = gridDim.x;
    }
    typedef PnTraits<BITS> T;
    PN_DYN_SMEM(pn_u32, smem);
    PN_SMEM(float, scratch, 32);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
    PN_SPTR(__half2) const xs = PN_SCAST(__half2, smem);
    PN_SPTR(pn_u32) const tile = smem + pn_xs_words<BITS>(K) + warp * ROWS * PN_TILE_WORDS;
    const int npairs = K / (2 * T::WEIGHTS), nchunks = (npairs + 31) / 32;
    const int group_rows = nwarps * ROWS;
    pn_u32 v[ROWS][PN_PAIR_WORDS];
    int row0 = (bx * nwarps + warp) * ROWS;
    if (row0 < N) pn_load_chunk<ROWS>(w, row0, N, npairs, 0, lane, v);
    const int e = pn_stage_x_h2<BITS, PREP>(x, xh, e_in, K, xs, scratch);
    for (int g = bx; g * group_rows < N; g += gx) {
        row0 = (g * nwarps + warp) * ROWS;
        if (row0 >= N) continue; // warp-uniform; no block barrier follows
        float acc[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) acc[r] = 0.0f;
        for (int c = 0; c < nchunks; ++c) {
            if (c > 0 || g != bx) pn_load_chunk<ROWS>(w, row0, N, npairs, c, lane, v);
            __syncwarp(); // the previous chunk's tile reads are done
#pragma unroll
            for (int r = 0; r < ROWS; ++r)
#pragma unroll
                for (int m = 0; m < PN_PAIR_WORDS; ++m) tile[r * PN_TILE_WORDS + lane + 32 * m] = v[r][m];
            __syncwarp();
            const int j = 32 * c + lane;
            if (j < npairs) {
                pn_u32 p[ROWS][PN_PAIR_WORDS];
#pragma unroll
                for (int r = 0; r < ROWS; ++r)
#pragma unroll
                    for (int i = 0; i < PN_PAIR_WORDS; ++i) p[r][i] = tile[r * PN_TILE_WORDS + lane * PN_PAIR_WORDS + i];
                PN_SPTR(const __half2) const xb = xs + j * (T::WEIGHTS + 1);
                float b0[ROWS], b1[ROWS];
                pn_block_dot_h2_rows<BITS, 0, ROWS>(p, xb, b0);
                pn_block_dot_h2_rows<BITS, 1, ROWS>(p, xb + T::WEIGHTS / 2, b1);
#pragma unroll
                for (int r = 0; r < ROWS; ++r) acc[r] = pn_add(acc[r], pn_add(b0[r], b1[r]));
            }
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const float s = pn_warp_sum(acc[r]);
            if (lane == 0 && row0 + r < N) y[row0 + r] = ldexpf(s, -e);
        }
    }
}

// Any block count (odd nb: rows alternate between starting on a pair and inside one). One warp
// per row, grid-stride over rows; each lane loads its own pairs (17 loads 68 bytes apart: not
// coalesced, but no 27B matrix takes this path: their block counts are even).
template <int BITS, bool PREP>
__device__ void pn_gemv_h2_any(const pn_u32* __restrict__ w, const float* __restrict__ x, const __half2* __restrict__ xh,
                               const int* __restrict__ e_in, float* __restrict__ y, int N, int K) {
    typedef PnTraits<BITS> T;
    PN_DYN_SMEM(__half2, xs);
    PN_SMEM(float, scratch, 32);
    const int e = pn_stage_x_h2<BITS, PREP>(x, xh, e_in, K, xs, scratch);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
    const pn_u64 nb = (pn_u64)(K / T::WEIGHTS);
    for (int row = blockIdx.x * nwarps + warp; row < N; row += gridDim.x * nwarps) {
        const pn_u64 g0 = (pn_u64)row * nb, total = (pn_u64)N * nb;
        float acc = 0.0f;
        for (pn_u64 q = pn_row_first_pair(g0) + lane; q < pn_row_end_pair(g0, nb); q += 32) {
            pn_u32 p[PN_PAIR_WORDS];
            pn_load_pair(w, q, total, p);
            // Block b of the row starts at half2 b * WEIGHTS / 2, inside staged pair b / 2.
            if (pn_block_in_row(q, 0, g0, nb)) {
                const int b = (int)(2 * q - g0);
                acc = pn_add(acc, pn_block_dot_h2<BITS, 0>(p, xs + b * T::WEIGHTS / 2 + b / 2));
            }
            if (pn_block_in_row(q, 1, g0, nb)) {
                const int b = (int)(2 * q + 1 - g0);
                acc = pn_add(acc, pn_block_dot_h2<BITS, 1>(p, xs + b * T::WEIGHTS / 2 + b / 2));
            }
        }
        acc = pn_warp_sum(acc);
        if (lane == 0) y[row] = ldexpf(acc, -e);
    }
}

// fp32 reference-order kernel: one warp per row, x read through the read-only cache.
template <int BITS>
__device__ void pn_gemv_f32(const pn_u32* __restrict__ w, const float* __restrict__ x,
                            float* __restrict__ y, int N, int K) {
    typedef PnTraits<BITS> T;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + warp;
    if (row >= N) return;
    const pn_u64 nb = (pn_u64)(K / T::WEIGHTS);
    const pn_u64 g0 = (pn_u64)row * nb, total = (pn_u64)N * nb;
    float acc = 0.0f;
    for (pn_u64 q = pn_row_first_pair(g0) + lane; q < pn_row_end_pair(g0, nb); q += 32) {
        pn_u32 p[PN_PAIR_WORDS];
        pn_load_pair(w, q, total, p);
        for (int blk = 0; blk < 2; ++blk)
            if (pn_block_in_row(q, blk, g0, nb))
                acc = pn_add(acc, pn_block_dot_f32<BITS>(p, blk, x + (2 * q + blk - g0) * T::WEIGHTS));
    }
    acc = pn_warp_sum(acc);
    if (lane == 0) y[row] = acc;
}

// Small batch (T = 2..8 activation rows, the MTP verify and batched decode): each weight pair is
// loaded and decoded once and applied to all T rows. Rows with an even block count only (every
// 27B matrix); x prepared by pn_prepare_x_h2 with one block per row (xh: T rows of K fp16, row t
// at t * K; e: T exponents), y: T rows of N (row t at t * N).
//
// As pn_gemv_h2_even with one weight row per warp and row group: the block loops over sets of
// G row groups of nwarps rows (see PN_BATCH_G below), and per 32-pair chunk each warp loads each
// of its G rows' contiguous 2176 bytes coalesced into its tile, then lane l takes pair 32c + l
// at word stride 17. T rows of a whole row's x do not fit in
// 48 KB (K = 17408, T = 8: 278 KB), so x is staged in K-chunks: per weight chunk, in 32 / XP
// phases of XP pairs (XP = 32, 16, 8 or 4, as launch::pn_batch sizes it); in phase h, lanes
// [h XP, (h+1) XP) have their pair's x of all T rows staged (row t, slot s at word
// (t XP + s)(WEIGHTS + 1): lane stride WEIGHTS + 1, odd, no bank conflict) and compute. Lane l
// sums the same pairs in the same order as the single-row kernel, with the same fp16/fp32 steps
// per row (the code pairs n - z are exact, so computing them once for all rows changes no bit):
// row t of the result equals the single-row kernel on row t of x, bit for bit.
template <int BITS, int BLK, int T>
PN_DEV void pn_block_dot_h2_batch(const pn_u32* p, PN_SPTR(const __half2) xs, int tstride, float* out) {
    typedef PnTraits<BITS> TR;
    pn_h2u zz;
    zz.u = pn_zero_h2bits<BITS>();
    float s[T];
#pragma unroll
    for (int t = 0; t < T; ++t) s[t] = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const pn_u32 w = pn_pair_word(p, BLK, i);
        __half2 d[TR::PAIRS];
#pragma unroll
        for (int j = 0; j < TR::PAIRS; ++j) {
            pn_h2u c;
            c.u = pn_code_pair_h2bits<BITS>(w, j);
            d[j] = __hsub2(c.h, zz.h);
        }
#pragma unroll
        for (int t = 0; t < T; ++t) {
            __half2 a = __float2half2_rn(0.0f);
#pragma unroll
            for (int j = 0; j < TR::PAIRS; ++j) a = __hfma2(d[j], xs[t * tstride + i * TR::PAIRS + j], a);
            const float2 f = __half22float2(a);
            s[t] = pn_add(s[t], pn_add(f.x, f.y));
        }
    }
    const float sc = pn_f16_to_f32(pn_pair_scale_bits(p, BLK));
#pragma unroll
    for (int t = 0; t < T; ++t) out[t] = pn_mul(sc, s[t]);
}

// Row groups per staged x (PN_BATCH_G): the block takes G consecutive row groups of nwarps rows
// at once (G = the kernel's last argument, 1..PN_BATCH_G, launch::pn_batch), each warp
// accumulating its G rows (G x T registers); per chunk it loads and computes them one after
// another against one staged x chunk, so x is read from L2 once per G x nwarps weight rows
// (review finding 4: with one row group per staging, once per 8 rows, 18.2 GB per 27B verify).
// Only the one-phase chunk (XP = 32) is shared; the launch takes G = 1 otherwise. Per row the
// pairs, their order and arithmetic are as before: the bits do not depend on G.
#define PN_BATCH_G 4
template <int BITS, int T>
__device__ void pn_gemv_h2_batch(const pn_u32* __restrict__ w, const __half2* __restrict__ xh, const int* __restrict__ e_in,
                                 float* __restrict__ y, int N, int K, int XP, int G) {
    typedef PnTraits<BITS> TR;
    PN_DYN_SMEM(pn_u32, smem);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
    const int W1 = TR::WEIGHTS + 1, H = K / 2;
    // Shared memory: the x chunk (T * XP * W1 words), then one 544-word weight tile per warp.
    PN_SPTR(__half2) const xs = PN_SCAST(__half2, smem);
    PN_SPTR(pn_u32) const tile = smem + T * XP * W1 + warp * PN_TILE_WORDS;
    const int npairs = K / (2 * TR::WEIGHTS), nchunks = (npairs + 31) / 32, phases = 32 / XP;
    const int chunk_words = T * XP * W1;
    // Every warp runs every iteration (rows past N load zeros and write nothing): the x staging
    // barriers need the whole block.
    for (int sg = blockIdx.x; sg * G * nwarps < N; sg += gridDim.x) {
        float acc[PN_BATCH_G][T];
#pragma unroll
        for (int g = 0; g < PN_BATCH_G; ++g)
#pragma unroll
            for (int t = 0; t < T; ++t) acc[g][t] = 0.0f;
        for (int c = 0; c < nchunks; ++c) {
            const int j = 32 * c + lane;
#pragma unroll
            for (int g = 0; g < PN_BATCH_G; ++g) {
                if (g >= G) break; // block-uniform
                const int row = (sg * G + g) * nwarps + warp;
                // Row g's pairs of chunk c through the warp's tile (coalesced loads).
                pn_u32 p[PN_PAIR_WORDS];
                {
                    pn_u32 v[1][PN_PAIR_WORDS];
                    pn_load_chunk<1>(w, row, N, npairs, c, lane, v);
                    __syncwarp(); // the previous tile reads are done
#pragma unroll
                    for (int m = 0; m < PN_PAIR_WORDS; ++m) tile[lane + 32 * m] = v[0][m];
                    __syncwarp();
#pragma unroll
                    for (int i = 0; i < PN_PAIR_WORDS; ++i) p[i] = tile[lane * PN_PAIR_WORDS + i];
                }
                for (int h = 0; h < phases; ++h) {
                    // One phase (XP = 32, launch::pn_batch's choice whenever G > 1): the chunk's
                    // x is staged once for the G row groups. Several phases restage per group.
                    if (g == 0 || phases > 1) {
                        __syncthreads(); // the previous phase's reads of xs are done
                        const int pair0 = 32 * c + h * XP;
                        for (int i = threadIdx.x; i < chunk_words; i += blockDim.x) {
                            const int ts = i / W1, cc = i - ts * W1, t = ts / XP, hh = (pair0 + ts - t * XP) * TR::WEIGHTS + cc;
                            if (cc == TR::WEIGHTS || hh >= H) continue;
                            xs[i] = __ldg(xh + (pn_u64)t * H + hh);
                        }
                        __syncthreads();
                    }
                    const int s = lane - h * XP;
                    if (row < N && s >= 0 && s < XP && j < npairs) {
                        PN_SPTR(const __half2) const xb = xs + s * W1;
                        float b0[T], b1[T];
                        pn_block_dot_h2_batch<BITS, 0, T>(p, xb, XP * W1, b0);
                        pn_block_dot_h2_batch<BITS, 1, T>(p, xb + TR::WEIGHTS / 2, XP * W1, b1);
#pragma unroll
                        for (int t = 0; t < T; ++t) acc[g][t] = pn_add(acc[g][t], pn_add(b0[t], b1[t]));
                    }
                }
            }
        }
#pragma unroll
        for (int g = 0; g < PN_BATCH_G; ++g) {
            const int row = (sg * G + g) * nwarps + warp;
            if (g >= G || row >= N) break; // warp-uniform
#pragma unroll
            for (int t = 0; t < T; ++t) {
                const float s = pn_warp_sum(acc[g][t]);
                // The exponent is read here, not held across the loops (registers: no spills).
                if (lane == 0) y[(pn_u64)t * N + row] = ldexpf(s, -__ldg(e_in + t));
            }
        }
    }
}

#define PN_ARGS const pn_u32 *__restrict__ w, const float *__restrict__ x, float *__restrict__ y, int N, int K
#define PN_PARGS const pn_u32 *__restrict__ w, const __half2 *__restrict__ xh, const int *__restrict__ e, float *__restrict__ y, int N, int K
extern "C" {
// One block of 1024 threads: the staging of pn_stage_x_h2 done once, for every matrix that reads
// the same activation: xh[i] = fp16(x * 2^e) as half2, *e_out = e.
// With a grid of T blocks, block t converts row t (x + t K into xh + t K / 2, e_out[t]): the
// prepared input of the small-batch kernels.
__global__ void __launch_bounds__(1024) pn_prepare_x_h2(const float* __restrict__ x, int K, __half2* __restrict__ xh, int* __restrict__ e_out) {
    PN_SMEM(float, scratch, 32);
    x += (pn_u64)blockIdx.x * K;
    xh += (pn_u64)blockIdx.x * (K / 2);
    e_out += blockIdx.x;
    float amax = 0.0f;
    for (int i = threadIdx.x; i < K; i += blockDim.x) amax = fmaxf(amax, fabsf(x[i]));
    amax = pn_block_max(amax, scratch);
    int e;
    const float s = pn_x_scale_exp(amax, &e);
    const float2* x2 = reinterpret_cast<const float2*>(x);
    for (int i = threadIdx.x; i < K / 2; i += blockDim.x) {
        const float2 v = x2[i];
        xh[i] = __floats2half2_rn(v.x * s, v.y * s);
    }
    if (threadIdx.x == 0) *e_out = e;
}
__global__ void __launch_bounds__(256) pn3t_gemv_h2_r1(PN_ARGS) { pn_gemv_h2_even<3, 1, false>(w, x, nullptr, nullptr, y, N, K); }
__global__ void __launch_bounds__(256) pn3t_gemv_h2_r2(PN_ARGS) { pn_gemv_h2_even<3, 2, false>(w, x, nullptr, nullptr, y, N, K); }
__global__ void __launch_bounds__(256) pn4t_gemv_h2_r1(PN_ARGS) { pn_gemv_h2_even<4, 1, false>(w, x, nullptr, nullptr, y, N, K); }
__global__ void __launch_bounds__(256) pn4t_gemv_h2_r2(PN_ARGS) { pn_gemv_h2_even<4, 2, false>(w, x, nullptr, nullptr, y, N, K); }
__global__ void __launch_bounds__(256) pn3t_gemv_h2_any(PN_ARGS) { pn_gemv_h2_any<3, false>(w, x, nullptr, nullptr, y, N, K); }
__global__ void __launch_bounds__(256) pn4t_gemv_h2_any(PN_ARGS) { pn_gemv_h2_any<4, false>(w, x, nullptr, nullptr, y, N, K); }
__global__ void __launch_bounds__(256) pn3t_gemv_h2p_r1(PN_PARGS) { pn_gemv_h2_even<3, 1, true>(w, nullptr, xh, e, y, N, K); }
__global__ void __launch_bounds__(256) pn3t_gemv_h2p_r2(PN_PARGS) { pn_gemv_h2_even<3, 2, true>(w, nullptr, xh, e, y, N, K); }
__global__ void __launch_bounds__(256) pn4t_gemv_h2p_r1(PN_PARGS) { pn_gemv_h2_even<4, 1, true>(w, nullptr, xh, e, y, N, K); }
__global__ void __launch_bounds__(256) pn4t_gemv_h2p_r2(PN_PARGS) { pn_gemv_h2_even<4, 2, true>(w, nullptr, xh, e, y, N, K); }
__global__ void __launch_bounds__(256) pn3t_gemv_h2p_any(PN_PARGS) { pn_gemv_h2_any<3, true>(w, nullptr, xh, e, y, N, K); }
__global__ void __launch_bounds__(256) pn4t_gemv_h2p_any(PN_PARGS) { pn_gemv_h2_any<4, true>(w, nullptr, xh, e, y, N, K); }
__global__ void __launch_bounds__(256) pn3t_gemv_f32(PN_ARGS) { pn_gemv_f32<3>(w, x, y, N, K); }
__global__ void __launch_bounds__(256) pn4t_gemv_f32(PN_ARGS) { pn_gemv_f32<4>(w, x, y, N, K); }
// The grouped GEMV: up to PN_GROUP_MAX matrices that read the same prepared x (the FFN gate and
// up; attention q/k/v; the GDN qkv and gate) in one launch. Matrix m owns blocks
// [first[m], first[m + 1]) of the grid and runs there as its own launch of that many blocks
// would (kind: 0 pn3t r1, 1 pn3t r2, 2 pn4t r1, 3 pn4t r2), so y[m] gets the same bits. Dynamic
// shared memory: the largest member's; every member's block size is the launch's.
#define PN_GROUP_MAX 4
struct PnGroup {
    const pn_u32* w[PN_GROUP_MAX];
    float* y[PN_GROUP_MAX];
    int n[PN_GROUP_MAX];
    int kind[PN_GROUP_MAX];
    int first[PN_GROUP_MAX + 1];
    int count;
};
__global__ void __launch_bounds__(256) pn_gemv_h2p_group(const PnGroup g, const __half2* __restrict__ xh, const int* __restrict__ e, int K) {
    // The member is picked with constant indices only (a dynamic index into the parameter
    // struct would copy it to the stack).
    const pn_u32* w = g.w[0];
    float* y = g.y[0];
    int n = g.n[0], kind = g.kind[0], lo = 0, hi = g.first[1];
#pragma unroll
    for (int i = 1; i < PN_GROUP_MAX; ++i) {
        if (i < g.count && (int)blockIdx.x >= g.first[i]) {
            w = g.w[i];
            y = g.y[i];
            n = g.n[i];
            kind = g.kind[i];
            lo = g.first[i];
            hi = g.first[i + 1];
        }
    }
    const int bx = blockIdx.x - lo, gx = hi - lo;
    switch (kind) {
    case 0: pn_gemv_h2_even<3, 1, true>(w, nullptr, xh, e, y, n, K, bx, gx); break;
    case 1: pn_gemv_h2_even<3, 2, true>(w, nullptr, xh, e, y, n, K, bx, gx); break;
    case 2: pn_gemv_h2_even<4, 1, true>(w, nullptr, xh, e, y, n, K, bx, gx); break;
    default: pn_gemv_h2_even<4, 2, true>(w, nullptr, xh, e, y, n, K, bx, gx); break;
    }
}
#define PN_BARGS const pn_u32 *__restrict__ w, const __half2 *__restrict__ xh, const int *__restrict__ e, float *__restrict__ y, int N, int K, int XP, int G
#define PN_BATCH(bits, t) \
    __global__ void __launch_bounds__(256, 1) pn##bits##t_gemv_h2p_b##t(PN_BARGS) { pn_gemv_h2_batch<bits, t>(w, xh, e, y, N, K, XP, G); }
PN_BATCH(3, 2) PN_BATCH(3, 3) PN_BATCH(3, 4) PN_BATCH(3, 5) PN_BATCH(3, 6) PN_BATCH(3, 7) PN_BATCH(3, 8)
PN_BATCH(4, 2) PN_BATCH(4, 3) PN_BATCH(4, 4) PN_BATCH(4, 5) PN_BATCH(4, 6) PN_BATCH(4, 7) PN_BATCH(4, 8)
#undef PN_BATCH
}
