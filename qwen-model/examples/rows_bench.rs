//! The cost of one forward pass over M tokens relative to one token, on the CPU backend:
//! `cargo run --release -p qwen-model --example rows_bench -- MODEL.gguf [REPS] [THREADS]
//! [DECODE_ROWS_MIN]`. This is what speculative (MTP) verification of M-1 drafted tokens costs
//! per step. After a 16-token prefill, each repetition restores the state and runs M = 1..=8 in a
//! shuffled order, logits for every row (as verification needs); the minimum and median wall
//! time per M are printed as ratios to M = 1 measured in the same run, so tenants that load the
//! machine slow every M alike. With THREADS = 1 it also prints the ratios of the thread's CPU
//! time (`CLOCK_THREAD_CPUTIME_ID`, Linux), which time-slicing by other tenants leaves alone;
//! with more threads, the ratios of the process's CPU time (every thread). `ROWS_BENCH_M=1,3`
//! runs only those M (1 always), for a shorter run on a large model.

use qwen_model::{Backend, CpuBackend, Model, Outputs};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .ok_or("usage: rows_bench MODEL.gguf [REPS] [THREADS] [DECODE_ROWS_MIN]")?;
    let reps: usize = args.get(2).map_or(Ok(15), |s| s.parse())?;
    let threads: usize = args.get(3).map_or(Ok(0), |s| s.parse())?;
    let mut backend = CpuBackend::new(threads);
    if let Some(n) = args.get(4) {
        backend.set_decode_rows_min(n.parse()?);
    }
    let model = Model::load(path, backend)?;
    let v = model.config.vocab;
    const MAX_M: usize = 8;
    let prompt: Vec<u32> = (0..16u32).map(|i| (i * 37 + 11) % v as u32).collect();
    let mut state = model.new_state(prompt.len() + MAX_M + 1)?;
    let mut ws = model.new_workspace(64)?;
    let mut logits = vec![0.0f32; MAX_M * v];
    model.forward(
        &mut state,
        &mut ws,
        &prompt,
        Outputs::last_logits(&mut logits[..v]),
    )?;
    let snap = state.snapshot(&model.config, &model.backend)?;
    let single_thread = model.backend.n_threads() == 1;
    let only: Option<Vec<usize>> = std::env::var("ROWS_BENCH_M")
        .ok()
        .map(|s| s.split(',').filter_map(|m| m.trim().parse().ok()).collect());
    let wanted = |m: usize| m == 1 || only.as_ref().is_none_or(|o| o.contains(&m));
    let mut times = vec![Vec::new(); MAX_M + 1];
    let mut cpu = vec![Vec::new(); MAX_M + 1];
    let mut seed = 0x9e37_79b9_u64;
    for rep in 0..reps + 1 {
        let mut order: Vec<usize> = (1..=MAX_M).filter(|&m| wanted(m)).collect();
        for i in (1..order.len()).rev() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            order.swap(i, (seed % (i as u64 + 1)) as usize);
        }
        for &m in &order {
            state.restore(&model.config, &model.backend, &snap).unwrap();
            let toks: Vec<u32> = (0..m as u32).map(|i| (i * 101 + 7) % v as u32).collect();
            let t = Instant::now();
            let c = cpu_ns(single_thread);
            model.forward(
                &mut state,
                &mut ws,
                &toks,
                Outputs::all_logits(&mut logits[..m * v]),
            )?;
            // The first repetition warms caches and is not counted.
            if rep > 0 {
                times[m].push(t.elapsed().as_secs_f64());
                cpu[m].push((cpu_ns(single_thread) - c) as f64 * 1e-9);
            }
        }
    }
    for t in times.iter_mut().chain(cpu.iter_mut()) {
        t.sort_by(f64::total_cmp);
    }
    let clock = if single_thread { "thread" } else { "process" };
    let have_cpu = cpu[1].first().is_some_and(|&c| c > 0.0);
    let (min1, med1) = (times[1][0], times[1][reps / 2]);
    println!(
        "{path}: {}, {reps} reps; 1-row pass min {:.2} ms, median {:.2} ms",
        model.backend.name(),
        min1 * 1e3,
        med1 * 1e3
    );
    for (m, t) in times.iter().enumerate().skip(2) {
        if t.is_empty() {
            continue;
        }
        let c = &cpu[m];
        let cpu_ratio = if have_cpu {
            format!(
                "; {clock} CPU time min {:.2}x, median {:.2}x",
                c[0] / cpu[1][0],
                c[reps / 2] / cpu[1][reps / 2]
            )
        } else {
            String::new()
        };
        println!(
            "  M={m}: pass cost vs M=1: wall min {:.2}x, median {:.2}x{cpu_ratio}",
            t[0] / min1,
            t[reps / 2] / med1
        );
    }
    Ok(())
}

/// CPU time in ns of the calling thread (`thread`) or of the whole process
/// (`clock_gettime(CLOCK_THREAD_CPUTIME_ID / CLOCK_PROCESS_CPUTIME_ID)` on Linux; 0 elsewhere).
#[cfg(target_os = "linux")]
fn cpu_ns(thread: bool) -> u64 {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    const CLOCK_PROCESS_CPUTIME_ID: i32 = 2;
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let id = if thread {
        CLOCK_THREAD_CPUTIME_ID
    } else {
        CLOCK_PROCESS_CPUTIME_ID
    };
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec (64-bit Linux layout); the C library that std
    // links provides `clock_gettime`.
    if unsafe { clock_gettime(id, &mut ts) } != 0 {
        return 0;
    }
    ts.sec as u64 * 1_000_000_000 + ts.nsec as u64
}

#[cfg(not(target_os = "linux"))]
fn cpu_ns(_thread: bool) -> u64 {
    0
}
