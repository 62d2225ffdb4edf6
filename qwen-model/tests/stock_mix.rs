//! A GGUF mixing the stock types llama.cpp's Q3_K_M writes for a model whose widths are not all
//! multiples of 256 (Q3_K / Q4_K where the row length allows a 256-superblock, Q5_0 / Q5_1 /
//! Q4_0 / Q8_0 elsewhere), made from the tiny F16 model with gguf-io's quantizers: it loads and
//! runs on the CPU; its logits equal those of its own dequantized F32 twin up to f32 rounding
//! (the quantized kernels compute the same function), every matrix's error is within its type's
//! bound, and its logits stay within the error that noise of the same size gives the F16 model.
//!
//! The tiny model has random weights and amplifies any weight error through its 9 layers (all
//! matrices in Q8_0 already move its logits by 0.1 relative RMS; the Q3_K_M-like mix by ~0.76,
//! as much as the noise of equal size): hence a noise-calibrated bound rather than a fixed one.

use gguf_io::quants::{dequantize_row, quantize_row};
use gguf_io::{GgmlType, GgufFile};
use pn_tests::model::prefill_then_decode;
use pn_tests::{read_tokens, tiny};
use qwen_model::{CpuBackend, Model};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeSet;
use std::sync::Arc;

/// The type a Q3_K_M-like mix gives a matrix with rows of `k` elements (its `i`-th of that
/// kind, so that every fallback type is used).
fn mix_type(k: u64, i: usize) -> GgmlType {
    use GgmlType::*;
    if k.is_multiple_of(256) {
        [Q3K, Q4K][i % 2]
    } else {
        [Q5_0, Q5_1, Q4_0, Q8_0][i % 4]
    }
}

/// How [`build`] stores each re-quantized matrix.
#[derive(Clone, Copy, PartialEq)]
enum Store {
    /// In its quantized type.
    Quantized,
    /// Its decoded values, as F32.
    Twin,
    /// The F16 values plus seeded noise of the quantization error's RMS, as F32.
    Noise,
}

/// Relative RMS error each mix type stays within on these weights (those of gguf-io's
/// quantizer tests, `gguf-io/tests/quants.rs`, for Q8_0/Q4_K/Q3_K; Q5 / Q4_0 in between).
fn type_bound(ty: GgmlType) -> f32 {
    use GgmlType::*;
    match ty {
        Q8_0 => 0.01,
        Q5_0 | Q5_1 => 0.06,
        Q4_0 | Q4K => 0.12,
        _ => 0.25,
    }
}

/// The tiny model with every F16 matrix re-quantized by [`mix_type`], stored as `store` says.
/// Returns the file and the types used.
fn build(store: Store) -> (GgufFile, BTreeSet<GgmlType>) {
    let src = GgufFile::open(tiny("model-f16.gguf")).expect("tiny model");
    let mut used = BTreeSet::new();
    let (mut n_fallback, mut n_k) = (0, 0);
    let mut rng = StdRng::seed_from_u64(18);
    let mut tensors: Vec<(String, GgmlType, Vec<u64>, Vec<u8>)> = Vec::new();
    for t in src.tensors() {
        let (ty, bytes) = if t.ty == GgmlType::F16 && t.dims.len() == 2 {
            let k = t.dims[0];
            let counter = if k.is_multiple_of(256) {
                &mut n_k
            } else {
                &mut n_fallback
            };
            let ty = mix_type(k, *counter);
            *counter += 1;
            let mut x = vec![0f32; t.n_elements() as usize];
            dequantize_row(GgmlType::F16, t.bytes, &mut x).unwrap();
            let mut q = Vec::new();
            quantize_row(ty, &x, &mut q).unwrap();
            used.insert(ty);
            let mut y = vec![0f32; x.len()];
            dequantize_row(ty, &q, &mut y).unwrap();
            let err = rms(x.iter().zip(&y).map(|(a, b)| a - b));
            let rel = err / rms(x.iter().copied());
            assert!(rel <= type_bound(ty), "{}: {ty} error {rel}", t.name);
            let mut f = Vec::new();
            match store {
                Store::Quantized => (ty, q),
                Store::Twin => {
                    quantize_row(GgmlType::F32, &y, &mut f).unwrap();
                    (GgmlType::F32, f)
                }
                Store::Noise => {
                    // Uniform noise of RMS `err`: half-width sqrt(3) err.
                    let a = 3f32.sqrt() * err;
                    let z: Vec<f32> = x.iter().map(|v| v + rng.random_range(-a..=a)).collect();
                    quantize_row(GgmlType::F32, &z, &mut f).unwrap();
                    (GgmlType::F32, f)
                }
            }
        } else {
            (t.ty, t.bytes.to_vec())
        };
        tensors.push((t.name.to_string(), ty, t.dims.to_vec(), bytes));
    }
    let specs: Vec<gguf_io::TensorSpec<'_>> = tensors
        .iter()
        .map(|(n, ty, d, b)| (n.as_str(), *ty, d.as_slice(), b.as_slice()))
        .collect();
    let bytes = gguf_io::write_gguf_to_vec(src.metadata(), &specs).expect("write gguf");
    (GgufFile::from_bytes(bytes).expect("parse"), used)
}

