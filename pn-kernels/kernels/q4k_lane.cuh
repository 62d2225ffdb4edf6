// One lane's share of a Q4_K super-block in the Q4_K GEMVs (the single-row `q4_k_gemv_f32` of
// quant_gemv.cu and the small-batch `q4_k_gemv_b*` of q4k_batch.cu): both kernels call these
// two functions, so the batch kernel's row t is the same arithmetic, in the same order, as the
// single-row kernel on row t (and the compiler sees the same expression in both).
//
// Lane l takes chunk c = l / 8 of the super-block (sub-blocks 2c and 2c+1) and qs bytes
// 4 (l % 8) .. + 3 of that chunk: the warp's 32 qs loads are 128 consecutive bytes.
//
// ALU: the decode is per weight byte, so it is kept to full-rate integer and fp32 ops. The
// scales and mins of sub-blocks 2c and 2c+1 are picked by shifts and selects (no branch: the
// lanes of a warp take different sub-blocks, so a branch would run both sides), and the 4-bit
// codes and 6-bit scales become floats as 2^23 + n - 2^23 (an OR and an FADD, exact) instead
// of int-to-float conversions, which sm_60 issues at a quarter of the fp32 rate.
#pragma once
#include "ggml_blocks.cuh"

// n (0 <= n < 2^23) as a float, exactly: 2^23 + n has n in its mantissa.
PN_DEV float pn_small_u2f(pn_u32 n) {
    return __int_as_float((int)(0x4B000000u | n)) - 8388608.0f;
}

// The lane's weights of one 144-byte super-block: the scales d, dmin, the two sub-blocks'
// 6-bit scale and min, and the 4 qs codes of each sub-block, as floats (lo: sub-block 2c from
// the low nibbles, hi: 2c+1 from the high nibbles).
struct Q4kLane {
    float d, dmin;
    float sc_lo, m_lo, sc_hi, m_hi;
    float qlo[4], qhi[4];
};

// Scale and min of sub-block j = 2c + h (h = 0, 1) from the 12 scale bytes as three words
// (q4_k_scale_min's formulas): for j < 4 (c < 2) sc = byte j & 63, m = byte j+4 & 63; for
// j >= 4, sc = (byte j+4 & 15) | (byte j-4 >> 6) << 4 and m = (byte j+4 >> 4) | (byte j >> 6) << 4.
// Bytes j - 4 (or j), j (or j + 4) and j + 4 sit at the same position j mod 4 of s0, s1 and s2.
PN_DEV void q4_k_lane_scales(pn_u32 s0, pn_u32 s1, pn_u32 s2, int c, Q4kLane* L) {
    const int sh = 16 * (c & 1);
    const bool high = c >= 2;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const pn_u32 a = (s0 >> (sh + 8 * h)) & 255u, b = (s1 >> (sh + 8 * h)) & 255u, e = (s2 >> (sh + 8 * h)) & 255u;
        const pn_u32 sc = high ? ((e & 15u) | ((a >> 6) << 4)) : (a & 63u);
        const pn_u32 m = high ? ((e >> 4) | ((b >> 6) << 4)) : (b & 63u);
        if (h == 0) {
            L->sc_lo = pn_small_u2f(sc);
            L->m_lo = pn_small_u2f(m);
        } else {
            L->sc_hi = pn_small_u2f(sc);
            L->m_hi = pn_small_u2f(m);
        }
    }
}

// Loads and decodes the lane's share of super-block b (16-byte aligned: every u32 field below
// is aligned).
PN_DEV Q4kLane q4_k_lane_load(const pn_u8* __restrict__ b, int c, int i0) {
    Q4kLane L;
    const pn_u32 dd = __ldg(reinterpret_cast<const pn_u32*>(b));
    const pn_u32* sw = reinterpret_cast<const pn_u32*>(b + 4);
    const pn_u32 s0 = __ldg(sw), s1 = __ldg(sw + 1), s2 = __ldg(sw + 2);
    const pn_u32 q = __ldg(reinterpret_cast<const pn_u32*>(b + 16 + 32 * c + i0));
    L.d = pn_f16_to_f32((pn_u16)(dd & 0xffffu));
    L.dmin = pn_f16_to_f32((pn_u16)(dd >> 16));
    q4_k_lane_scales(s0, s1, s2, c, &L);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        L.qlo[i] = pn_small_u2f((q >> (8 * i)) & 15u);
        L.qhi[i] = pn_small_u2f((q >> (8 * i + 4)) & 15u);
    }
    return L;
}

// The lane's term of the row's dot product: xl = x[64c + i0 ..][0..4) (sub-block 2c), xh the
// same 32 further on (sub-block 2c+1). The min is applied once per sub-block through the sum
// of x: d*sc*sum(q*x) - dmin*m*sum(x).
PN_DEV float q4_k_lane_term(const Q4kLane& L, float4 xl, float4 xh) {
    const float dot_lo = L.qlo[0] * xl.x + L.qlo[1] * xl.y + L.qlo[2] * xl.z + L.qlo[3] * xl.w;
    const float dot_hi = L.qhi[0] * xh.x + L.qhi[1] * xh.y + L.qhi[2] * xh.z + L.qhi[3] * xh.w;
    const float sum_lo = xl.x + xl.y + xl.z + xl.w, sum_hi = xh.x + xh.y + xh.z + xh.w;
    return L.d * (L.sc_lo * dot_lo + L.sc_hi * dot_hi) - L.dmin * (L.m_lo * sum_lo + L.m_hi * sum_hi);
}
