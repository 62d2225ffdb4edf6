//! The chat-template sandbox: rendering in a `pn __template-worker` child process gives the
//! same text and errors as rendering in-process, and a template that would exhaust memory (list
//! doubling, which fuel does not bound) or hang only costs the child.

mod common;

use pn_runtime::chat_template::{
    ChatMessage, ChatTemplate, ChatTemplateError, SubprocessSandbox, TemplateContext,
    TemplateIsolation, TemplateLimits, WORKER_ARG,
};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The tests measure this process's memory and its children: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The built `pn` as the worker, with the default limits.
fn pn_sandbox() -> SubprocessSandbox {
    SubprocessSandbox::new(env!("CARGO_BIN_EXE_pn"), vec![OsString::from(WORKER_ARG)])
}

fn isolated(t: ChatTemplate) -> ChatTemplate {
    t.with_isolation(TemplateIsolation::Subprocess(pn_sandbox()))
}

/// Renders `source` with `ctx` in-process and in the worker.
fn both(
    source: &str,
    limits: TemplateLimits,
    ctx: &TemplateContext,
) -> (
    Result<String, ChatTemplateError>,
    Result<String, ChatTemplateError>,
) {
    let local = ChatTemplate::with_limits(source, limits).unwrap();
    let remote = isolated(ChatTemplate::with_limits(source, limits).unwrap());
    (local.render(ctx), remote.render(ctx))
}

/// `Ok` texts equal, or the same error variant with the same message.
fn same(a: &Result<String, ChatTemplateError>, b: &Result<String, ChatTemplateError>) -> bool {
    match (a, b) {
        (Ok(x), Ok(y)) => x == y,
        (Err(x), Err(y)) => {
            std::mem::discriminant(x) == std::mem::discriminant(y) && x.to_string() == y.to_string()
        }
        _ => false,
    }
}

