//! `pn serve` chat features: thinking split into `reasoning_content` with a Qwen3.5 template
//! (and `chat_template_kwargs` reaching the template), and a continuing conversation reusing
//! the slot that holds it.

mod server_support;
use server_support::Server;

#[test]
fn thinking_goes_to_reasoning_content() {
    let template = pn_tests::data("chat-template", "qwen3.5_chat_template.jinja");
    let template = template.to_str().expect("UTF-8 path");
    let s = Server::start(&["--parallel", "1", "--chat-template-file", template]);
    // The Qwen3.5 template opens `<think>` in the generation prompt: the demo model never
    // closes it, so everything it writes is reasoning.
    let body = r#"{"messages":[{"role":"user","content":"def add(a, b):"}],"max_tokens":12,"temperature":0,"ignore_eos":true}"#;
    let v = s.post("/v1/chat/completions", body).json();
    let m = &v["choices"][0]["message"];
    let reasoning = m["reasoning_content"]
        .as_str()
        .expect("reasoning_content")
        .to_string();
    assert!(!reasoning.is_empty(), "{v}");
    assert_eq!(m["content"], "", "{v}");
    // Streamed: reasoning deltas concatenate to the same text, content stays empty.
    let r = s.post(
        "/v1/chat/completions",
        &body.replace("}]", "}],\"stream\":true"),
    );
    let data = r.sse_data();
    let mut streamed = String::new();
    for d in &data[..data.len() - 1] {
        let c: serde_json::Value = serde_json::from_str(d).unwrap();
        let delta = &c["choices"][0]["delta"];
        streamed.push_str(delta["reasoning_content"].as_str().unwrap_or(""));
        assert!(delta["content"].as_str().unwrap_or("").is_empty(), "{d}");
    }
    assert_eq!(streamed, reasoning);

    // enable_thinking=false through chat_template_kwargs: the template closes the block
    // itself, and the reply is content.
    let off = body.replace(
        "}]",
        "}],\"chat_template_kwargs\":{\"enable_thinking\":false}",
    );
    let v = s.post("/v1/chat/completions", &off).json();
    let m = &v["choices"][0]["message"];
    assert!(m.get("reasoning_content").is_none(), "{v}");
    assert!(!m["content"].as_str().unwrap().is_empty(), "{v}");
    // The prompt differs by the closed think block.
    assert!(
        v["usage"]["prompt_tokens"].as_u64().unwrap()
            > s.post("/v1/chat/completions", body).json()["usage"]["prompt_tokens"]
                .as_u64()
                .unwrap()
    );
}

#[test]
fn a_continuing_conversation_reuses_its_slot() {
    let s = Server::start(&["--parallel", "2"]);
    let turn1 = r#"[{"role":"user","content":"def add(a, b):"}]"#;
    let v = s
        .post(
            "/v1/chat/completions",
            &format!(r#"{{"messages":{turn1},"max_tokens":8,"temperature":0}}"#),
        )
        .json();
    let p1 = v["usage"]["prompt_tokens"].as_u64().unwrap();
    let reply = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    // Unrelated requests in between take the other slot.
    for _ in 0..2 {
        let r = s.post(
            "/v1/completions",
            r#"{"prompt":"import sys","max_tokens":4}"#,
        );
        assert_eq!(r.status, 200);
    }
    let turn2 = serde_json::json!({
        "messages": [
            {"role": "user", "content": "def add(a, b):"},
            {"role": "assistant", "content": reply},
            {"role": "user", "content": "def sub(a, b):"},
        ],
        "max_tokens": 4,
        "temperature": 0,
    });
    let v = s.post("/v1/chat/completions", &turn2.to_string()).json();
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        cached >= p1,
        "turn 2 reused {cached} tokens, turn 1's prompt has {p1}: {v}"
    );
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > p1);
}
