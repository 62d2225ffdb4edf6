//! The incremental tool-call parser: generated text in, text and parsed calls out.
//!
//! Two forms are recognised inside `<tool_call>` ... `</tool_call>`:
//!
//! - the XML-like form of the Qwen3.5/3.6/3.8 templates (what they render for an assistant
//!   turn with `tool_calls`, and what their system prompt tells the model to write):
//!   `<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...</function>\n</tool_call>`;
//! - Qwen3's JSON form: `<tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>`.
//!
//! Text arrives in arbitrary pieces. Outside a call the parser holds back a tail that could
//! still become `<tool_call>` and a trailing whitespace run (whitespace next to a call is
//! dropped, as the templates add it themselves when they render the call back); a block is
//! held whole until it closes, then released as one call, or as its raw text when it does not
//! parse. A call is therefore never half-announced: a truncated call (`max_tokens`) or a
//! malformed one comes back as text. The output does not depend on how the text was cut.
//!
//! Leniency, for the failure modes servers see from these models:
//! - a duplicated closing tag (`</parameter>`, `</function>` inside the block, `</tool_call>`
//!   right after a call) is dropped;
//! - a parameter without `</parameter>` ends at the next `<parameter=` or `</function>`
//!   (so a string value cannot contain those two tags, nor `</parameter>`);
//! - a block without `</tool_call>` still counts when its function is complete and the text
//!   ends or another `<tool_call>` starts;
//! - anything else in a block (text around the function, a missing `>` or `</function>`,
//!   invalid JSON) makes the whole block text again.

use super::ToolSet;
use serde_json::{Map, Value};

/// Opens a call block.
pub const OPEN: &str = "<tool_call>";
/// Closes a call block.
pub const CLOSE: &str = "</tool_call>";
const FUNCTION: &str = "<function=";
const FUNCTION_END: &str = "</function>";
const PARAMETER: &str = "<parameter=";
const PARAMETER_END: &str = "</parameter>";

/// One call as the model wrote it (before it gets an id).
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedCall {
    /// The function's name.
    pub name: String,
    /// The arguments, typed by the tool's JSON schema (in the order written).
    pub arguments: Map<String, Value>,
}

/// What the parser releases.
#[derive(Debug, Clone, PartialEq)]
pub enum Parsed {
    /// Plain text (never empty).
    Text(String),
    /// A complete call.
    Call(ParsedCall),
}

/// Streaming parser of one text stream (the answer, or the reasoning).
#[derive(Debug, Clone)]
pub struct ToolCallParser {
    tools: std::sync::Arc<ToolSet>,
    /// Text not released yet: outside a block, a tail that may become a tag or precede one;
    /// inside, the block after `<tool_call>`.
    held: String,
    in_block: bool,
    /// Whitespace dropped before the current block's `<tool_call>` (given back if the block
    /// turns out to be text).
    ws_before: String,
    /// The last thing released was a call: leading whitespace and stray `</tool_call>` tags
    /// are dropped.
    after_call: bool,
}

impl ToolCallParser {
    /// A parser typing arguments by `tools`' schemas.
    pub fn new(tools: std::sync::Arc<ToolSet>) -> Self {
        ToolCallParser {
            tools,
            held: String::new(),
            in_block: false,
            ws_before: String::new(),
            after_call: false,
        }
    }

