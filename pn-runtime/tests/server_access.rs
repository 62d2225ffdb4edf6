//! Access (issue #21): with `--api-key` every endpoint but `/health` (and the chat page's
//! static files) needs the key, metrics included; a non-loopback address without a key gets
//! a warning; CORS is off unless `--cors-origin` asks for it.

mod server_support;

use server_support::Server;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

const KEY: &str = "k-3f9a";

/// Every route of the server, with a body that would be served.
const ROUTES: &[(&str, &str, &str)] = &[
    (
        "POST",
        "/v1/chat/completions",
        r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}"#,
    ),
    (
        "POST",
        "/v1/completions",
        r#"{"prompt":"def f():","max_tokens":2}"#,
    ),
    (
        "POST",
        "/v1/messages",
        r#"{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}"#,
    ),
    (
        "POST",
        "/v1/messages/count_tokens",
        r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
    ),
    ("GET", "/v1/models", ""),
    ("GET", "/metrics", ""),
    ("GET", "/v2/unknown", ""),
];

#[test]
fn every_endpoint_but_health_needs_the_key() {
    let s = Server::start(&["--parallel", "1", "--api-key", KEY]);
    let json = ("Content-Type", "application/json");
    let bearer = format!("Bearer {KEY}");
    for &(method, path, body) in ROUTES {
        // No key, a wrong key, the key without "Bearer": 401 in the route's API shape.
        for auth in [None, Some("Bearer nope"), Some(KEY)] {
            let mut headers = vec![json];
            headers.extend(auth.map(|a| ("Authorization", a)));
            let r = s.request(method, path, &headers, body.as_bytes());
            assert_eq!(r.status, 401, "{method} {path} with {auth:?}");
            if path.starts_with("/v1/messages") {
                assert_eq!(r.json()["type"], "error");
                assert_eq!(r.json()["error"]["type"], "authentication_error");
            } else {
                assert_eq!(r.json()["error"]["code"], "invalid_api_key");
            }
        }
        // The key (as a bearer token or Anthropic's x-api-key): served.
        for header in [("Authorization", bearer.as_str()), ("x-api-key", KEY)] {
            let r = s.request(method, path, &[json, header], body.as_bytes());
            let want = if path == "/v2/unknown" { 404 } else { 200 };
            assert_eq!(r.status, want, "{method} {path}: {}", r.text());
        }
    }
    // Open without the key: the health check and the chat page's static files (the page
    // asks for the key itself).
    for path in ["/health", "/", "/webui/app.js", "/webui/style.css"] {
        assert_eq!(s.get(path).status, 200, "{path}");
    }
}

/// Starts `pn serve` with `args` and returns what it wrote on stderr before it was listening.
fn startup_stderr(args: &[&str]) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pn"))
        .args(["serve", "--port", "0", "-t", "1"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start pn serve");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).expect("stdout");
    assert!(line.contains("listening on"), "{line:?}");
    // Everything printed before the address line is on stderr by now.
    std::thread::sleep(Duration::from_millis(200));
    let _ = child.kill();
    let _ = child.wait();
    let mut err = String::new();
    let _ = std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err);
    err
}

#[test]
fn a_public_address_without_a_key_is_warned_about() {
    let warned = |s: &str| s.contains("warning") && s.contains("--api-key");
    let err = startup_stderr(&["--host", "0.0.0.0"]);
    assert!(warned(&err), "{err}");
    let err = startup_stderr(&["--host", "0.0.0.0", "--api-key", KEY]);
    assert!(!warned(&err), "{err}");
    let err = startup_stderr(&["--host", "127.0.0.1"]);
    assert!(!warned(&err), "{err}");
}

#[test]
fn cors_is_off_unless_asked_for() {
    let origin = ("Origin", "https://app.example");
    let preflight = [
        origin,
        ("Access-Control-Request-Method", "POST"),
        (
            "Access-Control-Request-Headers",
            "authorization, content-type",
        ),
    ];
    let s = Server::start(&["--parallel", "1"]);
    let r = s.request("GET", "/v1/models", &[origin], b"");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("access-control-allow-origin"), None);
    let r = s.request("OPTIONS", "/v1/chat/completions", &preflight, b"");
    assert_eq!(r.status, 405);
    assert_eq!(r.header("access-control-allow-origin"), None);
    drop(s);

    let s = Server::start(&[
        "--parallel",
        "1",
        "--api-key",
        KEY,
        "--cors-origin",
        "https://app.example",
    ]);
    // The preflight is answered without the key (browsers send none with it).
    let r = s.request("OPTIONS", "/v1/chat/completions", &preflight, b"");
    assert_eq!(r.status, 204);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    assert!(r
        .header("access-control-allow-headers")
        .is_some_and(|h| h.contains("authorization")));
    let bearer = format!("Bearer {KEY}");
    let r = s.request(
        "GET",
        "/v1/models",
        &[origin, ("Authorization", &bearer)],
        b"",
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    // The key is still needed for the request itself.
    let r = s.request("GET", "/v1/models", &[origin], b"");
    assert_eq!(r.status, 401);
    // Another origin gets no CORS headers.
    let r = s.request(
        "GET",
        "/v1/models",
        &[
            ("Origin", "https://evil.example"),
            ("Authorization", &bearer),
        ],
        b"",
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("access-control-allow-origin"), None);
}
