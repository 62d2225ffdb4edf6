// kernels/pn_gemv.cu and kernels/quant_gemv.cu run on the host by the SIMT emulator (compiled
// with PN_EMU and __CUDACC__ defined, host/emu first on the include path: see build.rs).
// Each kernel file sits in its own namespace so that same-named helpers of different files
// cannot collide; the extern "C" entry points below dispatch by kernel name.
#include "pn_block.cuh"
#include "ggml_blocks.cuh"
#include <cstring>

namespace kpn {
#include "pn_gemv.cu"
}
namespace legacy {
using kpn::pn_block_dot_h2;
using kpn::pn_load_pair;
using kpn::pn_x_scale_exp;
#include "legacy_pn_gemv.cuh"
}
namespace kq {
#include "quant_gemv.cu"
}

extern "C" {
// Runs the PN kernel `name` (any of pn_gemv.cu's, or "legacy_pn4t_gemv_h2_r1" / "legacy_pn3t_..."
// / "..._r2" for the old layout) on a grid of `grid` blocks of `threads` threads with `smem`
// bytes of dynamic shared memory. x is used by the self-staging and f32 kernels, xh/e by the
// prepared ones. Returns 0, -1 on a barrier deadlock, -2 for an unknown name.
int pn_emu_pn_gemv(const char* name, const void* w, const float* x, const void* xh, const int* e, float* y, int N, int K,
                   unsigned grid, unsigned threads, unsigned smem) {
    const pn_u32* wp = (const pn_u32*)w;
    const __half2* hp = (const __half2*)xh;
    std::function<void()> body;
    using namespace kpn;
#define PN_EMU_CASE(kname, call) \
    else if (std::strcmp(name, kname) == 0) body = [&] { call; };
    if (false) {
    }
    PN_EMU_CASE("pn3t_gemv_h2_r1", pn3t_gemv_h2_r1(wp, x, y, N, K))
    PN_EMU_CASE("pn3t_gemv_h2_r2", pn3t_gemv_h2_r2(wp, x, y, N, K))
    PN_EMU_CASE("pn4t_gemv_h2_r1", pn4t_gemv_h2_r1(wp, x, y, N, K))
    PN_EMU_CASE("pn4t_gemv_h2_r2", pn4t_gemv_h2_r2(wp, x, y, N, K))
    PN_EMU_CASE("pn3t_gemv_h2_any", pn3t_gemv_h2_any(wp, x, y, N, K))
    PN_EMU_CASE("pn4t_gemv_h2_any", pn4t_gemv_h2_any(wp, x, y, N, K))
    PN_EMU_CASE("pn3t_gemv_h2p_r1", pn3t_gemv_h2p_r1(wp, hp, e, y, N, K))
    PN_EMU_CASE("pn3t_gemv_h2p_r2", pn3t_gemv_h2p_r2(wp, hp, e, y, N, K))
    PN_EMU_CASE("pn4t_gemv_h2p_r1", pn4t_gemv_h2p_r1(wp, hp, e, y, N, K))
    PN_EMU_CASE("pn4t_gemv_h2p_r2", pn4t_gemv_h2p_r2(wp, hp, e, y, N, K))
    PN_EMU_CASE("pn3t_gemv_h2p_any", pn3t_gemv_h2p_any(wp, hp, e, y, N, K))
    PN_EMU_CASE("pn4t_gemv_h2p_any", pn4t_gemv_h2p_any(wp, hp, e, y, N, K))
    PN_EMU_CASE("pn3t_gemv_f32", pn3t_gemv_f32(wp, x, y, N, K))
    PN_EMU_CASE("pn4t_gemv_f32", pn4t_gemv_f32(wp, x, y, N, K))
    PN_EMU_CASE("pn_prepare_x_h2", pn_prepare_x_h2(x, K, (__half2*)xh, (int*)e))
    PN_EMU_CASE("legacy_pn3t_gemv_h2_r1", (legacy::pn_gemv_h2_even<3, 1, false>(wp, x, nullptr, nullptr, y, N, K)))
    PN_EMU_CASE("legacy_pn4t_gemv_h2_r1", (legacy::pn_gemv_h2_even<4, 1, false>(wp, x, nullptr, nullptr, y, N, K)))
    PN_EMU_CASE("legacy_pn3t_gemv_h2_r2", (legacy::pn_gemv_h2_even<3, 2, false>(wp, x, nullptr, nullptr, y, N, K)))
    PN_EMU_CASE("legacy_pn4t_gemv_h2_r2", (legacy::pn_gemv_h2_even<4, 2, false>(wp, x, nullptr, nullptr, y, N, K)))
    else return -2;
#undef PN_EMU_CASE
    return emu::launch3(EmuDim3{grid, 1, 1}, threads, smem, body) ? 0 : -1;
}

// The small-batch kernels pn{3,4}t_gemv_h2p_b{2..8} (x chunk of XP pairs per phase, G row
// groups per staged chunk), and
// pn_prepare_x_h2 on a grid of T blocks (one activation row each). Returns as pn_emu_pn_gemv.
// The arguments in one struct (layout of BatchArgs in src/emu/batch.rs).
struct PnBatchArgs {
    const char* name;
    const void* w;
    const void* xh;
    const int* e;
    float* y;
    int N, K, XP, G;
    unsigned grid, threads, smem;
};
int pn_emu_pn_gemv_batch(const PnBatchArgs* a) {
    const char* name = a->name;
    const pn_u32* wp = (const pn_u32*)a->w;
    const __half2* hp = (const __half2*)a->xh;
    const int* e = a->e;
    float* y = a->y;
    const int N = a->N, K = a->K, XP = a->XP, G = a->G;
    const unsigned grid = a->grid, threads = a->threads, smem = a->smem;
    std::function<void()> body;
    using namespace kpn;
#define PN_EMU_B(bits, t)                                                                          \
    else if (std::strcmp(name, "pn" #bits "t_gemv_h2p_b" #t) == 0) body = [&] {                    \
        pn##bits##t_gemv_h2p_b##t(wp, hp, e, y, N, K, XP, G);                                      \
    };
    if (false) {
    }
    PN_EMU_B(3, 2) PN_EMU_B(3, 3) PN_EMU_B(3, 4) PN_EMU_B(3, 5) PN_EMU_B(3, 6) PN_EMU_B(3, 7) PN_EMU_B(3, 8)
    PN_EMU_B(4, 2) PN_EMU_B(4, 3) PN_EMU_B(4, 4) PN_EMU_B(4, 5) PN_EMU_B(4, 6) PN_EMU_B(4, 7) PN_EMU_B(4, 8)
    else return -2;
#undef PN_EMU_B
    return emu::launch3(EmuDim3{grid, 1, 1}, threads, smem, body) ? 0 : -1;
}
int pn_emu_pn_prepare_rows(const float* x, int K, int T, void* xh, int* e) {
    std::function<void()> body = [&] { kpn::pn_prepare_x_h2(x, K, (__half2*)xh, e); };
    return emu::launch3(EmuDim3{(unsigned)T, 1, 1}, 1024, 0, body) ? 0 : -1;
}

// quant_gemv.cu's kernels: type 0 f32, 1 f16, 2 q8_0, 3 q4_K. Returns as pn_emu_pn_gemv.
int pn_emu_quant_gemv(int type, const void* w, const float* x, float* y, int N, int K, unsigned grid, unsigned threads,
                      unsigned smem) {
    using namespace kq;
    std::function<void()> body;
    switch (type) {
    case 0: body = [&] { f32_gemv_f32((const float*)w, x, y, N, K); }; break;
    case 1: body = [&] { f16_gemv_f32((const __half*)w, x, y, N, K); }; break;
    case 2: body = [&] { q8_0_gemv_f32((const pn_u8*)w, x, y, N, K); }; break;
    case 3: body = [&] { q4_k_gemv_f32((const pn_u8*)w, x, y, N, K); }; break;
    default: return -2;
    }
    return emu::launch3(EmuDim3{grid, 1, 1}, threads, smem, body) ? 0 : -1;
}

// The counters (host/simt_emu.h): reset them (and forget the regions), name a global buffer
// (region 1..7), read them.
void pn_emu_reset() { emu::reset(); }
void pn_emu_region(int id, const void* p, unsigned long long len) {
    if (id <= 0 || id >= PN_EMU_REGIONS) return;
    emu::st().regions[id] = emu::Region{(uintptr_t)p, (uintptr_t)p + len};
}
void pn_emu_stats(PnEmuStats* out) { *out = emu::st().stats; }
// The grouped kernel pn_gemv_h2p_group on `grid` blocks; `group` is a kpn::PnGroup (layout of
// `GroupC` in src/emu/group.rs). Returns as pn_emu_pn_gemv.
int pn_emu_pn_gemv_group(const void* group, const void* xh, const int* e, int K, unsigned grid, unsigned threads,
                         unsigned smem) {
    const kpn::PnGroup g = *(const kpn::PnGroup*)group;
    std::function<void()> body = [&] { kpn::pn_gemv_h2p_group(g, (const __half2*)xh, e, K); };
    return emu::launch3(EmuDim3{grid, 1, 1}, threads, smem, body) ? 0 : -1;
}
}
