//! Structured output on the HTTP API, and the request extras of llama-server and vLLM.
//!
//! A request asks for constrained output with OpenAI's `response_format`
//! (`{"type": "json_object"}`, `{"type": "json_schema", "json_schema": {"name", "schema",
//! "strict"}}`), llama-server's `grammar` (GBNF) or `json_schema`, or vLLM's `guided_json`,
//! `guided_regex`, `guided_grammar`, `guided_choice`; at most one of them. All go through
//! [`crate::constrain`].
//!
//! Other extras such clients send are accepted by name ([`EXTRA_FIELDS`]): the ones pn has are
//! honoured (`n_predict`, `repetition_penalty`, `stop_token_ids`), the rest are ignored
//! (`cache_prompt` and `id_slot`: the scheduler always reuses the best slot's cache).

use super::error::ApiError;
use crate::constrain::Grammar;
use serde::Deserialize;
use serde_json::Value;

/// Request fields of llama-server and vLLM accepted on both endpoints besides OpenAI's.
pub const EXTRA_FIELDS: &[&str] = &[
    // Structured output.
    "response_format",
    "grammar",
    "json_schema",
    "guided_json",
    "guided_regex",
    "guided_grammar",
    "guided_choice",
    "guided_decoding_backend",
    "guided_whitespace_pattern",
    // Honoured.
    "n_predict",
    "repetition_penalty",
    "stop_token_ids",
    // llama-server extras, ignored.
    "cache_prompt",
    "id_slot",
    "n_keep",
    "n_probs",
    "n_indent",
    "n_cmpl",
    "typical_p",
    "tfs_z",
    "mirostat",
    "mirostat_tau",
    "mirostat_eta",
    "dynatemp_range",
    "dynatemp_exponent",
    "xtc_probability",
    "xtc_threshold",
    "dry_multiplier",
    "dry_base",
    "dry_allowed_length",
    "dry_penalty_last_n",
    "dry_sequence_breakers",
    "penalize_nl",
    "samplers",
    "t_max_predict_ms",
    "timings_per_token",
    "return_tokens",
    "return_progress",
    "post_sampling_probs",
    "response_fields",
    "grammar_lazy",
    "grammar_triggers",
    "preserved_tokens",
    "lora",
    // vLLM extras, ignored.
    "min_tokens",
    "use_beam_search",
    "length_penalty",
    "early_stopping",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "truncate_prompt_tokens",
    "prompt_logprobs",
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "documents",
    "priority",
    "request_id",
    "return_tokens_as_token_ids",
    "structured_outputs",
];

/// The extras pn acts on.
#[derive(Debug, Default, Deserialize)]
pub struct ExtraFields {
    /// OpenAI's output format (`text`, `json_object`, `json_schema`).
    pub response_format: Option<Value>,
    /// llama-server: a GBNF grammar.
    pub grammar: Option<String>,
    /// llama-server: a JSON schema.
    pub json_schema: Option<Value>,
    /// vLLM: a JSON schema (object or JSON text).
    pub guided_json: Option<Value>,
    /// vLLM: a regular expression.
    pub guided_regex: Option<String>,
    /// vLLM: a grammar (GBNF, or Lark when it has no `::=`).
    pub guided_grammar: Option<String>,
    /// vLLM: one of these strings exactly.
    pub guided_choice: Option<Vec<String>>,
    /// llama-server's `max_tokens` (-1: until the context is full or an end token).
    pub n_predict: Option<i64>,
    /// vLLM's name of `repeat_penalty`.
    pub repetition_penalty: Option<f32>,
    /// vLLM: more token ids that end the generation.
    pub stop_token_ids: Option<Vec<u32>>,
}

