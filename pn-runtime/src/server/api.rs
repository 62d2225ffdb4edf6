//! OpenAI request and response bodies, and turning a request into generation settings.
//!
//! Like OpenAI, an argument the API does not know is a 400 ("Unrecognized request argument
//! supplied: X"); documented OpenAI arguments that pn does not implement are accepted when
//! they ask for the default behaviour and rejected (400, naming them) when they ask for
//! something else. llama.cpp-style extensions (`top_k`, `min_p`, `repeat_penalty`,
//! `ignore_eos`, `chat_template_kwargs`) are accepted, and so are the llama-server and vLLM
//! extras of [`structured::EXTRA_FIELDS`](super::structured::EXTRA_FIELDS) (structured output,
//! `n_predict`, `cache_prompt`, ...). Sampling fields a request leaves out take the server's
//! defaults ([`SamplingDefaults`]: `pn run`'s unless `pn serve` sets others).

use super::error::ApiError;
use super::structured::{ExtraFields, EXTRA_FIELDS};
use crate::sampling::SamplingParams;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Sampling and stopping fields shared by both endpoints.
const SAMPLING_FIELDS: &[&str] = &[
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repeat_penalty",
    "repeat_last_n",
    "seed",
    "stop",
    "n",
    "stream",
    "stream_options",
    "ignore_eos",
    "user",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "metadata",
    "store",
    "service_tier",
];

/// Fields of `POST /v1/chat/completions` besides [`SAMPLING_FIELDS`].
const CHAT_FIELDS: &[&str] = &[
    "messages",
    "max_completion_tokens",
    "chat_template_kwargs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "reasoning_effort",
    "thinking_budget_tokens",
    "modalities",
];

/// Fields of `POST /v1/completions` besides [`SAMPLING_FIELDS`].
const COMPLETION_FIELDS: &[&str] = &["prompt", "echo", "suffix", "best_of"];

/// Sampling and stopping arguments.
#[derive(Debug, Default, Deserialize)]
pub struct SamplingFields {
    /// Ignored (one model is served), echoed back as the served model's id.
    pub model: Option<String>,
    /// Most tokens to generate.
    pub max_tokens: Option<i64>,
    /// Softmax temperature, 0..=2 (0: greedy).
    pub temperature: Option<f32>,
    /// Nucleus sampling mass, 0..=1.
    pub top_p: Option<f32>,
    /// Keep the k most likely tokens (0: off).
    pub top_k: Option<i64>,
    /// Min-p filter, 0..=1.
    pub min_p: Option<f32>,
    /// -2..=2.
    pub presence_penalty: Option<f32>,
    /// -2..=2.
    pub frequency_penalty: Option<f32>,
    /// llama.cpp's multiplicative penalty (1: off).
    pub repeat_penalty: Option<f32>,
    /// Window of the penalties.
    pub repeat_last_n: Option<i64>,
    /// Sampler seed.
    pub seed: Option<i64>,
    /// Stop strings.
    pub stop: Option<StopField>,
    /// Choices (only 1).
    pub n: Option<i64>,
    /// Server-sent events.
    pub stream: Option<bool>,
    /// `{"include_usage": true}`.
    pub stream_options: Option<StreamOptions>,
    /// Keep generating past end tokens.
    pub ignore_eos: Option<bool>,
    /// Ignored.
    pub user: Option<String>,
    /// Only empty.
    pub logit_bias: Option<Map<String, Value>>,
    /// `true` (chat) or a count (completions): [`super::logprobs`].
    pub logprobs: Option<Value>,
    /// Alternatives per token, 0..=20 (with `logprobs: true`).
    pub top_logprobs: Option<i64>,
    /// Ignored.
    pub metadata: Option<Value>,
    /// Ignored.
    pub store: Option<bool>,
    /// Ignored.
    pub service_tier: Option<String>,
}

/// `stop`: one string or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a final chunk with the token usage and empty `choices`.
    #[serde(default)]
    pub include_usage: bool,
}

