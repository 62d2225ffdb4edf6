//! The greedy decode loops: plain (the reference) and speculative (MTP or a given drafter).

use super::SpecStats;
use qwen_model::{Backend, Model, ModelError, Outputs, State, StateTrace, Workspace};

/// Errors of a speculative run.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// The model failed (bad token, context full...).
    #[error(transparent)]
    Model(#[from] ModelError),
    /// Nothing to continue.
    #[error("empty prompt")]
    EmptyPrompt,
    /// The state already holds tokens; these loops start from an empty one.
    #[error("the state already holds {0} tokens; pass an empty (reset) state")]
    StateNotEmpty(usize),
    /// MTP drafting was asked of a model without an MTP block.
    #[error("the model has no MTP block to draft with")]
    NoMtp,
}

/// A source of draft tokens other than the MTP head (tests force acceptance or rejection).
pub trait Drafter {
    /// Up to `n` tokens proposed to follow `sequence` (prompt and every token generated so far,
    /// including the next token the target already chose).
    fn draft(&mut self, sequence: &[u32], n: usize) -> Vec<u32>;
}

/// Index of the largest value (the first on ties, as plain greedy decoding picks).
fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Prefill `prompt` into the empty `state`; returns the first generated token and the trunk's
/// post-norm hidden states of every prompt token (`[prompt.len(), D]`).
fn prefill<B: Backend>(
    model: &Model<B>,
    state: &mut State<B>,
    ws: &mut Workspace<B>,
    prompt: &[u32],
) -> Result<(u32, Vec<f32>), SpecError> {
    if prompt.is_empty() {
        return Err(SpecError::EmptyPrompt);
    }
    if state.pos() != 0 {
        return Err(SpecError::StateNotEmpty(state.pos()));
    }
    let (v, d, n) = (model.config.vocab, model.config.hidden, prompt.len());
    let mut hidden = vec![0.0; n * d];
    let mut logits = vec![0.0; v];
    // All rows' hidden states (the MTP catch-up needs them) but only the last row's logits.
    if n > 1 {
        let out = Outputs {
            hidden: Some(&mut hidden[..(n - 1) * d]),
            all_rows: true,
            ..Outputs::default()
        };
        model.forward(state, ws, &prompt[..n - 1], out)?;
    }
    let out = Outputs {
        logits: Some(&mut logits),
        hidden: Some(&mut hidden[(n - 1) * d..]),
        all_rows: false,
        layer_residuals: None,
    };
    model.forward(state, ws, &prompt[n - 1..], out)?;
    Ok((argmax(&logits), hidden))
}

/// Plain greedy decoding: `max_new` tokens after `prompt`, one trunk pass per token. `state`
/// must be empty.
pub fn plain_greedy<B: Backend>(
    model: &Model<B>,
    state: &mut State<B>,
    ws: &mut Workspace<B>,
    prompt: &[u32],
    max_new: usize,
) -> Result<Vec<u32>, SpecError> {
    if max_new == 0 {
        return Ok(Vec::new());
    }
    let (first, _) = prefill(model, state, ws, prompt)?;
    let mut out = vec![first];
    let mut logits = vec![0.0; model.config.vocab];
    while out.len() < max_new {
        let last = out[out.len() - 1];
        model.forward(state, ws, &[last], Outputs::last_logits(&mut logits))?;
        out.push(argmax(&logits));
    }
    Ok(out)
}

/// MTP rows waiting to be fed (accepted tokens with the target's hidden states); they sit at
/// positions `mtp_len + 1..` and are run together with the next step's first draft row.
struct Pending {
    tokens: Vec<u32>,
    hidden: Vec<f32>,
}

