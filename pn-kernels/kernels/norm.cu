// Normalisations, one thread block per row. Row (head h of token t): h = blockIdx.x, and the
// tokens t = blockIdx.y, blockIdx.y + gridDim.y, ... < n_tokens (a grid stride, so any token
// count fits the 65535 blocks of grid y), at t*tok_stride + h*head_stride, so per-head norms read
// heads in place (q heads sit every 512 floats, interleaved with their gates; GDN q/k heads
// inside the conv output). The reduction scratch is reused by the next token: pn_block_sum's
// first barrier orders that.
// rms(v) = v / sqrt(mean(v^2) + eps) with IEEE sqrt and division (no fast math).
// y (or the output pointer) may be null: the result then overwrites the input row in place
// (every element is read before the block-wide reduction and written after it).
#include "common.cuh"

extern "C" {
// y[r][i] = x[r][i] / sqrt(mean_i x[r]^2 + eps) * w[i]   (w may be null: no weight)
__global__ void __launch_bounds__(1024) rms_norm_f32(const float* x, long long x_ts, long long x_hs,
                                                     float* y, long long y_ts, long long y_hs,
                                                     const float* __restrict__ w, int n, float eps, int n_tokens) {
    PN_SMEM(float, scratch, 32);
    for (long long t = blockIdx.y; t < n_tokens; t += gridDim.y) {
        const float* xr = x + t * x_ts + blockIdx.x * x_hs;
        float* yr = y ? y + t * y_ts + blockIdx.x * y_hs : const_cast<float*>(xr);
        float ss = 0.0f;
        for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
        ss = pn_block_sum(ss, scratch);
        const float inv = 1.0f / sqrtf(ss / (float)n + eps);
        for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = w ? xr[i] * inv * w[i] : xr[i] * inv;
    }
}

// Gated RMSNorm of the GDN output: y = rms(o) * w * silu(z), per row (value head); w shared.
__global__ void __launch_bounds__(1024) gated_rms_norm_f32(const float* o, long long o_ts, long long o_hs,
                                                           const float* __restrict__ z, long long z_ts, long long z_hs,
                                                           float* y, long long y_ts, long long y_hs,
                                                           const float* __restrict__ w, int n, float eps, int n_tokens) {
    PN_SMEM(float, scratch, 32);
    for (long long t = blockIdx.y; t < n_tokens; t += gridDim.y) {
        const float* orow = o + t * o_ts + blockIdx.x * o_hs;
        const float* zr = z + t * z_ts + blockIdx.x * z_hs;
        float* yr = y ? y + t * y_ts + blockIdx.x * y_hs : const_cast<float*>(orow);
        float ss = 0.0f;
        for (int i = threadIdx.x; i < n; i += blockDim.x) ss += orow[i] * orow[i];
        ss = pn_block_sum(ss, scratch);
        const float inv = 1.0f / sqrtf(ss / (float)n + eps);
        for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = orow[i] * inv * w[i] * pn_silu(zr[i]);
    }
}

// L2 normalisation with a scale (GDN q and k heads): y = x * scale / max(||x||, eps).
__global__ void __launch_bounds__(1024) l2_norm_f32(const float* x, long long x_ts, long long x_hs,
                                                    float* y, long long y_ts, long long y_hs,
                                                    int n, float eps, float scale, int n_tokens) {
    PN_SMEM(float, scratch, 32);
    for (long long t = blockIdx.y; t < n_tokens; t += gridDim.y) {
        const float* xr = x + t * x_ts + blockIdx.x * x_hs;
        float* yr = y ? y + t * y_ts + blockIdx.x * y_hs : const_cast<float*>(xr);
        float ss = 0.0f;
        for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
        ss = pn_block_sum(ss, scratch);
        const float f = scale / fmaxf(sqrtf(ss), eps);
        for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * f;
    }
}
}
