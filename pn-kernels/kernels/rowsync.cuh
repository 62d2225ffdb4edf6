// Cross-block hand-offs inside one launch without a grid barrier: the blocks that share a
// result each count their arrival on a word of a small zeroed scratch (`sync`), and the block
// that arrives last (it knows every other one has finished its writes and its reads) does the
// work that needs all of them. The counters wrap back to 0 and the maxima are exchanged for 0,
// so the scratch is zero again after every launch and needs no clearing between launches.
//
// Used by mixer.cu (the fp16 copy of a row that several blocks produce: its exponent needs the
// whole row's max) and delta_rule_conv.cu (the conv state of a key head read by every value
// head of its group, shifted only after the last one has read it).
#pragma once
#include "prepare.cuh"

#if defined(__CUDACC__)
// Every thread of the block calls it, after its own global writes (and reads) of the shared
// part are done. Returns, in every thread, whether this block is the last of `blocks` to
// arrive at counter `cnt`; the previous blocks' global writes are then visible to it through
// volatile (L1-bypassing) loads. `flag`: one shared word.
PN_DEV bool pn_arrive_last(unsigned* cnt, unsigned blocks, PN_SPTR(unsigned) flag) {
    __threadfence(); // this thread's writes reach device scope before the arrival counts
    __syncthreads();
    if (threadIdx.x == 0) flag[0] = atomicInc(cnt, blocks - 1) == blocks - 1 ? 1u : 0u;
    __syncthreads();
    const bool last = flag[0] != 0u;
    __syncthreads(); // flag is free again for the caller's next use
    return last;
}

// The fp16 copy of a row of `row_len` f32 values that `blocks` blocks wrote into `row` (each
// its own part): every block calls it with `amax` = max |value| of its part (the same in every
// thread: a pn_block_max result, NaN-free as fmaxf from 0 gives it). sync[0] counts arrivals,
// sync[1] gathers the maximum (the bits of a non-negative float order as unsigned ints). The
// last block writes xh (row_len / 2 half2) and *e_out as pn_prepare_x_h2 would from the whole
// row: the same maximum, the same exponent, the same conversion. `bc`: two shared words.
PN_DEV void pn_row_prepare(const float* row, int row_len, float amax, unsigned* sync, unsigned blocks,
                           __half2* __restrict__ xh, int* __restrict__ e_out, PN_SPTR(unsigned) bc) {
    if (threadIdx.x == 0) atomicMax(sync + 1, pn_as_u32(amax));
    if (!pn_arrive_last(sync, blocks, bc)) return;
    if (threadIdx.x == 0) bc[1] = atomicExch(sync + 1, 0u);
    __syncthreads();
    int e;
    const float s = pn_x_scale_exp(pn_as_float(bc[1]), &e);
    const volatile float* v = row;
    for (int i = threadIdx.x; i < row_len / 2; i += blockDim.x) xh[i] = __floats2half2_rn(v[2 * i] * s, v[2 * i + 1] * s);
    if (threadIdx.x == 0) *e_out = e;
}
#endif
