//! Stock-type decoders and dot products against the scalar references, and the reference
//! quantizers' error against the bounds ggml's own `test-quantize-fns` uses.

use gguf_io::quants::{
    dequantize_row, quantize_activations, quantize_row, reference, vec_dot_f32, vec_dot_q,
    QuantError, DECODABLE,
};
use gguf_io::GgmlType;
use half::f16;
use pn_tests::ggml::{abs_dot, random_row, scale_fields, set_iq1m_scale};
use pn_tests::random_vec;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[test]
fn fast_f32_dot_matches_reference_for_every_type() {
    let mut rng = StdRng::seed_from_u64(7);
    for &ty in DECODABLE {
        for n_blocks in [1, 3, 20] {
            let blocks = if ty.block_size() == 1 {
                n_blocks * 37
            } else {
                n_blocks
            };
            for scale in [1e-3f32, 0.05, 30.0] {
                let row = random_row(ty, blocks, scale, &mut rng);
                let x = random_vec(&mut rng, blocks * ty.block_size(), 2.0);
                let r = reference::vec_dot_f32(ty, &row, &x).unwrap();
                let fast = vec_dot_f32(ty, &row, &x).unwrap();
                let portable = reference::vec_dot_f32_portable(ty, &row, &x).unwrap();
                let tol = 2e-6 * abs_dot(ty, &row, &x);
                assert!(
                    (fast - r).abs() <= tol,
                    "{ty} x{blocks}: fast {fast} ref {r} tol {tol}"
                );
                assert!(
                    (portable - r).abs() <= tol,
                    "{ty} x{blocks}: portable {portable} ref {r}"
                );
            }
        }
    }
}

