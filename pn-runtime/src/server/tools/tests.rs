//! The tool-call parser and assembler on scripted model text (no model involved).

use super::grammar::{call_grammar, CallForm};
use super::parser::{parse_block, typed_value, Parsed, ParsedCall, ToolCallParser};
use super::*;
use proptest::prelude::*;
use serde_json::json;

fn weather_tools() -> Arc<ToolSet> {
    let openai = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "metric": {"type": "boolean"},
            "coords": {"type": "object"},
            "tags": {"type": "array"},
            "note": {"type": ["string", "null"]}},
        "required": ["city"]}}}]);
    let cfg = ToolConfig::from_openai(openai.as_array().map(Vec::as_slice), None, None)
        .unwrap()
        .unwrap();
    cfg.set.clone()
}

/// Feeds `pieces`, merging adjacent text so the result can be compared across cuts.
fn parse_pieces(tools: &Arc<ToolSet>, pieces: &[&str]) -> Vec<Parsed> {
    let mut p = ToolCallParser::new(tools.clone());
    let mut out: Vec<Parsed> = Vec::new();
    let mut all = Vec::new();
    for piece in pieces {
        all.extend(p.push(piece));
    }
    all.extend(p.finish());
    for x in all {
        match (out.last_mut(), x) {
            (Some(Parsed::Text(a)), Parsed::Text(b)) => a.push_str(&b),
            (_, x) => out.push(x),
        }
    }
    out
}

fn call(name: &str, args: serde_json::Value) -> Parsed {
    Parsed::Call(ParsedCall {
        name: name.into(),
        arguments: args.as_object().unwrap().clone(),
    })
}

const XML_CALL: &str = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";

#[test]
fn xml_call_with_text_before() {
    let tools = weather_tools();
    let text = format!("Let me check.\n\n{XML_CALL}");
    assert_eq!(
        parse_pieces(&tools, &[&text]),
        vec![
            Parsed::Text("Let me check.".into()),
            call("get_weather", json!({"city": "Paris", "days": 3}))
        ]
    );
}

#[test]
fn arguments_are_typed_by_the_schema() {
    let tools = weather_tools();
    let block = "<function=get_weather>\n<parameter=city>\n42\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n<parameter=coords>\n{\"lat\": 1.5}\n</parameter>\n<parameter=tags>\n[\"a\", 2]\n</parameter>\n<parameter=note>\nnull\n</parameter>\n<parameter=extra>\nfree text\n</parameter>\n<parameter=extra2>\n7\n</parameter>\n</function>";
    let c = parse_block(block, &tools).unwrap();
    assert_eq!(
        serde_json::Value::Object(c.arguments),
        json!({"city": "42", "metric": true, "coords": {"lat": 1.5}, "tags": ["a", 2],
               "note": null, "extra": "free text", "extra2": 7})
    );
    // A value that is not what its schema asks for stays a string.
    assert_eq!(
        typed_value(Some(&json!({"type": "integer"})), "three"),
        json!("three")
    );
    // Multi-line strings keep their inner newlines.
    assert_eq!(
        typed_value(Some(&json!({"type": "string"})), "a\n\nb"),
        json!("a\n\nb")
    );
}

#[test]
fn json_form_and_parallel_calls() {
    let tools = weather_tools();
    let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Rome\\\"}\"}\n</tool_call>";
    assert_eq!(
        parse_pieces(&tools, &[text]),
        vec![
            call("get_weather", json!({"city": "Oslo"})),
            call("get_weather", json!({"city": "Rome"}))
        ]
    );
}

#[test]
fn duplicated_closing_tags_are_dropped() {
    let tools = weather_tools();
    let text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</parameter>\n</function>\n</function>\n</tool_call>\n</tool_call>";
    assert_eq!(
        parse_pieces(&tools, &[text]),
        vec![call("get_weather", json!({"city": "Paris"}))]
    );
}

