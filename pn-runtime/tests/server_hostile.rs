//! Clients that misbehave (issue #21): slow headers and bodies, more connections than the
//! limit, oversized heads, bad sampling values, deep JSON, invalid UTF-8, a client that stops
//! reading its stream, cancel storms. Each case gets its documented answer and the server
//! serves the next request. Access control (`--api-key` on every route, the warning on a
//! non-loopback address, CORS off unless asked for) is in `server_access.rs`.

mod server_support;

use server_support::{read_response, Server};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const COMPLETION: &str = r#"{"prompt":"def f():","max_tokens":2}"#;

/// The server answers a plain request after whatever came before.
fn still_serves(s: &Server) {
    let r = s.post("/v1/completions", COMPLETION);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
}

/// Reads until the server closes the connection or `limit` passes; the bytes and the time.
fn read_until_closed(c: &mut TcpStream, limit: Duration) -> (Vec<u8>, Duration) {
    let t0 = Instant::now();
    c.set_read_timeout(Some(limit)).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match c.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                panic!(
                    "the server kept the connection open for {limit:?}; got {:?}",
                    String::from_utf8_lossy(&out)
                )
            }
            Err(_) => break, // reset: closed too
        }
    }
    (out, t0.elapsed())
}

fn status_of(raw: &[u8]) -> u16 {
    let text = String::from_utf8_lossy(raw);
    text.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"))
}

fn body_json(raw: &[u8]) -> serde_json::Value {
    let text = String::from_utf8_lossy(raw);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

#[test]
fn slow_headers_and_slow_bodies_time_out() {
    let s = Server::start(&[
        "--parallel",
        "1",
        "--header-timeout",
        "1",
        "--body-timeout",
        "1",
    ]);
    // Half a request line and headers, then nothing: closed after the header timeout.
    let mut c = s.connect();
    c.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let (_, took) = read_until_closed(&mut c, Duration::from_secs(10));
    assert!(took < Duration::from_secs(5), "closed after {took:?}");
    // An idle keep-alive connection is closed after the same time.
    let mut c = s.connect();
    let (_, took) = read_until_closed(&mut c, Duration::from_secs(10));
    assert!(took < Duration::from_secs(5), "closed after {took:?}");

    // Headers, then 10 of the 100 body bytes announced: 408 with the OpenAI error body.
    for (path, anthropic) in [("/v1/chat/completions", false), ("/v1/messages", true)] {
        let mut c = s.connect();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"model\":"
        );
        c.write_all(head.as_bytes()).unwrap();
        let (raw, took) = read_until_closed(&mut c, Duration::from_secs(10));
        assert!(took < Duration::from_secs(5), "answered after {took:?}");
        assert_eq!(status_of(&raw), 408, "{}", String::from_utf8_lossy(&raw));
        let v = body_json(&raw);
        if anthropic {
            assert_eq!(v["type"], "error", "{v}");
            assert!(v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("--body-timeout")));
        } else {
            assert_eq!(v["error"]["code"], "request_timeout", "{v}");
        }
    }
    still_serves(&s);
}

#[test]
fn connections_over_the_limit_get_503_and_the_server_goes_on() {
    const LIMIT: usize = 300;
    let s = Server::start(&["--parallel", "1", "--max-connections", "300"]);
    // Twice the limit of idle connections (each completes its TCP handshake: the kernel
    // accepts them into the backlog before the server sees them).
    let mut idle: Vec<TcpStream> = Vec::new();
    for _ in 0..2 * LIMIT {
        idle.push(TcpStream::connect(s.addr).expect("connect"));
    }
    // The ones over the limit are answered 503 (or, past the refusals answered at once,
    // closed); the limit's worth stay open; none is left hanging.
    std::thread::sleep(Duration::from_secs(1));
    let (mut kept, mut answered, mut closed) = (Vec::new(), 0, 0);
    for mut c in idle {
        c.set_read_timeout(Some(Duration::from_millis(5))).unwrap();
        let mut b = [0u8; 1];
        match c.peek(&mut b) {
            Ok(0) => closed += 1,
            Ok(_) => {
                let (raw, _) = read_until_closed(&mut c, Duration::from_secs(10));
                assert_eq!(status_of(&raw), 503, "{}", String::from_utf8_lossy(&raw));
                answered += 1;
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                kept.push(c)
            }
            Err(_) => closed += 1,
        }
    }
    assert_eq!(kept.len(), LIMIT, "{answered} answered, {closed} closed");
    assert!(answered > 0, "{closed} closed");
    // With the limit's worth held open, a new client gets the 503 with its JSON body...
    let r = s.post("/v1/completions", COMPLETION);
    let e = r.assert_error(503);
    assert_eq!(e["code"], "too_many_connections");
    assert_eq!(r.header("retry-after"), Some("1"));
    eprintln!(
        "connection limit {LIMIT}: {} idle kept, {answered} answered 503, {closed} closed",
        kept.len()
    );
    let idle = kept;
    // ...and once they go, the next request is served.
    drop(idle);
    s.wait_for("a free connection", Duration::from_secs(10), |s| {
        s.get("/health").status == 200
    });
    still_serves(&s);
}

