//! CPU-side tests of the Walsh-Hadamard kernels' butterfly pairing (`kernels/hadamard.cuh`,
//! compiled as host C++): every stage touches every element once inside its chunk, and the
//! kernels' network gives pn-format's block rotation bit for bit.

mod common;

use common::*;
use pn_kernels::host_shim::safe as shim;
use rand::Rng;

#[test]
fn every_stage_pairs_each_element_once_within_its_chunk() {
    for r in (1..=10).map(|e| 1usize << e) {
        for chunks in [1usize, 3] {
            let n = chunks * r;
            let mut h = 1;
            while h < r {
                let mut seen = vec![0u8; n];
                for k in 0..n / 2 {
                    let i = shim::fwht_first(k, r, h);
                    let j = i + h;
                    assert!(j < n, "R={r} h={h} k={k}: pair ({i}, {j}) past {n}");
                    assert_eq!(i / r, j / r, "R={r} h={h} k={k}: pair crosses a chunk");
                    assert_eq!(i & h, 0, "R={r} h={h} k={k}: {i} is not the low element");
                    seen[i] += 1;
                    seen[j] += 1;
                }
                assert!(
                    seen.iter().all(|&c| c == 1),
                    "R={r} h={h}: an element is paired {} times",
                    seen.iter().max().unwrap()
                );
                h *= 2;
            }
        }
    }
}

#[test]
fn kernel_network_equals_pn_format_rotation() {
    let mut g = rng(31);
    for (r, chunks) in [(2usize, 5usize), (32, 3), (64, 1), (256, 20), (1024, 2)] {
        let x: Vec<f32> = (0..r * chunks).map(|_| g.random_range(-4.0..4.0)).collect();
        let mut want = x.clone();
        pn_format::fwht_blocks_inplace(&mut want, r).unwrap();
        // The scale the launch wrappers pass: 1/sqrt(R) rounded once from f64.
        let scale = (1.0f64 / (r as f64).sqrt()) as f32;
        let mut got = x.clone();
        shim::fwht_blocks(&mut got, r, scale);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "R={r}, {chunks} chunks");
        // And the definition: y_i = sum_j (-1)^popcount(i & j) x_j / sqrt(R) per chunk.
        for c in 0..chunks {
            for i in (0..r).step_by((r / 8).max(1)) {
                let y: f64 = (0..r)
                    .map(|j| {
                        let s = if (i & j).count_ones() % 2 == 0 {
                            1.0
                        } else {
                            -1.0
                        };
                        s * x[c * r + j] as f64
                    })
                    .sum::<f64>()
                    / (r as f64).sqrt();
                let d = (got[c * r + i] as f64 - y).abs();
                assert!(d < 1e-5 * (r as f64).sqrt(), "R={r} c={c} i={i}: {d}");
            }
        }
    }
}

/// The shapes the fused rotation wrappers accept (the CUDA backend falls back to separate ops
/// outside them), and the row limit of the fused norm against the compiled kernel's static
/// shared memory: the row and the scratch must fit the 48 KB a block gets without an opt-in.
#[cfg(feature = "cuda")]
#[test]
fn fused_rotation_limits_match_the_kernels() {
    use pn_kernels::Gpu;
    for (n, r, ok) in [
        (5120, 256, true),
        (2, 2, true),
        (12288, 1024, true),
        (5120, 3, false),
        (4096, 2048, false),
        (100, 64, false),
        (0, 64, false),
        (64, 1, false),
    ] {
        assert_eq!(Gpu::rotation_fits(n, r), ok, "n = {n}, R = {r}");
    }
    if !pn_kernels::kernels_available() {
        eprintln!("no kernels in this build: static shared memory not checked");
        return;
    }
    let line = pn_kernels::ptxas_report()
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("rms_norm_hadamard_f32"))
        .expect("rms_norm_hadamard_f32 in the ptxas report");
    let smem: usize = line
        .split_whitespace()
        .last()
        .and_then(|s| s.parse().ok())
        .expect("smem column");
    assert_eq!(
        Gpu::RMS_NORM_HADAMARD_MAX_N * 4 + smem,
        48 * 1024,
        "ptxas: {line}"
    );
}
