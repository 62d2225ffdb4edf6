//! What a slot of a [`Batch`](crate::engine::batch::Batch) asks of its session core: the batch
//! runs the forward passes (its rows together with the other slots'), the core keeps the
//! sequence's tokens, logits, prompt cache and speculative decoder as a lone session does.

use super::{SessionCore, SpecRun, Start};
use crate::engine::error::{EngineError, Result};
use crate::engine::Engine;
use crate::sampling::Sampler;
use crate::speculative::{DraftNeed, MtpRow, SpecDecoder, SpecStats, StepInput};
use qwen_model::{Backend, Model, State, Workspace};
use std::sync::Arc;

/// What a slot of a [`Batch`](crate::engine::batch::Batch) asks of its session core: the batch
/// runs the forward passes (its rows together with the other slots'), the core keeps the
/// sequence's tokens, logits and prompt cache as a lone session does.
impl<B: Backend> SessionCore<B> {
    /// A core for a batch slot: as [`new`](Self::new) (speculating as the engine's options
    /// say), with a workspace of one row (the batch has its own, for its passes and for the
    /// decoder's MTP-head passes).
    pub(crate) fn for_batch(engine: Engine, model: Arc<Model<B>>) -> Result<SessionCore<B>> {
        let spec = engine.options().speculation;
        Self::build(engine, model, spec, 1)
    }

    /// Starts the sequence `full` (the whole sequence, as
    /// [`Session::generate_sequence`](super::Session::generate_sequence)): rewinds to its
    /// longest reusable prefix and returns that prefix's length and the prompt-cache marks of
    /// the rest (absolute positions where [`batch_checkpoint`](Self::batch_checkpoint) is to
    /// be called before the chunk starting there).
    pub(crate) fn batch_begin(&mut self, full: &[u32]) -> Result<(usize, Vec<usize>)> {
        if full.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        self.check_room_total(full.len())?;
        let reused = self.rewind_to_prefix_of(full)?;
        let marks = if reused < full.len() {
            self.prompt_marks(&full[reused..])
        } else {
            Vec::new()
        };
        self.has_logits = reused == full.len() && self.has_logits;
        Ok((reused, marks))
    }

    /// Tokens the state holds (the position of the next one fed).
    pub(crate) fn batch_pos(&self) -> usize {
        self.fed.len()
    }

    /// [`CoreOps::reusable_prefix`] for the batch.
    pub(crate) fn reusable_prefix_of(&self, tokens: &[u32]) -> usize {
        match self.plan(tokens) {
            Start::Live(n) | Start::Checkpoint(n) => n,
            Start::Empty => 0,
        }
    }

    /// Back to an empty sequence and prompt cache (after a failed pass).
    pub(crate) fn batch_reset(&mut self) -> Result<()> {
        let m = &*self.model;
        self.fed.clear();
        self.pending = None;
        self.has_logits = false;
        self.kept.seq = None;
        self.cache.clear();
        self.state.reset(&m.config, &m.backend)?;
        Ok(())
    }

    /// Whether the logits after the last fed token are at hand (a prompt the cache held whole).
    pub(crate) fn batch_has_logits(&self) -> bool {
        self.has_logits
    }

    /// A prompt-cache checkpoint at the current position (a mark inside a prompt), or at the
    /// end of a prompt with its logits when `end`.
    pub(crate) fn batch_checkpoint(&mut self, end: bool) -> Result<()> {
        if end {
            return self.prompt_checkpoint();
        }
        let m = &*self.model;
        let h = self
            .spec
            .as_ref()
            .and_then(|sp| sp.carried_hidden(self.fed.len()));
        self.cache
            .insert(&self.state, &m.config, &m.backend, None, h)?;
        Ok(())
    }

    /// The pending token (a sampled one not yet fed), taken: the batch feeds it next.
    pub(crate) fn batch_take_pending(&mut self) -> Option<u32> {
        self.pending.take()
    }

    /// The state, the logits buffer (`[vocab]`) and the speculative decoder, for one
    /// batched pass.
    pub(crate) fn batch_parts(
        &mut self,
    ) -> (&mut State<B>, &mut [f32], Option<&mut SpecDecoder<B>>) {
        (
            &mut self.state,
            self.logits.as_mut_slice(),
            self.spec.as_mut(),
        )
    }