/// A chat message as sent by clients.
#[derive(Debug, Deserialize)]
pub struct RequestMessage {
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    pub role: String,
    /// Text, or a list of content parts.
    pub content: Option<MessageContent>,
    /// An earlier assistant turn's thinking.
    pub reasoning_content: Option<String>,
    /// Participant name.
    pub name: Option<String>,
    /// An assistant turn's tool calls (passed to the template as is).
    pub tool_calls: Option<Value>,
    /// A tool result's call id.
    pub tool_call_id: Option<String>,
}

/// Message content.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Content parts (`{"type": "text", "text": ...}`).
    Parts(Vec<ContentPart>),
}

/// One content part.
#[derive(Debug, Deserialize)]
pub struct ContentPart {
    /// `text` (images and audio are not supported).
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    pub text: Option<String>,
}

/// `POST /v1/chat/completions` (besides [`SamplingFields`]).
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Vec<RequestMessage>,
    /// Newer name of `max_tokens`.
    pub max_completion_tokens: Option<i64>,
    /// Extra template variables (`{"enable_thinking": false}`).
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// Tool definitions (see [`tools`](super::tools)).
    pub tools: Option<Vec<Value>>,
    /// `auto`, `none`, `required` or a named function.
    pub tool_choice: Option<Value>,
    /// Whether more than one call may be returned (default true).
    pub parallel_tool_calls: Option<bool>,
    /// Passed to the template as a variable; sets the thinking budget ([`super::thinking`]).
    pub reasoning_effort: Option<String>,
    /// Most reasoning tokens ([`super::thinking`]).
    pub thinking_budget_tokens: Option<i64>,
    /// Only `["text"]`.
    pub modalities: Option<Vec<String>>,
}

/// `prompt` of `POST /v1/completions`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum PromptField {
    /// Text.
    Text(String),
    /// Token ids.
    Tokens(Vec<u32>),
    /// A batch of texts (only one supported).
    Texts(Vec<String>),
    /// A batch of token lists (only one supported).
    TokenLists(Vec<Vec<u32>>),
}

/// `POST /v1/completions` (besides [`SamplingFields`]).
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    /// What to continue.
    pub prompt: PromptField,
    /// Only false.
    pub echo: Option<bool>,
    /// Only null.
    pub suffix: Option<String>,
    /// Only 1.
    pub best_of: Option<i64>,
}

/// Parses a JSON object body: malformed JSON, a non-object, an unknown argument or a field of
/// the wrong type is a 400 naming the problem.
fn parse_object(body: &[u8], allowed: &[&[&str]]) -> Result<Map<String, Value>, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::invalid(format!(
            "We could not parse the JSON body of your request: {e}. The API expects a JSON object."
        ))
    })?;
    let Value::Object(map) = value else {
        return Err(ApiError::invalid("The request body must be a JSON object."));
    };
    if let Some(unknown) = map
        .keys()
        .find(|k| !allowed.iter().any(|set| set.contains(&k.as_str())))
    {
        return Err(ApiError::invalid(format!(
            "Unrecognized request argument supplied: {unknown}"
        )));
    }
    Ok(map)
}

pub(crate) fn typed<T: DeserializeOwned>(map: &Map<String, Value>) -> Result<T, ApiError> {
    // `Map` deserializes from a reference, so the body is not copied per struct.
    serde_path_to_error::deserialize::<_, T>(map).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            ApiError::invalid(format!("Invalid request: {inner}"))
        } else {
            ApiError::invalid_param(path.clone(), format!("Invalid value for '{path}': {inner}"))
        }
    })
}

/// Parses a chat request.
pub fn parse_chat(body: &[u8]) -> Result<(ChatRequest, SamplingFields, ExtraFields), ApiError> {
    let map = parse_object(body, &[SAMPLING_FIELDS, CHAT_FIELDS, EXTRA_FIELDS])?;
    if !map.contains_key("messages") {
        return Err(ApiError::invalid_param(
            "messages",
            "Missing required parameter: 'messages'.",
        ));
    }
    Ok((typed(&map)?, typed(&map)?, typed(&map)?))
}

