//! Golden vectors: the quantizer's bytes and the decoded values for fixed inputs, as insta
//! snapshots (reviewed by hand; a change to any byte is a visible, deliberate change).

mod common;

use common::{hex, naive_quantize, spec_codes, Rng};
use pn_format::{dequantize_row, quantize_row_ref, validate_row, PnType, BLOCK_BYTES};

/// One block's worth of weights for each golden case (`n` = weights per block).
fn cases(ty: PnType) -> Vec<(&'static str, Vec<f32>)> {
    let n = ty.weights_per_block();
    let z = ty.zero_point() as f32;
    let mut rng = Rng(0x5eed_0000 + ty.ggml_id() as u64);
    let mut v = Vec::new();
    v.push(("random normal (sigma 1)", rng.normals(n, 1.0)));
    let mut outl = rng.normals(n, 0.02);
    outl[3] = 9.5;
    outl[n - 7] = -6.25;
    v.push(("heavy outliers (sigma 0.02, +9.5 and -6.25)", outl));
    v.push(("all zero", vec![0.0; n]));
    v.push((
        "negative-dominant (uniform in [-3, 1))",
        (0..n).map(|_| (rng.uniform() * 4.0 - 3.0) as f32).collect(),
    ));
    v.push((
        "positive-dominant (uniform in [-1, 3))",
        (0..n).map(|_| (rng.uniform() * 4.0 - 1.0) as f32).collect(),
    ));
    // Exact tie between m = 0.98 and m = 1.00 (derivation in `exact_tie_is_a_tie` below): the
    // amax z has code 0 under both scales and the second weight sits where both errors match.
    let mut tie = vec![0.0; n];
    tie[0] = z;
    tie[1] = match ty {
        PnType::Pn3t => 3399.0 / 4096.0,
        PnType::Pn4t => 3399.0 / 2048.0,
    };
    v.push(("exact tie between m = 0.98 and m = 1.00", tie));
    v.push((
        "magnitudes that underflow every candidate scale (amax 1e-8)",
        rng.normals(n, 1.0)
            .iter()
            .map(|x| x.clamp(-1.0, 1.0) * 1e-8)
            .collect(),
    ));
    v.push((
        "subnormal-scale group (amax ~1e-4)",
        rng.normals(n, 1.0)
            .iter()
            .map(|x| x.clamp(-2.0, 2.0) * 5e-5)
            .collect(),
    ));
    let mut edge = rng.normals(n, 1000.0);
    edge[5] = 300_000.0;
    v.push(("amax 3e5: some candidate scales overflow fp16", edge));
    let mut single = vec![0.0; n];
    single[n / 2 + 1] = -0.7;
    v.push(("single non-zero weight (-0.7 at index n/2+1)", single));
    v
}

fn describe(ty: PnType, name: &str, w: &[f32]) -> String {
    let mut s = format!("## {ty}: {name}\n");
    match quantize_row_ref(ty, w) {
        Err(e) => s += &format!("error: {e}\n"),
        Ok(bytes) => {
            assert_eq!(bytes.len(), BLOCK_BYTES);
            validate_row(ty, &bytes).expect("quantizer output validates");
            let d = half::f16::from_le_bytes([bytes[0], bytes[1]]);
            let naive = naive_quantize(ty, w);
            s += &format!(
                "bytes: {}\nd: {:#06x} = {:e} (winning m index: {:?})\ncodes: {:?}\n",
                hex(&bytes),
                d.to_bits(),
                d.to_f32(),
                naive.best,
                spec_codes(ty, &bytes)
            );
            let mut out = vec![0.0; w.len()];
            dequantize_row(ty, &bytes, &mut out).unwrap();
            let vals: Vec<String> = out.iter().map(|v| format!("{v:e}")).collect();
            s += &format!("decoded: [{}]\n", vals.join(", "));
        }
    }
    s
}

fn golden(ty: PnType) -> String {
    cases(ty)
        .iter()
        .map(|(name, w)| describe(ty, name, w))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn golden_pn3t() {
    insta::assert_snapshot!(golden(PnType::Pn3t));
}

#[test]
fn golden_pn4t() {
    insta::assert_snapshot!(golden(PnType::Pn4t));
}

#[test]
fn golden_too_large_for_f16_scale() {
    let mut w = vec![0.5f32; 80];
    w[17] = -2.0e6;
    insta::assert_snapshot!(quantize_row_ref(PnType::Pn3t, &w).unwrap_err().to_string());
    let mut w = vec![0.0f32; 64 * 3];
    w[64 * 2 + 9] = 2.5e6;
    insta::assert_snapshot!(quantize_row_ref(PnType::Pn4t, &w).unwrap_err().to_string());
}

#[test]
fn exact_tie_is_a_tie() {
    // pn3t, a = fp16(0.98) = 2007/2048: errors (4 - 4a)^2 + (v - a)^2 and (v - 1)^2 are equal for
    // v = (17a - 15)/2 = 3399/4096; every term has few bits, so the f64 sums are exact.
    // pn4t: (8 - 8a)^2 + (v - 2a)^2 = (v - 2)^2 for v = (4(1 + a) - 64(1 - a))/4 = 3399/2048.
    for ty in PnType::ALL {
        let (_, w) = cases(ty)
            .into_iter()
            .find(|c| c.0.starts_with("exact tie"))
            .unwrap();
        let r = naive_quantize(ty, &w);
        assert_eq!(r.errors[24], r.errors[25], "{ty}: m=0.98 and m=1.00 tie");
        let min = r
            .errors
            .iter()
            .flatten()
            .cloned()
            .fold(f64::INFINITY, f64::min);
        assert_eq!(r.errors[25], Some(min), "{ty}: the tie is the minimum");
        assert_eq!(r.best, Some(25), "{ty}: the larger m wins");
        let bytes = quantize_row_ref(ty, &w).unwrap();
        assert_eq!(
            u16::from_le_bytes([bytes[0], bytes[1]]),
            0xbc00,
            "{ty}: d = -1.0"
        );
    }
}
