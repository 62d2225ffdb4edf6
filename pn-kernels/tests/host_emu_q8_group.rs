//! The grouped Q8_0 GEMV (`kernels/q8_group.cu`: the GDN's ssm_alpha and ssm_beta in one
//! launch) run by the SIMT emulator: every member's output equals `q8_0_gemv_f32` on that
//! matrix alone bit for bit (and gguf-io's dequantized product within f32 rounding), each weight
//! byte is requested once, x is read once per block, the weight loads take the minimum sectors
//! and no shared access has a bank conflict. At the 27B shape (48 x 5120 twice), with row counts
//! that leave warps idle, four members, and K at a chunk that is not whole 32-block runs.
mod common;

use common::*;
use gguf_io::{quants, GgmlType};
use pn_kernels::emu::{self, region, StockType};
use pn_kernels::launch::Launch;
use pn_kernels::q8_group::q8_group;

fn q8_matrix(r: &mut rand::rngs::StdRng, n: usize, k: usize) -> (Vec<u8>, Vec<f32>) {
    let xw = random_vec(r, n * k, 1.0);
    let mut w = Vec::new();
    quants::quantize_row(GgmlType::Q8_0, &xw, &mut w).unwrap();
    let mut wd = vec![0f32; n * k];
    quants::dequantize_row(GgmlType::Q8_0, &w, &mut wd).unwrap();
    (w, wd)
}

#[test]
fn grouped_q8_0_equals_each_matrix_alone_without_conflicts() {
    let mut r = rng(93);
    for (rows, k) in [
        (&[48usize, 48][..], 5120usize),
        (&[5, 17, 1][..], 1088),
        (&[9, 8, 40, 3][..], 320),
    ] {
        let mats: Vec<(Vec<u8>, Vec<f32>)> =
            rows.iter().map(|&n| q8_matrix(&mut r, n, k)).collect();
        let x = random_vec(&mut r, k, 2.0);
        let g = q8_group(rows, k).unwrap();
        let mut ys: Vec<Vec<f32>> = rows.iter().map(|&n| vec![f32::NAN; n]).collect();
        let ws: Vec<&[u8]> = mats.iter().map(|m| m.0.as_slice()).collect();
        let mut yr: Vec<&mut [f32]> = ys.iter_mut().map(|y| y.as_mut_slice()).collect();
        let st = emu::q8_0_gemv_group(&g, &ws, &mut yr, &x).unwrap();
        let what = format!("q8_0 group {rows:?} x {k}");
        assert_eq!(st.smem_max_degree, 1.0, "{what}: bank conflict");
        // Rows that start on a 32-byte sector (every 27B Q8_0 matrix: 5440-byte rows) take the
        // minimum; others pay the sector their 128-byte runs straddle.
        let ratio = st.sector_ratio(region::WEIGHT);
        let bound = if (k / 32 * 34).is_multiple_of(32) {
            1.1
        } else {
            1.5
        };
        assert!(
            ratio <= bound,
            "{what}: weight sectors {ratio:.3}x the minimum"
        );
        let wbytes: usize = rows.iter().map(|n| n * k / 32 * 34).sum();
        assert_eq!(
            st.g_bytes[region::WEIGHT],
            wbytes as u64,
            "{what}: weight bytes"
        );
        assert_eq!(
            st.g_bytes[region::X],
            (4 * k) as u64 * g.grid as u64,
            "{what}: x once per block"
        );
        for (i, (&n, (w, wd))) in rows.iter().zip(&mats).enumerate() {
            let l = Launch {
                kernel: "q8_0_gemv_f32",
                grid: n.div_ceil(8) as u32,
                threads: 256,
                smem: 0,
                rows_per_warp: 1,
            };
            let mut alone = vec![f32::NAN; n];
            emu::quant_gemv(StockType::Q8_0, &l, w, k / 32 * 34, &x, &mut alone, n).unwrap();
            for (j, (a, b)) in ys[i].iter().zip(&alone).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{what}: member {i} row {j}: {a} vs {b}"
                );
            }
            for (j, y) in ys[i].iter().enumerate() {
                let (want, scale): (f64, f64) = (0..k)
                    .map(|c| wd[j * k + c] as f64 * x[c] as f64)
                    .fold((0.0, 0.0), |(s, a), p| (s + p, a + p.abs()));
                let err = (*y as f64 - want).abs() / scale.max(1e-30);
                assert!(err < 1e-5, "{what}: member {i} row {j}: {y} vs {want}");
            }
        }
        eprintln!(
            "{what}: smem degree {:.2}, weight sectors {ratio:.3}x",
            st.smem_max_degree
        );
    }
}
