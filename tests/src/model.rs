//! Helpers over a loaded [`qwen_model::Model`].

use qwen_model::{Backend, Model, Outputs, State};

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
