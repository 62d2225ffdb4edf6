//! Speculative decoding inside a session: the MTP block's cache kept in step with prompt
//! processing, one draft / verify / accept step, and rolling the state back to a prefix of the
//! accepted run (when a generation stops in the middle of it).

use super::accept::{judge, AcceptRule};
use super::backoff::Backoff;
use super::{Drafter, SpecStats, Speculation};
use crate::sampling::{Sampler, TokenDist};
use qwen_model::topk::DEVICE_TOP_K_MAX;
use qwen_model::{Backend, Model, ModelError, Outputs, State, StateTrace, Workspace};

/// What [`SpecDecoder::step`] must remember to roll back to a prefix of its accepted run.
#[derive(Debug, Default)]
struct Undo {
    /// The step's run is valid (the state holds exactly `tokens` after `pos`).
    valid: bool,
    /// Trunk position before the verification pass (the trace's first position).
    pos: usize,
    /// `[x_n, d_1..d_a]`: the tokens the state processed in the step.
    tokens: Vec<u32>,
    /// MTP cache length before the row of `x_n`.
    mtp_base: usize,
    /// Whether `x_n` got an MTP row (it needs the trunk's `h_{n-1}`, kept in `h_prev`).
    x_row: bool,
    h_prev: Vec<f32>,
}

/// A step between its draft ([`SpecDecoder::draft`]) and its verification pass
/// ([`SpecDecoder::finish`]).
#[derive(Debug, Default)]
struct Pending {
    /// Trunk position before the verification pass.
    n: usize,
    /// Length of `penalty_hist` before the drafts (the history window and `x_n`).
    base: usize,
    /// `[x_n, d_1..d_N]`: the verification rows.
    rows: Vec<u32>,
    /// The MTP cache length after `x_n`'s row, when drafting made that row.
    mtp_after_x: Option<usize>,
    /// The carried `h_{n-1}` belongs to this sequence (`x_n` can get its MTP row).
    h_valid: bool,
}

/// What one [`SpecDecoder::step`] continues from.
#[derive(Debug, Clone, Copy)]
pub struct StepInput<'a> {
    /// The tokens the state has processed (the sampler's penalties look at their tail).
    pub history: &'a [u32],
    /// The sampled token that follows `history`, not yet processed.
    pub x_n: u32,
    /// Most tokens to draft in this step (the generation's remaining budget and room).
    pub max_draft: usize,
}

