//! PN format vectors: the reference quantizer's bytes and the decoded values for fixed inputs.
//! Exact: the quantizer is deterministic integer/f64 math and a decoded value is an f16 scale
//! times a small integer, which every decoder (scalar or SIMD) computes without rounding.

use super::super::case::{sha256_hex, CaseError, Output, Run};
use super::super::snapshot::Field;
use super::Rng;
use pn_format::{dequantize_row, quantize_row_ref, PnType};
use std::fmt::Write as _;

/// Fixed inputs of `blocks` blocks each: (name, weights).
fn inputs(ty: PnType, blocks: usize) -> Vec<(&'static str, Vec<f32>)> {
    let n = ty.weights_per_block() * blocks;
    let mut rng = Rng(0x601d_0000 + ty.bits() as u64);
    let mut outliers = rng.normals(n, 0.02);
    outliers[1] = 7.5;
    outliers[n - 3] = -4.25;
    vec![
        ("normal-sigma1", rng.normals(n, 1.0)),
        ("normal-sigma0.02-outliers", outliers),
        ("zeros", vec![0.0; n]),
        (
            "ramp",
            (0..n).map(|i| (i as f32 - n as f32 / 3.0) / 64.0).collect(),
        ),
        ("tiny-1e-6", rng.normals(n, 1e-6)),
    ]
}

/// Quantizes every fixed input and decodes it back.
pub fn run(ty: PnType) -> Result<Run, CaseError> {
    let mut out = Output::default();
    for (name, w) in inputs(ty, 3) {
        let bytes = quantize_row_ref(ty, &w).map_err(|e| format!("{ty} {name}: {e}"))?;
        let mut hex = String::with_capacity(bytes.len() * 2);
        for b in &bytes {
            let _ = write!(hex, "{b:02x}");
        }
        let mut dec = vec![0.0f32; w.len()];
        dequantize_row(ty, &bytes, &mut dec).map_err(|e| format!("{ty} {name}: {e}"))?;
        out.fields.push(Field::exact(format!("{name}.bytes"), hex));
        let vals: Vec<String> = dec.iter().map(|v| format!("{v:e}")).collect();
        out.fields
            .push(Field::exact(format!("{name}.decoded"), vals.join(" ")));
        let err = w
            .iter()
            .zip(&dec)
            .map(|(a, b)| ((a - b) as f64).powi(2))
            .sum::<f64>();
        out.fields.push(Field::info(
            format!("{name}.sq_err"),
            format!("{err:.6e} (bytes sha256 {})", &sha256_hex(&bytes)[..16]),
        ));
    }
    Ok(Run::Done(out))
}
