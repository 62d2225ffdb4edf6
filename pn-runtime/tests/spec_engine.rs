//! Speculative decoding through the engine: greedy output identical to plain decoding (tiny
//! model, a PN3-quantized one, the demo model and its F16 original; MTP drafts with N = 1..4,
//! forced always-accepted and always-rejected drafts, with their acceptance and pass counts), sessions left consistent when a generation stops inside an accepted
//! run, and sampled output with the target distribution (a chi-square test that a wrong
//! acceptance rule fails).

use pn_runtime::engine::{CancelToken, Engine, FinishReason, Session, Speculation, StopConditions};
use pn_runtime::sampling::{Sampler, SamplingParams, TokenDist};
use pn_runtime::speculative::{AcceptRule, Drafter};
use std::sync::atomic::AtomicBool;
use std::sync::OnceLock;

// The cached engines of the shared kit (2 threads, 512-token context): `tiny()` the tiny oracle
// model, `demo()` the shipped PN3 demo, `demo_f16()` its F16 original.
use pn_tests::engine::{
    demo_engine as demo, demo_f16_engine as demo_f16, engine_options as options,
    tiny_engine as tiny,
};
use pn_tests::{data_dir, read_tokens, tiny as tiny_file};

/// The tiny model quantized with `pn quantize`'s default PN3 mix.
fn tiny_pn3() -> &'static Engine {
    static E: OnceLock<Engine> = OnceLock::new();
    E.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("pn-spec-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("tiny-pn3.gguf");
        let mut o = pn_runtime::quantize::QuantizeOptions::new(tiny_file("model-f16.gguf"), &out);
        o.threads = 2;
        pn_runtime::quantize::quantize_model(
            &o,
            &pn_runtime::quantize::no_progress,
            &AtomicBool::new(false),
        )
        .expect("quantize");
        let e = Engine::load(&out, options()).expect("PN3 tiny");
        let _ = std::fs::remove_dir_all(&dir);
        e
    })
}

fn prompt_a() -> Vec<u32> {
    tokens_of("tiny-qwen35/tokens_a.json")
}

/// The `tokens` array of a JSON file under tests/data.
fn tokens_of(rel: &str) -> Vec<u32> {
    read_tokens(&data_dir().join(rel))
}

fn until(n: usize) -> StopConditions {
    StopConditions {
        max_tokens: Some(n),
        ignore_eog: true,
        ..StopConditions::default()
    }
}

/// Runs a generation to its end: (tokens, finish).
fn gen(
    s: &mut Session,
    prompt: Vec<u32>,
    params: SamplingParams,
    stop: StopConditions,
) -> (Vec<u32>, FinishReason) {
    let mut g = s.generate(prompt, params, stop).unwrap();
    let toks: Vec<u32> = g.by_ref().filter_map(|e| e.unwrap().token).collect();
    (toks, g.finish_reason().cloned().unwrap())
}

fn plain_greedy(engine: &Engine, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut s = engine.session().unwrap();
    s.set_speculation(Speculation::None);
    assert!(s.speculation_mut().is_none());
    gen(&mut s, prompt.to_vec(), SamplingParams::greedy(), until(n)).0
}

/// Proposes the known greedy continuation (always accepted) or wrong tokens (always rejected).
struct Forced {
    truth: Vec<u32>,
    reject: bool,
    vocab: u32,
}

impl Drafter for Forced {
    fn draft(&mut self, seq: &[u32], n: usize) -> Vec<u32> {
        assert_eq!(&self.truth[..seq.len()], seq, "drafter sees the sequence");
        let end = (seq.len() + n).min(self.truth.len());
        self.truth[seq.len()..end]
            .iter()
            .map(|&t| if self.reject { (t + 1) % self.vocab } else { t })
            .collect()
    }
}

fn forced(engine: &Engine, truth: &[u32], reject: bool) -> Box<dyn Drafter + Send> {
    Box::new(Forced {
        truth: truth.to_vec(),
        reject,
        vocab: engine.config().vocab as u32,
    })
}

