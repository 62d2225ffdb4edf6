//! The session core: everything a [`Session`](super::Session) does, written once over the
//! backend `B`, and the object-safe [`CoreOps`] interface the public types call it through.

mod batch_slot;
pub(crate) mod kept;

use super::request::ProgressFn;
use crate::engine::error::{EngineError, Result};
use crate::engine::prompt_cache::PromptCache;
use crate::engine::Engine;
use crate::sampling::Sampler;
use crate::speculative::{SpecControl, SpecDecoder, SpecStats, Speculation, StepInput};
use kept::KeptLogits;
use qwen_model::{Backend, Model, Outputs, State, Workspace};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What [`Session`](super::Session) and [`Generation`](super::Generation) ask of the session
/// core of the engine's backend. `SessionCore<B>` implements it for every backend `B`; the
/// session holds a `Box<dyn CoreOps>`, so the device is picked once, when the session is made,
/// instead of at every call.
pub(super) trait CoreOps: Send {
    /// The engine the session runs on.
    fn engine(&self) -> &Engine;
    /// A sampled token not yet processed.
    fn pending(&self) -> Option<u32>;
    /// Sets the long-prompt progress callback.
    fn set_progress(&mut self, f: Option<ProgressFn>);
    /// Replaces the speculative decoder by the one `spec` asks for.
    fn set_speculation(&mut self, spec: Speculation);
    /// The speculative decoder's controls, when speculation is on.
    fn speculation_mut(&mut self) -> Option<&mut dyn SpecControl>;
    /// The speculative decoder's counters, when speculation is on.
    fn spec_stats(&self) -> Option<SpecStats>;
    /// Zeroes the speculative decoder's counters (and its back-off), at a generation's start.
    fn reset_spec_stats(&mut self);
    /// Positions of the prompt cache's checkpoints (ascending).
    fn prompt_cache_positions(&self) -> Vec<usize>;
    /// Bytes the prompt cache's checkpoints hold.
    fn prompt_cache_bytes(&self) -> u64;
    /// The logits after the last processed token, when no sampled token waits.
    fn logits(&self) -> Option<&[f32]>;
    /// Every token of the sequence (the pending one included).
    fn tokens(&self) -> Vec<u32>;
    /// Positions in use.
    fn len(&self) -> usize;
    /// Positions the session can hold.
    fn context(&self) -> usize;
    /// Back to an empty sequence and an empty prompt cache.
    fn reset(&mut self) -> Result<()>;
    /// Appends `tokens`; the logits after the last one.
    fn feed(&mut self, tokens: &[u32]) -> Result<&[f32]>;
    /// Appends `tokens`; the logits after each (`tokens.len() x vocab`).
    fn feed_all_logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>>;
    /// [`Session::generate`](super::Session::generate)'s prompt processing.
    fn start_append(&mut self, tokens: &[u32]) -> Result<PromptRun>;
    /// [`Session::generate_sequence`](super::Session::generate_sequence)'s prompt processing.
    fn start_sequence(&mut self, full: &[u32]) -> Result<PromptRun>;
    /// Leading tokens of `tokens` the session would not process again.
    fn reusable_prefix(&self, tokens: &[u32]) -> usize;
    /// The next token of a generation (`None`: the context is full).
    fn next_id(
        &mut self,
        sampler: &mut Sampler,
        run: &mut SpecRun,
        budget: usize,
    ) -> Result<Option<u32>>;
    /// Emits `id` as the next token without sampling (a thinking budget's forced tokens):
    /// processes the pending token, lets `sampler` observe the logits (log probabilities),
    /// and makes `id` pending. Unemitted tokens of a speculative `run` are dropped. `None`: the
    /// context is full.
    fn force_next(
        &mut self,
        sampler: &mut Sampler,
        run: &mut SpecRun,
        id: u32,
    ) -> Result<Option<u32>>;
}

/// What processing a generation's prompt did: tokens processed, tokens reused, time taken.
pub(super) struct PromptRun {
    pub(super) processed: usize,
    pub(super) reused: usize,
    pub(super) time: Duration,
}

/// The last speculative step's run `[x_n, accepted drafts, next]`, how many of its tokens
/// after `x_n` were emitted, and the length of the session's tokens before it. The session's
/// tokens follow the emitted ones; its state may be ahead until it settles.
#[derive(Default)]
pub(crate) struct SpecRun {
    tokens: Vec<u32>,
    emitted: usize,
    base: usize,
}

