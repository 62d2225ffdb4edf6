//! The `pn run`, `pn bench` and `pn perplexity` commands, running the built binary.

mod common;

use common::pn;
use pn_tests::{data, DEMO};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The README's first command, with a small token count: the demo model by default.
#[test]
fn run_on_the_demo_model_end_to_end() {
    let out = pn(&[
        "run",
        "-p",
        "def fibonacci(n):",
        "-n",
        "12",
        "--temp",
        "0",
        "-t",
        "2",
    ]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.starts_with("def fibonacci(n):"), "{stdout}");
    assert!(
        stdout.len() > "def fibonacci(n):".len() + 5,
        "no completion: {stdout:?}"
    );
    assert!(
        stderr.contains("DEMO model") && stderr.contains("-m"),
        "{stderr}"
    );
    assert!(
        stderr.contains("generation 12 tokens") && stderr.contains("tokens/s"),
        "{stderr}"
    );
    // Greedy: the same command gives the same text.
    let again = pn(&[
        "run",
        "-p",
        "def fibonacci(n):",
        "-n",
        "12",
        "--temp",
        "0",
        "-t",
        "2",
    ]);
    assert_eq!(text(&again.stdout), stdout);
}

#[test]
fn bench_json_parses_as_documented() {
    let out = pn(&[
        "bench", "-p", "16", "-n", "4", "-d", "0,8", "-r", "2", "-o", "json", "-t", "2",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let rows = v.as_array().unwrap();
    let tests: Vec<&str> = rows.iter().map(|r| r["test"].as_str().unwrap()).collect();
    assert_eq!(tests, ["pp16", "tg4", "pp16 @ d8", "tg4 @ d8"]);
    for r in rows {
        assert_eq!(r["repetitions"], 2);
        assert_eq!(r["samples_ts"].as_array().unwrap().len(), 2);
        assert_eq!(r["samples_ns"].as_array().unwrap().len(), 2);
        let avg = r["avg_ts"].as_f64().unwrap();
        assert!(avg > 0.0 && avg.is_finite());
        assert!(r["stddev_ts"].as_f64().unwrap() >= 0.0);
        assert_eq!(r["backend"], "CPU");
        assert_eq!(r["n_threads"], 2);
        // The step is capped by the longest prompt or depth, but not below the engine's 64.
        assert_eq!(r["n_ubatch"], 64);
        assert!(r["model_size"].as_u64().unwrap() > 1_000_000);
        assert!(r["model_n_params"].as_u64().unwrap() > 10_000_000);
    }
    assert_eq!(rows[2]["n_depth"], 8);
    assert_eq!(rows[0]["n_prompt"], 16);
    assert_eq!(rows[1]["n_gen"], 4);
    // The demo model has an MTP head: tg tests draft by default and report it.
    assert_eq!(rows[1]["spec"], "mtp");
    let tpp = rows[1]["spec_tokens_per_pass"].as_f64().unwrap();
    assert!((1.0..=3.0).contains(&tpp), "{tpp}");
    assert!(rows[0].get("spec").is_none(), "pp tests do not draft");
}

#[test]
fn bench_ubatch_flag_sets_the_prefill_step() {
    let out = pn(&[
        "bench", "-p", "8", "-n", "0", "-r", "1", "-o", "json", "-t", "2", "-ub", "32", "-b", "16",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    // `-b` caps `-ub`, as in llama.cpp.
    assert_eq!(v[0]["n_ubatch"], 16);
    // Without `-ub`: llama-bench's 512 once a prompt is that long, else the longest prompt.
    let out = pn(&[
        "bench", "-p", "600", "-n", "0", "-r", "1", "-o", "json", "-t", "2",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v[0]["n_ubatch"], 512);
    let out = pn(&[
        "bench", "-p", "100", "-n", "0", "-r", "1", "-o", "json", "-t", "2",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v[0]["n_ubatch"], 100);
}

#[test]
fn bench_markdown_table() {
    let out = pn(&["bench", "-p", "8", "-n", "2", "-r", "1", "-t", "2"]);
    let s = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        s.starts_with("| model | size | params | backend | threads | test | t/s |"),
        "{s}"
    );
    assert!(s.contains("| pp8 |") && s.contains("| tg2 |"), "{s}");
}

/// The demo model's F16 original on its 128 validation tokens: transformers measured 3.8381
/// nats/token with the same weights (all 127 predictions of one window).
#[test]
fn perplexity_of_the_demo_model_matches_transformers() {
    let model = pn_runtime::DEMO_MODEL_F16_PATH;
    let tokens = data(DEMO, "tokens_val.json").display().to_string();
    let logits = data(DEMO, "logits_val.f32").display().to_string();
    let out = pn(&[
        "perplexity",
        "-m",
        model,
        "--tokens",
        &tokens,
        "--kl-base",
        &logits,
        // Every position, as transformers scores them (llama-perplexity's windows score the
        // second half only; see cli_llama.rs).
        "--all-positions",
        "-t",
        "2",
    ]);
    let s = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let ce: f64 = s
        .split("cross-entropy ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|x| x.parse().ok())
        .unwrap_or_else(|| panic!("{s}"));
    assert!((ce - 3.8381).abs() < 0.01, "CE {ce}\n{s}");
    let kl: f64 = s
        .split("mean ")
        .nth(1)
        .and_then(|r| r.trim_end_matches(',').split(',').next())
        .and_then(|x| x.trim().parse().ok())
        .unwrap_or_else(|| panic!("{s}"));
    assert!(
        kl < 1e-3,
        "KL against the transformers logits of the same weights: {kl}\n{s}"
    );
}

#[test]
fn errors_name_the_problem() {
    let out = pn(&["run", "-m", "/nonexistent/model.gguf", "-p", "x", "-n", "1"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("not found: /nonexistent/model.gguf"),
        "{}",
        text(&out.stderr)
    );

    let readme = data(DEMO, "README.md").display().to_string();
    let out = pn(&["run", "-m", &readme, "-p", "x", "-n", "1"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("not a GGUF file"),
        "{}",
        text(&out.stderr)
    );

    let out = pn(&["run", "--device", "tpu", "-p", "x", "-n", "1"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("unknown device `tpu`"),
        "{}",
        text(&out.stderr)
    );

    // Without a usable GPU, `--device cuda` fails with the device and the reason, no panic.
    if let Err(why) = qwen_model::cuda::CudaBackend::availability(0) {
        let out = pn(&["run", "--device", "cuda", "-p", "hi", "-n", "2"]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains("cuda:0"), "{err}");
        assert!(
            err.contains("libcuda") || err.contains("no CUDA kernels"),
            "{err} ({why})"
        );
        assert!(!err.contains("panicked"), "{err}");
    }

    let out = pn(&["run", "-c", "100000", "-p", "x", "-n", "1"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("larger than the model supports (4096"),
        "{}",
        text(&out.stderr)
    );
}
