//! Anthropic Messages requests: parsing, checking, and mapping onto the chat template's input
//! and pn's generation settings.

use super::super::api::{self, GenSettings, SamplingDefaults, SamplingFields};
use super::super::error::ApiError;
use super::super::structured::ExtraFields;
use super::super::tools::{self, ToolChoice, ToolConfig, ToolSet};
use serde::Deserialize;
use serde_json::{json, Map, Value};

/// Fields pn acts on.
const SUPPORTED: &[&str] = &[
    "model",
    "messages",
    "system",
    "max_tokens",
    "stop_sequences",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "tools",
    "tool_choice",
    "thinking",
];

/// Fields accepted and ignored (`cache_control`: the slots cache prompts by themselves;
/// `context_management`: nothing is cleared from the conversation; `output_config` without a
/// `format`, e.g. an `effort`, which agent clients send).
pub const IGNORED: &[&str] = &[
    "metadata",
    "service_tier",
    "cache_control",
    "context_management",
    "output_config",
    "inference_geo",
    "speed",
    "user_profile_id",
    "workspace_id",
];

/// Fields of features pn does not have: a 400 naming them (and `output_config.format`).
pub const REJECTED: &[&str] = &["container", "mcp_servers", "diagnostics"];

/// `POST /v1/messages` (and `count_tokens`, which ignores the generation fields).
#[derive(Debug, Deserialize)]
pub struct MessagesRequest {
    /// Echoed back (one model is served).
    pub model: Option<String>,
    /// The conversation.
    pub messages: Vec<InMessage>,
    /// A string or a list of text blocks.
    pub system: Option<Value>,
    /// Required by `/v1/messages`.
    pub max_tokens: Option<i64>,
    /// Stop strings.
    pub stop_sequences: Option<Vec<String>>,
    /// Server-sent events.
    pub stream: Option<bool>,
    /// 0..=2 (Anthropic allows 0..=1).
    pub temperature: Option<f32>,
    /// Nucleus mass.
    pub top_p: Option<f32>,
    /// Top-k.
    pub top_k: Option<i64>,
    /// `[{name, description, input_schema}]`.
    pub tools: Option<Vec<Value>>,
    /// `{"type": "auto" | "any" | "tool" | "none", "name", "disable_parallel_tool_use"}`.
    pub tool_choice: Option<Value>,
    /// `{"type": "enabled", "budget_tokens": N}` or `{"type": "disabled"}`.
    pub thinking: Option<Value>,
}

/// One message.
#[derive(Debug, Deserialize)]
pub struct InMessage {
    /// `user` or `assistant`.
    pub role: String,
    /// A string or a list of content blocks.
    pub content: Value,
}

fn bad(param: impl Into<String>, message: impl Into<String>) -> ApiError {
    ApiError::invalid_param(param, message)
}

/// Parses a body, rejecting unknown fields as Anthropic does.
pub fn parse(body: &[u8]) -> Result<MessagesRequest, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("the request body is not valid JSON: {e}")))?;
    let Value::Object(map) = value else {
        return Err(ApiError::invalid("the request body must be a JSON object"));
    };
    for k in map.keys() {
        if REJECTED.contains(&k.as_str()) {
            return Err(bad(k.clone(), format!("{k}: not supported by this server")));
        }
        if !SUPPORTED.contains(&k.as_str()) && !IGNORED.contains(&k.as_str()) {
            return Err(bad(
                k.clone(),
                format!("{k}: Extra inputs are not permitted"),
            ));
        }
    }
    if map
        .get("output_config")
        .and_then(|o| o.get("format"))
        .is_some()
    {
        return Err(bad(
            "output_config.format",
            "output_config.format: structured output is not supported on this endpoint (use /v1/chat/completions with response_format)",
        ));
    }
    if !map.contains_key("messages") {
        return Err(bad("messages", "messages: Field required"));
    }
    api::typed(&map)
}

/// Text of a `system` field or of a tool result's content: a string or text blocks.
fn text_of(v: &Value, at: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        Value::Array(blocks) => {
            let mut s = String::new();
            for (j, b) in blocks.iter().enumerate() {
                match (block_type(b), b.get("text").and_then(Value::as_str)) {
                    ("text", Some(t)) => {
                        if !s.is_empty() {
                            s.push('\n');
                        }
                        s.push_str(t);
                    }
                    (kind, _) => return Err(unsupported_block(&format!("{at}[{j}]"), kind)),
                }
            }
            Ok(s)
        }
        _ => Err(bad(
            at,
            format!("{at}: expected a string or a list of text blocks"),
        )),
    }
}

fn block_type(b: &Value) -> &str {
    b.get("type").and_then(Value::as_str).unwrap_or("")
}

