//! The draft phase of a speculative step, as a small state machine so that the MTP rows of
//! several sequences can run in one pass ([`Model::mtp_forward_batch`], the batch engine):
//! [`SpecDecoder::draft_start`], then while it says [`DraftNeed::MtpRow`] the caller runs
//! [`SpecDecoder::mtp_row`] and calls [`SpecDecoder::draft_advance`]. A lone step
//! ([`SpecDecoder::draft`]) runs the same machine with one-sequence MTP passes.

use super::{SpecDecoder, StepInput};
use crate::sampling::{Sampler, TokenDist};
use qwen_model::topk::DEVICE_TOP_K_MAX;
use qwen_model::{Backend, Model, ModelError, Outputs, State, StateTrace, Workspace};

/// What a draft in progress needs next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraftNeed {
    /// One MTP row ([`SpecDecoder::mtp_row`], run alone or beside other sequences' rows),
    /// then [`SpecDecoder::draft_advance`].
    MtpRow,
    /// The verification rows `[x_n, drafts]` are staged
    /// ([`SpecDecoder::verify_parts`]); the value is their count.
    Staged(usize),
}

/// The MTP row a draft needs next: its token, the hidden state it pairs with, its RoPE
/// position, and where its outputs go (the decoder's draft logits and MTP hidden state).
pub struct MtpRow<'a> {
    /// The row's token (one).
    pub token: &'a [u32],
    /// The hidden state it pairs with: `[hidden]`.
    pub hidden: &'a [f32],
    /// Its RoPE position.
    pub rope_pos: usize,
    /// The last row's logits and MTP hidden state, written into the decoder.
    pub out: Outputs<'a>,
}

/// An MTP draft between its rows.
#[derive(Debug)]
pub(super) struct Drafting {
    /// Drafts wanted in this step.
    k_max: usize,
    /// The next row chains a draft (pairs with the MTP block's own hidden state, `chain_h`)
    /// rather than `x_n` with the trunk's `last_h`.
    chained: bool,
    /// The next row's token and RoPE position.
    token: [u32; 1],
    rope_pos: usize,
}

impl<B: Backend> SpecDecoder<B> {
    /// The first phase of a [`step`](Self::step): drafts the tokens after `input.x_n` (with
    /// the MTP head, on the state's MTP cache) and stages the verification rows `[x_n,
    /// drafts]`, its outputs and (with drafts) its state trace. Returns the row count.
    pub fn draft(
        &mut self,
        model: &Model<B>,
        state: &mut State<B>,
        ws: &mut Workspace<B>,
        sampler: &mut Sampler,
        input: StepInput<'_>,
    ) -> Result<usize, ModelError> {
        let mut need = self.draft_start(model, state, sampler, input)?;
        loop {
            match need {
                DraftNeed::Staged(k) => return Ok(k),
                DraftNeed::MtpRow => {
                    // The draft row's logits stay on the backend where the sampler draws
                    // from candidates.
                    let keep = self.keeps_verify(sampler);
                    if keep {
                        ws.keep_next_logits();
                    }
                    let r = self.mtp_row()?;
                    model.mtp_forward(state, ws, r.token, r.hidden, r.rope_pos, r.out)?;
                    self.set_draft_kept(keep.then_some(0));
                    need = self.draft_advance(model, ws, state, sampler)?;
                }
            }
        }
    }

    /// Starts a step's draft: how many tokens to draft, the penalty window, and either the
    /// first MTP row to run ([`DraftNeed::MtpRow`]) or the staged verification (no MTP
    /// drafting: none wanted, drafting paused, another [`Drafter`](crate::speculative::Drafter),
    /// or no carried hidden state for `x_n`).
    pub fn draft_start(
        &mut self,
        model: &Model<B>,
        state: &mut State<B>,
        sampler: &mut Sampler,
        input: StepInput<'_>,
    ) -> Result<DraftNeed, ModelError> {
        let StepInput {
            history,
            x_n,
            max_draft,
        } = input;
        self.undo.valid = false;
        self.drafting = None;
        let v = model.config.vocab;
        let n = state.pos();
        let k_max = if self.backoff.may_draft() {
            max_draft.min(self.n_draft)
        } else {
            self.stats.paused_steps += 1;
            0
        };
        // Penalties see at most the last `penalty_last_n` tokens: keep only those.
        let window = sampler.params().penalty_last_n;
        self.penalty_hist.clear();
        self.penalty_hist
            .extend_from_slice(&history[history.len().saturating_sub(window)..]);
        self.penalty_hist.push(x_n);
        let base = self.penalty_hist.len();
        let h_valid = self.use_mtp && n > 0 && self.h_for == Some(n);
        let p = &mut self.pending;
        p.rows.clear();
        p.rows.push(x_n);
        (p.n, p.base, p.mtp_after_x, p.h_valid) = (n, base, None, h_valid);
        self.drafts.clear();
        if k_max > 0 {
            if let Some(dr) = self.drafter.as_deref_mut() {
                let mut seq = history.to_vec();
                seq.push(x_n);
                self.drafts = dr.draft(&seq, k_max);
                self.drafts.truncate(k_max);
                self.drafts.retain(|&t| (t as usize) < v);
                for (i, &t) in self.drafts.iter().enumerate() {
                    if self.draft_dists.len() <= i {
                        self.draft_dists.push(TokenDist::new());
                    }
                    self.draft_dists[i].reset(v);
                    self.draft_dists[i].push(t, 1.0);
                }
            } else if h_valid {
                state.truncate_mtp(n - 1);
                self.drafting = Some(Drafting {
                    k_max,
                    chained: false,
                    token: [x_n],
                    rope_pos: n,
                });
                return Ok(DraftNeed::MtpRow);
            }
        }
        self.stage(model)
    }

