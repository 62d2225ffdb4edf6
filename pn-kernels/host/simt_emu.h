// A cooperative SIMT emulator that runs a kernel's own source on the host in the tests (no GPU
// here) and counts what its memory accesses would cost on the device.
//
// Execution: each CUDA thread of a block is a ucontext fiber on one OS thread, switched only at
// __syncthreads, __syncwarp and warp shuffles, which are emulated with barriers (threads that
// have returned no longer count, as on the device). Blocks run one after another, so a
// `__shared__` array can be a function-local static (thread_local: parallel Rust tests emulate
// their own launches). It checks a kernel's index math, thread mapping and barrier placement as
// written (not timing, not the device's float contraction).
//
// Counting: every access through a shared-memory pointer (`emu::sp`, what PN_SMEM/PN_DYN_SMEM/
// PN_SPTR give under the emulator) and every `__ldg` is recorded with its lane and call site.
// The k-th execution of a call site by the lanes of one warp is one warp-wide instruction (the
// lanes that skip it, by a branch or a shorter loop, are inactive for it). Per instruction:
//  - shared memory: the distinct 4-byte words, spread over 32 banks; it takes
//    max(max distinct words in one bank, ceil(words / 32)) wavefronts against the minimum
//    ceil(words / 32) (words read by several lanes are broadcast); degree = wavefronts / minimum;
//  - global (`__ldg`): the distinct 32-byte sectors against ceil(distinct bytes / 32), per
//    registered region (a buffer the caller names), plus the bytes requested and the launch's
//    distinct sectors (its DRAM footprint, every sector read once).
// Include it before the kernel source (host/emu/cuda_fp16.h does).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <ucontext.h>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static thread_local
#define __align__(n) alignas(n)
#define __restrict__

struct EmuDim3 {
    unsigned x, y, z;
};

// Per-launch cost counters, filled by the emulator (C layout: the Rust tests read it).
#define PN_EMU_REGIONS 8
extern "C" {
typedef struct {
    unsigned long long smem_instr;     // warp-wide shared-memory instructions
    unsigned long long smem_wave;      // wavefronts they take
    unsigned long long smem_ideal;     // wavefronts without bank conflicts
    double smem_max_degree;            // worst instruction: wavefronts / minimum
    unsigned long long smem_bad_instr; // instructions with degree > 1
    // Global loads by region (0 = not registered).
    unsigned long long g_instr[PN_EMU_REGIONS];
    unsigned long long g_sectors[PN_EMU_REGIONS];     // sum over instructions of distinct sectors
    unsigned long long g_min_sectors[PN_EMU_REGIONS]; // sum of ceil(distinct bytes / 32)
    unsigned long long g_bytes[PN_EMU_REGIONS];       // bytes requested
    unsigned long long g_unique_sectors[PN_EMU_REGIONS]; // distinct sectors of the launch
    int deadlock;
} PnEmuStats;
}

