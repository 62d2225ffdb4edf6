//! `pn logits` end to end (owner: model): the tiny oracle model's logits and MTP logits written
//! by the command match the transformers reference files.

use pn_tests::{max_abs, read_f32, tiny};
use std::process::Command;

#[test]
fn logits_and_mtp_logits_match_the_oracle() {
    let dir = std::env::temp_dir().join(format!("pn-logits-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (out, mtp) = (dir.join("logits.f32"), dir.join("mtp.f32"));
    let status = Command::new(env!("CARGO_BIN_EXE_pn"))
        .arg("logits")
        .arg("-m")
        .arg(tiny("model-f16.gguf"))
        .arg("--tokens")
        .arg(tiny("tokens_a.json"))
        .arg("--out")
        .arg(&out)
        .arg("--mtp-out")
        .arg(&mtp)
        .arg("--batch")
        .arg("5")
        .status()
        .expect("run pn");
    assert!(status.success());
    let d = max_abs(&read_f32(&out), &read_f32(&tiny("logits_a.f32")));
    assert!(d <= 1e-4, "logits: {d}");
    let d = max_abs(&read_f32(&mtp), &read_f32(&tiny("mtp_logits_a.f32")));
    assert!(d <= 1e-4, "mtp logits: {d}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_tokens_file_is_an_error() {
    let dir = std::env::temp_dir().join(format!("pn-logits-cli-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let toks = dir.join("t.json");
    std::fs::write(&toks, r#"{"tokens": [1, 999999]}"#).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_pn"))
        .args(["logits", "-m"])
        .arg(tiny("model-f16.gguf"))
        .arg("--tokens")
        .arg(&toks)
        .arg("--out")
        .arg(dir.join("o.f32"))
        .output()
        .expect("run pn");
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("999999") && err.contains("vocabulary"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
