//! `pn chat`: interactive multi-turn chat through the model's chat template.
//!
//! `/reset` starts a new conversation (and empties the prompt cache), `/exit` (or end of input)
//! quits; Ctrl-C during a reply stops that reply and keeps the session, Ctrl-C at the prompt
//! quits. After each reply a line on stderr says how many prompt tokens were processed and how
//! many were reused from the session (its state or a prompt-cache checkpoint).

use crate::engine_args::{self, ModelArgs, SamplingArgs};
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
    pub grammar: crate::grammar_args::GrammarArgs,
    /// System prompt.
    #[arg(long = "system", alias = "sys")]
    pub system: Option<String>,
    /// Most tokens per reply (-1: until an end token).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_hyphen_values = true)]
    pub n_predict: i64,
}

/// Runs the subcommand.
pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let engine = engine_args::load_engine(&args.model, true)?;
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
    loop {
        eprint!("> ");
        std::io::stderr().flush()?;
        line.clear();
        if stdin.lock().read_line(&mut line)? == 0 {
            break;
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
            Ok(text) => messages.push(ChatMessage::assistant(text)),
            Err(e) => {
                // Keep the session usable: drop the failed turn.
                messages.pop();
                eprintln!("error: {e}");
            }
        }
    }
    Ok(())
}

fn stream_reply(
    session: &mut pn_runtime::Session<'_>,
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
