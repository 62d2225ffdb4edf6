//! `pn serve`: the OpenAI-compatible HTTP server (see `pn_runtime::server`).

use crate::engine_args::{self, ModelArgs};
use pn_runtime::server::{serve, ServerConfig};
use std::time::Duration;

/// Serve the model over an OpenAI-compatible HTTP API.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on (127.0.0.1: this machine only).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port (0: any free port; the bound address is printed on stdout).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Requests generated at the same time (one session each).
    #[arg(long = "parallel", alias = "np", default_value_t = 4)]
    pub parallel: usize,
    /// Requests that may wait for a free slot; more get 429 with Retry-After.
    #[arg(long = "queue", default_value_t = 64)]
    pub queue: usize,
    /// Require `Authorization: Bearer KEY` on every route but /health.
    #[arg(long = "api-key")]
    pub api_key: Option<String>,
    /// Model id listed by /v1/models (default: the file name).
    #[arg(long)]
    pub alias: Option<String>,
    /// Largest request body in bytes (413 beyond).
    #[arg(long = "max-body-bytes", default_value_t = 16 << 20)]
    pub max_body_bytes: usize,
    /// Seconds running generations may continue after SIGINT/SIGTERM before they are cancelled.
    #[arg(long = "shutdown-grace", default_value_t = 10.0)]
    pub shutdown_grace: f64,
    /// Jinja chat template file to use instead of the model's `tokenizer.chat_template`.
    #[arg(long = "chat-template-file")]
    pub chat_template_file: Option<std::path::PathBuf>,
}

/// Runs the subcommand.
pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    if args.parallel == 0 {
        return Err("--parallel must be at least 1".into());
    }
    let grace = Duration::try_from_secs_f64(args.shutdown_grace)
        .map_err(|e| format!("--shutdown-grace {}: {e}", args.shutdown_grace))?;
    let chat_template = match &args.chat_template_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?,
        ),
        None => None,
    };
    let engine = engine_args::load_engine(&args.model, true)?;
    let config = ServerConfig {
        host: args.host,
        port: args.port,
        parallel: args.parallel,
        max_queue: args.queue,
        api_key: args.api_key.filter(|k| !k.is_empty()),
        model_id: args.alias,
        max_body_bytes: args.max_body_bytes,
        shutdown_grace: grace,
        chat_template,
    };
    serve(engine, config)?;
    Ok(())
}