#[test]
fn oversized_heads_and_invalid_utf8() {
    let s = Server::start(&["--parallel", "1", "--max-header-bytes", "16384"]);
    // A header bigger than the limit: 431.
    let big = "a".repeat(20_000);
    let r = s.request(
        "POST",
        "/v1/completions",
        &[("X-Big", &big)],
        COMPLETION.as_bytes(),
    );
    assert_eq!(r.status, 431);
    // More headers than the limit of 100: 431.
    let mut c = s.connect();
    let mut head = String::from("GET /health HTTP/1.1\r\nHost: x\r\n");
    for i in 0..150 {
        head.push_str(&format!("X-H{i}: v\r\n"));
    }
    head.push_str("\r\n");
    c.write_all(head.as_bytes()).unwrap();
    let r = read_response(&mut c);
    assert_eq!(r.status, 431);
    // Invalid UTF-8 in the request line: 400.
    let mut c = s.connect();
    c.write_all(b"GET /v1/mod\xffels HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let (raw, _) = read_until_closed(&mut c, Duration::from_secs(10));
    assert_eq!(status_of(&raw), 400);
    // Invalid UTF-8 in a header value is opaque bytes (HTTP allows them): served.
    let mut c = s.connect();
    let body = COMPLETION.as_bytes();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\nX-Odd: ",
        body.len()
    );
    c.write_all(head.as_bytes()).unwrap();
    c.write_all(b"\xff\xfe\r\n\r\n").unwrap();
    c.write_all(body).unwrap();
    assert_eq!(read_response(&mut c).status, 200);
    // Invalid UTF-8 in the body of each endpoint: 400 in its API's shape.
    let bad = b"{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}],\"max_tokens\":4}";
    let json = [("Content-Type", "application/json")];
    s.request("POST", "/v1/chat/completions", &json, bad)
        .assert_error(400);
    let r = s.request("POST", "/v1/messages", &json, bad);
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["type"], "error");
    s.request(
        "POST",
        "/v1/completions",
        &json,
        b"{\"prompt\":\"\xc3\x28\"}",
    )
    .assert_error(400);
    still_serves(&s);
}