/// A session on backend `B`: everything [`Session`](super::Session) does, written once for
/// every backend.
pub(crate) struct SessionCore<B: Backend> {
    /// A handle on the engine (tokenizer, options), keeping the model alive.
    engine: Engine,
    /// The engine's model on backend `B` (the same one `engine` holds, typed).
    model: Arc<Model<B>>,
    state: State<B>,
    ws: Workspace<B>,
    /// Tokens the state has processed.
    fed: Vec<u32>,
    /// A sampled token not yet processed (it is, before anything else is).
    pending: Option<u32>,
    /// Logits after the last fed token, valid when `has_logits`.
    logits: Vec<f32>,
    has_logits: bool,
    /// Whether those logits are still on the backend (`kept.seq`), and the decode path.
    kept: KeptLogits,
    /// Checkpoints of the recurrent state at positions of `fed`, to continue from a prefix when
    /// a new sequence diverges from this one (the recurrent layers cannot be rewound otherwise).
    cache: PromptCache<B>,
    progress: Option<ProgressFn>,
    /// Speculative decoder (MTP cache catch-up, draft/verify/accept), when speculation is on.
    spec: Option<SpecDecoder<B>>,
}

impl<B: Backend> SessionCore<B> {
    pub(super) fn new(engine: Engine, model: Arc<Model<B>>) -> Result<SessionCore<B>> {
        let (spec, rows) = (engine.options().speculation, engine.options().batch);
        Self::build(engine, model, spec, rows)
    }

    /// A core speculating as `spec`, with a workspace of `ws_rows` rows per pass.
    fn build(
        engine: Engine,
        model: Arc<Model<B>>,
        spec: Speculation,
        ws_rows: usize,
    ) -> Result<SessionCore<B>> {
        Ok(SessionCore {
            state: model.new_state_with_kv_types(
                engine.context(),
                engine.options().kv_type_k,
                engine.options().kv_type_v,
            )?,
            ws: model.new_workspace(ws_rows.max(1))?,
            fed: Vec::new(),
            pending: None,
            logits: vec![0.0; model.config.vocab],
            has_logits: false,
            kept: KeptLogits::new(Self::candidates_on(&engine, &model)),
            cache: PromptCache::new(
                engine.options().prompt_cache_interval,
                engine.options().prompt_cache_checkpoints,
            ),
            progress: None,
            spec: Self::decoder(&engine, &model, spec),
            engine,
            model,
        })
    }

    /// Whether decoding reads candidates instead of whole logits rows
    /// ([`LogitsPath`](crate::engine::LogitsPath)).
    fn candidates_on(engine: &Engine, model: &Model<B>) -> bool {
        let path = engine.options().logits_path;
        path.candidates(model.backend.prefers_top_k())
    }

    /// The speculative decoder `spec` asks for, on the engine's logits path.
    fn decoder(engine: &Engine, model: &Model<B>, spec: Speculation) -> Option<SpecDecoder<B>> {
        let mut sp = SpecDecoder::for_model(model, spec)?;
        sp.set_candidates(Self::candidates_on(engine, model));
        Some(sp)
    }

    /// A generation that stopped inside a speculative run leaves the state ahead of the
    /// session's tokens (the emitted ones): roll it back before the state is used again.
    fn settle_spec(&mut self) -> Result<()> {
        let n = self.fed.len();
        if self.state.pos() > n {
            let sp = self.spec.as_mut().ok_or(EngineError::EmptyPrompt)?;
            sp.rollback_to(&self.model, &mut self.state, &mut self.ws, n)?;
        }
        Ok(())
    }

    /// Processes `all` (after `fed`, pending token already included), leaving the logits after
    /// the last one. Chunks end at each of `marks` (absolute positions, ascending), where a
    /// prompt-cache checkpoint is taken; a mark at the current position is taken first.
    fn run_tokens(&mut self, all: &[u32], marks: &[usize]) -> Result<()> {
        self.settle_spec()?;
        let m = &*self.model;
        let total = all.len();
        let step = self.ws.max_rows();
        let start = self.fed.len();
        self.has_logits = false;
        self.kept.seq = None;
        let mut marks = marks
            .iter()
            .copied()
            .filter(|&p| p >= start && p < start + total)
            .peekable();
        let mut done = 0;
        while done < total {
            if marks.next_if_eq(&(start + done)).is_some() {
                let h = self
                    .spec
                    .as_ref()
                    .and_then(|sp| sp.carried_hidden(start + done));
                self.cache
                    .insert(&self.state, &m.config, &m.backend, None, h)?;
            }
            let until = marks.peek().map_or(total, |&p| p - start);
            let n = step.min(until - done);
            let chunk = &all[done..done + n];
            let out = if done + n == total {
                Outputs::last_logits(&mut self.logits)
            } else {
                Outputs::default()
            };
            match self.spec.as_mut() {
                // Also feeds the MTP block's cache.
                Some(sp) => sp.forward(m, &mut self.state, &mut self.ws, chunk, out)?,
                None => m.forward(&mut self.state, &mut self.ws, chunk, out)?,
            }
            self.fed.extend_from_slice(chunk);
            done += n;
            if total > step {
                if let Some(p) = self.progress.as_mut() {
                    p(done, total);
                }
            }
        }
        self.has_logits = true;
        Ok(())
    }

