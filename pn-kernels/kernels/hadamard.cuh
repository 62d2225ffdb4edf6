// Index math of the block-diagonal Walsh-Hadamard butterflies of hadamard.cu, shared with the
// host shim (host/shim.cpp) so the CPU tests check the pairing against pn-format's transform.
#pragma once
#include "common.cuh"

// The first element of butterfly k (0 <= k < n/2) of the stage of span h (1, 2, 4 .. R/2) over
// n values in chunks of R; its partner is the element h further. Each chunk has R/2 butterflies
// per stage (chunk k / (R/2)); inside it, butterfly kk pairs the (kk % h)-th element of the
// (kk / h)-th group of 2h, Sylvester (natural) order, so a stage touches every element once.
PN_HD int pn_fwht_first(int k, int R, int h) {
    const int c = k / (R / 2), kk = k % (R / 2);
    return c * R + (kk / h) * 2 * h + (kk % h);
}

#if defined(__CUDACC__)
// (Device code: shared by hadamard.cu, fuse.cu and mixer.cu.)
// In-place FWHT of every R-chunk of buf[0..n) (n a multiple of R, R >= 64), all threads of the
// block. The 32 butterflies of a warp cover 64 consecutive words; for spans h < 32 their first
// elements fall in 16 banks twice over (a 2-way conflict), so lanes 16..31 access their partner
// first: each of the two loads (and stores) of the warp then hits 32 distinct banks.
PN_DEV void pn_fwht_smem(PN_SPTR(float) buf, int n, int R) {
    const bool swap = (threadIdx.x & 16) != 0;
    for (int h = 1; h < R; h <<= 1) {
        for (int k = threadIdx.x; k < n / 2; k += blockDim.x) {
            const int i = pn_fwht_first(k, R, h), j = i + h;
            const int first = swap ? j : i, second = swap ? i : j;
            const float u = buf[first], v = buf[second];
            const float a = swap ? v : u, b = swap ? u : v;
            buf[first] = swap ? a - b : a + b;
            buf[second] = swap ? a + b : a - b;
        }
        __syncthreads();
    }
}
#endif
