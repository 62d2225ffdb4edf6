//! The text tokenizer, built from a GGUF's `tokenizer.ggml.*` metadata.
//!
//! Qwen models use byte-level BPE: the input is NFC-normalised, split into words by the
//! pre-tokenizer regex (`tokenizer.ggml.pre`, e.g. `qwen35`), each word's UTF-8 bytes are
//! written in the GPT-2 byte alphabet, and BPE merges them by rank. Added tokens (`<|im_start|>`,
//! `<think>`, ...) are matched in the text first and never split. No BOS is prepended unless
//! `tokenizer.ggml.add_bos_token` says so.
//!
//! Normalisation follows the HF tokenizer (and tiktoken): NFC is applied. llama.cpp does not
//! normalise, so on text whose NFC form differs (decomposed accents) llama.cpp's ids differ from
//! ours; on all other text they agree.
//!
//! The BPE itself runs on the HF `tokenizers` crate; decoding maps ids to bytes from a table
//! built here, so that streaming ([`StreamDecoder`]) and whole decoding share one code path.

mod byte_level;
mod error;
mod metadata;
pub mod pretokenize;
mod stream;

pub use error::TokenizerError;
pub use metadata::{TokenType, TokenizerMetadata};
pub use stream::StreamDecoder;

use std::collections::HashSet;
use std::sync::OnceLock;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior};

/// Texts of added tokens that end a generation (llama.cpp's end-of-generation detection by text).
const EOG_TEXTS: &[&str] = &[
    "<|endoftext|>",
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endofturn|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
];

/// Ids of the tokens with a special role, as given by the metadata.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    /// Beginning of sequence (`tokenizer.ggml.bos_token_id`); Qwen has none.
    pub bos: Option<u32>,
    /// End of sequence (`tokenizer.ggml.eos_token_id`), `<|im_end|>` for Qwen3.5.
    pub eos: Option<u32>,
    /// End of turn (`tokenizer.ggml.eot_token_id`).
    pub eot: Option<u32>,
    /// End of message (`tokenizer.ggml.eom_token_id`).
    pub eom: Option<u32>,
    /// Padding (`tokenizer.ggml.padding_token_id`), `<|endoftext|>` for Qwen3.5.
    pub pad: Option<u32>,
}

/// A byte-level BPE tokenizer. `Send + Sync`; encoding and decoding take `&self`.
pub struct Tokenizer {
    /// Matches every added token (control and user-defined).
    hf: tokenizers::Tokenizer,
    /// Same, but control tokens are ordinary text; built on first use.
    hf_plain: OnceLock<tokenizers::Tokenizer>,
    /// Bytes of token `i` are `bytes[offsets[i]..offsets[i + 1]]`.
    bytes: Vec<u8>,
    offsets: Vec<u32>,
    types: Vec<TokenType>,
    pre: pretokenize::PreTokenizer,
    specials: SpecialTokens,
    eog: Vec<u32>,
    add_bos: bool,
    chat_template: Option<String>,
    /// Control tokens (text, id), longest text first: what [`control_tokens`] lists.
    ///
    /// [`control_tokens`]: Tokenizer::control_tokens
    controls: Vec<(String, u32)>,
}

