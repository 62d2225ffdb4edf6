// A tiny cooperative SIMT emulator for running a kernel's own source on the host in the tests
// (no GPU here): each CUDA thread of a block is a ucontext fiber on one OS thread, switched only
// at __syncthreads, __syncwarp and warp shuffles, which are emulated with barriers. Blocks run
// one after another, so `__shared__` can be a function-local static. It checks a kernel's index
// math, thread mapping and barrier placement as written (not timing, not the device's float
// contraction). Include it before the kernel source; define nothing else CUDA-specific.
#pragma once
#include <algorithm>
#include <cmath>
#include <functional>
#include <ucontext.h>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static

struct EmuDim3 {
    unsigned x, y, z;
};

namespace emu {
struct Fiber {
    ucontext_t ctx;
    std::vector<char> stack;
    unsigned tid;
    bool done;
};
struct State {
    ucontext_t sched;
    std::vector<Fiber> fibers;
    int cur;
    EmuDim3 block;
    // Barrier generations: block-wide and per warp (arrivals, generation).
    int block_arrived, block_gen;
    int warp_arrived[32], warp_gen[32];
    float slots[32][32];
    // Barrier arrivals and finished threads; a scheduling sweep without any is a deadlock.
    long long progress;
    std::function<void()> body;
};
// Per OS thread: the Rust tests run in parallel threads, each emulating its own launches.
inline State& st() {
    static thread_local State s;
    return s;
}
inline void yield() {
    State& s = st();
    swapcontext(&s.fibers[s.cur].ctx, &s.sched);
}
inline void block_barrier() {
    State& s = st();
    const int gen = s.block_gen;
    ++s.progress;
    if (++s.block_arrived == (int)s.fibers.size()) {
        s.block_arrived = 0;
        ++s.block_gen;
        return;
    }
    while (s.block_gen == gen) yield();
}
inline void warp_barrier() {
    State& s = st();
    const int w = (int)(s.fibers[s.cur].tid >> 5);
    const int width = std::min(32, (int)s.fibers.size() - 32 * w);
    const int gen = s.warp_gen[w];
    ++s.progress;
    if (++s.warp_arrived[w] == width) {
        s.warp_arrived[w] = 0;
        ++s.warp_gen[w];
        return;
    }
    while (s.warp_gen[w] == gen) yield();
}
inline float shfl_xor(float v, int o) {
    State& s = st();
    const unsigned tid = s.fibers[s.cur].tid;
    const int w = (int)(tid >> 5), lane = (int)(tid & 31);
    s.slots[w][lane] = v;
    warp_barrier();
    const float r = s.slots[w][lane ^ o];
    warp_barrier();
    return r;
}
inline void trampoline() {
    State& s = st();
    s.body();
    s.fibers[s.cur].done = true;
    ++s.progress;
    swapcontext(&s.fibers[s.cur].ctx, &s.sched);
}
// Runs `body` as every thread of every block of the grid (x, y), `threads` threads per block;
// false when the threads of a block deadlock on mismatched barriers.
inline bool launch(unsigned gx, unsigned gy, unsigned threads, std::function<void()> body) {
    State& s = st();
    s.body = std::move(body);
    for (unsigned by = 0; by < gy; ++by)
        for (unsigned bx = 0; bx < gx; ++bx) {
            s.block = EmuDim3{bx, by, 0};
            s.block_arrived = s.block_gen = 0;
            for (int w = 0; w < 32; ++w) s.warp_arrived[w] = s.warp_gen[w] = 0;
            s.fibers.assign(threads, Fiber());
            for (unsigned t = 0; t < threads; ++t) {
                Fiber& f = s.fibers[t];
                f.tid = t;
                f.done = false;
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
                if (left && s.progress == before) return false;
            }
        }
    return true;
}
inline EmuDim3 thread_idx() { return EmuDim3{st().fibers[st().cur].tid, 0, 0}; }
} // namespace emu

#define threadIdx (emu::thread_idx())
#define blockIdx (emu::st().block)
#define __syncthreads() emu::block_barrier()
#define __syncwarp() emu::warp_barrier()
#define __shfl_xor_sync(mask, v, o) emu::shfl_xor((v), (o))
using std::min;
