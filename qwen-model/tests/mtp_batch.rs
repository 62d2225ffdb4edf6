//! `Model::mtp_forward_batch`: the MTP rows of several sequences (each its own MTP cache,
//! length and RoPE position) in one pass over the MTP block and the LM head give each
//! sequence what `Model::mtp_forward` gives it alone.
//!
//! Tolerance as `batch_forward.rs`: the matrix kernels see every row of the pass, so the
//! outputs equal a lone pass's up to the rounding of the kernel the row count picks
//! (`LOGIT_TOL` relative); a one-sequence batch is the lone pass bit for bit.

use pn_tests::{data, f32_bits as bits, DEMO};
use qwen_model::{CpuBackend, Model, ModelError, MtpSeq, Outputs, State};

const LOGIT_TOL: f32 = 1e-3;

fn model() -> Model<CpuBackend> {
    Model::load(data(DEMO, "model-pn3.gguf"), CpuBackend::new(2)).expect("demo model")
}

fn toks(n: usize, salt: u32, vocab: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 7919 + salt * 104_729 + 13) % vocab as u32)
        .collect()
}

/// Deterministic hidden states `[n, d]` of the size of a trunk output.
fn hidden(n: usize, d: usize, salt: usize) -> Vec<f32> {
    (0..n * d)
        .map(|i| ((i * 31 + salt * 17) as f32 * 0.37).sin() * 2.0)
        .collect()
}

fn max_rel_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / (1.0 + y.abs()))
        .fold(0.0, f32::max)
}

/// One sequence's two MTP calls: its prompt rows (every row's logits), then one draft row
/// (its logits and MTP hidden state), as a speculative step makes them.
struct Case {
    prompt: Vec<u32>,
    prompt_h: Vec<f32>,
    draft: u32,
    draft_h: Vec<f32>,
}

/// (every prompt row's logits, the draft row's logits, its hidden state, the MTP length).
type Got = (Vec<f32>, Vec<f32>, Vec<f32>, usize);

fn cases(m: &Model<CpuBackend>, n: usize) -> Vec<Case> {
    let (v, d) = (m.config.vocab, m.config.hidden);
    (0..n)
        .map(|i| {
            let len = 1 + (5 * i) % 7;
            Case {
                prompt: toks(len, i as u32 + 1, v),
                prompt_h: hidden(len, d, i),
                draft: toks(1, 100 + i as u32, v)[0],
                draft_h: hidden(1, d, 50 + i),
            }
        })
        .collect()
}

fn alone(m: &Model<CpuBackend>, c: &Case) -> Got {
    let (v, d) = (m.config.vocab, m.config.hidden);
    let mut st = m.new_state(64).unwrap();
    let mut ws = m.new_workspace(16).unwrap();
    let n = c.prompt.len();
    let mut pl = vec![0.0; n * v];
    let out = Outputs {
        logits: Some(&mut pl),
        hidden: None,
        all_rows: true,
        layer_residuals: None,
    };
    m.mtp_forward(&mut st, &mut ws, &c.prompt, &c.prompt_h, 0, out)
        .unwrap();
    let (mut dl, mut dh) = (vec![0.0; v], vec![0.0; d]);
    let out = Outputs {
        logits: Some(&mut dl),
        hidden: Some(&mut dh),
        all_rows: false,
        layer_residuals: None,
    };
    m.mtp_forward(&mut st, &mut ws, &[c.draft], &c.draft_h, n, out)
        .unwrap();
    (pl, dl, dh, st.mtp_len())
}

