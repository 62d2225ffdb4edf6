//! Dot products: the element-index-shift defect, accuracy against the f64 reference, SIMD ==
//! scalar (fixed cases here; random ones in `props.rs`), the matrix-vector product.

mod common;

use common::{magnitude, Rng};
use pn_format::dot::{dot_prepared_with, matvec_with};
use pn_format::{
    dequantize_row, dot_f32, dot_ref_f64, matvec, pack_block, quantize_row_ref, Isa, PnError,
    PnType, PreparedF32, PreparedI16,
};

/// Decodes a row the way the spec's broken CPU dot product does: shift by element index `t`
/// within the word (`BITS * t`) instead of `BITS*(t>>1) + 16*(t&1)`.
fn defective_decode(ty: PnType, row: &[u8]) -> Vec<f32> {
    let mut out = Vec::new();
    for blk in row.chunks(34) {
        let d = half::f16::from_le_bytes([blk[0], blk[1]]).to_f32();
        for i in 0..8 {
            let w = u32::from_le_bytes(blk[2 + 4 * i..6 + 4 * i].try_into().unwrap());
            for t in 0..ty.codes_per_word() {
                let n = (w >> (ty.bits() * t as u32)) & u32::from(ty.max_code());
                out.push(d * (n as i32 - ty.zero_point()) as f32);
            }
        }
    }
    out
}

/// A test the element-index shift would fail: one odd-position code (t = 1, bit 16) differs from
/// z. The correct dot is `d * (code - z)`; the defective decode reads bits 3..5 (or 4..7) instead.
#[test]
fn element_index_shift_defect_is_not_reproduced() {
    for ty in PnType::ALL {
        let n = ty.weights_per_block();
        let mut codes = vec![ty.zero_point() as u8; n];
        codes[1] = ty.max_code();
        let blk = pack_block(ty, half::f16::from_f32(0.5), &codes);
        let mut x = vec![0.0f32; n];
        x[1] = 1.0;
        let want = 0.5 * (ty.max_code() as i32 - ty.zero_point()) as f32;
        let wrong: f32 = defective_decode(ty, &blk)
            .iter()
            .zip(&x)
            .map(|(w, x)| w * x)
            .sum();
        assert_ne!(
            wrong, want,
            "the defective decode must differ on this block"
        );
        assert_eq!(dot_ref_f64(ty, &blk, &x).unwrap() as f32, want);
        for isa in Isa::available() {
            let f = dot_prepared_with(isa, ty, &blk, &PreparedF32::new(ty, &x).unwrap()).unwrap();
            assert_eq!(f, want, "{ty} {isa:?} f32");
            let q = dot_prepared_with(isa, ty, &blk, &PreparedI16::new(ty, &x).unwrap()).unwrap();
            assert!(
                (q - want).abs() <= 1e-4 * want.abs(),
                "{ty} {isa:?} i16: {q} vs {want}"
            );
        }
        // And on a realistic row: the defective product is far off, ours is not.
        let mut rng = Rng(99);
        let w = rng.normals(n * 16, 1.0);
        let x = rng.normals(n * 16, 1.0);
        let row = quantize_row_ref(ty, &w).unwrap();
        let reference = dot_ref_f64(ty, &row, &x).unwrap();
        let wrong: f64 = defective_decode(ty, &row)
            .iter()
            .zip(&x)
            .map(|(w, x)| (*w as f64) * (*x as f64))
            .sum();
        let ours = dot_f32(ty, &row, &x).unwrap() as f64;
        assert!((ours - reference).abs() < 1e-4 * (1.0 + reference.abs()));
        assert!(
            (wrong - reference).abs() > 1.0,
            "defect would be caught: {wrong} vs {reference}"
        );
    }
}

/// Extra error of int16 activations: |w| * (half a quantization step of the block).
fn i16_bound(ty: PnType, row: &[u8], x: &[f32]) -> f64 {
    let bpw = ty.weights_per_block();
    let mut w = vec![0.0; x.len()];
    dequantize_row(ty, row, &mut w).unwrap();
    let mut s = 0.0;
    for (wb, xb) in w.chunks(bpw).zip(x.chunks(bpw)) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64;
        s += wb.iter().map(|v| (*v as f64).abs()).sum::<f64>() * amax / 65534.0;
    }
    s
}

