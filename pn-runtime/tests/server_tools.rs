//! Tool calls: the parser against what the real Qwen chat templates render, and `pn serve`
//! end to end on the demo model: forced calls (constrained decoding) on both APIs, scripted
//! model output (a grammar that forces a fixed text through the real model and tokenizer),
//! streaming, and the Anthropic Messages endpoint.

mod server_support;
use pn_runtime::chat_template::{ChatTemplate, TemplateContext};
use pn_runtime::server::tools::parser::{Parsed, ToolCallParser};
use pn_runtime::server::tools::ToolConfig;
use serde_json::{json, Value};
use server_support::Server;

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data/chat-template");
const QWEN35: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/data/chat-template/qwen3.5_chat_template.jinja"
);

fn parse_all(cfg: &ToolConfig, text: &str) -> Vec<Parsed> {
    let mut p = ToolCallParser::new(cfg.set.clone());
    let mut out = p.push(text);
    out.extend(p.finish());
    out
}

/// Every reference conversation with tool calls: the calls the template renders for an
/// assistant turn parse back into the same names and arguments.
#[test]
fn rendered_calls_parse_back_to_the_messages_calls() {
    let cases = std::fs::read_to_string(format!("{DATA}/cases.jsonl")).unwrap();
    let mut checked = 0;
    for line in cases.lines() {
        let case: Value = serde_json::from_str(line).unwrap();
        let Some(rendered) = case["rendered"].as_str() else {
            continue;
        };
        let tools = case["tools"].as_array().map(Vec::as_slice);
        let Some(cfg) = ToolConfig::from_openai(tools, None, None).unwrap() else {
            continue;
        };
        // The assistant turns, in order, and the calls each of them made.
        let turns: Vec<&str> = rendered
            .split("<|im_start|>assistant\n")
            .skip(1)
            .map(|t| t.split("<|im_end|>").next().unwrap())
            .collect();
        let assistants: Vec<&Value> = case["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "assistant")
            .collect();
        for (turn, m) in turns.iter().zip(&assistants) {
            let answer = turn.rsplit("</think>\n\n").next().unwrap();
            let calls: Vec<(String, Value)> = parse_all(&cfg, answer)
                .into_iter()
                .filter_map(|p| match p {
                    Parsed::Call(c) => Some((c.name, Value::Object(c.arguments))),
                    Parsed::Text(_) => None,
                })
                .collect();
            let want: Vec<(String, Value)> = m["tool_calls"]
                .as_array()
                .map(|v| v.as_slice())
                .unwrap_or_default()
                .iter()
                .map(|c| {
                    let f = c.get("function").unwrap_or(c);
                    (
                        f["name"].as_str().unwrap().to_string(),
                        f["arguments"].clone(),
                    )
                })
                .collect();
            assert_eq!(calls, want, "{}: {turn:?}", case["id"]);
            checked += want.len();
        }
    }
    assert!(checked >= 7, "only {checked} calls checked");
}

/// An assistant turn with OpenAI-shaped calls (arguments as a JSON string) renders through
/// the template into text the parser reads back as the same call.
#[test]
fn openai_tool_calls_round_trip_through_the_template() {
    let source = std::fs::read_to_string(QWEN35).unwrap();
    let t = ChatTemplate::new(&source).unwrap();
    let tools = json!([{"type": "function", "function": {"name": "set_alarm", "parameters": {
        "type": "object", "properties": {"hour": {"type": "integer"}, "label": {"type": "string"},
        "loud": {"type": "boolean"}, "days": {"type": "array"}}}}}]);
    let args = json!({"hour": 7, "label": "wake\nup", "loud": true, "days": ["mon", "tue"]});
    let messages = json!([
        {"role": "user", "content": "Set an alarm."},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "set_alarm", "arguments": args.to_string()}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
    ]);
    let mut ctx = TemplateContext::new();
    ctx.set("messages", &messages);
    ctx.set("tools", &tools);
    let text = t.render(&ctx).unwrap();
    let turn = text
        .split("<|im_start|>assistant\n")
        .nth(1)
        .unwrap()
        .split("<|im_end|>")
        .next()
        .unwrap();
    let answer = turn.rsplit("</think>\n\n").next().unwrap();
    let cfg = ToolConfig::from_openai(tools.as_array().map(Vec::as_slice), None, None)
        .unwrap()
        .unwrap();
    match parse_all(&cfg, answer).as_slice() {
        [Parsed::Call(c)] => {
            assert_eq!(c.name, "set_alarm");
            assert_eq!(Value::Object(c.arguments.clone()), args);
        }
        other => panic!("{answer:?} parsed as {other:?}"),
    }
    assert!(
        text.contains("<tool_response>\nok\n</tool_response>"),
        "{text}"
    );
}

fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
         "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "enum": ["Paris", "Oslo", "Rome"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
          "required": ["city", "days"]}}},
        {"type": "function", "function": {"name": "get_time", "description": "Local time.",
         "parameters": {"type": "object", "properties": {
            "zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"]}}},
    ])
}

fn chat_body(extra: Value) -> String {
    let mut body = json!({
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": weather_tools(), "max_tokens": 200, "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": false},
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body.to_string()
}

/// `tool_choice` required / named forces a call from the demo model (which cannot call tools
/// on its own): parsed into `tool_calls` with arguments valid for the schema, whole and
/// streamed alike.
#[test]
fn forced_calls_on_the_real_engine() {
    let s = Server::start(&["--parallel", "1", "--chat-template-file", QWEN35]);
    let chat = "/v1/chat/completions";
    let r = s.post(
        chat,
        &chat_body(json!({"tool_choice": "required", "parallel_tool_calls": false})),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls", "{v}");
    let calls = c["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{v}");
    assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(calls[0]["type"], "function");
    let name = calls[0]["function"]["name"].as_str().unwrap();
    let args: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    match name {
        "get_weather" => {
            assert!(
                ["Paris", "Oslo", "Rome"].contains(&args["city"].as_str().unwrap()),
                "{args}"
            );
            assert!((1..=7).contains(&args["days"].as_i64().unwrap()), "{args}");
        }
        "get_time" => assert!(["UTC", "CET"].contains(&args["zone"].as_str().unwrap())),
        other => panic!("unexpected function {other}"),
    }
    assert!(c["message"]["content"].is_null(), "{v}");

    // Named: that function; streamed deltas assemble into the whole answer's call.
    let named = json!({"tool_choice": {"type": "function", "function": {"name": "get_time"}}});
    let whole = s.post(chat, &chat_body(named.clone())).json();
    let call = &whole["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_time", "{whole}");
    let mut body: Value = serde_json::from_str(&chat_body(named)).unwrap();
    body["stream"] = true.into();
    let r = s.post(chat, &body.to_string());
    let (name, args, finish) = assemble(&r.sse_data());
    assert_eq!(name, "get_time");
    assert_eq!(args, call["function"]["arguments"].as_str().unwrap());
    assert_eq!(finish, "tool_calls");

    // A forced call cannot be combined with another grammar.
    let r = s.post(
        chat,
        &chat_body(json!({"tool_choice": "required", "grammar": "root ::= \"x\""})),
    );
    assert_eq!(r.assert_error(400)["param"], "tool_choice");
}

/// Assembles a streamed chat's first call the way the openai client does: (name, arguments,
/// finish_reason).
fn assemble(data: &[String]) -> (String, String, String) {
    let (mut name, mut args, mut finish) = (String::new(), String::new(), String::new());
    for d in data.iter().filter(|d| d.as_str() != "[DONE]") {
        let v: Value = serde_json::from_str(d).unwrap();
        let Some(c) = v["choices"].get(0) else {
            continue;
        };
        for tc in c["delta"]["tool_calls"].as_array().into_iter().flatten() {
            assert_eq!(tc["index"], 0, "{v}");
            name.push_str(tc["function"]["name"].as_str().unwrap_or(""));
            args.push_str(tc["function"]["arguments"].as_str().unwrap_or(""));
        }
        if let Some(f) = c["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (name, args, finish)
}

/// A Lark grammar that forces exactly `text`: the scripted-output seam (the real model
/// samples under a mask that allows only this text, through the real tokenizer).
fn script(text: &str) -> Value {
    json!(format!("start: {}", serde_json::to_string(text).unwrap()))
}

#[test]
fn scripted_output_is_parsed_or_left_as_text() {
    let s = Server::start(&["--parallel", "1"]);
    let chat = "/v1/chat/completions";
    let two = "I will check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}\n</tool_call>";
    let v = s
        .post(chat, &chat_body(json!({"guided_grammar": script(two)})))
        .json();
    let m = &v["choices"][0]["message"];
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
    assert_eq!(m["content"], "I will check.");
    assert_eq!(
        m["tool_calls"][0]["function"]["arguments"],
        r#"{"city":"Oslo","days":2}"#
    );
    assert_eq!(
        m["tool_calls"][1]["function"]["arguments"],
        r#"{"zone":"CET"}"#
    );
    // parallel_tool_calls false: the first call only.
    let v = s
        .post(
            chat,
            &chat_body(json!({"guided_grammar": script(two), "parallel_tool_calls": false})),
        )
        .json();
    assert_eq!(
        v["choices"][0]["message"]["tool_calls"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    // Malformed: text, finish stop.
    let bad =
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\nstray words\n</function>\n</tool_call>x";
    let v = s
        .post(chat, &chat_body(json!({"guided_grammar": script(bad)})))
        .json();
    assert_eq!(v["choices"][0]["message"]["content"], bad, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert!(v["choices"][0]["message"].get("tool_calls").is_none());
    // Truncated at max_tokens: text, finish length.
    let v = s
        .post(
            chat,
            &chat_body(json!({"guided_grammar": script(two), "max_tokens": 12})),
        )
        .json();
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    assert!(v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .starts_with("I will check."));
    // tool_choice none: nothing parsed.
    let v = s
        .post(
            chat,
            &chat_body(json!({"guided_grammar": script(two), "tool_choice": "none"})),
        )
        .json();
    assert_eq!(v["choices"][0]["message"]["content"], two);
    // Streamed: the same calls.
    let r = s.post(
        chat,
        &chat_body(json!({"guided_grammar": script(two), "stream": true})),
    );
    let data = r.sse_data();
    let mut by_index: Vec<(String, String)> = vec![Default::default(); 2];
    for d in data.iter().filter(|d| d.as_str() != "[DONE]") {
        let v: Value = serde_json::from_str(d).unwrap();
        for tc in v["choices"][0]["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let e = &mut by_index[tc["index"].as_u64().unwrap() as usize];
            e.0.push_str(tc["function"]["name"].as_str().unwrap_or(""));
            e.1.push_str(tc["function"]["arguments"].as_str().unwrap_or(""));
        }
    }
    assert_eq!(
        by_index[0],
        ("get_weather".into(), r#"{"city":"Oslo","days":2}"#.into())
    );
    assert_eq!(by_index[1], ("get_time".into(), r#"{"zone":"CET"}"#.into()));
}

#[test]
fn anthropic_messages() {
    let s = Server::start(&[
        "--parallel",
        "1",
        "--api-key",
        "k",
        "--chat-template-file",
        QWEN35,
    ]);
    let key = [
        ("Content-Type", "application/json"),
        ("x-api-key", "k"),
        ("anthropic-version", "2023-06-01"),
    ];
    let post =
        |path: &str, body: &Value| s.request("POST", path, &key, body.to_string().as_bytes());
    let base = json!({"model": "m", "max_tokens": 8, "temperature": 0,
        "system": [{"type": "text", "text": "You write Python."}],
        "messages": [{"role": "user", "content": "def f():"}]});
    let r = post("/v1/messages", &base);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert!(v["id"].as_str().unwrap().starts_with("msg_"));
    assert!(
        ["end_turn", "max_tokens"].contains(&v["stop_reason"].as_str().unwrap()),
        "{v}"
    );
    assert!(v["usage"]["input_tokens"].as_u64().unwrap() > 5);
    assert!(v["usage"]["output_tokens"].as_u64().unwrap() <= 8);
    // Forced tool use, streamed: the event sequence and the tool_use block.
    let mut body = base.clone();
    body["tools"] = json!([{"name": "get_time", "description": "Local time.",
        "input_schema": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}}]);
    body["tool_choice"] = json!({"type": "any"});
    body["max_tokens"] = 100.into();
    body["stream"] = true.into();
    let r = post("/v1/messages", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let text = r.text();
    let events: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(events.first(), Some(&"message_start"), "{text}");
    assert_eq!(
        &events[events.len() - 2..],
        ["message_delta", "message_stop"],
        "{text}"
    );
    assert!(
        events.contains(&"content_block_start") && events.contains(&"ping"),
        "{text}"
    );
    let datas: Vec<Value> = r
        .sse_data()
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let start = datas
        .iter()
        .find(|d| d["type"] == "content_block_start")
        .unwrap();
    assert_eq!(start["content_block"]["type"], "tool_use", "{text}");
    assert!(start["content_block"]["id"]
        .as_str()
        .unwrap()
        .starts_with("toolu_"));
    let json: String = datas
        .iter()
        .filter(|d| d["delta"]["type"] == "input_json_delta")
        .map(|d| d["delta"]["partial_json"].as_str().unwrap().to_string())
        .collect();
    let input: Value = serde_json::from_str(&json).unwrap();
    assert!(input["zone"] == "UTC" || input["zone"] == "CET", "{input}");
    let delta = datas.iter().find(|d| d["type"] == "message_delta").unwrap();
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");
    // count_tokens counts the same prompt.
    let r = post(
        "/v1/messages/count_tokens",
        &json!({"model": "m", "system": "You write Python.", "messages": [{"role": "user", "content": "def f():"}]}),
    );
    assert_eq!(
        r.json()["input_tokens"],
        v["usage"]["input_tokens"].as_u64().unwrap()
            + v["usage"]["cache_read_input_tokens"].as_u64().unwrap()
    );
    // Errors in Anthropic's shape: an image block, a missing max_tokens, a wrong key.
    let mut img = base.clone();
    img["messages"] = json!([{"role": "user", "content": [{"type": "image", "source": {}}]}]);
    let e = post("/v1/messages", &img);
    assert_eq!(e.status, 400);
    let ev = e.json();
    assert_eq!(ev["type"], "error");
    assert_eq!(ev["error"]["type"], "invalid_request_error");
    assert!(
        ev["error"]["message"].as_str().unwrap().contains("'image'"),
        "{ev}"
    );
    let mut nomax = base.clone();
    nomax.as_object_mut().unwrap().remove("max_tokens");
    assert!(post("/v1/messages", &nomax).json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("max_tokens"));
    let r = s.request(
        "POST",
        "/v1/messages",
        &[("x-api-key", "wrong")],
        base.to_string().as_bytes(),
    );
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["type"], "authentication_error");
}

/// The forced-call grammars (XML with free-text strings and the thinking prefix, and the JSON
/// form) compile for a real vocabulary, accept the text the parser reads as a call, and reject
/// what the parser would not read as one.
#[test]
fn forced_call_grammars_accept_what_the_parser_reads() {
    use pn_runtime::constrain::{ConstraintFactory, Grammar};
    use pn_runtime::server::tools::grammar::{call_grammar, CallForm};
    use pn_runtime::server::tools::ToolChoice;
    let engine = pn_runtime::Engine::load(pn_runtime::DEMO_MODEL_PATH, Default::default()).unwrap();
    let tok = engine.tokenizer();
    let factory = ConstraintFactory::new(tok).unwrap();
    let tools = json!([{"type": "function", "function": {"name": "write", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}, "n": {"type": "integer"},
        "opts": {"type": "object", "properties": {"x": {"type": "boolean"}}}},
        "required": ["path"]}}}]);
    let cfg = ToolConfig::from_openai(
        tools.as_array().map(Vec::as_slice),
        Some(&json!("required")),
        None,
    )
    .unwrap()
    .unwrap();
    // Whether the grammar accepts `text` whole.
    let accepts = |grammar: &str, text: &str| {
        let mut c = factory
            .compile(&Grammar::Lark(grammar.to_string()))
            .unwrap();
        for id in tok.encode(text).unwrap() {
            c.advance(id);
        }
        let ok = c.error().is_none() && c.is_accepting();
        if !ok {
            eprintln!("not accepted: {text:?}: {:?}", c.error());
        }
        ok
    };
    let call = "<tool_call>\n<function=write>\n<parameter=path>\na/b.py\nline 2 </parameter>\n<parameter=opts>\n{\"x\": true}\n</parameter>\n</function>\n</tool_call>";
    let xml = call_grammar(&cfg, CallForm::Xml, true);
    assert!(accepts(&xml, &format!("Plan.</think>\n\n{call}")), "{xml}");
    assert!(accepts(&xml, &format!("</think>{call}\n{call}")));
    // The parser reads the same text as the same call.
    let mut p = ToolCallParser::new(cfg.set.clone());
    let parsed = p.push(call);
    match parsed.as_slice() {
        [Parsed::Call(c)] => assert_eq!(
            Value::Object(c.arguments.clone()),
            json!({"path": "a/b.py\nline 2 ", "opts": {"x": true}})
        ),
        other => panic!("{other:?}"),
    }
    // Missing the required parameter, a string holding `<parameter=`, text after the call.
    let no_path = "<tool_call>\n<function=write>\n</function>\n</tool_call>";
    let bad_value = "<tool_call>\n<function=write>\n<parameter=path>\na<parameter=b\n</parameter>\n</function>\n</tool_call>";
    let plain = call_grammar(&cfg, CallForm::Xml, false);
    assert!(accepts(&plain, call));
    assert!(!accepts(&plain, no_path));
    assert!(!accepts(&plain, bad_value));
    assert!(!accepts(&plain, &format!("{call} and more")));
    // The JSON form, for a named choice.
    let named = ToolConfig {
        choice: ToolChoice::Named("write".into()),
        ..cfg.clone()
    };
    let jg = call_grammar(&named, CallForm::Json, false);
    assert!(accepts(&jg, "<tool_call>\n{\"name\": \"write\", \"arguments\": {\"path\": \"x\", \"n\": 3}}\n</tool_call>"), "{jg}");
    assert!(!accepts(
        &jg,
        "<tool_call>\n{\"name\": \"other\", \"arguments\": {\"path\": \"x\"}}\n</tool_call>"
    ));
}
