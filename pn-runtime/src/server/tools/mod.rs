//! Tool calling: the tools a request offers, how it lets the model use them (`tool_choice`),
//! parsing the model's calls out of its text ([`parser`]), assembling them into pieces a
//! response is made of ([`CallStream`]), and the grammar that forces a call ([`grammar`]).
//!
//! Shared by the OpenAI chat endpoint (`tools`, `tool_choice`, `parallel_tool_calls`) and the
//! Anthropic Messages endpoint (its `tools` and `tool_choice` are mapped onto [`ToolConfig`]).
//!
//! Decisions:
//! - `tool_choice: "none"`: the tools are not given to the template (the model is not told
//!   it can call them) and the output is not parsed (a `<tool_call>` it writes anyway stays
//!   text). Without `tools`, nothing is parsed either.
//! - A call written inside the reasoning block (`<think>` ... `</think>`) **is** returned as a
//!   call, and taken out of the reasoning. Qwen3-family models do this (most often: they open a
//!   call and stop without ever closing `</think>`); the bug reports against servers that leave
//!   it in the reasoning are agents that stall, since the client sees no call and no answer. A
//!   model drafting a call in its thoughts writes prose about it, not the exact block its
//!   system prompt defines for calling, so the false positive is the rarer failure.
//! - `parallel_tool_calls: false`: only the first call is returned (the rest are dropped),
//!   and a forced call ([`grammar`]) is exactly one.
//! - A call naming a function that was not offered is still returned (the client answers it
//!   with an error result and the model can recover; raw XML in `content` helps nobody).

pub mod grammar;
pub mod parser;
#[cfg(test)]
mod tests;

use super::error::ApiError;
use super::reasoning::Split;
use parser::{Parsed, ToolCallParser};
use serde::Serialize;
use serde_json::Value;
use std::sync::Arc;

/// One offered function.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// Its name.
    pub name: String,
    /// The JSON schema of its arguments (an object schema; `{}` when none was given).
    pub parameters: Value,
}

/// The offered functions.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolSet {
    /// In request order.
    pub tools: Vec<ToolSpec>,
}

impl ToolSet {
    /// The tool named `name`.
    pub fn get(&self, name: &str) -> Option<&ToolSpec> {
        self.tools.iter().find(|t| t.name == name)
    }

    /// The schema of parameter `param` of function `function`, if both are known.
    pub fn parameter_schema(&self, function: &str, param: &str) -> Option<&Value> {
        self.get(function)?.parameters.get("properties")?.get(param)
    }
}

/// How the model may use the tools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// It decides (calls are parsed).
    Auto,
    /// It must not call (tools are not offered, nothing is parsed).
    None,
    /// It must call one or more of them (constrained decoding).
    Required,
    /// It must call this one (constrained decoding).
    Named(String),
}

/// The tool settings of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolConfig {
    /// The offered functions.
    pub set: Arc<ToolSet>,
    /// `tool_choice`.
    pub choice: ToolChoice,
    /// Whether more than one call may be returned.
    pub parallel: bool,
}

fn bad(param: impl Into<String>, message: impl Into<String>) -> ApiError {
    ApiError::invalid_param(param, message)
}

impl ToolConfig {
    /// A configuration, checking that a named choice names an offered tool and that a forced
    /// call has tools to call. `field` names `tool_choice` in errors.
    pub fn new(
        set: ToolSet,
        choice: ToolChoice,
        parallel: bool,
        field: &str,
    ) -> Result<ToolConfig, ApiError> {
        match &choice {
            ToolChoice::Required if set.tools.is_empty() => {
                return Err(bad(
                    field,
                    format!("'{field}' asks for a tool call but no tools were given"),
                ))
            }
            ToolChoice::Named(n) if set.get(n).is_none() => {
                return Err(bad(
                    field,
                    format!("'{field}' names the function '{n}', which is not among the tools"),
                ))
            }
            _ => {}
        }
        Ok(ToolConfig {
            set: Arc::new(set),
            choice,
            parallel,
        })
    }

