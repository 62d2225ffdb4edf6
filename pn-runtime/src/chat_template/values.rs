//! Rewriting template variables before a render: the string leaves of a value
//! ([`rewrite_strings`], for neutralizing control-token text) and the tool-call arguments of
//! OpenAI messages ([`parse_tool_arguments`]).

use minijinja::value::ValueKind;
use minijinja::Value;

/// `value` with every string (map keys included) passed through `f`, which returns the
/// replacement or `None` to keep the string. `None` when nothing changed (no copy is made);
/// maps keep their key order.
pub(super) fn rewrite_strings(
    value: &Value,
    f: &mut dyn FnMut(&str) -> Option<String>,
) -> Option<Value> {
    match value.kind() {
        ValueKind::String => {
            let new = f(value.as_str()?)?;
            Some(if value.is_safe() {
                Value::from_safe_string(new)
            } else {
                Value::from(new)
            })
        }
        ValueKind::Seq => map_seq(value, &mut |item| rewrite_strings(item, f)),
        ValueKind::Map => {
            let keys: Vec<Value> = value.try_iter().ok()?.collect();
            let mut changed = false;
            let mut pairs = Vec::with_capacity(keys.len());
            for key in keys {
                let item = value.get_item(&key).unwrap_or_default();
                let new_key = rewrite_strings(&key, f);
                let new_item = rewrite_strings(&item, f);
                changed |= new_key.is_some() || new_item.is_some();
                pairs.push((new_key.unwrap_or(key), new_item.unwrap_or(item)));
            }
            changed.then(|| Value::from_pairs(pairs))
        }
        _ => None,
    }
}

/// `messages` with each tool call's `arguments` that is a string holding a JSON object
/// replaced by that object, as transformers users pass them (OpenAI clients send the
/// arguments as a JSON string; the Qwen templates iterate them as a mapping). Both shapes of a
/// tool call are handled: `{"function": {"name", "arguments"}}` and the bare `{"name",
/// "arguments"}`. A string that is not a JSON object stays the string. `None` when nothing
/// changed.
pub(super) fn parse_tool_arguments(messages: &Value) -> Option<Value> {
    let arguments = |call: &Value| -> Option<Value> {
        let parse = |args: &Value| -> Option<Value> {
            let text = args.as_str()?;
            let parsed: Value = serde_json::from_str(text).ok()?;
            (parsed.kind() == ValueKind::Map).then_some(parsed)
        };
        let function = call
            .get_attr("function")
            .ok()
            .filter(|f| f.kind() == ValueKind::Map);
        match function {
            Some(function) => {
                let args = parse(&function.get_attr("arguments").ok()?)?;
                Some(with_entry(
                    call,
                    "function",
                    with_entry(&function, "arguments", args),
                ))
            }
            None => {
                let args = parse(&call.get_attr("arguments").ok()?)?;
                Some(with_entry(call, "arguments", args))
            }
        }
    };
    map_seq(messages, &mut |message| {
        let calls = message.get_attr("tool_calls").ok()?;
        let calls = map_seq(&calls, &mut |call| arguments(call))?;
        Some(with_entry(message, "tool_calls", calls))
    })
}

/// Sequence `seq` with each item `f` returns `Some` for replaced; `None` when `seq` is not a
/// sequence or no item changed.
fn map_seq(seq: &Value, f: &mut dyn FnMut(&Value) -> Option<Value>) -> Option<Value> {
    if seq.kind() != ValueKind::Seq {
        return None;
    }
    let mut changed = false;
    let new: Vec<Value> = seq
        .try_iter()
        .ok()?
        .map(|item| match f(&item) {
            Some(v) => {
                changed = true;
                v
            }
            None => item,
        })
        .collect();
    changed.then(|| Value::from(new))
}

/// A copy of map `map` with `key` set to `value` (in place of the old entry, order kept).
fn with_entry(map: &Value, key: &str, value: Value) -> Value {
    let keys: Vec<Value> = map.try_iter().map(|i| i.collect()).unwrap_or_default();
    let mut value = Some(value);
    let pairs: Vec<(Value, Value)> = keys
        .into_iter()
        .map(|k| {
            let v = if k.as_str() == Some(key) {
                value.take().unwrap_or_default()
            } else {
                map.get_item(&k).unwrap_or_default()
            };
            (k, v)
        })
        .collect();
    Value::from_pairs(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(text: &str) -> Value {
        serde_json::from_str(text).unwrap()
    }

    fn dumps(v: &Value) -> String {
        serde_json::to_string(v).unwrap()
    }

    #[test]
    fn string_arguments_become_objects_in_both_tool_call_shapes() {
        let messages = json(
            r#"[{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "", "tool_calls": [
                  {"type": "function", "function": {"name": "f", "arguments": "{\"b\": 1, \"a\": [true]}"}},
                  {"name": "g", "arguments": "{\"x\": \"y\"}"},
                  {"function": {"name": "h", "arguments": "not json"}},
                  {"function": {"name": "k", "arguments": "[1, 2]"}},
                  {"function": {"name": "m", "arguments": {"already": "an object"}}}]}]"#,
        );
        let got = parse_tool_arguments(&messages).expect("changed");
        assert_eq!(
            dumps(&got),
            r#"[{"role":"user","content":"hi"},{"role":"assistant","content":"","tool_calls":[{"type":"function","function":{"name":"f","arguments":{"b":1,"a":[true]}}},{"name":"g","arguments":{"x":"y"}},{"function":{"name":"h","arguments":"not json"}},{"function":{"name":"k","arguments":"[1, 2]"}},{"function":{"name":"m","arguments":{"already":"an object"}}}]}]"#
        );
        // Nothing to parse: no copy.
        assert!(parse_tool_arguments(&json(r#"[{"role": "user", "content": "{}"}]"#)).is_none());
        assert!(parse_tool_arguments(&json(r#"{"messages": []}"#)).is_none());
    }

    #[test]
    fn strings_are_rewritten_everywhere_and_order_is_kept() {
        let v = json(r#"{"z": "a-b", "a-k": ["x", {"q": "b-a"}], "n": 3}"#);
        let mut f = |s: &str| s.contains('-').then(|| s.replace('-', "+"));
        let got = rewrite_strings(&v, &mut f).unwrap();
        assert_eq!(dumps(&got), r#"{"z":"a+b","a+k":["x",{"q":"b+a"}],"n":3}"#);
        assert!(rewrite_strings(&json(r#"["x", 1]"#), &mut f).is_none());
    }
}
