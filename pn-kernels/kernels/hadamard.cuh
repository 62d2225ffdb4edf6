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