/// One piece of a prompt for [`Tokenizer::encode_parts`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptPart<'a> {
    /// A control token placed by trusted markup (the chat template).
    Control(u32),
    /// Text; control-token text in it is plain characters ([`Tokenizer::encode_plain`]).
    Text(&'a str),
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("n_vocab", &self.n_vocab())
            .field("pre", &self.pre.name)
            .field("specials", &self.specials)
            .field("eog", &self.eog)
            .field("add_bos", &self.add_bos)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Reads the tokenizer of a GGUF file (a vocab-only file is enough).
    pub fn open(path: impl AsRef<std::path::Path>) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_gguf(&gguf_io::GgufFile::open(path)?)
    }

    /// Builds the tokenizer from an opened GGUF file's `tokenizer.*` metadata.
    pub fn from_gguf(file: &gguf_io::GgufFile) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_metadata(&TokenizerMetadata::from_gguf(file)?)
    }

    /// Builds the tokenizer from metadata gathered by hand or by [`TokenizerMetadata::from_gguf`].
    pub fn from_metadata(meta: &TokenizerMetadata) -> Result<Tokenizer, TokenizerError> {
        if meta.model != "gpt2" {
            return Err(TokenizerError::UnsupportedModel(meta.model.clone()));
        }
        let pre_name = meta
            .pre
            .as_deref()
            .ok_or_else(|| TokenizerError::Metadata {
                key: metadata::KEY_PRE.into(),
                reason: "missing (needed to choose the pre-tokenizer regex)".into(),
            })?;
        let pre = pretokenize::lookup(pre_name)
            .ok_or_else(|| TokenizerError::UnsupportedPreTokenizer(pre_name.to_string()))?;
        if meta.tokens.is_empty() {
            return Err(TokenizerError::Metadata {
                key: metadata::KEY_TOKENS.into(),
                reason: "empty".into(),
            });
        }
        if meta.tokens.len() > u32::MAX as usize {
            return Err(TokenizerError::Metadata {
                key: metadata::KEY_TOKENS.into(),
                reason: format!("{} tokens do not fit 32-bit ids", meta.tokens.len()),
            });
        }
        let types = meta.types()?;
        let specials = special_tokens(meta)?;

        let hf = build_hf(meta, &types, pre)?;
        let (bytes, offsets) = byte_table(&meta.tokens, &types);
        let eog = eog_ids(&meta.tokens, &types, &specials);
        let mut controls: Vec<(String, u32)> = meta
            .tokens
            .iter()
            .zip(&types)
            .enumerate()
            .filter(|(_, (t, ty))| **ty == TokenType::Control && !t.is_empty())
            .map(|(id, (t, _))| (t.clone(), id as u32))
            .collect();
        controls.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        Ok(Tokenizer {
            controls,
            hf,
            hf_plain: OnceLock::new(),
            bytes,
            offsets,
            types,
            pre,
            specials,
            eog,
            add_bos: meta.add_bos_token.unwrap_or(false) && specials.bos.is_some(),
            chat_template: meta.chat_template.clone(),
        })
    }

    /// Tokenizes `text`, matching added tokens (control and user-defined) written in it, as HF
    /// `tokenizers` does (llama.cpp's `parse_special = true`).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.encode_with(&self.hf, text)
    }

    /// Tokenizes `text` treating control-token text (`<|im_start|>`) as plain characters, as
    /// llama.cpp does with `parse_special = false`; user-defined tokens (`<think>`) still match.
    /// Use this for untrusted text that must not inject chat markup.
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.encode_with(self.plain(), text)
    }

    fn plain(&self) -> &tokenizers::Tokenizer {
        self.hf_plain.get_or_init(|| {
            let mut t = self.hf.clone();
            t.set_encode_special_tokens(true);
            t
        })
    }

    /// Tokenizes a prompt given as pieces: each [`PromptPart::Control`] is its token, each
    /// [`PromptPart::Text`] is tokenized with control-token text as plain characters. BOS is
    /// prepended once, when the tokenizer adds one. For text without control-token text this
    /// is exactly [`encode`](Self::encode) of the pieces joined (with the control tokens'
    /// text): the library splits its input at added tokens the same way.
    pub fn encode_parts(&self, parts: &[PromptPart<'_>]) -> Result<Vec<u32>, TokenizerError> {
        let mut ids = Vec::new();
        if self.add_bos {
            ids.extend(self.specials.bos);
        }
        for part in parts {
            match *part {
                PromptPart::Control(id) => {
                    if self.token_type(id) != Some(TokenType::Control) {
                        return Err(TokenizerError::NotControl { id });
                    }
                    ids.push(id);
                }
                PromptPart::Text("") => {}
                PromptPart::Text(text) => {
                    ids.extend_from_slice(self.encode_raw(self.plain(), text)?.get_ids())
                }
            }
        }
        Ok(ids)
    }

    /// The control tokens (`<|im_start|>`, `<|endoftext|>`...: type `Control`) as (text, id),
    /// longest text first: the texts that [`encode`](Self::encode) turns into control tokens.
    pub fn control_tokens(&self) -> &[(String, u32)] {
        &self.controls
    }

    fn encode_raw(
        &self,
        hf: &tokenizers::Tokenizer,
        text: &str,
    ) -> Result<tokenizers::Encoding, TokenizerError> {
        hf.encode_fast(text, false)
            .map_err(|e| TokenizerError::Library(format!("encoding {} bytes: {e}", text.len())))
    }

    fn encode_with(
        &self,
        hf: &tokenizers::Tokenizer,
        text: &str,
    ) -> Result<Vec<u32>, TokenizerError> {
        let enc = self.encode_raw(hf, text)?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if self.add_bos {
            ids.extend(self.specials.bos);
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// Decodes `ids` to text; byte sequences that are not valid UTF-8 become U+FFFD. Control
    /// tokens are written as their text (`<|im_end|>`); unused ids decode to nothing.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        Ok(String::from_utf8_lossy(&self.decode_bytes(ids)?).into_owned())
    }

    /// The raw bytes `ids` stand for.
    pub fn decode_bytes(&self, ids: &[u32]) -> Result<Vec<u8>, TokenizerError> {
        let mut out = Vec::new();
        for &id in ids {
            out.extend_from_slice(self.token_bytes(id)?);
        }
        Ok(out)
    }

    /// Feeds one generated token to a stream decoder and returns the text that is complete.
    pub fn decode_next(
        &self,
        stream: &mut StreamDecoder,
        id: u32,
    ) -> Result<String, TokenizerError> {
        Ok(stream.push(self.token_bytes(id)?))
    }

    /// The bytes of one token.
    pub fn token_bytes(&self, id: u32) -> Result<&[u8], TokenizerError> {
        let i = id as usize;
        if i >= self.n_vocab() {
            return Err(TokenizerError::IdOutOfRange {
                id,
                n_vocab: self.n_vocab(),
            });
        }
        Ok(&self.bytes[self.offsets[i] as usize..self.offsets[i + 1] as usize])
    }

    /// The type of token `id`, or `None` outside the vocabulary.
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    /// The id of an added token or vocabulary string written in byte-level form (`"Ġthe"`,
    /// `"<|im_end|>"`).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.hf.token_to_id(token)
    }

    /// Number of ids in the vocabulary, padding entries included (248,320 for Qwen3.5).
    pub fn n_vocab(&self) -> usize {
        self.types.len()
    }

    /// Whether `id` may be produced by a model: inside the vocabulary and not an unused padding
    /// entry. The sampler masks everything else.
    pub fn is_sampleable(&self, id: u32) -> bool {
        matches!(self.token_type(id), Some(t) if t != TokenType::Unused)
    }

    /// The special-token ids from the metadata.
    pub fn specials(&self) -> &SpecialTokens {
        &self.specials
    }

    /// Ids that end a generation: eos, eot, eom, and added tokens whose text marks an end
    /// (`<|endoftext|>`, `<|im_end|>`, `<|fim_pad|>`, ...), sorted.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    /// Whether `id` ends a generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// Whether encoding prepends the BOS token (only when the metadata asks and has one).
    pub fn adds_bos(&self) -> bool {
        self.add_bos
    }

    /// The `tokenizer.ggml.pre` name in use.
    pub fn pre_tokenizer(&self) -> &'static str {
        self.pre.name
    }

    /// The model's `tokenizer.chat_template`, if the file has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }
}

