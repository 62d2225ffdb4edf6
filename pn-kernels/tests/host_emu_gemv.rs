//! The decode GEMV kernels (kernels/pn_gemv.cu, the Q4_K GEMV of kernels/quant_gemv.cu) run on
//! the host by the SIMT emulator, with the launch geometry the CUDA wrappers use
//! (`pn_kernels::launch`), against the CPU: bit for bit against the Rust emulation of the
//! kernels' arithmetic (tests/common), within the GPU tests' bound against the f64 reference of
//! pn-format / gguf-io. And what they cost: no shared-memory bank conflict anywhere, weight
//! reads within 1.1x of the minimum sectors; the layout before this change fails both.
mod common;

use common::*;
use gguf_io::{quants, GgmlType};
use pn_kernels::emu::{self, region, EmuStats, PnInput, StockType};
use pn_kernels::launch::{self, Launch};

/// Max |got - want| / scale, asserting it is <= tol.
fn assert_close(what: &str, got: &[f32], want: &[f64], scale: &[f64], tol: f64) {
    for (i, ((g, w), s)) in got.iter().zip(want).zip(scale).enumerate() {
        let e = (*g as f64 - w).abs() / s.max(1e-30);
        assert!(
            e <= tol,
            "{what}: row {i}: got {g} want {w} (rel {e:.3e} > {tol:.1e})"
        );
    }
}

fn run_pn(l: &Launch, w: &[u8], x: PnInput<'_>, n: usize, k: usize) -> (Vec<f32>, EmuStats) {
    let mut y = vec![f32::NAN; n];
    let s = emu::pn_gemv(l, w, x, &mut y, n, k).unwrap();
    (y, s)
}

/// One shape through the half2 kernel the wrappers pick (or with `rows` per warp and a grid
/// of `grid` blocks, so that blocks loop over row groups): self-staged and prepared, checked
/// against the CPU; returns the self-staged run's counters.
fn check_pn(
    seed: u64,
    bits: u32,
    n: usize,
    k: usize,
    rows: Option<usize>,
    grid: Option<u32>,
) -> (Launch, EmuStats) {
    let mut r = rng(seed);
    let w = random_pn_weights(&mut r, bits, n, k);
    let x = activation_like(&mut r, k);
    let mut l = launch::pn_h2(bits, n, k, false, rows).unwrap();
    if let Some(g) = grid {
        l.grid = g;
    }
    let what = format!("{} pn{bits}t {n}x{k}", l.kernel);
    let (got, stats) = run_pn(&l, &w, PnInput::F32(&x), n, k);
    assert_eq!(stats.deadlock, 0, "{what}");
    let want = emulate_pn_gemv(bits, h2_kernel_for(bits, k), &w, &x, n, k);
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        assert_eq!(
            a.to_bits(),
            b.to_bits(),
            "{what} row {i}: kernel {a} vs Rust emulation {b}"
        );
    }
    let (yf, sc) = pn_ref_f64(bits, &w, &x, n, k);
    assert_close(&what, &got, &yf, &sc, 2e-3);
    // The prepared path (x converted once by pn_prepare_x_h2) gives the same bits.
    let (xh, e) = emu::pn_prepare_x(&x).unwrap();
    let mut lp = launch::pn_h2(bits, n, k, true, rows).unwrap();
    lp.grid = l.grid;
    let (gotp, sp) = run_pn(&lp, &w, PnInput::Prepared(&xh, e), n, k);
    assert_eq!(
        gotp.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        "{what}: prepared"
    );
    assert_eq!(
        sp.smem_max_degree, 1.0,
        "{what}: prepared staging conflicts"
    );
    (l, stats)
}

/// (bits, n, k, rows per warp, grid).
type Case = (u32, usize, usize, Option<usize>, Option<u32>);

#[test]
fn pn_gemv_runs_on_the_host_and_equals_the_cpu_on_27b_and_adversarial_shapes() {
    // (bits, n, k, rows per warp, grid): 27B row lengths at reduced row counts; row counts that
    // leave partial row groups; chunk tails (40 and 136 pairs per row: not multiples of 32);
    // 2 blocks looping over many row groups; odd block counts (the `any` kernel).
    let cases: &[Case] = &[
        (3, 24, 5120, None, None),
        (3, 37, 5120, Some(2), None),
        (4, 20, 5120, None, Some(2)),
        (4, 12, 6144, Some(2), None),
        (4, 9, 17408, None, None),
        (3, 5, 320, None, None),
        (4, 70, 256, Some(2), Some(3)),
        (3, 33, 400, None, None),
        (4, 45, 704, None, Some(2)),
    ];
    for (i, &(bits, n, k, rows, grid)) in cases.iter().enumerate() {
        let (l, s) = check_pn(100 + i as u64, bits, n, k, rows, grid);
        let what = format!("{} {n}x{k}", l.kernel);
        assert_eq!(
            s.smem_max_degree, 1.0,
            "{what}: a shared access has a bank conflict ({} of {})",
            s.smem_bad_instr, s.smem_instr
        );
        if !l.kernel.ends_with("any") {
            // Rows whose byte length is a multiple of 32 (every 27B matrix) start on a sector:
            // then within 1.1x; shorter odd rows (136 bytes) straddle sectors.
            let row_bytes = k / if bits == 3 { 80 } else { 64 } * 34;
            let bound = if row_bytes.is_multiple_of(32) {
                1.1
            } else {
                1.5
            };
            let ratio = s.sector_ratio(region::WEIGHT);
            assert!(
                ratio <= bound,
                "{what}: weight loads take {ratio:.3}x the minimum sectors"
            );
            // Every weight byte read once: the footprint is the tensor.
            let wbytes = (n * k / if bits == 3 { 80 } else { 64 } * 34) as u64;
            assert_eq!(
                s.g_bytes[region::WEIGHT],
                wbytes,
                "{what}: weight bytes requested"
            );
        }
        eprintln!(
            "{what}: smem degree max {:.2} mean {:.3} over {} instr; weight sectors {:.3}x min; x {:.3}x",
            s.smem_max_degree,
            s.smem_mean_degree(),
            s.smem_instr,
            s.sector_ratio(region::WEIGHT),
            s.sector_ratio(region::X)
        );
    }
}

