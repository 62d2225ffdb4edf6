//! `pn logits` end to end (owner: model): the tiny oracle model's logits and MTP logits written
//! by the command match the transformers reference files.

use std::path::PathBuf;
use std::process::Command;

fn tiny(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/tiny-qwen35")
        .join(name)
}

fn read_f32(path: &PathBuf) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

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
