//! The oracle: logits of the tiny Qwen3.5 model (HF transformers, f32) against ours on the F16
//! GGUF converted by llama.cpp's converter (`tests/data/tiny-qwen35/README.md`).
#![allow(clippy::needless_range_loop)] // the naive references index like the formulas

use pn_tests::model::prefill_then_decode;
use pn_tests::{assert_argmax, max_abs, read_f32, read_tokens, tiny};
use qwen_model::{CpuBackend, Model, Outputs};

const TOL: f32 = 1e-4;

fn model() -> Model<CpuBackend> {
    Model::load(tiny("model-f16.gguf"), CpuBackend::new(2)).expect("load tiny model")
}

/// All positions' logits (and final hidden states), the sequence fed in `pieces` calls, with a
/// workspace of `max_rows` rows.
fn run(
    m: &Model<CpuBackend>,
    tokens: &[u32],
    pieces: &[usize],
    max_rows: usize,
) -> (Vec<f32>, Vec<f32>) {
    let (v, d) = (m.config.vocab, m.config.hidden);
    let mut state = m.new_state(tokens.len()).unwrap();
    let mut ws = m.new_workspace(max_rows).unwrap();
    let mut logits = vec![0.0; tokens.len() * v];
    let mut hidden = vec![0.0; tokens.len() * d];
    let mut t0 = 0;
    for &p in pieces {
        let out = Outputs {
            logits: Some(&mut logits[t0 * v..(t0 + p) * v]),
            hidden: Some(&mut hidden[t0 * d..(t0 + p) * d]),
            all_rows: true,
            layer_residuals: None,
        };
        m.forward(&mut state, &mut ws, &tokens[t0..t0 + p], out)
            .unwrap();
        t0 += p;
    }
    assert_eq!(t0, tokens.len());
    assert_eq!(state.pos(), tokens.len());
    (logits, hidden)
}

#[test]
fn config_of_tiny_model() {
    let m = model();
    let c = &m.config;
    assert_eq!(
        (c.hidden, c.n_layers, c.n_mtp, c.ffn, c.vocab),
        (320, 8, 1, 704, 2048)
    );
    assert_eq!(
        (c.n_q_heads, c.n_kv_heads, c.head_dim, c.rope_dims),
        (6, 2, 256, 64)
    );
    assert_eq!(
        (
            c.gdn.n_k_heads,
            c.gdn.n_v_heads,
            c.gdn.dk,
            c.gdn.dv,
            c.gdn.conv_kernel
        ),
        (2, 6, 128, 128, 4)
    );
    let attn: Vec<usize> = (0..8)
        .filter(|&i| c.layer_kinds[i] == qwen_model::LayerKind::FullAttention)
        .collect();
    assert_eq!(attn, vec![3, 7]);
    assert!(m.weights.mtp.is_some() && m.weights.output.is_some());
}

#[test]
fn sequence_a_whole_prefill_matches_transformers() {
    let m = model();
    let tokens = read_tokens(&tiny("tokens_a.json"));
    let want = read_f32(&tiny("logits_a.f32"));
    let (got, hidden) = run(&m, &tokens, &[tokens.len()], 64);
    let d = max_abs(&got, &want);
    eprintln!("sequence a, whole prefill: max abs diff {d:.3e}");
    assert!(d <= TOL, "sequence a: max abs diff {d}");
    assert!(assert_argmax(&got, &want, m.config.vocab, 0.0, "a").is_empty());
    // The LM-head input too (it feeds the MTP block).
    let dh = max_abs(&hidden, &read_f32(&tiny("hidden_a_final.f32")));
    eprintln!("sequence a, final hidden: max abs diff {dh:.3e}");
    assert!(dh <= TOL);
}

/// Per-layer residual stream of sequence a (the place to look first when the logits drift).
#[test]
fn sequence_a_layer_by_layer_matches_transformers() {
    let m = model();
    let tokens = read_tokens(&tiny("tokens_a.json"));
    let want = read_f32(&tiny("hidden_a_layers.f32"));
    let (n, d) = (tokens.len(), m.config.hidden);
    let mut got = vec![0.0; (m.config.n_layers + 1) * n * d];
    let mut state = m.new_state(n).unwrap();
    // A workspace of 5 rows: the residuals of every internal chunk land in place.
    let mut ws = m.new_workspace(5).unwrap();
    let out = Outputs {
        layer_residuals: Some(&mut got),
        ..Default::default()
    };
    m.forward(&mut state, &mut ws, &tokens, out).unwrap();
    for l in 0..=m.config.n_layers {
        let diff = max_abs(
            &got[l * n * d..(l + 1) * n * d],
            &want[l * n * d..(l + 1) * n * d],
        );
        eprintln!("sequence a, residual after layer {l} (0 = embeddings): max abs diff {diff:.3e}");
        assert!(diff <= 1e-4, "residual {l}: {diff}");
    }
}