    /// Feeds a piece of text; returns what became final.
    pub fn push(&mut self, text: &str) -> Vec<Parsed> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            if self.in_block {
                let close = self.held.find(CLOSE);
                let reopen = self.held.find(OPEN);
                match (close, reopen) {
                    (Some(c), r) if r.is_none_or(|r| c < r) => {
                        let rest = self.held.split_off(c);
                        let block =
                            std::mem::replace(&mut self.held, rest[CLOSE.len()..].to_string());
                        self.end_block(&block, true, &mut out);
                    }
                    (_, Some(r)) => {
                        // A new call opens before this one closed.
                        let rest = self.held.split_off(r);
                        let block = std::mem::replace(&mut self.held, rest);
                        self.end_block(&block, false, &mut out);
                    }
                    _ => return out,
                }
                continue;
            }
            if self.after_call {
                let t = self.held.trim_start();
                if t.is_empty() {
                    self.held.clear();
                    return out;
                }
                if let Some(rest) = t.strip_prefix(CLOSE) {
                    // A duplicated closing tag.
                    self.held = rest.to_string();
                    continue;
                }
                if CLOSE.starts_with(t) {
                    self.held = t.to_string();
                    return out;
                }
                self.held = t.to_string();
                self.after_call = false;
            }
            if let Some(i) = self.held.find(OPEN) {
                let text = &self.held[..i];
                let kept = text.trim_end();
                if !kept.is_empty() {
                    out.push(Parsed::Text(kept.to_string()));
                }
                self.ws_before = text[kept.len()..].to_string();
                self.held.drain(..i + OPEN.len());
                self.in_block = true;
                continue;
            }
            // Release all but a possible partial tag and the whitespace before it.
            let tag = partial_suffix(&self.held, OPEN);
            let kept = self.held[..self.held.len() - tag].trim_end().len();
            if kept > 0 {
                out.push(Parsed::Text(self.held[..kept].to_string()));
                self.held.drain(..kept);
            }
            return out;
        }
    }

    /// Releases what is held at the end of the text: an unclosed block is a call when its
    /// function is complete, else text.
    pub fn finish(&mut self) -> Vec<Parsed> {
        let mut out = Vec::new();
        let held = std::mem::take(&mut self.held);
        if self.in_block {
            self.end_block(&held, false, &mut out);
        } else if !self.after_call && !held.is_empty() {
            out.push(Parsed::Text(held));
        }
        // After a call, only whitespace or part of a stray `</tool_call>` can be held.
        out
    }

    fn end_block(&mut self, block: &str, closed: bool, out: &mut Vec<Parsed>) {
        self.in_block = false;
        let ws = std::mem::take(&mut self.ws_before);
        match parse_block(block, &self.tools) {
            Some(call) => {
                out.push(Parsed::Call(call));
                self.after_call = true;
            }
            None => {
                let close = if closed { CLOSE } else { "" };
                out.push(Parsed::Text(format!("{ws}{OPEN}{block}{close}")));
                self.after_call = false;
            }
        }
    }
}

/// Length of the longest proper suffix of `s` that starts `tag` (a tag cut by a piece
/// boundary).
pub(super) fn partial_suffix(s: &str, tag: &str) -> usize {
    let longest = tag.len().saturating_sub(1).min(s.len());
    (1..=longest)
        .rev()
        .find(|&n| s.is_char_boundary(s.len() - n) && tag.starts_with(&s[s.len() - n..]))
        .unwrap_or(0)
}

/// Parses the text between `<tool_call>` and `</tool_call>`.
pub fn parse_block(block: &str, tools: &ToolSet) -> Option<ParsedCall> {
    let b = block.trim();
    if b.starts_with('{') {
        parse_json_call(b)
    } else {
        parse_xml_call(b, tools)
    }
}

fn parse_json_call(b: &str) -> Option<ParsedCall> {
    let v: Value = serde_json::from_str(b).ok()?;
    let name = v.get("name")?.as_str()?.trim();
    if !valid_name(name) {
        return None;
    }
    let arguments = match v.get("arguments").or_else(|| v.get("parameters")) {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        // Some models write the arguments as a JSON string.
        Some(Value::String(s)) => serde_json::from_str(s).ok()?,
        Some(_) => return None,
    };
    Some(ParsedCall {
        name: name.to_string(),
        arguments,
    })
}

fn valid_name(name: &str) -> bool {
    !name.is_empty() && !name.contains(['<', '>', '\n', '='])
}

/// `NAME>` at the start of `s`: the name and the rest after `>`.
fn tag_name(s: &str) -> Option<(&str, &str)> {
    let gt = s.find('>')?;
    let name = s[..gt].trim();
    valid_name(name).then(|| (name, &s[gt + 1..]))
}

