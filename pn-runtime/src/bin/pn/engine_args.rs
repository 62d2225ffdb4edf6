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

/// Model, device and context flags (llama.cpp spellings: see `llama_flags::FLAGS`).
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// GGUF model (`qwen35` architecture). Without it: the demo model built into `pn`.
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// Context size in tokens (0: min(4096, the model's)).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 0)]
    pub ctx_size: usize,
    /// CPU threads (default: the physical cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// Device: cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Layers to offload (-ngl; llama.cpp's spelling). pn runs the whole model on --device:
    /// accepted for scripts, with a note on the CPU.
    #[arg(long = "n-gpu-layers", alias = "gpu-layers", value_name = "N")]
    pub n_gpu_layers: Option<String>,
    /// Flash attention (-fa): accepted; pn's attention is always fused.
    #[arg(long = "flash-attn", num_args = 0..=1, default_missing_value = "on", value_parser = ["on", "off", "auto"])]
    pub flash_attn: Option<String>,
    /// KV cache type for K: f32, f16, q8_0 or q4_0 (-ctk).
    #[arg(long = "cache-type-k", alias = "ctk", default_value = "f16")]
    pub cache_type_k: KvCacheType,
    /// KV cache type for V: f32, f16, q8_0 or q4_0 (-ctv).
    #[arg(long = "cache-type-v", alias = "ctv", default_value = "f16")]
    pub cache_type_v: KvCacheType,
    /// Most tokens per prefill step (-b; llama.cpp's logical batch): caps --ubatch-size.
    #[arg(short = 'b', long = "batch-size")]
    pub batch_size: Option<usize>,
    /// Tokens per prefill step (-ub; default 64, `pn bench` 512 as llama-bench).
    #[arg(long = "ubatch-size")]
    pub ubatch_size: Option<usize>,
    /// Lock the process's memory (the mapped model included) so it is never swapped out.
    #[arg(long)]
    pub mlock: bool,
    /// Read the model into memory instead of mapping it: a file truncated or rewritten while pn
    /// runs then changes nothing (mapped, pn exits with status 74 naming the file).
    #[arg(long = "no-mmap")]
    pub no_mmap: bool,
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
    /// Random seed: the same seed gives the same output (-1: a random seed, printed).
    #[arg(short = 's', long, default_value_t = RANDOM_SEED, allow_hyphen_values = true)]
    pub seed: i64,
}

/// `--seed -1`, llama.cpp's "pick a random seed" (also its `LLAMA_DEFAULT_SEED`, 0xFFFFFFFF).
pub const RANDOM_SEED: i64 = -1;

/// A seed of its own for this run: OS randomness through std's hasher keys.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

impl SamplingArgs {
    /// The seed `--seed` stands for: a fresh random one for -1 (and llama.cpp's 0xFFFFFFFF).
    pub fn resolve_seed(&self) -> u64 {
        match self.seed {
            RANDOM_SEED | 0xFFFF_FFFF => random_seed(),
            s => s as u64,
        }
    }

    /// The sampler parameters; a random `--seed` is drawn here, once per call.
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
            seed: self.resolve_seed(),
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

/// The engine options these flags ask for; what they leave unset is `EngineOptions::default()`'s
/// (threads: the library's default, the physical cores).
pub fn engine_options(args: &ModelArgs) -> Result<EngineOptions, Box<dyn std::error::Error>> {
    let defaults = EngineOptions::default();
    let batch = args
        .ubatch_size
        .unwrap_or(defaults.batch)
        .min(args.batch_size.unwrap_or(usize::MAX))
        .max(1);
    Ok(EngineOptions {
        device: args.device.parse()?,
        context: args.ctx_size,
        kv_type_k: args.cache_type_k,
        kv_type_v: args.cache_type_v,
        threads: args.threads.unwrap_or(defaults.threads),
        batch,
        speculation: args.speculation(),
        prompt_cache_checkpoints: args.ctx_checkpoints,
        prompt_cache_interval: args.checkpoint_interval,
        template_isolation: args.template_sandbox.isolation()?,
        no_mmap: args.no_mmap,
        ..defaults
    })
}

/// The one-line note for `-ngl` on the CPU (`None`: no note; on CUDA every layer is offloaded).
pub fn gpu_layers_note(args: &ModelArgs, device: Device) -> Option<String> {
    match (&args.n_gpu_layers, device) {
        (Some(n), Device::Cpu) => Some(format!(
            "pn: -ngl {n}: pn runs on the CPU unless --device cuda (which offloads every layer); running on the CPU"
        )),
        _ => None,
    }
}

/// Loads the model named by `-m`, or the demo model built into `pn` when no `-m` was given
/// (saying so on stderr). `allow_demo: false` asks for `-m` instead.
pub fn load_engine(
    args: &ModelArgs,
    allow_demo: bool,
) -> Result<Engine, Box<dyn std::error::Error>> {
    load_engine_with(args, allow_demo, EngineOptions::clone)
}

/// [`load_engine`] with the options adjusted by `edit` (a chat template of the command's own).
pub fn load_engine_with(
    args: &ModelArgs,
    allow_demo: bool,
    edit: impl FnOnce(&EngineOptions) -> EngineOptions,
) -> Result<Engine, Box<dyn std::error::Error>> {
    let options = edit(&engine_options(args)?);
    if let Some(note) = gpu_layers_note(args, options.device) {
        eprintln!("{note}");
    }
    let pb = bar(1, "{msg} {bar:40} {percent}%");
    let mut progress = |p: LoadProgress| {
        pb.set_message(p.stage);
        pb.set_length(p.total);
        pb.set_position(p.done);
    };
    let engine = match &args.model {
        Some(path) => Engine::load_with_progress(path, options, &mut progress)?,
        None if allow_demo => {
            crate::demo::announce();
            let file = gguf_io::GgufFile::from_static(crate::demo::demo_bytes())?;
            Engine::load_gguf(file, crate::demo::DEMO_NAME, options, &mut progress)?
        }
        None => return Err("no model given: pass a GGUF model with -m PATH".into()),
    };
    pb.finish_and_clear();
    if args.mlock {
        lock_memory();
    }
    Ok(engine)
}

/// `--mlock`: locks every page the process has and will map (the model's included); says so
/// when the system refuses (RLIMIT_MEMLOCK) and goes on.
fn lock_memory() {
    #[cfg(unix)]
    {
        // SAFETY: mlockall has no memory-safety preconditions; it only pins pages.
        let rc = unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) };
        if rc != 0 {
            eprintln!(
                "pn: --mlock: {} (raise `ulimit -l`); going on unlocked",
                std::io::Error::last_os_error()
            );
        }
    }
    #[cfg(not(unix))]
    eprintln!("pn: --mlock is not supported on this system; going on unlocked");
}

/// The chat-template flags of `pn run` and `pn chat`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ChatTemplateArgs {
    /// Jinja chat template file to use instead of the model's `tokenizer.chat_template`.
    #[arg(long = "chat-template-file")]
    pub chat_template_file: Option<PathBuf>,
    /// Accepted for llama.cpp scripts: pn always renders the Jinja template.
    #[arg(long)]
    pub jinja: bool,
}

impl ChatTemplateArgs {
    /// The template source `--chat-template-file` names, if any.
    pub fn source(&self) -> Result<Option<String>, Box<dyn std::error::Error>> {
        self.chat_template_file
            .as_deref()
            .map(|p| {
                std::fs::read_to_string(p)
                    .map_err(|e| format!("cannot read {}: {e}", p.display()).into())
            })
            .transpose()
    }
}
