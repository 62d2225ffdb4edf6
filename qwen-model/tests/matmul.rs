//! Quantized matrix products, embedding gather and the Hadamard rotation of the CPU backend,
//! against naive decode-then-f64-dot references written here, for every weight type.
#![allow(clippy::needless_range_loop)] // the naive references index like the formulas

use gguf_io::GgmlType;
use qwen_model::backend::{Backend, WeightSource};
use qwen_model::cpu::CpuWeight;
use qwen_model::CpuBackend;
// `randn`: the kit's `random_signed` under this file's short name.
use pn_tests::random_signed as randn;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A multiple of every block size involved (256 for K-quants, 80 for pn3t, 64 for pn4t).
const K: usize = 1280;
const ROWS: usize = 37;

/// The product `w . x` in f64 and its magnitude `sum |w_i x_i|` (the tolerances' scale).
fn exact_dot(w: &[f32], x: &[f32]) -> (f64, f64) {
    w.iter().zip(x).fold((0.0, 0.0), |(s, m), (&a, &b)| {
        let p = a as f64 * b as f64;
        (s + p, m + p.abs())
    })
}

/// `ROWS x K` random weights of type `ty` (`encode`), loaded on `be`: the bytes and the weight.
fn random_weight(be: &CpuBackend, ty: GgmlType, rng: &mut StdRng) -> (Vec<u8>, CpuWeight) {
    let bytes = encode(ty, rng);
    let w = be.load_weight(&source(ty, &bytes)).unwrap();
    (bytes, w)
}

/// `bytes` as the `ROWS x K` weight "w" of type `ty`.
fn source(ty: GgmlType, bytes: &[u8]) -> WeightSource<'_> {
    WeightSource {
        name: "w",
        ty,
        rows: ROWS,
        cols: K,
        bytes,
        rotated: false,
        rotation_block: 0,
        file: None,
    }
}

/// Encodes `ROWS x K` random weights as `ty` (hand-built blocks for the types gguf-io does not
/// quantize).
fn encode(ty: GgmlType, rng: &mut StdRng) -> Vec<u8> {
    let w = randn(rng, ROWS * K, 0.05);
    let mut out = Vec::new();
    match ty {
        GgmlType::Pn3t | GgmlType::Pn4t => {
            let pt = if ty == GgmlType::Pn3t {
                pn_format::PnType::Pn3t
            } else {
                pn_format::PnType::Pn4t
            };
            for r in w.chunks_exact(K) {
                out.extend(pn_format::quantize_row_ref(pt, r).unwrap());
            }
        }
        GgmlType::Q4_0 => {
            // Block: f16 scale, 16 bytes of nibbles.
            for _ in 0..ROWS * K / 32 {
                out.extend(half::f16::from_f32(rng.random_range(0.001f32..0.01)).to_le_bytes());
                out.extend((0..16).map(|_| rng.random::<u8>()));
            }
        }
        GgmlType::Q5K => {
            // Block: d, dmin (f16), 12 bytes of 6-bit scales/mins, 32 bytes high bits, 128 nibbles.
            for _ in 0..ROWS * K / 256 {
                out.extend(half::f16::from_f32(rng.random_range(0.0005f32..0.002)).to_le_bytes());
                out.extend(half::f16::from_f32(rng.random_range(0.0005f32..0.002)).to_le_bytes());
                out.extend((0..12 + 32 + 128).map(|_| rng.random::<u8>()));
            }
        }
        _ => {
            for r in w.chunks_exact(K) {
                gguf_io::quants::quantize_row(ty, r, &mut out).unwrap();
            }
        }
    }
    assert_eq!(
        out.len() as u64,
        ty.row_bytes(K as u64).unwrap() * ROWS as u64
    );
    out
}

