// The grouped Q8_0 GEMV: up to Q8G_MAX matrices of one K that read the same f32 x (the GDN's
// ssm_alpha and ssm_beta) in one launch, each row with the bits of quant_gemv.cu's q8_0_gemv.
//
// Member m owns blocks [first[m], first[m + 1]) of the grid; block bx of a member computes rows
// bx * 8 + warp (one warp per row, as q8_0_gemv_f32's grid of ceil(n / 8) blocks of 256). Each
// block stages x once in shared memory, 33 words per 32 values (one pad word per Q8_0 block),
// so lane l reading element e of its block b = c + l hits bank (b + e) % 32: no conflict.
//
// Weights, per chunk of 32 blocks (1088 bytes, 272 words; K a multiple of 64, so every row
// starts on a word): the warp copies its row's bytes with consecutive word loads (coalesced)
// into its tile, a pair of blocks (17 words) per 18 words (one pad word). Each half-warp stores
// 16 consecutive words (a span of at most 17 slots: 16 banks), in its own store. Lane l then
// takes block c + l: the nine words that hold it, pair j = l / 2 at slot 18 j; the even block
// at offsets 0..8, the odd one at 8..16. At step m the even lanes read offset m and the odd
// lanes offset 9 + m (m < 8; 8 at step 8, the word the pair shares): 18 j covers the even banks
// once for j < 16, so the even lanes take the banks of m's parity and the odd lanes the others,
// 32 distinct banks (a broadcast of 16 shared words at step 8).
//
// Lane l sums the blocks l, l + 32, ... in q8_0_gemv's order with its expressions (the same
// contraction into FMAs) and the same warp sum: y[m] gets the bits of q8_0_gemv_f32 on that
// matrix alone.
#include "ggml_blocks.cuh"

#define Q8G_MAX 4
#define Q8G_WARPS 8
#define Q8G_CHUNK_WORDS 288

extern "C" {
struct Q8Group {
    const pn_u8* w[Q8G_MAX];
    float* y[Q8G_MAX];
    int n[Q8G_MAX];
    int first[Q8G_MAX + 1];
    int count;
};

// Dynamic shared memory: K / 32 * 33 floats.
__global__ void __launch_bounds__(256) q8_0_gemv_group(const Q8Group g, const float* __restrict__ x, int K) {
    PN_DYN_SMEM(float, xs);
    PN_SMEM(pn_u32, tiles, Q8G_WARPS * Q8G_CHUNK_WORDS);
    // The member is picked with constant indices only (a dynamic index into the parameter
    // struct would copy it to the stack).
    const pn_u8* w = g.w[0];
    float* y = g.y[0];
    int n = g.n[0], lo = 0;
#pragma unroll
    for (int i = 1; i < Q8G_MAX; ++i) {
        if (i < g.count && (int)blockIdx.x >= g.first[i]) {
            w = g.w[i];
            y = g.y[i];
            n = g.n[i];
            lo = g.first[i];
        }
    }
    for (int i = threadIdx.x; i < K; i += blockDim.x) xs[i + (i >> 5)] = __ldg(x + i);
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = ((int)blockIdx.x - lo) * Q8G_WARPS + warp;
    if (row >= n) return; // the whole warp: no block barrier follows
    const int nb = K / 32;
    const pn_u32* rowp = reinterpret_cast<const pn_u32*>(w + (pn_u64)row * nb * PN_Q8_0_BYTES);
    PN_SPTR(pn_u32) t = tiles + warp * Q8G_CHUNK_WORDS;
    const bool odd = (lane & 1) != 0;
    const int pair = lane >> 1;
    float acc = 0.0f;
    for (int c = 0; c < nb; c += 32) {
        const int words = min(32, nb - c) / 2 * 17; // whole pairs: nb is even
        const pn_u32* src = rowp + c / 2 * 17;
        __syncwarp(); // the previous chunk's tile reads are done
        // Whole runs of 32 words, then the tail (16 words of a full chunk) at its own loads, so
        // every lane issues the same loads per chunk (the emulator pairs them per lane).
        int i0 = 0;
        for (; i0 + 32 <= words; i0 += 32) {
            const int i = i0 + lane;
            const pn_u32 word = __ldg(src + i);
            const int slot = i / 17 * 18 + i % 17;
            if (lane < 16) t[slot] = word;
            __syncwarp(); // two stores of 16 lanes: neither has two words in one bank
            if (lane >= 16) t[slot] = word;
        }
        {
            const int i = i0 + lane;
            const bool live = i < words;
            pn_u32 word = 0u;
            if (live) word = __ldg(src + i);
            const int slot = i / 17 * 18 + i % 17;
            if (live && lane < 16) t[slot] = word;
            __syncwarp();
            if (live && lane >= 16) t[slot] = word;
        }
        __syncwarp();
        if (c + lane < nb) {
            // Every lane issues the same loads (one shape of code for both parities).
            const int base = 18 * pair, ob = odd ? 9 : 0;
            pn_u32 r[9];
#pragma unroll
            for (int m = 0; m < 8; ++m) r[m] = t[base + ob + m];
            r[8] = t[base + 8];
            // Even lanes: word m of the pair is r[m]; odd lanes: word 8 is r[8], word 9 + j is
            // r[j]. The scale and the 32 codes as 8 aligned words (codes start at byte 2 of the
            // even block's words, at word 9 for the odd block).
            const pn_u16 dbits = (pn_u16)(odd ? r[8] >> 16 : r[0] & 0xffffu);
            pn_u32 qw[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) qw[j] = odd ? r[j] : (r[j] >> 16) | (r[j + 1] << 16);
            const int b = c + lane;
            float s = 0.0f;
            // Fully unrolled: every code's word index is a constant (registers, no local memory).
#pragma unroll
            for (int e = 0; e < 32; ++e) s += (float)(pn_i8)(pn_u8)(qw[e >> 2] >> (8 * (e & 3))) * xs[33 * b + e];
            acc += pn_f16_to_f32(dbits) * s;
        }
    }
    acc = pn_warp_sum(acc);
    if (lane == 0) y[row] = acc;
}
}
