// The q4_0 KV cache block (ggml's block_q4_0 layout: f16 d @0, 16 bytes of nibbles @2; byte i
// holds value i in its low nibble and value i + 16 in its high nibble, each stored as q + 8) with
// the CPU KV cache's quantizer (qwen-model cpu/kvquant.rs, BlockQ4_0::quantize) reproduced bit for
// bit: m = the first value of largest magnitude (0 when none is non-zero), d = m / -8,
// id = 1/d (0 when d is 0), q = clamp(round_half_away(x * id), -8, 7) with NaN -> 0, and d stored
// as f16 rounded to nearest even. Compiled both into the attention kernels and, as host C++, into
// the test shim (host/shim.cpp), which checks it against the Rust quantizer.
#pragma once
#include "common.cuh"

#define PN_Q4_0_KV_BYTES 18

// f32 -> IEEE binary16 bits, rounded to nearest even; overflow to inf, NaN kept quiet with its
// top payload bits. Written out (not __float2half_rn) so that the host shim runs the same code
// as the device.
PN_HD pn_u16 pn_f32_to_f16_bits(float f) {
    const pn_u32 x = pn_as_u32(f);
    const pn_u32 sign = (x >> 16) & 0x8000u;
    const pn_u32 ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) {
        return (pn_u16)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x0200u | ((ax >> 13) & 0x3ffu) : 0u));
    }
    // 65520 = halfway between 65504 (largest f16, odd mantissa) and 2^16: ties go up to inf.
    if (ax >= 0x477ff000u) return (pn_u16)(sign | 0x7c00u);
    if (ax < 0x38800000u) {
        // Below 2^-14: an f16 subnormal, counted in units of 2^-24. Under 2^-25 (including the
        // f32 subnormals) everything rounds to zero; exactly 2^-25 ties to the even zero.
        if (ax < 0x33000000u) return (pn_u16)sign;
        const pn_u32 shift = 126u - (ax >> 23); // 14..24
        const pn_u32 man = (ax & 0x7fffffu) | 0x800000u;
        pn_u32 h = man >> shift;
        const pn_u32 rem = man & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
        if (rem > halfway || (rem == halfway && (h & 1u))) ++h;
        return (pn_u16)(sign | h);
    }
    // Normal: rebias the exponent (127 - 15 = 112) and round the 13 dropped mantissa bits; a
    // carry into the exponent is the correct next binade.
    pn_u32 h = (ax - 0x38000000u) >> 13;
    const pn_u32 rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
    return (pn_u16)(sign | h);
}

PN_HD float pn_abs_bits(float x) { return pn_as_float(pn_as_u32(x) & 0x7fffffffu); }

// The value of largest magnitude among x[0..32), the first one on ties; +0 when every value is
// zero (or NaN, which never compares greater). The CPU's fold in the same order.
PN_HD float q4_0_kv_signed_absmax(const float* x) {
    float m = 0.0f;
    for (int i = 0; i < 32; ++i) {
        if (pn_abs_bits(x[i]) > pn_abs_bits(m)) m = x[i];
    }
    return m;
}

// d = m / -8 (exact up to the final rounding, as a multiply by -1/8 is).
PN_HD float q4_0_kv_scale(float m) { return pn_mul(m, -0.125f); }

// 1/d correctly rounded, or 0 for d == 0 (all-zero blocks store code 8, value 0).
PN_HD float q4_0_kv_inv_scale(float d) {
    if (d == 0.0f) return 0.0f;
#if defined(__CUDA_ARCH__)
    return __frcp_rn(d);
#else
    return 1.0f / d;
#endif
}

// The stored nibble (0..16) of value v: q + 8 with q = clamp(round(v * id), -8, 7); halves
// round away from zero (Rust's f32::round, C's roundf); NaN (0 * inf, a NaN input) gives q = 0
// as Rust's saturating `as i32` does.
PN_HD int q4_0_kv_code(float v, float id) {
#if defined(__CUDA_ARCH__)
    float r = roundf(pn_mul(v, id));
#else
    float r = std::round(pn_mul(v, id));
#endif
    if (r != r) return 8;
    if (r < -8.0f) r = -8.0f;
    if (r > 7.0f) r = 7.0f;
    return (int)r + 8;
}

// Byte i of the nibbles from the codes of values i (low) and i + 16 (high).
PN_HD pn_u8 q4_0_kv_pack(int lo, int hi) { return (pn_u8)(lo | (hi << 4)); }

// One block of 32 values into 18 bytes (the CPU's BlockQ4_0::quantize). The store kernel runs
// the same steps with one value per lane and pairs the codes with a warp shuffle.
PN_HD void q4_0_kv_quantize(const float* x, pn_u8* blk) {
    const float d = q4_0_kv_scale(q4_0_kv_signed_absmax(x));
    const float id = q4_0_kv_inv_scale(d);
    const pn_u16 dh = pn_f32_to_f16_bits(d);
    blk[0] = (pn_u8)(dh & 0xffu);
    blk[1] = (pn_u8)(dh >> 8);
    for (int i = 0; i < 16; ++i) blk[2 + i] = q4_0_kv_pack(q4_0_kv_code(x[i], id), q4_0_kv_code(x[i + 16], id));
}

// Eight values 8*part .. 8*part+8 (part 0..4) of a block with scale d, from the 8 nibble bytes
// 8*(part&1) .. +8 given as two little-endian words; parts 2 and 3 are the high nibbles.
// value = d * (nibble - 8) in f32, as the CPU dequantizes.
PN_HD void q4_0_kv_decode8(float d, pn_u32 w0, pn_u32 w1, int high, float* out) {
    const int sh = high ? 4 : 0;
    for (int i = 0; i < 4; ++i) {
        out[i] = pn_mul(d, (float)((int)((w0 >> (8 * i + sh)) & 15u) - 8));
        out[4 + i] = pn_mul(d, (float)((int)((w1 >> (8 * i + sh)) & 15u) - 8));
    }
}

// Values 8*part .. 8*part+8 of the block at `blk` (any byte address).
PN_HD void q4_0_kv_part8(const pn_u8* blk, int part, float* out) {
    const pn_u8* q = blk + 2 + 8 * (part & 1);
    q4_0_kv_decode8(pn_f16_to_f32(pn_load_u16(blk)), pn_load_u32(q), pn_load_u32(q + 4), part >> 1, out);
}
