//! `pn serve` over raw HTTP: the endpoints, streaming, usage, stop strings, and hostile input
//! (malformed JSON, wrong types, unknown fields, invalid UTF-8, huge bodies, API keys).

mod server_support;
use server_support::{collect_stream, read_response, send, Server};
use std::io::Write;

#[test]
fn endpoints_streaming_and_usage() {
    let s = Server::start(&["--parallel", "1"]);
    let h = s.get("/health");
    assert_eq!(h.status, 200);
    assert_eq!(h.json()["status"], "ok");

    let m = s.get("/v1/models").json();
    assert_eq!(m["object"], "list");
    let id = m["data"][0]["id"].as_str().unwrap().to_string();
    // The built-in demo (no -m) is named after its folder: `demo-code-model-pn3`.
    assert_eq!(id, "demo-code-model-pn3", "{m}");

    // Chat, non-streamed.
    let body = r#"{"model":"x","messages":[{"role":"system","content":"You write Python."},{"role":"user","content":"def add(a, b):"}],"max_tokens":8,"seed":7,"temperature":0.7}"#;
    let r = s.post("/v1/chat/completions", body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], id.as_str());
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    let whole = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let usage = &v["usage"];
    assert_eq!(usage["completion_tokens"], 8);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let prompt_tokens = usage["prompt_tokens"].as_u64().unwrap();
    assert!(prompt_tokens > 10, "{usage}");
    assert_eq!(usage["total_tokens"].as_u64().unwrap(), prompt_tokens + 8);

    // The same request streamed: chunks concatenate to the same text, same counts; the
    // prompt now comes from the slot's cache.
    let streamed = body.replace(
        "\"max_tokens\":8",
        "\"max_tokens\":8,\"stream\":true,\"stream_options\":{\"include_usage\":true}",
    );
    let r = s.post("/v1/chat/completions", &streamed);
    assert_eq!(r.status, 200);
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    let data = r.sse_data();
    let first: serde_json::Value = serde_json::from_str(&data[0]).unwrap();
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    let (text, finish, usage2) = collect_stream(&data);
    assert_eq!(finish, "length");
    assert_eq!(usage2["completion_tokens"], 8);
    assert_eq!(usage2["prompt_tokens"].as_u64(), Some(prompt_tokens));
    assert_eq!(
        usage2["prompt_tokens_details"]["cached_tokens"].as_u64(),
        Some(prompt_tokens)
    );
    // include_usage: the last chunk before [DONE] has empty choices.
    let last: serde_json::Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(last["choices"].as_array().unwrap().len(), 0);
    // The cached rerun must reproduce the text exactly when both come from the same state.
    let again = s.post("/v1/chat/completions", body).json();
    assert_eq!(
        again["choices"][0]["message"]["content"].as_str().unwrap(),
        text
    );
    let _ = whole;

    // Completions, streamed and not, greedy: equal.
    let c = r#"{"prompt":"def fibonacci(n):","max_tokens":10,"temperature":0}"#;
    let v = s.post("/v1/completions", c).json();
    assert_eq!(v["object"], "text_completion");
    let t = v["choices"][0]["text"].as_str().unwrap().to_string();
    let r = s.post("/v1/completions", &c.replace("}", ",\"stream\":true}"));
    let (t2, _, u) = collect_stream(&r.sse_data());
    assert_eq!(t, t2);
    assert_eq!(u["completion_tokens"], 10);

    // Default max_tokens of /v1/completions is 16 (OpenAI's).
    let v = s
        .post(
            "/v1/completions",
            r#"{"prompt":"import os","ignore_eos":true,"temperature":0}"#,
        )
        .json();
    assert_eq!(v["usage"]["completion_tokens"], 16, "{v}");

    // Stop strings cut the output right before the match.
    let full = s
        .post(
            "/v1/completions",
            r#"{"prompt":"def fibonacci(n):","max_tokens":24,"temperature":0,"ignore_eos":true}"#,
        )
        .json()["choices"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    let stop: String = full.chars().skip(3).take(3).collect();
    let stop_json = serde_json::to_string(&stop).unwrap();
    let v = s
        .post(
            "/v1/completions",
            &format!(r#"{{"prompt":"def fibonacci(n):","max_tokens":24,"temperature":0,"ignore_eos":true,"stop":[{stop_json}]}}"#),
        )
        .json();
    let cut = v["choices"][0]["text"].as_str().unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        cut,
        &full[..full.find(&stop).unwrap()],
        "stop {stop:?} in {full:?}"
    );

    // Token-id prompts.
    let v = s
        .post(
            "/v1/completions",
            r#"{"prompt":[1,2,3],"max_tokens":2,"temperature":0}"#,
        )
        .json();
    assert_eq!(v["usage"]["prompt_tokens"], 3);

    // Metrics count the work and the requests.
    let metrics = s.get("/metrics").text();
    assert!(
        metrics.contains("pn_http_requests_total{path=\"/v1/chat/completions\",status=\"200\"} 3"),
        "{metrics}"
    );
    assert!(s.metric("pn_tokens_generated_total") >= 8.0 * 3.0 + 10.0 * 2.0 + 16.0);
    assert_eq!(s.metric("pn_queue_depth"), 0.0);
    assert!(s.metric("pn_prompt_tokens_cached_total") >= prompt_tokens as f64);
    // The batch speculates (`--spec mtp` is the default): the greedy requests above drafted
    // with the MTP head, and the stop-string cut above landed right whatever the run.
    let (drafted, accepted) = (
        s.metric("pn_spec_drafted_total"),
        s.metric("pn_spec_accepted_total"),
    );
    assert!(drafted > 0.0 && accepted <= drafted, "{metrics}");
    assert!(s.metric("pn_spec_verify_passes_total") > 0.0);
}