#[test]
fn sequence_b_whole_prefill_matches_transformers() {
    let m = model();
    let tokens = read_tokens(&tiny("tokens_b.json"));
    let want = read_f32(&tiny("logits_b.f32"));
    let (got, _) = run(&m, &tokens, &[tokens.len()], 256);
    let d = max_abs(&got, &want);
    eprintln!("sequence b, whole prefill: max abs diff {d:.3e}");
    assert!(d <= TOL, "sequence b: max abs diff {d}");
    // Position 111 has a reference top-2 gap of 5e-4: still must agree at our precision.
    assert!(assert_argmax(&got, &want, m.config.vocab, 0.0, "b").is_empty());
}

#[test]
fn sequence_c_token_by_token_matches_transformers() {
    let m = model();
    let tokens = read_tokens(&tiny("tokens_c.json"));
    let want = read_f32(&tiny("logits_c.f32"));
    let ones = vec![1; tokens.len()];
    let (got, _) = run(&m, &tokens, &ones, 64);
    let d = max_abs(&got, &want);
    eprintln!("sequence c, token by token: max abs diff {d:.3e}");
    assert!(d <= TOL, "sequence c: max abs diff {d}");
    assert!(assert_argmax(&got, &want, m.config.vocab, 0.0, "c").is_empty());
}

#[test]
fn prefill_decode_and_uneven_chunks_agree() {
    let m = model();
    let tokens = read_tokens(&tiny("tokens_b.json"));
    let want = read_f32(&tiny("logits_b.f32"));
    let (whole, _) = run(&m, &tokens, &[tokens.len()], 256);
    let ones = vec![1; tokens.len()];
    let (decode, _) = run(&m, &tokens, &ones, 1);
    // Uneven calls, and a workspace smaller than some calls (internal splitting).
    let (chunks, _) = run(&m, &tokens, &[7, 1, 64, 3, 90, 35], 37);
    for (name, got) in [("token-by-token", &decode), ("uneven chunks", &chunks)] {
        let d = max_abs(got, &whole);
        eprintln!("sequence b, {name} vs whole prefill: max abs diff {d:.3e}");
        assert!(d <= TOL, "{name} vs whole: {d}");
        let dr = max_abs(got, &want);
        eprintln!("sequence b, {name} vs transformers: max abs diff {dr:.3e}");
        assert!(dr <= TOL, "{name} vs transformers: {dr}");
    }
}

#[test]
fn last_row_output_equals_all_rows_output() {
    let m = model();
    let tokens = read_tokens(&tiny("tokens_a.json"));
    let v = m.config.vocab;
    let (all, _) = run(&m, &tokens, &[tokens.len()], 64);
    let mut state = m.new_state(tokens.len()).unwrap();
    let mut ws = m.new_workspace(5).unwrap();
    let mut last = vec![0.0; v];
    m.forward(
        &mut state,
        &mut ws,
        &tokens,
        Outputs::last_logits(&mut last),
    )
    .unwrap();
    assert!(max_abs(&last, &all[(tokens.len() - 1) * v..]) <= 1e-5);
}

#[test]
fn snapshot_restore_replays_exactly() {
    let m = model();
    let tokens = read_tokens(&tiny("tokens_b.json"));
    let v = m.config.vocab;
    let mut state = m.new_state(tokens.len()).unwrap();
    let mut ws = m.new_workspace(16).unwrap();
    m.forward(&mut state, &mut ws, &tokens[..50], Outputs::default())
        .unwrap();
    let snap = state.snapshot(&m.config, &m.backend).unwrap();
    let mut first = vec![0.0; 10 * v];
    m.forward(
        &mut state,
        &mut ws,
        &tokens[50..60],
        Outputs::all_logits(&mut first),
    )
    .unwrap();
    // A different continuation, then roll back and replay the first one.
    m.forward(&mut state, &mut ws, &tokens[100..130], Outputs::default())
        .unwrap();
    state.restore(&m.config, &m.backend, &snap).unwrap();
    assert_eq!(state.pos(), 50);
    let mut again = vec![0.0; 10 * v];
    m.forward(
        &mut state,
        &mut ws,
        &tokens[50..60],
        Outputs::all_logits(&mut again),
    )
    .unwrap();
    assert_eq!(first, again);
}

