//! The command line a llama.cpp user meets, through the built binary: the demo model inside a
//! copied `pn`, token files between commands, refused flags, Ctrl-C in `pn run`, a chat that
//! outgrows its context (through a pty), and llama-perplexity's windows.

mod common;

use common::pn;
use pn_runtime::engine::{Engine, EngineOptions, KvCacheType};
use pn_tests::{data, scratch_dir, DEMO};
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn run_in(dir: &Path, exe: &Path, args: &[&str]) -> Output {
    // A freshly copied executable can be "busy" for a moment: another test thread's fork
    // inherits the copy's open write descriptor until that child execs (Linux ETXTBSY; seen
    // once in CI, 2026-12-05). Retry briefly rather than fail on the race.
    let mut tries = 0;
    loop {
        match Command::new(exe)
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .output()
        {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 100 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            r => return r.expect("run the copied pn"),
        }
    }
}

/// A copy of `pn` alone in an empty directory runs every model command on its built-in demo.
#[test]
fn copied_binary_runs_the_demo_with_no_files() {
    let dir = scratch_dir("pn-copied");
    let exe = dir.join("pn");
    std::fs::copy(env!("CARGO_BIN_EXE_pn"), &exe).unwrap();
    let out = run_in(
        &dir,
        &exe,
        &[
            "run",
            "-p",
            "def f(x):",
            "-n",
            "4",
            "--temp",
            "0",
            "-t",
            "2",
        ],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.starts_with("def f(x):") && stdout.len() > 10,
        "{stdout:?}"
    );
    assert!(
        stderr.contains("DEMO model") && stderr.contains("generation 4 tokens"),
        "{stderr}"
    );

    // The other commands that take -m fall back to the same model.
    let out = run_in(&dir, &exe, &["tokenize", "-p", "def f(x):\n    return x"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    std::fs::write(dir.join("t.json"), &out.stdout).unwrap();
    let ids: Vec<u32> = serde_json::from_slice(&out.stdout).unwrap();
    assert!(ids.len() > 4, "{ids:?}");
    let out = run_in(
        &dir,
        &exe,
        &[
            "logits",
            "--tokens",
            "t.json",
            "--out",
            "l.f32",
            "--threads",
            "2",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let vocab = std::fs::metadata(dir.join("l.f32")).unwrap().len() as usize / 4 / ids.len();
    assert_eq!(
        vocab * 4 * ids.len(),
        std::fs::metadata(dir.join("l.f32")).unwrap().len() as usize
    );
    assert!(vocab >= 8192, "{vocab}");
    let out = run_in(&dir, &exe, &["perplexity", "--tokens", "t.json", "-t", "2"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("Final estimate: PPL = "),
        "{}",
        text(&out.stdout)
    );
    std::fs::write(
        dir.join("m.json"),
        r#"{"messages": [{"role": "user", "content": "hi"}]}"#,
    )
    .unwrap();
    let out = run_in(
        &dir,
        &exe,
        &[
            "template",
            "--messages",
            "m.json",
            "--add-generation-prompt",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// `pn tokenize` prints what `pn logits` and `pn perplexity --tokens` read, and the logits of
/// the demo agree with the library's on the same ids.
#[test]
fn tokenize_output_feeds_logits() {
    let dir = scratch_dir("pn-tok-logits");
    let out = pn(&["tokenize", "-p", "import os\nprint(os.getcwd())"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let toks = dir.join("t.json");
    std::fs::write(&toks, &out.stdout).unwrap();
    let ids: Vec<u32> = serde_json::from_slice(&out.stdout).unwrap();
    let logits = dir.join("l.f32");
    let out = pn(&[
        "logits",
        "--tokens",
        toks.to_str().unwrap(),
        "--out",
        logits.to_str().unwrap(),
        "--threads",
        "2",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let bytes = std::fs::read(&logits).unwrap();
    let engine = Engine::load(
        pn_runtime::DEMO_MODEL_PATH,
        EngineOptions {
            threads: 2,
            kv_type_k: KvCacheType::F32,
            kv_type_v: KvCacheType::F32,
            ..EngineOptions::default()
        },
    )
    .unwrap();
    let vocab = engine.config().vocab;
    assert_eq!(bytes.len(), ids.len() * vocab * 4);
    let mut s = engine.session().unwrap();
    let want = s.feed_all_logits(&ids).unwrap();
    let got: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let diff = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(diff < 1e-2, "max |diff| {diff}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn llama_cpp_flags_pn_lacks_are_refused_by_name() {
    let out = pn(&["run", "--lora", "adapter.gguf", "-p", "x"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("`--lora`") && err.contains("not supported by pn"),
        "{err}"
    );
    let out = pn(&["run", "-ts", "1,1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("`-ts`"), "{}", text(&out.stderr));
    // Multi-letter short flags parse (and -ngl says where pn runs).
    let out = pn(&[
        "run", "-p", "def f():", "-n", "2", "-ngl", "99", "-fa", "-ctk", "q8_0", "-ctv", "q8_0",
        "-t", "2", "--temp", "0",
    ]);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("-ngl 99: pn runs on the CPU"), "{err}");
}

/// `-f -` and piped stdin are prompts.
#[test]
fn stdin_prompts() {
    use std::io::Write;
    for args in [&["run", "-f", "-"][..], &["run"][..]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_pn"))
            .args(args)
            .args(["-n", "3", "--temp", "0", "-t", "2"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"class Stack:")
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert!(
            text(&out.stdout).starts_with("class Stack:"),
            "{args:?}: {}",
            text(&out.stdout)
        );
        assert!(
            text(&out.stderr).contains("generation 3 tokens"),
            "{}",
            text(&out.stderr)
        );
    }
}

/// Ctrl-C stops the generation; the timing line still comes, and the exit is clean.
#[cfg(unix)]
#[test]
fn ctrl_c_stops_run_with_the_timing_line() {
    use std::io::Read;
    let mut child = Command::new(env!("CARGO_BIN_EXE_pn"))
        .args([
            "run",
            "-p",
            "def f(x):",
            "-n",
            "-1",
            "--ignore-eos",
            "-c",
            "4096",
            "-t",
            "2",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for the completion to start streaming, then interrupt.
    let mut stdout = child.stdout.take().unwrap();
    let mut buf = vec![0u8; 64];
    let mut seen = 0;
    while seen < 20 {
        let n = stdout.read(&mut buf).unwrap();
        assert!(n > 0, "pn ended before being interrupted");
        seen += n;
    }
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = text(&out.stderr);
    assert!(out.status.success(), "{:?} {err}", out.status);
    assert!(
        err.contains("generation ") && err.contains("stop: Cancelled"),
        "{err}"
    );
}

/// A chat with a 64-token context goes on past it: the oldest turns are dropped (said on
/// stderr) and every turn gets a reply. Driven through a pty by python3's `pty` module; skipped
/// where there is no python3.
#[cfg(unix)]
#[test]
fn chat_outgrowing_the_context_drops_old_turns() {
    if Command::new("python3")
        .arg("-c")
        .arg("import pty")
        .output()
        .map_or(true, |o| !o.status.success())
    {
        eprintln!("skipped: no python3 with the pty module");
        return;
    }
    let script = r#"
import os, pty, sys, time, select
exe = sys.argv[1]
pid, fd = pty.fork()
if pid == 0:
    os.execv(exe, [exe, "chat", "-c", "64", "-n", "6", "--temp", "0", "-t", "2", "--spec", "none"])
out = b""
def read_until(done, timeout=120):
    global out
    end = time.time() + timeout
    while time.time() < end:
        if done():
            return True
        r, _, _ = select.select([fd], [], [], 0.5)
        if r:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                return False
            if not chunk:
                return False
            out += chunk
    return done()
# The prompt "> " comes last once pn waits for a line (after each reply's timing line).
assert read_until(lambda: out.endswith(b"> ")), out
for i in range(6):
    os.write(fd, b"def function_number_%d(a, b, c):\r" % i)
    assert read_until(lambda: out.count(b"[prompt: ") > i and out.endswith(b"> ")), out
os.write(fd, b"/exit\r")
_, status = os.waitpid(pid, 0)
sys.stdout.buffer.write(out)
sys.exit(os.waitstatus_to_exitcode(status))
"#;
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_pn"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let s = text(&out.stdout);
    assert!(out.status.success(), "{s}\n{}", text(&out.stderr));
    assert!(
        s.contains("no longer fits the context") && s.contains("system prompt kept"),
        "{s}"
    );
    // Six replies, each with its timing line; no turn failed.
    assert_eq!(s.matches("[prompt: ").count(), 6, "{s}");
    assert!(!s.contains("error:"), "{s}");
}

/// `pn perplexity -c 32` on the demo's 128 validation tokens: 4 windows, rows 16..30 of each
/// scored, the NLL equal to one computed here with the library on those positions.
#[test]
fn perplexity_windows_are_llama_perplexitys() {
    let tokens_path = data(DEMO, "tokens_val.json");
    let tokens = pn_tests::read_tokens(&tokens_path);
    assert_eq!(tokens.len(), 128);
    let out = pn(&[
        "perplexity",
        "--tokens",
        tokens_path.to_str().unwrap(),
        "-c",
        "32",
        "-t",
        "2",
    ]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains("over 60 predictions, 4 window(s) of 32 tokens"),
        "{stdout}"
    );
    assert!(
        stderr.contains("[1]") && stderr.contains("[4]"),
        "progress: {stderr}"
    );
    let ppl: f64 = stdout
        .split("PPL = ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|x| x.parse().ok())
        .unwrap_or_else(|| panic!("{stdout}"));
    // The reference: positions worked out here (the demo adds no BOS).
    let engine = Engine::load(
        pn_runtime::DEMO_MODEL_PATH,
        EngineOptions {
            threads: 2,
            context: 32,
            kv_type_k: KvCacheType::F16,
            kv_type_v: KvCacheType::F16,
            ..EngineOptions::default()
        },
    )
    .unwrap();
    assert!(!engine.tokenizer().adds_bos());
    let vocab = engine.config().vocab;
    let mut s = engine.session().unwrap();
    let (mut nll, mut n) = (0.0f64, 0);
    for w in 0..4 {
        s.reset().unwrap();
        let logits = s.feed_all_logits(&tokens[w * 32..w * 32 + 32]).unwrap();
        for row in 16..31 {
            let l = &logits[row * vocab..(row + 1) * vocab];
            let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let lse = l.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln() + max;
            nll += lse - l[tokens[w * 32 + row + 1] as usize] as f64;
            n += 1;
        }
    }
    assert_eq!(n, 60);
    let want = (nll / n as f64).exp();
    assert!(
        (ppl - want).abs() / want < 1e-3,
        "pn {ppl} vs reference {want}"
    );
}

/// A compact KL base file written by one run is read by `--kl-divergence` and `pn eval-kl`:
/// the same model against itself gives zero KL, the F16 original against PN3 a small one.
#[test]
fn compact_kl_base_round_trip() {
    let dir = scratch_dir("pn-klbase");
    let kld = dir.join("base.kld");
    let tokens = data(DEMO, "tokens_val.json");
    let (t, k) = (tokens.to_str().unwrap(), kld.to_str().unwrap());
    let f16 = pn_runtime::DEMO_MODEL_F16_PATH;
    let out = pn(&[
        "perplexity",
        "-m",
        f16,
        "--tokens",
        t,
        "-c",
        "64",
        "--kl-divergence-base",
        k,
        "-t",
        "2",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // 2 windows x 31 rows x (8 + 8 x 32) bytes, plus the header and the 128 tokens.
    assert_eq!(
        std::fs::metadata(&kld).unwrap().len(),
        32 + 128 * 4 + 62 * 264
    );
    let kl_of = |out: &Output| -> f64 {
        let s = text(&out.stdout);
        assert!(out.status.success(), "{s}{}", text(&out.stderr));
        s.split("Mean KLD: ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|x| x.parse().ok())
            .unwrap_or_else(|| panic!("{s}"))
    };
    let same = kl_of(&pn(&[
        "perplexity",
        "-m",
        f16,
        "--kl-divergence-base",
        k,
        "--kl-divergence",
        "-t",
        "2",
    ]));
    assert!(same < 1e-4, "{same}");
    let pn3 = kl_of(&pn(&[
        "perplexity",
        "--kl-divergence-base",
        k,
        "--kl-divergence",
        "-t",
        "2",
    ]));
    let eval = kl_of(&pn(&[
        "eval-kl",
        pn_runtime::DEMO_MODEL_PATH,
        "--kl-base",
        k,
        "--threads",
        "2",
    ]));
    assert!(pn3 > 1e-3 && pn3 < 0.5, "{pn3}");
    assert!(
        (eval - pn3).abs() < 0.2 * pn3,
        "eval-kl {eval} vs perplexity {pn3}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
