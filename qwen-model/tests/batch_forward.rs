//! `Model::forward_batch`: the rows of several sequences (each its own state, position, KV
//! cache length and recurrent state) in one pass give each sequence what it gets alone.
//!
//! Tolerance: a sequence's rows go through matrix kernels that take every row of the pass, so
//! its logits equal those of a lone pass up to the rounding of the kernel the row count picks
//! (the CPU's fused multi-row dot products below 9 rows, its decode-once path above; each
//! within `1e-5 + 1e-4 * sum|w x|` of a naive product, `tests/matmul.rs`). Through the demo
//! model's layers that stays below `LOGIT_TOL` relative (`|a - b| / (1 + |b|)`); the greedy
//! tokens are the same.

use pn_tests::{argmax, data, f32_bits as bits, DEMO};
use qwen_model::{BatchSeq, CpuBackend, Model, Outputs, State};

/// Largest relative logit difference allowed between batched and lone decoding.
const LOGIT_TOL: f32 = 1e-3;

fn model() -> Model<CpuBackend> {
    Model::load(data(DEMO, "model-pn3.gguf"), CpuBackend::new(2)).expect("demo model")
}

fn toks(n: usize, salt: u32, vocab: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 7919 + salt * 104_729 + 13) % vocab as u32)
        .collect()
}

fn max_rel_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / (1.0 + y.abs()))
        .fold(0.0, f32::max)
}

/// Sequence `i` of a run: its prompt, the step at which it joins, and how many tokens it
/// decodes before it leaves.
struct Plan {
    prompt: Vec<u32>,
    join: usize,
    steps: usize,
}

fn plans(n: usize, vocab: usize) -> Vec<Plan> {
    (0..n)
        .map(|i| Plan {
            prompt: toks(2 + 5 * i % 17, i as u32 + 1, vocab),
            join: i % 3,
            steps: 3 + i % 4,
        })
        .collect()
}

/// A sequence's logits after its prompt and after each decoded token, and its tokens.
type Run = (Vec<Vec<f32>>, Vec<u32>);

/// Alone: the prompt in one call, then greedy decoding one token per call. Returns the logits
/// after the prompt and after each decoded token (`steps + 1` rows) and the tokens.
fn alone(m: &Model<CpuBackend>, p: &Plan) -> Run {
    let v = m.config.vocab;
    let mut st = m.new_state(64).unwrap();
    let mut ws = m.new_workspace(64).unwrap();
    let mut l = vec![0.0; v];
    m.forward(&mut st, &mut ws, &p.prompt, Outputs::last_logits(&mut l))
        .unwrap();
    let mut rows = vec![l.clone()];
    let mut out = Vec::new();
    for _ in 0..p.steps {
        let t = argmax(&l) as u32;
        out.push(t);
        m.forward(&mut st, &mut ws, &[t], Outputs::last_logits(&mut l))
            .unwrap();
        rows.push(l.clone());
    }
    (rows, out)
}

/// One sequence of a batched run.
struct Live {
    state: State<CpuBackend>,
    logits: Vec<f32>,
    /// Rows to feed this step (the prompt when joining, else the last token).
    feed: Vec<u32>,
    rows: Vec<Vec<f32>>,
    tokens: Vec<u32>,
}

/// Batched: every step one `forward_batch` over the sequences that have joined and not left;
/// a joining sequence's whole prompt is its part of that step's pass.
fn batched(m: &Model<CpuBackend>, plans: &[Plan]) -> Vec<Run> {
    let v = m.config.vocab;
    let mut ws = m.new_workspace(128).unwrap();
    let mut live: Vec<Option<Live>> = plans.iter().map(|_| None).collect();
    let mut done: Vec<Option<Run>> = plans.iter().map(|_| None).collect();
    let mut step = 0;
    while done.iter().any(Option::is_none) {
        for (i, p) in plans.iter().enumerate() {
            if p.join == step {
                live[i] = Some(Live {
                    state: m.new_state(64).unwrap(),
                    logits: vec![0.0; v],
                    feed: p.prompt.clone(),
                    rows: Vec::new(),
                    tokens: Vec::new(),
                });
            }
        }
        let mut seqs: Vec<BatchSeq<'_, CpuBackend>> = live
            .iter_mut()
            .flatten()
            .map(|l| BatchSeq {
                state: &mut l.state,
                tokens: &l.feed,
                out: Outputs::last_logits(&mut l.logits),
                trace: None,
            })
            .collect();
        if !seqs.is_empty() {
            m.forward_batch(&mut ws, &mut seqs).unwrap();
        }
        drop(seqs);
        for (i, p) in plans.iter().enumerate() {
            let Some(l) = live[i].as_mut() else { continue };
            l.rows.push(l.logits.clone());
            if l.tokens.len() == p.steps {
                let l = live[i].take().unwrap();
                done[i] = Some((l.rows, l.tokens));
                continue;
            }
            let t = argmax(&l.logits) as u32;
            l.tokens.push(t);
            l.feed = vec![t];
        }
        step += 1;
    }
    done.into_iter().map(Option::unwrap).collect()
}