fn unsupported_block(at: &str, kind: &str) -> ApiError {
    bad(
        format!("{at}.type"),
        format!("{at}: content blocks of type '{kind}' are not supported by this server (text, tool_use, tool_result and thinking are)"),
    )
}

impl MessagesRequest {
    /// The conversation as chat-template messages (OpenAI's shape, which the templates read):
    /// `tool_result` blocks become `tool` messages, `tool_use` blocks an assistant's
    /// `tool_calls`, `thinking` blocks its `reasoning_content`.
    pub fn template_messages(&self) -> Result<Vec<Value>, ApiError> {
        let mut out = Vec::new();
        if let Some(system) = &self.system {
            out.push(json!({"role": "system", "content": text_of(system, "system")?}));
        }
        if self.messages.is_empty() {
            return Err(bad(
                "messages",
                "messages: at least one message is required",
            ));
        }
        for (i, m) in self.messages.iter().enumerate() {
            let at = format!("messages[{i}]");
            match m.role.as_str() {
                "user" => user_message(&m.content, &at, &mut out)?,
                "assistant" => out.push(assistant_message(&m.content, &at)?),
                other => {
                    return Err(bad(
                        format!("{at}.role"),
                        format!("{at}.role: expected 'user' or 'assistant', got '{other}'"),
                    ))
                }
            }
        }
        if self.messages.last().is_some_and(|m| m.role == "assistant") {
            return Err(bad(
                format!("messages[{}]", self.messages.len() - 1),
                "a final assistant message (prefilling the answer) is not supported by this server",
            ));
        }
        Ok(out)
    }

    /// The tools as the template gets them (OpenAI's function shape) and the tool settings.
    pub fn tools(&self) -> Result<(Option<Vec<Value>>, Option<ToolConfig>), ApiError> {
        let Some(list) = &self.tools else {
            if self.tool_choice.is_some() {
                choice(self.tool_choice.as_ref())?;
            }
            return Ok((None, None));
        };
        let mut set = ToolSet::default();
        let mut template = Vec::new();
        for (i, t) in list.iter().enumerate() {
            let at = format!("tools[{i}]");
            match t.get("type").and_then(Value::as_str) {
                None | Some("custom") => {}
                Some(other) => {
                    return Err(bad(
                        format!("{at}.type"),
                        format!("{at}: server tools ('{other}') are not supported; define client tools with name and input_schema"),
                    ))
                }
            }
            let spec = tools::spec(t.get("name"), t.get("input_schema"), &at)?;
            let mut f = Map::new();
            f.insert("name".into(), spec.name.clone().into());
            if let Some(d) = t.get("description") {
                f.insert("description".into(), d.clone());
            }
            f.insert("parameters".into(), spec.parameters.clone());
            template.push(json!({"type": "function", "function": f}));
            set.tools.push(spec);
        }
        let (choice, parallel) = choice(self.tool_choice.as_ref())?;
        let cfg = ToolConfig::new(set, choice, parallel, "tool_choice")?;
        Ok((Some(template), Some(cfg)))
    }

    /// `thinking.budget_tokens` of an enabled thinking block: the engine closes the block itself
    /// when it runs out (validated by [`MessagesRequest::kwargs`]).
    pub fn thinking_budget(&self) -> Option<usize> {
        let t = self.thinking.as_ref()?;
        if t.get("type").and_then(Value::as_str) != Some("enabled") {
            return None;
        }
        t.get("budget_tokens")
            .and_then(Value::as_u64)
            .and_then(|b| usize::try_from(b).ok())
    }

    /// Template variables: `enable_thinking` from `thinking` (off unless enabled, as the
    /// Messages API's default is no thinking).
    pub fn kwargs(&self) -> Result<Map<String, Value>, ApiError> {
        let enabled = match &self.thinking {
            None | Some(Value::Null) => false,
            Some(t) => match t.get("type").and_then(Value::as_str) {
                Some("enabled") => {
                    match t.get("budget_tokens").and_then(Value::as_i64) {
                        Some(b) if b > 0 => {}
                        _ => {
                            return Err(bad(
                                "thinking.budget_tokens",
                                "thinking.budget_tokens: a positive integer is required",
                            ))
                        }
                    }
                    true
                }
                Some("adaptive") => true,
                Some("disabled") => false,
                _ => {
                    return Err(bad(
                        "thinking.type",
                        "thinking.type: expected 'enabled', 'adaptive' or 'disabled'",
                    ))
                }
            },
        };
        let mut m = Map::new();
        m.insert("enable_thinking".into(), enabled.into());
        Ok(m)
    }