fn batched(m: &Model<CpuBackend>, cs: &[Case]) -> Vec<Got> {
    let (v, d) = (m.config.vocab, m.config.hidden);
    let mut ws = m.new_workspace(64).unwrap();
    let mut states: Vec<State<CpuBackend>> = cs.iter().map(|_| m.new_state(64).unwrap()).collect();
    let mut pls: Vec<Vec<f32>> = cs.iter().map(|c| vec![0.0; c.prompt.len() * v]).collect();
    let mut seqs: Vec<MtpSeq<'_, CpuBackend>> = states
        .iter_mut()
        .zip(cs)
        .zip(pls.iter_mut())
        .map(|((state, c), pl)| MtpSeq {
            state,
            tokens: &c.prompt,
            hidden: &c.prompt_h,
            rope_pos0: 0,
            out: Outputs {
                logits: Some(pl),
                hidden: None,
                all_rows: true,
                layer_residuals: None,
            },
        })
        .collect();
    m.mtp_forward_batch(&mut ws, &mut seqs).unwrap();
    let mut dls: Vec<Vec<f32>> = cs.iter().map(|_| vec![0.0; v]).collect();
    let mut dhs: Vec<Vec<f32>> = cs.iter().map(|_| vec![0.0; d]).collect();
    let mut seqs: Vec<MtpSeq<'_, CpuBackend>> = states
        .iter_mut()
        .zip(cs)
        .zip(dls.iter_mut().zip(dhs.iter_mut()))
        .map(|((state, c), (dl, dh))| MtpSeq {
            state,
            tokens: std::slice::from_ref(&c.draft),
            hidden: &c.draft_h,
            rope_pos0: c.prompt.len(),
            out: Outputs {
                logits: Some(dl),
                hidden: Some(dh),
                all_rows: false,
                layer_residuals: None,
            },
        })
        .collect();
    m.mtp_forward_batch(&mut ws, &mut seqs).unwrap();
    (0..cs.len())
        .map(|i| {
            (
                pls[i].clone(),
                dls[i].clone(),
                dhs[i].clone(),
                states[i].mtp_len(),
            )
        })
        .collect()
}

#[test]
fn batched_mtp_rows_match_each_sequence_alone() {
    let m = model();
    assert!(m.config.n_mtp > 0, "the demo model has an MTP block");
    for n in 1..=6 {
        let cs = cases(&m, n);
        let got = batched(&m, &cs);
        for (i, c) in cs.iter().enumerate() {
            let want = alone(&m, c);
            assert_eq!(got[i].3, want.3, "n={n} seq {i}: MTP cache length");
            if n == 1 {
                // One sequence: the lone pass itself.
                assert_eq!(bits(&got[i].0), bits(&want.0), "prompt logits");
                assert_eq!(bits(&got[i].1), bits(&want.1), "draft logits");
                assert_eq!(bits(&got[i].2), bits(&want.2), "draft hidden");
            }
            for (what, a, b) in [
                ("prompt logits", &got[i].0, &want.0),
                ("draft logits", &got[i].1, &want.1),
                ("draft hidden", &got[i].2, &want.2),
            ] {
                let diff = max_rel_diff(a, b);
                assert!(diff <= LOGIT_TOL, "n={n} seq {i} {what}: {diff}");
            }
        }
    }
}

#[test]
fn batched_mtp_errors_name_the_limit() {
    let m = model();
    let (v, d) = (m.config.vocab, m.config.hidden);
    let mut ws = m.new_workspace(2).unwrap();
    let err = m.mtp_forward_batch(&mut ws, &mut []).unwrap_err();
    assert!(matches!(err, ModelError::BadArgument(_)), "{err}");
    let mut st = m.new_state(16).unwrap();
    let h = hidden(3, d, 0);
    let toks3 = toks(3, 1, v);
    let mut seqs = [MtpSeq {
        state: &mut st,
        tokens: &toks3,
        hidden: &h,
        rope_pos0: 0,
        out: Outputs::default(),
    }];
    let err = m
        .mtp_forward_batch(&mut ws, &mut seqs)
        .unwrap_err()
        .to_string();
    assert!(err.contains("3 rows") && err.contains("takes 2"), "{err}");
    // A hidden state of the wrong length is refused before anything runs.
    let mut st = m.new_state(16).unwrap();
    let short = hidden(1, d, 0);
    let mut seqs = [MtpSeq {
        state: &mut st,
        tokens: &toks3[..2],
        hidden: &short,
        rope_pos0: 0,
        out: Outputs::default(),
    }];
    let err = m
        .mtp_forward_batch(&mut ws, &mut seqs)
        .unwrap_err()
        .to_string();
    assert!(err.contains("hidden floats"), "{err}");
    assert_eq!(st.mtp_len(), 0);
}
