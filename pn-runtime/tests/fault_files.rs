//! A model file truncated while `pn run` has it mapped: pn exits with status 74
//! (`gguf_io::EXIT_FILE_CHANGED`) and a message naming the file, never a bare SIGBUS; with
//! `--no-mmap` the truncation changes nothing. And memory that does not fit: `pn serve
//! --parallel` too large for the machine is refused before allocating, with the numbers.

#![cfg(unix)]

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pn-fault-files-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A copy of the demo model (F16: the CPU backend reads its weights from the map every token).
fn model_copy(dir: &Path) -> PathBuf {
    let p = dir.join("model.gguf");
    std::fs::copy(pn_tests::data(pn_tests::DEMO, "model-f16.gguf"), &p).unwrap();
    p
}

/// `pn run` on `model`, generating until stopped.
fn spawn_run(model: &Path, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_pn"))
        .args(["run", "-m"])
        .arg(model)
        .args(["-p", "def f(x):", "-n", "-1", "--ignore-eos", "-c", "4096"])
        .args(["-t", "2", "--temp", "0", "--spec", "none"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Reads `n` bytes of the child's streamed completion (it is generating).
fn read_some(stdout: &mut impl Read, n: usize) {
    let mut buf = vec![0u8; 64];
    let mut seen = 0;
    while seen < n {
        let k = stdout.read(&mut buf).unwrap();
        assert!(k > 0, "pn ended early");
        seen += k;
    }
}

fn wait_with_timeout(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            panic!("pn still running {limit:?} after its model was truncated");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Truncating the mapped model mid-generation: exit 74, the file named, no signal death.
#[test]
fn truncated_model_under_pn_run_exits_74_naming_the_file() {
    let d = scratch("truncate");
    let model = model_copy(&d);
    let mut child = spawn_run(&model, &[]);
    let mut stdout = child.stdout.take().unwrap();
    read_some(&mut stdout, 20);
    // Keep the header page only: every tensor page is now past the end of the file.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&model)
        .unwrap()
        .set_len(4096)
        .unwrap();
    let status = wait_with_timeout(&mut child, Duration::from_secs(60));
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(
        status.signal(),
        None,
        "killed by a signal: {status:?} {err}"
    );
    assert_eq!(status.code(), Some(gguf_io::EXIT_FILE_CHANGED), "{err}");
    assert!(
        err.contains(&format!("error: {} changed while in use", model.display())),
        "{err}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

/// With `--no-mmap` the same truncation changes nothing: the generation goes on, and Ctrl-C
/// ends it cleanly.
#[test]
fn no_mmap_run_survives_truncation() {
    let d = scratch("no-mmap");
    let model = model_copy(&d);
    let mut child = spawn_run(&model, &["--no-mmap"]);
    let mut stdout = child.stdout.take().unwrap();
    read_some(&mut stdout, 20);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&model)
        .unwrap()
        .set_len(4096)
        .unwrap();
    // Many more tokens after the truncation (each a full forward pass over every weight).
    read_some(&mut stdout, 200);
    let killed = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?} {err}", out.status);
    std::fs::remove_dir_all(&d).unwrap();
}

/// `pn serve --parallel` whose KV caches cannot fit: refused at start with the per-slot,
/// total and available sizes, in well under the time an allocation of that size would take.
#[test]
fn parallel_that_does_not_fit_is_refused_with_the_numbers() {
    let t0 = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_pn"))
        .args([
            "serve",
            "--port",
            "0",
            "-c",
            "4096",
            "--parallel",
            "10000000",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert_eq!(out.status.signal(), None, "{err}");
    assert!(
        err.contains("10000000 parallel sessions of context 4096 need")
            && err.contains("MiB each")
            && err.contains("MiB of memory is available"),
        "{err}"
    );
    assert!(t0.elapsed() < Duration::from_secs(60), "{:?}", t0.elapsed());
}
