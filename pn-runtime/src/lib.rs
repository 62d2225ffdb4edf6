//! The engine: loading and validating models, sessions, sampling, speculative decoding, the
//! tokenizer and chat template, the CUDA backend, and the `pn` command-line program.
//!
//! Generating text in a Rust program (this example runs the demo model that ships in the
//! repository; pass the path of any `qwen35` GGUF instead):
//!
//! ```
//! use pn_runtime::{Engine, EngineOptions, SamplingParams, StopConditions};
//!
//! let engine = Engine::load(pn_runtime::DEMO_MODEL_PATH, EngineOptions::default())?;
//! let mut session = engine.session()?;
//! let stop = StopConditions::max_tokens(8).with_strings(["\n\n"]);
//! for event in session.generate("def fibonacci(n):", SamplingParams::greedy(), stop)? {
//!     print!("{}", event?.text);
//! }
//! # Ok::<(), pn_runtime::EngineError>(())
//! ```
//!
//! Chat-level helpers take messages and go through the model's chat template:
//! [`Session::chat`](engine::Session::chat) with [`ChatMessage`](chat_template::ChatMessage)s.
//!
//! An [`Engine`] is a cheap handle on the loaded model (clone it freely); a [`Session`] owns
//! one, so it can move to another thread. The crate's `examples/` show a minimal embed
//! (`embed`), a chat loop over stdin (`chat`) and cancelling a generation from another thread
//! (`cancel`): `cargo run -p pn-runtime --example chat -- MODEL.gguf`.
//!
//! # Cargo features
//!
//! - `server` (default): [`server`], the OpenAI-compatible HTTP server (`pn serve`). Brings in
//!   axum, tokio, serde_path_to_error and futures-util.
//! - `cli` (default): the crates only the `pn` program uses: clap (arguments), indicatif
//!   (progress bars) and ctrlc (Ctrl-C clean-up of `pn quantize`). The `pn` binary needs both
//!   features.
//!
//! A program that only generates text embeds the engine without either:
//! `pn-runtime = { version = "...", default-features = false }`. Everything else (engine,
//! sampling, speculative decoding, tokenizer, chat templates, quantization, the CUDA backend)
//! is always there; progress of long operations comes back through callbacks.
pub mod engine;
pub use engine::{
    CancelToken, Device, Engine, EngineError, EngineOptions, FinishReason, Session, StopConditions,
    TokenEvent, DEMO_MODEL_F16_PATH, DEMO_MODEL_PATH,
};
pub use sampling::SamplingParams;
pub mod chat_template;
pub mod constrain;
pub mod convert;
pub mod quantize;
pub mod sampling;
#[cfg(feature = "server")]
pub mod server;
pub mod speculative;
pub mod tokenizer;
