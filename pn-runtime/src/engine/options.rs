//! What [`Engine::load`](super::Engine::load) is told: device, context, KV cache type, threads.

use super::error::EngineError;
use std::fmt;
use std::str::FromStr;

/// Where the model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    /// The CPU backend (exact; SIMD where available).
    #[default]
    Cpu,
    /// A CUDA device by ordinal (`cuda`, `cuda:0`, `cuda:1`...).
    Cuda(usize),
}

impl FromStr for Device {
    type Err = EngineError;

    fn from_str(s: &str) -> Result<Device, EngineError> {
        let t = s.trim().to_ascii_lowercase();
        match t.as_str() {
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda(0)),
            _ => t
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| EngineError::UnknownDevice(s.to_string())),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// Element type of the attention KV cache (f32, f16, q8_0, q4_0), chosen per K and V; the CPU
/// backend's attention reads every type in place.
pub use qwen_model::KvCacheType;

/// Speculative decoding setting (see [`crate::speculative`]).
pub use crate::speculative::Speculation;

/// How decoding reads the logits row it samples from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogitsPath {
    /// [`Candidates`](Self::Candidates) on a backend where downloading a row is expensive
    /// (`qwen_model::Backend::prefers_top_k`: CUDA), [`FullRow`](Self::FullRow) on the CPU.
    #[default]
    Auto,
    /// Select the sampler's best candidates on the backend and download only those
    /// (`Sampler::candidates_needed`), wherever the sampler can choose from them exactly as
    /// from the row; the whole row where a stage reads it (log probabilities, a grammar,
    /// penalties, top-k off or over `qwen_model::topk::DEVICE_TOP_K_MAX`, top-p off). The
    /// tokens are the same as [`FullRow`](Self::FullRow)'s.
    Candidates,
    /// Download every logits row the sampler reads.
    FullRow,
}

impl LogitsPath {
    /// Whether decoding on a backend that `prefers_top_k` (or not) takes the candidates.
    pub fn candidates(self, prefers_top_k: bool) -> bool {
        match self {
            LogitsPath::Auto => prefers_top_k,
            LogitsPath::Candidates => true,
            LogitsPath::FullRow => false,
        }
    }
}

/// Default context when none is given: long enough for chat, small enough that the KV cache of a
/// 27B model fits in a few GiB (llama.cpp's default is 4096 too).
pub const DEFAULT_CONTEXT: usize = 4096;

/// Default [`EngineOptions::prompt_cache_interval`]: a long prompt that diverges somewhere in
/// the middle recomputes at most this many tokens before the divergence (while the checkpoints
/// are not thinned out by eviction).
pub const DEFAULT_PROMPT_CACHE_INTERVAL: usize = 512;

/// Default [`EngineOptions::prompt_cache_checkpoints`]: the current request's three (previous
/// turn's end, assistant turn start, prompt end) plus one more (an earlier turn, or the roundest
/// interval position of a long prompt); about 600 MiB for the 27B shape (150 MiB each), 1.7 MB
/// for the demo model.
pub const DEFAULT_PROMPT_CACHE_CHECKPOINTS: usize = 4;

/// How to load a model. `EngineOptions::default()` follows llama.cpp's defaults: the CPU
/// backend on the physical cores ([`physical_cores`](super::physical_cores)), a context of
/// [`DEFAULT_CONTEXT`] (or the model's, if shorter) and an f16 KV cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineOptions {
    /// Where to run.
    pub device: Device,
    /// Positions each session can hold; 0 means `min(DEFAULT_CONTEXT, model's context)`.
    pub context: usize,
    /// Element type of the K cache (default f16, as llama.cpp; f32 is exact, q8_0/q4_0 smaller).
    pub kv_type_k: KvCacheType,
    /// Element type of the V cache (default f16).
    pub kv_type_v: KvCacheType,
    /// CPU threads (default: the physical cores); 0 uses every logical CPU.
    pub threads: usize,
    /// Check every block of every PN tensor when loading (cheap next to the first forward pass;
    /// it turns a corrupt file into an error naming the tensor and block instead of garbage).
    pub validate_pn: bool,
    /// Tokens per internal prefill step (bounds the activation memory of long prompts).
    pub batch: usize,
    /// A chat template to use instead of the model's `tokenizer.chat_template`.
    pub chat_template: Option<String>,
    /// Where the chat template renders: in this process (the default), or in a sandboxed child
    /// process for templates from untrusted model files (see
    /// [`TemplateIsolation`](crate::chat_template::TemplateIsolation)).
    pub template_isolation: crate::chat_template::TemplateIsolation,
    /// Prompt cache: a recurrent-state checkpoint every this many prompt tokens (0: only at
    /// turn starts and prompt ends). See [`checkpoint_bytes`](super::checkpoint_bytes) for
    /// the size of one.
    pub prompt_cache_interval: usize,
    /// Prompt cache: most checkpoints a session keeps (0: none; a new prompt then reuses only
    /// a session state it extends).
    pub prompt_cache_checkpoints: usize,
    /// Speculative decoding: MTP drafting by default (plain decoding for a model without an MTP
    /// block), or [`Speculation::None`].
    pub speculation: Speculation,
    /// Read the model file into memory (`--no-mmap`) instead of mapping it: slower to start and
    /// never shared with the page cache, but immune to the file changing on disk (a mapped file
    /// truncated under the process is a SIGBUS, see `gguf_io::mapwatch`).
    pub no_mmap: bool,
    /// Whether decoding downloads each logits row or only the sampler's best candidates
    /// (default [`LogitsPath::Auto`]: candidates on CUDA).
    pub logits_path: LogitsPath,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            device: Device::Cpu,
            context: 0,
            kv_type_k: KvCacheType::F16,
            kv_type_v: KvCacheType::F16,
            threads: super::physical_cores(),
            validate_pn: true,
            batch: 64,
            chat_template: None,
            template_isolation: crate::chat_template::TemplateIsolation::InProcess,
            prompt_cache_interval: DEFAULT_PROMPT_CACHE_INTERVAL,
            prompt_cache_checkpoints: DEFAULT_PROMPT_CACHE_CHECKPOINTS,
            speculation: Speculation::default(),
            no_mmap: false,
            logits_path: LogitsPath::Auto,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's defaults: an f16 KV cache and one thread per physical core.
    #[test]
    fn defaults_are_llama_cpps() {
        let o = EngineOptions::default();
        assert_eq!(
            (o.kv_type_k, o.kv_type_v),
            (KvCacheType::F16, KvCacheType::F16)
        );
        assert_eq!(o.threads, super::super::physical_cores());
        assert_eq!(o.device, Device::Cpu);
        assert_eq!(o.context, 0);
    }

    #[test]
    fn parses_devices() {
        assert_eq!("cpu".parse::<Device>().unwrap(), Device::Cpu);
        assert_eq!("CUDA".parse::<Device>().unwrap(), Device::Cuda(0));
        assert_eq!("cuda:2".parse::<Device>().unwrap(), Device::Cuda(2));
        for bad in ["tpu", "cuda:", "cuda:x", ""] {
            let e = bad.parse::<Device>().unwrap_err();
            assert!(e.to_string().contains("unknown device"), "{e}");
        }
    }
}
