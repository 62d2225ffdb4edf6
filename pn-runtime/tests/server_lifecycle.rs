//! `pn serve` under stress: a client that disconnects mid-stream frees its slot within a token,
//! a full queue answers 429 with Retry-After, a panicking request does not take the server
//! down, and SIGTERM shuts down gracefully.

mod server_support;
use pn_runtime::server::ServerConfig;
use pn_runtime::tokenizer::Tokenizer;
use server_support::{collect_stream, Server};
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A long generation (no end token) so the slot stays busy.
const LONG: &str = r#"{"prompt":"def f():","max_tokens":3000,"ignore_eos":true,"stream":true}"#;

fn start_stream(s: &Server, body: &str) -> std::net::TcpStream {
    let mut c = s.connect();
    server_support::send(
        &mut c,
        "POST",
        "/v1/completions",
        &[("Content-Type", "application/json")],
        body.as_bytes(),
    );
    // Wait until generated text is flowing.
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("\"text\"") {
        let n = c.read(&mut buf).expect("read stream");
        assert!(
            n > 0,
            "stream ended early: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    c
}

#[test]
fn disconnect_mid_stream_frees_the_slot() {
    let s = Server::start(&["--parallel", "1"]);
    let c = start_stream(&s, LONG);
    assert_eq!(s.metric("pn_slots_busy"), 1.0);
    let before = s.metric("pn_tokens_generated_total");
    drop(c);
    s.wait_for("the slot to be freed", Duration::from_secs(10), |s| {
        s.metric("pn_slots_busy") == 0.0
    });
    assert_eq!(s.metric("pn_requests_cancelled_total"), 1.0);
    // It stopped long before its 3000 tokens.
    let after = s.metric("pn_tokens_generated_total");
    assert!(after - before < 2000.0, "{before} -> {after}");
    // The one slot serves the next request.
    let r = s.post("/v1/completions", r#"{"prompt":"x","max_tokens":3}"#);
    assert_eq!(r.status, 200);
    // Same for a non-streamed request whose client gives up.
    let mut c = s.connect();
    server_support::send(
        &mut c,
        "POST",
        "/v1/completions",
        &[],
        LONG.replace(",\"stream\":true", "").as_bytes(),
    );
    s.wait_for("the request to start", Duration::from_secs(10), |s| {
        s.metric("pn_slots_busy") == 1.0
    });
    drop(c);
    s.wait_for("the slot to be freed", Duration::from_secs(10), |s| {
        s.metric("pn_slots_busy") == 0.0
    });
}

#[test]
fn full_queue_answers_429_and_panics_are_contained() {
    // In this process, with a hook that panics (on the slot's thread, inside its panic guard)
    // on every request whose prompt holds the marker.
    let config = ServerConfig {
        parallel: 1,
        max_queue: 1,
        ..ServerConfig::default()
    };
    let tokenizer = Tokenizer::open(pn_runtime::DEMO_MODEL_PATH).expect("tokenizer");
    let hook = move |prompt: &[u32]| {
        if tokenizer
            .decode(prompt)
            .is_ok_and(|text| text.contains("PANIC-NOW"))
        {
            panic!("request panicked on purpose (test hook)");
        }
    };
    let s = Server::in_process(config, Arc::new(hook));
    let busy = start_stream(&s, LONG);
    // One may wait...
    let mut waiting = s.connect();
    server_support::send(
        &mut waiting,
        "POST",
        "/v1/completions",
        &[],
        br#"{"prompt":"y","max_tokens":2}"#,
    );
    s.wait_for("the queued request", Duration::from_secs(10), |s| {
        s.metric("pn_queue_depth") == 1.0
    });
    // ...the next is turned away.
    let r = s.post("/v1/completions", r#"{"prompt":"z","max_tokens":2}"#);
    let e = r.assert_error(429);
    assert_eq!(e["type"], "rate_limit_error");
    let retry: u64 = r
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!(retry >= 1);
    drop(busy);
    // The queued request then runs to completion.
    let resp = server_support::read_response(&mut waiting);
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(
        resp.json()["usage"]["completion_tokens"]
            .as_u64()
            .map(|n| n <= 2),
        Some(true)
    );

    // A request that panics in its slot gets a 500; the server and the slot go on.
    let e = s
        .post(
            "/v1/completions",
            r#"{"prompt":"PANIC-NOW","max_tokens":2}"#,
        )
        .assert_error(500);
    assert_eq!(e["type"], "server_error");
    let r = s.post(
        "/v1/chat/completions",
        r#"{"messages":[{"role":"user","content":"PANIC-NOW"}],"max_tokens":2,"stream":true}"#,
    );
    assert_eq!(r.status, 200);
    let data = r.sse_data();
    assert!(data.iter().any(|d| d.contains("\"error\"")), "{data:?}");
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(s.metric("pn_request_panics_total"), 2.0);
    let r = s.post(
        "/v1/completions",
        r#"{"prompt":"def g():","max_tokens":4,"stream":true}"#,
    );
    let (_, finish, usage) = collect_stream(&r.sse_data());
    assert!(!finish.is_empty());
    assert!(usage["completion_tokens"].as_u64().unwrap() >= 1);
}

#[test]
fn sigterm_finishes_running_requests_then_exits() {
    let mut s = Server::start(&["--parallel", "2", "--shutdown-grace", "120"]);
    // A short stream in flight finishes normally during the grace period.
    let mut c = start_stream(
        &s,
        r#"{"prompt":"def f():","max_tokens":60,"ignore_eos":true,"stream":true}"#,
    );
    s.terminate();
    let mut rest = Vec::new();
    c.read_to_end(&mut rest).unwrap();
    let rest = String::from_utf8_lossy(&rest);
    assert!(rest.contains("\"finish_reason\":\"length\""), "{rest}");
    assert!(rest.contains("[DONE]"));
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = s.child().try_wait().unwrap() {
            break st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "server did not exit"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
}

#[test]
fn sigterm_cancels_generations_after_the_grace_period() {
    let mut s = Server::start(&["--parallel", "1", "--shutdown-grace", "0.5"]);
    let mut c = start_stream(&s, LONG);
    let t0 = Instant::now();
    s.terminate();
    // New connections are refused or answered 503 while shutting down.
    let mut rest = Vec::new();
    c.read_to_end(&mut rest).unwrap();
    let rest = String::from_utf8_lossy(&rest);
    assert!(rest.contains("shutting down"), "{rest}");
    let status = loop {
        if let Some(st) = s.child().try_wait().unwrap() {
            break st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "server did not exit"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success());
    let _ = c.write_all(b"");
}