#[test]
fn batched_decode_matches_each_sequence_alone() {
    let m = model();
    let v = m.config.vocab;
    let mut worst = 0.0f32;
    for n in 1..=8 {
        let plans = plans(n, v);
        let got = batched(&m, &plans);
        for (i, (p, (rows, tokens))) in plans.iter().zip(&got).enumerate() {
            let (want_rows, want_tokens) = alone(&m, p);
            assert_eq!(tokens, &want_tokens, "n={n} seq {i}: greedy tokens");
            assert_eq!(rows.len(), want_rows.len());
            for (s, (a, b)) in rows.iter().zip(&want_rows).enumerate() {
                let d = max_rel_diff(a, b);
                worst = worst.max(d);
                assert!(
                    d <= LOGIT_TOL,
                    "n={n} seq {i} step {s}: logits differ by {d}"
                );
            }
        }
    }
    eprintln!("batched vs alone: worst relative logit difference {worst:e}");
}

/// One sequence in a batched pass is the lone forward: the same bits.
#[test]
fn one_sequence_batch_is_the_lone_forward() {
    let m = model();
    let v = m.config.vocab;
    for n_tok in [1usize, 5, 12] {
        let prompt = toks(7, 3, v);
        let input = toks(n_tok, 4, v);
        let mut ws = m.new_workspace(16).unwrap();
        let mut a = m.new_state(64).unwrap();
        let mut b = m.new_state(64).unwrap();
        m.forward(&mut a, &mut ws, &prompt, Outputs::default())
            .unwrap();
        m.forward(&mut b, &mut ws, &prompt, Outputs::default())
            .unwrap();
        let mut la = vec![0.0; n_tok * v];
        let mut lb = vec![0.0; n_tok * v];
        m.forward(&mut a, &mut ws, &input, Outputs::all_logits(&mut la))
            .unwrap();
        let mut seqs = [BatchSeq {
            state: &mut b,
            tokens: &input,
            out: Outputs::all_logits(&mut lb),
            trace: None,
        }];
        m.forward_batch(&mut ws, &mut seqs).unwrap();
        assert_eq!(bits(&la), bits(&lb), "{n_tok} tokens");
        assert_eq!(
            a.recurrent_state(&m.config, &m.backend).unwrap(),
            b.recurrent_state(&m.config, &m.backend).unwrap()
        );
        assert_eq!(a.pos(), b.pos());
    }
}

/// Several sequences with several rows each (prefill chunks side by side), every row's logits
/// asked for: each within rounding of its lone pass, and its state advanced by its rows.
#[test]
fn multi_row_sequences_side_by_side() {
    let m = model();
    let v = m.config.vocab;
    let lens = [3usize, 1, 6, 2];
    let mut ws = m.new_workspace(32).unwrap();
    let mut states: Vec<_> = lens.iter().map(|_| m.new_state(64).unwrap()).collect();
    // Different positions: each sequence first gets a prompt of its own length alone.
    for (i, st) in states.iter_mut().enumerate() {
        let pre = toks(4 + 3 * i, 10 + i as u32, v);
        m.forward(st, &mut ws, &pre, Outputs::default()).unwrap();
    }
    let inputs: Vec<Vec<u32>> = lens
        .iter()
        .enumerate()
        .map(|(i, &n)| toks(n, 20 + i as u32, v))
        .collect();
    let mut outs: Vec<Vec<f32>> = lens.iter().map(|&n| vec![0.0; n * v]).collect();
    let mut seqs: Vec<BatchSeq<'_, CpuBackend>> = states
        .iter_mut()
        .zip(&inputs)
        .zip(outs.iter_mut())
        .map(|((state, tokens), o)| BatchSeq {
            state,
            tokens,
            out: Outputs::all_logits(o),
            trace: None,
        })
        .collect();
    m.forward_batch(&mut ws, &mut seqs).unwrap();
    drop(seqs);
    for (i, &n) in lens.iter().enumerate() {
        let mut st = m.new_state(64).unwrap();
        let pre = toks(4 + 3 * i, 10 + i as u32, v);
        m.forward(&mut st, &mut ws, &pre, Outputs::default())
            .unwrap();
        let mut want = vec![0.0; n * v];
        m.forward(&mut st, &mut ws, &inputs[i], Outputs::all_logits(&mut want))
            .unwrap();
        let d = max_rel_diff(&outs[i], &want);
        assert!(d <= LOGIT_TOL, "seq {i}: logits differ by {d}");
        assert_eq!(states[i].pos(), st.pos(), "seq {i}: position");
        let (a, b) = (
            states[i].recurrent_state(&m.config, &m.backend).unwrap(),
            st.recurrent_state(&m.config, &m.backend).unwrap(),
        );
        assert!(
            max_rel_diff(&a, &b) <= LOGIT_TOL,
            "seq {i}: recurrent state"
        );
    }
}

