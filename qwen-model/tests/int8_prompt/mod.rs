//! The accuracy check behind `prompt_precision.rs` and `prompt_precision_avx2.rs` (see the
//! former): the logits after a prompt fed with only its last row's logits asked for, against
//! the same prompt with every row's logits asked for, and both against transformers.

use pn_tests::{argmax, data, read_f32, read_tokens, DEMO};
use qwen_model::{CpuBackend, Model, Outputs};

/// Positions (0-based, the prompt's last row) whose logits are compared.
const ENDS: [usize; 4] = [31, 63, 95, 127];

/// `KL(softmax(p) || softmax(q))` of two logit rows, in nats.
fn kl(p: &[f32], q: &[f32]) -> f64 {
    let log_softmax = |x: &[f32]| {
        let m = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
        let z = x.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln() + m;
        x.iter().map(move |&v| v as f64 - z).collect::<Vec<f64>>()
    };
    let (lp, lq) = (log_softmax(p), log_softmax(q));
    lp.iter()
        .zip(&lq)
        .map(|(a, b)| a.exp() * (a - b))
        .sum::<f64>()
}

/// Runs the comparison on whatever kernels this process picks, asserting the bounds.
pub fn check() {
    let m = Model::load(data(DEMO, "model-pn3.gguf"), CpuBackend::new(2)).expect("demo model");
    let v = m.config.vocab;
    let tokens = read_tokens(&data(DEMO, "tokens_val.json"));
    let oracle = read_f32(&data(DEMO, "logits_val.f32"));
    assert!(tokens.len() > ENDS[3] && oracle.len() == tokens.len() * v);
    // Every row's logits asked for: every row a logits row (int16).
    let mut all = vec![0f32; tokens.len() * v];
    let mut st = m.new_state(tokens.len()).unwrap();
    let mut ws = m.new_workspace(64).unwrap();
    m.forward(&mut st, &mut ws, &tokens, Outputs::all_logits(&mut all))
        .unwrap();
    let (mut kl_rows, mut kl_int16, mut kl_int8) = (0f64, 0f64, 0f64);
    let mut max_rel = 0f32;
    for end in ENDS {
        // Only the last row's logits: rows `0..end` state-only.
        let mut last = vec![0f32; v];
        let mut st = m.new_state(tokens.len()).unwrap();
        m.forward(
            &mut st,
            &mut ws,
            &tokens[..=end],
            Outputs::last_logits(&mut last),
        )
        .unwrap();
        let full = &all[end * v..(end + 1) * v];
        let want = &oracle[end * v..(end + 1) * v];
        let scale = full.iter().fold(1f32, |a, &b| a.max(b.abs()));
        let rel = last
            .iter()
            .zip(full)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max)
            / scale;
        max_rel = max_rel.max(rel);
        kl_rows = kl_rows.max(kl(full, &last));
        kl_int16 += kl(want, full) / ENDS.len() as f64;
        kl_int8 += kl(want, &last) / ENDS.len() as f64;
        assert_eq!(
            argmax(&last),
            argmax(full),
            "top token after {} rows",
            end + 1
        );
    }
    eprintln!(
        "state-only prompt rows against logits rows: max |diff| / max |logit| {max_rel:.2e}, \
         max KL {kl_rows:.2e}; mean KL to transformers f32: {kl_int16:.3e} (logits rows) and \
         {kl_int8:.3e} (state-only rows)"
    );
    // The int8 rows' own error is far below the 3-4-bit weights' (the KL to the unquantized
    // model), and adds little to it.
    assert!(
        kl_rows <= 0.1 * kl_int16.max(1e-6),
        "KL between the two {kl_rows:.3e}"
    );
    assert!(
        kl_int8 <= 1.1 * kl_int16 + 1e-6,
        "KL to transformers: {kl_int8:.3e} against {kl_int16:.3e}"
    );
}
