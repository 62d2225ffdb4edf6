// Row gather (the embedding lookup): out[t][e] = W[ids[t]][e] decoded to f32. One thread block
// per token. Types: Q3_K (token_embd of the PN mix), F32, F16, Q8_0.
#include "ggml_blocks.cuh"

extern "C" {
__global__ void __launch_bounds__(256) q3_k_get_rows(const pn_u8* __restrict__ w, const int* __restrict__ ids, float* __restrict__ out, int K, int n_rows) {
    const int id = ids[blockIdx.x];
    if (id < 0 || id >= n_rows) return; // the wrapper validates ids on the host; never read out of bounds
    const pn_u8* row = w + (pn_u64)id * (K / PN_QK_K) * PN_Q3_K_BYTES;
    for (int e = threadIdx.x; e < K; e += blockDim.x)
        out[(pn_u64)blockIdx.x * K + e] = q3_k_elem(row + (e / PN_QK_K) * PN_Q3_K_BYTES, e % PN_QK_K);
}
__global__ void __launch_bounds__(256) q8_0_get_rows(const pn_u8* __restrict__ w, const int* __restrict__ ids, float* __restrict__ out, int K, int n_rows) {
    const int id = ids[blockIdx.x];
    if (id < 0 || id >= n_rows) return;
    const pn_u8* row = w + (pn_u64)id * (K / 32) * PN_Q8_0_BYTES;
    for (int e = threadIdx.x; e < K; e += blockDim.x)
        out[(pn_u64)blockIdx.x * K + e] = q8_0_elem(row + (e / 32) * PN_Q8_0_BYTES, e % 32);
}
__global__ void __launch_bounds__(256) f16_get_rows(const pn_u16* __restrict__ w, const int* __restrict__ ids, float* __restrict__ out, int K, int n_rows) {
    const int id = ids[blockIdx.x];
    if (id < 0 || id >= n_rows) return;
    for (int e = threadIdx.x; e < K; e += blockDim.x)
        out[(pn_u64)blockIdx.x * K + e] = pn_f16_to_f32(w[(pn_u64)id * K + e]);
}
__global__ void __launch_bounds__(256) f32_get_rows(const float* __restrict__ w, const int* __restrict__ ids, float* __restrict__ out, int K, int n_rows) {
    const int id = ids[blockIdx.x];
    if (id < 0 || id >= n_rows) return;
    for (int e = threadIdx.x; e < K; e += blockDim.x) out[(pn_u64)blockIdx.x * K + e] = w[(pn_u64)id * K + e];
}
}