#[test]
fn bad_sampling_values_name_the_field() {
    let s = Server::start(&["--parallel", "1", "-c", "256"]);
    let chat = |extra: &str| {
        format!(r#"{{"messages":[{{"role":"user","content":"hi"}}],"max_tokens":2,{extra}}}"#)
    };
    for (extra, field) in [
        (r#""temperature":-1"#, "temperature"),
        // Beyond f32: parses as infinity, out of range.
        (r#""temperature":1e39"#, "temperature"),
        (r#""top_p":-0.5"#, "top_p"),
        (r#""min_p":1e300"#, "min_p"),
        (r#""frequency_penalty":-1e39"#, "frequency_penalty"),
        (r#""presence_penalty":3"#, "presence_penalty"),
        (r#""top_k":-3"#, "top_k"),
        (r#""max_tokens":-5"#, "max_tokens"),
        // Past i64: not a valid max_tokens.
        (r#""max_tokens":1e30"#, "max_tokens"),
    ] {
        let e = s
            .post("/v1/chat/completions", &chat(extra))
            .assert_error(400);
        assert_eq!(e["param"], field, "{extra}: {e}");
    }
    // Not JSON numbers at all: NaN, Infinity, a number past f64.
    for extra in [
        r#""temperature":NaN"#,
        r#""temperature":Infinity"#,
        r#""temperature":1e999"#,
    ] {
        s.post("/v1/chat/completions", &chat(extra))
            .assert_error(400);
    }
    // Anthropic: same checks, its error shape.
    let r = s.post(
        "/v1/messages",
        r#"{"model":"m","max_tokens":4,"temperature":-2,"messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(r.status, 400);
    let v = r.json();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    // A huge max_tokens is clamped to the room left in the context: an answer that ends
    // with `length` where the context is full.
    let r = s.post(
        "/v1/completions",
        r#"{"prompt":"def f():","max_tokens":9000000000000000000,"ignore_eos":true}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let u = &v["usage"];
    assert_eq!(
        u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap(),
        256,
        "{v}"
    );
    still_serves(&s);
}

/// `{"type":"object","properties":{"a": ...}}` nested `levels` deep.
fn nested_schema(levels: usize) -> String {
    let mut s = String::from(r#"{"type":"string"}"#);
    for _ in 0..levels {
        s = format!(r#"{{"type":"object","properties":{{"a":{s}}},"required":["a"]}}"#);
    }
    s
}

#[test]
fn deeply_nested_json_everywhere() {
    let s = Server::start(&["--parallel", "1", "-c", "512"]);
    let deep = |n: usize| format!("{}1{}", "[".repeat(n), "]".repeat(n));
    // Past serde_json's depth limit of 128 in every JSON input: 400, no stack overflow.
    for body in [
        format!(
            r#"{{"messages":[{{"role":"user","content":"x"}}],"chat_template_kwargs":{{"k":{}}}}}"#,
            deep(50_000)
        ),
        format!(
            r#"{{"messages":[{{"role":"user","content":"x"}}],"response_format":{{"type":"json_schema","json_schema":{{"name":"n","schema":{}}}}}}}"#,
            nested_schema(20_000)
        ),
        format!(
            r#"{{"messages":[{{"role":"user","content":"x"}}],"tools":[{{"type":"function","function":{{"name":"f","parameters":{}}}}}]}}"#,
            nested_schema(20_000)
        ),
    ] {
        s.post("/v1/chat/completions", &body).assert_error(400);
    }
    let r = s.post(
        "/v1/messages",
        &format!(
            r#"{{"model":"m","max_tokens":2,"messages":[{{"role":"user","content":{}}}]}}"#,
            deep(50_000)
        ),
    );
    assert_eq!(r.status, 400);
    // Just under the limit, the recursive code after the parser (schema to grammar, the
    // template's tojson on tool parameters and kwargs) runs on it: an answer, not a crash.
    let ok_or_400 = |r: server_support::Response| {
        assert!(
            r.status == 200 || r.status == 400,
            "{} {}",
            r.status,
            String::from_utf8_lossy(&r.body)
        );
    };
    ok_or_400(s.post(
        "/v1/chat/completions",
        &format!(
            r#"{{"messages":[{{"role":"user","content":"x"}}],"max_tokens":4,"response_format":{{"type":"json_schema","json_schema":{{"name":"n","schema":{}}}}}}}"#,
            nested_schema(40)
        ),
    ));
    ok_or_400(s.post(
        "/v1/chat/completions",
        &format!(
            r#"{{"messages":[{{"role":"user","content":"x"}}],"max_tokens":4,"tool_choice":"required","tools":[{{"type":"function","function":{{"name":"f","parameters":{}}}}}]}}"#,
            nested_schema(40)
        ),
    ));
    ok_or_400(s.post(
        "/v1/chat/completions",
        &format!(
            r#"{{"messages":[{{"role":"user","content":"x"}}],"max_tokens":2,"chat_template_kwargs":{{"k":{}}}}}"#,
            deep(120)
        ),
    ));
    still_serves(&s);
}

/// The server's resident memory in KiB.
fn rss_kib(s: &mut Server) -> u64 {
    let pid = s.child().id();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS")
}

fn stream_request(s: &Server, max_tokens: usize, logprobs: bool) -> TcpStream {
    let body = format!(
        r#"{{"prompt":"def f():","max_tokens":{max_tokens},"ignore_eos":true,"stream":true{}}}"#,
        if logprobs { r#","logprobs":20"# } else { "" }
    );
    let mut c = TcpStream::connect(s.addr).expect("connect");
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    c.write_all(head.as_bytes()).unwrap();
    c.write_all(body.as_bytes()).unwrap();
    c
}

/// Caps the client's receive buffer at a few KiB: loopback's autotuned buffers (up to
/// `tcp_rmem`'s 32 MiB here) would otherwise take a whole stream without the client reading.
fn small_receive_buffer(c: &TcpStream) {
    use std::os::fd::AsRawFd;
    let size: libc::c_int = 4096;
    // SAFETY: a valid socket descriptor and a c_int option value of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            c.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            std::ptr::from_ref(&size).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "setsockopt SO_RCVBUF");
}

#[test]
fn a_client_that_stops_reading_keeps_memory_bounded() {
    // Four streams whose clients stop reading after the first bytes (receive buffers capped
    // at 4 KiB). Generation goes on into bounded buffers (hyper's, the kernel's, the events
    // of one generation); RSS is sampled until the slots are idle again.
    let mut s = Server::start(&["--parallel", "4"]);
    still_serves(&s);
    let before = rss_kib(&mut s);
    let mut slow: Vec<TcpStream> = (0..4)
        .map(|_| {
            let c = stream_request(&s, 200, true);
            small_receive_buffer(&c);
            c
        })
        .collect();
    for c in &mut slow {
        let mut b = [0u8; 256];
        c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        c.read_exact(&mut b).unwrap();
    }
    let t0 = Instant::now();
    let mut peak = before;
    loop {
        peak = peak.max(rss_kib(&mut s));
        if s.get("/health").json()["slots_busy"] == 0 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "slots still busy");
        std::thread::sleep(Duration::from_millis(100));
    }
    let grew = peak.saturating_sub(before);
    eprintln!(
        "stalled readers: RSS {before} KiB before, peak {peak} KiB (+{grew}); slots idle after {:?}",
        t0.elapsed()
    );
    assert!(grew < 64 << 10, "RSS grew by {grew} KiB");
    drop(slow);
    still_serves(&s);
}

/// `--write-timeout`: a write to a client that reads nothing fails with `TimedOut` once it
/// has been blocked for the timeout (without it the write waits forever, and the 30 s guard
/// here fails the test). The server closes such a connection, which cancels its generation.
#[test]
fn a_write_blocked_past_the_write_timeout_fails() {
    use pn_runtime::server::limits::TimedIo;
    use std::pin::Pin;
    use tokio::io::AsyncWrite;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        small_receive_buffer(&client);
        let (server, _) = listener.accept().await.unwrap();
        let mut timed = TimedIo::new(server, Duration::from_millis(300));
        let chunk = vec![b'x'; 64 << 10];
        let t0 = Instant::now();
        let mut written = 0usize;
        let err = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                match std::future::poll_fn(|cx| Pin::new(&mut timed).poll_write(cx, &chunk)).await {
                    Ok(n) => written += n,
                    Err(e) => return e,
                }
            }
        })
        .await
        .expect("a blocked write must fail within its timeout, not hang");
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "{err}");
        eprintln!(
            "write timeout: {written} bytes taken by the socket, then failed after {:?}",
            t0.elapsed()
        );
        drop(client);
    });
}

#[test]
fn cancel_storm_frees_every_slot() {
    let s = Server::start(&["--parallel", "2", "--queue", "400"]);
    // Hundreds of streams opened and dropped: some at once, some after the first bytes.
    for round in 0..3 {
        let mut open: Vec<TcpStream> = (0..100).map(|_| stream_request(&s, 3000, false)).collect();
        if round == 1 {
            for c in open.iter_mut().take(4) {
                let mut b = [0u8; 64];
                c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
                let _ = c.read(&mut b);
            }
        }
        drop(open);
    }
    s.wait_for(
        "the slots and queue to empty",
        Duration::from_secs(60),
        |s| {
            let h = s.get("/health").json();
            h["slots_busy"] == 0 && h["queue"] == 0
        },
    );
    still_serves(&s);
    assert_eq!(s.metric("pn_queue_depth"), 0.0);
}
