//! `pn serve`: the OpenAI-compatible HTTP server (see `pn_runtime::server`).

use crate::engine_args::{self, ModelArgs};
use pn_runtime::sampling::SamplingParams;
use pn_runtime::server::api::SamplingDefaults;
use pn_runtime::server::limits::{self, Limits};
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
    #[command(flatten)]
    pub sampling: ServeSampling,
    #[command(flatten)]
    pub limits: ServeLimits,
}

/// What one client may hold of the server (`pn_runtime::server::limits`).
#[derive(clap::Args, Debug)]
pub struct ServeLimits {
    /// Seconds a client has to send a request's headers (also how long an idle keep-alive
    /// connection stays open); slower ones are closed.
    #[arg(long = "header-timeout", default_value_t = 30.0)]
    pub header_timeout: f64,
    /// Seconds a client has to send a request's body (408 beyond).
    #[arg(long = "body-timeout", default_value_t = 60.0)]
    pub body_timeout: f64,
    /// Seconds a write to a client may stay blocked (it stopped reading) before the
    /// connection is closed and its generation cancelled.
    #[arg(long = "write-timeout", default_value_t = 60.0)]
    pub write_timeout: f64,
    /// Largest request head (request line and headers) in bytes, at least 8192 (431 beyond).
    #[arg(long = "max-header-bytes", default_value_t = 64 << 10)]
    pub max_header_bytes: usize,
    /// Connections open at once; more are answered 503 and closed.
    #[arg(long = "max-connections", default_value_t = 512)]
    pub max_connections: usize,
    /// Let browser pages from this origin call the API (CORS), e.g. https://app.example;
    /// repeatable; `*` for any. Off by default.
    #[arg(long = "cors-origin")]
    pub cors_origin: Vec<String>,
}

impl ServeLimits {
    /// The server's limits; a negative or non-finite time is an error naming its flag.
    pub fn limits(&self) -> Result<Limits, String> {
        let secs = |flag: &str, v: f64| {
            Duration::try_from_secs_f64(v).map_err(|e| format!("--{flag} {v}: {e}"))
        };
        if self.max_connections == 0 {
            return Err("--max-connections must be at least 1".into());
        }
        Ok(Limits {
            header_timeout: secs("header-timeout", self.header_timeout)?,
            body_timeout: secs("body-timeout", self.body_timeout)?,
            write_timeout: secs("write-timeout", self.write_timeout)?,
            max_header_bytes: self.max_header_bytes.max(limits::MIN_HEADER_BYTES),
            max_connections: self.max_connections,
            ..Limits::default()
        })
    }
}

/// Sampling of requests that leave the fields out; unset flags are `pn run`'s defaults
/// (llama.cpp's: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, no penalties).
#[derive(clap::Args, Debug, Default)]
pub struct ServeSampling {
    /// Default temperature (0: greedy) [default: 0.8].
    #[arg(long)]
    pub temp: Option<f32>,
    /// Default top-k (0: off) [default: 40].
    #[arg(long = "top-k")]
    pub top_k: Option<usize>,
    /// Default top-p (1: off) [default: 0.95].
    #[arg(long = "top-p")]
    pub top_p: Option<f32>,
    /// Default min-p (0: off) [default: 0.05].
    #[arg(long = "min-p")]
    pub min_p: Option<f32>,
    /// Default repetition penalty (1: off).
    #[arg(long = "repeat-penalty")]
    pub repeat_penalty: Option<f32>,
    /// Default presence penalty (0: off).
    #[arg(long = "presence-penalty")]
    pub presence_penalty: Option<f32>,
    /// Default frequency penalty (0: off).
    #[arg(long = "frequency-penalty")]
    pub frequency_penalty: Option<f32>,
    /// Default window of the penalties.
    #[arg(long = "repeat-last-n")]
    pub repeat_last_n: Option<usize>,
    /// Seed of requests without one (-1 or unset: a random seed per request).
    #[arg(short = 's', long, allow_hyphen_values = true)]
    pub seed: Option<i64>,
    /// Most tokens of a request without `max_tokens` (-1 or unset: the endpoint's default,
    /// until the context is full for chat, 16 for completions).
    #[arg(short = 'n', long = "n-predict", allow_hyphen_values = true)]
    pub n_predict: Option<i64>,
}

impl ServeSampling {
    /// The server's defaults.
    pub fn defaults(&self) -> SamplingDefaults {
        let d = SamplingParams::default();
        SamplingDefaults {
            params: SamplingParams {
                temperature: self.temp.unwrap_or(d.temperature),
                top_k: self.top_k.unwrap_or(d.top_k),
                top_p: self.top_p.unwrap_or(d.top_p),
                min_p: self.min_p.unwrap_or(d.min_p),
                repeat_penalty: self.repeat_penalty.unwrap_or(d.repeat_penalty),
                presence_penalty: self.presence_penalty.unwrap_or(d.presence_penalty),
                frequency_penalty: self.frequency_penalty.unwrap_or(d.frequency_penalty),
                penalty_last_n: self.repeat_last_n.unwrap_or(d.penalty_last_n),
                ..d
            },
            seed: self.seed.and_then(|s| u64::try_from(s).ok()),
            max_tokens: self.n_predict.and_then(|n| usize::try_from(n).ok()),
        }
    }
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
    // Every slot allocates its own KV cache: refuse a --parallel that cannot fit, with numbers.
    engine.check_slots_memory(args.parallel)?;
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
        sampling: args.sampling.defaults(),
        limits: args.limits.limits()?,
        cors_origins: args.limits.cors_origin,
    };
    serve(engine, config)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    #[derive(Parser)]
    struct Serve {
        #[command(flatten)]
        args: super::Args,
    }

    #[derive(Parser)]
    struct Run {
        #[command(flatten)]
        args: crate::run::Args,
    }

    #[test]
    fn serve_defaults_are_run_defaults() {
        let serve = Serve::parse_from(["pn"]).args.sampling.defaults();
        let run = Run::parse_from(["pn"]).args.sampling.params();
        let sampling = |p: &pn_runtime::sampling::SamplingParams| {
            (
                p.temperature,
                p.top_k,
                p.top_p,
                p.min_p,
                p.repeat_penalty,
                p.penalty_last_n,
            )
        };
        assert_eq!(sampling(&serve.params), sampling(&run));
        assert_eq!((serve.seed, serve.max_tokens), (None, None));
    }

    #[test]
    fn serve_sampling_flags() {
        let argv = [
            "pn",
            "--temp",
            "0.2",
            "--top-k",
            "5",
            "--top-p",
            "0.5",
            "--min-p",
            "0.1",
            "--repeat-penalty",
            "1.1",
            "--seed",
            "7",
            "-n",
            "64",
        ];
        let d = Serve::parse_from(argv).args.sampling.defaults();
        assert_eq!(
            (
                d.params.temperature,
                d.params.top_k,
                d.params.top_p,
                d.params.min_p
            ),
            (0.2, 5, 0.5, 0.1)
        );
        assert_eq!(
            (d.params.repeat_penalty, d.seed, d.max_tokens),
            (1.1, Some(7), Some(64))
        );
        let d = Serve::parse_from(["pn", "--seed", "-1", "-n", "-1"])
            .args
            .sampling
            .defaults();
        assert_eq!((d.seed, d.max_tokens), (None, None));
    }
}
