//! The chat templates against the prompts transformers rendered (tests/data/chat-template), and
//! the sandbox against hostile templates.

mod common;

use pn_runtime::chat_template::{
    ChatMessage, ChatTemplate, ChatTemplateError, TemplateContext, TemplateLimits,
};
use std::time::{Duration, Instant};

fn template_file(name: &str) -> String {
    std::fs::read_to_string(common::data("chat-template", name)).unwrap()
}

/// Renders one case line the way the reference did: messages and tools from the line (key order
/// kept), each kwarg as a variable.
fn render_case(case: &serde_json::Value, line: &str) -> Result<String, ChatTemplateError> {
    let template = ChatTemplate::new(&template_file(case["template_file"].as_str().unwrap()))?;
    let mut ctx = TemplateContext::from_request_json(line)?;
    ctx.set_kwargs_json(&case["kwargs"].to_string())?;
    template.render(&ctx)
}

#[test]
fn every_case_renders_exactly_like_transformers() {
    let path = common::data("chat-template", "cases.jsonl");
    let text = std::fs::read_to_string(path).unwrap();
    let mut n = 0;
    let mut failures = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let case: serde_json::Value = serde_json::from_str(line).unwrap();
        let id = case["id"].as_str().unwrap();
        n += 1;
        let got = render_case(&case, line);
        match (&case["rendered"], &case["error"], got) {
            (serde_json::Value::String(want), _, Ok(got)) => {
                if &got != want {
                    failures.push(format!("{id}:\n--- got\n{got}\n--- want\n{want}"));
                }
            }
            (_, serde_json::Value::String(err), Err(ChatTemplateError::Raised { message })) => {
                let want = err.strip_prefix("TemplateError: ").unwrap();
                if message != want {
                    failures.push(format!("{id}: raised {message:?}, want {want:?}"));
                }
            }
            (_, _, got) => failures.push(format!("{id}: unexpected outcome {got:?}")),
        }
    }
    assert_eq!(n, 28);
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn rendered_prompts_tokenize_to_the_reference_ids() {
    let tok = common::qwen();
    for case in common::jsonl(common::data("chat-template", "cases.jsonl")) {
        let Some(rendered) = case["rendered"].as_str() else {
            continue;
        };
        assert_eq!(
            tok.encode(rendered).unwrap(),
            common::ids(&case["ids"]),
            "{}",
            case["id"]
        );
    }
}

#[test]
fn the_gguf_template_is_the_qwen35_file_and_renders_typed_messages() {
    let tok = common::qwen();
    assert_eq!(
        tok.chat_template(),
        Some(template_file("qwen3.5_chat_template.jinja").as_str())
    );
    let t = ChatTemplate::from_tokenizer(tok).unwrap();
    let msgs = [ChatMessage::system("Be brief."), ChatMessage::user("Hi")];
    assert_eq!(
        t.render_messages(&msgs, true).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
         <|im_start|>assistant\n<think>\n"
    );
}

