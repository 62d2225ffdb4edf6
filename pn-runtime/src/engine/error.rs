//! Errors of loading a model and generating with it, worded so a user can act on them.

use std::path::PathBuf;
use thiserror::Error;

/// Everything [`Engine`](super::Engine) and [`Session`](super::Session) can fail with.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The model path does not exist.
    #[error(
        "model file not found: {path} (the path given to Engine::load must name a GGUF model file)"
    )]
    NotFound {
        /// The path given.
        path: PathBuf,
    },
    /// The file exists but does not start with the GGUF magic.
    #[error("{path} is not a GGUF file (it starts with {found:02x?}, expected \"GGUF\")")]
    NotGguf {
        /// The file.
        path: PathBuf,
        /// Its first bytes.
        found: Vec<u8>,
    },
    /// The GGUF is of another model family.
    #[error("{path}: architecture `{found}` is not supported (pn runs `qwen35` models: Qwen3.5/Qwen3.8 hybrids)")]
    WrongArchitecture {
        /// The file.
        path: PathBuf,
        /// `general.architecture` of the file.
        found: String,
    },
    /// A PN-quantized tensor holds a block that cannot be decoded.
    #[error("invalid PN tensor `{tensor}`, row {row}: {source} (the file is corrupt or was written by a buggy quantizer)")]
    InvalidPnTensor {
        /// Tensor name.
        tensor: String,
        /// Row inside the tensor.
        row: u64,
        /// The block-level error (names the block).
        source: pn_format::PnError,
    },
    /// The device string could not be parsed.
    #[error("unknown device `{0}` (expected `cpu`, `cuda` or `cuda:N`)")]
    UnknownDevice(String),
    /// CUDA was requested but this build has no CUDA kernels.
    #[error("CUDA requested (device cuda:{ordinal}) but this build has no CUDA kernels ({reason}); load it on Device::Cpu instead (EngineOptions::device)")]
    CudaNoKernels {
        /// Device ordinal requested.
        ordinal: usize,
        /// Why there are no kernels (from `pn --version`).
        reason: String,
    },
    /// CUDA was requested but the NVIDIA driver library cannot be loaded.
    #[error("CUDA requested (device cuda:{ordinal}) but the NVIDIA driver library (libcuda.so.1) is not present: install the NVIDIA driver or load on Device::Cpu (EngineOptions::device)")]
    CudaNoDriver {
        /// Device ordinal requested.
        ordinal: usize,
    },
    /// CUDA was requested for a device ordinal that does not exist.
    #[error("CUDA device cuda:{ordinal} does not exist ({count} present); set EngineOptions::device to another Device::Cuda(N) or to Device::Cpu")]
    CudaNoDevice {
        /// Device ordinal requested.
        ordinal: usize,
        /// Devices present.
        count: i32,
    },
    /// The CUDA device could not be opened or the model could not be put on it.
    #[error("CUDA device cuda:{ordinal}: {source}")]
    Cuda {
        /// Device ordinal.
        ordinal: usize,
        /// The backend's error.
        source: qwen_model::cuda::CudaError,
    },
    /// The model, one session's KV cache and state, and the backend's scratch do not fit in the
    /// device's free memory.
    #[error("the model does not fit on CUDA device cuda:{ordinal}: it needs {} but {free_mib} MiB of {total_mib} MiB are free; use a smaller EngineOptions::context (KV cache), a smaller KV type (EngineOptions::kv_type_k/kv_type_v), fewer EngineOptions::prompt_cache_checkpoints, or a smaller quantization", .plan.describe())]
    CudaOutOfMemory {
        /// Device ordinal.
        ordinal: usize,
        /// Every term of the footprint.
        plan: qwen_model::cuda::MemoryPlan,
        /// Free device memory in MiB.
        free_mib: u64,
        /// Device memory in MiB.
        total_mib: u64,
    },
    /// K and V caches of different types on a backend whose attention kernels read one type
    /// for both.
    #[error("K cache type {k} and V cache type {v} differ, which {device} does not support; use the same type for both (EngineOptions::kv_type_k and kv_type_v)")]
    MixedKvTypes {
        /// The K cache type asked for.
        k: String,
        /// The V cache type asked for.
        v: String,
        /// The device.
        device: String,
    },
    /// The KV cache element type is not supported by the chosen backend.
    #[error("KV cache type {kv} is not supported on {device} (supported: {supported})")]
    UnsupportedKvType {
        /// The type asked for.
        kv: String,
        /// The device.
        device: String,
        /// The types the device supports, comma-separated.
        supported: String,
    },
    /// The context asked for is longer than the model was trained for.
    #[error("context {requested} is larger than the model supports ({max}, `qwen35.context_length`); set EngineOptions::context to {max} or less")]
    ContextTooLarge {
        /// Positions requested.
        requested: usize,
        /// The model's trained context length.
        max: usize,
    },
    /// The KV cache for the context asked for would not fit in memory.
    #[error("context {requested} needs {needed_mib} MiB of KV cache per session but only {available_mib} MiB of memory is available; use a smaller EngineOptions::context or a smaller KV type (EngineOptions::kv_type_k/kv_type_v)")]
    ContextOutOfMemory {
        /// Positions requested.
        requested: usize,
        /// KV cache size in MiB.
        needed_mib: u64,
        /// Available memory in MiB.
        available_mib: u64,
    },
    /// Sessions at once (`pn serve --parallel`) whose KV caches and states would not fit in memory.
    #[error("{slots} parallel sessions of context {context} need {needed_mib} MiB ({per_slot_mib} MiB each: KV cache and recurrent state) but only {available_mib} MiB of memory is available; use a smaller --parallel, --ctx-size or KV type")]
    SlotsOutOfMemory {
        /// Sessions asked for.
        slots: usize,
        /// Positions per session.
        context: usize,
        /// One session's KV cache and recurrent state, in MiB.
        per_slot_mib: u64,
        /// All of them, in MiB.
        needed_mib: u64,
        /// Available memory in MiB.
        available_mib: u64,
    },
    /// The prompt plus generation do not fit in the session's context.
    #[error("prompt of {prompt} tokens does not fit in the context of {context} positions (already used: {used}); load the engine with a larger EngineOptions::context, or reset the session to free it")]
    PromptTooLong {
        /// Prompt tokens.
        prompt: usize,
        /// Positions already used.
        used: usize,
        /// Session capacity.
        context: usize,
    },
    /// Every slot of a [`Batch`](super::batch::Batch) runs a sequence.
    #[error("all {slots} slots of the batch are running a sequence; step the batch until one finishes, or cancel one")]
    BatchFull {
        /// Slots of the batch.
        slots: usize,
    },
    /// A batch slot index that does not exist or whose slot runs a sequence.
    #[error("batch slot {slot} is busy or does not exist (the batch has {slots} slots)")]
    BatchSlot {
        /// The slot asked for.
        slot: usize,
        /// Slots of the batch.
        slots: usize,
    },
    /// Empty input where tokens are needed.
    #[error("empty prompt: there is nothing to condition the generation on")]
    EmptyPrompt,
    /// Reading or running the model failed.
    #[error(transparent)]
    Model(#[from] qwen_model::ModelError),
    /// The GGUF reader failed.
    #[error(transparent)]
    Gguf(#[from] gguf_io::GgufError),
    /// The tokenizer could not be built or failed.
    #[error(transparent)]
    Tokenizer(#[from] crate::tokenizer::TokenizerError),
    /// The chat template failed.
    #[error(transparent)]
    Template(#[from] crate::chat_template::ChatTemplateError),
}

/// Result type of the engine.
pub type Result<T> = std::result::Result<T, EngineError>;