fn decode_row(ty: GgmlType, row: &[u8]) -> Vec<f32> {
    let mut dst = vec![0.0; K];
    match ty {
        GgmlType::Pn3t => {
            pn_format::dequantize_row(pn_format::PnType::Pn3t, row, &mut dst).unwrap()
        }
        GgmlType::Pn4t => {
            pn_format::dequantize_row(pn_format::PnType::Pn4t, row, &mut dst).unwrap()
        }
        _ => gguf_io::quants::dequantize_row(ty, row, &mut dst).unwrap(),
    }
    dst
}

const TYPES: [GgmlType; 11] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::Pn3t,
    GgmlType::Pn4t,
];

#[test]
fn matmul_every_type_matches_naive() {
    let be = CpuBackend::new(2);
    let mut rng = StdRng::seed_from_u64(11);
    for ty in TYPES {
        let (bytes, w) = random_weight(&be, ty, &mut rng);
        let rb = bytes.len() / ROWS;
        // 1..=8 rows take the fused multi-vector dots (prepared activations for PN; one call
        // per 8 rows), 9 and more the decode-once path: all must agree with the reference.
        for t in [1usize, 2, 3, 5, 8, 9, 12] {
            let x = randn(&mut rng, t * K, 1.0);
            let mut y = vec![0.0f32; t * ROWS];
            let mut y2 = vec![0.0f32; t * ROWS];
            be.matmul(&x, t, &mut [(&w, &mut y), (&w, &mut y2)])
                .unwrap();
            assert_eq!(y, y2, "{ty:?}: two outputs of one call differ");
            for r in 0..ROWS {
                let wr = decode_row(ty, &bytes[r * rb..(r + 1) * rb]);
                for ti in 0..t {
                    let xr = &x[ti * K..(ti + 1) * K];
                    let (want, mag) = exact_dot(&wr, xr);
                    let got = y[ti * ROWS + r] as f64;
                    // f32 accumulation; the PN int16 activation path adds <= 2^-16 relative.
                    let tol = 1e-5 + 1e-4 * mag;
                    assert!(
                        (got - want).abs() <= tol,
                        "{ty:?} t={t} row {r}: {got} vs {want} (tol {tol})"
                    );
                }
            }
        }
    }
}

fn naive_hadamard(x: &[f32], r: usize) -> Vec<f32> {
    let s = 1.0 / (r as f64).sqrt();
    let mut out = vec![0.0f32; x.len()];
    for (blk, ob) in x.chunks_exact(r).zip(out.chunks_exact_mut(r)) {
        for i in 0..r {
            let v: f64 = (0..r)
                .map(|j| {
                    if (i & j).count_ones() % 2 == 0 {
                        blk[j] as f64
                    } else {
                        -(blk[j] as f64)
                    }
                })
                .sum();
            ob[i] = (v * s) as f32;
        }
    }
    out
}

#[test]
fn hadamard_matches_sylvester_matrix() {
    let be = CpuBackend::new(1);
    let mut rng = StdRng::seed_from_u64(12);
    for r in [64usize, 256] {
        let x = randn(&mut rng, 3 * r, 1.0);
        let mut got = x.clone();
        be.hadamard(&mut got, x.len(), r).unwrap();
        let want = naive_hadamard(&x, r);
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() < 1e-5);
        }
    }
}

#[test]
fn embed_gathers_rows_and_unrotates_pn() {
    let be = CpuBackend::new(1);
    let mut rng = StdRng::seed_from_u64(13);
    for (ty, rotated) in [
        (GgmlType::F16, false),
        (GgmlType::Q8_0, false),
        (GgmlType::Pn4t, true),
    ] {
        let bytes = encode(ty, &mut rng);
        let rb = bytes.len() / ROWS;
        let src = WeightSource {
            name: "token_embd.weight",
            ty,
            rows: ROWS,
            cols: K,
            bytes: &bytes,
            rotated,
            rotation_block: 64,
            file: None,
        };
        let w = be.load_weight(&src).unwrap();
        let tokens = [3u32, 0, 36, 3];
        let mut out = vec![0.0; tokens.len() * K];
        be.embed(&w, &tokens, &mut out).unwrap();
        for (i, &t) in tokens.iter().enumerate() {
            let row = decode_row(ty, &bytes[t as usize * rb..(t as usize + 1) * rb]);
            // A rotated table stores E H: the gather applies H again to get E back.
            let want = if rotated {
                naive_hadamard(&row, 64)
            } else {
                row
            };
            for (a, b) in out[i * K..(i + 1) * K].iter().zip(&want) {
                assert!((a - b).abs() < 1e-5, "{ty:?} token {t}");
            }
        }
    }
}