fn check_greedy_equal(engine: &Engine, prompt: &[u32], n: usize) {
    let want = plain_greedy(engine, prompt, n);
    assert_eq!(want.len(), n);
    for nd in 1..=4 {
        let mut s = engine.session().unwrap();
        s.set_speculation(Speculation::Mtp { draft: nd });
        let mut g = s
            .generate(prompt.to_vec(), SamplingParams::greedy(), until(n))
            .unwrap();
        let got: Vec<u32> = g.by_ref().filter_map(|e| e.unwrap().token).collect();
        let st = g.spec_stats().unwrap();
        eprintln!(
            "N={nd}: acceptance {:.2}, {:.2} tokens/pass, {st:?}",
            st.acceptance_rate(),
            st.tokens_per_pass()
        );
        assert_eq!(got, want, "MTP drafting with N={nd} changed the output");
        assert!(st.drafted > 0 && st.target_passes > 0);
        drop(g);
        assert_eq!(s.tokens(), [prompt, &want[..]].concat());
    }
    let truth = [prompt, &want[..]].concat();
    for reject in [false, true] {
        let mut s = engine.session().unwrap();
        s.set_speculation(Speculation::Mtp { draft: 3 });
        s.speculation_mut()
            .unwrap()
            .set_drafter(Some(forced(engine, &truth, reject)));
        let mut g = s
            .generate(prompt.to_vec(), SamplingParams::greedy(), until(n))
            .unwrap();
        let got: Vec<u32> = g.by_ref().filter_map(|e| e.unwrap().token).collect();
        let st = g.spec_stats().unwrap();
        assert_eq!(got, want, "forced reject={reject}");
        if reject {
            assert_eq!(st.accepted, 0);
            assert!(st.rollbacks > 0);
            assert_eq!(st.target_passes as usize, n - 1);
            // Drafts that are always wrong make drafting pause (the back-off).
            if n > 8 {
                assert!(st.paused_steps > 0, "{st:?}");
            }
        } else {
            assert_eq!(st.accepted, st.drafted);
            assert_eq!(st.rollbacks, 0);
            assert_eq!(st.paused_steps, 0);
            // The first token comes from the prompt pass, then 4 tokens per pass.
            assert_eq!(st.target_passes as usize, (n - 1).div_ceil(4));
        }
    }
}

#[test]
fn greedy_with_speculation_equals_plain_greedy_tiny() {
    check_greedy_equal(tiny(), &prompt_a(), 21);
}

#[test]
fn greedy_with_speculation_equals_plain_greedy_pn3() {
    check_greedy_equal(tiny_pn3(), &prompt_a(), 21);
}

#[test]
fn greedy_with_speculation_equals_plain_greedy_demo() {
    let prompt = demo().tokenizer().encode("def fibonacci(n):\n").unwrap();
    check_greedy_equal(demo(), &prompt, 24);
}

