// The causal depthwise conv1d (kernel 4) + SiLU of one channel at one token, shared by
// conv1d.cu and the decode delta rule that runs the conv itself (delta_rule.cu), so both give
// the same bits (one expression, contracted the same way).
#pragma once
#include "common.cuh"

#if defined(__CUDACC__)
// silu(w0 s0 + w1 s1 + w2 s2 + w3 u): s0..s2 the last three inputs (oldest first), u this one.
PN_DEV float pn_conv4_silu(float w0, float w1, float w2, float w3, float s0, float s1, float s2, float u) {
    const float acc = w0 * s0 + w1 * s1 + w2 * s2 + w3 * u;
    return pn_silu(acc);
}
#endif
