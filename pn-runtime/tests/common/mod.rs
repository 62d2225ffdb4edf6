//! Shared helpers of the tokenizer/template tests: test-data paths and one tokenizer per test
//! binary (building it from the 248k-token vocabulary takes a moment).
#![allow(dead_code)]

use pn_runtime::tokenizer::Tokenizer;
use std::path::PathBuf;
use std::sync::OnceLock;

/// `tests/data/<folder>/<file>` at the workspace root.
pub fn data(folder: &str, file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data")
        .join(folder)
        .join(file)
}

/// The real Qwen3.5 vocabulary (vocab-only GGUF).
pub fn vocab_path() -> PathBuf {
    data("qwen-tokenizer", "vocab-qwen35.gguf")
}

/// The Qwen3.5 tokenizer, loaded once.
pub fn qwen() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| Tokenizer::open(vocab_path()).expect("vocab-qwen35.gguf loads"))
}

/// The lines of a JSONL file as JSON values.
pub fn jsonl(path: PathBuf) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("valid JSON line"))
        .collect()
}

/// A JSON array of ids as `u32`s.
pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("array of ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}
