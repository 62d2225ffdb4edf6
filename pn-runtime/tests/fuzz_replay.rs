//! Replays every committed fuzz input (`fuzz/seeds/<target>/*`: the seed corpus, and every
//! crash the fuzzer found, kept there as a regression case) through the same target bodies the
//! libFuzzer binaries run, so they are ordinary tests without libFuzzer or a nightly compiler.

#[path = "../../fuzz/src/cases.rs"]
mod cases;

use std::path::PathBuf;

fn replay(target: &str) {
    let body = cases::TARGETS
        .iter()
        .find(|(n, _)| *n == target)
        .map(|(_, f)| *f)
        .expect("a known target");
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/seeds")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{} has no seeds", dir.display());
    for f in files {
        let data = std::fs::read(&f).expect("a seed");
        eprintln!("replaying {}", f.display());
        body(&data);
    }
}

#[test]
fn every_target_has_a_replay_test() {
    let names: Vec<&str> = cases::TARGETS.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        names,
        [
            "gguf_parse",
            "pn_validate",
            "safetensors",
            "imatrix",
            "tokenizer",
            "chat_template",
            "server_request"
        ]
    );
}

#[test]
fn gguf_parse() {
    replay("gguf_parse");
}

#[test]
fn pn_validate() {
    replay("pn_validate");
}

#[test]
fn safetensors() {
    replay("safetensors");
}

#[test]
fn imatrix() {
    replay("imatrix");
}

#[test]
fn tokenizer() {
    replay("tokenizer");
}

#[test]
fn chat_template() {
    replay("chat_template");
}

#[test]
fn server_request() {
    replay("server_request");
}
