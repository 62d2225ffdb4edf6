//! The decode (one input row) products of the stock types at the 27B model's shapes, each next
//! to a read of the same bytes in the same run, on 1 and 2 threads, with the working set in L3
//! and in DRAM (the harness is `pn-format/benches/common/clock.rs`). Report ratios `read time /
//! kernel time` (the goal of issue #16 is >= 0.85).
//!
//! - Q4_K `output`: 248320 rows x 5120 (715 MB, the largest single read of a token); `l3` is
//!   its first 13888 rows (40 MB), `dram` the whole head twice over.
//! - Q8_0 at 17408 x 5120 (94.7 MB; the model's Q8_0 `ssm_alpha`/`ssm_beta` are 48 rows, too
//!   small to time alone: this is the kernel's throughput).
//! - Q3_K `token_embd` gather: 4096 rows of the 248320 x 5120 table decoded to f32, in a
//!   scattered order (the table itself is 546 MB, so every row comes from DRAM).
//!
//! Weights are random blocks with fixed, finite scales (a quantizer run over 1.3 G weights
//! would take minutes and changes no timing). `PN_BENCH_CLOCK=cpu` measures thread CPU time;
//! `PN_BENCH_MODES` picks the working sets (default `l3,dram`). Each kernel is timed with f32
//! activations (`f32_acts`) and, where the CPU has it, the int16-activation path the model's
//! decode uses for Q4_K and Q8_0 (`i16_acts`, quantization included).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use gguf_io::quants::{dequantize_row, has_i16_kernel, vec_dot_f32, vec_dot_i16, ActsI16};
use gguf_io::GgmlType;
use std::hint::black_box;
use std::time::Duration;

#[path = "../../pn-format/benches/common/clock.rs"]
mod clock;
use clock::read_sum;

const K: usize = 5120;

/// `rows` random rows of `ty` whose f16 scales (the first `scale_bytes` of a block) are small
/// and finite.
fn random_rows(ty: GgmlType, rows: usize, scale_bytes: &[usize]) -> Vec<u8> {
    let rb = ty.row_bytes(K as u64).unwrap() as usize;
    let bs = ty.type_size();
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let mut out = vec![0u8; rows * rb];
    for c in out.chunks_exact_mut(8) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        c.copy_from_slice(&s.to_le_bytes());
    }
    let d = half::f16::from_f32(0.01).to_bits().to_le_bytes();
    for blk in out.chunks_exact_mut(bs) {
        for &o in scale_bytes {
            blk[o..o + 2].copy_from_slice(&d);
        }
    }
    out
}

fn modes() -> Vec<&'static str> {
    let want = std::env::var("PN_BENCH_MODES").unwrap_or_else(|_| "l3,dram".into());
    ["l3", "dram"]
        .into_iter()
        .filter(|m| want.contains(m))
        .collect()
}

fn matvec_shape(c: &mut Criterion, ty: GgmlType, rows: usize, l3_rows: usize, scales: &[usize]) {
    let all = random_rows(ty, rows, scales);
    let rb = all.len() / rows;
    let x: Vec<f32> = (0..K).map(|i| (i * 31 % 97) as f32 / 48.0 - 1.0).collect();
    for mode in modes() {
        let rows = if mode == "l3" { l3_rows } else { rows };
        let one = &all[..rows * rb];
        let copies = if mode == "dram" {
            clock::dram_copies(one.len())
        } else {
            1
        };
        let ring: Vec<Vec<u8>> = (0..copies).map(|_| one.to_vec()).collect();
        let mut g = c.benchmark_group(format!("decode_{}_{rows}x{K}_{mode}", ty.name()));
        g.throughput(Throughput::Bytes(one.len() as u64));
        for threads in [1usize, 2] {
            let read = |m: usize, t: usize| {
                let (r0, r1) = clock::part(rows, t, threads);
                black_box(read_sum(&ring[m][r0 * rb..r1 * rb]));
            };
            g.bench_function(format!("read_{threads}t"), |b| {
                b.iter_custom(|n| clock::run_split(n, threads, copies, &read))
            });
            let kernel = |m: usize, t: usize| {
                let (r0, r1) = clock::part(rows, t, threads);
                let s: f32 = ring[m][r0 * rb..r1 * rb]
                    .chunks_exact(rb)
                    .map(|r| vec_dot_f32(ty, r, &x).unwrap())
                    .sum();
                black_box(s);
            };
            g.bench_function(format!("f32_acts_{threads}t"), |b| {
                b.iter_custom(|n| clock::run_split(n, threads, copies, &kernel))
            });
            if !has_i16_kernel(ty) {
                continue;
            }
            // The int16-activation path as the model runs it: each part quantizes the
            // activations once (as each chunk of a matmul does), then one dot per row.
            let kernel_i16 = |m: usize, t: usize| {
                let (r0, r1) = clock::part(rows, t, threads);
                let mut a = ActsI16::new();
                a.update(&x).unwrap();
                let s: f32 = ring[m][r0 * rb..r1 * rb]
                    .chunks_exact(rb)
                    .map(|r| vec_dot_i16(ty, r, &a).unwrap())
                    .sum();
                black_box(s);
            };
            g.bench_function(format!("i16_acts_{threads}t"), |b| {
                b.iter_custom(|n| clock::run_split(n, threads, copies, &kernel_i16))
            });
        }
        g.finish();
    }
}

fn gather(c: &mut Criterion) {
    let ty = GgmlType::Q3K;
    let rows = 248_320;
    // Q3_K: d is the last two bytes of the 110-byte block.
    let table = random_rows(ty, rows, &[108]);
    let rb = table.len() / rows;
    let picks: Vec<usize> = (0..4096).map(|i| i * 7919 % rows).collect();
    let mut g = c.benchmark_group("decode_q3_K_token_embd_gather_4096rows");
    g.throughput(Throughput::Bytes((picks.len() * rb) as u64));
    g.bench_function("read_1t", |b| {
        b.iter_custom(|n| {
            clock::run_split(n, 1, 1, &|_, _| {
                for &r in &picks {
                    black_box(read_sum(&table[r * rb..(r + 1) * rb]));
                }
            })
        })
    });
    g.bench_function("dequantize_1t", |b| {
        b.iter_custom(|n| {
            clock::run_split(n, 1, 1, &|_, _| {
                let mut out = vec![0f32; K];
                for &r in &picks {
                    dequantize_row(ty, &table[r * rb..(r + 1) * rb], &mut out).unwrap();
                    black_box(&out);
                }
            })
        })
    });
    g.finish();
}

fn all(c: &mut Criterion) {
    // Q4_K: d and dmin at bytes 0 and 2. Q8_0: d at byte 0.
    matvec_shape(c, GgmlType::Q4K, 248_320, 13_888, &[0, 2]);
    matvec_shape(c, GgmlType::Q8_0, 17_408, 17_408, &[0]);
    gather(c);
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! { name = benches; config = config(); targets = all }
criterion_main!(benches);
