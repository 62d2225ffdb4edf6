//! The smallest embed: load a model, open a session, stream a completion.
//!
//! `cargo run -p pn-runtime --example embed -- [MODEL.gguf] [PROMPT]` (default: the demo model
//! that ships in the repository and a line of Python). A library that only generates text
//! needs `pn-runtime = { version = "0.1", default-features = false }`.

use pn_runtime::{Engine, EngineOptions, SamplingParams, StopConditions};
use std::io::Write;

/// Completes `prompt` with the model at `model` (greedy, at most `max_tokens` tokens), writing
/// the text to `out` as it streams; returns the text.
pub fn complete(
    model: &str,
    prompt: &str,
    max_tokens: usize,
    out: &mut dyn Write,
) -> Result<String, Box<dyn std::error::Error>> {
    let engine = Engine::load(model, EngineOptions::default())?;
    let mut session = engine.session()?;
    let stop = StopConditions::max_tokens(max_tokens).with_strings(["\n\n"]);
    let mut text = String::new();
    for event in session.generate(prompt, SamplingParams::greedy(), stop)? {
        let event = event?;
        out.write_all(event.text.as_bytes())?;
        out.flush()?;
        text.push_str(&event.text);
    }
    Ok(text)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let model = args
        .next()
        .unwrap_or_else(|| pn_runtime::DEMO_MODEL_PATH.to_string());
    let prompt = args
        .next()
        .unwrap_or_else(|| "def fibonacci(n):".to_string());
    print!("{prompt}");
    complete(&model, &prompt, 64, &mut std::io::stdout())?;
    println!();
    Ok(())
}