    /// After a batched pass fed `tokens` (not a speculative verification); `logits`: whether
    /// it wrote the logits after the last. A speculative decoder that tracks hidden states
    /// (its [`feed_outputs`](SpecDecoder::feed_outputs) were the pass's) adds their MTP rows,
    /// on the batch's workspace `ws`.
    pub(crate) fn batch_fed(
        &mut self,
        ws: &mut Workspace<B>,
        tokens: &[u32],
        logits: bool,
    ) -> Result<()> {
        self.fed.extend_from_slice(tokens);
        self.has_logits = logits;
        self.kept.seq = None;
        if let Some(sp) = self.spec.as_mut() {
            sp.fed(&self.model, &mut self.state, ws, tokens)?;
        }
        Ok(())
    }

    /// Whether the batch feeds this slot's rows with the decoder's hidden-state outputs
    /// ([`SpecDecoder::feed_outputs`]): then a row with logits is fed alone.
    pub(crate) fn batch_tracks_hidden(&self) -> bool {
        self.spec.as_ref().is_some_and(|sp| sp.tracks_hidden())
    }

    /// Whether the next decode step can be a speculative one (as a lone session's: a decoder,
    /// and room for `x_n` and the token after it).
    pub(crate) fn batch_can_speculate(&self) -> bool {
        self.spec.is_some() && self.fed.len() + 2 <= self.state.capacity()
    }

    /// Starts drafting the step after `x_n` (the sequence's next token), as a lone
    /// speculative step does: [`DraftNeed::MtpRow`] while the MTP head is to draft (the batch
    /// runs the rows of all drafting slots together: [`batch_mtp_parts`](Self::batch_mtp_parts),
    /// then [`batch_spec_draft_advance`](Self::batch_spec_draft_advance)), else the staged
    /// verification ([`batch_spec_rows`](Self::batch_spec_rows)).
    pub(crate) fn batch_spec_draft_start(
        &mut self,
        sampler: &mut Sampler,
        x_n: u32,
        budget: usize,
    ) -> Result<DraftNeed> {
        let room = self.state.capacity() - self.fed.len() - 2;
        let sp = self.spec.as_mut().ok_or(EngineError::EmptyPrompt)?;
        let input = StepInput {
            history: &self.fed,
            x_n,
            max_draft: budget.min(room),
        };
        Ok(sp.draft_start(&self.model, &mut self.state, sampler, input)?)
    }

    /// The state and the MTP row of the draft in progress, for the batch's MTP pass.
    pub(crate) fn batch_mtp_parts(&mut self) -> Result<(&mut State<B>, MtpRow<'_>)> {
        let sp = self.spec.as_mut().ok_or(EngineError::EmptyPrompt)?;
        Ok((&mut self.state, sp.mtp_row()?))
    }

    /// After the batch's MTP pass ran this slot's row: the next draft, and the next row or
    /// the staged verification.
    /// `kept`: the batch's MTP pass kept its logits in `ws`, this slot's as that sequence.
    pub(crate) fn batch_spec_draft_advance(
        &mut self,
        ws: &Workspace<B>,
        kept: Option<usize>,
        sampler: &mut Sampler,
    ) -> Result<DraftNeed> {
        let sp = self.spec.as_mut().ok_or(EngineError::EmptyPrompt)?;
        sp.set_draft_kept(kept);
        Ok(sp.draft_advance(&self.model, ws, &mut self.state, sampler)?)
    }

    /// Appends to `rows` the staged verification rows `[x_n, drafts]` the batch's pass is to
    /// run ([`batch_parts`](Self::batch_parts)' decoder gives their outputs).
    pub(crate) fn batch_spec_rows(&self, rows: &mut Vec<u32>) {
        if let Some(sp) = self.spec.as_ref() {
            rows.extend_from_slice(sp.verify_rows());
        }
    }

