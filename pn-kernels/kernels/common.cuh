// Shared definitions for the kernels and for the host-side C++ shim that tests them on the CPU.
// Everything outside `#ifdef __CUDACC__` must compile as plain C++17 with g++.
#pragma once

// Fixed-width types without <cstdint>: NVRTC ships no host C++ headers.
typedef unsigned char pn_u8;
typedef signed char pn_i8;
typedef unsigned short pn_u16;
typedef unsigned int pn_u32;
typedef int pn_i32;
typedef unsigned long long pn_u64;

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define PN_HD __host__ __device__ __forceinline__
#define PN_DEV __device__ __forceinline__
#else
#include <cmath>
#include <cstring>
#define PN_HD inline
#endif

// Bit casts.
PN_HD float pn_as_float(pn_u32 u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    std::memcpy(&f, &u, 4);
    return f;
#endif
}

PN_HD pn_u32 pn_as_u32(float f) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    pn_u32 u;
    std::memcpy(&u, &f, 4);
    return u;
#endif
}

// Rounded-once arithmetic. On the device nvcc/NVRTC would contract `a*b+c` into an FMA
// (--fmad=true); code whose result must match the host bit for bit uses these instead.
PN_HD float pn_mul(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
PN_HD float pn_add(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}
PN_HD float pn_sub(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}
PN_HD float pn_fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
    return __fmaf_rn(a, b, c);
#else
    return std::fma(a, b, c);
#endif
}

// IEEE binary16 bits to f32, exact (every f16 is an f32). Written out so that the host shim and
// the device agree without cuda_fp16.h on the host.
PN_HD float pn_f16_to_f32(pn_u16 h) {
    const pn_u32 sign = (pn_u32)(h & 0x8000u) << 16;
    const pn_u32 exp = (h >> 10) & 0x1fu;
    const pn_u32 man = h & 0x3ffu;
    if (exp == 0) {
        // zero or subnormal: man * 2^-24, exact in f32
        const float f = (float)man * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    if (exp == 31) return pn_as_float(sign | 0x7f800000u | (man << 13));
    return pn_as_float(sign | ((exp + 112u) << 23) | (man << 13));
}

// Little-endian loads from byte pointers with no alignment assumption (GGML blocks of 34, 110 or
// 144 bytes leave their fields unaligned).
PN_HD pn_u16 pn_load_u16(const pn_u8* p) { return (pn_u16)(p[0] | (p[1] << 8)); }
PN_HD pn_u32 pn_load_u32(const pn_u8* p) {
    return (pn_u32)p[0] | ((pn_u32)p[1] << 8) | ((pn_u32)p[2] << 16) | ((pn_u32)p[3] << 24);
}

// Shared-memory declarations and pointers. On the device plain CUDA; under the host emulator
// (PN_EMU, host/simt_emu.h) pointers that record each access, so that it can count bank
// conflicts. Kernels declare every shared array with these, so none escapes the count.
#if defined(PN_EMU)
#define PN_SMEM(T, name, n) alignas(16) static thread_local T name##_emu_[n]; const emu::sp<T> name(name##_emu_)
#define PN_DYN_SMEM(T, name) const emu::sp<T> name(reinterpret_cast<T*>(emu::dyn_smem()))
#define PN_SPTR(T) emu::sp<T>
#define PN_SCAST(T, p) ((p).template cast<T>())
#elif defined(__CUDACC__)
#define PN_SMEM(T, name, n) __shared__ __align__(16) T name[n]
#define PN_DYN_SMEM(T, name) extern __shared__ __align__(16) T name[]
#define PN_SPTR(T) T*
#define PN_SCAST(T, p) reinterpret_cast<T*>(p)
#endif

#if defined(__CUDACC__)
#define PN_INF __int_as_float(0x7f800000)
// Warp-wide reductions over all 32 lanes.
PN_DEV float pn_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
PN_DEV float pn_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Block-wide sum; `scratch` holds at least 32 floats; every thread gets the result.
PN_DEV float pn_block_sum(float v, PN_SPTR(float) scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    v = pn_warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < nwarps ? scratch[lane] : 0.0f;
    return pn_warp_sum(t);
}
PN_DEV float pn_block_max(float v, PN_SPTR(float) scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    v = pn_warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < nwarps ? scratch[lane] : -PN_INF;
    return pn_warp_max(t);
}
PN_DEV float pn_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
PN_DEV float pn_silu(float x) { return x / (1.0f + expf(-x)); }
#endif
