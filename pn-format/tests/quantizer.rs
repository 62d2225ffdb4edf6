//! The reference quantizer against an independent naive implementation, and its edge cases.

mod common;

use common::{naive_quantize, spec_codes, Rng};
use pn_format::{quantize_row_ref, quantize_rows, validate_row, PnError, PnType, BLOCK_BYTES};

/// Thousands of random groups of varied shapes: the quantizer's d and codes are exactly those of
/// the brute-force argmin over the 36 candidates (ties to the larger m).
#[test]
fn picks_the_brute_force_argmin() {
    let mut rng = Rng(42);
    for ty in PnType::ALL {
        let n = ty.weights_per_block();
        for g in 0..3000 {
            let sigma = 10f64.powf(rng.uniform() * 8.0 - 5.0);
            let mut w = rng.normals(n, sigma);
            match g % 4 {
                0 => {}
                1 => w.iter_mut().for_each(|v| *v = v.abs()),
                2 => {
                    // Coarse values: many exact ties between codes and candidates.
                    w.iter_mut()
                        .for_each(|v| *v = (*v * 4.0 / sigma as f32).round() / 4.0)
                }
                _ => {
                    let i = (rng.next_u64() % n as u64) as usize;
                    w[i] *= 30.0;
                }
            }
            let bytes = quantize_row_ref(ty, &w).unwrap();
            let naive = naive_quantize(ty, &w);
            let d = u16::from_le_bytes([bytes[0], bytes[1]]);
            assert_eq!(d, naive.d.to_bits(), "{ty} group {g}: d");
            assert_eq!(spec_codes(ty, &bytes), naive.codes, "{ty} group {g}: codes");
        }
    }
}

#[test]
fn reserved_bits_are_zero_and_output_validates() {
    let mut rng = Rng(7);
    let row = rng.normals(80 * 64, 1.0);
    let bytes = quantize_row_ref(PnType::Pn3t, &row).unwrap();
    for blk in bytes.chunks(BLOCK_BYTES) {
        for i in 0..8 {
            let w = u32::from_le_bytes(blk[2 + 4 * i..6 + 4 * i].try_into().unwrap());
            assert_eq!(w & 0x8000_8000, 0);
        }
    }
    validate_row(PnType::Pn3t, &bytes).unwrap();
}

#[test]
fn zero_and_underflow_groups_are_canonical() {
    for ty in PnType::ALL {
        let n = ty.weights_per_block();
        for w in [vec![0.0f32; n], vec![-0.0f32; n], vec![1e-9f32; n]] {
            let bytes = quantize_row_ref(ty, &w).unwrap();
            assert_eq!(&bytes[0..2], &[0, 0], "{ty}: d = +0.0");
            assert!(spec_codes(ty, &bytes)
                .iter()
                .all(|&c| c as i32 == ty.zero_point()));
        }
    }
}

#[test]
fn bad_inputs_are_typed_errors() {
    let ty = PnType::Pn3t;
    assert!(matches!(
        quantize_row_ref(ty, &[0.0; 81]),
        Err(PnError::RaggedWeights {
            len: 81,
            block: 80,
            ..
        })
    ));
    let mut w = vec![0.0f32; 160];
    w[80 + 5] = f32::NAN;
    assert!(matches!(
        quantize_row_ref(ty, &w),
        Err(PnError::NonFiniteWeight {
            group: 1,
            index: 5,
            ..
        })
    ));
    w[85] = f32::NEG_INFINITY;
    let e = quantize_row_ref(ty, &w).unwrap_err().to_string();
    assert!(e.contains("group 1") && e.contains("weight 5"), "{e}");
    let mut w = vec![0.0f32; 64];
    w[0] = 1e7;
    assert!(matches!(
        quantize_row_ref(PnType::Pn4t, &w),
        Err(PnError::ScaleOverflow { group: 0, .. })
    ));
}

#[test]
fn parallel_quantizer_matches_reference_and_names_rows() {
    let mut rng = Rng(3);
    for ty in PnType::ALL {
        let k = ty.weights_per_block() * 5;
        let rows = 13;
        let x = rng.normals(rows * k, 0.5);
        let mut serial = Vec::new();
        for r in x.chunks(k) {
            serial.extend(quantize_row_ref(ty, r).unwrap());
        }
        for threads in [0, 1, 2, 5, 64] {
            assert_eq!(
                quantize_rows(ty, &x, k, threads).unwrap(),
                serial,
                "{threads} threads"
            );
        }
        let mut bad = x.clone();
        bad[9 * k + ty.weights_per_block() * 2 + 3] = f32::NAN;
        let e = quantize_rows(ty, &bad, k, 3).unwrap_err();
        match &e {
            PnError::InRow { row: 9, source } => assert!(matches!(
                **source,
                PnError::NonFiniteWeight {
                    group: 2,
                    index: 3,
                    ..
                }
            )),
            other => panic!("unexpected error {other:?}"),
        }
        assert_eq!(
            e.to_string(),
            "row 9: group 2: weight 3 is not finite (NaN)"
        );
    }
}
