//! Greedy MTP speculative decoding gives exactly plain greedy decoding's tokens.

use pn_runtime::speculative::{greedy_generate, plain_greedy, Drafter};
use pn_tests::data;
use qwen_model::{CpuBackend, Model};
use std::path::PathBuf;

fn tokens(dir: &str, file: &str) -> Vec<u32> {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data(dir, file)).unwrap()).unwrap();
    v["tokens"]
        .as_array()
        .expect("tokens array")
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}

fn plain(m: &Model<CpuBackend>, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut st = m.new_state(prompt.len() + n + 8).unwrap();
    let mut ws = m.new_workspace(32).unwrap();
    plain_greedy(m, &mut st, &mut ws, prompt, n).unwrap()
}

/// Proposes the true continuation (always accepted) or its shifted tokens (always rejected).
struct Forced {
    truth: Vec<u32>,
    reject: bool,
    vocab: u32,
}

impl Drafter for Forced {
    fn draft(&mut self, seq: &[u32], n: usize) -> Vec<u32> {
        assert_eq!(
            &self.truth[..seq.len()],
            seq,
            "drafter sees the plain sequence"
        );
        let end = (seq.len() + n).min(self.truth.len());
        self.truth[seq.len()..end]
            .iter()
            .map(|&t| if self.reject { (t + 1) % self.vocab } else { t })
            .collect()
    }
}

fn check_model(path: PathBuf, prompt: &[u32], n_new: usize) {
    let m = Model::load(path, CpuBackend::new(2)).expect("model");
    let want = plain(&m, prompt, n_new);
    assert_eq!(want.len(), n_new);
    for nd in 1..=4 {
        let mut st = m.new_state(prompt.len() + n_new + 8).unwrap();
        let mut ws = m.new_workspace(32).unwrap();
        let (got, stats) = greedy_generate(&m, &mut st, &mut ws, prompt, n_new, nd, None).unwrap();
        eprintln!(
            "N={nd}: acceptance {:.2}, {:.2} tokens/pass, {stats:?}",
            stats.acceptance_rate(),
            stats.tokens_per_pass()
        );
        assert_eq!(got, want, "MTP drafting with N={nd} changed the output");
        assert!(stats.drafted > 0);
    }
    let mut truth = prompt.to_vec();
    truth.extend(&want);
    for reject in [false, true] {
        let mut dr = Forced {
            truth: truth.clone(),
            reject,
            vocab: m.config.vocab as u32,
        };
        let mut st = m.new_state(prompt.len() + n_new + 8).unwrap();
        let mut ws = m.new_workspace(32).unwrap();
        let (got, stats) =
            greedy_generate(&m, &mut st, &mut ws, prompt, n_new, 3, Some(&mut dr)).unwrap();
        assert_eq!(got, want, "forced reject={reject}");
        if reject {
            assert_eq!(stats.accepted, 0);
            assert_eq!(stats.target_passes as usize, n_new - 1);
            assert!(stats.rollbacks > 0);
        } else {
            assert_eq!(stats.accepted, stats.drafted);
            assert_eq!(stats.rollbacks, 0);
            // 4 tokens per pass: (n_new - 1) / 4 passes rounded up.
            assert_eq!(stats.target_passes as usize, (n_new - 1).div_ceil(4));
        }
    }
}

#[test]
fn tiny_model_mtp_greedy_equals_plain() {
    let prompt = tokens("tiny-qwen35", "tokens_a.json");
    check_model(data("tiny-qwen35", "model-f16.gguf"), &prompt, 21);
}

#[test]
fn demo_model_mtp_greedy_equals_plain() {
    let toks = tokens("demo-code-model", "tokens_val.json");
    check_model(data("demo-code-model", "model-f16.gguf"), &toks[..24], 21);
}

/// Process CPU time (user + system) in seconds, from /proc (Linux; 0 elsewhere).
fn cpu_seconds() -> f64 {
    let Ok(s) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    let f: Vec<&str> = s
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

/// Measurement (run with `--ignored --nocapture`): wall and CPU time per token on the demo
/// model, plain vs MTP drafting.
#[test]
#[ignore]
fn measure_demo_model_speed() {
    let m = Model::load(
        data("demo-code-model", "model-f16.gguf"),
        CpuBackend::new(2),
    )
    .unwrap();
    let toks = tokens("demo-code-model", "tokens_val.json");
    let (prompt, n) = (&toks[..32], 64);
    let t = (std::time::Instant::now(), cpu_seconds());
    let want = plain(&m, prompt, n);
    let (w, c) = (t.0.elapsed().as_secs_f64(), cpu_seconds() - t.1);
    eprintln!(
        "plain: {:.1} tok/s wall, {:.2} ms CPU/token",
        n as f64 / w,
        1e3 * c / n as f64
    );
    for nd in 1..=4 {
        let mut st = m.new_state(prompt.len() + n + 8).unwrap();
        let mut ws = m.new_workspace(32).unwrap();
        let t = (std::time::Instant::now(), cpu_seconds());
        let (got, s) = greedy_generate(&m, &mut st, &mut ws, prompt, n, nd, None).unwrap();
        let (w, c) = (t.0.elapsed().as_secs_f64(), cpu_seconds() - t.1);
        assert_eq!(got, want);
        eprintln!(
            "MTP N={nd}: {:.1} tok/s wall, {:.2} ms CPU/token, acceptance {:.2}, {:.2} tok/pass, {s:?}",
            n as f64 / w,
            1e3 * c / n as f64,
            s.acceptance_rate(),
            s.tokens_per_pass()
        );
    }
}
