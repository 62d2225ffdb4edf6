//! Errors raised while building a tokenizer from metadata or while encoding/decoding.

/// A tokenizer failure. Every variant names the metadata key, token id or input that caused it.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A required metadata key is absent or has the wrong type.
    #[error("tokenizer metadata `{key}`: {reason}")]
    Metadata {
        /// The GGUF key, e.g. `tokenizer.ggml.tokens`.
        key: String,
        /// What was wrong with it.
        reason: String,
    },
    /// `tokenizer.ggml.model` names a model this tokenizer does not implement.
    #[error("unsupported tokenizer model `{0}` (tokenizer.ggml.model): only byte-level BPE (`gpt2`) is supported")]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer this tokenizer does not know.
    #[error("unsupported pre-tokenizer `{0}` (tokenizer.ggml.pre): supported are {supported}", supported = super::pretokenize::SUPPORTED.join(", "))]
    UnsupportedPreTokenizer(String),
    /// A token type id outside the llama.cpp convention (0..=6).
    #[error("token {id} has unknown token type {ty} (tokenizer.ggml.token_type)")]
    BadTokenType {
        /// Token id.
        id: u32,
        /// The raw type value.
        ty: i64,
    },
    /// A merge rule is not of the form `"left right"`.
    #[error("merge rule {index} ({rule:?}) is not two tokens separated by a space (tokenizer.ggml.merges)")]
    BadMerge {
        /// Position in `tokenizer.ggml.merges`.
        index: usize,
        /// The rule text.
        rule: String,
    },
    /// A special-token id key points outside the vocabulary.
    #[error("`{key}` = {id} is outside the vocabulary of {n_vocab} tokens")]
    SpecialIdOutOfRange {
        /// The metadata key.
        key: String,
        /// The id it holds.
        id: u32,
        /// Number of tokens.
        n_vocab: usize,
    },
    /// Decoding was asked for an id that the vocabulary does not have.
    #[error("token id {id} is outside the vocabulary of {n_vocab} tokens")]
    IdOutOfRange {
        /// The offending id.
        id: u32,
        /// Number of tokens.
        n_vocab: usize,
    },
    /// [`PromptPart::Control`](super::PromptPart::Control) holds an id that is not a control
    /// token.
    #[error("token id {id} is not a control token (tokenizer.ggml.token_type)")]
    NotControl {
        /// The id given.
        id: u32,
    },
    /// The `tokenizers` library rejected the vocabulary/merges or failed to encode.
    #[error("tokenizer library: {0}")]
    Library(String),
    /// Reading the GGUF file failed.
    #[error(transparent)]
    Gguf(#[from] gguf_io::GgufError),
}
