// Stock ggml block decodes used by the model (Q8_0, Q4_K, Q3_K, F16) as __host__ __device__
// functions over byte pointers (fields are not aligned in general). Formulas follow
// shared/docs/gguf-and-ggml-types.md section 3 and keep ggml's operation order (d*sc first, then
// times q, minus dmin*m) so that results match a CPU decode bit for bit.
#pragma once
#include "common.cuh"

#define PN_Q8_0_BYTES 34
#define PN_Q4_K_BYTES 144
#define PN_Q3_K_BYTES 110
#define PN_QK_K 256

// Q8_0: d f16 @0, 32 x i8 @2.
PN_HD float q8_0_elem(const pn_u8* b, int e) {
    return pn_mul(pn_f16_to_f32(pn_load_u16(b)), (float)(pn_i8)b[2 + e]);
}

// Q4_K sub-block j (0..8) scale and min, 6 bits each.
PN_HD void q4_k_scale_min(const pn_u8* s, int j, int* sc, int* m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// The same from the 12 scale bytes held as three little-endian words; bytes are picked by
// shifts so that a run-time j does not force a local-memory array on the device.
PN_HD int pn_byte_of3(pn_u32 s0, pn_u32 s1, pn_u32 s2, int k) {
    const pn_u32 w = k < 4 ? s0 : (k < 8 ? s1 : s2);
    return (int)((w >> (8 * (k & 3))) & 0xffu);
}
PN_HD void q4_k_scale_min_words(pn_u32 s0, pn_u32 s1, pn_u32 s2, int j, int* sc, int* m) {
    if (j < 4) {
        *sc = pn_byte_of3(s0, s1, s2, j) & 63;
        *m = pn_byte_of3(s0, s1, s2, j + 4) & 63;
    } else {
        const int hi = pn_byte_of3(s0, s1, s2, j + 4);
        *sc = (hi & 15) | ((pn_byte_of3(s0, s1, s2, j - 4) >> 6) << 4);
        *m = (hi >> 4) | ((pn_byte_of3(s0, s1, s2, j) >> 6) << 4);
    }
}

// Q4_K element e (0..256): d*sc*q - dmin*m.
PN_HD float q4_k_elem(const pn_u8* b, int e) {
    const float d = pn_f16_to_f32(pn_load_u16(b));
    const float dmin = pn_f16_to_f32(pn_load_u16(b + 2));
    const int c = e / 64, r = e % 64, l = r % 32, j = 2 * c + r / 32;
    int sc, m;
    q4_k_scale_min(b + 4, j, &sc, &m);
    const pn_u8 byte = b[16 + 32 * c + l];
    const int q = r < 32 ? (byte & 15) : (byte >> 4);
    return pn_sub(pn_mul(pn_mul(d, (float)sc), (float)q), pn_mul(dmin, (float)m));
}

// Q3_K sub-block scale j (0..16), signed 6-bit.
PN_HD int q3_k_scale(const pn_u8* s, int j) {
    const int low4 = j < 8 ? (s[j] & 15) : (s[j - 8] >> 4);
    const int hi2 = (s[8 + (j % 4)] >> (2 * (j / 4))) & 3;
    return (low4 | (hi2 << 4)) - 32;
}

// Q3_K element e (0..256): d * sc * q with q in -4..3.
PN_HD float q3_k_elem(const pn_u8* b, int e) {
    const pn_u8* hmask = b;
    const pn_u8* qs = b + 32;
    const pn_u8* scales = b + 96;
    const float d = pn_f16_to_f32(pn_load_u16(b + 108));
    const int h = e / 128, r = e % 128, j = r / 32, l = r % 32;
    const int q2 = (qs[32 * h + l] >> (2 * j)) & 3;
    const int hb = (hmask[l] >> (4 * h + j)) & 1;
    const int q = hb ? q2 : q2 - 4;
    const int sc = q3_k_scale(scales, 8 * h + 2 * j + l / 16);
    return pn_mul(pn_mul(d, (float)sc), (float)q);
}
