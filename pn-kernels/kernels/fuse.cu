// Fused producers of the PN GEMVs' input: one launch where the decode path took three or four.
// Each writes the f32 activation (as the unfused kernels do) and, when `xh` is given, its
// prepared fp16 copy (x * 2^e as half2, e from max|x|: the bits of pn_prepare_x_h2 on that f32
// row), so the GEMVs that follow read it without a pn_prepare_x launch.
//
// add_rms_norm_hadamard_prep_f32: the residual add before a norm (optional), the RMSNorm, the
// block-diagonal rotation and the fp16 copy, and (optional) the unrotated normed row beside the
// rotated one (the GDN's unquantized alpha/beta read it; the final norm before an unrotated head
// writes only it). Same arithmetic, in the same order, as add_inplace_f32 then
// rms_norm_hadamard_f32 (256 threads) then pn_prepare_x_h2, and, for the unrotated row,
// rms_norm_f32 (256 threads: the same reduction order): the same bits.
// swiglu_hadamard_prep_f32: swiglu_hadamard_f32 over a whole row (its R-chunks one after
// another) and the fp16 copy of the row.
//
// Rows are looped over with a grid stride (row t = blockIdx.x + i * gridDim.x), so any row count
// fits the grid. Every warp-wide shared access is to consecutive words (no bank conflict); the
// fp16 pairs are formed with a lane shuffle instead of 2-word-strided shared reads.
#include "hadamard.cuh"
#include "prepare.cuh"

// Writes the fp16 copy of v (this thread's value of element i; lanes 2j, 2j+1 hold consecutive
// elements) at xh[i / 2]: the even lane stores the pair. All 32 lanes must call it together.
PN_DEV void pn_store_pair(__half2* xh, int i, float v, float s, bool live) {
    const float other = __shfl_xor_sync(0xffffffffu, v, 1);
    if (live && (i & 1) == 0) xh[i >> 1] = __floats2half2_rn(v * s, other * s);
}

extern "C" {
// For each row t < rows (n values, n <= 12256): if r is not null, x[t] += r[t] (written back: the
// residual stream); if yp is not null, yp[t] = rms(x[t]) * w (the unrotated norm); if y is not
// null (n a multiple of R), y[t] = H_R(rms(x[t]) * w) * scale and, if xh is not null, xh[t]
// (n / 2 half2, n a multiple of 16) and e[t] as pn_prepare_x_h2 writes them for y[t] (xh needs
// y). Dynamic shared memory n floats. y and yp must not alias x or each other.
__global__ void __launch_bounds__(512) add_rms_norm_hadamard_prep_f32(float* x, const float* __restrict__ r,
                                                                      float* __restrict__ y, float* __restrict__ yp,
                                                                      const float* __restrict__ w, int n, float eps,
                                                                      int R, float scale, __half2* __restrict__ xh,
                                                                      int* __restrict__ e_out, int rows) {
    PN_DYN_SMEM(float, buf);
    PN_SMEM(float, scratch, 32);
    // Whole warps per pass, so the pair shuffle always has all 32 lanes.
    const int span = (n + blockDim.x - 1) / blockDim.x * blockDim.x;
    for (int t = blockIdx.x; t < rows; t += gridDim.x) {
        float* xr = x + (pn_u64)t * n;
        const float* rr = r ? r + (pn_u64)t * n : nullptr;
        float ss = 0.0f;
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            float v = xr[i];
            if (rr) {
                v += rr[i];
                xr[i] = v;
            }
            buf[i] = v;
            ss += v * v;
        }
        ss = pn_block_sum(ss, scratch);
        const float inv = 1.0f / sqrtf(ss / (float)n + eps);
        // rms_norm_f32's product, x * inv * w, from the value this thread stored.
        float* ypr = yp ? yp + (pn_u64)t * n : nullptr;
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const float v = buf[i] * inv * w[i];
            buf[i] = v;
            if (ypr) ypr[i] = v;
        }
        if (y) { // uniform over the block: the barriers below are reached by every thread or none
            __syncthreads();
            pn_fwht_smem(buf, n, R);
            float* yr = y + (pn_u64)t * n;
            float amax = 0.0f;
            for (int i = threadIdx.x; i < n; i += blockDim.x) {
                const float v = buf[i] * scale;
                yr[i] = v;
                amax = fmaxf(amax, fabsf(v));
            }
            if (xh) {
                amax = pn_block_max(amax, scratch);
                int e;
                const float s = pn_x_scale_exp(amax, &e);
                for (int i = threadIdx.x; i < span; i += blockDim.x) {
                    const bool live = i < n;
                    pn_store_pair(xh + (pn_u64)t * (n / 2), i, live ? buf[i] * scale : 0.0f, s, live);
                }
                if (threadIdx.x == 0) e_out[t] = e;
            }
        }
        __syncthreads(); // buf and scratch are reused by the next row
    }
}

// For each row t < rows of n values (n a multiple of R): out[t] = H_R(silu(gate[t]) * up[t]) *
// scale, `cap` values (a multiple of R: a group of whole chunks) at a time; if xh is not null,
// the fp16 copy of out[t] into xh[t] and e[t]. The copy re-reads out[t], which this block wrote
// (visible after the barrier). Dynamic shared memory cap floats.
__global__ void __launch_bounds__(512) swiglu_hadamard_prep_f32(const float* __restrict__ gate, const float* __restrict__ up,
                                                                float* out, int n, int R, int cap, float scale,
                                                                __half2* __restrict__ xh, int* __restrict__ e_out, int rows) {
    PN_DYN_SMEM(float, buf);
    PN_SMEM(float, scratch, 32);
    const int span = (n + blockDim.x - 1) / blockDim.x * blockDim.x;
    for (int t = blockIdx.x; t < rows; t += gridDim.x) {
        const pn_u64 row = (pn_u64)t * n;
        float amax = 0.0f;
        for (int c = 0; c < n; c += cap) {
            const int m = min(cap, n - c);
            for (int i = threadIdx.x; i < m; i += blockDim.x) buf[i] = pn_silu(gate[row + c + i]) * up[row + c + i];
            __syncthreads();
            pn_fwht_smem(buf, m, R);
            for (int i = threadIdx.x; i < m; i += blockDim.x) {
                const float v = buf[i] * scale;
                out[row + c + i] = v;
                amax = fmaxf(amax, fabsf(v));
            }
            __syncthreads(); // buf is refilled by the next group
        }
        if (xh) {
            amax = pn_block_max(amax, scratch);
            int e;
            const float s = pn_x_scale_exp(amax, &e);
            for (int i = threadIdx.x; i < span; i += blockDim.x) {
                const bool live = i < n;
                pn_store_pair(xh + row / 2, i, live ? out[row + i] : 0.0f, s, live);
            }
            if (threadIdx.x == 0) e_out[t] = e;
            __syncthreads(); // scratch is reused by the next row
        }
    }
}
}
