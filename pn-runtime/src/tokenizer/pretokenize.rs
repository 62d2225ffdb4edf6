//! Pre-tokenizer choices keyed by `tokenizer.ggml.pre`: the split regex and whether the input is
//! NFC-normalised first (HF's Qwen tokenizers normalise; llama.cpp does not, see the module docs
//! of [`crate::tokenizer`]).

/// The `tokenizer.ggml.pre` values this crate implements.
pub const SUPPORTED: &[&str] = &["qwen35", "qwen2"];

/// Qwen3.5/3.6/3.8: Qwen2's pattern with combining marks (`\p{M}`) joining letters.
const QWEN35: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2/2.5/3.
const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How text is cut into words before BPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreTokenizer {
    /// The `tokenizer.ggml.pre` name.
    pub name: &'static str,
    /// The split regex (matches become words, the rest is isolated too).
    pub regex: &'static str,
    /// Whether to NFC-normalise before splitting.
    pub nfc: bool,
}

/// The pre-tokenizer for a `tokenizer.ggml.pre` value, or `None` if unknown.
pub fn lookup(name: &str) -> Option<PreTokenizer> {
    match name {
        "qwen35" => Some(PreTokenizer {
            name: "qwen35",
            regex: QWEN35,
            nfc: true,
        }),
        "qwen2" => Some(PreTokenizer {
            name: "qwen2",
            regex: QWEN2,
            nfc: true,
        }),
        _ => None,
    }
}
