//! Compute cost of the int16 kernels with the weights in cache (64 rows, about 140 KB: L2),
//! measured in thread CPU time so that other tenants of a shared machine do not distort it:
//! `cargo run --release -p pn-format --example kernel_cpu`. Prints weight bytes processed per
//! CPU-nanosecond for one `matvec` and for `matvec_multi` with M = 1..=8 vectors; compare with
//! the memory read bandwidth per core to see whether a kernel is compute- or memory-bound.

use pn_format::dot::{matvec_multi_with, matvec_small, matvec_with, SmallActs};
use pn_format::{Isa, PnType, PreparedI16};

fn main() {
    for ty in PnType::ALL {
        let (rows, k) = (64, 5120);
        let nb = rows * k / ty.weights_per_block();
        let mut s = 0x1234_5678_9abc_def0u64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let reserved = if ty == PnType::Pn3t {
            0x8000_8000u32
        } else {
            0
        };
        let mut w = Vec::with_capacity(nb * 34);
        for _ in 0..nb {
            w.extend_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
            for _ in 0..8 {
                w.extend_from_slice(&((next() as u32) & !reserved).to_le_bytes());
            }
        }
        let acts: Vec<PreparedI16> = (0..8)
            .map(|_| {
                let x: Vec<f32> = (0..k)
                    .map(|_| (next() % 1000) as f32 / 500.0 - 1.0)
                    .collect();
                PreparedI16::new(ty, &x).unwrap()
            })
            .collect();
        let mut outs = vec![vec![0.0f32; rows]; 8];
        for isa in [Isa::Avx2, Isa::Avx512Vnni] {
            if !isa.is_available() {
                continue;
            }
            // Minimum over interleaved rounds: the least disturbed measurement of each.
            let iters = 100;
            let mut best = [f64::INFINITY; 9];
            for _ in 0..7 {
                let t = cpu_ns();
                for _ in 0..iters {
                    matvec_with(isa, ty, &w, rows, &acts[0], &mut outs[0]).unwrap();
                }
                best[0] = best[0].min((cpu_ns() - t) as f64 / iters as f64);
                for m in 1..=8 {
                    let t = cpu_ns();
                    for _ in 0..iters {
                        let mut r: Vec<&mut [f32]> =
                            outs[..m].iter_mut().map(|o| o.as_mut_slice()).collect();
                        matvec_multi_with(isa, ty, &w, rows, &acts[..m], &mut r).unwrap();
                    }
                    best[m] = best[m].min((cpu_ns() - t) as f64 / iters as f64);
                }
            }
            // The few-row AMX kernel (the verify pass), where the CPU has AMX.
            let mut small = [f64::INFINITY; 9];
            if isa == Isa::Avx512Vnni && pn_format::dot::amx_available() {
                let mut sa = SmallActs::default();
                for _ in 0..7 {
                    for m in 1..=8 {
                        sa.update(&acts[..m]).unwrap();
                        let t = cpu_ns();
                        for _ in 0..iters {
                            let mut r: Vec<&mut [f32]> =
                                outs[..m].iter_mut().map(|o| o.as_mut_slice()).collect();
                            matvec_small(ty, &w, rows, &sa, &mut r).unwrap();
                        }
                        small[m] = small[m].min((cpu_ns() - t) as f64 / iters as f64);
                    }
                }
            }
            let base = best[0];
            let mut line = format!(
                "{ty} {isa:?}: matvec {:.2} B/ns; multi:",
                w.len() as f64 / base
            );
            for (m, b) in best.iter().enumerate().skip(1) {
                line += &format!(" M{m} {:.2}x", b / base);
            }
            if small[1].is_finite() {
                line += "; small:";
                for (m, b) in small.iter().enumerate().skip(1) {
                    line += &format!(" M{m} {:.2}x", b / base);
                }
            }
            println!("{line}  (cost relative to one matvec)");
        }
    }
}

/// CPU time of this thread in ns (Linux `CLOCK_THREAD_CPUTIME_ID`).
fn cpu_ns() -> u64 {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: valid pointer to a 64-bit Linux timespec; clock 3 is CLOCK_THREAD_CPUTIME_ID.
    unsafe { clock_gettime(3, &mut ts) };
    ts.sec as u64 * 1_000_000_000 + ts.nsec as u64
}
