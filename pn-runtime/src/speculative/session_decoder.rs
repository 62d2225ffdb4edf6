//! Speculative decoding inside a session: the MTP block's cache kept in step with prompt
//! processing, one draft / verify / accept step, and rolling the state back to a prefix of the
//! accepted run (when a generation stops in the middle of it).

use super::accept::{judge, AcceptRule};
use super::{Drafter, SpecStats, Speculation};
use crate::sampling::{Sampler, TokenDist};
use qwen_model::{Backend, Model, ModelError, Outputs, State, StateTrace, Workspace};

/// Drafting pauses while the running acceptance rate is below this. A rejected draft costs its
/// row of the verification pass (the rollback copies the GDN state recorded after the accepted
/// prefix, no replay pass), and a drafter that is never right (a random or mismatched MTP
/// head) still wastes those rows and the drafting itself.
pub const MIN_ACCEPTANCE: f32 = 0.5;
/// Steps without drafting after the first low-acceptance verdict; doubles while probes keep
/// failing, up to [`MAX_PAUSE`].
const MIN_PAUSE: u32 = 8;
const MAX_PAUSE: u32 = 128;
/// Weight of the newest step in the running acceptance rate.
const EMA_WEIGHT: f32 = 0.25;

/// Deterministic back-off (it depends only on the accept/reject history, so a seeded run is
/// reproducible): drafting stops for a while when drafts keep being rejected, then probes.
#[derive(Debug, Clone, Copy)]
struct Backoff {
    ema: f32,
    pause: u32,
    next_pause: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            ema: 1.0,
            pause: 0,
            next_pause: MIN_PAUSE,
        }
    }
}

impl Backoff {
    /// Whether this step may draft (counts down a pause).
    fn may_draft(&mut self) -> bool {
        if self.pause > 0 {
            self.pause -= 1;
            return false;
        }
        true
    }