#[test]
fn adversarial_blocks_decode_consistently() {
    // Extreme quant bytes (all zeros, all ones) with large and tiny scales.
    let mut rng = StdRng::seed_from_u64(11);
    for &ty in DECODABLE {
        if ty.block_size() == 1 {
            continue;
        }
        for fill in [0x00u8, 0xff, 0x80, 0x0f] {
            for d in [65504.0f32, -65504.0, 6e-8, 0.0] {
                let mut b = vec![fill; ty.type_size() * 4];
                for blk in 0..4 {
                    for &off in scale_fields(ty) {
                        let o = blk * ty.type_size() + off;
                        b[o..o + 2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
                    }
                    if ty == GgmlType::Iq1M {
                        set_iq1m_scale(&mut b[blk * ty.type_size()..], d);
                    }
                }
                let x = random_vec(&mut rng, 4 * ty.block_size(), 2.0);
                let r = reference::vec_dot_f32(ty, &b, &x).unwrap();
                let fast = vec_dot_f32(ty, &b, &x).unwrap();
                let tol = 2e-6 * abs_dot(ty, &b, &x);
                assert!(
                    (fast - r).abs() <= tol || (fast.is_infinite() && r.is_infinite()),
                    "{ty} fill {fill:#x} d {d}: {fast} vs {r}"
                );
            }
        }
    }
}

#[test]
fn int8_dot_matches_its_scalar_reference_and_the_f32_math() {
    let mut rng = StdRng::seed_from_u64(3);
    use GgmlType::*;
    for ty in [Q4_0, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K] {
        for blocks in [1, 4, 20] {
            let n = blocks * ty.block_size();
            let n = n.div_ceil(256) * 256;
            let row = random_row(ty, n / ty.block_size(), 0.05, &mut rng);
            let x = random_vec(&mut rng, n, 2.0);
            let acts = quantize_activations(ty, &x).unwrap();
            let fast = vec_dot_q(ty, &row, &acts).unwrap();
            let scalar = reference::vec_dot_q(ty, &row, &acts).unwrap();
            let xq = acts.dequantize();
            let exact = reference::vec_dot_f32(ty, &row, &xq).unwrap();
            let tol = 1e-5 * abs_dot(ty, &row, &xq);
            assert!(
                (fast - scalar).abs() <= tol,
                "{ty}: simd {fast} scalar {scalar}"
            );
            assert!(
                (scalar - exact).abs() <= tol,
                "{ty}: int {scalar} f32 {exact}"
            );
            // Against the unquantized activations: off by the activation rounding only.
            let f = reference::vec_dot_f32(ty, &row, &x).unwrap();
            assert!(
                (fast - f).abs() <= 0.02 * abs_dot(ty, &row, &x),
                "{ty}: {fast} vs f32 {f}"
            );
        }
    }
}

#[test]
fn int8_path_rejects_mismatched_activations() {
    let x = vec![0.5f32; 256];
    let acts = quantize_activations(GgmlType::Q8_0, &x).unwrap();
    let row = vec![0u8; 144];
    assert!(matches!(
        vec_dot_q(GgmlType::Q4K, &row, &acts),
        Err(QuantError::ActsMismatch { .. })
    ));
    assert!(matches!(
        quantize_activations(GgmlType::F32, &x),
        Err(QuantError::Unsupported { .. })
    ));
    assert!(matches!(
        quantize_activations(GgmlType::Q4K, &x[..100]),
        Err(QuantError::NotBlockMultiple { .. })
    ));
}

#[test]
fn bad_lengths_and_pn_types_are_errors() {
    let mut out = vec![0f32; 256];
    assert!(matches!(
        dequantize_row(GgmlType::Q4K, &[0u8; 143], &mut out),
        Err(QuantError::Length {
            expected: 144,
            got: 143,
            ..
        })
    ));
    assert!(matches!(
        dequantize_row(GgmlType::Q4K, &[0u8; 144], &mut out[..100]),
        Err(QuantError::NotBlockMultiple { n: 100, .. })
    ));
    assert!(matches!(
        dequantize_row(GgmlType::Pn3t, &[0u8; 34], &mut out[..80]),
        Err(QuantError::Unsupported { .. })
    ));
    assert!(matches!(
        vec_dot_f32(GgmlType::Pn4t, &[0u8; 34], &out[..64]),
        Err(QuantError::Unsupported { .. })
    ));
    let mut v = Vec::new();
    assert!(matches!(
        quantize_row(GgmlType::Q2K, &out, &mut v),
        Err(QuantError::Unsupported { .. })
    ));
}

// ---- quantizers, measured the way ggml's tests/test-quantize-fns.cpp measures them ----

/// ggml's test input: `0.1 + 2 cos(i + offset)`.
fn ggml_test_data(offset: f32, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| 0.1 + 2.0 * (i as f32 + offset).cos())
        .collect()
}

/// ggml's "total error": sqrt(sum of squared differences) / n.
fn ggml_rmse(a: &[f32], b: &[f32]) -> f32 {
    let s: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
    s.sqrt() as f32 / a.len() as f32
}

fn round_trip(ty: GgmlType, x: &[f32]) -> Vec<f32> {
    let mut q = Vec::new();
    quantize_row(ty, x, &mut q).unwrap();
    assert_eq!(q.len(), ty.row_bytes(x.len() as u64).unwrap() as usize);
    let mut y = vec![0f32; x.len()];
    dequantize_row(ty, &q, &mut y).unwrap();
    y
}

#[test]
fn quantizers_meet_ggml_error_bounds() {
    const TEST_SIZE: usize = 32 * 128;
    let x = ggml_test_data(0.0, TEST_SIZE);
    let x2 = ggml_test_data(1.0, TEST_SIZE);
    // (type, MAX_QUANTIZATION_TOTAL_ERROR, MAX_DOT_PRODUCT_ERROR) as in ggml's test.
    for (ty, max_err, max_dot_err) in [
        (GgmlType::Q8_0, 0.002, 0.02),
        (GgmlType::Q6K, 0.002, 0.02),
        (GgmlType::Q4K, 0.002, 0.02),
        (GgmlType::Q3K, 0.004, 0.04),
        (GgmlType::F16, 0.002, 0.02),
        (GgmlType::BF16, 0.002, 0.02),
    ] {
        let y = round_trip(ty, &x);
        let err = ggml_rmse(&x, &y);
        assert!(err <= max_err, "{ty}: total error {err} > {max_err}");
        // Dot product of quantized weights with (int8-)quantized activations vs exact.
        let mut q = Vec::new();
        quantize_row(ty, &x, &mut q).unwrap();
        let got = match quantize_activations(ty, &x2) {
            Ok(acts) => vec_dot_q(ty, &q, &acts).unwrap(),
            Err(_) => vec_dot_f32(ty, &q, &x2).unwrap(),
        };
        let exact: f64 = x
            .iter()
            .zip(&x2)
            .map(|(a, b)| f64::from(*a) * f64::from(*b))
            .sum();
        let dot_err = (got as f64 - exact).abs() / TEST_SIZE as f64;
        assert!(dot_err <= max_dot_err, "{ty}: dot error {dot_err}");
    }
}