/// The F16 original of the demo model, on a validation-text prompt.
#[test]
fn greedy_with_speculation_equals_plain_greedy_demo_f16() {
    let toks = tokens_of("demo-code-model/tokens_val.json");
    check_greedy_equal(demo_f16(), &toks[..24], 21);
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
/// model's F16 original, plain vs MTP drafting.
#[test]
#[ignore]
fn measure_demo_model_speed() {
    let engine = demo_f16();
    let toks = tokens_of("demo-code-model/tokens_val.json");
    let (prompt, n) = (&toks[..32], 64);
    let t = (std::time::Instant::now(), cpu_seconds());
    let want = plain_greedy(engine, prompt, n);
    let (w, c) = (t.0.elapsed().as_secs_f64(), cpu_seconds() - t.1);
    eprintln!(
        "plain: {:.1} tok/s wall, {:.2} ms CPU/token",
        n as f64 / w,
        1e3 * c / n as f64
    );
    for nd in 1..=4 {
        let mut s = engine.session().unwrap();
        s.set_speculation(Speculation::Mtp { draft: nd });
        let t = (std::time::Instant::now(), cpu_seconds());
        let mut g = s
            .generate(prompt.to_vec(), SamplingParams::greedy(), until(n))
            .unwrap();
        let got: Vec<u32> = g.by_ref().filter_map(|e| e.unwrap().token).collect();
        let (w, c) = (t.0.elapsed().as_secs_f64(), cpu_seconds() - t.1);
        let st = g.spec_stats().unwrap();
        assert_eq!(got, want);
        eprintln!(
            "MTP N={nd}: {:.1} tok/s wall, {:.2} ms CPU/token, acceptance {:.2}, {:.2} tok/pass, {st:?}",
            n as f64 / w,
            1e3 * c / n as f64,
            st.acceptance_rate(),
            st.tokens_per_pass()
        );
    }
}

/// A session whose generation stopped at `cut` (inside a forced, always-accepted run) holds
/// exactly the emitted tokens: its state continues exactly like a never-speculated session.
fn check_consistent_after(engine: &Engine, prompt: &[u32], emitted: &[u32], s: &mut Session) {
    let want_all = plain_greedy(engine, prompt, emitted.len() + 6);
    assert_eq!(emitted, &want_all[..emitted.len()]);
    assert_eq!(s.tokens(), [prompt, emitted].concat());
    let (more, _) = gen(s, Vec::new(), SamplingParams::greedy(), until(6));
    assert_eq!(
        more,
        &want_all[emitted.len()..],
        "continuation after the stop"
    );
    // And the logits match a plain session fed the same tokens, the prompt as a prompt (its
    // rows before the last may take the state-only rows' kernels, `Backend::set_state_rows`,
    // as the speculative session's prefill did) and the generated tokens as rows whose logits
    // are read (as the verification passes read them).
    let all = s.tokens();
    let got = s.feed(&[]).unwrap().to_vec();
    let mut p = engine.session().unwrap();
    p.set_speculation(Speculation::None);
    p.feed(prompt).unwrap();
    let rows = p.feed_all_logits(&all[prompt.len()..]).unwrap();
    let want = rows[rows.len() - got.len()..].to_vec();
    let diff = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    // Not bit-exact: the two sessions group the generated rows into passes differently, and a
    // pass's row count picks fused kernels or PN tiles, which take the same int16 activations
    // but sum blocks in another f32 order; a last-bit change upstream can move an activation by
    // one int16 step (logits then differ by ~1e-4, printed; a wrong state or rollback moves them
    // by far more than 1e-3).
    eprintln!("speculative vs plain logits: max abs diff {diff:e}");
    assert!(diff < 5e-4, "logits differ by {diff}");
}

fn forced_session(engine: &Engine, truth: &[u32]) -> Session {
    let mut s = engine.session().unwrap();
    s.set_speculation(Speculation::Mtp { draft: 4 });
    s.speculation_mut()
        .unwrap()
        .set_drafter(Some(forced(engine, truth, false)));
    s
}

#[test]
fn stopping_inside_an_accepted_run_leaves_the_session_consistent() {
    let engine = tiny();
    let prompt = prompt_a();
    let truth = [&prompt[..], &plain_greedy(engine, &prompt, 40)].concat();
    let gen_tok = |i: usize| truth[prompt.len() + i];

    // A stop token that is the 3rd token of the first 5-token run (tokens 1..=5 come from the
    // first verification pass): the generation ends on it, mid-run.
    let mut s = forced_session(engine, &truth);
    let stop = StopConditions {
        tokens: vec![gen_tok(3)],
        ..until(30)
    };
    let (toks, finish) = gen(&mut s, prompt.clone(), SamplingParams::greedy(), stop);
    assert_eq!(finish, FinishReason::EndOfGeneration);
    let first = truth[prompt.len()..]
        .iter()
        .position(|&t| t == gen_tok(3))
        .unwrap();
    assert_eq!(toks.len(), first + 1);
    check_consistent_after(engine, &prompt, &toks, &mut s);

    // Cancelled after 7 tokens (inside the second run).
    let mut s = forced_session(engine, &truth);
    let cancel = CancelToken::new();
    let mut g = s
        .generate(
            prompt.clone(),
            SamplingParams::greedy(),
            until(30).with_cancel(cancel.clone()),
        )
        .unwrap();
    let mut toks = Vec::new();
    for e in g.by_ref() {
        let e = e.unwrap();
        toks.extend(e.token);
        if toks.len() == 7 {
            cancel.cancel();
        }
    }
    assert_eq!(g.finish_reason(), Some(&FinishReason::Cancelled));
    drop(g);
    assert_eq!(toks.len(), 7);
    check_consistent_after(engine, &prompt, &toks, &mut s);

    // max_tokens inside what the drafter would propose: drafting stops at the budget.
    let mut s = forced_session(engine, &truth);
    let (toks, finish) = gen(&mut s, prompt.clone(), SamplingParams::greedy(), until(8));
    assert_eq!((toks.len(), finish), (8, FinishReason::MaxTokens));
    check_consistent_after(engine, &prompt, &toks, &mut s);

    // A generation dropped in the middle of a run.
    let mut s = forced_session(engine, &truth);
    let mut g = s
        .generate(prompt.clone(), SamplingParams::greedy(), until(30))
        .unwrap();
    let toks: Vec<u32> = g
        .by_ref()
        .take(3)
        .filter_map(|e| e.unwrap().token)
        .collect();
    drop(g);
    check_consistent_after(engine, &prompt, &toks, &mut s);
}

#[test]
fn stop_strings_inside_an_accepted_run() {
    let engine = demo();
    let prompt = engine.tokenizer().encode("def fibonacci(n):\n").unwrap();
    let plain = plain_greedy(engine, &prompt, 30);
    let truth = [&prompt[..], &plain].concat();
    // A stop string ending inside the 4th generated token's text.
    let text4 = engine.tokenizer().decode(&plain[..4]).unwrap();
    let text3 = engine.tokenizer().decode(&plain[..3]).unwrap();
    assert!(text4.len() > text3.len());
    let stop = text4[text3.len().saturating_sub(2)..].to_string();
    let mut s = forced_session(engine, &truth);
    let mut g = s
        .generate(
            prompt.clone(),
            SamplingParams::greedy(),
            until(30).with_strings([stop.clone()]),
        )
        .unwrap();
    let mut toks = Vec::new();
    let mut text = String::new();
    for e in g.by_ref() {
        let e = e.unwrap();
        toks.extend(e.token);
        text.push_str(&e.text);
    }
    assert!(matches!(
        g.finish_reason(),
        Some(FinishReason::StopString(_))
    ));
    drop(g);
    assert!(toks.len() <= 4 && !toks.is_empty(), "{toks:?}");
    assert!(!text.contains(&stop));
    check_consistent_after(engine, &prompt, &toks, &mut s);
}

// ---- distribution ----

const PARAMS_TOP_K: usize = 3;

fn sampling(seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        top_k: PARAMS_TOP_K,
        top_p: 1.0,
        min_p: 0.0,
        seed,
        ..SamplingParams::default()
    }
}