    /// Processes a prompt's tokens `all` (after `fed`, pending token already included) with
    /// prompt-cache checkpoints: at every interval mark, before the last two `<|im_start|>`
    /// (the last message, usually the new user one: an edited one diverges there; and the
    /// assistant turn: a template that re-renders earlier replies differently diverges there)
    /// and at the end, with the logits (the same prompt again).
    fn run_prompt(&mut self, all: &[u32]) -> Result<()> {
        let marks = self.prompt_marks(all);
        self.run_tokens(all, &marks)?;
        self.prompt_checkpoint()
    }

    /// Where [`run_prompt`](Self::run_prompt) takes prompt-cache checkpoints in `all` (after
    /// `fed`): absolute positions, ascending.
    fn prompt_marks(&self, all: &[u32]) -> Vec<usize> {
        let start = self.fed.len();
        let mut marks = self.cache.interval_marks(start, start + all.len());
        if let Some(id) = self.engine.tokenizer().token_id("<|im_start|>") {
            let turns = (0..all.len()).rev().filter(|&i| all[i] == id).take(2);
            marks.extend(turns.map(|i| start + i));
            marks.sort_unstable();
            marks.dedup();
        }
        marks
    }

    /// The checkpoint at the end of a prompt, with its logits (the same prompt again).
    fn prompt_checkpoint(&mut self) -> Result<()> {
        let m = &*self.model;
        self.cache.insert(
            &self.state,
            &m.config,
            &m.backend,
            Some(&self.logits),
            self.spec
                .as_ref()
                .and_then(|sp| sp.carried_hidden(self.state.pos())),
        )?;
        Ok(())
    }

    fn check_room(&self, n: usize) -> Result<()> {
        let used = self.fed.len();
        if used + n > self.state.capacity() {
            return Err(EngineError::PromptTooLong {
                prompt: n,
                used,
                context: self.state.capacity(),
            });
        }
        Ok(())
    }

    fn check_room_total(&self, n: usize) -> Result<()> {
        if n > self.state.capacity() {
            return Err(EngineError::PromptTooLong {
                prompt: n,
                used: 0,
                context: self.state.capacity(),
            });
        }
        Ok(())
    }

    /// Where a new sequence `full` would start from.
    fn plan(&self, full: &[u32]) -> Start {
        let common = common_prefix(&self.fed, full);
        // The live state, when `full` extends it (or equals it and its logits are at hand).
        if !self.fed.is_empty()
            && common == self.fed.len()
            && (common < full.len() || self.has_logits)
        {
            return Start::Live(common);
        }
        match self.cache.best(common, full.len()) {
            Some(c) => Start::Checkpoint(c.pos),
            None => Start::Empty,
        }
    }

    /// Brings the session to the longest reusable prefix of `full` (see [`plan`](Self::plan))
    /// and returns its length; when it is all of `full`, the logits after it are at hand.
    /// Checkpoints past the common prefix are dropped (their KV rows get overwritten).
    fn rewind_to_prefix_of(&mut self, full: &[u32]) -> Result<usize> {
        let common = common_prefix(&self.fed, full);
        let m = &*self.model;
        let reused = match self.plan(full) {
            Start::Live(n) => n,
            Start::Checkpoint(pos) => {
                let c = self
                    .cache
                    .best(common, full.len())
                    .expect("plan found this checkpoint");
                self.state.restore(&m.config, &m.backend, &c.snap)?;
                // MTP rows pair token p + 1 with the trunk's h_p: none may reach past pos - 1.
                self.state.truncate_mtp(pos.saturating_sub(1));
                if let Some(sp) = self.spec.as_mut() {
                    sp.set_carried_hidden(c.hidden.as_deref().map(|h| (pos, h)));
                }
                self.has_logits = false;
                if let Some(l) = &c.logits {
                    if pos == full.len() {
                        self.logits.copy_from_slice(l);
                        self.has_logits = true;
                    }
                }
                pos
            }
            Start::Empty => {
                self.state.reset(&m.config, &m.backend)?;
                0
            }
        };
        self.cache.truncate(common);
        self.fed.truncate(reused);
        self.pending = None;
        if reused < full.len() {
            self.has_logits = false;
        }
        Ok(reused)
    }

