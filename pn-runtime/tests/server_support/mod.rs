//! Shared by the `server_*` integration tests: start the real `pn serve` binary on a loopback
//! port and talk raw HTTP/1.1 to it (std only, so the tests see exactly what goes on the wire).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running server: a `pn serve` child process (killed when dropped), or a server running
/// in this process (`child: None`, see [`Server::in_process`]).
pub struct Server {
    pub child: Option<Child>,
    pub addr: SocketAddr,
}

impl Server {
    /// Starts `pn serve --port 0` with the demo model and `extra` flags, and waits for the
    /// address it prints.
    pub fn start(extra: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_pn"))
            .args(["serve", "--port", "0", "-t", "2"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start pn serve");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let line = lines
            .next()
            .expect("pn serve printed nothing")
            .expect("read stdout");
        let addr = line
            .rsplit("http://")
            .next()
            .and_then(|a| a.trim().parse().ok())
            .unwrap_or_else(|| panic!("no address in {line:?}"));
        // Keep draining stdout so the server never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Server {
            child: Some(child),
            addr,
        }
    }

    /// Starts `pn_runtime::server::serve_on` on a thread of this process (as `pn serve -t 2`
    /// with the demo model and `config`), with `hook` called before each request generates.
    /// The server lives until the test process ends.
    pub fn in_process(
        config: pn_runtime::server::ServerConfig,
        hook: pn_runtime::server::SlotHook,
    ) -> Server {
        use pn_runtime::{Engine, EngineOptions};
        let options = EngineOptions {
            threads: 2,
            ..EngineOptions::default()
        };
        let engine = Engine::load(pn_runtime::DEMO_MODEL_PATH, options).expect("demo model");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("address");
        std::thread::spawn(move || {
            pn_runtime::server::serve_on(listener, engine, config, Some(hook)).expect("serve")
        });
        let s = Server { child: None, addr };
        // The socket is bound already; wait until the server answers on it.
        s.wait_for("the server", Duration::from_secs(60), |s| {
            s.get("/health").status == 200
        });
        s
    }

    /// The child process (`pn serve`).
    pub fn child(&mut self) -> &mut Child {
        self.child.as_mut().expect("a pn serve child process")
    }

    /// Sends a request and reads the whole response.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Response {
        let mut s = self.connect();
        send(&mut s, method, path, headers, body);
        read_response(&mut s)
    }

    /// POSTs JSON.
    pub fn post(&self, path: &str, json: &str) -> Response {
        self.request(
            "POST",
            path,
            &[("Content-Type", "application/json")],
            json.as_bytes(),
        )
    }

    /// GETs a path.
    pub fn get(&self, path: &str) -> Response {
        self.request("GET", path, &[], b"")
    }

    /// A connection with a read timeout.
    pub fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(self.addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        s
    }

    /// The value of a metric line `name value` (first match).
    pub fn metric(&self, name: &str) -> f64 {
        let text = self.get("/metrics").text();
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("metric {name} missing in\n{text}"))
    }

    /// Waits until `f` holds (polling every 20 ms), panicking after `timeout`.
    pub fn wait_for(&self, what: &str, timeout: Duration, mut f: impl FnMut(&Server) -> bool) {
        let t0 = Instant::now();
        while !f(self) {
            assert!(t0.elapsed() < timeout, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        let ok = Command::new("kill")
            .args([
                "-TERM",
                &self.child.as_ref().expect("a child").id().to_string(),
            ])
            .status()
            .expect("run kill")
            .success();
        assert!(ok);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Writes a request with `Connection: close`.
pub fn send(s: &mut TcpStream, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    s.write_all(head.as_bytes()).unwrap();
    // The server may answer (and close) before reading a large body.
    let _ = s.write_all(body);
}

/// A parsed response.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn text(&self) -> String {
        String::from_utf8(self.body.clone()).expect("UTF-8 body")
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `data:` payloads of an SSE body.
    pub fn sse_data(&self) -> Vec<String> {
        self.text()
            .lines()
            .filter_map(|l| l.strip_prefix("data: ").map(str::to_string))
            .collect()
    }

    /// Asserts an OpenAI error object with this status and returns it.
    pub fn assert_error(&self, status: u16) -> serde_json::Value {
        assert_eq!(
            self.status,
            status,
            "{}",
            String::from_utf8_lossy(&self.body)
        );
        let v = self.json();
        let e = &v["error"];
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert!(e["type"].is_string(), "{v}");
        assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
        e.clone()
    }
}

/// Reads a whole response (the server closes after it: `Connection: close`).
pub fn read_response(s: &mut TcpStream) -> Response {
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in {:?}", String::from_utf8_lossy(&raw)));
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .expect("status line");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let mut body = raw[end + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    if chunked {
        body = dechunk(&body);
    }
    Response {
        status,
        headers,
        body,
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size =
            usize::from_str_radix(std::str::from_utf8(&b[..eol]).unwrap().trim(), 16).unwrap();
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[eol + 2 + size + 2..];
    }
}

/// Concatenates the text of a chat stream's chunks (`content`, `reasoning_content`) or a
/// completion stream's (`text`), checking the `[DONE]` end; returns (text, finish, usage).
pub fn collect_stream(data: &[String]) -> (String, String, serde_json::Value) {
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
    let mut text = String::new();
    let mut finish = String::new();
    let mut usage = serde_json::Value::Null;
    for d in &data[..data.len() - 1] {
        let v: serde_json::Value = serde_json::from_str(d).unwrap();
        assert!(v.get("error").is_none(), "error chunk {v}");
        if let Some(c) = v["choices"].get(0) {
            if let Some(t) = c["delta"]["content"].as_str() {
                text.push_str(t);
            }
            if let Some(t) = c["text"].as_str() {
                text.push_str(t);
            }
            if let Some(f) = c["finish_reason"].as_str() {
                finish = f.to_string();
            }
        }
        if !v["usage"].is_null() {
            usage = v["usage"].clone();
        }
    }
    (text, finish, usage)
}