fn logits(file: GgufFile, tokens: &[u32]) -> Vec<f32> {
    let m = Model::from_file(Arc::new(file), CpuBackend::new(2)).expect("load");
    let mut state = m.new_state(tokens.len()).unwrap();
    // A prefill of 12 rows (the decode-once path), then single-token decode (the fused dots).
    prefill_then_decode(&m, &mut state, tokens, 12)
}

fn rms(v: impl Iterator<Item = f32>) -> f32 {
    let (s, n) = v.fold((0f64, 0usize), |(s, n), x| {
        (s + f64::from(x) * f64::from(x), n + 1)
    });
    (s / n as f64).sqrt() as f32
}

#[test]
fn q3_k_m_like_mix_loads_and_runs_within_its_quantization_error() {
    use GgmlType::*;
    let tokens: Vec<u32> = read_tokens(&tiny("tokens_b.json"))
        .into_iter()
        .take(24)
        .collect();
    let (mixed, used) = build(Store::Quantized);
    assert_eq!(
        used,
        BTreeSet::from([Q4_0, Q5_0, Q5_1, Q8_0, Q3K, Q4K]),
        "types in the mix"
    );
    for t in mixed.tensor_infos() {
        assert_ne!(t.ty, F16, "{} left in F16", t.name);
    }
    let got = logits(mixed, &tokens);
    let twin = logits(build(Store::Twin).0, &tokens);
    let noise = logits(build(Store::Noise).0, &tokens);
    let f16 = logits(GgufFile::open(tiny("model-f16.gguf")).unwrap(), &tokens);
    assert!(got.iter().all(|v| v.is_finite()));

    let scale = rms(f16.iter().copied());
    let vs_twin = rms(got.iter().zip(&twin).map(|(a, b)| a - b)) / scale;
    let vs_f16 = rms(got.iter().zip(&f16).map(|(a, b)| a - b)) / scale;
    let noise_vs_f16 = rms(noise.iter().zip(&f16).map(|(a, b)| a - b)) / scale;
    eprintln!(
        "relative rms logit error: mix vs its f32 twin {vs_twin:.2e}, mix vs f16 {vs_f16:.3}, \
         equal-size noise vs f16 {noise_vs_f16:.3}"
    );
    // The quantized kernels compute the twin's function: f32 summation order only.
    assert!(vs_twin <= 1e-4, "mix vs dequantized twin: {vs_twin}");
    // Quantization error: what weight errors of this size do to this model, no more.
    assert!(
        vs_f16 > 0.0 && vs_f16 <= 1.25 * noise_vs_f16,
        "mix vs f16: {vs_f16}, noise of equal size: {noise_vs_f16}"
    );
}
