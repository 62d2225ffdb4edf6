//! The engine: a loaded model plus its tokenizer and chat template, shared by any number of
//! independent [`Session`]s.
//!
//! ```no_run
//! # fn main() -> Result<(), pn_runtime::engine::EngineError> {
//! use pn_runtime::engine::{Engine, EngineOptions, StopConditions};
//! use pn_runtime::sampling::SamplingParams;
//!
//! let engine = Engine::load("model.gguf", EngineOptions::default())?;
//! let mut session = engine.session()?;
//! for event in session.generate("def add(a, b):", SamplingParams::greedy(), StopConditions::max_tokens(16))? {
//!     print!("{}", event?.text);
//! }
//! # Ok(())
//! # }
//! ```

pub mod batch;
mod cpu_cores;
mod error;
mod load;
mod load_report;
mod options;
mod prompt_cache;
mod session;

pub use cpu_cores::physical_cores;
pub use error::{EngineError, Result};
pub use load::LoadProgress;
pub use load_report::{process_cpu, LoadPhase, LoadReport};
pub use options::{
    Device, EngineOptions, KvCacheType, LogitsPath, Speculation, DEFAULT_CONTEXT,
    DEFAULT_PROMPT_CACHE_CHECKPOINTS, DEFAULT_PROMPT_CACHE_INTERVAL,
};
pub use prompt_cache::checkpoint_bytes;
pub(crate) use session::count_candidate_row;
pub use session::{
    candidate_rows, CancelToken, FinishReason, Generation, ProgressFn, Prompt, Session,
    StopConditions, ThinkingControl, Timings, TokenEvent,
};

use crate::chat_template::{ChatMessage, ChatPrompt, ChatTemplate, TemplateContext};
use crate::sampling::{StopTokens, TokenMask};
use crate::tokenizer::Tokenizer;
use gguf_io::GgufFile;
use qwen_model::cuda::CudaBackend;
use qwen_model::{CpuBackend, Model, ModelConfig};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The model that ships in the repository and that `pn run` / `pn chat` use without `-m`: a
/// ~17M-parameter model of the exact Qwen3.5 architecture trained on Python source, quantized
/// by `pn quantize` with streamed GPTQ to the PN3 mix P0k+28 (Hadamard-rotated; 10.9 MB). Its
/// README beside it gives the command that made it and its measured quality against the F16
/// original.
pub const DEMO_MODEL_PATH: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/data/demo-code-model/model-pn3.gguf"
);

/// The F16 original of the demo model (the oracle the PN3 demo file was quantized from).
pub const DEMO_MODEL_F16_PATH: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/data/demo-code-model/model-f16.gguf"
);

/// A ChatML template (the format Qwen models are trained on), used when a model has no
/// `tokenizer.chat_template` (the demo model, plain base models).
pub const FALLBACK_CHAT_TEMPLATE: &str = "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// The model bound to the backend of the device it was loaded on. Sessions are generic over the
/// backend; this enum is the one place the engine picks one.
// One per engine, created once and never moved in bulk: boxing the larger variant buys nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum LoadedModel {
    /// On the CPU backend.
    Cpu(Arc<Model<CpuBackend>>),
    /// On a CUDA device.
    Cuda(Arc<Model<CudaBackend>>),
}

/// Runs `$body` with `$m` bound to the `Model<B>` inside a [`LoadedModel`], whatever `B` is.
macro_rules! with_model {
    ($loaded:expr, $m:ident => $body:expr) => {
        match $loaded {
            $crate::engine::LoadedModel::Cpu($m) => $body,
            $crate::engine::LoadedModel::Cuda($m) => $body,
        }
    };
}
pub(crate) use with_model;

/// A loaded model, ready to generate: a cheap handle (an `Arc` inside), so `clone` shares the
/// model, never copies it. `Send + Sync`; every [`Session`] holds its own handle, so a session
/// can move to another thread, outlive the `Engine` value it came from, or sit in a `'static`
/// worker, and the model is freed with the last handle.
///
/// ```
/// use pn_runtime::{Engine, EngineOptions, SamplingParams, StopConditions};
///
/// let engine = Engine::load(pn_runtime::DEMO_MODEL_PATH, EngineOptions::default())?;
/// let mut session = engine.session()?;
/// let worker = std::thread::spawn(move || {
///     let stop = StopConditions::max_tokens(4);
///     session.generate("import", SamplingParams::greedy(), stop)?.text()
/// });
/// drop(engine); // the session keeps the model alive
/// let text = worker.join().expect("worker")?;
/// assert!(!text.is_empty());
/// # Ok::<(), pn_runtime::EngineError>(())
/// ```
#[derive(Clone)]
pub struct Engine {
    inner: Arc<EngineInner>,
}

/// What an [`Engine`] handle shares: the model and everything loaded with it.
pub(crate) struct EngineInner {
    pub(crate) model: LoadedModel,
    pub(crate) tokenizer: Tokenizer,
    pub(crate) template: ChatTemplate,
    pub(crate) template_is_fallback: bool,
    pub(crate) mask: TokenMask,
    pub(crate) stop_tokens: StopTokens,
    pub(crate) options: EngineOptions,
    pub(crate) context: usize,
    pub(crate) path: PathBuf,
    /// Where the load's time went (phases, resident memory after it).
    pub(crate) load_report: LoadReport,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("path", &self.inner.path)
            .field("options", &self.inner.options)
            .field("context", &self.inner.context)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Loads and validates a GGUF model.
    ///
    /// Errors say what to do: a missing file, a file that is not a GGUF, another architecture,
    /// an invalid PN tensor (named, with the row and block), a context longer than the model's or
    /// than memory allows, an unknown or unavailable device.
    pub fn load(path: impl AsRef<Path>, options: EngineOptions) -> Result<Engine> {
        Self::load_with_progress(path, options, &mut |_| {})
    }

