//! Faults while `pn quantize` / `pn convert` write or read files, exercised for real on the
//! binary: a file-size limit reached mid-write (RLIMIT_FSIZE set in the child before exec,
//! the kernel then fails the write with EFBIG exactly as a full disk fails it with ENOSPC),
//! SIGKILL at random points (never a partial file at the final path: the output is a hidden
//! temporary renamed when complete), and checkpoint shards that cannot be read (a dangling
//! symlink, a directory, a truncated file: tests may run as root, where `chmod 000` blocks
//! nothing).

#![cfg(unix)]

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod convert_fixture;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pn-fault-out-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn entries(d: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn demo() -> PathBuf {
    pn_tests::data(pn_tests::DEMO, "model-f16.gguf")
}

/// `pn quantize` of the demo model to `out` (the default mix), with the process's file-size
/// limit at `fsize` bytes when given.
fn quantize(out: &Path, fsize: Option<u64>) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pn"));
    c.args(["quantize", "--threads", "1", "--quiet"])
        .arg(demo())
        .arg(out)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(limit) = fsize {
        // SAFETY: setrlimit is async-signal-safe, as pre_exec requires.
        unsafe {
            c.pre_exec(move || {
                let lim = libc::rlimit {
                    rlim_cur: limit,
                    rlim_max: limit,
                };
                if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    c
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// No file can grow past 1 MiB: a clear "disk full" error naming the file that hit it (the
/// first is the ranking spill `.NAME.rank-PID` beside the output), exit 1 (not a SIGXFSZ
/// death: pn ignores that signal so the write fails instead), and nothing at the final path
/// nor a temporary left in the folder.
#[test]
fn out_of_space_while_quantizing_leaves_nothing() {
    let d = scratch("fsize");
    let out = d.join("m.q8.gguf");
    let o = quantize(&out, Some(1 << 20)).output().unwrap();
    let err = text(&o);
    assert_eq!(o.status.signal(), None, "killed by a signal: {err}");
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "disk full while writing {}/.m.q8.gguf.",
            d.display()
        )),
        "{err}"
    );
    assert!(!out.exists());
    assert!(entries(&d).is_empty(), "left behind: {:?}", entries(&d));
    std::fs::remove_dir_all(&d).unwrap();
}

/// The same for `pn convert` (checkpoint -> GGUF).
#[test]
fn out_of_space_while_converting_leaves_nothing() {
    let d = scratch("fsize-convert");
    let ck = d.join("ck");
    std::fs::create_dir_all(&ck).unwrap();
    convert_fixture::write_tiny_checkpoint(&ck);
    let out_dir = d.join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    let out = out_dir.join("m.gguf");
    let mut c = Command::new(env!("CARGO_BIN_EXE_pn"));
    c.arg("convert").arg(&ck).arg(&out).arg("--quiet");
    // SAFETY: setrlimit is async-signal-safe, as pre_exec requires.
    unsafe {
        c.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 1 << 20,
                rlim_max: 1 << 20,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let o = c.output().unwrap();
    let err = text(&o);
    assert_eq!(o.status.signal(), None, "killed by a signal: {err}");
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "writing {}: no space left on the device",
            out.display()
        )),
        "{err}"
    );
    assert!(
        entries(&out_dir).is_empty(),
        "left behind: {:?}",
        entries(&out_dir)
    );
    std::fs::remove_dir_all(&d).unwrap();
}