#[test]
fn unsupported_type_and_short_data_are_errors() {
    let be = CpuBackend::new(1);
    let bytes = vec![0u8; 10];
    let mut src = WeightSource {
        name: "blk.0.ffn_up.weight",
        ty: GgmlType::F16,
        rows: 2,
        cols: 32,
        bytes: &bytes,
        rotated: false,
        rotation_block: 0,
        file: None,
    };
    let e = be
        .load_weight(&src)
        .err()
        .expect("short data must fail")
        .to_string();
    assert!(e.contains("blk.0.ffn_up.weight"), "{e}");
    // Q2_K was the refused type here until every stock type llama.cpp writes became loadable
    // (issue #18); MXFP4 has no decoder.
    src.ty = GgmlType::Mxfp4;
    src.cols = 256;
    let e = be
        .load_weight(&src)
        .err()
        .expect("mxfp4 must fail")
        .to_string();
    assert!(
        e.contains("blk.0.ffn_up.weight") && e.contains("mxfp4"),
        "{e}"
    );
}

/// The fused multi-vector path and the decode-once path agree for every row count around the
/// switch-over, whichever threshold is set.
#[test]
fn fused_and_decoded_paths_agree() {
    let mut rng = StdRng::seed_from_u64(14);
    for ty in [GgmlType::Pn3t, GgmlType::Q4K, GgmlType::F16, GgmlType::Q8_0] {
        let bytes = encode(ty, &mut rng);
        let src = source(ty, &bytes);
        let mut fused = CpuBackend::new(2);
        fused.set_decode_rows_min(usize::MAX);
        let mut decoded = CpuBackend::new(2);
        decoded.set_decode_rows_min(1);
        let (wf, wd) = (
            fused.load_weight(&src).unwrap(),
            decoded.load_weight(&src).unwrap(),
        );
        for t in [2usize, 5, 11] {
            let x = randn(&mut rng, t * K, 1.0);
            let mut yf = vec![0.0f32; t * ROWS];
            let mut yd = vec![0.0f32; t * ROWS];
            fused.matmul(&x, t, &mut [(&wf, &mut yf)]).unwrap();
            decoded.matmul(&x, t, &mut [(&wd, &mut yd)]).unwrap();
            for (i, (a, b)) in yf.iter().zip(&yd).enumerate() {
                // The PN fused path uses int16 activations (<= 2^-16 relative per block).
                assert!(
                    (a - b).abs() <= 1e-3 * (1.0 + b.abs()),
                    "{ty:?} t={t} output {i}: fused {a} vs decoded {b}"
                );
            }
        }
    }
}

/// A pass of 2..8 rows (the MTP verify) through Q4_K / Q8_0 weights gives every row the bits
/// of a 1-row decode step on it (int16 activations, each weight block unpacked once for all
/// rows), so verifying a draft judges it by decode's logits.
#[test]
fn stock_verify_rows_equal_single_row_decode() {
    let be = CpuBackend::new(2);
    let mut rng = StdRng::seed_from_u64(15);
    for ty in [GgmlType::Q4K, GgmlType::Q8_0] {
        if !gguf_io::quants::has_i16_kernel(ty) {
            // No int16 kernel here (PN_ISA=scalar, no AVX2): both paths take f32 activations.
            continue;
        }
        let (_, w) = random_weight(&be, ty, &mut rng);
        for t in [2usize, 3, 5, 8] {
            let x = randn(&mut rng, t * K, 1.0);
            let mut y = vec![0.0f32; t * ROWS];
            be.matmul(&x, t, &mut [(&w, &mut y)]).unwrap();
            for ti in 0..t {
                let mut one = vec![0.0f32; ROWS];
                let xt = x[ti * K..(ti + 1) * K].to_vec();
                be.matmul(&xt, 1, &mut [(&w, &mut one)]).unwrap();
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&y[ti * ROWS..(ti + 1) * ROWS]),
                    bits(&one),
                    "{ty:?} t={t} row {ti}"
                );
            }
        }
    }
}