#[test]
fn python_style_values_and_helpers() {
    let t = ChatTemplate::new(
        "{{ true }} {{ none }} {{ 1.0 }} {{ 1e-05 }} {{ [1, 'a'] }} {{ x|string }} {{ x|tojson }} \
         {{ 'a,b'.split(',') }} {{ '  hi  '.strip() }} {{ 'abc'.startswith('ab') }} \
         {{ undefined_var is defined }} {{ y|tojson(indent=2) }}",
    )
    .unwrap();
    let mut ctx = TemplateContext::new();
    ctx.set_json("x", r#"{"z": 1, "a": [true, null, 0.5, "é"]}"#)
        .unwrap();
    ctx.set_json("y", r#"[1]"#).unwrap();
    assert_eq!(
        t.render(&ctx).unwrap(),
        "True None 1.0 1e-05 [1, 'a'] {'z': 1, 'a': [True, None, 0.5, 'é']} \
         {\"z\": 1, \"a\": [true, null, 0.5, \"é\"]} ['a', 'b'] hi True False [\n  1\n]"
    );
}

#[test]
fn template_errors_are_reported_clearly() {
    let err = ChatTemplate::new("{% if %}").unwrap_err();
    assert!(matches!(err, ChatTemplateError::Syntax(_)), "{err}");
    let err = ChatTemplate::new("{{ raise_exception('nope') }}")
        .unwrap()
        .render(&TemplateContext::new())
        .unwrap_err();
    assert!(
        matches!(&err, ChatTemplateError::Raised { message } if message == "nope"),
        "{err}"
    );
    let err = ChatTemplate::new("{{ messages[0].content.nosuchmethod() }}")
        .unwrap()
        .render(&TemplateContext::with_messages(&[ChatMessage::user("x")]))
        .unwrap_err();
    assert!(matches!(err, ChatTemplateError::Render(_)), "{err}");
    assert!(err.to_string().contains("chat_template:1"), "{err}");
    assert!(TemplateContext::from_request_json("{\"messages\": 3}").is_err());
    assert!(TemplateContext::from_request_json("not json").is_err());
}

/// Renders a hostile template and checks it fails fast with one of the limit errors.
fn assert_contained(source: &str) -> ChatTemplateError {
    eprintln!("hostile: {source}");
    let start = Instant::now();
    let result = ChatTemplate::new(source).and_then(|t| t.render(&TemplateContext::new()));
    let elapsed = start.elapsed();
    assert!(
        elapsed < Duration::from_secs(20),
        "{source}: took {elapsed:?}"
    );
    match result {
        Ok(out) => panic!("{source}: rendered {} bytes", out.len()),
        Err(e) => e,
    }
}

#[test]
fn hostile_templates_cannot_hang_or_exhaust_memory() {
    let cases = [
        // Exponential string growth through a namespace.
        "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
        // Not covered: exponential *list* growth (`ns.l = ns.l + ns.l` 33 times). minijinja 3.1
        // materialises list concatenations nested deeper than 32 without charging fuel, so that
        // template exhausts memory in-process; only the subprocess sandbox contains it
        // (tests/template_sandbox.rs).
        // Huge repetition in one step.
        "{{ 'x' * 4000000000 }}",
        "{{ ('x' * 1000000) * 1000000 }}",
        // Long loops.
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        // Unbounded recursion.
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        // Output flood.
        "{% for i in range(100000) %}{% for j in range(1000) %}xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx{% endfor %}{% endfor %}",
        // A value referenced many times, expanded by tojson / string / printing.
        "{% set s = 'x' * 1000000 %}{% set l = [s] * 100000 %}{{ l|tojson|length }}",
        "{% set s = 'x' * 1000000 %}{% set l = [s] * 100000 %}{{ l|string|length }}",
        "{% set s = 'x' * 1000000 %}{% set l = [s] * 100000 %}{{ l }}",
        // Python methods that expand text.
        "{% set s = 'x' * 100000 %}{{ s.replace('x', s)|length }}",
        "{{ '{:>4000000000}'.format('x')|length }}",
        "{{ '{:.4000000000f}'.format(1.5)|length }}",
        "{{ '%4000000000s'|format('x')|length }}",
        "{% set s = 'ab' * 1000000 %}{{ s|replace('a', s)|length }}",
        "{% set s = 'x' * 1000000 %}{% set l = [s] * 100000 %}{{ l|join|length }}",
        "{{ range(100000)|list|string|length }}{% for i in range(100000) %}{{ range(1000)|sum }}{% endfor %}",
    ];
    for source in cases {
        let err = assert_contained(source);
        assert!(
            matches!(
                err,
                ChatTemplateError::OutOfFuel { .. }
                    | ChatTemplateError::OutputTooLarge { .. }
                    | ChatTemplateError::Render(_)
            ),
            "{source}: {err}"
        );
    }
}

#[test]
fn templates_cannot_reach_the_file_system() {
    let secret = std::env::temp_dir().join(format!("pn-template-secret-{}", std::process::id()));
    std::fs::write(&secret, "SECRET").unwrap();
    let p = secret.display().to_string();
    for source in [
        format!("{{% include '{p}' %}}"),
        format!("{{% import '{p}' as x %}}"),
        format!("{{% extends '{p}' %}}"),
        format!("{{% from '{p}' import x %}}"),
        "{{ open('/etc/passwd') }}".to_string(),
        "{{ self.__init__.__globals__ }}".to_string(),
        "{{ ''.__class__.__mro__ }}".to_string(),
    ] {
        // Either the template fails, or its output leaks nothing.
        if let Ok(out) = ChatTemplate::new(&source).and_then(|t| t.render(&TemplateContext::new()))
        {
            assert!(
                !out.contains("SECRET") && !out.contains("root:"),
                "{source}: {out}"
            );
        }
    }
    std::fs::remove_file(secret).ok();
}

#[test]
fn limits_are_configurable() {
    let limits = TemplateLimits {
        fuel: 1_000_000,
        max_output_bytes: 10,
        recursion_limit: 20,
    };
    let t = ChatTemplate::with_limits("{{ 'x' * 11 }}", limits).unwrap();
    assert!(matches!(
        t.render(&TemplateContext::new()),
        Err(ChatTemplateError::OutputTooLarge { limit: 10 })
    ));
    let t = ChatTemplate::with_limits("{{ 'x' * 10 }}", limits).unwrap();
    assert_eq!(t.render(&TemplateContext::new()).unwrap(), "xxxxxxxxxx");
    let t = ChatTemplate::with_limits(
        "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(50) }}",
        limits,
    )
    .unwrap();
    assert!(t.render(&TemplateContext::new()).is_err());
}
