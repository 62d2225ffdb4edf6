//! Accuracy of the PN decode path (half2 codes, fp16 products over one word, fp32 beyond) at the
//! 27B shapes, measured on the CPU through a bit-exact emulation of the kernels (tests/common),
//! against the f64 reference. The GPU suite checks that the device matches the emulation bit
//! for bit, so these bounds hold on the device.

mod common;

use common::*;

fn max_rel_err(got: &[f32], want: &[f64], scale: &[f64]) -> f64 {
    got.iter()
        .zip(want)
        .zip(scale)
        .map(|((g, w), s)| (*g as f64 - w).abs() / s.max(1e-30))
        .fold(0.0, f64::max)
}

#[test]
fn half2_path_error_vs_f64_at_27b_shapes() {
    let mut r = rng(21);
    // (bits, rows sampled, K): pn3t K = 5120 (q/qkv/gate/up), pn4t K = 6144 and 17408 (outputs,
    // down), pn4t K = 704 (odd block count: the `any` kernel).
    for (bits, n, k) in [
        (3u32, 48, 5120),
        (4, 24, 6144),
        (4, 12, 17408),
        (4, 40, 704),
    ] {
        let w = random_pn_weights(&mut r, bits, n, k);
        let x = activation_like(&mut r, k);
        let (want, scale) = pn_ref_f64(bits, &w, &x, n, k);
        let h2 = emulate_pn_gemv(bits, h2_kernel_for(bits, k), &w, &x, n, k);
        let f32p = emulate_pn_gemv(bits, PnKernel::F32, &w, &x, n, k);
        let (e_h2, e_f32) = (
            max_rel_err(&h2, &want, &scale),
            max_rel_err(&f32p, &want, &scale),
        );
        let ymax = want.iter().fold(0f64, |m, v| m.max(v.abs()));
        let abs_h2 = h2
            .iter()
            .zip(&want)
            .map(|(g, w)| (*g as f64 - w).abs())
            .fold(0.0, f64::max);
        eprintln!(
            "pn{bits}t K={k}: max |err| / sum|w x|: half2 {e_h2:.2e}, f32 {e_f32:.2e}; half2 max |err| / max|y| {:.2e}",
            abs_h2 / ymax
        );
        assert!(e_h2 <= 2e-3, "half2 error {e_h2:.3e} above the bound");
        assert!(e_f32 <= 1e-5, "f32 error {e_f32:.3e} above the bound");
        assert!(h2.iter().all(|v| v.is_finite()));
    }
}

#[test]
fn half2_staging_scale_prevents_overflow_and_is_exact() {
    // Huge and tiny activation ranges: the power-of-two staging keeps every fp16 partial finite,
    // and scaling both x and the result by powers of two changes nothing else.
    let mut r = rng(22);
    let (bits, n, k) = (3u32, 8, 640);
    let w = random_pn_weights(&mut r, bits, n, k);
    let x = activation_like(&mut r, k);
    let base = emulate_pn_gemv(bits, PnKernel::H2Even, &w, &x, n, k);
    for f in [2f32.powi(40), 2f32.powi(-60), 65536.0] {
        let xf: Vec<f32> = x.iter().map(|v| v * f).collect();
        let y = emulate_pn_gemv(bits, PnKernel::H2Even, &w, &xf, n, k);
        for (a, b) in base.iter().zip(&y) {
            assert_eq!((a * f).to_bits(), b.to_bits(), "scale {f}");
        }
    }
}

#[test]
fn f16_rne_rounds_ties_to_even() {
    use half::f16;
    // 2049 is a tie between 2048 and 2050 (ulp 2): even mantissa wins (2048).
    assert_eq!(f16_rne(2049.0), f16::from_f32(2048.0));
    assert_eq!(f16_rne(2051.0), f16::from_f32(2052.0));
    // Just above the tie rounds up (the half crate's from_f64 truncation would not).
    assert_eq!(f16_rne(2049.0 + 1e-9), f16::from_f32(2050.0));
    assert_eq!(f16_rne(65519.0), f16::MAX);
    assert!(f16_rne(65520.0).is_infinite());
    assert_eq!(f16_rne(2f64.powi(-25)), f16::ZERO); // tie at half the smallest subnormal
    assert_eq!(f16_rne(3.0 * 2f64.powi(-25)), f16::from_bits(2));
}