#[test]
fn quantizers_relative_error_on_gaussian_like_rows() {
    // Tighter, type-specific bounds on rows that look like weights (sum of uniforms ~ normal,
    // a few outliers): relative RMS error of the round trip.
    let mut rng = StdRng::seed_from_u64(99);
    let x: Vec<f32> = (0..256 * 64)
        .map(|i| {
            let g: f32 = (0..4).map(|_| rng.random_range(-1.0f32..1.0)).sum::<f32>() * 0.02;
            if i % 997 == 0 {
                g * 8.0
            } else {
                g
            }
        })
        .collect();
    let rms = |v: &[f32]| (v.iter().map(|a| a * a).sum::<f32>() / v.len() as f32).sqrt();
    for (ty, bound) in [
        (GgmlType::Q8_0, 0.01),
        (GgmlType::Q6K, 0.03),
        (GgmlType::Q4K, 0.12),
        (GgmlType::Q3K, 0.25),
    ] {
        let y = round_trip(ty, &x);
        let diff: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a - b).collect();
        let rel = rms(&diff) / rms(&x);
        assert!(rel <= bound, "{ty}: relative rms error {rel} > {bound}");
    }
    // All-zero and constant rows survive.
    for ty in [GgmlType::Q8_0, GgmlType::Q6K, GgmlType::Q4K, GgmlType::Q3K] {
        assert!(
            round_trip(ty, &[0.0; 256]).iter().all(|&v| v == 0.0),
            "{ty} zeros"
        );
        let c = round_trip(ty, &[0.75; 256]);
        assert!(
            c.iter().all(|&v| (v - 0.75).abs() < 0.03),
            "{ty} constant: {:?}",
            &c[..4]
        );
    }
}

#[test]
fn float_types_round_trip_exactly_when_representable() {
    let x: Vec<f32> = (0..64).map(|i| (i as f32 - 32.0) * 0.125).collect();
    assert_eq!(round_trip(GgmlType::F32, &x), x);
    assert_eq!(round_trip(GgmlType::F16, &x), x);
    assert_eq!(round_trip(GgmlType::BF16, &x), x);
    // bf16 rounds to nearest even: 1 + 2^-8 is a tie between 1 and 1 + 2^-7.
    assert_eq!(round_trip(GgmlType::BF16, &[1.0 + 1.0 / 256.0])[0], 1.0);
    assert!(round_trip(GgmlType::BF16, &[f32::NAN])[0].is_nan());
}

#[test]
fn q8_0_quantizer_matches_ggml_reference_rule() {
    // d = amax/127 rounded to f16, q = round(x / d) with ties away from zero.
    let x: Vec<f32> = (0..32).map(|i| i as f32 - 12.7).collect();
    let mut q = Vec::new();
    quantize_row(GgmlType::Q8_0, &x, &mut q).unwrap();
    let d = f16::from_bits(u16::from_le_bytes([q[0], q[1]])).to_f32();
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert_eq!(d, f16::from_f32(amax / 127.0).to_f32());
    let id = 1.0 / (amax / 127.0);
    for (i, &v) in x.iter().enumerate() {
        assert_eq!(q[2 + i] as i8, (v * id).round() as i8);
    }
}
