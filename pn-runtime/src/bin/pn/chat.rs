//! `pn chat`: interactive multi-turn chat through the model's chat template.
//!
//! `/reset` starts a new conversation (and empties the prompt cache), `/exit` (or end of input)
//! quits; Ctrl-C during a reply stops that reply and keeps the session, Ctrl-C at the prompt
//! quits. After each reply a line on stderr says how many prompt tokens were processed and how
//! many were reused from the session (its state or a prompt-cache checkpoint).
//!
//! A conversation that outgrows the context (`-c`) loses its oldest turns, the system prompt
//! kept, with a note on stderr, and goes on.
//!
//! A turn that fails (a message that cannot fit the context even alone, a generation error) is
//! reported on stderr and the conversation goes on without it, but the process then exits
//! non-zero at the end (`error: N of M turns failed`), so scripts that pipe messages into
//! `pn chat` see the failure. A reply stopped with Ctrl-C is not a failure.

use crate::engine_args::{self, ChatTemplateArgs, ModelArgs, SamplingArgs};
use pn_runtime::chat_template::ChatMessage;
use pn_runtime::engine::{CancelToken, StopConditions};
use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Chat with a model interactively. Without -m, the built-in demo model is used.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub template: ChatTemplateArgs,
    #[command(flatten)]
    pub grammar: crate::grammar_args::GrammarArgs,
    /// System prompt (llama.cpp's -sys).
    #[arg(long = "system-prompt", aliases = ["system", "sys"])]
    pub system: Option<String>,
    /// The first user message (then the conversation goes on from stdin).
    #[arg(short = 'p', long = "prompt")]
    pub prompt: Option<String>,
    /// Most tokens per reply (-1: until an end token or the context is full).
    #[arg(short = 'n', long = "n-predict", alias = "predict", default_value_t = -1, allow_hyphen_values = true)]
    pub n_predict: i64,
}

/// Runs the subcommand.
pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let chat_template = args.template.source()?;
    let engine = engine_args::load_engine_with(&args.model, true, |o| {
        let mut o = o.clone();
        o.chat_template = chat_template.or(o.chat_template);
        o
    })?;
    if engine.chat_template_is_fallback() {
        eprintln!(
            "pn: the model has no chat template; using ChatML (<|im_start|>role ... <|im_end|>)"
        );
    }
    let constraint = args.grammar.constraint(engine.tokenizer())?;
    let mut session = engine.session()?;
    session.set_progress(engine_args::prefill_progress());

    let cancel = CancelToken::new();
    let generating = Arc::new(AtomicBool::new(false));
    {
        let (cancel, generating) = (cancel.clone(), Arc::clone(&generating));
        ctrlc::set_handler(move || {
            if generating.load(Ordering::SeqCst) {
                cancel.cancel();
            } else {
                eprintln!();
                std::process::exit(130);
            }
        })?;
    }
    eprintln!("pn chat: type a message; /reset starts over, /exit quits, Ctrl-C stops a reply.");

    let initial: Vec<ChatMessage> = args.system.iter().map(ChatMessage::system).collect();
    let mut messages = initial.clone();
    let stdin = std::io::stdin();
    let mut line = String::new();
    let mut first = args.prompt.clone();
    let mut turns = TurnCount::default();
    loop {
        line.clear();
        if let Some(p) = first.take() {
            line.push_str(&p);
        } else {
            eprint!("> ");
            std::io::stderr().flush()?;
            if stdin.lock().read_line(&mut line)? == 0 {
                break;
            }
        }
        let input = line.trim_end_matches(['\n', '\r']);
        match input.trim() {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                messages = initial.clone();
                session.reset()?;
                eprintln!("(conversation reset)");
                continue;
            }
            _ => {}
        }
        messages.push(ChatMessage::user(input));
        let budget = engine
            .context()
            .saturating_sub(reply_room(engine.context(), args.n_predict));
        let count = |m: &[ChatMessage]| -> Result<usize, Box<dyn std::error::Error>> {
            Ok(engine.tokenizer().encode(&engine.render_chat(m)?)?.len())
        };
        match turns_to_drop(&messages, count, budget) {
            Ok(0) => {}
            Ok(n) => {
                messages.drain(first_turn(&messages)..first_turn(&messages) + n);
                eprintln!(
                    "pn: the conversation no longer fits the context ({} tokens, -c): dropped the oldest {n} message(s), the system prompt kept",
                    engine.context()
                );
            }
            Err(e) => {
                messages.pop();
                turns.failed(&e);
                continue;
            }
        }
        cancel.reset();
        let stop = StopConditions {
            max_tokens: usize::try_from(args.n_predict).ok(),
            cancel: Some(cancel.clone()),
            ..StopConditions::default()
        };
        generating.store(true, Ordering::SeqCst);
        let reply = stream_reply(&mut session, &messages, &args, stop, constraint.as_ref());
        generating.store(false, Ordering::SeqCst);
        match reply {
            Ok(text) => {
                turns.ok += 1;
                messages.push(ChatMessage::assistant(text));
            }
            Err(e) => {
                // Keep the session usable: drop the failed turn.
                messages.pop();
                turns.failed(&e);
            }
        }
    }
    turns.result()
}

/// Turns that got a reply and turns that failed, for the exit status.
#[derive(Debug, Default)]
struct TurnCount {
    ok: usize,
    failed: usize,
}

