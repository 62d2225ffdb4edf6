//! `LogitsPath::Candidates` (the device decode path: the logits stay on the backend and only
//! the sampler's best candidates come back) forced on the CPU backend gives the same tokens as
//! `LogitsPath::FullRow` (every row downloaded), for greedy and seeded sampled generations,
//! alone, with MTP speculation (drafts judged from candidates) and in a batch (with a
//! log-probability sequence beside, which reads its whole row). `candidate_rows` shows the
//! candidates path was taken.

use pn_runtime::engine::batch::{Batch, BatchEvent, BatchOptions, SeqOptions};
use pn_runtime::engine::{candidate_rows, KvCacheType, LogitsPath, Prompt, Speculation};
use pn_runtime::{Engine, EngineOptions, SamplingParams, StopConditions};
use std::collections::HashMap;
use std::sync::OnceLock;

/// The demo model on 2 threads, f32 KV cache, speculating as `spec`, decoding along `path`.
fn load(spec: Speculation, path: LogitsPath) -> Engine {
    let o = EngineOptions {
        threads: 2,
        context: 256,
        kv_type_k: KvCacheType::F32,
        kv_type_v: KvCacheType::F32,
        speculation: spec,
        logits_path: path,
        ..EngineOptions::default()
    };
    Engine::load(pn_runtime::DEMO_MODEL_PATH, o).expect("demo model")
}

/// The four engines: `[plain, mtp]` x `[full row, candidates]`.
fn engine(mtp: bool, candidates: bool) -> &'static Engine {
    static E: [OnceLock<Engine>; 4] = [const { OnceLock::new() }; 4];
    let i = usize::from(mtp) * 2 + usize::from(candidates);
    E[i].get_or_init(|| {
        let spec = if mtp {
            Speculation::Mtp { draft: 3 }
        } else {
            Speculation::None
        };
        let path = if candidates {
            LogitsPath::Candidates
        } else {
            LogitsPath::FullRow
        };
        load(spec, path)
    })
}

const SOURCE: &str = "def most_common(self, n):\n    items = sorted(self.counts.items(), key=lambda kv: -kv[1])\n    return items[:n]\n\n\nclass Counter:\n    def __init__(self):\n";

fn prompt(e: &Engine, skip: usize) -> Vec<u32> {
    e.tokenizer().encode(SOURCE).unwrap()[skip..].to_vec()
}

fn stop(max: usize) -> StopConditions {
    StopConditions {
        max_tokens: Some(max),
        ignore_eog: true,
        ..StopConditions::default()
    }
}

/// Greedy; seeded top-k + top-p (+ min-p) sampling (the candidates path); top-p off (falls
/// back to the whole row on the candidates engine).
fn params() -> Vec<SamplingParams> {
    let sampled = |seed, top_k, top_p, min_p| SamplingParams {
        temperature: 0.9,
        top_k,
        top_p,
        min_p,
        seed,
        ..SamplingParams::default()
    };
    vec![
        SamplingParams::greedy(),
        sampled(7, 40, 0.95, 0.0),
        sampled(11, 8, 0.8, 0.05),
        sampled(3, 20, 1.0, 0.0),
    ]
}

fn alone(e: &Engine, p: &[u32], params: SamplingParams, max: usize) -> Vec<u32> {
    let mut s = e.session().unwrap();
    s.generate_sequence(Prompt::Tokens(p.to_vec()), params, stop(max))
        .unwrap()
        .map(|t| t.unwrap().token.unwrap())
        .collect()
}

fn lone_case(mtp: bool) {
    let (full, cand) = (engine(mtp, false), engine(mtp, true));
    for (i, params) in params().into_iter().enumerate() {
        let p = prompt(full, i);
        let before = candidate_rows();
        let want = alone(full, &p, params.clone(), 24);
        let got = alone(cand, &p, params.clone(), 24);
        assert_eq!(got, want, "mtp {mtp}, params {params:?}");
        if params.top_p < 1.0 {
            assert!(
                candidate_rows() > before,
                "the candidates path was not taken"
            );
        }
    }
}

#[test]
fn lone_generations_are_the_same_from_candidates() {
    lone_case(false);
}

#[test]
fn speculative_generations_are_the_same_from_candidates() {
    lone_case(true);
}

/// Every request of `params()` plus a log-probability one, in one batch of 3 slots (they
/// join at different steps): each request's tokens, and the logprob request's values.
fn batch_run(e: &Engine) -> (Vec<Vec<u32>>, Vec<f32>) {
    let mut b = Batch::new(
        e,
        BatchOptions {
            slots: 3,
            prefill_chunk: 16,
        },
    )
    .unwrap();
    let mut reqs: Vec<(SamplingParams, Option<usize>)> =
        params().into_iter().map(|p| (p, None)).collect();
    reqs.push((SamplingParams::greedy(), Some(2)));
    let mut ids = HashMap::new();
    let mut toks = vec![Vec::new(); reqs.len()];
    let mut lps = Vec::new();
    let (mut next, mut done, mut step) = (0, 0, 0);
    while done < reqs.len() {
        if next < reqs.len() && b.active() < 3 && step % 2 == 0 {
            let (params, logprobs) = reqs[next].clone();
            let opts = SeqOptions {
                logprobs,
                ..SeqOptions::default()
            };
            let id = b
                .add_with(Prompt::Tokens(prompt(e, next)), params, stop(16), opts)
                .unwrap();
            ids.insert(id, next);
            next += 1;
        }
        for ev in b.step().unwrap() {
            if let BatchEvent::Token {
                id, event, logprob, ..
            } = ev
            {
                let r = ids[&id];
                toks[r].extend(event.token);
                if let Some(lp) = logprob {
                    lps.push(lp.logprob);
                }
                if event.finish.is_some() {
                    done += 1;
                }
            }
        }
        step += 1;
        assert!(step < 2000, "the batch does not finish");
    }
    (toks, lps)
}

fn batch_case(mtp: bool) {
    let before = candidate_rows();
    let (want, want_lp) = batch_run(engine(mtp, false));
    let (got, got_lp) = batch_run(engine(mtp, true));
    assert_eq!(got, want, "mtp {mtp}");
    assert!(!want_lp.is_empty());
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(&got_lp),
        bits(&want_lp),
        "the logprob row is downloaded whole"
    );
    assert!(
        candidate_rows() > before,
        "the candidates path was not taken"
    );
}

#[test]
fn batched_generations_are_the_same_from_candidates() {
    batch_case(false);
}

#[test]
fn batched_speculative_generations_are_the_same_from_candidates() {
    batch_case(true);
}
