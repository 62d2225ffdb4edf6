//! `pn tokenize` and `pn template` run as a user runs them.

mod common;

use common::pn;

#[test]
fn tokenize_prints_the_reference_ids_as_json() {
    let vocab = common::vocab_path();
    let vocab = vocab.to_str().unwrap();
    let cases = common::jsonl(common::data("qwen-tokenizer", "tokenize-cases.jsonl"));
    // A sample of categories, including special-token text and NFC-sensitive lines.
    for case in cases.iter().step_by(37) {
        let text = case["text"].as_str().unwrap();
        let out = pn(&["tokenize", "-m", vocab, "-p", text]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got: Vec<u32> = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(got, common::ids(&case["ids_hf"]), "{}", case["id"]);
    }
    let out = pn(&[
        "tokenize",
        "-m",
        vocab,
        "-p",
        "<|im_start|>user\nHello<|im_end|>",
    ]);
    let got: Vec<u32> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(got, [248045, 846, 198, 9419, 248046]);
}

#[test]
fn tokenize_reads_a_file_exactly() {
    let path = std::env::temp_dir().join(format!("pn-tokenize-{}.txt", std::process::id()));
    std::fs::write(&path, "Hello world\n").unwrap();
    let out = pn(&[
        "tokenize",
        "-m",
        common::vocab_path().to_str().unwrap(),
        "-f",
        path.to_str().unwrap(),
    ]);
    std::fs::remove_file(&path).ok();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Vec<u32> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(got, common::qwen().encode("Hello world\n").unwrap());
}

#[test]
fn tokenize_errors_are_actionable() {
    let out = pn(&["tokenize", "-m", "/nonexistent/model.gguf", "-p", "x"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/model.gguf"), "{err}");
    let out = pn(&["tokenize", "-m", common::vocab_path().to_str().unwrap()]);
    assert!(!out.status.success());
}

#[test]
fn template_prints_the_transformers_render_exactly() {
    let vocab = common::vocab_path();
    let dir = std::env::temp_dir().join(format!("pn-template-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = std::fs::read_to_string(common::data("chat-template", "cases.jsonl")).unwrap();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let case: serde_json::Value = serde_json::from_str(line).unwrap();
        let Some(want) = case["rendered"].as_str() else {
            continue;
        };
        let id = case["id"].as_str().unwrap();
        // The case line itself is an object with "messages" and "tools".
        let messages = dir.join(format!("{id}.json"));
        std::fs::write(&messages, line).unwrap();
        let mut kwargs = case["kwargs"].as_object().unwrap().clone();
        let add_gen = kwargs
            .remove("add_generation_prompt")
            .and_then(|v| v.as_bool())
            .unwrap();
        let kwargs = serde_json::Value::Object(kwargs).to_string();
        let template = common::data("chat-template", case["template_file"].as_str().unwrap());
        let mut args = vec![
            "template",
            "-m",
            vocab.to_str().unwrap(),
            "--messages",
            messages.to_str().unwrap(),
            "--kwargs",
            &kwargs,
        ];
        // Qwen3.5 cases use the GGUF's own template; the others pass the file.
        if case["template"] != "qwen3.5" {
            args.extend(["--chat-template-file", template.to_str().unwrap()]);
        }
        if add_gen {
            args.push("--add-generation-prompt");
        }
        let out = pn(&args);
        assert!(
            out.status.success(),
            "{id}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8(out.stdout).unwrap(), want, "{id}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn template_errors_name_the_cause() {
    let dir = std::env::temp_dir().join(format!("pn-template-err-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let messages = dir.join("m.json");
    std::fs::write(
        &messages,
        r#"{"messages": [{"role": "assistant", "content": "hi"}]}"#,
    )
    .unwrap();
    let out = pn(&[
        "template",
        "-m",
        common::vocab_path().to_str().unwrap(),
        "--messages",
        messages.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("No user query found in messages."), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}
