// kernels/q8_group.cu (the grouped Q8_0 GEMV) run on the host by the SIMT emulator (see
// emu_pn_gemv.cpp for the scheme).
#include "common.cuh"
#include "ggml_blocks.cuh"

namespace kq8g {
#include "q8_group.cu"
}

extern "C" {
// q8_0_gemv_group with the group passed by value (layout of Q8Group: src/emu/q8_group.rs) on
// `grid` blocks of `threads` with `smem` bytes of dynamic shared memory (the staged x).
int pn_emu_q8_0_gemv_group(const void* group, const float* x, int K, unsigned grid, unsigned threads, unsigned smem) {
    const kq8g::Q8Group g = *(const kq8g::Q8Group*)group;
    std::function<void()> body = [&] { kq8g::q8_0_gemv_group(g, x, K); };
    return emu::launch3(EmuDim3{grid, 1, 1}, threads, smem, body) ? 0 : -1;
}
}