/// Parses a completion request.
pub fn parse_completion(
    body: &[u8],
) -> Result<(CompletionRequest, SamplingFields, ExtraFields), ApiError> {
    let map = parse_object(body, &[SAMPLING_FIELDS, COMPLETION_FIELDS, EXTRA_FIELDS])?;
    if !map.contains_key("prompt") {
        return Err(ApiError::invalid_param(
            "prompt",
            "Missing required parameter: 'prompt'.",
        ));
    }
    Ok((typed(&map)?, typed(&map)?, typed(&map)?))
}

/// What one request asks the engine for.
#[derive(Debug, Clone)]
pub struct GenSettings {
    /// Sampler.
    pub params: SamplingParams,
    /// Most tokens to generate (`None`: until the context is full).
    pub max_tokens: Option<usize>,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Extra stop token ids (vLLM's `stop_token_ids`).
    pub stop_tokens: Vec<u32>,
    /// Keep going past end tokens.
    pub ignore_eos: bool,
    /// Server-sent events.
    pub stream: bool,
    /// Final usage chunk with empty choices.
    pub include_usage: bool,
    /// Log probabilities with this many alternatives per token ([`super::logprobs`]).
    pub logprobs: Option<usize>,
    /// The thinking block to follow (chat; [`super::thinking`]).
    pub thinking: Option<crate::engine::ThinkingControl>,
}

/// What a request gets for the sampling fields it leaves out (`pn serve --temp --top-k
/// --top-p --min-p --repeat-penalty --seed -n`).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingDefaults {
    /// Temperature, top-k, top-p, min-p, penalties (`seed` and `constraint` are not used).
    pub params: SamplingParams,
    /// Seed of every request without one; `None`: a fresh random seed per request.
    pub seed: Option<u64>,
    /// Most tokens of a request without `max_tokens`; `None`: the endpoint's default.
    pub max_tokens: Option<usize>,
}

impl Default for SamplingDefaults {
    /// `pn run`'s sampling (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05), random seeds.
    fn default() -> Self {
        SamplingDefaults {
            params: SamplingParams::default(),
            seed: None,
            max_tokens: None,
        }
    }
}

fn check_range(name: &str, v: Option<f32>, lo: f32, hi: f32) -> Result<(), ApiError> {
    match v {
        Some(x) if !(lo..=hi).contains(&x) => Err(ApiError::invalid_param(
            name,
            format!("'{name}' must be between {lo} and {hi}, got {x}"),
        )),
        _ => Ok(()),
    }
}