    /// Makes the session's tokens the emitted part of the run (the last one pending, as after
    /// plain decoding) and returns the token just emitted.
    fn emit_from_run(&mut self, run: &SpecRun) -> u32 {
        let e = run.emitted;
        self.fed.truncate(run.base);
        self.fed.extend_from_slice(&run.tokens[..e]);
        self.pending = Some(run.tokens[e]);
        self.has_logits = false;
        run.tokens[e]
    }

    /// Drafts, verifies `[x_n, drafts]` in one pass and starts emitting the accepted run.
    /// Drafts stop short of `budget` and of the context.
    fn spec_step(
        &mut self,
        sampler: &mut Sampler,
        run: &mut SpecRun,
        x_n: u32,
        budget: usize,
    ) -> Result<u32> {
        let room = self.state.capacity() - self.fed.len() - 2;
        let Some(sp) = self.spec.as_mut() else {
            return Err(EngineError::EmptyPrompt);
        };
        let input = StepInput {
            history: &self.fed,
            x_n,
            max_draft: budget.min(room),
        };
        let (accepted, next) =
            sp.step(&self.model, &mut self.state, &mut self.ws, sampler, input)?;
        run.base = self.fed.len();
        run.tokens.clear();
        run.tokens.push(x_n);
        run.tokens.extend_from_slice(&accepted);
        run.tokens.push(next);
        run.emitted = 1;
        Ok(self.emit_from_run(run))
    }
}