/// Exact joint distribution of the first `depth` sampled tokens (plain target, no drafts).
fn exact_joint(engine: &Engine, prompt: &[u32], depth: usize) -> Vec<(Vec<u32>, f64)> {
    let mut out = vec![(Vec::new(), 1.0)];
    let mut sampler = Sampler::new(sampling(0), engine.token_mask().clone());
    let mut dist = TokenDist::new();
    for _ in 0..depth {
        let mut next = Vec::new();
        for (prefix, p) in out {
            let mut s = engine.session().unwrap();
            s.set_speculation(Speculation::None);
            let seq = [prompt, &prefix[..]].concat();
            let mut logits = s.feed(&seq).unwrap().to_vec();
            sampler.distribution(&mut logits, &seq, &mut dist);
            for &t in dist.support() {
                let mut q = prefix.clone();
                q.push(t);
                next.push((q, p * dist.prob(t)));
            }
        }
        out = next;
    }
    out
}

/// Chi-square statistic of `samples` (first `depth` tokens of each) against `joint`, and its
/// degrees of freedom.
fn chi_square(joint: &[(Vec<u32>, f64)], samples: &[Vec<u32>]) -> (f64, usize) {
    let n = samples.len() as f64;
    let mut chi = 0.0;
    let mut seen = 0.0;
    for (cell, p) in joint {
        let o = samples.iter().filter(|s| s == &cell).count() as f64;
        seen += o;
        chi += (o - n * p).powi(2) / (n * p);
    }
    // Samples outside the support would be an infinite deviation.
    assert_eq!(seen, n, "a sample outside the target's support");
    (chi, joint.len() - 1)
}

