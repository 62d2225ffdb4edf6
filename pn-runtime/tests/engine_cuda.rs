//! The engine on a CUDA device against the engine on the CPU, on the demo PN3 model: prompt
//! logits, greedy transcripts (up to the first near tie), speculative decoding, the prompt cache
//! and the f16 / q8_0 KV caches.
//!
//! Needs a GPU: `cargo test -p pn-runtime --test engine_cuda -- --ignored` (also run by
//! `scripts/gpu-check.sh`). Without kernels, driver or device each test prints why and returns.

use pn_runtime::engine::{Device, Engine, EngineOptions, KvCacheType, Speculation, StopConditions};
use pn_runtime::sampling::SamplingParams;
use pn_tests::engine::greedy_tokens as generate;
use pn_tests::{data, max_abs as max_abs_diff, DEMO};
use qwen_model::cuda::CudaBackend;
use std::path::PathBuf;

/// Generated tokens compared per transcript.
const N_GEN: usize = 32;
/// Prompt tokens.
const N_PROMPT: usize = 32;
/// Agreement bound, as a fraction of the CPU logits' range (max - min) of the same row.
const REL_TOL: f32 = 1e-3;

/// A prompt whose CPU greedy continuation has no near tie in its first 32 tokens, so the
/// transcripts are compared in full.
const SOURCE: &str = "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n        self.items.append(item)\n\n    def pop(self):\n        return self.items.pop()\n";

/// The demo PN3 model, found through `PN_REPO_ROOT` when run from a copied checkout.
fn model_path() -> PathBuf {
    data(DEMO, "model-pn3.gguf")
}

/// Whether a CUDA backend opens here; prints why not.
fn have_gpu() -> bool {
    match CudaBackend::new(0) {
        Ok(_) => true,
        Err(e) => {
            eprintln!("skipped: no CUDA backend here: {e}");
            false
        }
    }
}

fn options(device: Device) -> EngineOptions {
    EngineOptions {
        device,
        threads: 4,
        context: 256,
        speculation: Speculation::None,
        ..EngineOptions::default()
    }
}

fn load(opts: EngineOptions) -> Engine {
    let device = opts.device;
    Engine::load(model_path(), opts).unwrap_or_else(|e| panic!("load on {device}: {e}"))
}

fn prompt(engine: &Engine) -> Vec<u32> {
    let ids = engine.tokenizer().encode(SOURCE).expect("tokenize");
    assert!(ids.len() >= N_PROMPT, "prompt has {} tokens", ids.len());
    ids[..N_PROMPT].to_vec()
}

fn range(row: &[f32]) -> f32 {
    let (lo, hi) = row
        .iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        });
    hi - lo
}

/// Asserts every `vocab`-long row of `got` is within `rel` of the range of the same row of
/// `want`.
fn assert_rows_close(what: &str, got: &[f32], want: &[f32], vocab: usize, rel: f32) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (t, (g, w)) in got.chunks(vocab).zip(want.chunks(vocab)).enumerate() {
        let r = range(w);
        let d = max_abs_diff(g, w);
        eprintln!("{what}: row {t}: max abs diff {d:.3e} (range {r:.3})");
        assert!(
            d <= rel * r,
            "{what}: row {t}: max abs diff {d} > {rel} x range {r}"
        );
    }
}

/// The allowed token with the largest logit, and its gap to the runner-up.
fn top2(engine: &Engine, logits: &[f32]) -> (u32, f32) {
    let mask = engine.token_mask();
    let (mut best, mut b1, mut b2) = (0u32, f32::NEG_INFINITY, f32::NEG_INFINITY);
    for (i, &x) in logits.iter().enumerate() {
        if !mask.allows(i as u32) {
            continue;
        }
        if x > b1 {
            b2 = b1;
            b1 = x;
            best = i as u32;
        } else if x > b2 {
            b2 = x;
        }
    }
    (best, b1 - b2)
}

/// Greedy decoding by hand (one `feed` per token): the tokens and the top-2 gap, relative to
/// the logits' range, before each of them.
fn greedy_with_gaps(engine: &Engine, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<f32>) {
    let mut s = engine.session().expect("session");
    let mut logits = s.feed(prompt).expect("prompt").to_vec();
    let (mut ids, mut gaps) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let (id, gap) = top2(engine, &logits);
        ids.push(id);
        gaps.push(gap / range(&logits));
        logits = s.feed(&[id]).expect("decode").to_vec();
    }
    (ids, gaps)
}