    /// Records a step that drafted `drafted > 0` tokens and accepted `accepted`.
    fn record(&mut self, drafted: usize, accepted: usize) {
        let rate = accepted as f32 / drafted as f32;
        self.ema = (1.0 - EMA_WEIGHT) * self.ema + EMA_WEIGHT * rate;
        if self.ema < MIN_ACCEPTANCE {
            self.pause = self.next_pause;
            self.next_pause = (self.next_pause * 2).min(MAX_PAUSE);
            // The probe after the pause is judged on its own result, from just above the bar.
            self.ema = MIN_ACCEPTANCE + EMA_WEIGHT * 0.5;
        } else if rate >= MIN_ACCEPTANCE {
            self.next_pause = MIN_PAUSE;
        }
    }
}

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
    stats: SpecStats,
    backoff: Backoff,
    // Scratch buffers, reused across steps.
    hbuf: Vec<f32>,
    rows_h: Vec<f32>,
    rows_t: Vec<u32>,
    vl: Vec<f32>,
    vh: Vec<f32>,
    mtp_logits: Vec<f32>,
    mtp_h: Vec<f32>,
    chain_h: Vec<f32>,
    hist: Vec<u32>,
    q: Vec<TokenDist>,
    p: TokenDist,
    resid: TokenDist,
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
            stats: SpecStats::default(),
            backoff: Backoff::default(),
            hbuf: Vec::new(),
            rows_h: Vec::new(),
            rows_t: Vec::new(),
            vl: Vec::new(),
            vh: Vec::new(),
            mtp_logits: vec![0.0; model.config.vocab],
            mtp_h: vec![0.0; model.config.hidden],
            chain_h: vec![0.0; model.config.hidden],
            hist: Vec::new(),
            q: Vec::new(),
            p: TokenDist::new(),
            resid: TokenDist::new(),
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
        let (pos0, r) = (state.pos(), tokens.len());
        self.hbuf.resize(r * d, 0.0);
        let (head, last) = self.hbuf.split_at_mut((r - 1) * d);
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
        // MTP rows (x_{p+1}, h_p): the first token pairs with the carried `h` (if it belongs
        // to this sequence's previous position; otherwise its row is left out).
        state.truncate_mtp(pos0.saturating_sub(1));
        self.rows_t.clear();
        self.rows_h.clear();
        let with_first = pos0 > 0 && self.h_for == Some(pos0);
        if with_first {
            self.rows_t.push(tokens[0]);
            self.rows_h.extend_from_slice(&self.last_h);
        }
        self.rows_t.extend_from_slice(&tokens[1..]);
        self.rows_h.extend_from_slice(&self.hbuf[..(r - 1) * d]);
        let rope0 = if with_first { pos0 } else { pos0 + 1 };
        self.add_mtp_rows(model, state, ws, rope0)?;
        self.last_h.copy_from_slice(&self.hbuf[(r - 1) * d..]);
        self.h_for = Some(pos0 + r);
        Ok(())
    }

    /// Adds the staged MTP rows (`rows_t` paired with `rows_h`, the first at RoPE position
    /// `rope0`) to the MTP block's cache.
    fn add_mtp_rows(
        &self,
        model: &Model<B>,
        state: &mut State<B>,
        ws: &mut Workspace<B>,
        rope0: usize,
    ) -> Result<(), ModelError> {
        if self.rows_t.is_empty() {
            return Ok(());
        }
        model.mtp_forward(
            state,
            ws,
            &self.rows_t,
            &self.rows_h,
            rope0,
            Outputs::default(),
        )
    }

    /// One speculative step. The state holds the sequence `history` (its processed tokens)
    /// and `x_n` is the sampled token that follows it. Drafts up to `max_draft` (and at most
    /// [`n_draft`](Self::n_draft)) tokens, verifies `[x_n, drafts]` in one trunk pass, and
    /// returns the accepted drafts and the token after them (the replacement of the first
    /// rejected draft, or the bonus token). The state then holds `history, x_n, accepted`.
    #[allow(clippy::too_many_arguments)]
    pub fn step(
        &mut self,
        model: &Model<B>,
        state: &mut State<B>,
        ws: &mut Workspace<B>,
        sampler: &mut Sampler,
        history: &[u32],
        x_n: u32,
        max_draft: usize,
    ) -> Result<(Vec<u32>, u32), ModelError> {
        self.undo.valid = false;
        let (cfg, be) = (&model.config, &model.backend);
        let (v, d) = (cfg.vocab, cfg.hidden);
        let n = state.pos();
        let k_max = if self.backoff.may_draft() {
            max_draft.min(self.n_draft)
        } else {
            self.stats.paused_steps += 1;
            0
        };
        // Penalties see at most the last `penalty_last_n` tokens: keep only those.
        let window = sampler.params().penalty_last_n;
        self.hist.clear();
        self.hist
            .extend_from_slice(&history[history.len().saturating_sub(window)..]);
        self.hist.push(x_n);
        let base = self.hist.len();
        let h_valid = self.use_mtp && n > 0 && self.h_for == Some(n);

        // 1. Draft.
        let mut drafts: Vec<u32> = Vec::with_capacity(k_max);
        let mut mtp_after_x = None;
        if k_max > 0 {
            if let Some(dr) = self.drafter.as_deref_mut() {
                let mut seq = history.to_vec();
                seq.push(x_n);
                drafts = dr.draft(&seq, k_max);
                drafts.truncate(k_max);
                drafts.retain(|&t| (t as usize) < v);
                for (i, &t) in drafts.iter().enumerate() {
                    if self.q.len() <= i {
                        self.q.push(TokenDist::new());
                    }
                    self.q[i].reset(v);
                    self.q[i].push(t, 1.0);
                }
            } else if h_valid {
                state.truncate_mtp(n - 1);
                let out = Outputs {
                    logits: Some(&mut self.mtp_logits),
                    hidden: Some(&mut self.mtp_h),
                    all_rows: false,
                    layer_residuals: None,
                };
                model.mtp_forward(state, ws, &[x_n], &self.last_h, n, out)?;
                mtp_after_x = Some(state.mtp_len());
                loop {
                    let i = drafts.len();
                    if self.q.len() <= i {
                        self.q.push(TokenDist::new());
                    }
                    sampler.distribution(&mut self.mtp_logits, &self.hist, &mut self.q[i]);
                    let t = sampler.draw(&self.q[i]);
                    drafts.push(t);
                    self.hist.push(t);
                    if drafts.len() == k_max {
                        break;
                    }
                    // Chain: the draft with the MTP block's own hidden state.
                    self.chain_h.copy_from_slice(&self.mtp_h);
                    let out = Outputs {
                        logits: Some(&mut self.mtp_logits),
                        hidden: Some(&mut self.mtp_h),
                        all_rows: false,
                        layer_residuals: None,
                    };
                    model.mtp_forward(state, ws, &[t], &self.chain_h, n + drafts.len(), out)?;
                }
                self.hist.truncate(base);
            }
        }
        self.hist.extend_from_slice(&drafts);

        // 2. Verify [x_n, drafts] in one trunk pass (all rows' logits and hidden states).
        let k = drafts.len() + 1;
        let mut batch = Vec::with_capacity(k);
        batch.push(x_n);
        batch.extend_from_slice(&drafts);
        self.vl.resize(k * v, 0.0);
        self.vh.resize(k * d, 0.0);
        let out = Outputs {
            logits: Some(&mut self.vl[..k * v]),
            hidden: Some(&mut self.vh[..k * d]),
            all_rows: true,
            layer_residuals: None,
        };
        if k > 1 {
            // Record the GDN state after every row: a rejection then rolls back by copying.
            // (A trace too small for this step is dropped before the larger one is made.)
            let trace = match self.trace.take().filter(|t| t.max_rows() >= k) {
                Some(t) => self.trace.insert(t),
                None => self.trace.insert(StateTrace::new(cfg, be, k)?),
            };
            model.forward_traced(state, ws, &batch, out, trace)?;
        } else {
            model.forward(state, ws, &batch, out)?;
        }
        self.stats.target_passes += 1;
        self.stats.drafted += drafts.len() as u64;

        // 3. Accept: row `a` predicts the token after `batch[a]`.
        let mut a = 0;
        let next = loop {
            let row = &mut self.vl[a * v..(a + 1) * v];
            sampler.distribution(row, &self.hist[..base + a], &mut self.p);
            if a == drafts.len() {
                break sampler.draw(&self.p);
            }
            match judge(
                self.rule,
                sampler,
                drafts[a],
                &self.p,
                &self.q[a],
                &mut self.resid,
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
            self.rows_t.clear();
            self.rows_h.clear();
            let rope0;
            match mtp_after_x {
                Some(m) => {
                    state.truncate_mtp(m);
                    rope0 = n + 1;
                }
                None => {
                    state.truncate_mtp(n.saturating_sub(1));
                    if h_valid {
                        self.rows_t.push(x_n);
                        self.rows_h.extend_from_slice(&self.last_h);
                        rope0 = n;
                    } else {
                        rope0 = n + 1;
                    }
                }
            }
            self.rows_t.extend_from_slice(&drafts[..a]);
            self.rows_h.extend_from_slice(&self.vh[..a * d]);
            let x_row = mtp_after_x.is_some() || h_valid;
            self.undo.mtp_base = state.mtp_len() - usize::from(mtp_after_x.is_some());
            self.undo.x_row = x_row;
            if x_row {
                self.undo.h_prev.clear();
                self.undo.h_prev.extend_from_slice(&self.last_h);
            }
            self.add_mtp_rows(model, state, ws, rope0)?;
            self.last_h.copy_from_slice(&self.vh[a * d..(a + 1) * d]);
            self.h_for = Some(n + a + 1);
        }
        self.undo.valid = a > 0;
        self.undo.pos = n;
        self.undo.tokens.clear();
        self.undo.tokens.extend_from_slice(&batch[..a + 1]);
        Ok((drafts[..a].to_vec(), next))
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
            self.rows_t.clear();
            self.rows_h.clear();
            if u.x_row {
                self.rows_t.push(u.tokens[0]);
                self.rows_h.extend_from_slice(&u.h_prev);
            }
            self.rows_t.extend_from_slice(&u.tokens[1..keep]);
            self.rows_h.extend_from_slice(&self.vh[..(keep - 1) * d]);
            let rope0 = if u.x_row { u.pos } else { u.pos + 1 };
            if !self.rows_t.is_empty() {
                model.mtp_forward(
                    state,
                    ws,
                    &self.rows_t,
                    &self.rows_h,
                    rope0,
                    Outputs::default(),
                )?;
            }
            self.last_h
                .copy_from_slice(&self.vh[(keep - 1) * d..keep * d]);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::{SamplingParams, TokenMask};
    use crate::speculative::Drafter;
    use qwen_model::CpuBackend;

    fn argmax(row: &[f32]) -> u32 {
        let mut best = 0;
        for (i, &x) in row.iter().enumerate() {
            if x > row[best] {
                best = i;
            }
        }
        best as u32
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
                .step(m, &mut st, &mut ws, &mut sampler, &history, x_n, max_draft)
                .unwrap();
            let s1 = sd.stats();
            // The trunk cost from the decoder's counters: its verification passes of
            // `1 + drafts` rows each, plus a replay (one more pass over the replayed rows).
            let (passes, replayed) = (
                s1.target_passes - s0.target_passes,
                s1.replayed - s0.replayed,
            );
            let cost = (
                passes + u64::from(replayed > 0),
                passes + (s1.drafted - s0.drafted) + replayed,
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
        assert_eq!(stats.replayed, 0);
        assert_eq!(stats.accepted, 0);
    }

    /// One draft of two accepted per step: after the rollback the state is, bitwise, that of
    /// a fresh state fed the same calls the old rollback made (the prompt as the decoder
    /// feeds it, then each step's kept `[x_n, d_1]` in one call), and a step costs one pass.
    #[test]
    fn rollback_state_equals_a_fresh_state_fed_the_kept_tokens() {
        let n_new = 21;
        let run = demo_run(n_new);
        let m = &run.model;
        let (cfg, be) = (&m.config, &m.backend);
        let r = run.prompt.len();
        let mut ws = m.new_workspace(16).unwrap();
        let mut fresh = m.new_state(256).unwrap();
        m.forward(
            &mut fresh,
            &mut ws,
            &run.prompt[..r - 1],
            Outputs::default(),
        )
        .unwrap();
        m.forward(
            &mut fresh,
            &mut ws,
            &run.prompt[r - 1..],
            Outputs::default(),
        )
        .unwrap();
        let mut fed = 0;
        let mut compared = 0;
        let (out, stats) = generate(&run, 1, 2, n_new, |m, st, cost, drafted, acc| {
            assert_eq!(cost, (1, 1 + drafted as u64), "one pass, no replay");
            let kept = &run.truth[fed..fed + 1 + acc.len()];
            assert_eq!(&kept[1..], acc);
            m.forward(&mut fresh, &mut ws, kept, Outputs::default())
                .unwrap();
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
        assert_eq!(stats.replayed, 0);
    }

    #[test]
    fn backoff_pauses_doubles_and_recovers() {
        let mut b = Backoff::default();
        // Always rejected: 1.0 -> 0.75 -> 0.56 -> 0.42 < 0.5 on the third step.
        for _ in 0..2 {
            assert!(b.may_draft());
            b.record(2, 0);
            assert_eq!(b.pause, 0);
        }
        assert!(b.may_draft());
        b.record(2, 0);
        assert_eq!(b.pause, MIN_PAUSE);
        for _ in 0..MIN_PAUSE {
            assert!(!b.may_draft());
        }
        // A failed probe pauses twice as long.
        assert!(b.may_draft());
        b.record(2, 0);
        assert_eq!(b.pause, 2 * MIN_PAUSE);
        while !b.may_draft() {}
        // A good probe ends the doubling; steady acceptance keeps drafting on.
        b.record(2, 2);
        assert_eq!(b.next_pause, MIN_PAUSE);
        for _ in 0..50 {
            assert!(b.may_draft());
            b.record(2, 1);
        }
        assert_eq!(b.pause, 0);
    }
}
