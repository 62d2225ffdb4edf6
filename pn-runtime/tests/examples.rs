//! The programs in `examples/` run here on the demo model, so what they show keeps working
//! (`cargo test` also builds them as examples).

#[path = "../examples/embed.rs"]
#[allow(dead_code)] // its `main`
mod embed;

#[path = "../examples/chat.rs"]
#[allow(dead_code)]
mod chat;

#[path = "../examples/cancel.rs"]
#[allow(dead_code)]
mod cancel;

use pn_runtime::{FinishReason, DEMO_MODEL_PATH};
use std::time::Duration;

#[test]
fn the_minimal_embed_streams_a_completion() {
    let mut out = Vec::new();
    let text = embed::complete(DEMO_MODEL_PATH, "def fibonacci(n):", 16, &mut out).unwrap();
    assert!(!text.trim().is_empty());
    assert_eq!(String::from_utf8(out).unwrap(), text);
}

#[test]
fn the_chat_loop_answers_each_line_in_one_conversation() {
    let engine = pn_tests::engine::demo_engine();
    let mut input = std::io::Cursor::new("print a list\nnow sort it\n\nnot read\n");
    let mut out = Vec::new();
    let messages = chat::chat(engine, &mut input, &mut out, 8).unwrap();
    let roles: Vec<&str> = messages.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "user", "assistant"]);
    assert_eq!(messages[3].content, "now sort it");
    let out = String::from_utf8(out).unwrap();
    assert_eq!(out.matches("> ").count(), 2, "{out}");
    assert!(out.contains(&messages[4].content), "{out}");
}

#[test]
fn the_cancellation_example_stops_the_generation() {
    let engine = pn_tests::engine::demo_engine();
    let (n, reason) = cancel::generate_then_cancel(engine, Duration::from_millis(100)).unwrap();
    assert_eq!(reason, FinishReason::Cancelled, "after {n} tokens");
    assert!(n < engine.context(), "{n} tokens");
}