fn random_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    // SplitMix64 finaliser of time + counter: distinct seeds for requests in the same tick.
    let mut z = t ^ COUNTER
        .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
        .rotate_left(17);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl SamplingFields {
    /// Validates the arguments (OpenAI's ranges) and fills in the server's `defaults` where
    /// they are absent. `default_max` applies when `max_tokens` (and `n_predict`, and the
    /// server's default) are absent; `max_override` is the chat endpoint's
    /// `max_completion_tokens`.
    pub fn settings(
        &self,
        max_override: Option<i64>,
        default_max: Option<usize>,
        extras: &ExtraFields,
        defaults: &SamplingDefaults,
    ) -> Result<GenSettings, ApiError> {
        let repeat_penalty = self.repeat_penalty.or(extras.repetition_penalty);
        check_range("temperature", self.temperature, 0.0, 2.0)?;
        check_range("top_p", self.top_p, 0.0, 1.0)?;
        check_range("min_p", self.min_p, 0.0, 1.0)?;
        check_range("presence_penalty", self.presence_penalty, -2.0, 2.0)?;
        check_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)?;
        check_range("repeat_penalty", repeat_penalty, 0.01, 100.0)?;
        if let Some(n) = self.n {
            if n != 1 {
                return Err(ApiError::invalid_param(
                    "n",
                    format!("only n=1 is supported, got {n}"),
                ));
            }
        }
        let max_tokens = match max_override.or(self.max_tokens) {
            Some(m) if m < 1 => {
                let name = if max_override.is_some() {
                    "max_completion_tokens"
                } else {
                    "max_tokens"
                };
                return Err(ApiError::invalid_param(
                    name,
                    format!("'{name}' must be at least 1, got {m}"),
                ));
            }
            Some(m) => Some(usize::try_from(m).unwrap_or(usize::MAX)),
            // llama-server: -1 (any negative) is "until an end token or the context is full".
            None => match extras.n_predict {
                Some(n) if n < 0 => None,
                Some(n) => Some(usize::try_from(n).unwrap_or(usize::MAX).max(1)),
                None => defaults.max_tokens.or(default_max),
            },
        };
        let top_k = match self.top_k {
            Some(k) if k < 0 => {
                return Err(ApiError::invalid_param(
                    "top_k",
                    "'top_k' must be 0 (off) or positive",
                ))
            }
            Some(k) => usize::try_from(k).unwrap_or(usize::MAX),
            None => defaults.params.top_k,
        };
        let stop = match &self.stop {
            None => Vec::new(),
            Some(StopField::One(s)) => vec![s.clone()],
            Some(StopField::Many(v)) => v.clone(),
        };
        if stop.len() > 16 || stop.iter().any(String::is_empty) {
            return Err(ApiError::invalid_param(
                "stop",
                "'stop' takes at most 16 non-empty strings",
            ));
        }
        if self.logit_bias.as_ref().is_some_and(|m| !m.is_empty()) {
            return Err(ApiError::invalid_param(
                "logit_bias",
                "'logit_bias' is not supported by this server",
            ));
        }
        let d = &defaults.params;
        let params = SamplingParams {
            temperature: self.temperature.unwrap_or(d.temperature),
            top_k,
            top_p: self.top_p.unwrap_or(d.top_p),
            min_p: self.min_p.unwrap_or(d.min_p),
            repeat_penalty: repeat_penalty.unwrap_or(d.repeat_penalty),
            presence_penalty: self.presence_penalty.unwrap_or(d.presence_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(d.frequency_penalty),
            penalty_last_n: self
                .repeat_last_n
                .map_or(d.penalty_last_n, |n| usize::try_from(n).unwrap_or(0)),
            // llama.cpp: a negative seed asks for a random one.
            seed: match self.seed.filter(|&s| s >= 0) {
                Some(s) => s as u64,
                None => defaults.seed.unwrap_or_else(random_seed),
            },
            constraint: None,
        };
        Ok(GenSettings {
            params,
            max_tokens,
            stop,
            stop_tokens: extras.stop_token_ids.clone().unwrap_or_default(),
            ignore_eos: self.ignore_eos.unwrap_or(false),
            stream: self.stream.unwrap_or(false),
            include_usage: self
                .stream_options
                .as_ref()
                .is_some_and(|o| o.include_usage),
            logprobs: super::logprobs::requested(self.logprobs.as_ref(), self.top_logprobs)?,
            thinking: None,
        })
    }
}

impl ChatRequest {
    /// Rejects OpenAI features pn does not implement.
    pub fn check_supported(&self) -> Result<(), ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::invalid_param(
                "messages",
                "'messages' must contain at least one message",
            ));
        }
        if let Some(m) = &self.modalities {
            if m.iter().any(|x| x != "text") {
                return Err(ApiError::invalid_param(
                    "modalities",
                    "only the text modality is supported",
                ));
            }
        }
        Ok(())
    }
}

