//! The int16-activation kernels (every SIMD level this CPU has, not only the one `vec_dot_i16`
//! picks) against the scalar reference, and the activation quantizer's precision.

use super::*;
use crate::quants::{dequantize_row, reference as f32_reference};
use half::f16;
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A random row of `blocks` blocks of `ty` whose f16 scale fields are `scale`-sized (or, with
/// `extreme`, every byte 0xff and the largest finite f16 scales: the integer bounds' worst case).
fn row(ty: GgmlType, blocks: usize, scale: f32, extreme: bool, rng: &mut StdRng) -> Vec<u8> {
    let (size, fields): (usize, &[usize]) = match ty {
        GgmlType::Q4K => (Q4K_BYTES, &[0, 2]),
        _ => (34, &[0]),
    };
    let mut out = Vec::with_capacity(blocks * size);
    for _ in 0..blocks {
        let mut b: Vec<u8> = (0..size)
            .map(|_| if extreme { 0xff } else { rng.random() })
            .collect();
        if extreme && ty == GgmlType::Q8_0 {
            // -128 everywhere: the largest |w| of a Q8_0 block.
            b.iter_mut().for_each(|v| *v = 0x80);
        }
        for &o in fields {
            let v = if extreme {
                f16::MAX
            } else {
                f16::from_f32(rng.random_range(-scale..scale))
            };
            b[o..o + 2].copy_from_slice(&v.to_le_bytes());
        }
        out.extend(b);
    }
    out
}

/// `n` activations: uniform in +-`scale`, with (when `spiky`) one large value per group and
/// some exact zeros, and the last group all zero (scale 0).
fn acts(n: usize, scale: f32, spiky: bool, rng: &mut StdRng) -> Vec<f32> {
    let mut x: Vec<f32> = (0..n).map(|_| rng.random_range(-scale..scale)).collect();
    if spiky {
        for g in 0..n / GROUP {
            x[g * GROUP + rng.random_range(0..GROUP)] = -1e3 * scale;
            x[g * GROUP + rng.random_range(0..GROUP)] = 0.0;
        }
        if n >= 2 * GROUP {
            x[n - GROUP..].iter_mut().for_each(|v| *v = 0.0);
        }
    }
    x
}

/// An upper bound of the sum of the magnitudes of every term the kernels add (the f32 rounding
/// of the block sums is relative to it).
fn magnitude(ty: GgmlType, row: &[u8], a: &ActsI16) -> f64 {
    let x = a.dequantize();
    let (size, per) = match ty {
        GgmlType::Q4K => (Q4K_BYTES, QK_K),
        _ => (34, 32),
    };
    row.chunks_exact(size)
        .zip(x.chunks_exact(per))
        .map(|(b, xb)| {
            let ax: f64 = xb.iter().map(|v| f64::from(v.abs())).sum();
            let w = match ty {
                GgmlType::Q4K => {
                    f64::from(f16_at(b, 0).abs()) * 945.0 + f64::from(f16_at(b, 2).abs()) * 63.0
                }
                _ => f64::from(f16_at(b, 0).abs()) * 128.0,
            };
            w * ax
        })
        .sum()
}

/// Every kernel of this CPU equals the reference on `row` (copied to `offset` bytes past an
/// aligned start) within f32 rounding of the block sums.
fn check_all(ty: GgmlType, row: &[u8], x: &[f32], offset: usize) {
    let mut a = ActsI16::new();
    a.update(x).unwrap();
    let mut buf = vec![0u8; row.len() + 128];
    let start = buf.as_ptr().align_offset(64) + offset;
    buf.truncate(start + row.len());
    buf[start..].copy_from_slice(row);
    let unaligned = &buf[start..];
    let want = reference::vec_dot_i16(ty, unaligned, &a).unwrap();
    let tol = 4e-6 * magnitude(ty, unaligned, &a) + 1e-30;
    let got = vec_dot_i16(ty, unaligned, &a).unwrap();
    assert!(
        (f64::from(got) - f64::from(want)).abs() <= tol,
        "{ty}: vec_dot_i16 {got} vs reference {want} (tol {tol})"
    );
    #[cfg(target_arch = "x86_64")]
    for (name, kty, k) in super::super::x86_i16::all_kernels() {
        if kty != ty {
            continue;
        }
        // SAFETY: `all_kernels` lists only kernels whose features this CPU has; lengths match.
        let got = unsafe { k(unaligned, &a) };
        assert!(
            (f64::from(got) - f64::from(want)).abs() <= tol,
            "{name} at offset {offset}: {got} vs reference {want} (tol {tol})"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn kernels_match_reference(
        q4k in any::<bool>(),
        groups in 1usize..8,
        offset in 0usize..64,
        scale_w in prop_oneof![Just(1e-3f32), Just(0.05f32), Just(30.0f32)],
        scale_x in prop_oneof![Just(1e-4f32), Just(1.0f32), Just(300.0f32)],
        spiky in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let ty = if q4k { GgmlType::Q4K } else { GgmlType::Q8_0 };
        let mut rng = StdRng::seed_from_u64(seed);
        let blocks = if q4k { groups } else { 8 * groups };
        let r = row(ty, blocks, scale_w, false, &mut rng);
        let x = acts(groups * GROUP, scale_x, spiky, &mut rng);
        check_all(ty, &r, &x, offset);
    }
}

/// The integer bounds' worst case: the largest weights and scales against activations at
/// +-32767 (all the same sign, so nothing cancels) stay exact.
#[test]
fn extreme_blocks_do_not_overflow() {
    let mut rng = StdRng::seed_from_u64(3);
    for ty in [GgmlType::Q4K, GgmlType::Q8_0] {
        for groups in [1usize, 3] {
            let blocks = if ty == GgmlType::Q4K {
                groups
            } else {
                8 * groups
            };
            let r = row(ty, blocks, 0.0, true, &mut rng);
            for sign in [1f32, -1.0] {
                let x = vec![sign * 1e-3; groups * GROUP];
                check_all(ty, &r, &x, 1);
                let mut a = ActsI16::new();
                a.update(&x).unwrap();
                assert!(a.q.iter().all(|&q| q == (sign * 32767.0) as i16));
                // And against the f32 product of the decoded row (quantization exact here).
                let mut w = vec![0f32; x.len()];
                dequantize_row(ty, &r, &mut w).unwrap();
                let want: f64 = w
                    .iter()
                    .zip(&x)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum();
                let got = vec_dot_i16(ty, &r, &a).unwrap();
                assert!(
                    (f64::from(got) - want).abs() <= 1e-5 * want.abs(),
                    "{ty}: {got} vs {want}"
                );
            }
        }
    }
}

/// The stated precision: against the f32 activations, the error is at most half a quantization
/// step of each group times the row's weights' magnitudes (plus f32 rounding).
#[test]
fn quantization_error_is_within_half_a_step() {
    let mut rng = StdRng::seed_from_u64(5);
    for ty in [GgmlType::Q4K, GgmlType::Q8_0] {
        for spiky in [false, true] {
            let groups = 20;
            let blocks = if ty == GgmlType::Q4K {
                groups
            } else {
                8 * groups
            };
            let r = row(ty, blocks, 0.05, false, &mut rng);
            let x = acts(groups * GROUP, 1.0, spiky, &mut rng);
            let mut a = ActsI16::new();
            a.update(&x).unwrap();
            let deq = a.dequantize();
            for (j, (&v, &q)) in x.iter().zip(&deq).enumerate() {
                let step = a.d[j / GROUP];
                // Half a step, plus the f32 rounding of `x / d` (2^-24 of up to 32767 steps).
                assert!((v - q).abs() <= 0.502 * step, "x[{j}] {v} -> {q}");
            }
            let mut w = vec![0f32; x.len()];
            dequantize_row(ty, &r, &mut w).unwrap();
            let bound: f64 = w
                .iter()
                .enumerate()
                .map(|(j, &wj)| f64::from(wj.abs()) * 0.502 * f64::from(a.d[j / GROUP]))
                .sum();
            let exact = f32_reference::vec_dot_f32(ty, &r, &x).unwrap();
            let got = vec_dot_i16(ty, &r, &a).unwrap();
            let slack = 4e-6 * magnitude(ty, &r, &a);
            assert!(
                (f64::from(got) - f64::from(exact)).abs() <= bound + slack,
                "{ty} spiky={spiky}: {got} vs f32 {exact}, bound {bound}"
            );
        }
    }
}

/// A non-finite activation makes the product NaN (as the f32 kernels do), not a silent 0.
#[test]
fn non_finite_activations_poison_the_dot() {
    let mut rng = StdRng::seed_from_u64(9);
    for ty in [GgmlType::Q4K, GgmlType::Q8_0] {
        for bad in [f32::NAN, f32::INFINITY] {
            let blocks = if ty == GgmlType::Q4K { 2 } else { 16 };
            let r = row(ty, blocks, 0.05, false, &mut rng);
            let mut x = acts(2 * GROUP, 1.0, false, &mut rng);
            x[300] = bad;
            let mut a = ActsI16::new();
            a.update(&x).unwrap();
            assert!(vec_dot_i16(ty, &r, &a).unwrap().is_nan(), "{ty} with {bad}");
            assert!(reference::vec_dot_i16(ty, &r, &a).unwrap().is_nan());
        }
    }
}

#[test]
fn bad_lengths_and_types_are_typed_errors() {
    let mut a = ActsI16::new();
    assert!(matches!(
        a.update(&[0.0; 300]),
        Err(QuantError::NotBlockMultiple { n: 300, .. })
    ));
    a.update(&[0.5; 512]).unwrap();
    assert_eq!(a.len(), 512);
    assert!(matches!(
        vec_dot_i16(GgmlType::Q4K, &[0u8; 144], &a),
        Err(QuantError::Length { .. })
    ));
    assert!(matches!(
        vec_dot_i16(GgmlType::Q6K, &[0u8; 420], &a),
        Err(QuantError::Unsupported { .. })
    ));
    // Shrinking reuses the buffers and drops the old tail.
    a.update(&[0.25; 256]).unwrap();
    assert_eq!((a.len(), a.d.len(), a.sums.len()), (256, 1, 8));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// The multi-set kernel: every output bit-identical to the single-set kernel on its set (so
    /// a verify row gets decode's numbers) and within f32 rounding of the reference, for 1..7
    /// sets (a group of four and a remainder), odd group counts and unaligned rows.
    #[test]
    fn multi_set_kernel_equals_single_set(
        q4k in any::<bool>(),
        groups in 1usize..6,
        sets in 1usize..8,
        offset in 0usize..64,
        spiky in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let ty = if q4k { GgmlType::Q4K } else { GgmlType::Q8_0 };
        let mut rng = StdRng::seed_from_u64(seed);
        let blocks = if q4k { groups } else { 8 * groups };
        let r = row(ty, blocks, 0.05, false, &mut rng);
        let mut buf = vec![0u8; r.len() + 128];
        let start = buf.as_ptr().align_offset(64) + offset;
        buf.truncate(start + r.len());
        buf[start..].copy_from_slice(&r);
        let unaligned = &buf[start..];
        let acts_v: Vec<ActsI16> = (0..sets)
            .map(|_| {
                let mut a = ActsI16::new();
                a.update(&acts(groups * GROUP, 1.0, spiky, &mut rng)).unwrap();
                a
            })
            .collect();
        let refs: Vec<&ActsI16> = acts_v.iter().collect();
        let mut out = vec![0f32; sets];
        vec_dot_i16_multi(ty, unaligned, &refs, &mut out).unwrap();
        for (m, a) in acts_v.iter().enumerate() {
            let single = vec_dot_i16(ty, unaligned, a).unwrap();
            prop_assert_eq!(out[m].to_bits(), single.to_bits(), "set {} of {}", m, sets);
            let want = reference::vec_dot_i16(ty, unaligned, a).unwrap();
            let tol = 4e-6 * magnitude(ty, unaligned, a) + 1e-30;
            prop_assert!((f64::from(out[m]) - f64::from(want)).abs() <= tol);
        }
    }
}

#[test]
fn multi_set_errors_are_typed() {
    let mut a = ActsI16::new();
    a.update(&[0.5; 256]).unwrap();
    let mut out = [0f32; 2];
    assert!(matches!(
        vec_dot_i16_multi(GgmlType::Q4K, &[0u8; 144], &[&a], &mut out),
        Err(QuantError::Length { .. })
    ));
    assert!(matches!(
        vec_dot_i16_multi(GgmlType::Q4K, &[0u8; 100], &[&a, &a], &mut out),
        Err(QuantError::Length { .. })
    ));
    assert!(matches!(
        vec_dot_i16_multi(GgmlType::Q6K, &[0u8; 210], &[&a, &a], &mut out),
        Err(QuantError::Unsupported { .. })
    ));
}

/// The quantizer's rounding equals `f32::round_ties_even` over its whole range: every half
/// and quarter step up to the clamp bound, values next to them, and NaN (which `as` maps to 0).
#[test]
fn small_rounding_equals_round_ties_even() {
    use super::round_ties_even_small as r;
    for i in -4 * 32767..=4 * 32767 {
        let v = i as f32 / 4.0;
        for w in [
            v,
            f32::from_bits(v.to_bits() + 1),
            f32::from_bits(v.to_bits().max(1) - 1),
        ] {
            if w.abs() <= 32767.0 {
                assert_eq!(
                    r(w).to_bits() & 0x7fff_ffff,
                    w.round_ties_even().to_bits() & 0x7fff_ffff,
                    "{w:e}"
                );
                assert_eq!(r(w) as i16, w.round_ties_even() as i16, "{w:e}");
            }
        }
    }
    assert_eq!(r(f32::NAN) as i16, 0);
}
