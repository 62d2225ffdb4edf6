// Host stand-in for <cuda_fp16.h> and the CUDA built-ins the kernels use, for running kernel
// sources under the SIMT emulator (host/simt_emu.h). Only the host emulator includes it: the
// emulated translation units define __CUDACC__ (so the kernels take their device code paths) but
// not __CUDA_ARCH__ (so the few arch-only intrinsics keep their written-out host forms).
// fp16 arithmetic is exact-then-rounded-once (round to nearest even), as sm_60's HFMA2 is.
#pragma once
#include <cmath>
#include <cstring>
#include <math.h> // expf, fabsf, frexpf, ldexpf, sqrtf, roundf in the global namespace, as in CUDA
#include "../simt_emu.h"

struct float2 {
    float x, y;
};
struct float4 {
    float x, y, z, w;
};
struct uint4 {
    unsigned x, y, z, w;
};

// f32 -> f16 bits, round to nearest even (inf on overflow, NaN kept quiet).
inline unsigned short emu_f32_to_f16(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    const unsigned sign = (u >> 16) & 0x8000u;
    const unsigned a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (unsigned short)(sign | 0x7e00u);
    if (a >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u); // >= 65520: inf
    if (a < 0x38800000u) { // f16 subnormal or zero: units of 2^-24
        const unsigned E = a >> 23;
        if (E < 102u) return (unsigned short)sign; // below 2^-25: rounds to 0
        const unsigned man = (a & 0x7fffffu) | 0x800000u, drop = 126u - E;
        const unsigned q = man >> drop, rem = man & ((1u << drop) - 1u), half = 1u << (drop - 1u);
        const unsigned h = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
        return (unsigned short)(sign | h);
    }
    const unsigned e = (a >> 23) - 112u;
    unsigned h = (e << 10) | ((a >> 13) & 0x3ffu);
    const unsigned rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
    return (unsigned short)(sign | h);
}
inline float emu_f16_to_f32(unsigned short h) {
    const unsigned sign = (unsigned)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    float f;
    if (exp == 0) {
        f = (float)man * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    const unsigned u = exp == 31 ? (sign | 0x7f800000u | (man << 13)) : (sign | ((exp + 112u) << 23) | (man << 13));
    std::memcpy(&f, &u, 4);
    return f;
}
// The f16 nearest (ties to even) to a double: exact products and sums of f16 values are doubles,
// so this is the single rounding of an fp16 FMA.
inline unsigned short emu_f64_to_f16(double v) {
    if (std::isnan(v)) return 0x7e00u;
    const double a = std::fabs(v);
    double r;
    if (a >= 65520.0) r = INFINITY;
    else if (a == 0.0) r = 0.0;
    else {
        int ex;
        std::frexp(a, &ex); // a = m * 2^ex, m in [0.5, 1): the leading bit is 2^(ex-1)
        const double q = std::ldexp(1.0, std::max(ex - 1, -14) - 10);
        r = std::nearbyint(a / q) * q; // default rounding mode: ties to even
    }
    return emu_f32_to_f16((float)std::copysign(r, v)); // exact: r is an f16 value
}

struct __half {
    unsigned short bits;
};
struct __half2 {
    __half x, y;
};

inline __half __float2half_rn(float f) { return __half{emu_f32_to_f16(f)}; }
inline float __half2float(__half h) { return emu_f16_to_f32(h.bits); }
inline unsigned short __half_as_ushort(__half h) { return h.bits; }
inline __half2 __floats2half2_rn(float a, float b) { return __half2{__float2half_rn(a), __float2half_rn(b)}; }
inline __half2 __float2half2_rn(float a) { return __floats2half2_rn(a, a); }
inline float2 __half22float2(__half2 h) { return float2{__half2float(h.x), __half2float(h.y)}; }
inline __half emu_hfma(__half a, __half b, __half c) {
    return __half{emu_f64_to_f16((double)__half2float(a) * (double)__half2float(b) + (double)__half2float(c))};
}
inline __half2 __hfma2(__half2 a, __half2 b, __half2 c) { return __half2{emu_hfma(a.x, b.x, c.x), emu_hfma(a.y, b.y, c.y)}; }
inline __half2 __hsub2(__half2 a, __half2 b) {
    return __half2{__half{emu_f64_to_f16((double)__half2float(a.x) - (double)__half2float(b.x))},
                   __half{emu_f64_to_f16((double)__half2float(a.y) - (double)__half2float(b.y))}};
}

inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}
inline int __float_as_int(float f) {
    int i;
    std::memcpy(&i, &f, 4);
    return i;
}
inline unsigned __float_as_uint(float f) {
    unsigned i;
    std::memcpy(&i, &f, 4);
    return i;
}
using std::max;
