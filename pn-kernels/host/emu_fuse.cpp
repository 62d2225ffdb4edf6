// kernels/fuse.cu run on the host by the SIMT emulator (see emu_pn_gemv.cpp).
#include "common.cuh"
#include "hadamard.cuh"

namespace kfuse {
#include "fuse.cu"
}

extern "C" {
// Arguments of fuse.cu's kernels (layout of `FuseArgs` in src/emu/fuse.rs). kind 0
// add_rms_norm_hadamard_prep_f32 (x, r, y, yp, w, n, eps), 1 swiglu_hadamard_prep_f32 (gate = x,
// up = r, out = y, n, cap); both R, scale, xh, e, rows, on `grid` blocks of `threads` with `smem`
// bytes of dynamic shared memory.
struct PnFuseArgs {
    int kind;
    float* x;
    const float* r;
    float* y;
    float* yp;
    const float* w;
    int n;
    float eps;
    int R;
    int cap;
    float scale;
    void* xh;
    int* e;
    int rows;
    unsigned grid, threads, smem;
};
// Returns 0, -1 on a barrier deadlock, -2 for an unknown kind.
int pn_emu_fuse(const PnFuseArgs* a) {
    std::function<void()> body;
    __half2* xh = (__half2*)a->xh;
    switch (a->kind) {
    case 0:
        body = [&] {
            kfuse::add_rms_norm_hadamard_prep_f32(a->x, a->r, a->y, a->yp, a->w, a->n, a->eps, a->R, a->scale, xh, a->e, a->rows);
        };
        break;
    case 1:
        body = [&] { kfuse::swiglu_hadamard_prep_f32(a->x, a->r, a->y, a->n, a->R, a->cap, a->scale, xh, a->e, a->rows); };
        break;
    default: return -2;
    }
    return emu::launch3(EmuDim3{a->grid, 1, 1}, a->threads, a->smem, body) ? 0 : -1;
}
}