impl CompletionRequest {
    /// The one prompt, as text or tokens.
    pub fn prompt(&self) -> Result<crate::engine::Prompt, ApiError> {
        use crate::engine::Prompt;
        if self.echo == Some(true) {
            return Err(ApiError::invalid_param("echo", "'echo' is not supported"));
        }
        if self.suffix.is_some() {
            return Err(ApiError::invalid_param(
                "suffix",
                "'suffix' is not supported",
            ));
        }
        if self.best_of.is_some_and(|b| b != 1) {
            return Err(ApiError::invalid_param(
                "best_of",
                "only best_of=1 is supported",
            ));
        }
        let one = |n: usize| {
            if n == 1 {
                Ok(())
            } else {
                Err(ApiError::invalid_param(
                    "prompt",
                    format!("exactly one prompt per request is supported, got {n}"),
                ))
            }
        };
        let prompt = match &self.prompt {
            PromptField::Text(t) => Prompt::Text(t.clone()),
            PromptField::Tokens(t) => Prompt::Tokens(t.clone()),
            PromptField::Texts(v) => {
                one(v.len())?;
                Prompt::Text(v[0].clone())
            }
            PromptField::TokenLists(v) => {
                one(v.len())?;
                Prompt::Tokens(v[0].clone())
            }
        };
        Ok(prompt)
    }
}

/// Token counts of a response.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Usage {
    /// Tokens of the prompt (all of them, reused or not).
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
    /// Both.
    pub total_tokens: usize,
    /// How many prompt tokens came from the slot's cache.
    pub prompt_tokens_details: PromptTokensDetails,
    /// Reasoning tokens of chat completions ([`super::thinking`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_tokens_details: Option<super::thinking::CompletionTokensDetails>,
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct PromptTokensDetails {
    /// Prompt tokens reused from the cache.
    pub cached_tokens: usize,
}

impl Usage {
    /// Usage of a prompt of `prompt` tokens of which `processed` were run, and `completion`
    /// generated tokens.
    pub fn new(prompt: usize, processed: usize, completion: usize) -> Usage {
        Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: prompt.saturating_sub(processed),
            },
            completion_tokens_details: None,
        }
    }
}

/// `choices[i].message` of a chat completion, and `delta` of a chunk.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Delta {
    /// `assistant` (first chunk and whole messages only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// Answer text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Thinking text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Calls the model made (whole message), or pieces of them (chunks).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<super::tools::ToolCallOut>>,
}

/// One choice of a chat completion or chunk.
#[derive(Debug, Clone, Serialize)]
pub struct ChatChoice {
    /// Always 0.
    pub index: usize,
    /// Whole message (`chat.completion`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<Delta>,
    /// Increment (`chat.completion.chunk`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delta: Option<Delta>,
    /// The tokens' log probabilities, when asked for.
    pub logprobs: Option<super::logprobs::ChatLogprobs>,
    /// `stop` or `length` on the last chunk / the whole message.
    pub finish_reason: Option<&'static str>,
}

