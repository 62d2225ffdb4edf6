//! The matrix-vector bench harness and the read baseline of the PN benches (through `common`),
//! shared with `gguf-io/benches/decode_stock.rs` (included there by path): a ring of copies of one matrix
//! (one copy: the working set stays in this CPU's L3; enough copies to pass 1 GiB: every pass
//! reads DRAM), a byte-split over 1 or 2 threads, and a clock that is either wall time or the
//! threads' own CPU time (`PN_BENCH_CLOCK=cpu`: on a shared, loaded machine the wall clock
//! counts the time other processes hold the core; CPU time counts only ours).

use std::time::{Duration, Instant};

/// Working sets at or above this many bytes are read from DRAM (this CPU's L3 is 300 MiB).
pub const DRAM_BYTES: usize = 1200 << 20;

/// Copies of a matrix of `bytes` bytes that make a ring of at least [`DRAM_BYTES`].
pub fn dram_copies(bytes: usize) -> usize {
    DRAM_BYTES.div_ceil(bytes.max(1)).max(2)
}

/// Whether `PN_BENCH_CLOCK=cpu` asks for thread CPU time instead of the wall clock.
pub fn cpu_clock() -> bool {
    std::env::var("PN_BENCH_CLOCK").is_ok_and(|v| v == "cpu")
}

/// CPU time of the calling thread.
pub fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write into.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Runs `f(copy, part)` `iters` times on `threads` threads (part `t` of `threads`: the caller
/// splits each matrix's rows by bytes), cycling through `copies` matrices; returns the time of
/// the slowest thread (wall or CPU clock, see [`cpu_clock`]).
pub fn run_split(
    iters: u64,
    threads: usize,
    copies: usize,
    f: &(impl Fn(usize, usize) + Sync),
) -> Duration {
    let cpu = cpu_clock();
    let body = |t: usize| {
        let (c0, w0) = (thread_cpu(), Instant::now());
        for i in 0..iters as usize {
            f(i % copies, t);
        }
        if cpu {
            thread_cpu() - c0
        } else {
            w0.elapsed()
        }
    };
    if threads == 1 {
        return body(0);
    }
    std::thread::scope(|s| {
        let hs: Vec<_> = (1..threads).map(|t| s.spawn(move || body(t))).collect();
        let mine = body(0);
        hs.into_iter()
            .map(|h| h.join().unwrap())
            .fold(mine, Duration::max)
    })
}

/// Rows `[start, end)` of part `t` of `parts` of `rows` equal-sized rows (an even byte split).
pub fn part(rows: usize, t: usize, parts: usize) -> (usize, usize) {
    (rows * t / parts, rows * (t + 1) / parts)
}

/// Sums the bytes as u64 words: the memory-read baseline (vectorises to full load bandwidth).
pub fn read_sum(bytes: &[u8]) -> u64 {
    let mut acc = [0u64; 8];
    let mut chunks = bytes.chunks_exact(64);
    for c in &mut chunks {
        for (a, w) in acc.iter_mut().zip(c.chunks_exact(8)) {
            *a = a.wrapping_add(u64::from_le_bytes(w.try_into().unwrap()));
        }
    }
    let tail: u64 = chunks.remainder().iter().map(|&b| u64::from(b)).sum();
    acc.iter().fold(tail, |s, a| s.wrapping_add(*a))
}