#[test]
fn mtp_block_matches_oracle() {
    let m = model();
    let (v, d) = (m.config.vocab, m.config.hidden);
    for seq in ["a", "b"] {
        let tokens = read_tokens(&tiny(&format!("tokens_{seq}.json")));
        let want = read_f32(&tiny(&format!("mtp_logits_{seq}.f32")));
        let n = tokens.len() - 1;
        let (_, hidden) = run(&m, &tokens, &[tokens.len()], 64);
        let mut state = m.new_state(tokens.len()).unwrap();
        let mut ws = m.new_workspace(64).unwrap();
        let mut got = vec![0.0; n * v];
        m.mtp_forward(
            &mut state,
            &mut ws,
            &tokens[1..],
            &hidden[..n * d],
            1,
            Outputs::all_logits(&mut got),
        )
        .unwrap();
        let diff = max_abs(&got, &want);
        eprintln!("MTP sequence {seq}: max abs diff {diff:.3e}");
        assert!(diff <= TOL, "MTP {seq}: {diff}");
        // mtp_logits_b row 53 has a reference top-2 gap of 3.3e-5.
        let flips = assert_argmax(&got, &want, v, 1e-4, seq);
        eprintln!("MTP sequence {seq}: argmax flips at near-ties {flips:?}");
        // Row by row through the MTP cache gives the same logits.
        if seq == "a" {
            let mut state = m.new_state(tokens.len()).unwrap();
            let mut rows = vec![0.0; n * v];
            for p in 0..n {
                m.mtp_forward(
                    &mut state,
                    &mut ws,
                    &tokens[p + 1..p + 2],
                    &hidden[p * d..(p + 1) * d],
                    p + 1,
                    Outputs::last_logits(&mut rows[p * v..(p + 1) * v]),
                )
                .unwrap();
            }
            assert!(max_abs(&rows, &got) <= 1e-5);
        }
    }
}

#[test]
fn bad_token_and_full_context_are_errors() {
    let m = model();
    let mut state = m.new_state(4).unwrap();
    let mut ws = m.new_workspace(4).unwrap();
    let err = m
        .forward(&mut state, &mut ws, &[1, 5000], Outputs::default())
        .unwrap_err();
    assert!(
        matches!(
            err,
            qwen_model::ModelError::TokenOutOfRange {
                token: 5000,
                index: 1,
                ..
            }
        ),
        "{err}"
    );
    let err = m
        .forward(&mut state, &mut ws, &[1, 2, 3, 4, 5], Outputs::default())
        .unwrap_err();
    assert!(
        matches!(
            err,
            qwen_model::ModelError::ContextFull {
                needed: 5,
                capacity: 4
            }
        ),
        "{err}"
    );
}

/// The trained demo model (`tests/data/demo-code-model`): transformers f32 logits of 128
/// validation tokens. Trained weights give larger, structured logits than the random tiny model.
#[test]
fn demo_model_matches_transformers() {
    let dir = pn_tests::data(pn_tests::DEMO, "");
    let m = Model::load(dir.join("model-f16.gguf"), CpuBackend::new(2)).expect("demo model");
    let tokens = read_tokens(&dir.join("tokens_val.json"));
    let want = read_f32(&dir.join("logits_val.f32"));
    let (got, _) = run(&m, &tokens, &[tokens.len()], 64);
    let d = max_abs(&got, &want);
    let scale = want.iter().fold(0.0f32, |a, &b| a.max(b.abs()));
    eprintln!("demo model, 128 tokens: max abs diff {d:.3e} (max |logit| {scale:.2})");
    assert!(d <= 1e-4 * scale.max(1.0), "demo: max abs diff {d}");
    let flips = assert_argmax(&got, &want, m.config.vocab, 1e-4, "demo");
    assert!(flips.is_empty(), "demo argmax flips at {flips:?}");
}

/// An f16 KV cache rounds keys and values to f16: close to the f32 cache, not equal.
#[test]
fn f16_kv_cache_stays_close() {
    let m = model();
    let tokens = read_tokens(&tiny("tokens_b.json"));
    let want = read_f32(&tiny("logits_b.f32"));
    let mut state = m
        .new_state_with_kv(tokens.len(), qwen_model::KvCacheType::F16)
        .unwrap();
    let got = prefill_then_decode(&m, &mut state, &tokens, 150);
    let d = max_abs(&got, &want);
    eprintln!("sequence b with an f16 KV cache: max abs diff {d:.3e}");
    assert!(d > 0.0 && d <= 2e-3, "f16 KV cache: {d}");
}
