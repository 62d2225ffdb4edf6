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

mod error;
mod load;
mod options;
mod prompt_cache;
mod session;

pub use error::{EngineError, Result};
pub use load::LoadProgress;
pub use options::{
    Device, EngineOptions, KvCacheType, Speculation, DEFAULT_CONTEXT,
    DEFAULT_PROMPT_CACHE_CHECKPOINTS, DEFAULT_PROMPT_CACHE_INTERVAL,
};
pub use prompt_cache::checkpoint_bytes;
pub use session::{
    CancelToken, FinishReason, Generation, ProgressFn, Prompt, Session, StopConditions, Timings,
    TokenEvent,
};

use crate::chat_template::{ChatMessage, ChatTemplate};
use crate::sampling::{StopTokens, TokenMask};
use crate::tokenizer::Tokenizer;
use gguf_io::GgufFile;
use qwen_model::cuda::CudaBackend;
use qwen_model::{CpuBackend, Model, ModelConfig};
use std::path::{Path, PathBuf};

/// The model that ships in the repository and that `pn run` / `pn chat` use without `-m`: a
/// ~17M-parameter model of the exact Qwen3.5 architecture trained on Python source, quantized
/// by `pn quantize` to the PN3 mix (P0k+19, Hadamard-rotated; 10.7 MB). Its README beside it
/// gives the command that made it and its measured quality against the F16 original.
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
    Cpu(Model<CpuBackend>),
    /// On a CUDA device.
    Cuda(Model<CudaBackend>),
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

/// A loaded model, ready to generate. `Send + Sync`: share it (`Arc<Engine>` or `&Engine`)
/// between threads, each with its own [`Session`].
pub struct Engine {
    model: LoadedModel,
    tokenizer: Tokenizer,
    template: ChatTemplate,
    template_is_fallback: bool,
    mask: TokenMask,
    stop_tokens: StopTokens,
    options: EngineOptions,
    context: usize,
    path: PathBuf,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("path", &self.path)
            .field("options", &self.options)
            .field("context", &self.context)
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
    /// [`context`](Self::context) positions).
    pub fn session(&self) -> Result<Session<'_>> {
        Session::new(self)
    }

    /// The model when it runs on the CPU backend (for CPU-only tuning such as thread counts);
    /// `None` on a CUDA device.
    pub fn cpu_model(&self) -> Option<&Model<CpuBackend>> {
        match &self.model {
            LoadedModel::Cpu(m) => Some(m),
            LoadedModel::Cuda(_) => None,
        }
    }

    /// The model when it runs on a CUDA device; `None` on the CPU.
    pub fn cuda_model(&self) -> Option<&Model<CudaBackend>> {
        match &self.model {
            LoadedModel::Cuda(m) => Some(m),
            LoadedModel::Cpu(_) => None,
        }
    }

    /// The model's configuration (shapes, vocabulary, layer kinds), whatever the backend.
    pub fn config(&self) -> &ModelConfig {
        with_model!(&self.model, m => &m.config)
    }

    /// The GGUF file the model was loaded from (metadata, tensor table).
    pub fn file(&self) -> &GgufFile {
        with_model!(&self.model, m => m.file())
    }

    /// The device the model runs on.
    pub fn device(&self) -> Device {
        self.options.device
    }

    /// The backend's human-readable name (the CPU's thread count, the CUDA device's ordinal and
    /// compute capability).
    pub fn backend_name(&self) -> String {
        use qwen_model::Backend;
        with_model!(&self.model, m => m.backend.name())
    }

    pub(crate) fn loaded(&self) -> &LoadedModel {
        &self.model
    }

    /// The tokenizer built from the GGUF metadata.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The chat template in use.
    pub fn chat_template(&self) -> &ChatTemplate {
        &self.template
    }

    /// Whether the model has no template of its own and [`FALLBACK_CHAT_TEMPLATE`] is used.
    pub fn chat_template_is_fallback(&self) -> bool {
        self.template_is_fallback
    }

    /// Renders `messages` with the chat template and the assistant generation prompt.
    pub fn render_chat(&self, messages: &[ChatMessage]) -> Result<String> {
        Ok(self.template.render_messages(messages, true)?)
    }

    /// Positions each session holds.
    pub fn context(&self) -> usize {
        self.context
    }

    /// The options the engine was loaded with.
    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    /// The model file.
    pub fn path(&self) -> &Path {
        &self.path
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
        &self.mask
    }

    /// Ids that end a generation (both of Qwen's end tokens, `<|im_end|>` and `<|endoftext|>`).
    pub fn stop_tokens(&self) -> &StopTokens {
        &self.stop_tokens
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

    fn assert_send<T: Send>() {}

    /// Servers hand sessions to worker threads; the CUDA variant must not take that away.
    #[test]
    fn session_is_send() {
        assert_send::<Session<'static>>();
    }
}
