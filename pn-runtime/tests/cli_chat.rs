//! `pn chat`'s exit status: 0 when every turn got a reply, non-zero when a turn failed (the
//! conversation still goes on past it).

use std::process::{Command, Output, Stdio};

/// Runs `pn chat` on the built-in demo model with `args` and no further input on stdin.
fn chat(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pn"))
        .arg("chat")
        .args(["--temp", "0", "-t", "2", "--spec", "none"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run pn chat")
}

#[test]
fn every_turn_answered_exits_zero() {
    let out = chat(&["-c", "256", "-n", "4", "-p", "def add(a, b):"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("[prompt: "), "a reply was generated: {err}");
}

#[test]
fn a_failed_turn_exits_non_zero() {
    // 64 tokens of context leave 48 for the prompt: this message alone is far longer.
    let long = "def function_with_a_long_name(argument_one, argument_two): return 1\n".repeat(20);
    let out = chat(&["-c", "64", "-n", "4", "-p", &long]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a failed turn must fail the process: {err}"
    );
    assert!(err.contains("does not fit the context"), "{err}");
    assert!(err.contains("1 of 1 turns failed"), "{err}");
}
