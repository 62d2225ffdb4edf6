//! Fuzzes pn-format's validation, decoding and dot products on arbitrary bytes: any input must
//! give `Ok` or a typed error, never a panic, and a row that validates must decode to finite
//! values whose f64 dot product agrees with the fast paths.
#![no_main]

use pn_format::dot::dot_prepared_with;
use pn_format::{dequantize_row, dot_ref_f64, validate_row, Isa, PnType, PreparedF32, PreparedI16};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&sel, bytes)) = data.split_first() else {
        return;
    };
    let ty = if sel & 1 == 0 {
        PnType::Pn3t
    } else {
        PnType::Pn4t
    };
    let valid = validate_row(ty, bytes).is_ok();
    let nb = bytes.len() / 34;
    let k = nb * ty.weights_per_block();
    let mut out = vec![0.0f32; k];
    let decoded = dequantize_row(ty, bytes, &mut out);
    assert_eq!(decoded.is_ok(), bytes.len() % 34 == 0);
    if valid {
        assert!(
            out.iter().all(|v| v.is_finite()),
            "a valid row decodes to finite values"
        );
        // Activations derived from the selector byte: small integers, so the bound is loose.
        let x: Vec<f32> = (0..k)
            .map(|i| ((i as u32 ^ u32::from(sel)) % 7) as f32 - 3.0)
            .collect();
        let reference = dot_ref_f64(ty, bytes, &x).unwrap();
        // Scale of every partial sum either formulation forms: sum |d| (n + z) |x|.
        let mut mag = 0.0f64;
        for (b, blk) in pn_format::blocks(ty, bytes).unwrap().enumerate() {
            for e in 0..ty.weights_per_block() {
                let n = f64::from(blk.code(e)) + f64::from(ty.zero_point());
                let xe = f64::from(x[b * ty.weights_per_block() + e]).abs();
                mag += f64::from(blk.scale()).abs() * n * xe;
            }
        }
        let pf = PreparedF32::new(ty, &x).unwrap();
        let pq = PreparedI16::new(ty, &x).unwrap();
        for isa in Isa::available() {
            let f = f64::from(dot_prepared_with(isa, ty, bytes, &pf).unwrap());
            let q = f64::from(dot_prepared_with(isa, ty, bytes, &pq).unwrap());
            let bound = 1e-4 * mag + 1e-30;
            assert!(
                (f - reference).abs() <= bound,
                "{isa:?} f32 {f} vs {reference}"
            );
            assert!(
                (q - reference).abs() <= bound,
                "{isa:?} i16 {q} vs {reference}"
            );
        }
    }
});
