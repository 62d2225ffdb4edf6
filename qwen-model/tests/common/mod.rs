//! Shared helpers of the model tests: test data paths and raw f32 files.
#![allow(dead_code)]

use std::path::PathBuf;

mod wrapped;
#[allow(unused_imports)] // not every test binary uses it
pub use wrapped::{Rot, Wrapped};

/// `tests/data/tiny-qwen35/<name>` at the workspace root.
pub fn tiny(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/tiny-qwen35")
        .join(name)
}

/// Reads a raw little-endian f32 file.
pub fn read_f32(path: &PathBuf) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Reads `{"tokens": [...]}`.
pub fn read_tokens(path: &PathBuf) -> Vec<u32> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let v: serde_json::Value = serde_json::from_str(&text).expect("tokens json");
    v["tokens"]
        .as_array()
        .expect("tokens array")
        .iter()
        .map(|t| t.as_u64().expect("id") as u32)
        .collect()
}

/// Max abs difference.
pub fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Index of the largest value.
pub fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

/// Gap between the largest and second largest value.
pub fn top2_gap(row: &[f32]) -> f32 {
    let b = argmax(row);
    let second = row
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != b)
        .map(|(_, &v)| v)
        .fold(f32::NEG_INFINITY, f32::max);
    row[b] - second
}

/// Asserts every row's argmax matches the reference's, except rows where the reference's top-2
/// gap is below `tie` (a numerical near-tie a 1e-5 error may flip). Returns the rows that differ.
pub fn assert_argmax(got: &[f32], want: &[f32], vocab: usize, tie: f32, what: &str) -> Vec<usize> {
    let mut flips = Vec::new();
    for (r, (g, w)) in got
        .chunks_exact(vocab)
        .zip(want.chunks_exact(vocab))
        .enumerate()
    {
        if argmax(g) != argmax(w) {
            assert!(
                top2_gap(w) < tie,
                "{what}: argmax differs at row {r} (reference gap {})",
                top2_gap(w)
            );
            flips.push(r);
        }
    }
    flips
}

/// Logits of tokens_b (150-token prefill, then one token at a time) with the given cache types.
pub fn logits_b(
    m: &qwen_model::Model<qwen_model::CpuBackend>,
    kt: qwen_model::KvCacheType,
    vt: qwen_model::KvCacheType,
) -> Vec<f32> {
    let tokens = read_tokens(&tiny("tokens_b.json"));
    let v = m.config.vocab;
    let mut state = m.new_state_with_kv_types(tokens.len(), kt, vt).unwrap();
    let mut ws = m.new_workspace(64).unwrap();
    let mut got = vec![0.0; tokens.len() * v];
    m.forward(
        &mut state,
        &mut ws,
        &tokens[..150],
        qwen_model::Outputs::all_logits(&mut got[..150 * v]),
    )
    .unwrap();
    for (i, &t) in tokens[150..].iter().enumerate() {
        let row = &mut got[(150 + i) * v..(151 + i) * v];
        m.forward(
            &mut state,
            &mut ws,
            &[t],
            qwen_model::Outputs::last_logits(row),
        )
        .unwrap();
    }
    got
}