impl TurnCount {
    /// Reports a failed turn on stderr and counts it.
    fn failed(&mut self, e: &dyn std::fmt::Display) {
        eprintln!("error: {e}");
        self.failed += 1;
    }

    /// `Ok` when no turn failed; else the error `main` turns into a non-zero exit status.
    fn result(&self) -> Result<(), Box<dyn std::error::Error>> {
        if self.failed == 0 {
            return Ok(());
        }
        Err(format!("{} of {} turns failed", self.failed, self.failed + self.ok).into())
    }
}

/// Tokens kept free for the reply: `-n` (at most half the context), or a quarter of the
/// context for replies of unbounded length.
fn reply_room(context: usize, n_predict: i64) -> usize {
    match usize::try_from(n_predict) {
        Ok(n) if n > 0 => n.min(context / 2),
        _ => context / 4,
    }
    .max(1)
}

/// Index of the first message that may be dropped (the system prompt, if first, stays).
fn first_turn(messages: &[ChatMessage]) -> usize {
    usize::from(messages.first().is_some_and(|m| m.role == "system"))
}

/// How many of the oldest messages after the system prompt to drop, whole turns (a user
/// message and what answered it) at a time, so that the rest counts at most `budget` tokens;
/// the last message (the new one) is never dropped. An error when even that alone is too long.
fn turns_to_drop(
    messages: &[ChatMessage],
    count: impl Fn(&[ChatMessage]) -> Result<usize, Box<dyn std::error::Error>>,
    budget: usize,
) -> Result<usize, Box<dyn std::error::Error>> {
    let start = first_turn(messages);
    let last = messages.len().saturating_sub(1);
    let mut drop = 0;
    loop {
        let kept: Vec<ChatMessage> = messages[..start]
            .iter()
            .chain(&messages[start + drop..])
            .cloned()
            .collect();
        let n = count(&kept)?;
        if n <= budget {
            return Ok(drop);
        }
        if start + drop >= last {
            return Err(format!(
                "the message does not fit the context: {n} prompt tokens, {budget} available (raise -c)"
            )
            .into());
        }
        // Drop through the next user message that starts a later turn.
        drop += 1;
        while start + drop < last && messages[start + drop].role != "user" {
            drop += 1;
        }
    }
}

fn stream_reply(
    session: &mut pn_runtime::Session,
    messages: &[ChatMessage],
    args: &Args,
    stop: StopConditions,
    constraint: Option<&pn_runtime::constrain::Constraint>,
) -> Result<String, Box<dyn std::error::Error>> {
    let mut out = std::io::stdout().lock();
    let mut reply = String::new();
    let mut params = args.sampling.params();
    params.constraint = constraint.cloned();
    let mut generation = session.chat(messages, params, stop)?;
    for event in generation.by_ref() {
        let event = event?;
        reply.push_str(&event.text);
        write!(out, "{}", event.text)?;
        out.flush()?;
    }
    writeln!(out)?;
    if let Some(pn_runtime::FinishReason::Cancelled) = generation.finish_reason() {
        eprintln!("(stopped)");
    }
    let t = generation.timings();
    eprintln!(
        "[prompt: {} tokens processed, {} reused, {:.1} ms | reply: {} tokens, {:.2} tokens/s]",
        t.prompt_tokens,
        t.prompt_reused,
        t.prompt_time.as_secs_f64() * 1e3,
        t.generated_tokens,
        t.generation_tokens_per_sec(),
    );
    Ok(reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts one token per character of content, so the expected drops can be worked out.
    fn chars(m: &[ChatMessage]) -> Result<usize, Box<dyn std::error::Error>> {
        Ok(m.iter().map(|m| m.content.len()).sum())
    }

    #[test]
    fn oldest_turns_go_first_and_the_system_prompt_stays() {
        let m = vec![
            ChatMessage::system("ss"),
            ChatMessage::user("u1u1"),
            ChatMessage::assistant("a1a1"),
            ChatMessage::user("u2u2"),
            ChatMessage::assistant("a2a2"),
            ChatMessage::user("u3"),
        ];
        // 20 tokens in all.
        assert_eq!(turns_to_drop(&m, chars, 20).unwrap(), 0);
        // Without turn 1 (8 tokens): 12.
        assert_eq!(turns_to_drop(&m, chars, 19).unwrap(), 2);
        assert_eq!(turns_to_drop(&m, chars, 12).unwrap(), 2);
        // Without turns 1 and 2: system + u3 = 4.
        assert_eq!(turns_to_drop(&m, chars, 11).unwrap(), 4);
        assert_eq!(turns_to_drop(&m, chars, 4).unwrap(), 4);
        assert!(turns_to_drop(&m, chars, 3)
            .unwrap_err()
            .to_string()
            .contains("does not fit"));
        // No system prompt: the first message may go.
        assert_eq!(turns_to_drop(&m[1..], chars, 10).unwrap(), 2);
        assert_eq!(first_turn(&m[1..]), 0);
        assert_eq!(reply_room(64, -1), 16);
        assert_eq!(reply_room(64, 100), 32);
        assert_eq!(reply_room(64, 8), 8);
    }

    #[test]
    fn a_failed_turn_makes_the_result_an_error() {
        let mut t = TurnCount::default();
        t.ok += 2;
        assert!(t.result().is_ok());
        t.failed(&"boom");
        assert_eq!(t.result().unwrap_err().to_string(), "1 of 3 turns failed");
    }
}
