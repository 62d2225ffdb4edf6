//! `vec_dot_f32_multi` (one row, several vectors) against its reference (the f64 single-vector
//! reference per vector) and the single-vector fast path, for every decodable type, 1..=9
//! vectors and ragged lengths; and its typed errors.

use gguf_io::quants::{reference, vec_dot_f32, vec_dot_f32_multi, QuantError, DECODABLE};
use gguf_io::GgmlType;
use pn_tests::ggml::{abs_dot, random_row};
use pn_tests::random_vec;
use rand::rngs::StdRng;
use rand::SeedableRng;

/// The types whose multi-vector product gives every vector the single-vector product's exact
/// bits (the trunk's stock types where the int16 kernels do not apply: widths that are not a
/// multiple of 256, CPUs without them).
const SAME_BITS_AS_SINGLE: [GgmlType; 3] = [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0];

#[test]
fn multi_matches_reference_and_single_for_every_type() {
    let mut rng = StdRng::seed_from_u64(17);
    for &ty in DECODABLE {
        for n_blocks in [1, 3, 21] {
            // One-element types: lengths that are not a multiple of 8 exercise the tails.
            let blocks = if ty.block_size() == 1 {
                n_blocks * 37
            } else {
                n_blocks
            };
            let row = random_row(ty, blocks, 0.5, &mut rng);
            let n = blocks * ty.block_size();
            for m in 1..=9 {
                let xs: Vec<Vec<f32>> = (0..m).map(|_| random_vec(&mut rng, n, 2.0)).collect();
                let refs: Vec<&[f32]> = xs.iter().map(|x| x.as_slice()).collect();
                let mut fast = vec![f32::NAN; m];
                vec_dot_f32_multi(ty, &row, &refs, &mut fast).unwrap();
                let mut want = vec![f32::NAN; m];
                reference::vec_dot_f32_multi(ty, &row, &refs, &mut want).unwrap();
                for (i, x) in xs.iter().enumerate() {
                    let tol = 2e-6 * abs_dot(ty, &row, x);
                    let single = vec_dot_f32(ty, &row, x).unwrap();
                    assert!(
                        (fast[i] - want[i]).abs() <= tol,
                        "{ty} x{blocks} m {m} vector {i}: multi {} ref {}",
                        fast[i],
                        want[i]
                    );
                    assert!(
                        (fast[i] - single).abs() <= 2.0 * tol,
                        "{ty} m {m} vector {i}: multi {} single {single}",
                        fast[i]
                    );
                    if SAME_BITS_AS_SINGLE.contains(&ty) {
                        // A pass of a few rows (MTP verify, batched decode) gives each row the
                        // bits of its own decode step.
                        assert_eq!(
                            fast[i].to_bits(),
                            single.to_bits(),
                            "{ty} x{blocks} m {m} vector {i}: multi {} single {single}",
                            fast[i]
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn multi_errors_are_typed() {
    let ty = GgmlType::Q8_0;
    let row = vec![0u8; 2 * 34];
    let x = vec![1.0f32; 64];
    let short = vec![1.0f32; 32];
    let mut out = [0f32; 2];
    assert!(vec_dot_f32_multi(ty, &row, &[&x, &x], &mut out).is_ok());
    assert!(matches!(
        vec_dot_f32_multi(ty, &row, &[&x, &short], &mut out),
        Err(QuantError::Length { .. })
    ));
    assert!(matches!(
        vec_dot_f32_multi(ty, &row, &[&x], &mut out),
        Err(QuantError::Length { .. })
    ));
    assert!(matches!(
        vec_dot_f32_multi(ty, &row, &[&x[..33], &x[..33]], &mut out),
        Err(QuantError::NotBlockMultiple { .. })
    ));
    assert!(matches!(
        vec_dot_f32_multi(GgmlType::Pn3t, &row, &[&x, &x], &mut out),
        Err(QuantError::Unsupported { .. })
    ));
    // No vectors: nothing to do.
    assert!(vec_dot_f32_multi(ty, &row, &[], &mut []).is_ok());
}