/// A completion or one chunk of a streamed one, the same envelope for both endpoints: choices
/// `C` are [`ChatChoice`]s or [`TextChoice`]s.
#[derive(Debug, Clone, Serialize)]
pub struct Completion<C> {
    /// `chatcmpl-...` / `cmpl-...`, the same for every chunk of a stream.
    pub id: String,
    /// `chat.completion`, `chat.completion.chunk` or `text_completion`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The served model's id.
    pub model: String,
    /// Identifies the build.
    pub system_fingerprint: &'static str,
    /// One choice (none on the final usage chunk).
    pub choices: Vec<C>,
    /// Token counts (whole responses and the last chunks).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// A chat completion or one chunk of a streamed one.
pub type ChatCompletion = Completion<ChatChoice>;

/// One choice of a text completion.
#[derive(Debug, Clone, Serialize)]
pub struct TextChoice {
    /// Always 0.
    pub index: usize,
    /// Generated text (an increment in a stream).
    pub text: String,
    /// The tokens' log probabilities, when asked for.
    pub logprobs: Option<super::logprobs::TextLogprobs>,
    /// `stop` or `length` at the end.
    pub finish_reason: Option<&'static str>,
}

/// A text completion or one chunk of a streamed one.
pub type TextCompletion = Completion<TextChoice>;

/// The `system_fingerprint` of every response.
pub const FINGERPRINT: &str = concat!("pn-", env!("CARGO_PKG_VERSION"));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_argument_is_rejected_like_openai() {
        let e = parse_chat(br#"{"messages":[],"frobnicate":1}"#).unwrap_err();
        assert_eq!(e.status, 400);
        assert_eq!(
            e.message,
            "Unrecognized request argument supplied: frobnicate"
        );
    }

    #[test]
    fn wrong_type_names_the_field() {
        let e = parse_chat(br#"{"messages":[{"role":"user","content":"x"}],"temperature":"hot"}"#)
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"));
        let e = parse_chat(br#"{"messages":[{"role":5,"content":"x"}]}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].role"), "{e}");
    }

    #[test]
    fn malformed_and_non_object_bodies() {
        assert!(parse_chat(b"{")
            .unwrap_err()
            .message
            .contains("could not parse"));
        assert!(parse_chat(b"[1]")
            .unwrap_err()
            .message
            .contains("JSON object"));
        assert!(parse_chat(b"{\"messages\": \"\xff\"}").is_err());
        assert_eq!(
            parse_completion(b"{}").unwrap_err().param.as_deref(),
            Some("prompt")
        );
    }

    #[test]
    fn settings_defaults_and_ranges() {
        let (_, f, x) =
            parse_chat(br#"{"messages":[{"role":"user","content":"x"}],"seed":5,"stop":"\n"}"#)
                .unwrap();
        let s = f
            .settings(None, None, &x, &SamplingDefaults::default())
            .unwrap();
        // No sampling fields: `pn run`'s defaults (the issue's change from OpenAI's 1.0/off).
        assert_eq!(s.params.temperature, 0.8);
        assert_eq!(
            (s.params.top_k, s.params.top_p, s.params.min_p),
            (40, 0.95, 0.05)
        );
        assert_eq!(s.params.seed, 5);
        assert_eq!(s.stop, vec!["\n".to_string()]);
        assert_eq!(s.max_tokens, None);
        let (_, f, x) = parse_chat(br#"{"messages":[],"temperature":3}"#).unwrap();
        assert_eq!(
            f.settings(None, None, &x, &SamplingDefaults::default())
                .unwrap_err()
                .param
                .as_deref(),
            Some("temperature")
        );
        let (_, f, x) = parse_chat(br#"{"messages":[],"n":2}"#).unwrap();
        assert!(f
            .settings(None, None, &x, &SamplingDefaults::default())
            .is_err());
        let (_, f, x) = parse_chat(br#"{"messages":[],"max_tokens":0}"#).unwrap();
        assert!(f
            .settings(None, None, &x, &SamplingDefaults::default())
            .is_err());
        let (_, f, x) = parse_chat(br#"{"messages":[],"max_tokens":9}"#).unwrap();
        assert_eq!(
            f.settings(Some(3), None, &x, &SamplingDefaults::default())
                .unwrap()
                .max_tokens,
            Some(3)
        );
    }

    #[test]
    fn messages_become_template_input() {
        let (r, _, _) = parse_chat(
            br#"{"messages":[{"role":"developer","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"user","content":"hi"}]}"#,
        )
        .unwrap();
        let m = r.template_messages().unwrap();
        assert_eq!(m[0]["role"], "system");
        assert_eq!(m[0]["content"], "ab");
        let (r, _, _) = parse_chat(br#"{"messages":[{"role":"wizard","content":"x"}]}"#).unwrap();
        assert_eq!(
            r.template_messages().unwrap_err().param.as_deref(),
            Some("messages[0].role")
        );
    }

    #[test]
    fn usage_counts_cached_tokens() {
        let u = Usage::new(10, 4, 3);
        assert_eq!(u.total_tokens, 13);
        assert_eq!(u.prompt_tokens_details.cached_tokens, 6);
    }
}