/// SIGKILL at spread-out points of a `pn quantize` (seeded, so a failure replays): the final
/// path is never a partial file; it is absent, or the complete output, byte for byte. What a
/// kill can leave are the hidden temporaries (`.m.gguf.partial-PID`, the ranking spill
/// `.m.gguf.rank-PID`), never anything under the final name. `PN_FAULT_KILLS` kill points
/// (default 3, to keep CI fast).
#[test]
fn sigkill_during_quantize_never_leaves_a_partial_output() {
    let d = scratch("sigkill");
    // The complete output, and how long it takes.
    let full = d.join("full.gguf");
    let t0 = Instant::now();
    let o = quantize(&full, None).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let took = t0.elapsed();
    let want = std::fs::read(&full).unwrap();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut outcomes = Vec::new();
    let kills: usize = std::env::var("PN_FAULT_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    for i in 0..kills {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        // Points from the start to 20% past the measured duration (the last may finish).
        let frac = (seed >> 11) as f64 / (1u64 << 53) as f64 * 1.2;
        let delay = took.mul_f64(frac);
        let kd = d.join(format!("k{i}"));
        std::fs::create_dir_all(&kd).unwrap();
        let out = kd.join("m.gguf");
        let mut child = quantize(&out, None).stderr(Stdio::null()).spawn().unwrap();
        std::thread::sleep(delay);
        let _ = child.kill();
        let status = child.wait().unwrap();
        let left = entries(&kd);
        match std::fs::read(&out) {
            Ok(bytes) => assert!(bytes == want, "kill {i} at {delay:?}: partial output"),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::NotFound),
        }
        for name in &left {
            assert!(
                name == "m.gguf"
                    || name.starts_with(".m.gguf.partial-")
                    || name.starts_with(".m.gguf.rank-"),
                "kill {i}: unexpected {name}"
            );
        }
        outcomes.push(format!("{delay:?}: {status} -> {left:?}"));
    }
    eprintln!("full run {took:?}; kills: {outcomes:#?}");
    std::fs::remove_dir_all(&d).unwrap();
}

/// `pn convert` of a checkpoint whose shard cannot be read: a dangling symlink, a directory in
/// its place, a truncated file, and an index naming a shard that is a dangling symlink. Each
/// is an error naming the shard, and no output is written.
#[test]
fn unreadable_shard_is_an_error_naming_it() {
    let d = scratch("shard");
    let good = d.join("good");
    std::fs::create_dir_all(&good).unwrap();
    convert_fixture::write_tiny_checkpoint(&good);
    let shard_bytes = std::fs::read(good.join("model.safetensors")).unwrap();
    type Breaker = fn(&Path, &[u8]);
    let cases: [(&str, Breaker); 4] = [
        ("dangling", |ck, _| {
            std::os::unix::fs::symlink(ck.join("gone.safetensors"), ck.join("model.safetensors"))
                .unwrap()
        }),
        ("directory", |ck, _| {
            std::fs::create_dir(ck.join("model.safetensors")).unwrap()
        }),
        ("truncated", |ck, b| {
            std::fs::write(ck.join("model.safetensors"), &b[..b.len() / 2]).unwrap()
        }),
        ("indexed-dangling", |ck, _| {
            std::fs::write(
                ck.join("model.safetensors.index.json"),
                r#"{"weight_map": {"model.embed_tokens.weight": "model-00001-of-00001.safetensors"}}"#,
            )
            .unwrap();
            std::os::unix::fs::symlink(
                ck.join("gone.safetensors"),
                ck.join("model-00001-of-00001.safetensors"),
            )
            .unwrap()
        }),
    ];
    for (name, breaker) in cases {
        let ck = d.join(name);
        std::fs::create_dir_all(&ck).unwrap();
        convert_fixture::copy_side_files(&ck);
        breaker(&ck, &shard_bytes);
        let out = d.join(format!("{name}.gguf"));
        let o = Command::new(env!("CARGO_BIN_EXE_pn"))
            .arg("convert")
            .arg(&ck)
            .arg(&out)
            .arg("--quiet")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = text(&o);
        assert_eq!(o.status.signal(), None, "{name}: {err}");
        assert!(!o.status.success(), "{name}: {err}");
        assert!(
            err.contains("safetensors"),
            "{name}: the shard is not named: {err}"
        );
        assert!(!out.exists(), "{name}: output written");
        eprintln!("{name}: {}", err.trim());
    }
    // The same checkpoint whole converts (so the failures above are the shard's).
    let t0 = Instant::now();
    let o = Command::new(env!("CARGO_BIN_EXE_pn"))
        .arg("convert")
        .arg(&good)
        .arg(d.join("good.gguf"))
        .arg("--quiet")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(t0.elapsed() < Duration::from_secs(120));
    std::fs::remove_dir_all(&d).unwrap();
}