#[test]
fn hostile_input_gets_openai_errors() {
    let s = Server::start(&["--parallel", "1", "--max-body-bytes", "65536"]);
    let chat = "/v1/chat/completions";
    // Malformed JSON, not an object, wrong types, unknown fields, missing fields.
    s.post(chat, "{\"messages\": [").assert_error(400);
    s.post(chat, "[1,2]").assert_error(400);
    s.post(chat, "").assert_error(400);
    let e = s
        .post(
            chat,
            r#"{"messages":[{"role":"user","content":"x"}],"temperature":"hot"}"#,
        )
        .assert_error(400);
    assert_eq!(e["param"], "temperature");
    let e = s.post(chat, r#"{"messages":"hello"}"#).assert_error(400);
    assert_eq!(e["param"], "messages");
    let e = s
        .post(
            chat,
            r#"{"messages":[{"role":"user","content":"x"}],"frobnicate":true}"#,
        )
        .assert_error(400);
    assert_eq!(
        e["message"],
        "Unrecognized request argument supplied: frobnicate"
    );
    let e = s.post(chat, r#"{"model":"m"}"#).assert_error(400);
    assert_eq!(e["param"], "messages");
    s.post(chat, r#"{"messages":[]}"#).assert_error(400);
    s.post(
        chat,
        r#"{"messages":[{"role":"user","content":"x"}],"n":3}"#,
    )
    .assert_error(400);
    s.post(
        chat,
        r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":-1}"#,
    )
    .assert_error(400);
    s.post(
        chat,
        r#"{"messages":[{"role":"user","content":"x"}],"top_p":7}"#,
    )
    .assert_error(400);
    s.post(chat, r#"{"messages":[{"role":"wizard","content":"x"}]}"#)
        .assert_error(400);
    s.post("/v1/completions", r#"{"prompt":[999999999]}"#)
        .assert_error(400);
    // Deeply nested JSON is refused by the parser's depth limit, not a stack overflow.
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    s.post(chat, &deep[..60_000]).assert_error(400);
    // Invalid UTF-8 inside a string.
    let r = s.request(
        "POST",
        chat,
        &[("Content-Type", "application/json")],
        b"{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}",
    );
    r.assert_error(400);
    // A body over the limit: 413, announced by Content-Length or streamed in.
    let big = format!(r#"{{"prompt":"{}"}}"#, "a".repeat(200_000));
    let e = s.post("/v1/completions", &big).assert_error(413);
    assert_eq!(e["code"], "request_too_large");
    // A prompt longer than the context: 400 with the numbers.
    let long = format!(r#"{{"prompt":"{}","max_tokens":1}}"#, " x".repeat(5000));
    let e = s.post("/v1/completions", &long).assert_error(400);
    assert_eq!(e["code"], "context_length_exceeded");
    let msg = e["message"].as_str().unwrap();
    assert!(msg.contains("4096") && msg.contains("5000"), "{msg}");
    // Unknown route and wrong method.
    s.get("/v2/nothing").assert_error(404);
    s.get("/v1/chat/completions").assert_error(405);
    // Garbage that is not HTTP at all does not hurt the server.
    {
        let mut c = s.connect();
        let _ = c.write_all(b"\x00\x01\x02 NOT HTTP\r\n\r\n");
        let _ = read_response_lossy(&mut c);
    }
    // After all of it the server still answers.
    let r = s.post("/v1/completions", r#"{"prompt":"def f():","max_tokens":2}"#);
    assert_eq!(r.status, 200);
    assert!(
        s.metric("pn_http_requests_total{path=\"/v1/chat/completions\",status=\"400\"}") >= 10.0
    );
}

fn read_response_lossy(c: &mut std::net::TcpStream) -> Vec<u8> {
    use std::io::Read;
    let mut v = Vec::new();
    let _ = c.read_to_end(&mut v);
    v
}

#[test]
fn api_key_is_enforced() {
    let s = Server::start(&["--parallel", "1", "--api-key", "sekrit-123"]);
    let body = br#"{"prompt":"def f():","max_tokens":2}"#;
    let json = ("Content-Type", "application/json");
    let e = s
        .request("POST", "/v1/completions", &[json], body)
        .assert_error(401);
    assert_eq!(e["code"], "invalid_api_key");
    s.request(
        "POST",
        "/v1/completions",
        &[json, ("Authorization", "Bearer sekrit-124")],
        body,
    )
    .assert_error(401);
    s.request(
        "POST",
        "/v1/completions",
        &[json, ("Authorization", "Bearer sekrit-1234")],
        body,
    )
    .assert_error(401);
    s.request(
        "POST",
        "/v1/completions",
        &[json, ("Authorization", "sekrit-123")],
        body,
    )
    .assert_error(401);
    s.request("GET", "/v1/models", &[], b"").assert_error(401);
    s.request("GET", "/metrics", &[], b"").assert_error(401);
    // /health stays open for load balancers.
    assert_eq!(s.get("/health").status, 200);
    let r = s.request(
        "POST",
        "/v1/completions",
        &[json, ("Authorization", "Bearer sekrit-123")],
        body,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = s.request(
        "GET",
        "/v1/models",
        &[("Authorization", "Bearer sekrit-123")],
        b"",
    );
    assert_eq!(r.status, 200);
}

#[test]
fn raw_pipelined_requests_on_one_connection() {
    // Keep-alive: two requests on one connection both get answers.
    let s = Server::start(&["--parallel", "1"]);
    let mut c = s.connect();
    let body = br#"{"prompt":"x = 1","max_tokens":2}"#;
    let req = |close: bool| {
        format!(
            "POST /v1/completions HTTP/1.1\r\nHost: l\r\nContent-Length: {}\r\n{}\r\n",
            body.len(),
            if close { "Connection: close\r\n" } else { "" }
        )
    };
    c.write_all(req(false).as_bytes()).unwrap();
    c.write_all(body).unwrap();
    c.write_all(req(true).as_bytes()).unwrap();
    c.write_all(body).unwrap();
    let raw = read_response_lossy(&mut c);
    let text = String::from_utf8_lossy(&raw);
    assert_eq!(text.matches("HTTP/1.1 200").count(), 2, "{text}");
    let _ = (send, read_response);
}