/// Rows declared state-only (`Backend::set_state_rows`) may take int8 tile activations: each
/// stays within `1e-5 + 1e-4 * sum|w x|` plus the int8 bound (`sum |w| amax / 254` per block)
/// of the exact product; the other rows of the same call equal a call of those rows alone
/// (int16: the same integer block sums, f32 order apart), so a logits row does not depend on
/// the state-only rows beside it. A declaration of another row count is ignored (int16).
#[test]
fn state_only_rows_take_their_own_precision() {
    let be = CpuBackend::new(2);
    let mut rng = StdRng::seed_from_u64(21);
    for ty in [GgmlType::Pn3t, GgmlType::Pn4t] {
        let bpw = if ty == GgmlType::Pn3t { 80 } else { 64 };
        let (bytes, w) = random_weight(&be, ty, &mut rng);
        let rb = bytes.len() / ROWS;
        // Patterns: a prompt chunk with its logits row last, a decode row beside a chunk,
        // verify rows beside a chunk, one state-only row, and a mismatched declaration.
        let patterns: [(usize, Vec<bool>); 5] = [
            (20, (0..20).map(|t| t != 19).collect()),
            (18, (0..18).map(|t| t != 0).collect()),
            (25, (0..25).map(|t| !(3..6).contains(&t)).collect()),
            (1, vec![true]),
            (12, vec![true; 5]),
        ];
        for (t, state_only) in patterns {
            let x = randn(&mut rng, t * K, 1.0);
            be.set_state_rows(&mut state_only.iter().copied());
            let mut y = vec![0.0f32; t * ROWS];
            be.matmul(&x, t, &mut [(&w, &mut y)]).unwrap();
            let declared = state_only.len() == t;
            let logits_rows: Vec<usize> = (0..t).filter(|&i| !declared || !state_only[i]).collect();
            // The logits rows alone, in one call with nothing declared.
            be.set_state_rows(&mut std::iter::empty());
            let xs: Vec<f32> = logits_rows
                .iter()
                .flat_map(|&i| x[i * K..(i + 1) * K].iter().copied())
                .collect();
            let mut alone = vec![0.0f32; logits_rows.len() * ROWS];
            if !logits_rows.is_empty() {
                be.matmul(&xs, logits_rows.len(), &mut [(&w, &mut alone)])
                    .unwrap();
            }
            for r in 0..ROWS {
                let wr = decode_row(ty, &bytes[r * rb..(r + 1) * rb]);
                for ti in 0..t {
                    let xr = &x[ti * K..(ti + 1) * K];
                    let (want, mag) = exact_dot(&wr, xr);
                    let int8: f64 = wr
                        .chunks_exact(bpw)
                        .zip(xr.chunks_exact(bpw))
                        .map(|(wb, xb)| {
                            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
                            wb.iter().map(|&a| (a as f64).abs()).sum::<f64>() * amax / 254.0
                        })
                        .sum();
                    let got = y[ti * ROWS + r] as f64;
                    let tol = 1e-5 + 1e-4 * mag + int8;
                    assert!(
                        (got - want).abs() <= tol,
                        "{ty:?} t={t} row {r} input {ti}: {got} vs {want} (tol {tol})"
                    );
                    if let Some(j) = logits_rows.iter().position(|&i| i == ti) {
                        let a = alone[j * ROWS + r];
                        assert!(
                            (got as f32 - a).abs() <= 1e-5 * (1.0 + mag as f32),
                            "{ty:?} t={t} logits row {ti}, weight row {r}: {got} vs alone {a}"
                        );
                    }
                }
            }
        }
    }
}
