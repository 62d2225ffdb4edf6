//! `pn run`: complete one prompt, streaming the text to stdout, with a timing line on stderr.
//! Ctrl-C stops the generation (the timing line is still printed); `-cnv` (or `-sys`) turns it
//! into `pn chat`.

use crate::engine_args::{self, ChatTemplateArgs, ModelArgs, SamplingArgs};
use crate::inputs;
use pn_runtime::engine::{CancelToken, Prompt, StopConditions};
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
    pub template: ChatTemplateArgs,
    #[command(flatten)]
    pub grammar: crate::grammar_args::GrammarArgs,
    /// Prompt text (special-token text such as `<|im_start|>` maps to its id). Without -p or
    /// -f, a prompt piped into stdin is read.
    #[arg(short = 'p', long = "prompt", conflicts_with = "file")]
    pub prompt: Option<String>,
    /// Read the prompt from a file (`-` for stdin).
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Tokens to generate (-1: until an end token or the context is full).
    #[arg(
        short = 'n',
        long = "n-predict",
        alias = "predict",
        default_value_t = 256,
        allow_hyphen_values = true
    )]
    pub n_predict: i64,
    /// Stop string (repeatable; llama.cpp's -r/--reverse-prompt): the output ends right before it.
    #[arg(long = "stop", short = 'r', alias = "reverse-prompt")]
    pub stop: Vec<String>,
    /// Keep generating past end tokens.
    #[arg(long = "ignore-eos")]
    pub ignore_eos: bool,
    /// Do not echo the prompt before the completion.
    #[arg(long = "no-display-prompt")]
    pub no_display_prompt: bool,
    /// Conversation mode (-cnv): `pn chat` with these flags; -p is the first message.
    #[arg(long = "conversation", conflicts_with = "no_conversation")]
    pub conversation: bool,
    /// Plain completion (-no-cnv), the default of `pn run`.
    #[arg(long = "no-conversation")]
    pub no_conversation: bool,
    /// System prompt (-sys); implies conversation mode.
    #[arg(long = "system-prompt", conflicts_with = "no_conversation")]
    pub system_prompt: Option<String>,
}

/// Runs the subcommand.
pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    if args.conversation || args.system_prompt.is_some() {
        return crate::chat::run(crate::chat::Args {
            model: args.model,
            sampling: args.sampling,
            template: args.template,
            grammar: args.grammar,
            system: args.system_prompt,
            prompt: args.prompt,
            n_predict: args.n_predict,
        });
    }
    let prompt = match (&args.prompt, &args.file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => inputs::read_text(f)?,
        (None, None) => match inputs::piped_prompt()? {
            Some(p) => p,
            None if args.model.model.is_none() => "def fibonacci(n):".to_string(),
            None => return Err("give a prompt with -p TEXT, -f FILE or on stdin".into()),
        },
    };
    let chat_template = args.template.source()?;
    // Open to first token: wall and process CPU time from here (the machine may be busy).
    let opened = std::time::Instant::now();
    let engine = engine_args::load_engine_with(&args.model, true, |o| {
        let mut o = o.clone();
        o.chat_template = chat_template.or(o.chat_template);
        o
    })?;
    eprintln!("pn: {}", engine.load_report());
    let mut session = engine.session()?;
    session.set_progress(engine_args::prefill_progress());
    let cancel = CancelToken::new();
    {
        let cancel = cancel.clone();
        // First Ctrl-C: stop generating, print what was timed; a second one: quit at once.
        ctrlc::set_handler(move || {
            if cancel.is_cancelled() {
                std::process::exit(130);
            }
            cancel.cancel();
        })?;
    }
    let stop = StopConditions {
        max_tokens: usize::try_from(args.n_predict).ok(),
        strings: args.stop.clone(),
        ignore_eog: args.ignore_eos,
        cancel: Some(cancel),
        ..StopConditions::default()
    };
    let mut out = std::io::stdout().lock();
    if !args.no_display_prompt {
        write!(out, "{prompt}")?;
        out.flush()?;
    }
    let mut params = args.sampling.params();
    params.constraint = args.grammar.constraint(engine.tokenizer())?;
    let seed = params.seed;
    let mut generation = session.generate(Prompt::Text(prompt), params, stop)?;
    let mut first_token = None;
    for event in generation.by_ref() {
        let event = event?;
        first_token.get_or_insert_with(|| (opened.elapsed(), pn_runtime::engine::process_cpu()));
        write!(out, "{}", event.text)?;
        out.flush()?;
    }
    writeln!(out)?;
    let t = generation.timings();
    let first_note = first_token.map_or_else(String::new, |(wall, cpu)| {
        format!(
            " | first token {:.2} s after open ({:.2} s cpu)",
            wall.as_secs_f64(),
            cpu.as_secs_f64()
        )
    });
    let seed_note = if args.sampling.temp > 0.0 {
        format!(" | seed {seed}")
    } else {
        String::new()
    };
    eprintln!(
        "pn: prompt {} tokens in {:.1} ms ({:.2} tokens/s) | generation {} tokens in {:.1} ms ({:.2} tokens/s){}{seed_note}{first_note} | stop: {}",
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
