//! `pn serve` log probabilities (chat and completions, streamed and not), the thinking budget,
//! reasoning token usage, and the chat page at `/`.

mod server_support;
use serde_json::Value;
use server_support::Server;

fn chunks(r: &server_support::Response) -> Vec<Value> {
    let data = r.sse_data();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

/// The demo model in this process.
fn demo() -> pn_runtime::Engine {
    let options = pn_runtime::EngineOptions {
        threads: 2,
        ..pn_runtime::EngineOptions::default()
    };
    pn_runtime::Engine::load(pn_runtime::DEMO_MODEL_PATH, options).unwrap()
}

/// The log-softmax the server should report for the token after `prompt`: the demo model's
/// raw logits over the sampleable vocabulary.
fn reference_logprobs(engine: &pn_runtime::Engine, prompt: &[u32]) -> Vec<f64> {
    let mut session = engine.session().unwrap();
    let mut logits = session.feed(prompt).unwrap().to_vec();
    engine.token_mask().apply(&mut logits);
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = max
        + logits
            .iter()
            .filter(|l| l.is_finite())
            .map(|&l| (l as f64 - max).exp())
            .sum::<f64>()
            .ln();
    logits.iter().map(|&l| l as f64 - lse).collect()
}

#[test]
fn completions_logprobs_are_the_models_log_softmax() {
    let s = Server::start(&["--parallel", "1"]);
    let engine = demo();
    let prompt = engine.tokenizer().encode("def add(a, b):").unwrap();
    let ids = serde_json::to_string(&prompt).unwrap();
    // Sampled at a temperature: the reported numbers are still the raw distribution's.
    let body = format!(
        r#"{{"prompt":{ids},"max_tokens":6,"temperature":0.7,"seed":3,"ignore_eos":true,"logprobs":3}}"#
    );
    let v = s.post("/v1/completions", &body).json();
    let lp = &v["choices"][0]["logprobs"];
    let tokens: Vec<&str> = lp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tokens.len(), 6, "{v}");
    assert_eq!(
        tokens.concat(),
        v["choices"][0]["text"].as_str().unwrap(),
        "{v}"
    );
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    assert_eq!(offsets[0], 0);
    for (w, t) in offsets.windows(2).zip(&tokens) {
        assert_eq!(w[1] - w[0], t.chars().count() as u64, "{v}");
    }
    // The first token's number against the model's own logits.
    let reference = reference_logprobs(&engine, &prompt);
    let top = lp["top_logprobs"][0].as_object().unwrap();
    assert!(!top.is_empty() && top.len() <= 3, "{v}");
    let first = lp["token_logprobs"][0].as_f64().unwrap();
    let best = reference.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    assert!((-30.0..=0.0).contains(&first), "{v}");
    let top_max = top
        .values()
        .map(|x| x.as_f64().unwrap())
        .fold(f64::NEG_INFINITY, f64::max);
    assert!(
        (top_max - best).abs() < 1e-3,
        "top {top_max} vs reference {best}"
    );
    assert!(
        reference.iter().any(|&r| (r - first).abs() < 1e-3),
        "{first} is no token's log-softmax"
    );

    // Streamed: the chunks' entries concatenate to the whole response's.
    let r = s.post("/v1/completions", &body.replace("}", r#","stream":true}"#));
    let mut streamed = Vec::new();
    for c in chunks(&r) {
        if let Some(t) = c["choices"][0]["logprobs"]["tokens"].as_array() {
            streamed.extend(t.iter().map(|x| x.as_str().unwrap().to_string()));
        }
    }
    assert_eq!(streamed, tokens);
}

#[test]
fn chat_logprobs_streamed_and_whole() {
    let s = Server::start(&["--parallel", "1"]);
    let body = r#"{"messages":[{"role":"user","content":"def add(a, b):"}],"max_tokens":8,"temperature":0,"ignore_eos":true,"logprobs":true,"top_logprobs":2}"#;
    let v = s.post("/v1/chat/completions", body).json();
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(
        content.len() as u64,
        v["usage"]["completion_tokens"].as_u64().unwrap(),
        "{v}"
    );
    for e in content {
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 2, "{e}");
        // Greedy: the chosen token is the most likely one.
        assert_eq!(top[0]["token"], e["token"], "{e}");
        assert_eq!(top[0]["logprob"], e["logprob"], "{e}");
        assert!(top[0]["logprob"].as_f64() >= top[1]["logprob"].as_f64());
        let bytes: Vec<u8> = e["bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap() as u8)
            .collect();
        if let Ok(t) = std::str::from_utf8(&bytes) {
            assert_eq!(e["token"], t);
        }
    }
    let r = s.post(
        "/v1/chat/completions",
        &body.replace("}]", "}],\"stream\":true"),
    );
    let mut streamed = Vec::new();
    for c in chunks(&r) {
        if let Some(t) = c["choices"][0]["logprobs"]["content"].as_array() {
            streamed.extend(t.iter().cloned());
        }
    }
    assert_eq!(&streamed, content);
    // Without logprobs the field is null; out of range is a 400 naming the field.
    let v = s
        .post(
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":2}"#,
        )
        .json();
    assert!(v["choices"][0]["logprobs"].is_null(), "{v}");
    let e = s
        .post(
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21}"#,
        )
        .assert_error(400);
    assert_eq!(e["param"], "top_logprobs");
}

#[test]
fn the_thinking_budget_closes_the_reasoning_and_the_answer_follows() {
    let template = pn_tests::data("chat-template", "qwen3.5_chat_template.jinja");
    let template = template.to_str().expect("UTF-8 path");
    let s = Server::start(&["--parallel", "1", "--chat-template-file", template]);
    // The Qwen3.5 template opens `<think>` in the generation prompt and the demo model never
    // closes it: without a budget everything is reasoning.
    let base = r#"{"messages":[{"role":"user","content":"def add(a, b):"}],"max_tokens":40,"temperature":0,"ignore_eos":true"#;
    let v = s.post("/v1/chat/completions", &format!("{base}}}")).json();
    assert_eq!(v["choices"][0]["message"]["content"], "", "{v}");
    assert_eq!(
        v["usage"]["completion_tokens_details"]["reasoning_tokens"],
        v["usage"]["completion_tokens"],
        "{v}"
    );
    for budget in [0u64, 1, 7] {
        let body = format!(r#"{base},"thinking_budget_tokens":{budget}}}"#);
        let v = s.post("/v1/chat/completions", &body).json();
        let reasoning = v["usage"]["completion_tokens_details"]["reasoning_tokens"]
            .as_u64()
            .unwrap();
        assert!(reasoning <= budget, "budget {budget}: {v}");
        assert_eq!(
            reasoning, budget,
            "the demo model reasons as long as it may: {v}"
        );
        let m = &v["choices"][0]["message"];
        assert!(
            !m["content"].as_str().unwrap().trim().is_empty(),
            "the answer follows: {v}"
        );
        assert!(!m["content"].as_str().unwrap().contains("think>"), "{v}");
        assert_eq!(
            v["usage"]["completion_tokens"], 40,
            "reasoning counts toward max_tokens"
        );
        // Streamed, with the usage chunk.
        let r = s.post(
            "/v1/chat/completions",
            &body.replace(
                "}]",
                r#"}],"stream":true,"stream_options":{"include_usage":true}"#,
            ),
        );
        let cs = chunks(&r);
        let last = cs.last().unwrap();
        assert!(last["choices"].as_array().unwrap().is_empty());
        assert_eq!(
            last["usage"]["completion_tokens_details"]["reasoning_tokens"],
            budget
        );
        let content: String = cs
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(content, m["content"].as_str().unwrap());
    }
    // reasoning_effort maps to a budget capped at half of max_tokens: 20 here.
    let v = s
        .post(
            "/v1/chat/completions",
            &format!(r#"{base},"reasoning_effort":"high"}}"#),
        )
        .json();
    assert_eq!(
        v["usage"]["completion_tokens_details"]["reasoning_tokens"], 20,
        "{v}"
    );
    let e = s
        .post(
            "/v1/chat/completions",
            &format!(r#"{base},"reasoning_effort":"extreme"}}"#),
        )
        .assert_error(400);
    assert_eq!(e["param"], "reasoning_effort");
}

#[test]
fn the_chat_page_is_served_without_the_key() {
    let s = Server::start(&["--parallel", "1", "--api-key", "k1"]);
    let page = s.get("/");
    assert_eq!(page.status, 200);
    assert!(page
        .header("content-type")
        .unwrap()
        .starts_with("text/html"));
    assert!(page.text().contains("/webui/app.js"));
    let js = s.get("/webui/app.js");
    assert_eq!(js.status, 200);
    assert!(js.text().contains("/v1/chat/completions"));
    assert_eq!(s.get("/webui/style.css").status, 200);
    // The API itself still needs the key.
    s.get("/v1/models").assert_error(401);
}
