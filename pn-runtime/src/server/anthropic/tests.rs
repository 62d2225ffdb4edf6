//! Anthropic request mapping and block events, without a model.

use super::request::parse;
use super::response::{signature, BlockStream};
use crate::engine::FinishReason;
use crate::server::reasoning::Split;
use crate::server::tools::{Piece, ToolCall, ToolChoice};
use serde_json::{json, Value};

fn req(v: Value) -> super::request::MessagesRequest {
    parse(v.to_string().as_bytes()).unwrap()
}

#[test]
fn content_blocks_become_template_messages() {
    let r = req(json!({"model": "m", "max_tokens": 5,
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": [
            {"role": "user", "content": "Time?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Use the tool.", "signature": "s"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_time", "input": {"zone": "CET"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "12:00"}]},
                {"type": "text", "text": "Thanks"}]}]}));
    let m = r.template_messages().unwrap();
    assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
    assert_eq!(m[2]["reasoning_content"], "Use the tool.");
    assert_eq!(m[2]["content"], "Checking.");
    assert_eq!(
        m[2]["tool_calls"][0]["function"],
        json!({"name": "get_time", "arguments": {"zone": "CET"}})
    );
    assert_eq!(
        m[3],
        json!({"role": "tool", "tool_call_id": "toolu_1", "content": "12:00"})
    );
    assert_eq!(m[4], json!({"role": "user", "content": "Thanks"}));
}

#[test]
fn fields_tools_and_errors() {
    let e = parse(br#"{"messages": [], "frobnicate": 1}"#).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("frobnicate"));
    let e = parse(br#"{"messages": [], "container": "c"}"#).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("container"));
    let e = parse(br#"{"messages": [], "output_config": {"format": {}}}"#).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("output_config.format"));
    assert!(parse(br#"{"messages": [], "output_config": {"effort": "low"}}"#).is_ok());
    let r = req(json!({"messages": [{"role": "user", "content": "x"}]}));
    assert_eq!(
        r.settings(&Default::default(), false)
            .unwrap_err()
            .param
            .as_deref(),
        Some("max_tokens")
    );
    let r =
        req(json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}));
    let e = r.template_messages().unwrap_err();
    assert_eq!(e.param.as_deref(), Some("messages[0].content[0].type"));
    assert!(e.message.contains("'image'"), "{e}");
    let r = req(
        json!({"max_tokens": 9, "stop_sequences": ["\n\n"], "metadata": {"user_id": "u"},
        "thinking": {"type": "enabled", "budget_tokens": 2000},
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
        "messages": [{"role": "user", "content": "x"}]}),
    );
    let s = r.settings(&Default::default(), false).unwrap();
    assert_eq!(
        (s.max_tokens, s.stop.clone()),
        (Some(9), vec!["\n\n".to_string()])
    );
    assert_eq!(r.kwargs().unwrap()["enable_thinking"], true);
    let (template, cfg) = r.tools().unwrap();
    let cfg = cfg.unwrap();
    assert_eq!(
        (cfg.choice.clone(), cfg.parallel),
        (ToolChoice::Required, false)
    );
    assert_eq!(
        template.unwrap()[0]["function"]["parameters"],
        json!({"type": "object"})
    );
    let r = req(
        json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}],
        "messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(
        r.tools().unwrap_err().param.as_deref(),
        Some("tools[0].type")
    );
    let r = req(
        json!({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "pre"}]}),
    );
    assert!(r.template_messages().is_err());
    let body = super::error_body(&crate::server::error::ApiError::unauthorized());
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "authentication_error");
}

#[test]
fn pieces_become_blocks_and_events() {
    let mut b = BlockStream::default();
    let text = |reasoning: &str, content: &str| {
        Piece::Text(Split {
            reasoning: reasoning.into(),
            content: content.into(),
        })
    };
    let mut events = b.push(vec![text("hm", ""), text(" ok", "Hi")]);
    let call = ToolCall {
        index: 0,
        id: "toolu_1".into(),
        name: "f".into(),
        arguments: json!({"a": 1}).as_object().unwrap().clone(),
    };
    events.extend(b.push(vec![Piece::Call(call)]));
    events.extend(b.finish());
    let names: Vec<&str> = events.iter().map(|e| e.0).collect();
    assert_eq!(
        names,
        [
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop"
        ]
    );
    assert_eq!(events[3].1["delta"]["type"], "signature_delta");
    assert_eq!(
        events[9].1["delta"],
        json!({"type": "input_json_delta", "partial_json": "{\"a\":1}"})
    );
    assert_eq!(
        b.blocks,
        vec![
            json!({"type": "thinking", "thinking": "hm ok", "signature": signature("hm ok")}),
            json!({"type": "text", "text": "Hi"}),
            json!({"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}}),
        ]
    );
    assert_eq!(b.stop(&FinishReason::EndOfGeneration).0, "tool_use");
    let plain = BlockStream::default();
    assert_eq!(
        plain.stop(&FinishReason::StopString("##".into())),
        ("stop_sequence", json!("##"))
    );
    assert_eq!(plain.stop(&FinishReason::MaxTokens).0, "max_tokens");
}