/// Per-session speculative decoder: drafts with the model's MTP head (or a [`Drafter`]),
/// verifies the drafts in one batched trunk pass and accepts them by speculative sampling.
///
/// MTP rows follow the vLLM/transformers convention (architecture reference section 6): the
/// row of `x_{p+1}` pairs with the trunk's post-norm `h_p`; the MTP cache gets them while the
/// prompt is processed ([`forward`](Self::forward)) and for every accepted token.
pub struct SpecDecoder<B: Backend> {
    n_draft: usize,
    rule: AcceptRule,
    drafter: Option<Box<dyn Drafter + Send>>,
    use_mtp: bool,
    /// The trunk's post-norm hidden state of position `h_for - 1`.
    last_h: Vec<f32>,
    h_for: Option<usize>,
    /// GDN states after each row of the last verification pass (rollback without replay).
    trace: Option<StateTrace<B>>,
    undo: Undo,
    /// The drafted step waiting for its verification pass.
    pending: Pending,
    /// The MTP draft in progress between [`draft_start`](Self::draft_start) and its staging.
    drafting: Option<draft::Drafting>,
    /// The drafts of the step being drafted: `[<= n_draft]`.
    drafts: Vec<u32>,
    stats: SpecStats,
    backoff: Backoff,
    // Scratch buffers, reused across steps (grown on demand, never shrunk).
    /// Trunk post-norm hidden states of the tokens of one [`forward`](Self::forward) call:
    /// `[tokens, hidden]`.
    prompt_h: Vec<f32>,
    /// Tokens of the MTP rows staged for the MTP block's cache: `[rows]`.
    mtp_rows_t: Vec<u32>,
    /// The trunk hidden state each staged MTP row pairs with: `[rows, hidden]`.
    mtp_rows_h: Vec<f32>,
    /// Logits of every row of the last verification pass: `[1 + drafts, vocab]`.
    verify_logits: Vec<f32>,
    /// Trunk post-norm hidden states of every row of the last verification pass:
    /// `[1 + drafts, hidden]` (the MTP rows of the accepted tokens, and rollbacks, use them).
    verify_h: Vec<f32>,
    /// Whether verification judges from the best candidates of logits kept on the backend
    /// (`LogitsPath::candidates`), where the sampler takes them.
    candidates: bool,
    /// The sequence (in the verification pass's order; 0 alone) whose rows of that pass's
    /// kept logits [`finish`](Self::finish) reads; `None`: they are in `verify_logits`.
    kept_verify: Option<usize>,
    /// The sequence (in the MTP pass's order) whose kept row holds the last draft row's
    /// logits; `None`: they are in `mtp_logits`.
    kept_draft: Option<usize>,
    /// The best candidates of one kept row: `[<= DEVICE_TOP_K_MAX]`.
    cand: Vec<(u32, f32)>,
    /// Logits of the MTP head's last draft: `[vocab]`.
    mtp_logits: Vec<f32>,
    /// The MTP block's hidden state after its last draft: `[hidden]`.
    mtp_h: Vec<f32>,
    /// Copy of `mtp_h` fed back as the next chained draft's input: `[hidden]`.
    chain_h: Vec<f32>,
    /// The tokens the sampler's penalties see: `[<= penalty_last_n + 1 + drafts]` (the
    /// history window, `x_n`, then the drafts).
    penalty_hist: Vec<u32>,
    /// The distribution each draft was drawn from: `[drafts]`, each over the vocabulary.
    draft_dists: Vec<TokenDist>,
    /// The target's distribution at the row being judged (over the vocabulary).
    target_dist: TokenDist,
    /// The residual distribution a rejected draft's replacement is drawn from.
    residual_dist: TokenDist,
}