namespace emu {
struct Rec {
    uintptr_t addr;
    uintptr_t site;
    uint32_t k;
    uint16_t warp;
    uint8_t lane, size, space, region;
};
struct Fiber {
    ucontext_t ctx;
    std::vector<char> stack;
    unsigned tid;
    bool done;
    std::unordered_map<uintptr_t, uint32_t> occ;
};
struct Region {
    uintptr_t lo, hi;
};
struct State {
    ucontext_t sched;
    std::vector<Fiber> fibers;
    int cur;
    EmuDim3 block, grid;
    unsigned threads;
    int block_arrived, block_gen, live;
    int warp_arrived[32], warp_gen[32], warp_live[32];
    float slots[32][32];
    long long progress;
    std::function<void()> body;
    std::vector<char> dyn;
    bool counting;
    std::vector<Rec> recs;
    Region regions[PN_EMU_REGIONS];
    std::unordered_set<uintptr_t> seen[PN_EMU_REGIONS];
    PnEmuStats stats;
};
inline State& st() {
    static thread_local State s;
    return s;
}
inline void yield() {
    State& s = st();
    swapcontext(&s.fibers[s.cur].ctx, &s.sched);
}
// A barrier completes when every live (not returned) thread of its scope has arrived.
inline void block_barrier() {
    State& s = st();
    const int gen = s.block_gen;
    ++s.progress;
    if (++s.block_arrived == s.live) {
        s.block_arrived = 0;
        ++s.block_gen;
        return;
    }
    while (s.block_gen == gen) yield();
}
inline void warp_barrier() {
    State& s = st();
    const int w = (int)(s.fibers[s.cur].tid >> 5);
    const int gen = s.warp_gen[w];
    ++s.progress;
    if (++s.warp_arrived[w] == s.warp_live[w]) {
        s.warp_arrived[w] = 0;
        ++s.warp_gen[w];
        return;
    }
    while (s.warp_gen[w] == gen) yield();
}
template <class T> inline T shfl(T v, int src_of_lane(int, int), int arg) {
    State& s = st();
    static_assert(sizeof(T) == 4, "32-bit shuffles only");
    const unsigned tid = s.fibers[s.cur].tid;
    const int w = (int)(tid >> 5), lane = (int)(tid & 31);
    std::memcpy(&s.slots[w][lane], &v, 4);
    warp_barrier();
    T r;
    std::memcpy(&r, &s.slots[w][src_of_lane(lane, arg)], 4);
    warp_barrier();
    return r;
}
inline int src_xor(int lane, int o) { return lane ^ o; }
inline int src_down(int lane, int o) { return lane + o < 32 ? lane + o : lane; }
inline float shfl_xor(float v, int o) { return shfl(v, src_xor, o); }

// --- access recording -------------------------------------------------------------------------
inline void record(const void* p, unsigned size, uintptr_t site, uint8_t space) {
    State& s = st();
    if (!s.counting) return;
    Fiber& f = s.fibers[s.cur];
    const uintptr_t a = (uintptr_t)p;
    uint8_t region = 0;
    if (space == 1)
        for (int r = 1; r < PN_EMU_REGIONS; ++r)
            if (a >= s.regions[r].lo && a < s.regions[r].hi) region = (uint8_t)r;
    const uint32_t k = f.occ[site]++;
    s.recs.push_back(Rec{a, site, k, (uint16_t)(f.tid >> 5), (uint8_t)(f.tid & 31), (uint8_t)size, space, region});
}
// Analyses the recorded accesses of one block into the launch's counters.
inline void flush_block() {
    State& s = st();
    std::vector<Rec>& r = s.recs;
    std::sort(r.begin(), r.end(), [](const Rec& a, const Rec& b) {
        if (a.space != b.space) return a.space < b.space;
        if (a.warp != b.warp) return a.warp < b.warp;
        if (a.site != b.site) return a.site < b.site;
        if (a.k != b.k) return a.k < b.k;
        return a.lane < b.lane;
    });
    std::vector<uintptr_t> units;
    for (size_t i = 0; i < r.size();) {
        size_t j = i;
        while (j < r.size() && r[j].space == r[i].space && r[j].warp == r[i].warp && r[j].site == r[i].site && r[j].k == r[i].k) ++j;
        units.clear();
        if (r[i].space == 0) {
            for (size_t t = i; t < j; ++t)
                for (uintptr_t w = r[t].addr / 4; w <= (r[t].addr + r[t].size - 1) / 4; ++w) units.push_back(w);
            std::sort(units.begin(), units.end());
            units.erase(std::unique(units.begin(), units.end()), units.end());
            int bank[32] = {0}, worst = 0;
            for (uintptr_t w : units) worst = std::max(worst, ++bank[w % 32]);
            const unsigned long long ideal = (units.size() + 31) / 32;
            const unsigned long long wave = std::max<unsigned long long>(ideal, (unsigned long long)worst);
            s.stats.smem_instr++;
            s.stats.smem_wave += wave;
            s.stats.smem_ideal += ideal;
            const double deg = (double)wave / (double)ideal;
            if (deg > s.stats.smem_max_degree) s.stats.smem_max_degree = deg;
            if (wave > ideal) s.stats.smem_bad_instr++;
        } else {
            const int reg = r[i].region;
            unsigned long long bytes = 0;
            std::vector<uintptr_t> bs;
            for (size_t t = i; t < j; ++t) {
                bytes += r[t].size;
                for (uintptr_t b = r[t].addr; b < r[t].addr + r[t].size; ++b) bs.push_back(b);
                for (uintptr_t sec = r[t].addr / 32; sec <= (r[t].addr + r[t].size - 1) / 32; ++sec) units.push_back(sec);
            }
            std::sort(bs.begin(), bs.end());
            bs.erase(std::unique(bs.begin(), bs.end()), bs.end());
            std::sort(units.begin(), units.end());
            units.erase(std::unique(units.begin(), units.end()), units.end());
            s.stats.g_instr[reg]++;
            s.stats.g_sectors[reg] += units.size();
            s.stats.g_min_sectors[reg] += (bs.size() + 31) / 32;
            s.stats.g_bytes[reg] += bytes;
            for (uintptr_t sec : units) s.seen[reg].insert(sec);
        }
        i = j;
    }
    r.clear();
}

inline void trampoline() {
    State& s = st();
    s.body();
    Fiber& f = s.fibers[s.cur];
    f.done = true;
    ++s.progress;
    // A returned thread no longer holds back the barriers of its block and warp.
    --s.live;
    const int w = (int)(f.tid >> 5);
    --s.warp_live[w];
    if (s.block_arrived > 0 && s.block_arrived == s.live) {
        s.block_arrived = 0;
        ++s.block_gen;
    }
    if (s.warp_arrived[w] > 0 && s.warp_arrived[w] == s.warp_live[w]) {
        s.warp_arrived[w] = 0;
        ++s.warp_gen[w];
    }
    swapcontext(&f.ctx, &s.sched);
}

// Starts counting (zeroes the counters and forgets the regions).
inline void reset() {
    State& s = st();
    std::memset(&s.stats, 0, sizeof(s.stats));
    for (int r = 0; r < PN_EMU_REGIONS; ++r) {
        s.regions[r] = Region{0, 0};
        s.seen[r].clear();
    }
    s.counting = true;
}

// Runs `body` as every thread of every block of the grid (x, y, z), `threads` threads per block
// (at most 1024) with `dyn_smem` bytes of dynamic shared memory; false when the threads of a
// block deadlock on mismatched barriers.
inline bool launch3(EmuDim3 grid, unsigned threads, size_t dyn_smem, std::function<void()> body) {
    State& s = st();
    s.body = std::move(body);
    s.grid = grid;
    s.threads = threads;
    s.dyn.assign(dyn_smem + 128, (char)0xff); // NaN-filled: reading unwritten data shows
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                s.block = EmuDim3{bx, by, bz};
                s.block_arrived = s.block_gen = 0;
                s.live = (int)threads;
                for (int w = 0; w < 32; ++w) {
                    s.warp_arrived[w] = s.warp_gen[w] = 0;
                    s.warp_live[w] = std::max(0, std::min(32, (int)threads - 32 * w));
                }
                s.fibers.resize(threads);
                for (unsigned t = 0; t < threads; ++t) {
                    Fiber& f = s.fibers[t];
                    f.tid = t;
                    f.done = false;
                    f.occ.clear();
                    f.stack.resize(64 * 1024);
                    getcontext(&f.ctx);
                    f.ctx.uc_stack.ss_sp = f.stack.data();
                    f.ctx.uc_stack.ss_size = f.stack.size();
                    f.ctx.uc_link = nullptr;
                    makecontext(&f.ctx, trampoline, 0);
                }
                for (bool left = true; left;) {
                    left = false;
                    const long long before = s.progress;
                    for (unsigned t = 0; t < threads; ++t) {
                        if (s.fibers[t].done) continue;
                        s.cur = (int)t;
                        swapcontext(&s.sched, &s.fibers[t].ctx);
                        left = left || !s.fibers[t].done;
                    }
                    if (left && s.progress == before) {
                        s.recs.clear();
                        s.stats.deadlock = 1;
                        return false;
                    }
                }
                if (s.counting) flush_block();
            }
    if (s.counting)
        for (int r = 0; r < PN_EMU_REGIONS; ++r) s.stats.g_unique_sectors[r] = s.seen[r].size();
    return true;
}
inline bool launch(unsigned gx, unsigned gy, unsigned threads, std::function<void()> body) {
    return launch3(EmuDim3{gx, gy, 1}, threads, 0, std::move(body));
}
inline EmuDim3 thread_idx() { return EmuDim3{st().fibers[st().cur].tid, 0, 0}; }
inline void* dyn_smem() { return (void*)(((uintptr_t)st().dyn.data() + 127) & ~(uintptr_t)127); }