/// Greedy speculative decoding: `max_new` tokens after `prompt`, equal to [`plain_greedy`]'s.
///
/// Drafts up to `n_draft` tokens per step with the MTP head (`drafter: None`) or with
/// `drafter`, verifies them in one batched trunk pass, keeps the longest prefix matching the
/// target's argmax plus the target's own next token, and rolls the GDN state back to the state
/// the verification pass recorded after the accepted tokens when a draft was rejected. `state`
/// must be empty; it ends holding the prompt and all generated tokens but the last.
pub fn greedy_generate<B: Backend>(
    model: &Model<B>,
    state: &mut State<B>,
    ws: &mut Workspace<B>,
    prompt: &[u32],
    max_new: usize,
    n_draft: usize,
    mut drafter: Option<&mut dyn Drafter>,
) -> Result<(Vec<u32>, SpecStats), SpecError> {
    let (cfg, be) = (&model.config, &model.backend);
    let (v, d) = (cfg.vocab, cfg.hidden);
    let use_mtp = drafter.is_none();
    if use_mtp && cfg.n_mtp == 0 {
        return Err(SpecError::NoMtp);
    }
    let mut stats = SpecStats::default();
    if max_new == 0 {
        return Ok((Vec::new(), stats));
    }
    let (first, hidden) = prefill(model, state, ws, prompt)?;
    let n0 = prompt.len();
    let mut out = vec![first];
    stats.generated = 1;
    let mut sequence: Vec<u32> = prompt.to_vec();
    sequence.push(first);
    // MTP row for x_{p+1} pairs with h_p: the prompt's rows 1.. wait for the first draft.
    let mut pending = Pending {
        tokens: prompt[1..].to_vec(),
        hidden: hidden[..(n0 - 1) * d].to_vec(),
    };
    let mut last_h = hidden[(n0 - 1) * d..].to_vec();
    let mut trace = StateTrace::new(cfg, be, n_draft + 1)?;
    let (mut mtp_logits, mut mtp_h, mut chain_h) = (vec![0.0; v], vec![0.0; d], vec![0.0; d]);
    while out.len() < max_new {
        let n = state.pos();
        let x_n = out[out.len() - 1];
        // Drafts past what is still wanted, or past the context, would be wasted.
        let nd = n_draft
            .min(max_new - out.len() - 1)
            .min(state.capacity().saturating_sub(n + 1));
        if use_mtp {
            pending.tokens.push(x_n);
            pending.hidden.extend_from_slice(&last_h);
        }
        let drafts: Vec<u32> = if nd == 0 {
            Vec::new()
        } else if let Some(dr) = drafter.as_deref_mut() {
            let mut dd = dr.draft(&sequence, nd);
            dd.truncate(nd);
            dd
        } else {
            let out_h = Outputs {
                logits: Some(&mut mtp_logits),
                hidden: Some(&mut mtp_h),
                all_rows: false,
                layer_residuals: None,
            };
            let pos = state.mtp_len() + 1;
            model.mtp_forward(state, ws, &pending.tokens, &pending.hidden, pos, out_h)?;
            pending.tokens.clear();
            pending.hidden.clear();
            let mut dd = vec![argmax(&mtp_logits)];
            while dd.len() < nd {
                chain_h.copy_from_slice(&mtp_h);
                let out_h = Outputs {
                    logits: Some(&mut mtp_logits),
                    hidden: Some(&mut mtp_h),
                    all_rows: false,
                    layer_residuals: None,
                };
                let tok = dd[dd.len() - 1];
                model.mtp_forward(state, ws, &[tok], &chain_h, n + dd.len(), out_h)?;
                dd.push(argmax(&mtp_logits));
            }
            dd
        };
        // Verify [x_n, d_1..d_k] in one trunk pass.
        let mut batch = Vec::with_capacity(drafts.len() + 1);
        batch.push(x_n);
        batch.extend_from_slice(&drafts);
        let k = batch.len();
        let mut vl = vec![0.0; k * v];
        let mut vh = vec![0.0; k * d];
        let out_v = Outputs {
            logits: Some(&mut vl),
            hidden: Some(&mut vh),
            all_rows: true,
            layer_residuals: None,
        };
        if k > 1 {
            model.forward_traced(state, ws, &batch, out_v, &mut trace)?;
        } else {
            model.forward(state, ws, &batch, out_v)?;
        }
        stats.target_passes += 1;
        stats.drafted += drafts.len() as u64;
        let mut a = 0;
        let next = loop {
            let t = argmax(&vl[a * v..(a + 1) * v]);
            if a < drafts.len() && drafts[a] == t {
                a += 1;
            } else {
                break t;
            }
        };
        stats.accepted += a as u64;
        if a < drafts.len() {
            // Rejected draft: back to the state recorded after the accepted rows.
            state.restore_traced(cfg, be, &mut trace, a + 1)?;
            stats.rollbacks += 1;
        }
        if use_mtp {
            // Drop the chained draft rows (they used the MTP's own h); the accepted drafts get
            // rows with the target's hidden states, fed with the next step's first draft row.
            if nd > 0 {
                state.truncate_mtp(n);
            }
            pending.tokens.extend_from_slice(&drafts[..a]);
            pending.hidden.extend_from_slice(&vh[..a * d]);
        }
        last_h.copy_from_slice(&vh[a * d..(a + 1) * d]);
        out.extend_from_slice(&drafts[..a]);
        out.push(next);
        sequence.extend_from_slice(&drafts[..a]);
        sequence.push(next);
        stats.generated += a as u64 + 1;
    }
    out.truncate(max_new);
    Ok((out, stats))
}