impl<B: Backend> CoreOps for SessionCore<B>
where
    SessionCore<B>: Send,
{
    fn engine(&self) -> &Engine {
        &self.engine
    }

    fn pending(&self) -> Option<u32> {
        self.pending
    }

    fn set_progress(&mut self, f: Option<ProgressFn>) {
        self.progress = f;
    }

    fn set_speculation(&mut self, spec: Speculation) {
        self.spec = Self::decoder(&self.engine, &self.model, spec);
    }

    fn speculation_mut(&mut self) -> Option<&mut dyn SpecControl> {
        self.spec.as_mut().map(|sp| sp as &mut dyn SpecControl)
    }

    fn spec_stats(&self) -> Option<SpecStats> {
        self.spec.as_ref().map(|sp| sp.stats())
    }

    fn reset_spec_stats(&mut self) {
        if let Some(sp) = self.spec.as_mut() {
            sp.reset_stats();
        }
    }

    fn prompt_cache_positions(&self) -> Vec<usize> {
        self.cache.positions()
    }

    fn prompt_cache_bytes(&self) -> u64 {
        self.cache.bytes(&self.model.config)
    }

    fn logits(&self) -> Option<&[f32]> {
        self.has_logits.then_some(self.logits.as_slice())
    }

    fn tokens(&self) -> Vec<u32> {
        let mut t = self.fed.clone();
        t.extend(self.pending);
        t
    }

    fn len(&self) -> usize {
        self.fed.len() + usize::from(self.pending.is_some())
    }

    fn context(&self) -> usize {
        self.state.capacity()
    }

    fn reset(&mut self) -> Result<()> {
        self.batch_reset()
    }

    fn feed(&mut self, tokens: &[u32]) -> Result<&[f32]> {
        let mut all: Vec<u32> = self.pending.take().into_iter().collect();
        all.extend_from_slice(tokens);
        if all.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        self.check_room(all.len())?;
        self.run_tokens(&all, &[])?;
        Ok(self.logits.as_slice())
    }

    fn feed_all_logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.settle_spec()?;
        if let Some(p) = self.pending.take() {
            self.feed(&[p])?;
        }
        if tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        self.check_room(tokens.len())?;
        let model = &*self.model;
        let vocab = model.config.vocab;
        let mut out = vec![0.0f32; tokens.len() * vocab];
        let step = self.ws.max_rows();
        for (chunk, rows) in tokens.chunks(step).zip(out.chunks_mut(step * vocab)) {
            model.forward(
                &mut self.state,
                &mut self.ws,
                chunk,
                Outputs::all_logits(rows),
            )?;
            self.fed.extend_from_slice(chunk);
        }
        self.logits
            .copy_from_slice(&out[(tokens.len() - 1) * vocab..]);
        self.has_logits = true;
        Ok(out)
    }

    /// [`Session::generate`](super::Session::generate)'s prompt processing: appends the pending token and `tokens`.
    fn start_append(&mut self, tokens: &[u32]) -> Result<PromptRun> {
        if tokens.is_empty() && !self.has_logits && self.pending.is_none() {
            return Err(EngineError::EmptyPrompt);
        }
        let t0 = Instant::now();
        let reused = self.fed.len();
        let mut all: Vec<u32> = self.pending.take().into_iter().collect();
        all.extend_from_slice(tokens);
        let n = all.len();
        if n > 0 {
            self.check_room(n)?;
            self.run_prompt(&all)?;
        }
        Ok(PromptRun {
            processed: n,
            reused,
            time: t0.elapsed(),
        })
    }

    /// Brings the session to the longest reusable prefix of `full` and processes the rest.
    fn start_sequence(&mut self, full: &[u32]) -> Result<PromptRun> {
        if full.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        self.check_room_total(full.len())?;
        let t0 = Instant::now();
        let reused = self.rewind_to_prefix_of(full)?;
        let n = full.len() - reused;
        if n > 0 {
            self.run_prompt(&full[reused..])?;
        }
        Ok(PromptRun {
            processed: n,
            reused,
            time: t0.elapsed(),
        })
    }

    fn reusable_prefix(&self, tokens: &[u32]) -> usize {
        self.reusable_prefix_of(tokens)
    }

    /// The next token of a generation: from the current speculative `run`, else by a
    /// speculative step (drafting at most `budget` tokens), else by a plain pass. `None`: the
    /// context is full.
    fn next_id(
        &mut self,
        sampler: &mut Sampler,
        run: &mut SpecRun,
        budget: usize,
    ) -> Result<Option<u32>> {
        if run.emitted + 1 < run.tokens.len() {
            run.emitted += 1;
            return Ok(Some(self.emit_from_run(run)));
        }
        if !self.has_logits {
            let Some(p) = self.pending else {
                return Err(EngineError::EmptyPrompt);
            };
            if self.fed.len() + 1 > self.context() {
                return Ok(None);
            }
            if self.spec.is_some() && self.fed.len() + 2 <= self.context() {
                return self.spec_step(sampler, run, p, budget).map(Some);
            }
            // `feed` processes the pending token first (settled here, so the pass that keeps
            // its logits on the backend is the decode step's own).
            self.settle_spec()?;
            let keep = self.kept.wanted(sampler);
            if keep {
                self.ws.keep_next_logits();
            }
            self.feed(&[])?;
            self.kept.seq = keep.then_some(0);
        }
        if self.fed.len() >= self.context() {
            // No room for the sampled token: stop before sampling one that cannot be kept.
            self.kept.fetch(&self.model, &self.ws, &mut self.logits)?;
            return Ok(None);
        }
        let id = self
            .kept
            .sample(&self.model, &self.ws, &mut self.logits, sampler, &self.fed)?;
        self.has_logits = false;
        self.pending = Some(id);
        Ok(Some(id))
    }

    fn force_next(
        &mut self,
        sampler: &mut Sampler,
        run: &mut SpecRun,
        id: u32,
    ) -> Result<Option<u32>> {
        // The state may be ahead of the emitted tokens: `feed` settles it first.
        run.tokens.clear();
        run.emitted = 0;
        if !self.has_logits {
            if self.pending.is_none() {
                return Err(EngineError::EmptyPrompt);
            }
            if self.fed.len() + 1 > self.context() {
                return Ok(None);
            }
            self.feed(&[])?;
        }
        if self.fed.len() >= self.context() {
            return Ok(None);
        }
        sampler.observe(&mut self.logits);
        self.has_logits = false;
        self.pending = Some(id);
        Ok(Some(id))
    }
}

/// Where a new sequence starts from (the number is the tokens reused).
enum Start {
    /// The session's current state.
    Live(usize),
    /// A prompt-cache checkpoint at this position.
    Checkpoint(usize),
    /// An empty state.
    Empty,
}

/// Length of the common prefix of `a` and `b`.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