impl ExtraFields {
    /// The grammar the request asks for, if any: a 400 naming the field when it is malformed
    /// or when more than one field asks for one.
    pub fn grammar(&self) -> Result<Option<(Grammar, &'static str)>, ApiError> {
        let mut found: Vec<(Grammar, &'static str)> = Vec::new();
        if let Some(f) = &self.response_format {
            if let Some(g) = response_format(f)? {
                found.push((g, "response_format"));
            }
        }
        if let Some(g) = &self.grammar {
            found.push((Grammar::Gbnf(g.clone()), "grammar"));
        }
        if let Some(s) = &self.json_schema {
            found.push((
                Grammar::JsonSchema(schema_value(s, "json_schema")?),
                "json_schema",
            ));
        }
        if let Some(s) = &self.guided_json {
            found.push((
                Grammar::JsonSchema(schema_value(s, "guided_json")?),
                "guided_json",
            ));
        }
        if let Some(r) = &self.guided_regex {
            found.push((Grammar::Regex(r.clone()), "guided_regex"));
        }
        if let Some(g) = &self.guided_grammar {
            let g = if g.contains("::=") {
                Grammar::Gbnf(g.clone())
            } else {
                Grammar::Lark(g.clone())
            };
            found.push((g, "guided_grammar"));
        }
        if let Some(choices) = &self.guided_choice {
            if choices.is_empty() {
                return Err(ApiError::invalid_param(
                    "guided_choice",
                    "'guided_choice' needs at least one string",
                ));
            }
            let alts: Vec<String> = choices
                .iter()
                .map(|c| serde_json::to_string(c).unwrap_or_default())
                .collect();
            found.push((
                Grammar::Lark(format!("start: {}\n", alts.join(" | "))),
                "guided_choice",
            ));
        }
        if found.len() > 1 {
            return Err(ApiError::invalid_param(
                found[1].1,
                format!(
                    "only one of response_format, grammar, json_schema and guided_* may constrain the output; got {} and {}",
                    found[0].1, found[1].1
                ),
            ));
        }
        Ok(found.pop())
    }
}

/// A schema given as a JSON object or as JSON text.
fn schema_value(v: &Value, field: &str) -> Result<Value, ApiError> {
    let v = match v {
        Value::String(s) => serde_json::from_str(s).map_err(|e| {
            ApiError::invalid_param(field, format!("'{field}' is not valid JSON: {e}"))
        })?,
        other => other.clone(),
    };
    if v.is_object() || v.is_boolean() {
        Ok(v)
    } else {
        Err(ApiError::invalid_param(
            field,
            format!("'{field}' must be a JSON schema object"),
        ))
    }
}

/// OpenAI's `response_format`: `text` (no constraint), `json_object` (any object, or
/// llama-server's `schema` beside it), `json_schema` (`json_schema.schema`; `strict` is
/// accepted either way: the output always follows the schema).
fn response_format(f: &Value) -> Result<Option<Grammar>, ApiError> {
    let param = "response_format";
    match f.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(match f.get("schema") {
            Some(s) => Grammar::JsonSchema(schema_value(s, "response_format.schema")?),
            None => Grammar::JsonObject,
        })),
        Some("json_schema") => {
            let spec = f.get("json_schema").ok_or_else(|| {
                ApiError::invalid_param(
                    "response_format.json_schema",
                    "Missing required parameter: 'response_format.json_schema'.",
                )
            })?;
            // OpenAI nests the schema under `schema`; llama-server also takes it bare.
            let schema = spec.get("schema").unwrap_or(spec);
            Ok(Some(Grammar::JsonSchema(schema_value(
                schema,
                "response_format.json_schema.schema",
            )?)))
        }
        other => Err(ApiError::invalid_param(
            param,
            format!(
                "response_format type must be 'text', 'json_object' or 'json_schema', got {}",
                other.map_or_else(|| "none".to_string(), |t| format!("'{t}'"))
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extras(v: Value) -> ExtraFields {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn response_formats() {
        let e = extras(serde_json::json!({"response_format": {"type": "json_object"}}));
        assert_eq!(e.grammar().unwrap().unwrap().0, Grammar::JsonObject);
        let schema = serde_json::json!({"type": "object"});
        let e = extras(
            serde_json::json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "x", "schema": schema, "strict": true}}}),
        );
        assert_eq!(e.grammar().unwrap().unwrap().0, Grammar::JsonSchema(schema));
        let e = extras(serde_json::json!({"response_format": {"type": "text"}}));
        assert!(e.grammar().unwrap().is_none());
        let e = extras(serde_json::json!({"response_format": {"type": "xml"}}));
        assert_eq!(
            e.grammar().unwrap_err().param.as_deref(),
            Some("response_format")
        );
    }

    #[test]
    fn one_constraint_per_request() {
        let e = extras(serde_json::json!({"grammar": "root ::= \"a\"", "json_schema": {}}));
        assert_eq!(
            e.grammar().unwrap_err().param.as_deref(),
            Some("json_schema")
        );
        let e = extras(serde_json::json!({"guided_json": "{\"type\": \"integer\"}"}));
        assert_eq!(
            e.grammar().unwrap().unwrap().0,
            Grammar::JsonSchema(serde_json::json!({"type": "integer"}))
        );
    }
}
