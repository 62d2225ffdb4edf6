// The PN GEMV decode kernel as it was before the emulator counted (main 1cc9fc2,
// kernels/pn_gemv.cu `pn_gemv_h2_even`), kept for the host test that shows the counters catch
// its costs: staged x read at a lane stride of 64 (pn4t) / 80 (pn3t) words (32- / 16-way bank
// conflicts) and 17 weight loads per lane 68 bytes apart (8x the minimum sectors). Host-only: the
// only change is the shared-memory declarations (PN_SMEM / PN_SPTR) the emulator counts through.
// Included by host/emu_pn_gemv.cpp inside namespace legacy; the per-lane pair load and block
// dot (unchanged since) are pn_gemv.cu's own.
// Stages x[0..K) into xs as half2 times 2^e; returns e (undo with ldexpf(y, -e)).
PN_DEV int pn_stage_x_h2(const float* __restrict__ x, int K, PN_SPTR(__half2) xs, PN_SPTR(float) scratch) {
    float amax = 0.0f;
    for (int i = threadIdx.x; i < K; i += blockDim.x) amax = fmaxf(amax, fabsf(__ldg(x + i)));
    amax = pn_block_max(amax, scratch);
    int e;
    const float s = pn_x_scale_exp(amax, &e);
    const float2* x2 = reinterpret_cast<const float2*>(x);
    for (int i = threadIdx.x; i < K / 2; i += blockDim.x) {
        float2 v = __ldg(x2 + i);
        xs[i] = __floats2half2_rn(v.x * s, v.y * s); // exact scaling, one rounding to fp16
    }
    __syncthreads();
    return e;
}

// Stages a prepared copy (see pn_prepare_x_h2) with 16-byte loads; returns its exponent. K is a
// multiple of 16 (80 | K or 64 | K), so K/2 half2 are K/8 uint4.
PN_DEV int pn_stage_prepared(const __half2* __restrict__ xh, const int* __restrict__ e, int K, PN_SPTR(__half2) xs) {
    const uint4* src = reinterpret_cast<const uint4*>(xh);
    PN_SPTR(uint4) const dst = PN_SCAST(uint4, xs);
    for (int i = threadIdx.x; i < K / 8; i += blockDim.x) dst[i] = __ldg(src + i);
    __syncthreads();
    return __ldg(e);
}

// Rows with an even block count: every row starts on a pair, so the ROWS rows of a warp share
// their activation offsets and each lane has ROWS*17 words in flight.
// PREP: x arrives prepared (fp16, scaled, exponent in *e_in) instead of as f32.
template <int BITS, int ROWS, bool PREP>
__device__ void pn_gemv_h2_even(const pn_u32* __restrict__ w, const float* __restrict__ x, const __half2* __restrict__ xh,
                                const int* __restrict__ e_in, float* __restrict__ y, int N, int K) {
    typedef PnTraits<BITS> T;
    PN_DYN_SMEM(__half2, xs);
    PN_SMEM(float, scratch, 32);
    const int e = PREP ? pn_stage_prepared(xh, e_in, K, xs) : pn_stage_x_h2(x, K, xs, scratch);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row0 = (blockIdx.x * (blockDim.x >> 5) + warp) * ROWS;
    if (row0 >= N) return;
    const int nb = K / T::WEIGHTS;
    const int npairs = nb / 2;
    const pn_u64 total = (pn_u64)N * nb;
    float acc[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[r] = 0.0f;
    for (int j = lane; j < npairs; j += 32) {
        pn_u32 p[ROWS][PN_PAIR_WORDS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const int row = min(row0 + r, N - 1); // clamp: a tail row is computed, not stored
            pn_load_pair(w, (pn_u64)row * npairs + j, total, p[r]);
        }
        PN_SPTR(const __half2) const xb = xs + j * T::WEIGHTS; // pair j covers 2*WEIGHTS elements
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
            acc[r] = pn_add(acc[r], pn_add(pn_block_dot_h2<BITS, 0>(p[r], xb), pn_block_dot_h2<BITS, 1>(p[r], xb + T::WEIGHTS / 2)));
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const float v = pn_warp_sum(acc[r]);
        if (lane == 0 && row0 + r < N) y[row0 + r] = ldexpf(v, -e);
    }
}