/// Checks and collects the special-token ids.
fn special_tokens(meta: &TokenizerMetadata) -> Result<SpecialTokens, TokenizerError> {
    let n = meta.tokens.len();
    let check = |key: &str, id: Option<u32>| match id {
        Some(id) if id as usize >= n => Err(TokenizerError::SpecialIdOutOfRange {
            key: key.into(),
            id,
            n_vocab: n,
        }),
        _ => Ok(id),
    };
    Ok(SpecialTokens {
        bos: check("tokenizer.ggml.bos_token_id", meta.bos_token_id)?,
        eos: check("tokenizer.ggml.eos_token_id", meta.eos_token_id)?,
        eot: check("tokenizer.ggml.eot_token_id", meta.eot_token_id)?,
        eom: check("tokenizer.ggml.eom_token_id", meta.eom_token_id)?,
        pad: check("tokenizer.ggml.padding_token_id", meta.padding_token_id)?,
    })
}

/// The HF tokenizer: BPE over the byte-level vocabulary, NFC, the pre-tokenizer regex, and the
/// added tokens at their GGUF ids.
fn build_hf(
    meta: &TokenizerMetadata,
    types: &[TokenType],
    pre: pretokenize::PreTokenizer,
) -> Result<tokenizers::Tokenizer, TokenizerError> {
    // BPE vocabulary: every token that can come out of BPE or be matched as added text, at its
    // own id. Added tokens are included so the library keeps their GGUF ids instead of appending
    // new ones; BPE cannot reach them because no merge produces them. Unused entries are left
    // out so that they are never produced.
    let mut vocab = Vocab::with_capacity(meta.tokens.len());
    let mut added = Vec::new();
    for (id, (token, ty)) in meta.tokens.iter().zip(types).enumerate() {
        if *ty == TokenType::Unused {
            continue;
        }
        if let Some(&other) = vocab.get(token) {
            if ty.is_added() {
                return Err(TokenizerError::Metadata {
                    key: metadata::KEY_TOKENS.into(),
                    reason: format!("added token {token:?} (id {id}) repeats id {other}"),
                });
            }
            // A repeated plain token: the first id wins, as in llama.cpp.
            continue;
        }
        vocab.insert(token.clone(), id as u32);
        if ty.is_added() {
            // Control tokens are "special": `encode_plain` turns their matching off.
            added
                .push(AddedToken::from(token.clone(), *ty == TokenType::Control).normalized(false));
        }
    }
    let merges = meta
        .merges
        .iter()
        .enumerate()
        .map(|(index, rule)| {
            split_merge(rule).ok_or_else(|| TokenizerError::BadMerge {
                index,
                rule: rule.clone(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| {
            TokenizerError::Library(format!("building BPE from {}: {e}", metadata::KEY_MERGES))
        })?;

    let mut hf = tokenizers::Tokenizer::new(bpe);
    if pre.nfc {
        hf.with_normalizer(Some(NFC))
            .map_err(|e| TokenizerError::Library(format!("NFC normalizer: {e}")))?;
    }
    let split = Split::new(
        SplitPattern::Regex(pre.regex.to_string()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|e| TokenizerError::Library(format!("pre-tokenizer regex `{}`: {e}", pre.name)))?;
    hf.with_pre_tokenizer(Some(Sequence::new(vec![
        split.into(),
        ByteLevel::new(false, false, false).into(),
    ])));
    hf.with_decoder(Some(ByteLevel::new(false, false, false)));
    hf.add_tokens(added)
        .map_err(|e| TokenizerError::Library(format!("adding special tokens: {e}")))?;
    Ok(hf)
}

/// Splits `"left right"` at the first space after the first character (a byte-level token never
/// contains a space, but a rule's left side could in principle start with one).
fn split_merge(rule: &str) -> Option<(String, String)> {
    let first = rule.chars().next()?;
    let at = rule[first.len_utf8()..].find(' ')? + first.len_utf8();
    let (left, right) = (&rule[..at], &rule[at + 1..]);
    if right.is_empty() {
        return None;
    }
    Some((left.to_string(), right.to_string()))
}

/// The bytes of every token, flattened: byte-level text for BPE tokens, raw UTF-8 for added
/// tokens, nothing for unused ids.
fn byte_table(tokens: &[String], types: &[TokenType]) -> (Vec<u8>, Vec<u32>) {
    let dec = byte_level::ByteDecoder::new();
    let mut bytes = Vec::with_capacity(tokens.iter().map(String::len).sum());
    let mut offsets = Vec::with_capacity(tokens.len() + 1);
    offsets.push(0u32);
    for (token, ty) in tokens.iter().zip(types) {
        match ty {
            TokenType::Unused => {}
            t if t.is_added() => bytes.extend_from_slice(token.as_bytes()),
            _ => match dec.decode(token) {
                Some(b) => bytes.extend_from_slice(&b),
                // Not in the byte alphabet: the text itself, as HF's ByteLevel decoder does.
                None => bytes.extend_from_slice(token.as_bytes()),
            },
        }
        offsets.push(bytes.len() as u32);
    }
    (bytes, offsets)
}

/// The end-of-generation ids, sorted and without duplicates.
fn eog_ids(tokens: &[String], types: &[TokenType], specials: &SpecialTokens) -> Vec<u32> {
    let mut set: HashSet<u32> = [specials.eos, specials.eot, specials.eom]
        .into_iter()
        .flatten()
        .collect();
    for (id, (token, ty)) in tokens.iter().zip(types).enumerate() {
        if ty.is_added() && EOG_TEXTS.contains(&token.as_str()) {
            set.insert(id as u32);
        }
    }
    let mut v: Vec<u32> = set.into_iter().collect();
    v.sort_unstable();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_rules_split_at_the_first_inner_space() {
        assert_eq!(split_merge("Ġ t"), Some(("Ġ".into(), "t".into())));
        assert_eq!(split_merge("  x"), Some((" ".into(), "x".into())));
        assert_eq!(split_merge("ab"), None);
        assert_eq!(split_merge("a "), None);
        assert_eq!(split_merge(""), None);
    }
}
