//! Shared helpers of pn-runtime's tests: one tokenizer per test binary (building it from the
//! 248k-token vocabulary takes a moment) and running the `pn` binary. Data paths and the JSON(L) readers are the
//! shared kit's (`pn_tests`), re-exported for these tests.
#![allow(dead_code)]

use pn_runtime::tokenizer::Tokenizer;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;

#[allow(unused_imports)] // not every test binary uses each
pub use pn_tests::{data, ids, jsonl};

/// The real Qwen3.5 vocabulary (vocab-only GGUF).
pub fn vocab_path() -> PathBuf {
    data("qwen-tokenizer", "vocab-qwen35.gguf")
}

/// The Qwen3.5 tokenizer, loaded once.
pub fn qwen() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| Tokenizer::open(vocab_path()).expect("vocab-qwen35.gguf loads"))
}

/// Runs the built `pn` binary with `args` and waits for it.
pub fn pn(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pn"))
        .args(args)
        .output()
        .expect("run pn")
}
