//! The blockwise Walsh-Hadamard transform for every R from 2 to 1024.

mod common;

use common::Rng;
use pn_format::hadamard::{fwht_blocks_inplace_with, hadamard_scale};
use pn_format::{fwht_blocks_inplace, rotate_rows, Isa, PnError};

fn sizes() -> impl Iterator<Item = usize> {
    (1..=10).map(|p| 1usize << p)
}

/// Naive `H_R x / sqrt(R)` with the Sylvester entry `(-1)^popcount(i & j)`, in f64.
fn naive(x: &[f32], r: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for blk in x.chunks(r) {
        for i in 0..r {
            let s: f64 = (0..r)
                .map(|j| {
                    let sign = if (i & j).count_ones() % 2 == 0 {
                        1.0
                    } else {
                        -1.0
                    };
                    sign * blk[j] as f64
                })
                .sum();
            out.push(s / (r as f64).sqrt());
        }
    }
    out
}

#[test]
fn agrees_with_naive_matrix_for_every_r() {
    let mut rng = Rng(21);
    for r in sizes() {
        // 3 blocks, plus a length that is not a multiple of any vector width when r is small.
        for blocks in [3usize, 5] {
            let x = rng.normals(r * blocks, 1.0);
            let want = naive(&x, r);
            let norm_in: f64 = x.iter().map(|v| (*v as f64).powi(2)).sum();
            let mut scalar = x.clone();
            fwht_blocks_inplace_with(Isa::Scalar, &mut scalar, r).unwrap();
            for (g, w) in scalar.iter().zip(&want) {
                assert!(
                    (*g as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()),
                    "r {r}: {g} vs {w}"
                );
            }
            let norm_out: f64 = scalar.iter().map(|v| (*v as f64).powi(2)).sum();
            assert!((norm_out - norm_in).abs() <= 1e-5 * norm_in, "r {r}: norm");
            for isa in Isa::available() {
                let mut y = x.clone();
                fwht_blocks_inplace_with(isa, &mut y, r).unwrap();
                let same = y
                    .iter()
                    .zip(&scalar)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "r {r} {isa:?}: SIMD must be bit-identical to scalar");
                fwht_blocks_inplace_with(isa, &mut y, r).unwrap();
                for (a, b) in y.iter().zip(&x) {
                    assert!(
                        (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                        "r {r} {isa:?}: H H x = x"
                    );
                }
            }
        }
    }
}

#[test]
fn even_powers_are_exact_involutions() {
    // 1/sqrt(R) is a power of two when R = 4^k, so H H x = x bit for bit on small integers.
    let x: Vec<f32> = (0..1024).map(|i| ((i * 37) % 19) as f32 - 9.0).collect();
    for r in [4usize, 16, 64, 256, 1024] {
        assert_eq!(hadamard_scale(r), 1.0 / (r as f32).sqrt());
        let mut y = x.clone();
        fwht_blocks_inplace(&mut y, r).unwrap();
        fwht_blocks_inplace(&mut y, r).unwrap();
        assert_eq!(y, x, "r {r}");
    }
}

#[test]
fn rotated_weights_preserve_the_product() {
    let mut rng = Rng(4);
    let (rows, k, r) = (6, 320, 64);
    let w = rng.normals(rows * k, 1.0);
    let x = rng.normals(k, 1.0);
    let mut wr = w.clone();
    rotate_rows(&mut wr, k, r).unwrap();
    let mut xr = x.clone();
    fwht_blocks_inplace(&mut xr, r).unwrap();
    for row in 0..rows {
        let plain: f64 = (0..k).map(|j| w[row * k + j] as f64 * x[j] as f64).sum();
        let rot: f64 = (0..k).map(|j| wr[row * k + j] as f64 * xr[j] as f64).sum();
        assert!(
            (plain - rot).abs() < 1e-4 * (1.0 + plain.abs()),
            "{plain} vs {rot}"
        );
    }
}

#[test]
fn bad_sizes_are_errors() {
    let mut x = vec![0.0f32; 48];
    for r in [0usize, 1, 3, 6, 24] {
        assert_eq!(
            fwht_blocks_inplace(&mut x, r),
            Err(PnError::HadamardSize { r })
        );
    }
    assert_eq!(
        fwht_blocks_inplace(&mut x, 32),
        Err(PnError::HadamardLength { len: 48, r: 32 })
    );
    assert!(rotate_rows(&mut x, 20, 4).is_err()); // 48 is not a whole number of 20-wide rows
    assert!(rotate_rows(&mut x, 24, 16).is_err()); // 16 does not divide k
    rotate_rows(&mut x, 24, 8).unwrap();
}
