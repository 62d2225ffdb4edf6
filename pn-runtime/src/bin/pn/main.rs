//! `pn`: run, inspect and serve Qwen3.5/3.8 hybrid models in the PN format.
//!
//! Each subcommand lives in its own module with an `Args` struct (clap derive) and a
//! `run(args) -> Result<(), Box<dyn std::error::Error>>` function; this file only dispatches.

mod bench;
mod chat;
mod convert;
mod demo;
mod engine_args;
mod eval_kl;
mod grammar_args;
mod imatrix;
mod inputs;
mod inspect;
mod kl_file;
mod llama_flags;
mod logits;
mod perplexity;
mod progress;
mod quantize;
mod run;
mod serve;
mod template;
mod tokenize;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Command-line interface of the pn inference engine.
#[derive(Parser)]
#[command(
    name = "pn",
    version = VERSION,
    long_version = long_version(),
    about = "Run Qwen3.5/3.8 hybrid models in the PN format"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// `pn --version`: the version and the git commit it was built from (`unknown` outside a git
/// checkout; see build.rs).
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("PN_GIT_COMMIT"), ")");

/// `pn --version`: [`VERSION`] plus the CUDA kernels this build embeds (or why it has none).
fn long_version() -> &'static str {
    static V: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    V.get_or_init(|| format!("{VERSION}\n{}", pn_kernels::build_info()))
}

#[derive(Subcommand, Debug)]
enum Command {
    // One variant per subcommand, e.g. `Inspect(inspect::Args)`.
    /// Print a GGUF's metadata and tensor table (--json, --validate for PN rows).
    Inspect(inspect::Args),
    /// Quantize an F32/F16/BF16/Q8_0 qwen35 GGUF to a PN model (mix P0k+19, Hadamard-rotated).
    Quantize(quantize::Args),
    /// Convert a Hugging Face Qwen3.5 checkpoint folder to a qwen35 GGUF (as llama.cpp's converter).
    Convert(convert::Args),
    /// Collect llama.cpp-style importance matrices (activation statistics) over a text.
    Imatrix(imatrix::Args),
    /// Compare a quantized model with its base: mean/p99 KL, top-1 agreement, perplexity.
    EvalKl(eval_kl::Args),
    /// Print the token ids of a text as a JSON array.
    Tokenize(tokenize::Args),
    /// Render messages with the model's chat template and print the prompt exactly.
    Template(template::Args),
    /// Evaluate a token sequence from an empty state and write all positions' logits (raw f32).
    Logits(logits::Args),
    /// Complete one prompt, streaming to stdout (no -m: the built-in demo model).
    Run(run::Args),
    /// Interactive multi-turn chat with the chat template (/reset, Ctrl-C stops a reply).
    Chat(chat::Args),
    /// Prompt-processing and generation speed (pp512, tg128), llama-bench style.
    Bench(bench::Args),
    /// Perplexity on a text or token file; --kl-base for KL against saved logits.
    Perplexity(perplexity::Args),
    /// OpenAI-compatible HTTP server (chat, completions, streaming, metrics).
    Serve(serve::Args),
    /// Print the table of llama.cpp flags: what pn takes for each, and those it refuses.
    LlamaFlags,
}

fn main() -> ExitCode {
    // `pn __template-worker`: the chat-template sandbox's child process (hidden from --help).
    // Checked before clap so the worker sets its limits before doing anything else.
    if std::env::args_os().nth(1).as_deref()
        == Some(std::ffi::OsStr::new(pn_runtime::chat_template::WORKER_ARG))
    {
        return pn_runtime::chat_template::run_worker();
    }
    // A model or shard truncated while mapped: exit 74 naming the file, not a bare SIGBUS.
    gguf_io::install_sigbus_report();
    // A file-size limit (`ulimit -f`) reached while writing: the write fails with EFBIG and
    // pn quantize/convert report it and remove their temporary output, instead of SIGXFSZ
    // killing the process with the partial file left behind.
    #[cfg(unix)]
    // SAFETY: setting a signal's disposition to "ignore" has no preconditions.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
    // llama.cpp's multi-letter short flags (-ngl, -ctk...) become long ones clap can read.
    let args = match llama_flags::normalise(std::env::args_os()) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let cli = Cli::parse_from(args);
    let result: Result<(), Box<dyn std::error::Error>> = match cli.command {
        Command::Inspect(args) => inspect::run(args),
        Command::Quantize(args) => quantize::run(args),
        Command::Convert(args) => convert::run(args),
        Command::Imatrix(args) => imatrix::run(args),
        Command::EvalKl(args) => eval_kl::run(args),
        Command::Tokenize(args) => tokenize::run(args),
        Command::Template(args) => template::run(args),
        Command::Logits(args) => logits::run(args),
        Command::Run(args) => run::run(args),
        Command::Chat(args) => chat::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Perplexity(args) => perplexity::run(args),
        Command::Serve(args) => serve::run(args),
        Command::LlamaFlags => {
            print!("{}", llama_flags::markdown_table());
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
