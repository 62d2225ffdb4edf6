//! Constrained decoding: a per-step token mask from a grammar, so the output always matches a
//! JSON schema, a GBNF or Lark grammar, or a regular expression.
//!
//! The grammar engine is [llguidance](https://github.com/guidance-ai/llguidance) (the one
//! llama.cpp and vLLM use): a lexer and Earley parser walked over a trie of the vocabulary's
//! token bytes, computing the set of allowed tokens of a 248k vocabulary in tens of
//! microseconds.
//!
//! [`ConstraintFactory`] is built once per tokenizer (the trie); [`ConstraintFactory::compile`]
//! turns a [`Grammar`] into a [`Constraint`], which goes in
//! [`SamplingParams::constraint`](crate::sampling::SamplingParams::constraint). The sampler then
//! masks the logits before every draw and the generation advances the constraint with each
//! emitted token; the generation ends when the grammar is complete and the model emits an end
//! token (the only tokens allowed once nothing can follow).
//!
//! ```no_run
//! # fn demo(engine: &pn_runtime::engine::Engine) -> Result<(), Box<dyn std::error::Error>> {
//! use pn_runtime::constrain::{ConstraintFactory, Grammar};
//! use pn_runtime::sampling::SamplingParams;
//! let factory = ConstraintFactory::new(engine.tokenizer())?;
//! let schema = serde_json::json!({"type": "object", "properties": {"n": {"type": "integer"}}});
//! let params = SamplingParams {
//!     constraint: Some(factory.compile(&Grammar::JsonSchema(schema))?),
//!     ..SamplingParams::greedy()
//! };
//! # let _ = params; Ok(()) }
//! ```

mod gbnf;
#[cfg(test)]
mod tests;

pub use gbnf::gbnf_to_lark;

use crate::tokenizer::{TokenType, Tokenizer};
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{
    ApproximateTokEnv, InferenceCapabilities, SimpleVob, TokEnv, TokRxInfo, TokTrie,
};
use llguidance::{Matcher, ParserFactory};
use std::sync::Arc;

/// What the output must match.
#[derive(Debug, Clone, PartialEq)]
pub enum Grammar {
    /// A JSON value valid against this JSON schema (draft 2020-12 keywords llguidance supports:
    /// types, `properties`/`required`/`additionalProperties`, `enum`/`const`, `items`,
    /// `minItems`/`maxItems`, numeric bounds, string lengths and `pattern`, `anyOf`, `$ref`
    /// to `$defs`).
    JsonSchema(serde_json::Value),
    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    JsonObject,
    /// A llama.cpp GBNF grammar (`root ::= ...`), converted to Lark by [`gbnf_to_lark`].
    Gbnf(String),
    /// A grammar in llguidance's Lark syntax (`start: ...`).
    Lark(String),
    /// A regular expression the whole output must match.
    Regex(String),
}

/// Why a grammar could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConstrainError {
    /// The grammar (or schema) does not compile; the message names the offending part.
    #[error("invalid {kind}: {message}")]
    Invalid {
        /// `json_schema`, `grammar` (GBNF), `lark` or `regex`.
        kind: &'static str,
        /// The grammar engine's (or the GBNF converter's) message.
        message: String,
    },
    /// The tokenizer's vocabulary cannot be turned into a token trie.
    #[error("tokenizer cannot be used for constrained decoding: {0}")]
    Tokenizer(String),
}

/// Compiles [`Grammar`]s for one tokenizer; cheap to clone (shared). Build it once per engine:
/// it holds the token trie of the whole vocabulary.
#[derive(Clone)]
pub struct ConstraintFactory {
    factory: Arc<ParserFactory>,
}

impl std::fmt::Debug for ConstraintFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConstraintFactory")
            .field("vocab", &self.factory.tok_env().tok_trie().vocab_size())
            .finish()
    }
}

impl ConstraintFactory {
    /// A factory for `tok`'s vocabulary. Control tokens (`<|im_start|>`) are never produced by
    /// grammar text (llguidance's special-token marker), unused padding ids are never allowed,
    /// and the tokenizer's end tokens are the grammar's end: allowed only where the grammar is
    /// complete.
    pub fn new(tok: &Tokenizer) -> Result<ConstraintFactory, ConstrainError> {
        let n = tok.n_vocab();
        let mut words: Vec<Vec<u8>> = Vec::with_capacity(n);
        for id in 0..n as u32 {
            let bytes = tok
                .token_bytes(id)
                .map_err(|e| ConstrainError::Tokenizer(e.to_string()))?;
            words.push(match tok.token_type(id) {
                Some(TokenType::Unused) | None => Vec::new(),
                Some(TokenType::Control) => {
                    let mut w = Vec::with_capacity(bytes.len() + 1);
                    w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                    w.extend_from_slice(bytes);
                    w
                }
                Some(_) => bytes.to_vec(),
            });
        }
        let eog = tok.eog_ids();
        let eos = tok
            .specials()
            .eos
            .or_else(|| eog.first().copied())
            .ok_or_else(|| ConstrainError::Tokenizer("no end-of-sequence token".into()))?;
        let info = TokRxInfo::new(n as u32, eos);
        let mut trie = TokTrie::from(&info, &words);
        if !eog.is_empty() {
            trie = trie.with_eos_tokens(eog);
        }
        // Greedy tokenization over the trie: llguidance only tokenizes for forced-token
        // splicing, which this sampler does not use.
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new(
            &env,
            InferenceCapabilities::default(),
            &llguidance::earley::SlicedBiasComputer::general_slices(),
        )
        .map_err(|e| ConstrainError::Tokenizer(e.to_string()))?;
        factory.quiet();
        Ok(ConstraintFactory {
            factory: Arc::new(factory),
        })
    }

