//! Unit tests of [`SpecDecoder`](super::SpecDecoder): rollback cost and exactness.

use super::*;
use crate::sampling::{SamplingParams, TokenMask};
use crate::speculative::Drafter;
use qwen_model::CpuBackend;

fn argmax(row: &[f32]) -> u32 {
    crate::sampling::argmax(row).expect("finite logits")
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Drafts `right` tokens of the known greedy continuation, then wrong ones.
struct Scripted {
    truth: Vec<u32>,
    right: usize,
    vocab: u32,
}

impl Drafter for Scripted {
    fn draft(&mut self, seq: &[u32], n: usize) -> Vec<u32> {
        let end = (seq.len() + n).min(self.truth.len());
        self.truth[seq.len()..end]
            .iter()
            .enumerate()
            .map(|(i, &t)| {
                if i < self.right {
                    t
                } else {
                    (t + 1) % self.vocab
                }
            })
            .collect()
    }
}

struct Run {
    model: Model<CpuBackend>,
    prompt: Vec<u32>,
    /// Plain greedy continuation (one-row passes) after the prompt.
    truth: Vec<u32>,
}

fn demo_run(n_new: usize) -> Run {
    let model = Model::load(crate::DEMO_MODEL_PATH, CpuBackend::new(2)).expect("demo model");
    let v = model.config.vocab as u32;
    let prompt: Vec<u32> = (0..12u32).map(|i| (i * 7919 + 5) % v).collect();
    let mut ws = model.new_workspace(16).unwrap();
    let mut st = model.new_state(256).unwrap();
    let mut l = vec![0.0; model.config.vocab];
    model
        .forward(&mut st, &mut ws, &prompt, Outputs::last_logits(&mut l))
        .unwrap();
    let mut truth = vec![argmax(&l)];
    while truth.len() < n_new {
        let t = truth[truth.len() - 1];
        model
            .forward(&mut st, &mut ws, &[t], Outputs::last_logits(&mut l))
            .unwrap();
        truth.push(argmax(&l));
    }
    Run {
        model,
        prompt,
        truth,
    }
}

/// Greedy speculative generation with a [`Scripted`] drafter; calls `check` after every
/// step with the trunk passes and rows the step cost, the drafts it made and its result.
fn generate(
    run: &Run,
    right: usize,
    n_draft: usize,
    n_new: usize,
    mut check: impl FnMut(&Model<CpuBackend>, &State<CpuBackend>, (u64, u64), usize, &[u32]),
) -> (Vec<u32>, SpecStats) {
    let m = &run.model;
    let mut ws = m.new_workspace(16).unwrap();
    let mut st = m.new_state(256).unwrap();
    let mut sd = SpecDecoder::new(m, n_draft);
    let mut truth = run.prompt.clone();
    truth.extend_from_slice(&run.truth);
    sd.set_drafter(Some(Box::new(Scripted {
        truth,
        right,
        vocab: m.config.vocab as u32,
    })));
    let mut sampler = Sampler::new(SamplingParams::greedy(), TokenMask::allow_all());
    let mut l = vec![0.0; m.config.vocab];
    sd.forward(
        m,
        &mut st,
        &mut ws,
        &run.prompt,
        Outputs::last_logits(&mut l),
    )
    .unwrap();
    let mut history = run.prompt.clone();
    let mut out = vec![argmax(&l)];
    while out.len() < n_new {
        let x_n = out[out.len() - 1];
        let s0 = sd.stats();
        let max_draft = n_new - out.len() - 1;
        let (acc, next) = sd
            .step(
                m,
                &mut st,
                &mut ws,
                &mut sampler,
                StepInput {
                    history: &history,
                    x_n,
                    max_draft,
                },
            )
            .unwrap();
        let s1 = sd.stats();
        let cost = (
            s1.target_passes - s0.target_passes,
            s1.verify_rows - s0.verify_rows,
        );
        let drafted = (s1.drafted - s0.drafted) as usize;
        history.push(x_n);
        history.extend_from_slice(&acc);
        assert_eq!(
            st.pos(),
            history.len(),
            "state holds history, x_n, accepted"
        );
        check(m, &st, cost, drafted, &acc);
        out.extend_from_slice(&acc);
        out.push(next);
    }
    out.truncate(n_new);
    (out, sd.stats())
}

/// Every draft rejected: each step is one trunk pass of `1 + drafts` rows, the rollback
/// re-runs nothing, and the output is still plain greedy's.
#[test]
fn rejected_drafts_cost_no_replay_pass() {
    let n_new = 24;
    let run = demo_run(n_new);
    let mut steps_with_drafts = 0;
    let (out, stats) = generate(&run, 0, 3, n_new, |_, _, cost, drafted, acc| {
        assert!(acc.is_empty(), "wrong drafts are rejected");
        assert_eq!(cost, (1, 1 + drafted as u64), "one pass, no replay");
        steps_with_drafts += usize::from(drafted > 0);
    });
    assert_eq!(out, run.truth, "greedy output");
    assert!(steps_with_drafts >= 3, "drafts were made and rejected");
    assert_eq!(stats.rollbacks, steps_with_drafts as u64);
    assert_eq!(stats.accepted, 0);
}

/// One draft of two accepted per step: after the rollback the state is, bitwise, that of
/// a fresh state fed the same calls the old rollback made (the prompt as the decoder
/// feeds it, then each step's kept `[x_n, d_1]` in one call), and a step costs one pass.
/// The calls ask for the outputs the decoder's do (the rows whose logits are read may take
/// other matrix kernels than state-only rows: `Backend::set_state_rows`).
#[test]
fn rollback_state_equals_a_fresh_state_fed_the_kept_tokens() {
    let n_new = 21;
    let run = demo_run(n_new);
    let m = &run.model;
    let (cfg, be) = (&m.config, &m.backend);
    let r = run.prompt.len();
    let mut ws = m.new_workspace(16).unwrap();
    let mut fresh = m.new_state(256).unwrap();
    // Logits `[rows, vocab]` and hidden states `[rows, D]` for the calls' outputs.
    let (mut logits, mut hidden) = (vec![0f32; 16 * cfg.vocab], vec![0f32; 16 * cfg.hidden]);
    m.forward(
        &mut fresh,
        &mut ws,
        &run.prompt[..r - 1],
        Outputs {
            hidden: Some(&mut vec![0f32; (r - 1) * cfg.hidden]),
            all_rows: true,
            ..Outputs::default()
        },
    )
    .unwrap();
    m.forward(
        &mut fresh,
        &mut ws,
        &run.prompt[r - 1..],
        Outputs::last_logits(&mut logits[..cfg.vocab]),
    )
    .unwrap();
    let mut fed = 0;
    let mut compared = 0;
    let (out, stats) = generate(&run, 1, 2, n_new, |m, st, cost, drafted, acc| {
        assert_eq!(cost, (1, 1 + drafted as u64), "one pass, no replay");
        let kept = &run.truth[fed..fed + 1 + acc.len()];
        assert_eq!(&kept[1..], acc);
        let k = kept.len();
        let verify = Outputs {
            logits: Some(&mut logits[..k * cfg.vocab]),
            hidden: Some(&mut hidden[..k * cfg.hidden]),
            all_rows: true,
            layer_residuals: None,
        };
        m.forward(&mut fresh, &mut ws, kept, verify).unwrap();
        fed += kept.len();
        assert_eq!(fresh.pos(), st.pos());
        if kept.len() >= 2 {
            // Both sides ran these rows through multi-row matmuls: same bits.
            assert_eq!(
                bits(&st.recurrent_state(cfg, be).unwrap()),
                bits(&fresh.recurrent_state(cfg, be).unwrap()),
                "GDN state after {} tokens",
                st.pos()
            );
            compared += 1;
        }
    });
    assert_eq!(out, run.truth, "greedy output");
    assert!(compared >= 5, "{compared} rollbacks compared");
    assert!(stats.rollbacks >= 5 && stats.accepted >= 5, "{stats:?}");
}
