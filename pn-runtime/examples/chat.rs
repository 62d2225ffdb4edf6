//! A chat loop: each line read from stdin is a user message; the reply streams to stdout and
//! the conversation goes on in the same session (only the new tokens are processed).
//!
//! `cargo run -p pn-runtime --example chat -- [MODEL.gguf]` (default: the demo model, which
//! knows Python rather than conversation; use an instruction-tuned Qwen3.5/3.8 GGUF for real
//! chat). An empty line or end of input ends the chat.

use pn_runtime::chat_template::ChatMessage;
use pn_runtime::{Engine, EngineOptions, SamplingParams, StopConditions};
use std::io::{BufRead, Write};

/// Runs the chat: user lines from `input`, replies to `out` (each after `> `, ending with a
/// newline). Returns the conversation.
pub fn chat(
    engine: &Engine,
    input: &mut dyn BufRead,
    out: &mut dyn Write,
    max_tokens: usize,
) -> Result<Vec<ChatMessage>, Box<dyn std::error::Error>> {
    let mut session = engine.session()?;
    let mut messages = vec![ChatMessage::system("You are a helpful assistant.")];
    let mut line = String::new();
    loop {
        line.clear();
        if input.read_line(&mut line)? == 0 || line.trim().is_empty() {
            return Ok(messages);
        }
        messages.push(ChatMessage::user(line.trim_end()));
        let params = SamplingParams {
            seed: 1,
            ..SamplingParams::default()
        };
        let mut reply = String::new();
        write!(out, "> ")?;
        for event in session.chat(&messages, params, StopConditions::max_tokens(max_tokens))? {
            let event = event?;
            write!(out, "{}", event.text)?;
            out.flush()?;
            reply.push_str(&event.text);
        }
        writeln!(out)?;
        messages.push(ChatMessage::assistant(reply));
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let model = std::env::args()
        .nth(1)
        .unwrap_or_else(|| pn_runtime::DEMO_MODEL_PATH.to_string());
    let engine = Engine::load(&model, EngineOptions::default())?;
    eprintln!("chatting with {model}; an empty line ends");
    chat(
        &engine,
        &mut std::io::stdin().lock(),
        &mut std::io::stdout(),
        256,
    )?;
    Ok(())
}