    /// Compiles `grammar` into a fresh [`Constraint`] (at the start of its output).
    pub fn compile(&self, grammar: &Grammar) -> Result<Constraint, ConstrainError> {
        let (kind, top) = match grammar {
            Grammar::JsonSchema(schema) => ("json_schema", json_grammar(schema.clone())),
            Grammar::JsonObject => (
                "json_schema",
                json_grammar(serde_json::json!({"type": "object"})),
            ),
            Grammar::Gbnf(g) => {
                let lark = gbnf_to_lark(g).map_err(|message| ConstrainError::Invalid {
                    kind: "grammar",
                    message,
                })?;
                ("grammar", TopLevelGrammar::from_lark(lark))
            }
            Grammar::Lark(g) => ("lark", TopLevelGrammar::from_lark(g.clone())),
            Grammar::Regex(r) => ("regex", TopLevelGrammar::from_regex(r)),
        };
        let parser = self
            .factory
            .create_parser(top)
            .map_err(|e| ConstrainError::Invalid {
                kind,
                message: format!("{e:#}"),
            })?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(ConstrainError::Invalid { kind, message: e });
        }
        Ok(Constraint {
            matcher,
            eos: Arc::new(self.factory.tok_env().tok_trie().eos_token_set()),
            id: Arc::new(()),
            failed: None,
        })
    }
}

/// A schema with llguidance's layout options: one space after `,` and `:` and no other
/// whitespace, so a model cannot spend its token budget on indentation (any JSON parser reads
/// the result). A schema's own `x-guidance` options win.
fn json_grammar(mut schema: serde_json::Value) -> TopLevelGrammar {
    if let Some(obj) = schema.as_object_mut() {
        obj.entry("x-guidance").or_insert_with(|| {
            serde_json::json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": ",
            })
        });
    }
    TopLevelGrammar::from_json_schema(schema)
}

/// A compiled grammar and how far the output has got through it. Cloning copies the position
/// (a clone of a fresh constraint starts at the beginning).
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
    /// The end tokens (what a failed or finished constraint allows), one bit per id.
    eos: Arc<SimpleVob>,
    /// Identity of the compiled grammar (clones share it): what `==` compares.
    id: Arc<()>,
    /// The grammar engine's error, once it failed (then only end tokens are allowed).
    failed: Option<String>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("stopped", &self.matcher.is_stopped())
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl PartialEq for Constraint {
    /// The same compiled grammar (position not compared).
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.id, &other.id)
    }
}

impl Constraint {
    /// Sets the logit of every token the grammar does not allow next to minus infinity.
    /// `logits` has one entry per model output row; ids past the vocabulary are masked too.
    /// Once the grammar is complete with nothing allowed after it, only the end tokens remain.
    pub fn apply(&mut self, logits: &mut [f32]) {
        let computed = if self.failed.is_some() {
            None
        } else {
            match self.matcher.compute_mask_or_eos() {
                Ok(m) => Some(m),
                Err(e) => {
                    self.fail(e.to_string());
                    None
                }
            }
        };
        let mask = computed.as_ref().unwrap_or(&self.eos);
        // One mask word covers 32 ids; whole zero words (most of them) are a plain fill.
        let words = mask.as_slice();
        for (w, chunk) in logits.chunks_mut(32).enumerate() {
            match words.get(w).copied().unwrap_or(0) {
                0 => chunk.fill(f32::NEG_INFINITY),
                u32::MAX => {}
                bits => {
                    for (b, l) in chunk.iter_mut().enumerate() {
                        if bits & (1 << b) == 0 {
                            *l = f32::NEG_INFINITY;
                        }
                    }
                }
            }
        }
    }

    /// Advances past the emitted token `id`. A token the grammar does not allow (possible only
    /// if the mask was not applied) puts the constraint in its failed state.
    pub fn advance(&mut self, id: u32) {
        if self.failed.is_some() || self.matcher.is_stopped() {
            return;
        }
        if let Err(e) = self.matcher.consume_token(id) {
            self.fail(e.to_string());
        }
    }

    /// Whether nothing may follow: the grammar is complete and allows no continuation (or it
    /// failed). Only end tokens are allowed now.
    pub fn is_finished(&self) -> bool {
        self.failed.is_some() || self.matcher.is_stopped()
    }

    /// Whether the output so far is a complete match (an end token is allowed now).
    pub fn is_accepting(&mut self) -> bool {
        self.failed.is_none() && self.matcher.is_accepting().unwrap_or(false)
    }

    /// The grammar engine's error, if it failed.
    pub fn error(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    fn fail(&mut self, e: String) {
        self.failed.get_or_insert(e);
    }
}