fn parse_xml_call(b: &str, tools: &ToolSet) -> Option<ParsedCall> {
    let (name, mut body) = tag_name(b.strip_prefix(FUNCTION)?)?;
    let mut arguments = Map::new();
    loop {
        body = body.trim_start();
        if let Some(r) = body.strip_prefix(PARAMETER) {
            let (param, after) = tag_name(r)?;
            // The value ends at the first closing tag, or (without one) where the next
            // parameter or the function's end begins.
            let end = [PARAMETER_END, PARAMETER, FUNCTION_END]
                .iter()
                .filter_map(|t| after.find(t))
                .min()?;
            let raw = strip_newlines(&after[..end]);
            let rest = &after[end..];
            body = rest.strip_prefix(PARAMETER_END).unwrap_or(rest);
            let value = typed_value(tools.parameter_schema(name, param), raw);
            arguments.insert(param.to_string(), value);
        } else if let Some(r) = body.strip_prefix(PARAMETER_END) {
            body = r;
        } else if let Some(r) = body.strip_prefix(FUNCTION_END) {
            let mut t = r.trim_start();
            while let Some(x) = t
                .strip_prefix(FUNCTION_END)
                .or_else(|| t.strip_prefix(PARAMETER_END))
            {
                t = x.trim_start();
            }
            return t.is_empty().then(|| ParsedCall {
                name: name.to_string(),
                arguments,
            });
        } else {
            return None;
        }
    }
}

/// The value between `<parameter=P>` and `</parameter>` without the one newline the template
/// writes on each side.
fn strip_newlines(v: &str) -> &str {
    let v = v
        .strip_prefix("\r\n")
        .or_else(|| v.strip_prefix('\n'))
        .unwrap_or(v);
    v.strip_suffix("\r\n")
        .or_else(|| v.strip_suffix('\n'))
        .unwrap_or(v)
}

/// The JSON types a schema allows (`type` as a string or list, else the types of its
/// `enum`/`const` values, else of its `anyOf`/`oneOf` branches); empty when unknown.
pub(super) fn schema_types(schema: &Value) -> Vec<&str> {
    fn of_value(v: &Value) -> &'static str {
        match v {
            Value::Null => "null",
            Value::Bool(_) => "boolean",
            Value::Number(_) => "number",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        }
    }
    match schema.get("type") {
        Some(Value::String(t)) => return vec![t.as_str()],
        Some(Value::Array(ts)) => return ts.iter().filter_map(Value::as_str).collect(),
        _ => {}
    }
    if let Some(c) = schema.get("const") {
        return vec![of_value(c)];
    }
    if let Some(Value::Array(vs)) = schema.get("enum") {
        return vs.iter().map(of_value).collect();
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(Value::Array(branches)) = schema.get(key) {
            return branches.iter().flat_map(schema_types).collect();
        }
    }
    Vec::new()
}

/// A parameter's text as the JSON value its schema asks for: strings stay strings; numbers,
/// booleans, objects, arrays and null are parsed as JSON (Python's `True`/`False`/`None`
/// too, which the Qwen3.5 template writes for booleans and null); a value that does not parse,
/// or a parameter without a schema, is JSON when it parses and a string otherwise.
pub fn typed_value(schema: Option<&Value>, raw: &str) -> Value {
    let types = schema.map(schema_types).unwrap_or_default();
    let t = raw.trim();
    if types.contains(&"string") {
        return if t == "null" && types.contains(&"null") {
            Value::Null
        } else {
            Value::String(raw.to_string())
        };
    }
    if let Ok(v) = serde_json::from_str::<Value>(t) {
        return v;
    }
    // Python's spelling, for a parameter of that type or of no known type.
    let allows = |ty: &str| types.is_empty() || types.contains(&ty);
    let python = match t {
        "True" if allows("boolean") => Some(Value::Bool(true)),
        "False" if allows("boolean") => Some(Value::Bool(false)),
        "None" if allows("null") => Some(Value::Null),
        _ => None,
    };
    python.unwrap_or_else(|| Value::String(raw.to_string()))
}