    /// The OpenAI fields: `tools` (function tools only), `tool_choice` (`auto`, `none`,
    /// `required`, `{"type": "function", "function": {"name": ...}}`), `parallel_tool_calls`.
    /// `None` without tools (a `tool_choice` of `auto` or `none` is then accepted).
    pub fn from_openai(
        tools: Option<&[Value]>,
        tool_choice: Option<&Value>,
        parallel: Option<bool>,
    ) -> Result<Option<ToolConfig>, ApiError> {
        let mut set = ToolSet::default();
        for (i, t) in tools.unwrap_or_default().iter().enumerate() {
            match t.get("type").and_then(Value::as_str) {
                Some("function") => {}
                other => {
                    return Err(bad(
                        format!("tools[{i}].type"),
                        format!(
                            "only tools of type 'function' are supported, got {}",
                            other.map_or("none".into(), |o| format!("'{o}'"))
                        ),
                    ))
                }
            }
            let f = t.get("function");
            set.tools.push(spec(
                f.and_then(|f| f.get("name")),
                f.and_then(|f| f.get("parameters")),
                &format!("tools[{i}].function"),
            )?);
        }
        let choice = match tool_choice {
            None | Some(Value::Null) => ToolChoice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "auto" => ToolChoice::Auto,
                "none" => ToolChoice::None,
                "required" => ToolChoice::Required,
                other => {
                    return Err(bad(
                        "tool_choice",
                        format!("'tool_choice' must be 'auto', 'none', 'required' or a function, got '{other}'"),
                    ))
                }
            },
            Some(v) => match (
                v.get("type").and_then(Value::as_str),
                v.pointer("/function/name").and_then(Value::as_str),
            ) {
                (Some("function"), Some(name)) => ToolChoice::Named(name.to_string()),
                _ => {
                    return Err(bad(
                        "tool_choice",
                        "'tool_choice' as an object must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    ))
                }
            },
        };
        if set.tools.is_empty() && matches!(choice, ToolChoice::Auto | ToolChoice::None) {
            return Ok(None);
        }
        ToolConfig::new(set, choice, parallel.unwrap_or(true), "tool_choice").map(Some)
    }

    /// Whether the output is parsed for calls.
    pub fn parses_calls(&self) -> bool {
        self.choice != ToolChoice::None
    }

    /// Whether decoding is constrained to produce a call.
    pub fn forces_call(&self) -> bool {
        matches!(self.choice, ToolChoice::Required | ToolChoice::Named(_))
    }
}

/// A [`ToolSpec`] from a function's `name` and `parameters`, checked (`at` names the field).
pub fn spec(
    name: Option<&Value>,
    parameters: Option<&Value>,
    at: &str,
) -> Result<ToolSpec, ApiError> {
    let name = match name.and_then(Value::as_str) {
        Some(n) if parser_name_ok(n) => n.to_string(),
        Some(n) => {
            return Err(bad(
                format!("{at}.name"),
                format!("invalid function name '{n}': use letters, digits, '_', '-' and '.'"),
            ))
        }
        None => {
            return Err(bad(
                format!("{at}.name"),
                format!("Missing required parameter: '{at}.name'."),
            ))
        }
    };
    let parameters = match parameters {
        None | Some(Value::Null) => serde_json::json!({}),
        Some(p @ Value::Object(_)) => p.clone(),
        Some(_) => {
            return Err(bad(
                format!("{at}.parameters"),
                "the parameters must be a JSON schema object",
            ))
        }
    };
    Ok(ToolSpec { name, parameters })
}

fn parser_name_ok(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 128
        && n.chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'))
}

/// A call as returned to the client.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// 0, 1, ... in the order the model wrote them.
    pub index: usize,
    /// `call_...` (OpenAI) or `toolu_...` (Anthropic).
    pub id: String,
    /// The function.
    pub name: String,
    /// The arguments (typed by the schema).
    pub arguments: serde_json::Map<String, Value>,
}

impl ToolCall {
    /// The arguments as the JSON text OpenAI's `function.arguments` carries.
    pub fn arguments_json(&self) -> String {
        serde_json::to_string(&self.arguments).unwrap_or_else(|_| "{}".into())
    }
}

/// What a chat response is made of, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    /// Reasoning and answer text.
    Text(Split),
    /// A call.
    Call(ToolCall),
}

/// A fresh call id: `prefix` and 24 hex digits, unique within the process.
pub fn call_id(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let n = N.fetch_add(1, Ordering::Relaxed);
    // splitmix64 of the time mixes the low bits into all 16 digits; the counter keeps ids
    // distinct even within one clock tick.
    let mut z = t.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    format!("{prefix}{:016x}{:08x}", z ^ (z >> 31), n as u32)
}

/// Splits a chat generation's reasoning and answer into text and calls, as the text streams
/// in (see [`parser`]).
#[derive(Debug, Clone)]
pub struct CallStream {
    reasoning: ToolCallParser,
    content: ToolCallParser,
    made: usize,
    parallel: bool,
    id_prefix: &'static str,
}

