//! Cancelling a generation from another thread: the generation runs on a worker thread (the
//! session owns its handle to the engine, so it moves there), and the main thread cancels it
//! through a `CancelToken`; the worker stops within one token and reports
//! `FinishReason::Cancelled`.
//!
//! `cargo run -p pn-runtime --example cancel -- [MODEL.gguf] [MILLISECONDS]` (default: the
//! demo model, cancel after 200 ms).

use pn_runtime::{
    CancelToken, Engine, EngineOptions, FinishReason, SamplingParams, StopConditions,
};
use std::time::Duration;

/// Starts an unbounded generation on a thread, cancels it after `after`, and returns the
/// tokens it made and why it finished.
pub fn generate_then_cancel(
    engine: &Engine,
    after: Duration,
) -> Result<(usize, FinishReason), Box<dyn std::error::Error>> {
    let cancel = CancelToken::new();
    let mut session = engine.session()?;
    let stop = StopConditions {
        // No token limit and no end token: only the cancellation (or a full context) ends it.
        ignore_eog: true,
        cancel: Some(cancel.clone()),
        ..StopConditions::default()
    };
    let worker = std::thread::spawn(move || -> Result<_, pn_runtime::EngineError> {
        let mut generation = session.generate("import", SamplingParams::greedy(), stop)?;
        let mut n = 0;
        for event in generation.by_ref() {
            n += usize::from(event?.token.is_some());
        }
        Ok((n, generation.finish_reason().cloned()))
    });
    std::thread::sleep(after);
    cancel.cancel();
    let (n, reason) = worker
        .join()
        .map_err(|_| "the generation thread panicked")??;
    Ok((n, reason.ok_or("no finish reason")?))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let model = args
        .next()
        .unwrap_or_else(|| pn_runtime::DEMO_MODEL_PATH.to_string());
    let ms: u64 = args.next().map_or(Ok(200), |a| a.parse())?;
    let engine = Engine::load(&model, EngineOptions::default())?;
    let (n, reason) = generate_then_cancel(&engine, Duration::from_millis(ms))?;
    println!("{n} tokens, then {reason:?}");
    Ok(())
}
