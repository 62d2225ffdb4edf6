//! The importance-weighted K-quant and Q8_0 quantizers (`quantize_row_weighted`): never worse
//! than the unweighted reference with uniform weights, better on the weighted error with a
//! skewed importance, always decodable, and no panic on degenerate rows or weights.

use gguf_io::quants::{dequantize_row, quantize_row, quantize_row_weighted, QuantError};
use gguf_io::GgmlType;

/// Deterministic pseudo-random values: a heavy-ish tailed mix like trained weights.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f64 / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| {
            let u = next().max(1e-12);
            let g = (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * next()).cos();
            // A few outliers, as real rows have.
            let scale = if next() < 0.02 { 4.0 } else { 1.0 };
            (g * scale * 0.02) as f32
        })
        .collect()
}

fn decode(ty: GgmlType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut d = vec![0f32; n];
    dequantize_row(ty, bytes, &mut d).unwrap();
    d
}

fn err(x: &[f32], d: &[f32], w: Option<&[f32]>) -> f64 {
    x.iter()
        .zip(d)
        .enumerate()
        .map(|(i, (&a, &b))| {
            let e = f64::from(a) - f64::from(b);
            w.map_or(1.0, |w| f64::from(w[i])) * e * e
        })
        .sum()
}

const TYPES: [GgmlType; 4] = [GgmlType::Q3K, GgmlType::Q4K, GgmlType::Q6K, GgmlType::Q8_0];

#[test]
fn uniform_weights_are_no_worse_than_the_reference() {
    let n = 1024;
    for ty in TYPES {
        let (mut sum_w, mut sum_r) = (0.0, 0.0);
        for seed in 0..12 {
            let x = values(n, seed + 1);
            let (mut a, mut b) = (Vec::new(), Vec::new());
            quantize_row_weighted(ty, &x, &vec![1.0; n], &mut a).unwrap();
            quantize_row(ty, &x, &mut b).unwrap();
            assert_eq!(a.len(), b.len(), "{ty}");
            let (ea, eb) = (
                err(&x, &decode(ty, &a, n), None),
                err(&x, &decode(ty, &b, n), None),
            );
            assert!(
                ea <= eb * (1.0 + 1e-9),
                "{ty} seed {seed}: weighted {ea:e} > reference {eb:e}"
            );
            sum_w += ea;
            sum_r += eb;
        }
        eprintln!(
            "{ty}: uniform-weight search error / reference error = {:.4}",
            sum_w / sum_r
        );
    }
}

#[test]
fn skewed_importance_lowers_the_weighted_error_on_every_row() {
    let n = 512;
    for ty in TYPES.iter().copied().chain([GgmlType::Q5K]) {
        for seed in 0..8 {
            let x = values(n, 100 + seed);
            // Importance like an imatrix: log-normal spread, a few columns 100x the rest.
            let imp: Vec<f32> = values(n, 7_000 + seed)
                .iter()
                .enumerate()
                .map(|(i, v)| (v * 60.0).exp() * if i % 37 == 5 { 100.0 } else { 1.0 })
                .collect();
            let (mut a, mut b) = (Vec::new(), Vec::new());
            quantize_row_weighted(ty, &x, &imp, &mut a).unwrap();
            // Q5_K has no unweighted reference: compare with its own uniform-weight search.
            if ty == GgmlType::Q5K {
                quantize_row_weighted(ty, &x, &vec![1.0; n], &mut b).unwrap();
            } else {
                quantize_row(ty, &x, &mut b).unwrap();
            }
            let ea = err(&x, &decode(ty, &a, n), Some(&imp));
            let eb = err(&x, &decode(ty, &b, n), Some(&imp));
            assert!(
                ea < eb,
                "{ty} seed {seed}: weighted {ea:e} not below unweighted {eb:e}"
            );
        }
    }
}

#[test]
fn q5_k_sits_between_q4_k_and_q6_k() {
    let n = 2048;
    let x = values(n, 42);
    let rel = |ty| {
        let mut b = Vec::new();
        quantize_row(ty, &x, &mut b).unwrap();
        assert_eq!(b.len() as u64, ty.row_bytes(n as u64).unwrap());
        err(&x, &decode(ty, &b, n), None) / err(&x, &vec![0.0; n], None)
    };
    let (q4, q5, q6) = (rel(GgmlType::Q4K), rel(GgmlType::Q5K), rel(GgmlType::Q6K));
    assert!(q5 < q4 * 0.5 && q5 > q6, "q4 {q4:e} q5 {q5:e} q6 {q6:e}");
    assert!(q5 < 2e-3, "{q5:e}");
}

#[test]
fn degenerate_rows_and_weights_do_not_panic_and_decode() {
    let n = 256;
    let rows: Vec<Vec<f32>> = vec![
        vec![0.0; n],
        vec![f32::NAN; n],
        (0..n)
            .map(|i| if i == 3 { f32::INFINITY } else { 0.01 })
            .collect(),
        (0..n)
            .map(|i| {
                if i % 2 == 0 {
                    f32::NEG_INFINITY
                } else {
                    -1e-30
                }
            })
            .collect(),
        vec![65504.0 * 4.0; n],
        vec![1e-30; n],
    ];
    let weights: Vec<Vec<f32>> = vec![
        vec![0.0; n],
        vec![f32::NAN; n],
        (0..n)
            .map(|i| if i < 16 { -1.0 } else { f32::INFINITY })
            .collect(),
        vec![1.0; n],
    ];
    for ty in TYPES.iter().copied().chain([GgmlType::Q5K]) {
        for x in &rows {
            for w in &weights {
                let mut b = Vec::new();
                quantize_row_weighted(ty, x, w, &mut b).unwrap();
                assert_eq!(b.len() as u64, ty.row_bytes(n as u64).unwrap(), "{ty}");
                let _ = decode(ty, &b, n);
            }
        }
        // An all-zero row decodes to zeros whatever the weights.
        let mut b = Vec::new();
        quantize_row_weighted(ty, &vec![0.0; n], &vec![0.0; n], &mut b).unwrap();
        assert!(decode(ty, &b, n).iter().all(|&v| v == 0.0), "{ty}");
    }
}

#[test]
fn length_and_block_errors_are_typed() {
    let mut b = Vec::new();
    let e = quantize_row_weighted(GgmlType::Q4K, &[0.0; 256], &[1.0; 255], &mut b).unwrap_err();
    assert!(
        matches!(
            e,
            QuantError::Length {
                what: "importance",
                ..
            }
        ),
        "{e}"
    );
    let e = quantize_row_weighted(GgmlType::Q6K, &[0.0; 100], &[1.0; 100], &mut b).unwrap_err();
    assert!(matches!(e, QuantError::NotBlockMultiple { .. }), "{e}");
    // Types without a weighted search go through the plain quantizer.
    quantize_row_weighted(GgmlType::F16, &[1.0; 8], &[1.0; 8], &mut b).unwrap();
    assert_eq!(b.len(), 16);
}
