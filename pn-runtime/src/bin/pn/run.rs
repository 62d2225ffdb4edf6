//! `pn run`: complete one prompt, streaming the text to stdout, with a timing line on stderr.

use crate::engine_args::{self, ModelArgs, SamplingArgs};
use pn_runtime::engine::{Prompt, StopConditions};
use std::io::Write;
use std::path::PathBuf;

/// Complete one prompt (llama-cli style flags). Without -m, the built-in demo model is used.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub grammar: crate::grammar_args::GrammarArgs,
    /// Prompt text (special-token text such as `<|im_start|>` maps to its id).
    #[arg(short = 'p', long = "prompt", conflicts_with = "file")]
    pub prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Tokens to generate (-1: until an end token or the context is full).
    #[arg(
        short = 'n',
        long = "n-predict",
        default_value_t = 256,
        allow_hyphen_values = true
    )]
    pub n_predict: i64,
    /// Stop string (repeatable): the output ends right before it.
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Keep generating past end tokens.
    #[arg(long = "ignore-eos")]
    pub ignore_eos: bool,
    /// Do not echo the prompt before the completion.
    #[arg(long = "no-display-prompt")]
    pub no_display_prompt: bool,
}

/// Runs the subcommand.
pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let prompt = match (&args.prompt, &args.file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => std::fs::read_to_string(f)
            .map_err(|e| format!("cannot read prompt file {}: {e}", f.display()))?,
        (None, None) if args.model.model.is_none() => "def fibonacci(n):".to_string(),
        (None, None) => return Err("give a prompt with -p TEXT or -f FILE".into()),
    };
    let engine = engine_args::load_engine(&args.model, true)?;
    let mut session = engine.session()?;
    session.set_progress(engine_args::prefill_progress());
    let stop = StopConditions {
        max_tokens: usize::try_from(args.n_predict).ok(),
        strings: args.stop.clone(),
        ignore_eog: args.ignore_eos,
        ..StopConditions::default()
    };
    let mut out = std::io::stdout().lock();
    if !args.no_display_prompt {
        write!(out, "{prompt}")?;
        out.flush()?;
    }
    let mut params = args.sampling.params();
    params.constraint = args.grammar.constraint(engine.tokenizer())?;
    let mut generation = session.generate(Prompt::Text(prompt), params, stop)?;
    for event in generation.by_ref() {
        let event = event?;
        write!(out, "{}", event.text)?;
        out.flush()?;
    }
    writeln!(out)?;
    let t = generation.timings();
    eprintln!(
        "pn: prompt {} tokens in {:.1} ms ({:.2} tokens/s) | generation {} tokens in {:.1} ms ({:.2} tokens/s){} | stop: {}",
        t.prompt_tokens,
        t.prompt_time.as_secs_f64() * 1e3,
        t.prompt_tokens_per_sec(),
        t.generated_tokens,
        t.generation_time.as_secs_f64() * 1e3,
        t.generation_tokens_per_sec(),
        engine_args::spec_summary(generation.spec_stats()),
        generation
            .finish_reason()
            .map_or_else(|| "none".to_string(), |r| format!("{r:?}")),
    );
    Ok(())
}