#[test]
fn malformed_and_truncated_calls_are_text() {
    let tools = weather_tools();
    for bad in [
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
        "<tool_call>\n<function=get_weather\n</tool_call>",
        "<tool_call>\nnot a call\n</tool_call>",
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": [1]}\n</tool_call>",
        "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\ntrailing junk\n</function>\n</tool_call>",
    ] {
        let text = format!("Sure. {bad}");
        assert_eq!(parse_pieces(&tools, &[&text]), vec![Parsed::Text(text.clone())]);
    }
    // A complete function whose `</tool_call>` never came still counts.
    let text =
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n";
    assert_eq!(
        parse_pieces(&tools, &[text]),
        vec![call("get_weather", json!({"city": "Paris"}))]
    );
    // A missing `</parameter>` ends at the next parameter.
    let c = parse_block(
        "<function=get_weather>\n<parameter=city>\nParis\n<parameter=days>\n2\n</parameter>\n</function>",
        &tools,
    )
    .unwrap();
    assert_eq!(
        serde_json::Value::Object(c.arguments),
        json!({"city": "Paris", "days": 2})
    );
}

#[test]
fn text_without_calls_is_unchanged() {
    let tools = weather_tools();
    let text = "if a < b:\n    print('<tool')  \n";
    assert_eq!(
        parse_pieces(&tools, &[text]),
        vec![Parsed::Text(text.into())]
    );
}

fn stream_all(cfg: &ToolConfig, pieces: &[Split]) -> (Split, Vec<(String, String)>) {
    let mut s = CallStream::new(cfg, "call_");
    let mut out = Vec::new();
    for p in pieces {
        out.extend(s.push(p.clone()));
    }
    out.extend(s.finish());
    let (text, calls) = gather(out);
    for (i, c) in calls.iter().enumerate() {
        assert_eq!(c.index, i);
        assert!(c.id.starts_with("call_") && c.id.len() == 29, "{}", c.id);
    }
    let calls = calls
        .iter()
        .map(|c| (c.name.clone(), c.arguments_json()))
        .collect();
    (text, calls)
}

#[test]
fn call_inside_reasoning_is_a_call_and_parallel_false_keeps_one() {
    let cfg = ToolConfig {
        set: weather_tools(),
        choice: ToolChoice::Auto,
        parallel: true,
    };
    let split = Split {
        reasoning: format!("I need the weather.\n{XML_CALL}"),
        content: XML_CALL.into(),
    };
    let (text, calls) = stream_all(&cfg, std::slice::from_ref(&split));
    assert_eq!(text.reasoning, "I need the weather.");
    assert_eq!(text.content, "");
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].1, r#"{"city":"Paris","days":3}"#);
    let one = ToolConfig {
        parallel: false,
        ..cfg
    };
    assert_eq!(stream_all(&one, &[split]).1.len(), 1);
}

#[test]
fn tool_choice_parsing() {
    let tools = json!([{"type": "function", "function": {"name": "f"}}]);
    let t = tools.as_array().map(Vec::as_slice);
    let named = json!({"type": "function", "function": {"name": "f"}});
    let cfg = ToolConfig::from_openai(t, Some(&named), Some(false))
        .unwrap()
        .unwrap();
    assert_eq!(cfg.choice, ToolChoice::Named("f".into()));
    assert!(cfg.forces_call() && !cfg.parallel);
    let missing = json!({"type": "function", "function": {"name": "g"}});
    let e = ToolConfig::from_openai(t, Some(&missing), None).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("tool_choice"));
    let e = ToolConfig::from_openai(None, Some(&json!("required")), None).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("tool_choice"));
    assert!(ToolConfig::from_openai(None, Some(&json!("none")), None)
        .unwrap()
        .is_none());
    let e = ToolConfig::from_openai(t, Some(&json!("sometimes")), None).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("tool_choice"));
    let custom = json!([{"type": "custom", "custom": {"name": "x"}}]);
    let e = ToolConfig::from_openai(custom.as_array().map(Vec::as_slice), None, None).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("tools[0].type"));
    let noname = json!([{"type": "function", "function": {}}]);
    let e = ToolConfig::from_openai(noname.as_array().map(Vec::as_slice), None, None).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("tools[0].function.name"));
}