/// Positions before the first near tie (top-2 gap below [`REL_TOL`] of the range).
fn before_near_tie(gaps: &[f32]) -> usize {
    gaps.iter().position(|&g| g < REL_TOL).unwrap_or(gaps.len())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn prompt_logits_match_the_cpu() {
    if !have_gpu() {
        return;
    }
    let cpu = load(options(Device::Cpu));
    let gpu = load(options(Device::Cuda(0)));
    assert!(gpu.cpu_model().is_none() && gpu.cuda_model().is_some());
    assert_eq!(gpu.device(), Device::Cuda(0));
    let p = prompt(&cpu);
    let vocab = cpu.config().vocab;
    let want = cpu.session().unwrap().feed_all_logits(&p).unwrap();
    let got = gpu.session().unwrap().feed_all_logits(&p).unwrap();
    assert_rows_close("all-positions logits", &got, &want, vocab, REL_TOL);
    // The chunked prompt path (last row only) too.
    let want = cpu.session().unwrap().feed(&p).unwrap().to_vec();
    let got = gpu.session().unwrap().feed(&p).unwrap().to_vec();
    assert_rows_close("last-position logits", &got, &want, vocab, REL_TOL);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn greedy_transcript_matches_the_cpu_up_to_the_first_near_tie() {
    if !have_gpu() {
        return;
    }
    let cpu = load(options(Device::Cpu));
    let gpu = load(options(Device::Cuda(0)));
    let p = prompt(&cpu);
    let (want, gaps) = greedy_with_gaps(&cpu, &p, N_GEN);
    let k = before_near_tie(&gaps);
    eprintln!("cpu greedy: {want:?}; first near tie at {k}");
    let got = generate(&mut gpu.session().unwrap(), &p, N_GEN);
    eprintln!("gpu greedy: {got:?}");
    assert_eq!(got.len(), N_GEN);
    assert_eq!(
        got[..k],
        want[..k],
        "first {k} tokens (before any near tie)"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn speculative_greedy_on_cuda_equals_plain_greedy_on_cuda() {
    if !have_gpu() {
        return;
    }
    let plain = load(options(Device::Cuda(0)));
    let spec = load(EngineOptions {
        speculation: Speculation::default(),
        ..options(Device::Cuda(0))
    });
    let p = prompt(&plain);
    let (want, gaps) = greedy_with_gaps(&plain, &p, N_GEN);
    let k = before_near_tie(&gaps);
    let mut s = spec.session().unwrap();
    assert!(
        s.speculation_mut().is_some(),
        "the demo model drafts with MTP"
    );
    let stop = StopConditions {
        max_tokens: Some(N_GEN),
        ignore_eog: true,
        ..StopConditions::default()
    };
    let mut g = s.generate(&p[..], SamplingParams::greedy(), stop).unwrap();
    let got: Vec<u32> = g.by_ref().map(|e| e.unwrap().token.unwrap()).collect();
    let stats = g.spec_stats().expect("speculation on");
    eprintln!("speculative: {got:?}; {stats:?}; first near tie at {k}");
    assert!(
        stats.accepted > 0,
        "MTP drafts were never accepted: {stats:?}"
    );
    assert_eq!(got.len(), N_GEN);
    assert_eq!(
        got[..k],
        want[..k],
        "first {k} tokens (before any near tie)"
    );
}

/// A sequence that diverges from the session's is resumed from a prompt-cache checkpoint (a
/// device-side recurrent state copy) and gives the logits a fresh session computes.
#[test]
#[ignore = "needs a CUDA GPU"]
fn prompt_cache_resumes_on_cuda() {
    if !have_gpu() {
        return;
    }
    let gpu = load(EngineOptions {
        prompt_cache_interval: 8,
        speculation: Speculation::default(),
        ..options(Device::Cuda(0))
    });
    let p = prompt(&gpu);
    let mut other = p[..20].to_vec();
    other.extend_from_slice(&p[..12]);
    let greedy = SamplingParams::greedy;
    let mut s = gpu.session().unwrap();
    let first = generate(&mut s, &p, 4);
    assert_eq!(first.len(), 4);
    let g = s
        .generate_sequence(other.clone(), greedy(), StopConditions::max_tokens(0))
        .unwrap();
    let reused = g.timings().prompt_reused;
    g.text().unwrap();
    assert!(
        (8..=20).contains(&reused),
        "resumed from {reused} (checkpoints every 8 positions)"
    );
    let got = s.logits().expect("logits after the prompt").to_vec();
    let mut fresh = gpu.session().unwrap();
    let want = fresh.feed(&other).unwrap().to_vec();
    assert_rows_close("resumed logits", &got, &want, gpu.config().vocab, REL_TOL);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn f16_and_q8_0_kv_caches_run_on_cuda() {
    if !have_gpu() {
        return;
    }
    for kv in [KvCacheType::F16, KvCacheType::Q8_0] {
        let with_kv = |device| EngineOptions {
            kv_type_k: kv,
            kv_type_v: kv,
            ..options(device)
        };
        let cpu = load(with_kv(Device::Cpu));
        let gpu = load(with_kv(Device::Cuda(0)));
        let p = prompt(&cpu);
        let want = cpu.session().unwrap().feed_all_logits(&p).unwrap();
        let got = gpu.session().unwrap().feed_all_logits(&p).unwrap();
        // Both round the same keys and values to the cache type; an input a rounding step
        // apart may land on the neighbouring level, hence a looser bound than f32's.
        assert_rows_close(
            &format!("{kv} KV logits"),
            &got,
            &want,
            cpu.config().vocab,
            10.0 * REL_TOL,
        );
        let toks = generate(&mut gpu.session().unwrap(), &p, 8);
        assert_eq!(toks.len(), 8, "{kv}");
    }
}