/// Resident memory of this process, in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The pids of this process's children, and which of them are zombies.
fn children() -> Vec<(u32, bool)> {
    let me = std::process::id();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`; comm may hold spaces, so split after the last ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let state = fields.next().unwrap_or("");
        let ppid: u32 = fields.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        if ppid == me {
            found.push((pid, state == "Z"));
        }
    }
    found
}

/// Doubles a list `n` times: lazily up to 32 levels, then minijinja materialises it without
/// charging fuel (2^33 values and up).
fn list_doubling(n: usize) -> String {
    let mut s = String::from("{% set l = [1] %}");
    for _ in 0..n {
        s.push_str("{% set l = l + l %}");
    }
    s.push_str("{{ l|length }}");
    s
}

const NAMESPACE_DOUBLING: &str = "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}\
     {% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|length }}";

#[test]
fn every_test_case_renders_identically_in_the_worker() {
    let _g = serial();
    let text = std::fs::read_to_string(common::data("chat-template", "cases.jsonl")).unwrap();
    let mut n = 0;
    let mut failures = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let case: serde_json::Value = serde_json::from_str(line).unwrap();
        let source = std::fs::read_to_string(common::data(
            "chat-template",
            case["template_file"].as_str().unwrap(),
        ))
        .unwrap();
        let mut ctx = TemplateContext::from_request_json(line).unwrap();
        ctx.set_kwargs_json(&case["kwargs"].to_string()).unwrap();
        let (local, remote) = both(&source, TemplateLimits::default(), &ctx);
        if !same(&local, &remote) {
            failures.push(format!("{}: {local:?}\nvs {remote:?}", case["id"]));
        }
        n += 1;
    }
    assert_eq!(n, 28);
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));

    // The model's own template with its special-token variables.
    let local = ChatTemplate::from_tokenizer(common::qwen()).unwrap();
    let remote = isolated(ChatTemplate::from_tokenizer(common::qwen()).unwrap());
    let msgs = [ChatMessage::system("Be brief."), ChatMessage::user("Hi")];
    let want = local.render_messages(&msgs, true).unwrap();
    assert_eq!(remote.render_messages(&msgs, true).unwrap(), want);
    let eos = ChatTemplate::new("[{{ eos_token }}|{{ bos_token }}]")
        .unwrap()
        .with_special_tokens_of(common::qwen());
    let eos_remote = isolated(
        ChatTemplate::new("[{{ eos_token }}|{{ bos_token }}]")
            .unwrap()
            .with_special_tokens_of(common::qwen()),
    );
    let ctx = TemplateContext::new();
    assert_eq!(eos_remote.render(&ctx).unwrap(), eos.render(&ctx).unwrap());
}

#[test]
fn values_keep_their_kind_through_the_worker() {
    let _g = serial();
    let source = "{{ a }} {{ a|tojson }} {{ b }} {{ c }} {{ d }} {{ e }} {{ f }} {{ g }} \
                  {% for k, v in a.items() %}{{ k }}={{ v }};{% endfor %} {{ h is defined }}";
    let mut ctx = TemplateContext::new();
    ctx.set_json(
        "a",
        r#"{"z": 1, "y": 1.0, "x": [true, null, -0.0, 1e300, "é\u0000"], "w": {}}"#,
    )
    .unwrap();
    ctx.set("b", &u128::MAX);
    ctx.set("c", &i128::MIN);
    ctx.set("d", &(1, "two", 3.5));
    ctx.set("e", &std::collections::BTreeMap::from([(2, "x"), (1, "y")]));
    ctx.set("f", &f64::INFINITY);
    ctx.set("g", &u64::MAX);
    ctx.add_generation_prompt(true);
    let (local, remote) = both(source, TemplateLimits::default(), &ctx);
    let local = local.unwrap();
    assert!(local.contains("{'z': 1, 'y': 1.0"), "{local}");
    assert_eq!(remote.unwrap(), local);
}

#[test]
fn list_doubling_hits_the_memory_limit_in_the_worker_not_here() {
    let _g = serial();
    for source in [list_doubling(40), NAMESPACE_DOUBLING.to_string()] {
        let template = isolated(ChatTemplate::new(&source).unwrap());
        let before = rss_kib();
        let start = Instant::now();
        let result = template.render(&TemplateContext::new());
        let elapsed = start.elapsed();
        let grown = rss_kib().saturating_sub(before);
        eprintln!("list doubling: {result:?} after {elapsed:?}, RSS +{grown} KiB");
        assert!(
            matches!(
                result,
                Err(ChatTemplateError::SandboxMemory { limit })
                    if limit >> 20 == SubprocessSandbox::DEFAULT_MEMORY_LIMIT >> 20
            ),
            "{result:?}"
        );
        let message = result.unwrap_err().to_string();
        assert!(message.contains("memory limit of 128 MiB"), "{message}");
        assert!(elapsed < Duration::from_secs(8), "took {elapsed:?}");
        assert!(grown < 4 << 10, "this process grew by {grown} KiB");
    }
    // Another limit is the one enforced and reported (plus the headroom for the request).
    let small = ChatTemplate::new(&list_doubling(34))
        .unwrap()
        .with_isolation(TemplateIsolation::Subprocess(
            pn_sandbox().with_memory_limit(64 << 20),
        ));
    let err = small.render(&TemplateContext::new()).unwrap_err();
    assert!(
        matches!(err, ChatTemplateError::SandboxMemory { limit } if limit >> 20 == 64),
        "{err:?}"
    );
    // 32 doublings stay lazy and small: the limit does not get in the way of real work.
    let fine = isolated(ChatTemplate::new(&list_doubling(20)).unwrap());
    assert_eq!(fine.render(&TemplateContext::new()).unwrap(), "1048576");
    assert!(children().is_empty(), "{:?}", children());
}

/// Whether an error is the one a case expects.
type Expected = fn(&ChatTemplateError) -> bool;

#[test]
fn template_errors_come_back_as_the_same_variants() {
    let _g = serial();
    let ctx = TemplateContext::with_messages(&[ChatMessage::user("x")]);
    let small = TemplateLimits {
        fuel: 200_000,
        max_output_bytes: 1000,
        recursion_limit: 20,
    };
    let cases: [(&str, Expected); 5] = [
        (
            "{{ raise_exception('x') }}",
            |e| matches!(e, ChatTemplateError::Raised { message } if message == "x"),
        ),
        (
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            |e| matches!(e, ChatTemplateError::OutOfFuel { fuel: 200_000 }),
        ),
        ("{{ 'x' * 1001 }}", |e| {
            matches!(e, ChatTemplateError::OutputTooLarge { limit: 1000 })
        }),
        (
            "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
            |e| matches!(e, ChatTemplateError::Render(_)),
        ),
        (
            "{{ messages[0].content.nosuchmethod() }}",
            |e| matches!(e, ChatTemplateError::Render(m) if m.contains("chat_template:1")),
        ),
    ];
    for (source, expected) in cases {
        let (local, remote) = both(source, small, &ctx);
        let remote_err = remote.as_ref().unwrap_err();
        assert!(expected(remote_err), "{source}: {remote_err:?}");
        assert!(same(&local, &remote), "{source}: {local:?} vs {remote:?}");
    }
}

#[test]
fn a_hanging_worker_is_killed_at_the_timeout() {
    let _g = serial();
    // Not a template worker at all: it never answers.
    let sleeper = SubprocessSandbox::new("sleep", vec![OsString::from("30")])
        .with_timeout(Duration::from_millis(300));
    let template = ChatTemplate::new("hi")
        .unwrap()
        .with_isolation(TemplateIsolation::Subprocess(sleeper));
    let start = Instant::now();
    let err = template.render(&TemplateContext::new()).unwrap_err();
    let elapsed = start.elapsed();
    assert!(
        matches!(err, ChatTemplateError::SandboxTimeout { secs } if (secs - 0.3).abs() < 1e-9),
        "{err:?}"
    );
    assert!(err.to_string().contains("time limit of 0.3 s"), "{err}");
    assert!(elapsed < Duration::from_secs(3), "took {elapsed:?}");
    // Killed and reaped: no child left, running or zombie.
    assert!(children().is_empty(), "{:?}", children());

    // The real worker on a template that would run for hours with unlimited fuel.
    let limits = TemplateLimits {
        fuel: u64::MAX,
        ..TemplateLimits::default()
    };
    let slow = ChatTemplate::with_limits(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% for k in range(100000) %}\
         {% endfor %}{% endfor %}{% endfor %}",
        limits,
    )
    .unwrap()
    .with_isolation(TemplateIsolation::Subprocess(
        pn_sandbox().with_timeout(Duration::from_millis(500)),
    ));
    let start = Instant::now();
    let err = slow.render(&TemplateContext::new()).unwrap_err();
    assert!(
        matches!(err, ChatTemplateError::SandboxTimeout { .. }),
        "{err:?}"
    );
    assert!(start.elapsed() < Duration::from_secs(3));
    assert!(children().is_empty(), "{:?}", children());
}

#[test]
fn a_worker_that_cannot_start_or_answer_is_a_sandbox_failure() {
    let _g = serial();
    let missing = SubprocessSandbox::new("/nonexistent/pn-template-worker", Vec::new());
    let err = ChatTemplate::new("hi")
        .unwrap()
        .with_isolation(TemplateIsolation::Subprocess(missing))
        .render(&TemplateContext::new())
        .unwrap_err();
    assert!(
        matches!(&err, ChatTemplateError::SandboxFailed { reason } if reason.contains("/nonexistent/pn-template-worker")),
        "{err:?}"
    );
    // `true` reads nothing and says nothing.
    let mute = SubprocessSandbox::new("true", Vec::new());
    let err = ChatTemplate::new("hi")
        .unwrap()
        .with_isolation(TemplateIsolation::Subprocess(mute))
        .render(&TemplateContext::new())
        .unwrap_err();
    assert!(
        matches!(&err, ChatTemplateError::SandboxFailed { reason } if reason.contains("no valid reply")),
        "{err:?}"
    );
}

/// A copy of the demo model whose `tokenizer.chat_template` is `template`.
fn demo_with_template(template: &str, name: &str) -> PathBuf {
    use gguf_io::{GgufFile, MetadataEntry, Value};
    let demo = GgufFile::open(pn_runtime::DEMO_MODEL_PATH).unwrap();
    let mut metadata: Vec<MetadataEntry> = demo
        .metadata()
        .iter()
        .filter(|e| e.key != "tokenizer.chat_template")
        .cloned()
        .collect();
    metadata.push(MetadataEntry::new(
        "tokenizer.chat_template",
        Value::String(template.into()),
    ));
    let tensors: Vec<_> = demo.tensors().collect();
    let specs: Vec<gguf_io::TensorSpec<'_>> = tensors
        .iter()
        .map(|t| (t.name, t.ty, t.dims, t.bytes))
        .collect();
    let dir = std::env::temp_dir().join(format!("pn-template-sandbox-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    gguf_io::write_gguf(&path, &metadata, &specs).unwrap();
    path
}

#[test]
fn the_cli_reports_the_memory_limit_instead_of_dying() {
    let _g = serial();
    let model = demo_with_template(&list_doubling(40), "hostile.gguf");
    let messages = model.with_file_name("messages.json");
    std::fs::write(
        &messages,
        r#"{"messages": [{"role": "user", "content": "hi"}]}"#,
    )
    .unwrap();

    // `pn template` renders and exits.
    let out = Command::new(env!("CARGO_BIN_EXE_pn"))
        .arg("template")
        .arg("-m")
        .arg(&model)
        .arg("--messages")
        .arg(&messages)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("exceeded the sandbox memory limit of 128 MiB"),
        "{stderr}"
    );

    // `pn chat` renders the template for each turn: the turn fails with the same message, and
    // the process ends normally when its input does.
    let mut child = Command::new(env!("CARGO_BIN_EXE_pn"))
        .args(["chat", "-t", "1", "-n", "4", "-m"])
        .arg(&model)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"hello\n").unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code().is_some(),
        "killed: {:?}\n{stderr}",
        out.status
    );
    assert!(
        stderr.contains(
            "error: chat template rendering exceeded the sandbox memory limit of 128 MiB"
        ),
        "{stderr}"
    );
    std::fs::remove_dir_all(model.parent().unwrap()).ok();

    // The worker stays out of the help; the switch is documented.
    let help = Command::new(env!("CARGO_BIN_EXE_pn"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&help.stdout).contains(WORKER_ARG));
    let help = Command::new(env!("CARGO_BIN_EXE_pn"))
        .args(["chat", "--help"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&help.stdout).contains("--template-sandbox"));
}

#[test]
fn subprocess_overhead_per_render() {
    let _g = serial();
    let local = ChatTemplate::from_tokenizer(common::qwen()).unwrap();
    let remote = isolated(ChatTemplate::from_tokenizer(common::qwen()).unwrap());
    let msgs = [
        ChatMessage::system("You are a helpful assistant."),
        ChatMessage::user("Write a function that reverses a string."),
        ChatMessage::assistant("def rev(s):\n    return s[::-1]"),
        ChatMessage::user("Now in Rust."),
    ];
    let want = local.render_messages(&msgs, true).unwrap();
    assert_eq!(remote.render_messages(&msgs, true).unwrap(), want);
    const N: u32 = 20;
    let mean_ms = |t: &ChatTemplate| {
        let start = Instant::now();
        for _ in 0..N {
            assert_eq!(t.render_messages(&msgs, true).unwrap(), want);
        }
        start.elapsed().as_secs_f64() * 1e3 / f64::from(N)
    };
    let (in_process, subprocess) = (mean_ms(&local), mean_ms(&remote));
    println!(
        "chat template render (Qwen3.5 template, 4 messages, mean of {N}): \
         in-process {in_process:.3} ms, subprocess {subprocess:.2} ms \
         (overhead {:.2} ms)",
        subprocess - in_process
    );
    assert!(subprocess < 1000.0, "{subprocess} ms per render");
}
