//! `logprobs` / `top_logprobs`: what a request asks for, and the response shapes.
//!
//! - Chat (`/v1/chat/completions`): `logprobs: true` and `top_logprobs: 0..=20` give
//!   `choices[].logprobs.content[]`, one `{token, logprob, bytes, top_logprobs: [{token, logprob,
//!   bytes}]}` per generated token (reasoning tokens included, in order; the end token is not
//!   listed), in every streamed chunk for the tokens that chunk carries.
//! - Completions (`/v1/completions`): `logprobs: N` (0..=20) gives the legacy
//!   `{tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}`.
//!
//! The numbers are the model's log-softmax over the sampleable vocabulary before the grammar,
//! penalties, temperature and truncation ([`crate::sampling::logprobs`]). A token whose bytes
//! are not valid UTF-8 on their own (part of a character split across tokens) is written
//! `bytes:\xNN...` in `token`; `bytes` always has the raw bytes. A log probability of minus
//! infinity (a token the model gave no finite logit) is written -9999.

use super::error::ApiError;
use crate::sampling::TokenLogprob;
use crate::tokenizer::Tokenizer;
use serde::Serialize;
use serde_json::{Map, Value};

/// Most alternatives per token (OpenAI's limit for `top_logprobs`).
pub const MAX_TOP_LOGPROBS: i64 = 20;

/// Stand-in for minus infinity (JSON has none).
const NEG_INF: f32 = -9999.0;

/// The number of alternatives per token the request asks for (`None`: no log probabilities).
/// `logprobs` is a boolean (chat) or a count (completions); `top_logprobs` needs `logprobs:
/// true`.
pub fn requested(
    logprobs: Option<&Value>,
    top_logprobs: Option<i64>,
) -> Result<Option<usize>, ApiError> {
    let range = |name: &str, n: i64| {
        if (0..=MAX_TOP_LOGPROBS).contains(&n) {
            Ok(n as usize)
        } else {
            Err(ApiError::invalid_param(
                name,
                format!("'{name}' must be between 0 and {MAX_TOP_LOGPROBS}, got {n}"),
            ))
        }
    };
    let on = match logprobs {
        None | Some(Value::Null) | Some(Value::Bool(false)) => None,
        Some(Value::Bool(true)) => Some(0),
        Some(Value::Number(n)) => match n.as_i64() {
            Some(n) => Some(range("logprobs", n)?),
            None => {
                return Err(ApiError::invalid_param(
                    "logprobs",
                    "'logprobs' must be a boolean or an integer",
                ))
            }
        },
        Some(_) => {
            return Err(ApiError::invalid_param(
                "logprobs",
                "'logprobs' must be a boolean or an integer",
            ))
        }
    };
    match (on, top_logprobs) {
        (_, None) => Ok(on),
        (None, Some(_)) => Err(ApiError::invalid_param(
            "top_logprobs",
            "'top_logprobs' needs 'logprobs' set to true",
        )),
        (Some(_), Some(n)) => range("top_logprobs", n).map(Some),
    }
}

/// One token as the responses write it: its text (or `bytes:\xNN` escape) and bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenText {
    /// `token`.
    pub text: String,
    /// `bytes`.
    pub bytes: Vec<u8>,
}

impl TokenText {
    /// The text and bytes of token `id`.
    pub fn of(tok: &Tokenizer, id: u32) -> TokenText {
        let bytes = tok.token_bytes(id).map(<[u8]>::to_vec).unwrap_or_default();
        let text = match std::str::from_utf8(&bytes) {
            Ok(s) => s.to_string(),
            Err(_) => {
                let mut s = String::from("bytes:");
                for b in &bytes {
                    s.push_str(&format!("\\x{b:02x}"));
                }
                s
            }
        };
        TokenText { text, bytes }
    }
}

/// A generated token's log probability with its alternatives, as text: what a slot sends the
/// response side ([`Event::Logprob`](super::scheduler::Event::Logprob)).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenInfo {
    /// The token.
    pub token: TokenText,
    /// Its log probability.
    pub logprob: f32,
    /// The most likely tokens at its position, most likely first.
    pub top: Vec<(TokenText, f32)>,
}

fn finite(l: f32) -> f32 {
    if l.is_finite() {
        l
    } else {
        NEG_INF
    }
}

impl TokenInfo {
    /// `lp` with its tokens' text.
    pub fn new(tok: &Tokenizer, lp: &TokenLogprob) -> TokenInfo {
        TokenInfo {
            token: TokenText::of(tok, lp.id),
            logprob: finite(lp.logprob),
            top: lp
                .top
                .iter()
                .map(|&(id, l)| (TokenText::of(tok, id), finite(l)))
                .collect(),
        }
    }
}

/// `choices[].logprobs` of a chat completion (or chunk).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ChatLogprobs {
    /// One entry per token.
    pub content: Vec<ChatTokenLogprob>,
}

/// One token of [`ChatLogprobs`].
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ChatTokenLogprob {
    /// Token text.
    pub token: String,
    /// Natural-log probability.
    pub logprob: f32,
    /// The token's UTF-8 bytes.
    pub bytes: Vec<u8>,
    /// The most likely tokens at this position.
    pub top_logprobs: Vec<TopLogprob>,
}

/// One alternative of [`ChatTokenLogprob`].
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TopLogprob {
    /// Token text.
    pub token: String,
    /// Natural-log probability.
    pub logprob: f32,
    /// The token's UTF-8 bytes.
    pub bytes: Vec<u8>,
}