#[test]
fn openai_deltas_shape() {
    let c = ToolCall {
        index: 1,
        id: "call_x".into(),
        name: "f".into(),
        arguments: json!({"a": 1}).as_object().unwrap().clone(),
    };
    let [head, args] = ToolCallOut::deltas(&c);
    assert_eq!(
        serde_json::to_value(head).unwrap(),
        json!({"index": 1, "id": "call_x", "type": "function", "function": {"name": "f", "arguments": ""}})
    );
    assert_eq!(
        serde_json::to_value(args).unwrap(),
        json!({"index": 1, "function": {"arguments": "{\"a\":1}"}})
    );
    assert_eq!(
        serde_json::to_value(ToolCallOut::whole(&c)).unwrap(),
        json!({"id": "call_x", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}})
    );
}

#[test]
fn forced_call_grammars_compile_shape() {
    let cfg = ToolConfig {
        set: weather_tools(),
        choice: ToolChoice::Required,
        parallel: true,
    };
    let g = call_grammar(&cfg, CallForm::Xml, true);
    assert!(g.starts_with("start: thinking NL? calls"), "{g}");
    assert!(g.contains("\"<parameter=city>\\n\" s_0_0"), "{g}");
    assert!(g.contains("p_0_1?"), "{g}");
    let g = call_grammar(&cfg, CallForm::Json, false);
    assert!(g.contains("%json"), "{g}");
    assert_eq!(
        CallForm::of_prompt("<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>"),
        CallForm::Json
    );
    assert_eq!(
        CallForm::of_prompt("<function=example_function_name>"),
        CallForm::Xml
    );
}

/// Cuts `text` into pieces of the given lengths in characters (cycling through them), the
/// way a token stream cuts text.
fn cut<'a>(text: &'a str, lens: &[usize]) -> Vec<&'a str> {
    let mut pieces = Vec::new();
    let mut rest = text;
    for n in lens
        .iter()
        .cycle()
        .take(if lens.is_empty() { 0 } else { usize::MAX })
    {
        if rest.is_empty() {
            break;
        }
        let at = rest
            .char_indices()
            .nth((*n).max(1))
            .map_or(rest.len(), |(i, _)| i);
        pieces.push(&rest[..at]);
        rest = &rest[at..];
    }
    pieces.push(rest);
    pieces
}

proptest! {
    /// However a call's text is cut into stream pieces, the same calls and text come out.
    #[test]
    fn any_split_gives_the_same_calls(
        before in "[a-z .\n]{0,12}",
        after in "[a-z .\n<]{0,12}",
        dup in any::<bool>(),
        cuts in proptest::collection::vec(0usize..12, 0..24),
    ) {
        let tools = weather_tools();
        let tail = if dup { "\n</tool_call>" } else { "" };
        let text = format!("{before}{XML_CALL}\n{XML_CALL}{tail}{after}");
        let whole = parse_pieces(&tools, &[&text]);
        prop_assert_eq!(
            whole.iter().filter(|p| matches!(p, Parsed::Call(_))).count(),
            2
        );
        prop_assert_eq!(parse_pieces(&tools, &cut(&text, &cuts)), whole);
    }

    /// Malformed text never panics, and cutting it does not change the result.
    #[test]
    fn malformed_text_never_panics(
        text in "(<tool_call>|</tool_call>|<function=f>|</function>|<parameter=a>|</parameter>|\\{\"name\": \"f\"\\}|<|>|=|\n| |a|é){0,30}",
        cuts in proptest::collection::vec(0usize..12, 0..16),
    ) {
        let tools = weather_tools();
        let whole = parse_pieces(&tools, &[&text]);
        prop_assert_eq!(parse_pieces(&tools, &cut(&text, &cuts)), whole);
    }
}