    /// Generation settings (`max_tokens` required unless `count_only`).
    pub fn settings(
        &self,
        defaults: &SamplingDefaults,
        count_only: bool,
    ) -> Result<GenSettings, ApiError> {
        if self.max_tokens.is_none() && !count_only {
            return Err(bad("max_tokens", "max_tokens: Field required"));
        }
        let mut m = Map::new();
        let mut put = |k: &str, v: Option<Value>| {
            if let Some(v) = v {
                m.insert(k.into(), v);
            }
        };
        put("max_tokens", self.max_tokens.map(Value::from));
        put("temperature", self.temperature.map(Value::from));
        put("top_p", self.top_p.map(Value::from));
        put("top_k", self.top_k.map(Value::from));
        put("stop", self.stop_sequences.clone().map(Value::from));
        put("stream", self.stream.map(Value::from));
        let fields: SamplingFields = api::typed(&m)?;
        fields
            .settings(None, None, &ExtraFields::default(), defaults)
            .map_err(|mut e| {
                // Name Anthropic's field.
                if e.param.as_deref() == Some("stop") {
                    e.param = Some("stop_sequences".into());
                    e.message = e.message.replace("'stop'", "'stop_sequences'");
                }
                e
            })
    }
}

fn choice(v: Option<&Value>) -> Result<(ToolChoice, bool), ApiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok((ToolChoice::Auto, true));
    };
    let parallel = !v
        .get("disable_parallel_tool_use")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let c = match v.get("type").and_then(Value::as_str) {
        Some("auto") => ToolChoice::Auto,
        Some("any") => ToolChoice::Required,
        Some("none") => ToolChoice::None,
        Some("tool") => match v.get("name").and_then(Value::as_str) {
            Some(n) => ToolChoice::Named(n.to_string()),
            None => return Err(bad("tool_choice.name", "tool_choice.name: Field required")),
        },
        _ => {
            return Err(bad(
                "tool_choice.type",
                "tool_choice.type: expected 'auto', 'any', 'tool' or 'none'",
            ))
        }
    };
    Ok((c, parallel))
}

fn blocks<'a>(content: &'a Value, at: &str) -> Result<Vec<&'a Value>, ApiError> {
    match content {
        Value::Array(b) => Ok(b.iter().collect()),
        _ => Err(bad(
            format!("{at}.content"),
            format!("{at}.content: expected a string or a list of content blocks"),
        )),
    }
}

fn user_message(content: &Value, at: &str, out: &mut Vec<Value>) -> Result<(), ApiError> {
    if let Value::String(s) = content {
        out.push(json!({"role": "user", "content": s}));
        return Ok(());
    }
    let mut text = String::new();
    for (j, b) in blocks(content, at)?.into_iter().enumerate() {
        let bat = format!("{at}.content[{j}]");
        match block_type(b) {
            "text" => {
                if !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(b.get("text").and_then(Value::as_str).unwrap_or(""));
            }
            "tool_result" => {
                let id = b.get("tool_use_id").and_then(Value::as_str).unwrap_or("");
                let mut result = text_of(
                    b.get("content").unwrap_or(&Value::Null),
                    &format!("{bat}.content"),
                )?;
                if b.get("is_error").and_then(Value::as_bool) == Some(true) {
                    result = format!("Error: {result}");
                }
                out.push(json!({"role": "tool", "tool_call_id": id, "content": result}));
            }
            kind => return Err(unsupported_block(&bat, kind)),
        }
    }
    if !text.is_empty() {
        out.push(json!({"role": "user", "content": text}));
    }
    Ok(())
}

fn assistant_message(content: &Value, at: &str) -> Result<Value, ApiError> {
    if let Value::String(s) = content {
        return Ok(json!({"role": "assistant", "content": s}));
    }
    let (mut text, mut thinking, mut calls) = (String::new(), String::new(), Vec::new());
    for (j, b) in blocks(content, at)?.into_iter().enumerate() {
        let bat = format!("{at}.content[{j}]");
        match block_type(b) {
            "text" => text.push_str(b.get("text").and_then(Value::as_str).unwrap_or("")),
            "thinking" => {
                thinking.push_str(b.get("thinking").and_then(Value::as_str).unwrap_or(""))
            }
            "redacted_thinking" => {}
            "tool_use" => {
                let name = b.get("name").and_then(Value::as_str).unwrap_or("");
                let input = b.get("input").cloned().unwrap_or_else(|| json!({}));
                calls.push(
                    json!({"id": b.get("id").cloned().unwrap_or(Value::Null), "type": "function",
                    "function": {"name": name, "arguments": input}}),
                );
            }
            kind => return Err(unsupported_block(&bat, kind)),
        }
    }
    let mut m = json!({"role": "assistant", "content": text});
    if !thinking.is_empty() {
        m["reasoning_content"] = thinking.into();
    }
    if !calls.is_empty() {
        m["tool_calls"] = calls.into();
    }
    Ok(m)
}