/// 99.9% quantile of chi-square with `df` degrees of freedom (Wilson-Hilferty).
fn chi2_q999(df: usize) -> f64 {
    let k = df as f64;
    let z = 3.09;
    k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3)
}

/// Proposes the target's most likely token after each prefix it knows (a point-mass drafter
/// whose drafts the target often accepts but not always: the acceptance rule decides).
struct Likeliest(std::collections::HashMap<Vec<u32>, u32>);

impl Drafter for Likeliest {
    fn draft(&mut self, seq: &[u32], n: usize) -> Vec<u32> {
        let mut seq = seq.to_vec();
        let mut out = Vec::new();
        while out.len() < n {
            let Some(&t) = self.0.get(&seq) else { break };
            out.push(t);
            seq.push(t);
        }
        out
    }
}

fn likeliest(engine: &Engine, prompt: &[u32], depth: usize) -> Likeliest {
    let mut sampler = Sampler::new(sampling(0), engine.token_mask().clone());
    let mut dist = TokenDist::new();
    let mut map = std::collections::HashMap::new();
    let mut level = vec![prompt.to_vec()];
    for _ in 0..depth {
        let mut next = Vec::new();
        for seq in level {
            let mut s = engine.session().unwrap();
            s.set_speculation(Speculation::None);
            let mut logits = s.feed(&seq).unwrap().to_vec();
            sampler.distribution(&mut logits, &seq, &mut dist);
            let best = *dist
                .support()
                .iter()
                .max_by(|a, b| dist.prob(**a).total_cmp(&dist.prob(**b)))
                .unwrap();
            map.insert(seq.clone(), best);
            for &t in dist.support() {
                next.push([&seq[..], &[t]].concat());
            }
        }
        level = next;
    }
    Likeliest(map)
}

fn sampled_runs(
    engine: &Engine,
    prompt: &[u32],
    depth: usize,
    n: usize,
    rule: AcceptRule,
    forced: bool,
) -> Vec<Vec<u32>> {
    let mut s = engine.session().unwrap();
    s.set_speculation(Speculation::Mtp { draft: 2 });
    let sp = s.speculation_mut().unwrap();
    sp.set_rule(rule);
    if forced {
        sp.set_drafter(Some(Box::new(likeliest(engine, prompt, depth))));
    }
    (0..n as u64)
        .map(|seed| {
            s.reset().unwrap();
            gen(
                &mut s,
                prompt.to_vec(),
                sampling(seed * 7919 + 1),
                until(depth),
            )
            .0
        })
        .collect()
}

#[test]
fn sampled_output_with_speculation_has_the_target_distribution() {
    let engine = tiny();
    let prompt = &prompt_a()[..6];
    let depth = 3;
    let joint = exact_joint(engine, prompt, depth);
    let n = 700;
    // The tiny model's random MTP head mostly drafts outside the target's top-k (rejections and
    // residual sampling); the "likeliest" drafter's drafts are kept with probability p(d).
    for forced in [false, true] {
        let good = sampled_runs(engine, prompt, depth, n, AcceptRule::Standard, forced);
        let (chi, df) = chi_square(&joint, &good);
        let limit = chi2_q999(df);
        eprintln!(
            "standard rule, forced {forced}: chi2 {chi:.1} (df {df}, 99.9% limit {limit:.1})"
        );
        assert!(
            chi < limit,
            "speculative sampling changed the distribution: chi2 {chi:.1} > {limit:.1}"
        );
    }
    // The same test catches a wrong acceptance rule (keeping every draft).
    let bad = sampled_runs(engine, prompt, depth, n, AcceptRule::AlwaysAccept, true);
    let (chi_bad, df) = chi_square(&joint, &bad);
    eprintln!("always-accept rule: chi2 {chi_bad:.1}");
    assert!(
        chi_bad > chi2_q999(df),
        "the test did not catch always-accept: chi2 {chi_bad:.1}"
    );
}