impl<B: Backend> std::fmt::Debug for SpecDecoder<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpecDecoder")
            .field("n_draft", &self.n_draft)
            .field("rule", &self.rule)
            .field("mtp", &self.use_mtp)
            .field("drafter", &self.drafter.is_some())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> SpecDecoder<B> {
    /// The decoder `spec` asks for: `None` when speculation is off or the model has no MTP
    /// block to draft with.
    pub fn for_model(model: &Model<B>, spec: Speculation) -> Option<SpecDecoder<B>> {
        match spec {
            Speculation::Mtp { draft } if model.config.n_mtp > 0 && draft > 0 => {
                Some(Self::new(model, draft))
            }
            _ => None,
        }
    }

    /// A decoder drafting up to `n_draft` tokens per step (with the MTP head if the model has
    /// one; set a [`Drafter`] otherwise).
    pub fn new(model: &Model<B>, n_draft: usize) -> SpecDecoder<B> {
        SpecDecoder {
            n_draft,
            rule: AcceptRule::Standard,
            drafter: None,
            use_mtp: model.config.n_mtp > 0,
            last_h: vec![0.0; model.config.hidden],
            h_for: None,
            trace: None,
            undo: Undo::default(),
            pending: Pending::default(),
            drafting: None,
            drafts: Vec::new(),
            stats: SpecStats::default(),
            backoff: Backoff::default(),
            prompt_h: Vec::new(),
            mtp_rows_t: Vec::new(),
            mtp_rows_h: Vec::new(),
            verify_logits: Vec::new(),
            candidates: false,
            kept_verify: None,
            kept_draft: None,
            cand: Vec::with_capacity(DEVICE_TOP_K_MAX),
            verify_h: Vec::new(),
            mtp_logits: vec![0.0; model.config.vocab],
            mtp_h: vec![0.0; model.config.hidden],
            chain_h: vec![0.0; model.config.hidden],
            penalty_hist: Vec::new(),
            draft_dists: Vec::new(),
            target_dist: TokenDist::new(),
            residual_dist: TokenDist::new(),
        }
    }

    /// Most tokens drafted per step.
    pub fn n_draft(&self) -> usize {
        self.n_draft
    }

    /// Sets the most tokens drafted per step (0 verifies nothing: plain decoding).
    pub fn set_n_draft(&mut self, n: usize) {
        self.n_draft = n;
    }

    /// Drafts with `drafter` instead of the MTP head (`None`: back to the MTP head). Drafts of
    /// a [`Drafter`] count as certain (their distribution is a point mass).
    pub fn set_drafter(&mut self, drafter: Option<Box<dyn Drafter + Send>>) {
        self.drafter = drafter;
    }

    /// Judges drafts from the sampler's best candidates of logits kept on the backend
    /// (`on`) instead of downloading every verified row, wherever the sampler takes
    /// candidates (see `Sampler::candidates_needed`); the accepted tokens are the same.
    pub fn set_candidates(&mut self, on: bool) {
        self.candidates = on;
    }

    /// Whether the staged verification pass should keep its logits on the backend
    /// (`Workspace::keep_next_logits`) for `sampler`; then [`set_verify_kept`](Self::set_verify_kept)
    /// says where they are before [`finish`](Self::finish).
    pub fn keeps_verify(&self, sampler: &Sampler) -> bool {
        self.candidates && sampler.candidates_needed(DEVICE_TOP_K_MAX).is_some()
    }

    /// The verification pass kept its logits on the backend, this decoder's rows as sequence
    /// `seq` of the pass (`None`: it downloaded them into the decoder, as `verify_parts` asks).
    pub fn set_verify_kept(&mut self, seq: Option<usize>) {
        self.kept_verify = seq;
    }

    /// The MTP pass of the draft row kept its logits on the backend, this decoder's row as
    /// sequence `seq` of the pass (`None`: downloaded into the row's buffer).
    pub fn set_draft_kept(&mut self, seq: Option<usize>) {
        self.kept_draft = seq;
    }

    /// Sets the acceptance rule (tests; [`AcceptRule::Standard`] is the only correct one).
    pub fn set_rule(&mut self, rule: AcceptRule) {
        self.rule = rule;
    }

    /// Counters since the last [`reset_stats`](Self::reset_stats).
    pub fn stats(&self) -> SpecStats {
        self.stats
    }

    /// The trunk's post-norm hidden state of position `pos - 1`, if this decoder carries it
    /// (the state was last advanced through [`forward`](Self::forward) or a step ending at
    /// `pos`). Prompt-cache checkpoints keep it so a restore can give the MTP head its row.
    pub fn carried_hidden(&self, pos: usize) -> Option<&[f32]> {
        (self.use_mtp && pos > 0 && self.h_for == Some(pos)).then_some(self.last_h.as_slice())
    }

    /// Sets (or, with `None`, forgets) the hidden state carried for the next MTP row after the
    /// state was restored to position `pos` from a checkpoint.
    pub fn set_carried_hidden(&mut self, at: Option<(usize, &[f32])>) {
        self.undo.valid = false;
        match at {
            Some((pos, h)) if h.len() == self.last_h.len() => {
                self.last_h.copy_from_slice(h);
                self.h_for = Some(pos);
            }
            _ => self.h_for = None,
        }
    }

    /// Zeroes the counters.
    ///
    /// The acceptance back-off starts afresh too (a generation starts at full drafting), so a
    /// seeded generation does not depend on what the session generated before.
    pub fn reset_stats(&mut self) {
        self.stats = SpecStats::default();
        self.backoff = Backoff::default();
    }

    /// Runs the trunk over `tokens` like [`Model::forward`] (`out.logits` of the last row
    /// only) and adds their rows to the MTP cache. The trunk's hidden states are needed for
    /// that, so a multi-token call runs as two passes (all rows but the last without the LM
    /// head, then the last with it).
    pub fn forward(
        &mut self,
        model: &Model<B>,
        state: &mut State<B>,
        ws: &mut Workspace<B>,
        tokens: &[u32],
        out: Outputs<'_>,
    ) -> Result<(), ModelError> {
        self.undo.valid = false;
        if !self.use_mtp || out.all_rows || out.layer_residuals.is_some() || tokens.is_empty() {
            self.h_for = None;
            return model.forward(state, ws, tokens, out);
        }
        let d = model.config.hidden;
        let r = tokens.len();
        self.prompt_h.resize(r * d, 0.0);
        let (head, last) = self.prompt_h.split_at_mut((r - 1) * d);
        if r > 1 {
            let o = Outputs {
                hidden: Some(head),
                all_rows: true,
                ..Outputs::default()
            };
            model.forward(state, ws, &tokens[..r - 1], o)?;
        }
        let o = Outputs {
            logits: out.logits,
            hidden: Some(last),
            all_rows: false,
            layer_residuals: None,
        };
        model.forward(state, ws, &tokens[r - 1..], o)?;
        self.fed(model, state, ws, tokens)
    }

    /// Whether the trunk's hidden states of fed rows are needed (the MTP cache follows them):
    /// a pass that feeds this decoder's sequence outside [`forward`](Self::forward) then takes
    /// [`feed_outputs`](Self::feed_outputs), and calls [`fed`](Self::fed) after it.
    pub fn tracks_hidden(&self) -> bool {
        self.use_mtp
    }

    /// The outputs of a pass (a batched one) feeding `rows` tokens of this decoder's sequence:
    /// the trunk's hidden state of every row (into the decoder, `[rows, hidden]`) when
    /// [`tracks_hidden`](Self::tracks_hidden), and `logits` (`[vocab]`, the last row's). With
    /// hidden states tracked, a pass with logits feeds one row (as the second pass of
    /// [`forward`](Self::forward)): the head would otherwise run over every row.
    pub fn feed_outputs<'a>(
        &'a mut self,
        hidden: usize,
        rows: usize,
        logits: Option<&'a mut [f32]>,
    ) -> Result<Outputs<'a>, ModelError> {
        self.undo.valid = false;
        if !self.use_mtp {
            return Ok(Outputs {
                logits,
                ..Outputs::default()
            });
        }
        if rows == 0 || (logits.is_some() && rows != 1) {
            return Err(ModelError::BadArgument(format!(
                "speculative feed of {rows} rows with logits (MTP-tracked feeds with logits take one row)"
            )));
        }
        self.prompt_h.resize(rows * hidden, 0.0);
        Ok(Outputs {
            logits,
            hidden: Some(&mut self.prompt_h[..rows * hidden]),
            all_rows: true,
            layer_residuals: None,
        })
    }

    /// After a pass fed `tokens` (the state now ends with them) with the outputs of
    /// [`feed_outputs`](Self::feed_outputs) (or the passes of [`forward`](Self::forward)):
    /// adds their rows to the MTP cache and carries the last row's hidden state.
    pub fn fed(
        &mut self,
        model: &Model<B>,
        state: &mut State<B>,
        ws: &mut Workspace<B>,
        tokens: &[u32],
    ) -> Result<(), ModelError> {
        self.undo.valid = false;
        let (d, r) = (model.config.hidden, tokens.len());
        if !self.use_mtp || r == 0 || self.prompt_h.len() < r * d || state.pos() < r {
            self.h_for = None;
            return Ok(());
        }
        let pos0 = state.pos() - r;
        // MTP rows (x_{p+1}, h_p): the first token pairs with the carried `h` (if it belongs
        // to this sequence's previous position; otherwise its row is left out).
        state.truncate_mtp(pos0.saturating_sub(1));
        self.mtp_rows_t.clear();
        self.mtp_rows_h.clear();
        let with_first = pos0 > 0 && self.h_for == Some(pos0);
        if with_first {
            self.mtp_rows_t.push(tokens[0]);
            self.mtp_rows_h.extend_from_slice(&self.last_h);
        }
        self.mtp_rows_t.extend_from_slice(&tokens[1..]);
        self.mtp_rows_h
            .extend_from_slice(&self.prompt_h[..(r - 1) * d]);
        let rope0 = if with_first { pos0 } else { pos0 + 1 };
        self.add_mtp_rows(model, state, ws, rope0)?;
        self.last_h
            .copy_from_slice(&self.prompt_h[(r - 1) * d..r * d]);
        self.h_for = Some(pos0 + r);
        Ok(())
    }

    /// Adds the staged MTP rows (`mtp_rows_t` paired with `mtp_rows_h`, the first at RoPE position
    /// `rope0`) to the MTP block's cache.
    fn add_mtp_rows(
        &self,
        model: &Model<B>,
        state: &mut State<B>,
        ws: &mut Workspace<B>,
        rope0: usize,
    ) -> Result<(), ModelError> {
        if self.mtp_rows_t.is_empty() {
            return Ok(());
        }
        model.mtp_forward(
            state,
            ws,
            &self.mtp_rows_t,
            &self.mtp_rows_h,
            rope0,
            Outputs::default(),
        )
    }

    /// One speculative step. The state holds the sequence `input.history` (its processed
    /// tokens) and `input.x_n` is the sampled token that follows it. Drafts up to
    /// `input.max_draft` (and at most [`n_draft`](Self::n_draft)) tokens, verifies
    /// `[x_n, drafts]` in one trunk pass, and returns the accepted drafts and the token after
    /// them (the replacement of the first rejected draft, or the bonus token). The state then
    /// holds `history, x_n, accepted`.
    ///
    /// It is [`draft`](Self::draft), the verification pass over
    /// [`verify_parts`](Self::verify_parts), then [`finish`](Self::finish): a batch runs those
    /// phases itself, the pass shared with other sequences.
    pub fn step(
        &mut self,
        model: &Model<B>,
        state: &mut State<B>,
        ws: &mut Workspace<B>,
        sampler: &mut Sampler,
        input: StepInput<'_>,
    ) -> Result<(Vec<u32>, u32), ModelError> {
        self.draft(model, state, ws, sampler, input)?;
        // One pass of at most `max_rows` rows keeps its logits whole.
        let keep = self.keeps_verify(sampler) && self.pending.rows.len() <= ws.max_rows();
        if keep {
            ws.keep_next_logits();
        }
        let (rows, out, trace) = self.verify_parts(model.config.vocab, model.config.hidden);
        match trace {
            Some(t) => model.forward_traced(state, ws, rows, out, t)?,
            None => model.forward(state, ws, rows, out)?,
        }
        self.kept_verify = keep.then_some(0);
        self.finish(model, state, ws, sampler)
    }

    /// The rows `[x_n, drafts]` of the staged verification pass.
    pub fn verify_rows(&self) -> &[u32] {
        &self.pending.rows
    }

    /// The staged verification pass of the last [`draft`](Self::draft) (`vocab` and
    /// `hidden`: the model's): its rows `[x_n, drafts]`, the outputs it writes (every row's
    /// logits and hidden state, into the decoder) and, when it has drafts, the trace of its
    /// GDN states (a pass with drafts must record it: [`finish`](Self::finish) rolls back
    /// from it).
    pub fn verify_parts(
        &mut self,
        vocab: usize,
        hidden: usize,
    ) -> (&[u32], Outputs<'_>, Option<&mut StateTrace<B>>) {
        let k = self.pending.rows.len();
        let out = Outputs {
            logits: Some(&mut self.verify_logits[..k * vocab]),
            hidden: Some(&mut self.verify_h[..k * hidden]),
            all_rows: true,
            layer_residuals: None,
        };
        let trace = if k > 1 { self.trace.as_mut() } else { None };
        (&self.pending.rows, out, trace)
    }

    /// The last phase of a [`step`](Self::step), after the verification pass ran over
    /// [`verify_parts`](Self::verify_parts): accepts a prefix of the drafts, rolls the state
    /// back past it, and keeps the MTP cache in step. Returns the accepted drafts and the
    /// token after them.
    pub fn finish(
        &mut self,
        model: &Model<B>,
        state: &mut State<B>,
        ws: &mut Workspace<B>,
        sampler: &mut Sampler,
    ) -> Result<(Vec<u32>, u32), ModelError> {
        let (cfg, be) = (&model.config, &model.backend);
        let (v, d) = (cfg.vocab, cfg.hidden);
        let Pending {
            n,
            base,
            mtp_after_x,
            h_valid,
            ..
        } = self.pending;
        let batch = std::mem::take(&mut self.pending.rows);
        let drafts = &batch[1..];
        let k = batch.len();
        if k == 0 || state.pos() != n + k {
            self.pending.rows = batch;
            return Err(ModelError::BadArgument(
                "speculative finish without its verification pass".into(),
            ));
        }
        let x_n = batch[0];
        self.stats.target_passes += 1;
        self.stats.verify_rows += k as u64;
        self.stats.drafted += drafts.len() as u64;

        // 3. Accept: row `a` predicts the token after `batch[a]`.
        // Kept logits: each judged row's candidates (or the row, downloaded, where the
        // sampler reads it whole).
        let kept = self.kept_verify.take();
        let kept_k = kept.and(sampler.candidates_needed(DEVICE_TOP_K_MAX));
        let mut a = 0;
        let next = loop {
            let row = &mut self.verify_logits[a * v..(a + 1) * v];
            match (kept, kept_k) {
                (Some(seq), Some(k)) => {
                    let ids = sampler.candidate_ids(v);
                    model.kept_top_k(ws, (seq, a), ids, k, &mut self.cand)?;
                    crate::engine::count_candidate_row();
                    sampler.distribution_candidates(&self.cand, v, &mut self.target_dist);
                }
                (Some(seq), None) => {
                    model.kept_logits(ws, (seq, a), row)?;
                    sampler.distribution(
                        row,
                        &self.penalty_hist[..base + a],
                        &mut self.target_dist,
                    );
                }
                (None, _) => {
                    sampler.distribution(row, &self.penalty_hist[..base + a], &mut self.target_dist)
                }
            }
            if a == drafts.len() {
                break sampler.draw(&self.target_dist);
            }
            match judge(
                self.rule,
                sampler,
                drafts[a],
                &self.target_dist,
                &self.draft_dists[a],
                &mut self.residual_dist,
            ) {
                Ok(()) => a += 1,
                Err(t) => break t,
            }
        };
        self.stats.accepted += a as u64;
        self.stats.generated += a as u64 + 1;
        if !drafts.is_empty() {
            self.backoff.record(drafts.len(), a);
        }

        // 4. Roll back a rejected tail: the GDN state recorded after `[x_n, d_1..d_a]` (row
        //    `a`); the KV rows past it are overwritten later.
        if a < drafts.len() {
            if let Some(t) = self.trace.as_mut() {
                state.restore_traced(cfg, be, t, a + 1)?;
            }
            self.stats.rollbacks += 1;
        }

        // 5. MTP cache: drop the chained draft rows, add rows for x_n (if not made while
        //    drafting) and for the accepted drafts with the target's hidden states.
        if self.use_mtp {
            self.mtp_rows_t.clear();
            self.mtp_rows_h.clear();
            let rope0;
            match mtp_after_x {
                Some(m) => {
                    state.truncate_mtp(m);
                    rope0 = n + 1;
                }
                None => {
                    state.truncate_mtp(n.saturating_sub(1));
                    if h_valid {
                        self.mtp_rows_t.push(x_n);
                        self.mtp_rows_h.extend_from_slice(&self.last_h);
                        rope0 = n;
                    } else {
                        rope0 = n + 1;
                    }
                }
            }
            self.mtp_rows_t.extend_from_slice(&drafts[..a]);
            self.mtp_rows_h.extend_from_slice(&self.verify_h[..a * d]);
            let x_row = mtp_after_x.is_some() || h_valid;
            self.undo.mtp_base = state.mtp_len() - usize::from(mtp_after_x.is_some());
            self.undo.x_row = x_row;
            if x_row {
                self.undo.h_prev.clear();
                self.undo.h_prev.extend_from_slice(&self.last_h);
            }
            self.add_mtp_rows(model, state, ws, rope0)?;
            self.last_h
                .copy_from_slice(&self.verify_h[a * d..(a + 1) * d]);
            self.h_for = Some(n + a + 1);
        }
        self.undo.valid = a > 0;
        self.undo.pos = n;
        self.undo.tokens.clear();
        self.undo.tokens.extend_from_slice(&batch[..a + 1]);
        let accepted = drafts[..a].to_vec();
        self.pending.rows = batch;
        self.pending.rows.clear();
        Ok((accepted, next))
    }

    /// After a [`step`](Self::step) that accepted `a` drafts, rolls the state back to
    /// position `pos` inside its run `[x_n, d_1..d_a]` (keeping `1..=a` of those tokens): a
    /// generation that stopped after emitting `d_keep` leaves its session holding `x_n` and
    /// `d_1..d_{keep-1}`.
    pub fn rollback_to(
        &mut self,
        model: &Model<B>,
        state: &mut State<B>,
        ws: &mut Workspace<B>,
        pos: usize,
    ) -> Result<(), ModelError> {
        let u = &self.undo;
        let keep = pos.saturating_sub(u.pos);
        if !u.valid
            || pos <= u.pos
            || keep >= u.tokens.len()
            || state.pos() != u.pos + u.tokens.len()
        {
            return Err(ModelError::BadArgument(format!(
                "speculative rollback to {keep} tokens of a run of {} is not possible",
                u.tokens.len()
            )));
        }
        let Some(trace) = self.trace.as_mut() else {
            return Err(ModelError::BadArgument(
                "speculative rollback without a recorded verification pass".into(),
            ));
        };
        let (cfg, be, d) = (&model.config, &model.backend, model.config.hidden);
        state.restore_traced(cfg, be, trace, keep)?;
        if self.use_mtp {
            // Rebuild the MTP rows of the kept tokens (the step wrote rows for all of them).
            state.truncate_mtp(u.mtp_base);
            self.mtp_rows_t.clear();
            self.mtp_rows_h.clear();
            if u.x_row {
                self.mtp_rows_t.push(u.tokens[0]);
                self.mtp_rows_h.extend_from_slice(&u.h_prev);
            }
            self.mtp_rows_t.extend_from_slice(&u.tokens[1..keep]);
            self.mtp_rows_h
                .extend_from_slice(&self.verify_h[..(keep - 1) * d]);
            let rope0 = if u.x_row { u.pos } else { u.pos + 1 };
            if !self.mtp_rows_t.is_empty() {
                model.mtp_forward(
                    state,
                    ws,
                    &self.mtp_rows_t,
                    &self.mtp_rows_h,
                    rope0,
                    Outputs::default(),
                )?;
            }
            self.last_h
                .copy_from_slice(&self.verify_h[(keep - 1) * d..keep * d]);
            self.h_for = Some(u.pos + keep);
        }
        self.undo.valid = false;
        Ok(())
    }
}

