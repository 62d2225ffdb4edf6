//! `pn serve` and structured output, llama-server's clamping of `max_tokens`, and the request
//! extras llama-server and vLLM clients send.

mod server_support;
use serde_json::{json, Value};
use server_support::Server;

fn content(v: &Value) -> String {
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("no content in {v}"))
        .to_string()
}

#[test]
fn response_format_grammar_and_json_schema_fields() {
    let s = Server::start(&["--parallel", "1"]);
    let chat = "/v1/chat/completions";
    let user = json!([{"role": "user", "content": "Give me a point."}]);
    let schema = json!({"type": "object",
        "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9},
                       "label": {"enum": ["a", "b"]}},
        "required": ["x", "label"], "additionalProperties": false});
    let check = |text: &str| {
        let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(v["x"].as_u64().is_some_and(|x| x <= 9), "{v}");
        assert!(v["label"] == "a" || v["label"] == "b", "{v}");
        assert_eq!(v.as_object().unwrap().len(), 2, "{v}");
    };
    // OpenAI's json_schema, strict.
    let body = json!({"messages": user, "max_tokens": 48, "temperature": 0,
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "point", "schema": schema, "strict": true}}});
    let r = s.post(chat, &body.to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    check(&content(&v));
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    // llama-server's json_schema field, on the completions endpoint, streamed.
    let body = json!({"prompt": "p = ", "max_tokens": 48, "temperature": 0, "stream": true,
                      "json_schema": schema});
    let r = s.post("/v1/completions", &body.to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    let text: String = r
        .sse_data()
        .iter()
        .filter(|d| d.as_str() != "[DONE]")
        .map(|d| {
            let v: Value = serde_json::from_str(d).unwrap();
            v["choices"][0]["text"].as_str().unwrap_or("").to_string()
        })
        .collect();
    check(&text);
    // json_object: an object.
    let body = json!({"messages": user, "max_tokens": 24, "temperature": 0,
                      "response_format": {"type": "json_object"}});
    let r = s.post(chat, &body.to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(content(&r.json()).starts_with('{'));
    // A GBNF grammar.
    let body = json!({"prompt": "ok = ", "max_tokens": 8, "temperature": 0,
                      "grammar": "root ::= (\"yes\" | \"no\") \"!\""});
    let r = s.post("/v1/completions", &body.to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    let t = r.json()["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(t == "yes!" || t == "no!", "{t:?}");
    // Bad grammars and formats are 400s naming the field.
    let bad = [
        (json!({"grammar": "root ::= \"x"}), "grammar"),
        (
            json!({"json_schema": {"type": "integer", "minimum": 3, "maximum": 1}}),
            "json_schema",
        ),
        (
            json!({"response_format": {"type": "yaml"}}),
            "response_format",
        ),
        (
            json!({"grammar": "root ::= \"x\"", "json_schema": {}}),
            "json_schema",
        ),
    ];
    for (extra, param) in bad {
        let mut body = json!({"messages": user, "max_tokens": 4});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let e = s.post(chat, &body.to_string()).assert_error(400);
        assert_eq!(e["param"], param, "{e}");
    }
}

#[test]
fn max_tokens_clamps_to_the_room_and_extras_are_accepted() {
    let s = Server::start(&["--parallel", "1", "-c", "40"]);
    // 4096 tokens asked, 40 in the context: clamped, finishes with `length`.
    let body = json!({"prompt": "def f(x):", "max_tokens": 4096, "temperature": 0,
                      "ignore_eos": true});
    let r = s.post("/v1/completions", &body.to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let u = &v["usage"];
    assert_eq!(u["total_tokens"], 40, "{u}");
    // llama-server and vLLM extras: honoured or ignored by name, never refused.
    let body = json!({"prompt": "def f(x):", "temperature": 0, "ignore_eos": true,
        "n_predict": 5, "cache_prompt": true, "repeat_penalty": 1.1, "repetition_penalty": 1.1,
        "top_k": 40, "min_p": 0.05, "id_slot": -1, "typical_p": 1.0, "mirostat": 0,
        "n_keep": 0, "samplers": ["top_k"], "min_tokens": 0, "skip_special_tokens": true,
        "stop_token_ids": [], "seed": -1});
    let r = s.post("/v1/completions", &body.to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["usage"]["completion_tokens"],
        5,
        "n_predict is max_tokens"
    );
    // vLLM's guided_choice.
    let body = json!({"messages": [{"role": "user", "content": "pick"}], "temperature": 0,
                      "max_tokens": 8, "guided_choice": ["alpha", "beta"]});
    let r = s.post("/v1/chat/completions", &body.to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    let c = content(&r.json());
    assert!(c == "alpha" || c == "beta", "{c:?}");
}
