// The fp16 "prepared" activation of the PN half2 GEMVs (pn_gemv.cu): x times 2^e as half2, e
// chosen from max|x|. Shared by pn_prepare_x_h2 and the producers that write the copy
// themselves (fuse.cu), so every path converts with the same bits.
#pragma once
#include "common.cuh"

#if defined(__CUDACC__)
// Power-of-two factor that brings max|x| into [512, 1024): then a word's fp16 partial sum is at
// most PAIRS * 8 * 1024 < 65504 for both types.
PN_DEV float pn_x_scale_exp(float amax, int* e_out) {
    int e = 0;
    if (amax > 0.0f && amax < PN_INF) frexpf(amax, &e); // amax = m * 2^e, m in [0.5, 1)
    // The cap keeps the factor a finite f32 for tiny (subnormal) activations.
    const int se = (amax > 0.0f && amax < PN_INF) ? min(10 - e, 120) : 0; // NaN/inf: no scaling
    *e_out = se;
    return ldexpf(1.0f, se);
}
#endif
