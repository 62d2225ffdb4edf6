//! Chat messages as chat-template input.

use super::api::{ChatRequest, MessageContent};
use super::error::ApiError;
use serde_json::{Map, Value};

impl ChatRequest {
    /// The messages as template input (`developer` is mapped to `system`; content parts are
    /// joined), rejecting unknown roles and non-text parts.
    pub fn template_messages(&self) -> Result<Vec<Value>, ApiError> {
        let mut out = Vec::with_capacity(self.messages.len());
        for (i, m) in self.messages.iter().enumerate() {
            let role = match m.role.as_str() {
                "developer" => "system",
                r @ ("system" | "user" | "assistant" | "tool") => r,
                other => {
                    return Err(ApiError::invalid_param(
                        format!("messages[{i}].role"),
                        format!("unknown role '{other}' (expected system, developer, user, assistant or tool)"),
                    ))
                }
            };
            let content = match &m.content {
                None => String::new(),
                Some(MessageContent::Text(t)) => t.clone(),
                Some(MessageContent::Parts(parts)) => {
                    let mut s = String::new();
                    for (j, p) in parts.iter().enumerate() {
                        match (p.kind.as_str(), &p.text) {
                            ("text", Some(t)) => s.push_str(t),
                            _ => {
                                return Err(ApiError::invalid_param(
                                    format!("messages[{i}].content[{j}]"),
                                    format!(
                                        "content part of type '{}' is not supported (text only)",
                                        p.kind
                                    ),
                                ))
                            }
                        }
                    }
                    s
                }
            };
            let mut obj = Map::new();
            obj.insert("role".into(), role.into());
            obj.insert("content".into(), content.into());
            if let Some(r) = &m.reasoning_content {
                obj.insert("reasoning_content".into(), r.clone().into());
            }
            if let Some(n) = &m.name {
                obj.insert("name".into(), n.clone().into());
            }
            if let Some(t) = &m.tool_calls {
                obj.insert("tool_calls".into(), t.clone());
            }
            if let Some(t) = &m.tool_call_id {
                obj.insert("tool_call_id".into(), t.clone().into());
            }
            out.push(Value::Object(obj));
        }
        Ok(out)
    }
}
