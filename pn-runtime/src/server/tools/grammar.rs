//! The grammar that forces a call (`tool_choice: "required"` or a named function), in
//! llguidance's Lark syntax, compiled by [`crate::constrain`].
//!
//! It allows, in order: the rest of the thinking block when the prompt opened one (any text up
//! to the first `</think>`, then up to two newlines); then one call (or, for `required` with
//! parallel calls allowed, up to [`MAX_PARALLEL`] calls separated by a newline) of one of the
//! allowed functions, in the form the chat template teaches ([`CallForm`]). Nothing may come
//! after the last call but the end token.
//!
//! Simplifications against the JSON schema (the parser reads anything this allows):
//! - the XML form lists the schema's `properties` in schema order, the `required` ones
//!   mandatory and the others optional, and nothing else;
//! - a parameter whose schema allows strings (or says nothing about its type) is free text
//!   that cannot contain `<parameter=` or `</function>` and ends at the first `</parameter>`
//!   (string `minLength`, `maxLength`, `pattern` and `format` are not enforced), except an
//!   `enum` of strings, which is one of them exactly;
//! - every other parameter is JSON valid against its own schema (llguidance's JSON schema
//!   support: types, bounds, `enum`, nested objects and arrays).
//!
//! In the JSON form (Qwen3 templates) the whole call is one JSON object whose `name` is the
//! function and whose `arguments` follow the function's schema.

use super::parser::schema_types;
use super::{ToolChoice, ToolConfig, ToolSpec};
use serde_json::{json, Value};
use std::fmt::Write;

/// Most calls a forced `required` generation may make when parallel calls are allowed.
pub const MAX_PARALLEL: usize = 8;

/// How the chat template tells the model to write a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallForm {
    /// `<function=NAME><parameter=P>...` (Qwen3.5/3.6/3.8).
    Xml,
    /// `{"name": ..., "arguments": ...}` (Qwen3).
    Json,
}

impl CallForm {
    /// The form a rendered prompt (with the tools in its system part) teaches: the Qwen3.5
    /// templates show `<function=`, the Qwen3 ones a JSON object with `"arguments"`. A
    /// template that shows neither (pn's ChatML fallback) gets the Qwen3.5 form, the family
    /// pn targets.
    pub fn of_prompt(prompt: &str) -> CallForm {
        if prompt.contains("<function=") {
            CallForm::Xml
        } else if prompt.contains(super::parser::OPEN) && prompt.contains("\"arguments\"") {
            CallForm::Json
        } else {
            CallForm::Xml
        }
    }
}

/// A Lark string literal.
fn lit(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// A schema with the layout options the structured-output endpoint uses (no free whitespace).
fn json_rule(schema: &Value) -> String {
    let mut s = schema.clone();
    if let Some(o) = s.as_object_mut() {
        o.entry("x-guidance").or_insert_with(
            || json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    format!("%json {s}")
}

/// The grammar for `config` (which must force a call); `thinking`: the prompt left the model
/// inside `<think>`.
pub fn call_grammar(config: &ToolConfig, form: CallForm, thinking: bool) -> String {
    let tools: Vec<&ToolSpec> = match &config.choice {
        ToolChoice::Named(n) => config.set.tools.iter().filter(|t| &t.name == n).collect(),
        _ => config.set.tools.iter().collect(),
    };
    let many = config.parallel && config.choice == ToolChoice::Required;
    let mut g = String::new();
    if thinking {
        g.push_str(
            "start: thinking NL? calls\nthinking[lazy]: /(?s:.*)<\\/think>/\nNL: /\\n{1,2}/\n",
        );
    } else {
        g.push_str("start: calls\n");
    }
    if many {
        let _ = writeln!(g, "calls: call (\"\\n\" call){{0,{}}}", MAX_PARALLEL - 1);
    } else {
        g.push_str("calls: call\n");
    }
    let alts: Vec<String> = (0..tools.len()).map(|i| format!("fn_{i}")).collect();
    match form {
        CallForm::Xml => {
            let _ = writeln!(
                g,
                "call: {} ({}) {}",
                lit("<tool_call>\n"),
                alts.join(" | "),
                lit("</tool_call>")
            );
            // A string value: up to the first `</parameter>`, without the tags that would end
            // it early for the parser.
            g.push_str("STRVAL: (/(?s:.*)/ & ~/(?s:.*)(<parameter=|<\\/function>)(?s:.*)/) \"</parameter>\"\n");
            for (i, t) in tools.iter().enumerate() {
                xml_function(&mut g, i, t);
            }
        }
        CallForm::Json => {
            let _ = writeln!(
                g,
                "call: {} ({}) {}",
                lit("<tool_call>\n"),
                alts.join(" | "),
                lit("\n</tool_call>")
            );
            for (i, t) in tools.iter().enumerate() {
                let schema = json!({
                    "type": "object",
                    "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                    "required": ["name", "arguments"],
                    "additionalProperties": false,
                });
                let _ = writeln!(g, "fn_{i}: {}", json_rule(&schema));
            }
        }
    }
    g
}

fn xml_function(g: &mut String, i: usize, t: &ToolSpec) {
    let required: Vec<&str> = t
        .parameters
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut body = vec![lit(&format!("<function={}>\n", t.name))];
    let props = t.parameters.get("properties").and_then(Value::as_object);
    for (j, (name, schema)) in props.into_iter().flatten().enumerate() {
        let rule = format!("p_{i}_{j}");
        let head = lit(&format!("<parameter={name}>\n"));
        let types = schema_types(schema);
        let enum_strings: Option<Vec<String>> = schema
            .get("enum")
            .and_then(Value::as_array)
            .and_then(|vs| vs.iter().map(|v| v.as_str().map(lit)).collect());
        let value = if let Some(alts) = enum_strings.filter(|a| !a.is_empty()) {
            format!("({}) {}", alts.join(" | "), lit("\n</parameter>"))
        } else if types.is_empty() || types.contains(&"string") {
            let _ = writeln!(g, "s_{i}_{j}[lazy]: STRVAL");
            format!("s_{i}_{j}")
        } else {
            format!("{} {}", json_rule(schema), lit("\n</parameter>"))
        };
        let _ = writeln!(g, "{rule}: {head} {value} \"\\n\"");
        body.push(if required.contains(&name.as_str()) {
            rule
        } else {
            format!("{rule}?")
        });
    }
    body.push(lit("</function>\n"));
    let _ = writeln!(g, "fn_{i}: {}", body.join(" "));
}