#[test]
fn accuracy_against_f64_reference_and_int16_cost() {
    let mut rng = Rng(5);
    for ty in PnType::ALL {
        let k = ty.weights_per_block() * 64;
        let mut worst_f32 = 0.0f64;
        let mut worst_i16 = 0.0f64;
        for _ in 0..20 {
            let row = quantize_row_ref(ty, &rng.normals(k, 0.02)).unwrap();
            let x = rng.normals(k, 1.0);
            let reference = dot_ref_f64(ty, &row, &x).unwrap();
            let mag = magnitude(ty, &row, &x);
            let pf = PreparedF32::new(ty, &x).unwrap();
            let pq = PreparedI16::new(ty, &x).unwrap();
            for isa in Isa::available() {
                let f = dot_prepared_with(isa, ty, &row, &pf).unwrap() as f64;
                let q = dot_prepared_with(isa, ty, &row, &pq).unwrap() as f64;
                assert!(
                    (f - reference).abs() <= 1e-5 * mag,
                    "{ty} {isa:?} f32 {f} vs {reference}"
                );
                let qb = 1e-5 * mag + i16_bound(ty, &row, &x);
                assert!(
                    (q - reference).abs() <= qb,
                    "{ty} {isa:?} i16 {q} vs {reference}"
                );
                worst_f32 = worst_f32.max((f - reference).abs() / mag);
                worst_i16 = worst_i16.max((q - reference).abs() / mag);
            }
        }
        // The accuracy cost of int16 activations, reported by `cargo test -- --nocapture`.
        println!(
            "{ty}: worst |err| / sum(|d| (n+z) |x|): f32 {worst_f32:.2e}, int16 {worst_i16:.2e}"
        );
    }
}

#[test]
fn matvec_matches_rows_and_checks_shapes() {
    let mut rng = Rng(8);
    for ty in PnType::ALL {
        let k = ty.weights_per_block() * 7;
        let rows = 9;
        let w = quantize_row_ref(ty, &rng.normals(k * rows, 1.0)).unwrap();
        let x = rng.normals(k, 1.0);
        let pf = PreparedF32::new(ty, &x).unwrap();
        let pq = PreparedI16::new(ty, &x).unwrap();
        let rb = ty.row_bytes(k).unwrap();
        for isa in Isa::available() {
            let mut out = vec![0.0; rows];
            matvec_with(isa, ty, &w, rows, &pf, &mut out).unwrap();
            let mut outq = vec![0.0; rows];
            matvec_with(isa, ty, &w, rows, &pq, &mut outq).unwrap();
            for r in 0..rows {
                let row = &w[r * rb..(r + 1) * rb];
                assert_eq!(out[r], dot_prepared_with(isa, ty, row, &pf).unwrap());
                assert_eq!(outq[r], dot_prepared_with(isa, ty, row, &pq).unwrap());
                let reference = dot_ref_f64(ty, row, &x).unwrap();
                assert!((out[r] as f64 - reference).abs() <= 1e-5 * magnitude(ty, row, &x));
            }
        }
        let mut out = vec![0.0; rows];
        assert!(matches!(
            matvec(ty, &w[1..], rows, &pf, &mut out),
            Err(PnError::LengthMismatch { .. })
        ));
        assert!(matches!(
            matvec(ty, &w, rows, &pf, &mut out[1..]),
            Err(PnError::LengthMismatch { .. })
        ));
        let other = match ty {
            PnType::Pn3t => PnType::Pn4t,
            PnType::Pn4t => PnType::Pn3t,
        };
        let po = PreparedF32::new(other, &vec![0.0; 320]).unwrap();
        assert!(matches!(
            matvec(ty, &w, rows, &po, &mut out),
            Err(PnError::TypeMismatch { .. })
        ));
        assert!(matches!(
            PreparedF32::new(ty, &x[1..]),
            Err(PnError::RaggedWeights { .. })
        ));
    }
}

#[test]
fn non_finite_inputs_do_not_panic() {
    let ty = PnType::Pn3t;
    let mut row = quantize_row_ref(ty, &vec![1.0; 160]).unwrap();
    row[0..2].copy_from_slice(&0x7e00u16.to_le_bytes()); // NaN scale
    let x = vec![f32::INFINITY; 160];
    for isa in Isa::ALL {
        let _ = dot_prepared_with(isa, ty, &row, &PreparedF32::new(ty, &x).unwrap()).unwrap();
        let q = dot_prepared_with(isa, ty, &row, &PreparedI16::new(ty, &x).unwrap()).unwrap();
        assert!(q.is_nan());
    }
}