// A pointer into shared memory whose loads and stores are recorded (PN_SPTR under the emulator).
template <class T> struct sp;
template <class T> struct sref {
    T* p;
    __attribute__((noinline)) operator T() const {
        record(p, sizeof(T), (uintptr_t)__builtin_return_address(0), 0);
        return *p;
    }
    __attribute__((noinline)) const sref& operator=(const T& v) const {
        record(p, sizeof(T), (uintptr_t)__builtin_return_address(0), 0);
        *p = v;
        return *this;
    }
    const sref& operator=(const sref& o) const { return *this = (T)o; }
};
template <class T> struct sp {
    T* p;
    sp() : p(nullptr) {}
    explicit sp(T* q) : p(q) {}
    template <class U> sp(const sp<U>& o) : p(o.p) {}
    sref<T> operator[](long long i) const { return sref<T>{p + i}; }
    sref<T> operator*() const { return sref<T>{p}; }
    sp operator+(long long i) const { return sp(p + i); }
    sp operator-(long long i) const { return sp(p - i); }
    template <class U> sp<U> cast() const { return sp<U>(reinterpret_cast<U*>(p)); }
};
} // namespace emu

// Read-only global loads, recorded with their call site.
template <class T> __attribute__((noinline)) T __ldg(const T* p) {
    emu::record(p, sizeof(T), (uintptr_t)__builtin_return_address(0), 1);
    return *p;
}

// Global atomics and the memory fence (kernels/rowsync.cuh). Fibers switch only at barriers and
// shuffles, and blocks run one after another, so each read-modify-write is atomic as written
// and every block's writes are visible to the blocks after it.
inline unsigned atomicInc(unsigned* a, unsigned v) {
    const unsigned o = *a;
    *a = o >= v ? 0u : o + 1u;
    return o;
}
inline unsigned atomicMax(unsigned* a, unsigned v) {
    const unsigned o = *a;
    *a = o > v ? o : v;
    return o;
}
inline unsigned atomicExch(unsigned* a, unsigned v) {
    const unsigned o = *a;
    *a = v;
    return o;
}
#define __threadfence() ((void)0)

#define threadIdx (emu::thread_idx())
#define blockIdx (emu::st().block)
#define blockDim (EmuDim3{emu::st().threads, 1, 1})
#define gridDim (emu::st().grid)
#define __syncthreads() emu::block_barrier()
#define __syncwarp(...) emu::warp_barrier()
#define __shfl_xor_sync(mask, v, o) emu::shfl((v), emu::src_xor, (o))
#define __shfl_down_sync(mask, v, o) emu::shfl((v), emu::src_down, (o))
using std::min;