    /// The MTP row the draft in progress needs (after [`DraftNeed::MtpRow`]).
    pub fn mtp_row(&mut self) -> Result<MtpRow<'_>, ModelError> {
        let Some(d) = &self.drafting else {
            return Err(ModelError::BadArgument(
                "speculative mtp_row without a draft in progress".into(),
            ));
        };
        Ok(MtpRow {
            token: &d.token,
            hidden: if d.chained {
                &self.chain_h
            } else {
                &self.last_h
            },
            rope_pos: d.rope_pos,
            out: Outputs {
                logits: Some(&mut self.mtp_logits),
                hidden: Some(&mut self.mtp_h),
                all_rows: false,
                layer_residuals: None,
            },
        })
    }

    /// After the MTP row of [`mtp_row`](Self::mtp_row) ran on `state`: draws the next draft
    /// from its logits, then asks for the chained row after it, or stages the verification
    /// once `k_max` drafts are drawn.
    ///
    /// Its logits are in the row's `MtpRow::out` buffer, or kept on the backend in `ws` where
    /// [`set_draft_kept`](Self::set_draft_kept) said so (then drawn from the sampler's best
    /// candidates when it takes them).
    pub fn draft_advance(
        &mut self,
        model: &Model<B>,
        ws: &Workspace<B>,
        state: &mut State<B>,
        sampler: &mut Sampler,
    ) -> Result<DraftNeed, ModelError> {
        let Some(dr) = self.drafting.as_mut() else {
            return Err(ModelError::BadArgument(
                "speculative draft_advance without a draft in progress".into(),
            ));
        };
        if !dr.chained {
            self.pending.mtp_after_x = Some(state.mtp_len());
        }
        let i = self.drafts.len();
        if self.draft_dists.len() <= i {
            self.draft_dists.push(TokenDist::new());
        }
        let kept = self.kept_draft.take();
        let v = model.config.vocab;
        match (kept, kept.and(sampler.candidates_needed(DEVICE_TOP_K_MAX))) {
            (Some(seq), Some(k)) => {
                let ids = sampler.candidate_ids(v);
                model.kept_top_k(ws, (seq, 0), ids, k, &mut self.cand)?;
                crate::engine::count_candidate_row();
                sampler.distribution_candidates(&self.cand, v, &mut self.draft_dists[i]);
            }
            (kept, _) => {
                if let Some(seq) = kept {
                    model.kept_logits(ws, (seq, 0), &mut self.mtp_logits)?;
                }
                sampler.distribution(
                    &mut self.mtp_logits,
                    &self.penalty_hist,
                    &mut self.draft_dists[i],
                );
            }
        }
        let t = sampler.draw(&self.draft_dists[i]);
        self.drafts.push(t);
        self.penalty_hist.push(t);
        if self.drafts.len() == dr.k_max {
            self.drafting = None;
            return self.stage(model);
        }
        // Chain: the draft with the MTP block's own hidden state.
        self.chain_h.copy_from_slice(&self.mtp_h);
        dr.chained = true;
        dr.token = [t];
        dr.rope_pos = self.pending.n + self.drafts.len();
        Ok(DraftNeed::MtpRow)
    }

    /// Stages the verification of `[x_n, drafts]` (all rows' logits and hidden states, and the
    /// state trace a pass with drafts records).
    fn stage(&mut self, model: &Model<B>) -> Result<DraftNeed, ModelError> {
        let (cfg, be) = (&model.config, &model.backend);
        let (v, d) = (cfg.vocab, cfg.hidden);
        self.penalty_hist.truncate(self.pending.base);
        self.penalty_hist.extend_from_slice(&self.drafts);
        let k = self.drafts.len() + 1;
        let p = &mut self.pending;
        p.rows.truncate(1);
        p.rows.extend_from_slice(&self.drafts);
        self.verify_logits.resize(k * v, 0.0);
        self.verify_h.resize(k * d, 0.0);
        if k > 1 && self.trace.as_ref().is_none_or(|t| t.max_rows() < k) {
            // Record the GDN state after every row: a rejection then rolls back by copying.
            // (A trace too small for this step is dropped before the larger one is made.)
            self.trace = None;
            self.trace = Some(StateTrace::new(cfg, be, k)?);
        }
        Ok(DraftNeed::Staged(k))
    }
}