/// The backend-independent controls of a [`SpecDecoder`]: what a session hands out
/// (`Session::speculation_mut`) whatever device it runs on. Each method is the decoder's own.
pub trait SpecControl: Send + std::fmt::Debug {
    /// Most tokens drafted per step.
    fn n_draft(&self) -> usize;
    /// Sets the most tokens drafted per step (0 verifies nothing: plain decoding).
    fn set_n_draft(&mut self, n: usize);
    /// Drafts with `drafter` instead of the MTP head (`None`: back to the MTP head).
    fn set_drafter(&mut self, drafter: Option<Box<dyn Drafter + Send>>);
    /// Sets the acceptance rule (tests; [`AcceptRule::Standard`] is the only correct one).
    fn set_rule(&mut self, rule: AcceptRule);
    /// Counters since the last reset (the start of the current generation).
    fn stats(&self) -> SpecStats;
}

impl<B: Backend> SpecControl for SpecDecoder<B> {
    fn n_draft(&self) -> usize {
        SpecDecoder::n_draft(self)
    }
    fn set_n_draft(&mut self, n: usize) {
        SpecDecoder::set_n_draft(self, n);
    }
    fn set_drafter(&mut self, drafter: Option<Box<dyn Drafter + Send>>) {
        SpecDecoder::set_drafter(self, drafter);
    }
    fn set_rule(&mut self, rule: AcceptRule) {
        SpecDecoder::set_rule(self, rule);
    }
    fn stats(&self) -> SpecStats {
        SpecDecoder::stats(self)
    }
}

mod draft;
pub use draft::{DraftNeed, MtpRow};

#[cfg(test)]
mod tests;