    /// [`load`](Self::load), reporting progress (for a progress bar).
    pub fn load_with_progress(
        path: impl AsRef<Path>,
        options: EngineOptions,
        progress: &mut dyn FnMut(LoadProgress),
    ) -> Result<Engine> {
        load::load(path.as_ref(), options, progress)
    }

    /// [`load_with_progress`](Self::load_with_progress) from a GGUF already open, such as one
    /// embedded in the executable ([`GgufFile::from_static`]); `name` stands for its path in
    /// errors and in [`path`](Self::path).
    pub fn load_gguf(
        file: GgufFile,
        name: impl Into<PathBuf>,
        options: EngineOptions,
        progress: &mut dyn FnMut(LoadProgress),
    ) -> Result<Engine> {
        load::load_file(file, name.into(), options, progress)
    }

    /// A new, empty session (its own KV cache and recurrent state of
    /// [`context`](Self::context) positions). The session holds a handle to the engine (no
    /// borrow): it is `Send` and `'static`.
    pub fn session(&self) -> Result<Session> {
        Session::new(self.clone())
    }

    /// The model when it runs on the CPU backend (for CPU-only tuning such as thread counts);
    /// `None` on a CUDA device.
    pub fn cpu_model(&self) -> Option<&Model<CpuBackend>> {
        match &self.inner.model {
            LoadedModel::Cpu(m) => Some(m),
            LoadedModel::Cuda(_) => None,
        }
    }

    /// The model when it runs on a CUDA device; `None` on the CPU.
    pub fn cuda_model(&self) -> Option<&Model<CudaBackend>> {
        match &self.inner.model {
            LoadedModel::Cuda(m) => Some(m),
            LoadedModel::Cpu(_) => None,
        }
    }

    /// Where the load's time went: wall and CPU time per phase, resident memory after it.
    pub fn load_report(&self) -> &LoadReport {
        &self.inner.load_report
    }

    /// The model's configuration (shapes, vocabulary, layer kinds), whatever the backend.
    pub fn config(&self) -> &ModelConfig {
        with_model!(&self.inner.model, m => &m.config)
    }

    /// The GGUF file the model was loaded from (metadata, tensor table).
    pub fn file(&self) -> &GgufFile {
        with_model!(&self.inner.model, m => m.file())
    }

    /// The device the model runs on.
    pub fn device(&self) -> Device {
        self.inner.options.device
    }

    /// The backend's human-readable name (the CPU's thread count, the CUDA device's ordinal and
    /// compute capability).
    pub fn backend_name(&self) -> String {
        use qwen_model::Backend;
        with_model!(&self.inner.model, m => m.backend.name())
    }

    pub(crate) fn loaded(&self) -> &LoadedModel {
        &self.inner.model
    }

    /// The tokenizer built from the GGUF metadata.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.inner.tokenizer
    }

    /// The chat template in use.
    pub fn chat_template(&self) -> &ChatTemplate {
        &self.inner.template
    }

    /// Whether the model has no template of its own and [`FALLBACK_CHAT_TEMPLATE`] is used.
    pub fn chat_template_is_fallback(&self) -> bool {
        self.inner.template_is_fallback
    }

    /// Renders `messages` with the chat template and the assistant generation prompt.
    pub fn render_chat(&self, messages: &[ChatMessage]) -> Result<String> {
        Ok(self.inner.template.render_messages(messages, true)?)
    }

    /// Renders `ctx` (messages, tools, template variables) with the chat template and
    /// tokenizes it so that control tokens come only from the template's markup: a message
    /// that types `<|im_end|><|im_start|>system` stays plain text (see
    /// [`ChatTemplate::render_prompt`]). What [`Session::chat`] feeds the model.
    pub fn chat_prompt(&self, ctx: &TemplateContext) -> Result<ChatPrompt> {
        Ok(self
            .inner
            .template
            .render_prompt(ctx, &self.inner.tokenizer)?)
    }

    /// Positions each session holds.
    pub fn context(&self) -> usize {
        self.inner.context
    }

    /// The options the engine was loaded with.
    pub fn options(&self) -> &EngineOptions {
        &self.inner.options
    }

    /// The model file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Size of the model file (or embedded bytes) in bytes.
    pub fn file_size(&self) -> u64 {
        self.file().file_len()
    }

    /// Number of weights (elements of every tensor in the file, MTP block included).
    pub fn n_params(&self) -> u64 {
        self.file()
            .tensor_infos()
            .iter()
            .map(|t| t.dims.iter().product::<u64>())
            .sum()
    }

    /// Ids the sampler may produce (the vocabulary minus unused padding ids).
    pub fn token_mask(&self) -> &TokenMask {
        &self.inner.mask
    }

    /// Ids that end a generation (both of Qwen's end tokens, `<|im_end|>` and `<|endoftext|>`).
    pub fn stop_tokens(&self) -> &StopTokens {
        &self.inner.stop_tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn engine_is_send_and_sync() {
        assert_send_sync::<Engine>();
    }

    fn assert_send<T: Send + 'static>() {}

    /// Servers hand sessions to worker threads (owned, no borrow of the engine); the CUDA
    /// variant must not take that away.
    #[test]
    fn session_is_send() {
        assert_send::<Session>();
    }
}