    /// After the batch's pass verified the staged rows `[x_n, drafts]`: accepts (rolling back a rejected
    /// tail), starts emitting the run into `run` as [`spec_step`](Self::spec_step) does, and
    /// returns its first token (the others follow from [`batch_run_next`](Self::batch_run_next)).
    pub(crate) fn batch_spec_finish(
        &mut self,
        ws: &mut Workspace<B>,
        sampler: &mut Sampler,
        x_n: u32,
        run: &mut SpecRun,
    ) -> Result<u32> {
        let sp = self.spec.as_mut().ok_or(EngineError::EmptyPrompt)?;
        let (accepted, next) = sp.finish(&self.model, &mut self.state, ws, sampler)?;
        run.base = self.fed.len();
        run.tokens.clear();
        run.tokens.push(x_n);
        run.tokens.extend_from_slice(&accepted);
        run.tokens.push(next);
        run.emitted = 1;
        Ok(self.emit_from_run(run))
    }

    /// The next token of the current speculative `run`, if it has one not yet emitted.
    pub(crate) fn batch_run_next(&mut self, run: &mut SpecRun) -> Option<u32> {
        if run.emitted + 1 < run.tokens.len() {
            run.emitted += 1;
            return Some(self.emit_from_run(run));
        }
        None
    }

    /// Rolls the state back to the emitted tokens when a sequence stopped inside a
    /// speculative run (as a lone session does before it next uses its state).
    pub(crate) fn batch_settle(&mut self) -> Result<()> {
        self.settle_spec()
    }

    /// The speculative decoder's counters (`None`: speculation off).
    pub(crate) fn batch_spec_stats(&self) -> Option<SpecStats> {
        self.spec.as_ref().map(|sp| sp.stats())
    }

    /// Zeroes the decoder's counters and back-off at a sequence's start (as a generation's).
    pub(crate) fn batch_reset_spec_stats(&mut self) {
        if let Some(sp) = self.spec.as_mut() {
            sp.reset_stats();
        }
    }

    /// Samples the next token from the logits at hand and makes it pending (`None`: the
    /// context is full, nothing sampled), as a plain decoding step does.
    /// Logits kept on the backend by the batch's last pass are read from its workspace `ws`.
    pub(crate) fn batch_sample(
        &mut self,
        ws: &Workspace<B>,
        sampler: &mut Sampler,
    ) -> Result<Option<u32>> {
        if !self.has_logits || self.fed.len() >= self.state.capacity() {
            self.batch_fetch_kept(ws)?;
            return Ok(None);
        }
        let id = self
            .kept
            .sample(&self.model, ws, &mut self.logits, sampler, &self.fed)?;
        self.has_logits = false;
        self.pending = Some(id);
        Ok(Some(id))
    }

    /// Whether the batch's passes keep their logits on the backend (the decode path of
    /// [`LogitsPath`](crate::engine::LogitsPath)): then after each pass every slot that wanted
    /// logits is told where its row is ([`batch_logits_kept`](Self::batch_logits_kept)).
    pub(crate) fn batch_keeps_logits(&self) -> bool {
        self.kept.on
    }

    /// The batch's last pass kept this slot's logits as its sequence `seq` (a plain row, or
    /// the decoder's verification rows when `verify`).
    pub(crate) fn batch_logits_kept(&mut self, seq: usize, verify: bool) {
        match self.spec.as_mut() {
            Some(sp) if verify => sp.set_verify_kept(Some(seq)),
            _ => self.kept.seq = Some(seq),
        }
    }

    /// Brings logits kept in the batch's workspace `ws` to the host row (a prompt-end
    /// checkpoint stores them; forced tokens observe them).
    pub(crate) fn batch_fetch_kept(&mut self, ws: &Workspace<B>) -> Result<()> {
        Ok(self.kept.fetch(&self.model, ws, &mut self.logits)?)
    }

    /// [`batch_sample`](Self::batch_sample) for a token emitted without sampling (the thinking
    /// budget's closing sequence): the logits are only observed (for its log probability).
    pub(crate) fn batch_force(
        &mut self,
        ws: &Workspace<B>,
        sampler: &mut Sampler,
        id: u32,
    ) -> Result<Option<u32>> {
        self.batch_fetch_kept(ws)?;
        if !self.has_logits || self.fed.len() >= self.state.capacity() {
            return Ok(None);
        }
        sampler.observe(&mut self.logits);
        self.has_logits = false;
        self.pending = Some(id);
        Ok(Some(id))
    }
}