impl ChatLogprobs {
    /// The chat shape of `tokens`.
    pub fn of(tokens: &[TokenInfo]) -> ChatLogprobs {
        ChatLogprobs {
            content: tokens
                .iter()
                .map(|t| ChatTokenLogprob {
                    token: t.token.text.clone(),
                    logprob: t.logprob,
                    bytes: t.token.bytes.clone(),
                    top_logprobs: t
                        .top
                        .iter()
                        .map(|(tt, l)| TopLogprob {
                            token: tt.text.clone(),
                            logprob: *l,
                            bytes: tt.bytes.clone(),
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

/// `choices[].logprobs` of a text completion (the legacy shape).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct TextLogprobs {
    /// Token texts.
    pub tokens: Vec<String>,
    /// Their log probabilities.
    pub token_logprobs: Vec<f32>,
    /// Per token, the alternatives as `{token: logprob}`.
    pub top_logprobs: Vec<Map<String, Value>>,
    /// Per token, the number of characters of the generated text before it.
    pub text_offset: Vec<usize>,
}

/// Builds [`TextLogprobs`] across a stream: the text offsets continue from chunk to chunk.
#[derive(Debug, Clone, Default)]
pub struct TextOffsets {
    /// Characters begun so far (UTF-8 lead bytes of the tokens' bytes).
    chars: usize,
}

impl TextOffsets {
    /// The legacy shape of `tokens`, the next ones of the completion.
    pub fn next(&mut self, tokens: &[TokenInfo]) -> TextLogprobs {
        let mut out = TextLogprobs::default();
        for t in tokens {
            out.tokens.push(t.token.text.clone());
            out.token_logprobs.push(t.logprob);
            let mut top = Map::new();
            for (tt, l) in &t.top {
                top.insert(tt.text.clone(), Value::from(f64::from(*l)));
            }
            out.top_logprobs.push(top);
            out.text_offset.push(self.chars);
            // A character starts at every byte that is not a continuation byte (10xxxxxx).
            self.chars += t.token.bytes.iter().filter(|&&b| b & 0xc0 != 0x80).count();
        }
        out
    }
}

/// The log probabilities a response has received and not yet written (a streamed chunk carries
/// those of the tokens whose text it carries; a whole response carries all).
#[derive(Debug, Clone, Default)]
pub struct LogprobQueue {
    /// The request asked for log probabilities.
    pub on: bool,
    pending: Vec<TokenInfo>,
    offsets: TextOffsets,
}

impl LogprobQueue {
    /// A queue for a request that asked (`on`) or not.
    pub fn new(on: bool) -> Self {
        LogprobQueue {
            on,
            ..Self::default()
        }
    }

    /// Adds a token's entry.
    pub fn push(&mut self, t: TokenInfo) {
        self.pending.push(t);
    }

    /// The pending entries in the chat shape (`None`: off, or nothing pending and not `whole`).
    pub fn chat(&mut self, whole: bool) -> Option<ChatLogprobs> {
        (self.on && (whole || !self.pending.is_empty())).then(|| {
            let c = ChatLogprobs::of(&self.pending);
            self.pending.clear();
            c
        })
    }

    /// The pending entries in the completions shape (as [`chat`](Self::chat)).
    pub fn text(&mut self, whole: bool) -> Option<TextLogprobs> {
        (self.on && (whole || !self.pending.is_empty())).then(|| {
            let t = self.offsets.next(&self.pending);
            self.pending.clear();
            t
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn what_requests_ask_for() {
        assert_eq!(requested(None, None).unwrap(), None);
        assert_eq!(requested(Some(&json!(false)), None).unwrap(), None);
        assert_eq!(requested(Some(&json!(true)), None).unwrap(), Some(0));
        assert_eq!(requested(Some(&json!(true)), Some(5)).unwrap(), Some(5));
        assert_eq!(requested(Some(&json!(3)), None).unwrap(), Some(3));
        assert_eq!(requested(Some(&json!(0)), None).unwrap(), Some(0));
        let e = requested(Some(&json!(true)), Some(21)).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("top_logprobs"));
        let e = requested(None, Some(2)).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("top_logprobs"));
        assert!(requested(Some(&json!(-1)), None).is_err());
        assert!(requested(Some(&json!("yes")), None).is_err());
    }

    fn info(bytes: &[u8], lp: f32) -> TokenInfo {
        let text = String::from_utf8_lossy(bytes).into_owned();
        TokenInfo {
            token: TokenText {
                text,
                bytes: bytes.to_vec(),
            },
            logprob: lp,
            top: vec![],
        }
    }

    #[test]
    fn text_offsets_count_characters_across_chunks() {
        let mut o = TextOffsets::default();
        let a = o.next(&[info(b"ab", -0.5), info("é".as_bytes(), -1.0)]);
        assert_eq!(a.text_offset, vec![0, 2]);
        // A character split across two tokens counts once, at its first byte.
        let b = o.next(&[
            info(&[0xe4, 0xbd], -2.0),
            info(&[0xa0], -0.1),
            info(b"x", 0.0),
        ]);
        assert_eq!(b.text_offset, vec![3, 4, 4]);
        assert_eq!(b.token_logprobs, vec![-2.0, -0.1, 0.0]);
    }

    #[test]
    fn chat_shape_serialises_like_openai() {
        let mut t = info(b"hi", -0.25);
        t.top.push((t.token.clone(), -0.25));
        let v = serde_json::to_value(ChatLogprobs::of(&[t])).unwrap();
        assert_eq!(
            v,
            json!({"content": [{"token": "hi", "logprob": -0.25, "bytes": [104, 105],
                "top_logprobs": [{"token": "hi", "logprob": -0.25, "bytes": [104, 105]}]}]})
        );
    }
}
