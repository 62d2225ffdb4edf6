//! Helpers over a loaded [`qwen_model::Model`].

use qwen_model::{AttnLayout, Backend, Model, Outputs, State};

/// Every position's logits (`tokens.len() x vocab`, row-major) of `tokens` fed into `state` as
/// one prefill of the first `n_prefill` tokens, then one token per call (the decode path), with
/// a 64-row workspace. `state` decides the KV cache types; it must have room for the tokens.
pub fn prefill_then_decode<B: Backend>(
    m: &Model<B>,
    state: &mut State<B>,
    tokens: &[u32],
    n_prefill: usize,
) -> Vec<f32> {
    let v = m.config.vocab;
    let mut ws = m.new_workspace(64).unwrap();
    let mut got = vec![0.0; tokens.len() * v];
    m.forward(
        state,
        &mut ws,
        &tokens[..n_prefill],
        Outputs::all_logits(&mut got[..n_prefill * v]),
    )
    .unwrap();
    for (i, &t) in tokens[n_prefill..].iter().enumerate() {
        let row = &mut got[(n_prefill + i) * v..(n_prefill + i + 1) * v];
        m.forward(state, &mut ws, &[t], Outputs::last_logits(row))
            .unwrap();
    }
    got
}

/// The reference the attention ops are checked against: causal GQA softmax attention in f64
/// over plain f32 caches. `q` is `[n_tokens, ...]` laid out as `layout` says; `k` and `v` are
/// `[pos0 + n_tokens, n_kv_heads * head_dim]`; the result is `[n_tokens, n_q_heads * head_dim]`
/// for the query tokens at positions `pos0..pos0 + n_tokens` (each sees positions `0..=its own`).
pub fn naive_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    layout: &AttnLayout,
    n_tokens: usize,
    pos0: usize,
) -> Vec<f32> {
    let l = layout;
    let dh = l.head_dim;
    let kvs = l.n_kv_heads * dh;
    let mut out = vec![0.0f32; n_tokens * l.n_q_heads * dh];
    for t in 0..n_tokens {
        for h in 0..l.n_q_heads {
            // Query head h reads kv head h / (n_q_heads / n_kv_heads).
            let g = h * l.n_kv_heads / l.n_q_heads;
            let qv = &q[t * l.q_token_stride + h * l.q_head_stride..][..dh];
            let n_ctx = pos0 + t + 1;
            let scores: Vec<f64> = (0..n_ctx)
                .map(|j| {
                    (0..dh)
                        .map(|i| qv[i] as f64 * k[j * kvs + g * dh + i] as f64)
                        .sum::<f64>()
                        * l.scale as f64
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = scores.iter().map(|s| (s - m).exp()).sum();
            for i in 0..dh {
                let o: f64 = (0..n_ctx)
                    .map(|j| (scores[j] - m).exp() / z * v[j * kvs + g * dh + i] as f64)
                    .sum();
                out[(t * l.n_q_heads + h) * dh + i] = o as f32;
            }
        }
    }
    out
}
