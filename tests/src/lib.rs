//! The pn workspace's shared test kit (`pn-tests`), and the home of its cross-crate integration
//! tests (`tests/tests/`: qwen-model's CUDA backend against its CPU backend, pn-kernels' chunked
//! delta rule against qwen-model's; each test there exercises several crates together).
//!
//! Every crate's integration tests take this crate as a dev-dependency (a dev-dependency cycle
//! cargo allows: the test binaries link the one library under test), so no test file redefines
//! these helpers:
//!
//! - [`paths`]: `tests/data/<folder>/<file>` ([`data`], [`tiny`], [`data_dir`]), honouring
//!   `PN_REPO_ROOT` for GPU test binaries run from a copied checkout (`scripts/gpu-check.sh`);
//!   fresh output directories ([`scratch_dir`]).
//! - [`oracle`]: readers of the oracle files: little-endian f32 logits ([`read_f32`]), token JSON
//!   ([`read_tokens`], [`ids`]), JSON and JSONL ([`read_json`], [`jsonl`]); the writer side
//!   [`f32_le_bytes`]. [`try_read_f32`], [`try_read_json`] and [`try_ids`] return a typed
//!   [`DataError`] (the xtask reports it); the plain forms panic with it, naming the file.
//! - [`compare`]: [`max_abs`] (NaN counts as infinite), [`argmax`], [`top2_gap`],
//!   [`assert_argmax`], [`f32_bits`].
//! - [`random`]: seeded test data ([`rng`], [`random_vec`], [`seeded_vec`], [`random_signed`]).
//! - [`ggml`]: random stock-type (GGML) rows with finite scales, and `sum |w x|`.
//! - `model` (feature `model`, for qwen-model's tests): `model::prefill_then_decode`, the
//!   oracle's "prefill, then one token at a time" logits.
//! - `engine` (feature `engine`, for pn-runtime's tests): the process-wide cached demo and tiny
//!   engines (`engine::demo_engine`, `engine::tiny_engine`, ...) and greedy decoding through a
//!   session (`engine::greedy_tokens`).
//!
//! The features keep the crates below qwen-model (gguf-io, pn-format, pn-kernels) testing without
//! building it.
//!
//! ```
//! use pn_tests::{max_abs, read_f32, read_tokens, tiny};
//!
//! let want = read_f32(&tiny("logits_a.f32"));
//! let tokens = read_tokens(&tiny("tokens_a.json"));
//! assert_eq!(want.len() % tokens.len(), 0); // one vocab-long row per token
//! assert_eq!(max_abs(&want, &want), 0.0);
//! ```
#![warn(missing_docs)]

pub mod compare;
pub mod ggml;
pub mod oracle;
pub mod paths;
pub mod random;

#[cfg(feature = "engine")]
pub mod engine;
#[cfg(feature = "model")]
pub mod model;

pub use compare::{argmax, assert_argmax, f32_bits, max_abs, top2_gap};
pub use oracle::{
    f32_le_bytes, ids, jsonl, read_f32, read_json, read_tokens, try_ids, try_read_f32,
    try_read_json, DataError,
};
pub use paths::{data, data_dir, repo_root, scratch_dir, tiny, DEMO, TINY};
pub use random::{random_signed, random_vec, rng, seeded_vec};