#[test]
fn batch_errors_name_the_limit() {
    let m = model();
    let v = m.config.vocab;
    let mut ws = m.new_workspace(4).unwrap();
    let (mut a, mut b) = (m.new_state(64).unwrap(), m.new_state(64).unwrap());
    let (ta, tb) = (toks(3, 1, v), toks(2, 2, v));
    let mut seqs = [
        BatchSeq {
            state: &mut a,
            tokens: &ta,
            out: Outputs::default(),
            trace: None,
        },
        BatchSeq {
            state: &mut b,
            tokens: &tb,
            out: Outputs::default(),
            trace: None,
        },
    ];
    let e = m.forward_batch(&mut ws, &mut seqs).unwrap_err().to_string();
    assert!(e.contains("5 rows") && e.contains("takes 4"), "{e}");
    let e = m.forward_batch(&mut ws, &mut []).unwrap_err().to_string();
    assert!(e.contains("no sequences"), "{e}");
    // Nothing ran: both states are still empty.
    assert_eq!((a.pos(), b.pos()), (0, 0));
}

/// A pass where one sequence wants the hidden states of all its rows and no logits (a
/// speculative batch's prefill chunk) and others want logits (one with its hidden state too):
/// the head runs over the logit rows only, and each gets what it gets alone within rounding.
#[test]
fn hidden_only_rows_beside_logit_rows() {
    let m = model();
    let (v, d) = (m.config.vocab, m.config.hidden);
    let prompts = [toks(6, 1, v), toks(3, 2, v), toks(9, 3, v)];
    let inputs = [toks(5, 4, v), toks(1, 5, v), toks(2, 6, v)];
    let mut ws = m.new_workspace(32).unwrap();
    let mut lone = Vec::new();
    let mut states = Vec::new();
    for (i, (p, x)) in prompts.iter().zip(&inputs).enumerate() {
        let mut a = m.new_state(64).unwrap();
        m.forward(&mut a, &mut ws, p, Outputs::default()).unwrap();
        let mut b = m.new_state(64).unwrap();
        m.forward(&mut b, &mut ws, p, Outputs::default()).unwrap();
        let (mut l, mut h) = (vec![0.0; x.len() * v], vec![0.0; x.len() * d]);
        // Each alone asks for what it asks for in the batch: sequence 0's rows stay state-only
        // (no logits) there, so they may take the state-only rows' products
        // (`Backend::set_state_rows`) and its reference must too.
        let out = Outputs {
            logits: (i != 0).then_some(&mut l[..]),
            hidden: Some(&mut h),
            all_rows: true,
            layer_residuals: None,
        };
        m.forward(&mut a, &mut ws, x, out).unwrap();
        lone.push((l, h));
        states.push(b);
    }
    // Sequence 0: hidden only, every row; 1: logits of its row; 2: logits and hidden.
    let mut h0 = vec![0.0; 5 * d];
    let mut l1 = vec![0.0; v];
    let (mut l2, mut h2) = (vec![0.0; 2 * v], vec![0.0; 2 * d]);
    let [s0, s1, s2] = &mut states[..] else {
        unreachable!()
    };
    let mut seqs = [
        BatchSeq {
            state: s0,
            tokens: &inputs[0],
            out: Outputs {
                hidden: Some(&mut h0),
                all_rows: true,
                ..Outputs::default()
            },
            trace: None,
        },
        BatchSeq {
            state: s1,
            tokens: &inputs[1],
            out: Outputs::last_logits(&mut l1),
            trace: None,
        },
        BatchSeq {
            state: s2,
            tokens: &inputs[2],
            out: Outputs {
                logits: Some(&mut l2),
                hidden: Some(&mut h2),
                all_rows: true,
                layer_residuals: None,
            },
            trace: None,
        },
    ];
    m.forward_batch(&mut ws, &mut seqs).unwrap();
    assert!(max_rel_diff(&h0, &lone[0].1) <= LOGIT_TOL);
    assert!(max_rel_diff(&l1, &lone[1].0) <= LOGIT_TOL);
    assert!(max_rel_diff(&l2, &lone[2].0) <= LOGIT_TOL);
    assert!(max_rel_diff(&h2, &lone[2].1) <= LOGIT_TOL);
    assert_eq!(argmax(&l1), argmax(&lone[1].0));
}
