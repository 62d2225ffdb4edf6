//! Errors of model loading and evaluation.

use thiserror::Error;

/// Everything that can go wrong loading or running a model. Variants name the key, tensor or
/// token involved.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ModelError {
    /// The GGUF file could not be read or a metadata key had the wrong type.
    #[error(transparent)]
    Gguf(#[from] gguf_io::GgufError),
    /// A required metadata key is absent.
    #[error("missing metadata key `{key}`")]
    MissingKey {
        /// The key.
        key: String,
    },
    /// A metadata key holds a value the model cannot use.
    #[error("metadata key `{key}`: {reason}")]
    BadKey {
        /// The key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// The file's architecture is not `qwen35`.
    #[error("unsupported architecture `{arch}` (key `general.architecture`; expected `qwen35`)")]
    UnsupportedArch {
        /// The value found.
        arch: String,
    },
    /// A required tensor is absent.
    #[error("missing tensor `{name}` (expected shape {expected:?})")]
    MissingTensor {
        /// Tensor name.
        name: String,
        /// The shape it should have (GGUF order, fastest first).
        expected: Vec<u64>,
    },
    /// A tensor has the wrong shape.
    #[error("tensor `{name}` has shape {found:?}, expected {expected:?} (GGUF order)")]
    BadShape {
        /// Tensor name.
        name: String,
        /// Expected `ne` (fastest first).
        expected: Vec<u64>,
        /// Found `ne`.
        found: Vec<u64>,
    },
    /// A tensor has a storage type not allowed for its role.
    #[error("tensor `{name}` has type {found}, allowed: {allowed}")]
    BadType {
        /// Tensor name.
        name: String,
        /// Found type name.
        found: String,
        /// Allowed type names.
        allowed: String,
    },
    /// A tensor's byte size disagrees with its shape and type.
    #[error("tensor `{name}`: {reason}")]
    BadTensorData {
        /// Tensor name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// A token id outside the vocabulary.
    #[error("token id {token} at input index {index} is outside the vocabulary (size {vocab})")]
    TokenOutOfRange {
        /// The id.
        token: u32,
        /// Its index in the input.
        index: usize,
        /// Vocabulary size.
        vocab: usize,
    },
    /// The sequence would exceed the state's KV capacity.
    #[error("context full: {needed} positions needed, state capacity is {capacity}")]
    ContextFull {
        /// Positions needed.
        needed: usize,
        /// Capacity of the state.
        capacity: usize,
    },
    /// A caller-provided buffer or argument has the wrong size.
    #[error("bad argument: {0}")]
    BadArgument(String),
    /// The model file has no MTP block but an MTP op was requested.
    #[error("the model has no MTP block (`nextn_predict_layers` is 0 or absent)")]
    NoMtp,
    /// The backend cannot run this model or state: a kernel written for another head size, a
    /// KV cache type it does not store ([`Backend::supports`](crate::Backend::supports)).
    #[error(transparent)]
    Unsupported(#[from] crate::backend::Unsupported),
    /// A backend failed (device allocation, launch).
    #[error("backend error: {0}")]
    Backend(String),
}
