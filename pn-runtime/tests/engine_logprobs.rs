//! Per-token log probabilities and the thinking budget through the engine's generation (the
//! demo model): the reported numbers are the raw log-softmax of the model's logits at each
//! position, speculation on or off; a thinking budget closes the block on time, drafts and all.

use pn_runtime::engine::{Speculation, StopConditions, ThinkingControl};
use pn_runtime::sampling::SamplingParams;
use pn_tests::engine::demo_engine as demo;

/// Log-softmax of `row` over the entries `mask` allows.
fn log_softmax(engine: &pn_runtime::Engine, row: &[f32]) -> Vec<f64> {
    let mut row = row.to_vec();
    engine.token_mask().apply(&mut row);
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = row
        .iter()
        .filter(|l| l.is_finite())
        .map(|&l| (l as f64 - max).exp())
        .sum();
    row.iter().map(|&l| l as f64 - max - sum.ln()).collect()
}

#[test]
fn logprobs_are_the_log_softmax_at_every_position() {
    let engine = demo();
    let prompt = engine.tokenizer().encode("def fibonacci(n):").unwrap();
    let n = 12;
    for spec in [Speculation::None, Speculation::default()] {
        let mut s = engine.session().unwrap();
        s.set_speculation(spec);
        // Sampled, with penalties: the reported numbers ignore both.
        let params = SamplingParams {
            temperature: 0.9,
            repeat_penalty: 1.3,
            seed: 11,
            ..SamplingParams::default()
        };
        let stop = StopConditions {
            max_tokens: Some(n),
            ignore_eog: true,
            ..StopConditions::default()
        };
        let mut g = s
            .generate(prompt.as_slice(), params, stop)
            .unwrap()
            .with_logprobs(4);
        let mut got = Vec::new();
        while let Some(e) = g.next() {
            let e = e.unwrap();
            if let Some(lp) = g.take_logprob() {
                assert_eq!(Some(lp.id), e.token);
                got.push(lp);
            }
        }
        assert_eq!(got.len(), n, "{spec}: one entry per token");
        if spec != Speculation::None {
            assert_eq!(g.spec_stats().map_or(0, |st| st.drafted), 0, "no drafts");
        }
        // The reference: every position's logits from a fresh session, fed as a generation
        // feeds it (the prompt with the logits of its last row only, so its other rows may take
        // the state-only rows' kernels, `Backend::set_state_rows`; then the tokens).
        let generated: Vec<u32> = got.iter().map(|t| t.id).collect();
        let mut fresh = engine.session().unwrap();
        fresh.set_speculation(Speculation::None);
        let mut rows = fresh.feed(&prompt).unwrap().to_vec();
        let v = rows.len();
        rows.extend(fresh.feed_all_logits(&generated[..n - 1]).unwrap());
        for (i, t) in got.iter().enumerate() {
            let row = &rows[i * v..(i + 1) * v];
            let reference = log_softmax(engine, row);
            let want = reference[t.id as usize];
            assert!(
                (f64::from(t.logprob) - want).abs() < 2e-3,
                "{spec}: token {i}: {} vs {want}",
                t.logprob
            );
            assert_eq!(t.top.len(), 4);
            let best = reference.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            assert!((f64::from(t.top[0].1) - best).abs() < 2e-3);
            assert!(t.top.windows(2).all(|w| w[0].1 >= w[1].1));
        }
    }
}

#[test]
fn a_thinking_budget_closes_the_block_with_drafting_on() {
    let engine = demo();
    let tok = engine.tokenizer();
    // The Qwen generation prompt with thinking on: the block is open, the demo model never
    // closes it by itself.
    let prompt = tok
        .encode("<|im_start|>user\ndef add(a, b):<|im_end|>\n<|im_start|>assistant\n<think>\n")
        .unwrap();
    for budget in [0usize, 1, 5, 9] {
        let mut s = engine.session().unwrap();
        s.set_speculation(Speculation::default());
        let control =
            ThinkingControl::for_tokenizer(tok, true, Some(budget)).expect("think tokens");
        let stop = StopConditions {
            max_tokens: Some(24),
            ignore_eog: true,
            ..StopConditions::default()
        };
        let mut g = s
            .generate(prompt.as_slice(), SamplingParams::greedy(), stop)
            .unwrap()
            .with_thinking(control.clone());
        let mut ids: Vec<u32> = Vec::new();
        let mut text = String::new();
        for e in g.by_ref() {
            let e = e.unwrap();
            ids.extend(e.token);
            text.push_str(&e.text);
        }
        let t = g.timings();
        assert_eq!(t.reasoning_tokens, budget, "budget {budget}: {text:?}");
        // The budget's tokens, then the closing tag at once (after a newline if the reasoning
        // did not end with one), then the answer.
        let close = control.close_seq.len().max(control.close_seq_nl.len());
        let closed_by = (1..=ids.len())
            .find(|&k| tok.decode(&ids[..k]).unwrap().contains("</think>"))
            .expect("closed");
        assert!(closed_by <= budget + close, "{budget}: {ids:?}");
        let (_, answer) = text
            .split_once("</think>")
            .expect("closing tag in the text");
        assert!(!answer.trim().is_empty(), "an answer follows: {text:?}");
        assert_eq!(t.generated_tokens, 24);
    }
}
