//! The tokenizer's inputs as stored in a GGUF file (`tokenizer.ggml.*`, llama.cpp conventions),
//! gathered into a plain struct so a tokenizer can also be built without a file.

use super::TokenizerError;

/// Metadata key of the tokenizer model name.
pub const KEY_MODEL: &str = "tokenizer.ggml.model";
/// Metadata key of the pre-tokenizer name.
pub const KEY_PRE: &str = "tokenizer.ggml.pre";
/// Metadata key of the token strings.
pub const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
/// Metadata key of the token types.
pub const KEY_TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
/// Metadata key of the BPE merges.
pub const KEY_MERGES: &str = "tokenizer.ggml.merges";
/// Metadata key of the chat template.
pub const KEY_CHAT_TEMPLATE: &str = "tokenizer.chat_template";

/// How llama.cpp classifies a vocabulary entry (`tokenizer.ggml.token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenType {
    /// 0: no type recorded; treated like [`TokenType::Normal`].
    Undefined,
    /// 1: an ordinary BPE token.
    Normal,
    /// 2: the unknown token.
    Unknown,
    /// 3: a control token (`<|im_start|>`): matched in text only when special tokens are parsed.
    Control,
    /// 4: a user-defined added token (`<think>`): always matched in text.
    UserDefined,
    /// 5: an unused id (embedding padding such as `[PAD248100]`): never produced nor sampled.
    Unused,
    /// 6: a raw byte token (`<0x0A>`, SentencePiece vocabularies).
    Byte,
}

impl TokenType {
    /// The type with llama.cpp id `id`.
    pub fn from_id(id: i64) -> Option<TokenType> {
        Some(match id {
            0 => TokenType::Undefined,
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => return None,
        })
    }

    /// Whether the token is an added token matched as a whole in the input text.
    pub fn is_added(self) -> bool {
        matches!(self, TokenType::Control | TokenType::UserDefined)
    }
}

/// Everything a byte-level BPE tokenizer is built from, as found under `tokenizer.ggml.*`.
#[derive(Debug, Clone, Default)]
pub struct TokenizerMetadata {
    /// `tokenizer.ggml.model` (`"gpt2"` for byte-level BPE).
    pub model: String,
    /// `tokenizer.ggml.pre` (`"qwen35"`), if present.
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`: the token string of every id (byte-level text for normal tokens).
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type`, raw llama.cpp ids; empty means every token is normal.
    pub token_types: Vec<i64>,
    /// `tokenizer.ggml.merges`: `"left right"` rules in priority order.
    pub merges: Vec<String>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_token_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_token_id: Option<u32>,
    /// `tokenizer.ggml.eot_token_id`.
    pub eot_token_id: Option<u32>,
    /// `tokenizer.ggml.eom_token_id`.
    pub eom_token_id: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub padding_token_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token` (absent: false, llama.cpp's default for Qwen).
    pub add_bos_token: Option<bool>,
    /// `tokenizer.chat_template`, if present.
    pub chat_template: Option<String>,
}

impl TokenizerMetadata {
    /// Reads the `tokenizer.*` keys of a GGUF file.
    ///
    /// Required: `tokenizer.ggml.model`, `tokenizer.ggml.tokens`, and `tokenizer.ggml.merges`
    /// for BPE; the rest is optional. Errors name the key.
    pub fn from_gguf(file: &gguf_io::GgufFile) -> Result<TokenizerMetadata, TokenizerError> {
        let model = file.get_str(KEY_MODEL)?.to_string();
        let pre = optional(file, KEY_PRE, |k| file.get_str(k).map(str::to_string))?;
        let tokens = strings(file, KEY_TOKENS)?;
        let token_types =
            optional(file, KEY_TOKEN_TYPE, |k| file.get_i64_array(k))?.unwrap_or_default();
        let merges = optional(file, KEY_MERGES, |k| strings(file, k))?.unwrap_or_default();
        let id = |key: &str| optional(file, key, |k| file.get_u32(k));
        Ok(TokenizerMetadata {
            model,
            pre,
            tokens,
            token_types,
            merges,
            bos_token_id: id("tokenizer.ggml.bos_token_id")?,
            eos_token_id: id("tokenizer.ggml.eos_token_id")?,
            eot_token_id: id("tokenizer.ggml.eot_token_id")?,
            eom_token_id: id("tokenizer.ggml.eom_token_id")?,
            padding_token_id: id("tokenizer.ggml.padding_token_id")?,
            add_bos_token: optional(file, "tokenizer.ggml.add_bos_token", |k| file.get_bool(k))?,
            chat_template: optional(file, KEY_CHAT_TEMPLATE, |k| {
                file.get_str(k).map(str::to_string)
            })?,
        })
    }

    /// The decoded token types, one per token (all normal when the key was absent).
    pub fn types(&self) -> Result<Vec<TokenType>, TokenizerError> {
        if self.token_types.is_empty() {
            return Ok(vec![TokenType::Normal; self.tokens.len()]);
        }
        if self.token_types.len() != self.tokens.len() {
            return Err(TokenizerError::Metadata {
                key: KEY_TOKEN_TYPE.into(),
                reason: format!(
                    "{} entries for {} tokens",
                    self.token_types.len(),
                    self.tokens.len()
                ),
            });
        }
        self.token_types
            .iter()
            .enumerate()
            .map(|(id, &ty)| {
                TokenType::from_id(ty).ok_or(TokenizerError::BadTokenType { id: id as u32, ty })
            })
            .collect()
    }
}

/// A string array as owned strings.
fn strings(file: &gguf_io::GgufFile, key: &str) -> Result<Vec<String>, TokenizerError> {
    Ok(file
        .get_str_array(key)?
        .into_iter()
        .map(str::to_string)
        .collect())
}

/// `Ok(None)` when the key is absent; type errors still surface.
fn optional<T, E>(
    file: &gguf_io::GgufFile,
    key: &str,
    read: impl FnOnce(&str) -> Result<T, E>,
) -> Result<Option<T>, TokenizerError>
where
    TokenizerError: From<E>,
{
    if file.get(key).is_none() {
        return Ok(None);
    }
    Ok(Some(read(key)?))
}
