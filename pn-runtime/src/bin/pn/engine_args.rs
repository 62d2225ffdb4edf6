//! Flags shared by `pn run`, `pn chat`, `pn bench` and `pn perplexity` (llama.cpp spellings),
//! and loading the engine with a progress bar.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use pn_runtime::chat_template::{SubprocessSandbox, TemplateIsolation};
use pn_runtime::engine::{
    Device, Engine, EngineOptions, KvCacheType, LoadProgress, ProgressFn, Speculation,
};
use pn_runtime::sampling::SamplingParams;
use std::io::IsTerminal;
use std::path::PathBuf;

/// Model, device and context flags.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// GGUF model (`qwen35` architecture). Without it, `run` and `chat` use the built-in demo model.
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// Context size in tokens (0: min(4096, the model's)).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 0)]
    pub ctx_size: usize,
    /// CPU threads (0: all cores).
    #[arg(short = 't', long = "threads", default_value_t = 0)]
    pub threads: usize,
    /// Device: cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// KV cache type for K: f32, f16, q8_0 or q4_0.
    #[arg(long = "cache-type-k", alias = "ctk", default_value = "f32")]
    pub cache_type_k: KvCacheType,
    /// KV cache type for V: f32, f16, q8_0 or q4_0.
    #[arg(long = "cache-type-v", alias = "ctv", default_value = "f32")]
    pub cache_type_v: KvCacheType,
    /// Speculative decoding: mtp (draft with the model's MTP head; plain decoding for a model
    /// without one) or none.
    #[arg(long = "spec", default_value = "mtp", value_parser = ["mtp", "none"])]
    pub spec: String,
    /// Most tokens drafted per step with --spec mtp.
    #[arg(long = "draft", default_value_t = pn_runtime::speculative::DEFAULT_DRAFT)]
    pub draft: usize,
    /// Prompt cache: most recurrent-state checkpoints a session keeps (0: off; a new prompt
    /// then reuses the session only when it extends it).
    #[arg(long = "ctx-checkpoints", default_value_t = pn_runtime::engine::DEFAULT_PROMPT_CACHE_CHECKPOINTS)]
    pub ctx_checkpoints: usize,
    /// Prompt cache: a checkpoint every N prompt tokens (0: only at turn starts and prompt ends).
    #[arg(long = "checkpoint-interval", default_value_t = pn_runtime::engine::DEFAULT_PROMPT_CACHE_INTERVAL)]
    pub checkpoint_interval: usize,
    #[command(flatten)]
    pub template_sandbox: TemplateSandboxArgs,
}

/// Where chat templates render (shared by the commands that render one).
#[derive(clap::Args, Debug, Clone)]
pub struct TemplateSandboxArgs {
    /// Chat template sandbox: process (render in a child process limited to 128 MiB and 10 s,
    /// safe for untrusted model files) or none (in this process; a hostile template can
    /// exhaust memory).
    #[arg(long = "template-sandbox", default_value = "process", value_parser = ["process", "none"])]
    pub template_sandbox: String,
}

impl TemplateSandboxArgs {
    /// The isolation `--template-sandbox` asks for (`process`: this executable as worker).
    pub fn isolation(&self) -> Result<TemplateIsolation, Box<dyn std::error::Error>> {
        Ok(match self.template_sandbox.as_str() {
            "none" => TemplateIsolation::InProcess,
            _ => TemplateIsolation::Subprocess(SubprocessSandbox::current_exe()?),
        })
    }
}

impl ModelArgs {
    /// The speculative decoding setting of `--spec` and `--draft`.
    pub fn speculation(&self) -> Speculation {
        match self.spec.as_str() {
            "mtp" if self.draft > 0 => Speculation::Mtp { draft: self.draft },
            _ => Speculation::None,
        }
    }
}

/// A summary of a generation's speculative decoding for timing lines (empty when off).
pub fn spec_summary(stats: Option<pn_runtime::speculative::SpecStats>) -> String {
    match stats {
        Some(s) => format!(
            " | spec: acceptance {:.1}% ({}/{} drafts), {:.2} tokens/target pass",
            100.0 * s.acceptance_rate(),
            s.accepted,
            s.drafted,
            s.tokens_per_pass()
        ),
        None => String::new(),
    }
}

/// Sampling flags.
#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Temperature (0: greedy).
    #[arg(long, default_value_t = 0.8)]
    pub temp: f32,
    /// Top-k (0: off).
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    /// Top-p (1: off).
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    /// Min-p (0: off).
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    /// Repetition penalty (1: off).
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Presence penalty (0: off).
    #[arg(long = "presence-penalty", default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Frequency penalty (0: off).
    #[arg(long = "frequency-penalty", default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Last tokens the penalties look at.
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Random seed (same seed, same output).
    #[arg(short = 's', long, default_value_t = 0)]
    pub seed: u64,
}

impl SamplingArgs {
    /// The sampler parameters.
    pub fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            penalty_last_n: self.repeat_last_n,
            seed: self.seed,
            constraint: None,
        }
    }
}

/// Whether progress bars are drawn: only when stderr is a terminal.
pub fn interactive() -> bool {
    std::io::stderr().is_terminal()
}

fn bar(len: u64, template: &str) -> ProgressBar {
    if !interactive() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template(template) {
        pb.set_style(style);
    }
    pb
}

/// A prefill progress callback drawing a bar on stderr (nothing when not a terminal).
pub fn prefill_progress() -> Option<ProgressFn> {
    if !interactive() {
        return None;
    }
    let pb = bar(0, "prompt {bar:40} {pos}/{len} tokens ({per_sec})");
    Some(Box::new(move |done, total| {
        pb.set_length(total as u64);
        pb.set_position(done as u64);
        if done >= total {
            pb.finish_and_clear();
        }
    }))
}

/// Loads the model named by `-m`, or the demo model when `allow_demo` and no `-m` was given
/// (saying so on stderr).
pub fn load_engine(
    args: &ModelArgs,
    allow_demo: bool,
) -> Result<Engine, Box<dyn std::error::Error>> {
    let device: Device = args.device.parse()?;
    let path = match &args.model {
        Some(p) => p.clone(),
        None if allow_demo => {
            eprintln!(
                "pn: no model given (-m), using the built-in DEMO model: a 17M-parameter Qwen3.5-architecture\n\
                 pn: model trained on Python source, quantized to PN3 ({}).\n\
                 pn: To run a real model: pn run -m /path/to/Qwen3.8-27B-PN3.gguf -p \"...\"",
                pn_runtime::DEMO_MODEL_PATH
            );
            PathBuf::from(pn_runtime::DEMO_MODEL_PATH)
        }
        None => return Err("no model given: pass a GGUF model with -m PATH".into()),
    };
    let options = EngineOptions {
        device,
        context: args.ctx_size,
        kv_type_k: args.cache_type_k,
        kv_type_v: args.cache_type_v,
        threads: args.threads,
        speculation: args.speculation(),
        prompt_cache_checkpoints: args.ctx_checkpoints,
        prompt_cache_interval: args.checkpoint_interval,
        template_isolation: args.template_sandbox.isolation()?,
        ..EngineOptions::default()
    };
    let pb = bar(1, "{msg} {bar:40} {percent}%");
    let engine = Engine::load_with_progress(&path, options, &mut |p: LoadProgress| {
        pb.set_message(p.stage);
        pb.set_length(p.total);
        pb.set_position(p.done);
    })?;
    pb.finish_and_clear();
    Ok(engine)
}