impl CallStream {
    /// A stream for `config`, naming calls `id_prefix...`.
    pub fn new(config: &ToolConfig, id_prefix: &'static str) -> Self {
        CallStream {
            reasoning: ToolCallParser::new(config.set.clone()),
            content: ToolCallParser::new(config.set.clone()),
            made: 0,
            parallel: config.parallel,
            id_prefix,
        }
    }

    /// Feeds the next piece of split text.
    pub fn push(&mut self, split: Split) -> Vec<Piece> {
        let r = self.reasoning.push(&split.reasoning);
        let c = self.content.push(&split.content);
        self.pieces(r, c)
    }

    /// Releases what is held at the end of the generation.
    pub fn finish(&mut self) -> Vec<Piece> {
        let r = self.reasoning.finish();
        let c = self.content.finish();
        self.pieces(r, c)
    }

    /// Calls returned so far.
    pub fn calls(&self) -> usize {
        self.made
    }

    fn pieces(&mut self, reasoning: Vec<Parsed>, content: Vec<Parsed>) -> Vec<Piece> {
        let mut out = Vec::new();
        let tagged = reasoning
            .into_iter()
            .map(|p| (true, p))
            .chain(content.into_iter().map(|p| (false, p)));
        for (in_reasoning, p) in tagged {
            match p {
                Parsed::Text(t) => out.push(Piece::Text(if in_reasoning {
                    Split {
                        reasoning: t,
                        content: String::new(),
                    }
                } else {
                    Split {
                        reasoning: String::new(),
                        content: t,
                    }
                })),
                Parsed::Call(c) => {
                    if self.made > 0 && !self.parallel {
                        continue;
                    }
                    out.push(Piece::Call(ToolCall {
                        index: self.made,
                        id: call_id(self.id_prefix),
                        name: c.name,
                        arguments: c.arguments,
                    }));
                    self.made += 1;
                }
            }
        }
        out
    }
}

/// Runs a whole generation's split text through a [`CallStream`]: the text without the
/// calls, and the calls (none without a `config`).
pub fn take_calls(
    config: Option<&ToolConfig>,
    split: Split,
    id_prefix: &'static str,
) -> (Split, Vec<ToolCall>) {
    let Some(config) = config else {
        return (split, Vec::new());
    };
    let mut s = CallStream::new(config, id_prefix);
    let mut pieces = s.push(split);
    pieces.extend(s.finish());
    gather(pieces)
}

/// The text of `pieces` joined, and their calls.
pub fn gather(pieces: Vec<Piece>) -> (Split, Vec<ToolCall>) {
    let mut text = Split::default();
    let mut calls = Vec::new();
    for p in pieces {
        match p {
            Piece::Text(t) => {
                text.reasoning.push_str(&t.reasoning);
                text.content.push_str(&t.content);
            }
            Piece::Call(c) => calls.push(c),
        }
    }
    (text, calls)
}

/// One entry of OpenAI's `tool_calls` (a whole message's, or a piece of one in a chunk).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ToolCallOut {
    /// The call's position (chunks only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    /// `call_...` (the first piece of a call).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `function` (with the id).
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    /// Name and arguments.
    pub function: FunctionOut,
}

/// `tool_calls[].function`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FunctionOut {
    /// The function (the first piece of a call).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Arguments as JSON text (a piece of it in a chunk).
    pub arguments: String,
}

impl ToolCallOut {
    /// The call as a whole message carries it.
    pub fn whole(c: &ToolCall) -> Self {
        ToolCallOut {
            index: None,
            id: Some(c.id.clone()),
            kind: Some("function"),
            function: FunctionOut {
                name: Some(c.name.clone()),
                arguments: c.arguments_json(),
            },
        }
    }

    /// The call as stream deltas: its id, type and name with empty arguments, then the
    /// arguments (how OpenAI streams a call; clients concatenate `arguments` by `index`).
    pub fn deltas(c: &ToolCall) -> [Self; 2] {
        let head = ToolCallOut {
            index: Some(c.index),
            function: FunctionOut {
                name: Some(c.name.clone()),
                arguments: String::new(),
            },
            ..Self::whole(c)
        };
        let args = ToolCallOut {
            index: Some(c.index),
            id: None,
            kind: None,
            function: FunctionOut {
                name: None,
                arguments: c.arguments_json(),
            },
        };
        [head, args]
    }
}