#[test]
fn the_layout_before_the_counters_fails_them() {
    // main 1cc9fc2's pn_gemv_h2_even (host/legacy_pn_gemv.cuh): its staged-x reads conflict
    // 32-way (pn4t, lane stride 64 words) and 16-way (pn3t, 80 words), and a warp's weight load
    // touches 32 sectors for 128 bytes (lanes 68 bytes apart): 8x the minimum.
    for (bits, n, k, degree) in [(4, 16, 5120, 32.0), (3, 16, 5120, 16.0)] {
        let mut r = rng(7 + bits as u64);
        let w = random_pn_weights(&mut r, bits, n, k);
        let x = activation_like(&mut r, k);
        let old = Launch {
            kernel: if bits == 3 {
                "legacy_pn3t_gemv_h2_r1"
            } else {
                "legacy_pn4t_gemv_h2_r1"
            },
            grid: n.div_ceil(8) as u32,
            threads: 256,
            smem: (2 * k) as u32,
            rows_per_warp: 1,
        };
        let (y_old, s_old) = run_pn(&old, &w, PnInput::F32(&x), n, k);
        let new = launch::pn_h2(bits, n, k, false, None).unwrap();
        let (y_new, s_new) = run_pn(&new, &w, PnInput::F32(&x), n, k);
        // Same arithmetic, so the same bits: only the memory layout changed.
        assert_eq!(
            y_old.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            y_new.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        assert_eq!(
            s_old.smem_max_degree, degree,
            "pn{bits}t legacy conflict degree"
        );
        let ratio = s_old.sector_ratio(region::WEIGHT);
        assert!(ratio >= 7.9, "pn{bits}t legacy weight sectors {ratio:.2}x");
        assert_eq!(s_new.smem_max_degree, 1.0);
        assert!(s_new.sector_ratio(region::WEIGHT) <= 1.1);
        eprintln!(
            "pn{bits}t {n}x{k}: legacy smem degree max {:.1} mean {:.2}, weight sectors {:.2}x; new {:.1} / {:.2}, {:.3}x",
            s_old.smem_max_degree,
            s_old.smem_mean_degree(),
            ratio,
            s_new.smem_max_degree,
            s_new.smem_mean_degree(),
            s_new.sector_ratio(region::WEIGHT)
        );
    }
}

#[test]
fn q4_k_head_stages_x_once_per_block_and_equals_the_cpu() {
    let mut r = rng(31);
    for (n, k, grid) in [(40, 5120, None), (67, 1024, Some(3u32))] {
        let xw = random_vec(&mut r, n * k, 1.0);
        let mut w = Vec::new();
        quants::quantize_row(GgmlType::Q4K, &xw, &mut w).unwrap();
        let mut wd = vec![0f32; n * k];
        quants::dequantize_row(GgmlType::Q4K, &w, &mut wd).unwrap();
        let x = random_vec(&mut r, k, 2.0);
        let mut l = launch::q4_k(n, k).unwrap();
        if let Some(g) = grid {
            l.grid = g;
        }
        let mut y = vec![f32::NAN; n];
        let s = emu::quant_gemv(StockType::Q4K, &l, &w, k / 256 * 144, &x, &mut y, n).unwrap();
        let (mut want, mut sc) = (vec![0f64; n], vec![0f64; n]);
        for row in 0..n {
            for c in 0..k {
                let p = wd[row * k + c] as f64 * x[c] as f64;
                want[row] += p;
                sc[row] += p.abs();
            }
        }
        assert_close(&format!("q4_K {n}x{k}"), &y, &want, &sc, 1e-5);
        assert_eq!(s.smem_max_degree, 1.0, "q4_K: bank conflict");
        let ratio = s.sector_ratio(region::WEIGHT);
        assert!(ratio <= 1.1, "q4_K weight sectors {ratio:.3}x");
        // x read from global once per block, not once per row.
        assert_eq!(s.g_bytes[region::X], (4 * k) as u64 * l.grid as u64);
        eprintln!(
            "q4_K {n}x{k}: smem degree {:.2}, weight sectors {ratio:.3}x, x bytes {}",
            s.smem_max_degree,
            s.g_bytes[region::X]
        );
    }
}
