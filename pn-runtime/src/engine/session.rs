//! Sessions: one sequence's state, prompt processing and streaming generation.

use super::error::{EngineError, Result};
use super::prompt_cache::PromptCache;
use super::{Engine, LoadedModel};
use crate::chat_template::ChatMessage;
use crate::sampling::{Sampler, SamplingParams, StopStrings, StopTokens};
use crate::speculative::{SpecControl, SpecDecoder, SpecStats, Speculation};
use crate::tokenizer::StreamDecoder;
use qwen_model::cuda::CudaBackend;
use qwen_model::{Backend, CpuBackend, Model, Outputs, State, Workspace};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What to generate from: text (tokenized without BOS, special-token text such as
/// `<|im_start|>` mapped to its id) or token ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    /// Text to tokenize.
    Text(String),
    /// Token ids.
    Tokens(Vec<u32>),
}

impl From<&str> for Prompt {
    fn from(s: &str) -> Prompt {
        Prompt::Text(s.to_string())
    }
}

impl From<String> for Prompt {
    fn from(s: String) -> Prompt {
        Prompt::Text(s)
    }
}

impl From<Vec<u32>> for Prompt {
    fn from(t: Vec<u32>) -> Prompt {
        Prompt::Tokens(t)
    }
}

impl From<&[u32]> for Prompt {
    fn from(t: &[u32]) -> Prompt {
        Prompt::Tokens(t.to_vec())
    }
}

/// A flag that stops a generation: clone it, hand it to another thread or a Ctrl-C handler, and
/// call [`cancel`](Self::cancel). The generation checks it before every token, so it stops
/// within one token.
#[derive(Debug, Clone, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    /// A token that is not cancelled.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks the generation to stop.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether [`cancel`](Self::cancel) was called (since the last [`reset`](Self::reset)).
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// Clears the flag so the token can be reused for the next generation.
    pub fn reset(&self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// When a generation ends (besides the end of the context).
#[derive(Debug, Clone, Default)]
pub struct StopConditions {
    /// Most tokens to generate; `None`: until an end token, a stop string or the context is full.
    pub max_tokens: Option<usize>,
    /// Stop strings: the output is cut exactly before the earliest match.
    pub strings: Vec<String>,
    /// Extra stop token ids (besides the model's end tokens).
    pub tokens: Vec<u32>,
    /// Keep generating past the model's end tokens (`<|im_end|>`, `<|endoftext|>`).
    pub ignore_eog: bool,
    /// Checked before every token.
    pub cancel: Option<CancelToken>,
}

impl StopConditions {
    /// At most `n` tokens, and the model's end tokens.
    pub fn max_tokens(n: usize) -> Self {
        StopConditions {
            max_tokens: Some(n),
            ..Self::default()
        }
    }

    /// Adds stop strings.
    pub fn with_strings<S: Into<String>>(mut self, strings: impl IntoIterator<Item = S>) -> Self {
        self.strings.extend(strings.into_iter().map(Into::into));
        self
    }

    /// Sets the cancellation flag.
    pub fn with_cancel(mut self, cancel: CancelToken) -> Self {
        self.cancel = Some(cancel);
        self
    }
}

/// Why a generation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// The model produced an end token (its id is the event's token).
    EndOfGeneration,
    /// A stop string matched (the event's text ends right before it).
    StopString(String),
    /// `max_tokens` were generated.
    MaxTokens,
    /// The session's context is full.
    ContextFull,
    /// The [`CancelToken`] was cancelled.
    Cancelled,
}

/// One step of a generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenEvent {
    /// The sampled token; `None` only on a final event that samples nothing (cancelled, context
    /// full).
    pub token: Option<u32>,
    /// Text that became final with this step: valid UTF-8 (a character split across tokens is
    /// held back until complete), never part of a stop string, empty for end tokens.
    pub text: String,
    /// Set on the last event.
    pub finish: Option<FinishReason>,
}

/// Token counts and times of one generation.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timings {
    /// Prompt tokens processed (not counting those reused from the session's state).
    pub prompt_tokens: usize,
    /// Tokens of the sequence reused from the session (its live state or a prompt-cache
    /// checkpoint) instead of being processed.
    pub prompt_reused: usize,
    /// Time spent on them.
    pub prompt_time: Duration,
    /// Tokens generated.
    pub generated_tokens: usize,
    /// Time spent generating (forward passes and sampling).
    pub generation_time: Duration,
}

fn per_sec(n: usize, t: Duration) -> f64 {
    if t.is_zero() {
        0.0
    } else {
        n as f64 / t.as_secs_f64()
    }
}

impl Timings {
    /// Prompt tokens per second.
    pub fn prompt_tokens_per_sec(&self) -> f64 {
        per_sec(self.prompt_tokens, self.prompt_time)
    }

    /// Generated tokens per second.
    pub fn generation_tokens_per_sec(&self) -> f64 {
        per_sec(self.generated_tokens, self.generation_time)
    }
}

/// Called with `(tokens done, tokens total)` while a long prompt is processed.
pub type ProgressFn = Box<dyn FnMut(usize, usize) + Send>;

/// One sequence: its KV cache and recurrent state, the tokens it holds, and the logits of its
/// last position. Sessions of one engine are independent of each other.
///
/// The same on every device: the sequence logic lives in a session core generic over the
/// backend, and this type picks the core of the engine's device.
pub struct Session<'e> {
    core: AnyCore<'e>,
}

/// A session core on whichever backend the engine was loaded on.
// One per session, long-lived: boxing the larger variant would only add an indirection.
#[allow(clippy::large_enum_variant)]
enum AnyCore<'e> {
    Cpu(SessionCore<'e, CpuBackend>),
    Cuda(SessionCore<'e, CudaBackend>),
}

/// Runs `$body` with `$c` bound to the `SessionCore<B>` inside an [`AnyCore`], whatever `B` is.
macro_rules! with_core {
    ($core:expr, $c:ident => $body:expr) => {
        match $core {
            AnyCore::Cpu($c) => $body,
            AnyCore::Cuda($c) => $body,
        }
    };
}

impl std::fmt::Debug for Session<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("tokens", &self.len())
            .field("pending", &with_core!(&self.core, c => c.pending))
            .field("context", &self.context())
            .field("device", &self.engine().device())
            .finish_non_exhaustive()
    }
}

impl<'e> Session<'e> {
    pub(super) fn new(engine: &'e Engine) -> Result<Session<'e>> {
        let core = match engine.loaded() {
            LoadedModel::Cpu(m) => AnyCore::Cpu(SessionCore::new(engine, m)?),
            LoadedModel::Cuda(m) => AnyCore::Cuda(SessionCore::new(engine, m)?),
        };
        Ok(Session { core })
    }

    /// The engine this session runs on.
    pub fn engine(&self) -> &'e Engine {
        with_core!(&self.core, c => c.engine)
    }

    /// Reports progress of long prompts (for a progress bar).
    pub fn set_progress(&mut self, f: Option<ProgressFn>) {
        with_core!(&mut self.core, c => c.progress = f);
    }

    /// Changes this session's speculative decoding (the engine's option is the default).
    /// Turning it on mid-sequence works; the MTP head lacks the earlier rows until then.
    pub fn set_speculation(&mut self, spec: Speculation) {
        with_core!(&mut self.core, c => c.spec = SpecDecoder::for_model(c.model, spec));
    }

    /// The speculative decoder's controls, when speculation is on (statistics, draft count,
    /// and a custom drafter or acceptance rule for tests).
    pub fn speculation_mut(&mut self) -> Option<&mut dyn SpecControl> {
        with_core!(&mut self.core, c => c.spec.as_mut().map(|sp| sp as &mut dyn SpecControl))
    }

    /// Every token of the sequence (prompts and generated tokens).
    pub fn tokens(&self) -> Vec<u32> {
        with_core!(&self.core, c => c.tokens())
    }

    /// Positions in use.
    pub fn len(&self) -> usize {
        with_core!(&self.core, c => c.len())
    }

    /// Whether the session holds no tokens.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Positions the session can hold.
    pub fn context(&self) -> usize {
        with_core!(&self.core, c => c.context())
    }

    /// Back to an empty sequence; the prompt cache is emptied too.
    pub fn reset(&mut self) -> Result<()> {
        with_core!(&mut self.core, c => c.reset())
    }

    /// Positions of the prompt cache's checkpoints (ascending): a new sequence that diverges
    /// from this session's tokens at position `p` is recomputed from the largest of them `<= p`.
    pub fn prompt_cache_positions(&self) -> Vec<usize> {
        with_core!(&self.core, c => c.cache.positions())
    }

    /// The logits after the last processed token, when no sampled token is waiting to be
    /// processed (after a prompt, before the generation samples).
    pub fn logits(&self) -> Option<&[f32]> {
        with_core!(&self.core, c => c.has_logits.then_some(c.logits.as_slice()))
    }

    /// Bytes the prompt cache's checkpoints hold (recurrent states and logits).
    pub fn prompt_cache_bytes(&self) -> u64 {
        with_core!(&self.core, c => c.cache.bytes(&c.model.config))
    }

    /// Appends `tokens` to the sequence and returns the logits after the last one.
    pub fn feed(&mut self, tokens: &[u32]) -> Result<&[f32]> {
        with_core!(&mut self.core, c => c.feed(tokens))
    }

    /// Appends `tokens` and returns the logits after each of them (`tokens.len() x vocab`,
    /// row `t` predicting the token after `tokens[t]`), for perplexity and KL measurements.
    pub fn feed_all_logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        with_core!(&mut self.core, c => c.feed_all_logits(tokens))
    }

    fn tokenize(&self, prompt: Prompt) -> Result<Vec<u32>> {
        match prompt {
            Prompt::Text(s) => Ok(self.engine().tokenizer().encode(&s)?),
            Prompt::Tokens(t) => Ok(t),
        }
    }

    /// Appends `prompt` to the sequence and streams the continuation. The prompt is processed
    /// here (errors such as a prompt longer than the context come back now); each call of the
    /// iterator then samples one token.
    pub fn generate(
        &mut self,
        prompt: impl Into<Prompt>,
        params: SamplingParams,
        stop: StopConditions,
    ) -> Result<Generation<'_, 'e>> {
        let tokens = self.tokenize(prompt.into())?;
        let run = with_core!(&mut self.core, c => c.start_append(&tokens))?;
        Ok(Generation::new(self, params, stop, run))
    }

    /// Makes the session hold exactly `prompt` (the whole sequence, not an addition to it) and
    /// streams the continuation. The longest prefix the session can reuse is kept and only the
    /// rest is processed; [`Timings::prompt_tokens`] counts the processed tokens. Servers use this
    /// for requests that each carry a whole conversation.
    pub fn generate_sequence(
        &mut self,
        prompt: impl Into<Prompt>,
        params: SamplingParams,
        stop: StopConditions,
    ) -> Result<Generation<'_, 'e>> {
        let full = self.tokenize(prompt.into())?;
        let run = with_core!(&mut self.core, c => c.start_sequence(&full))?;
        Ok(Generation::new(self, params, stop, run))
    }

    /// How many leading tokens of `tokens` this session would not process again if
    /// [`generate_sequence`](Self::generate_sequence) (or [`chat`](Self::chat)) got `tokens`
    /// now: the session's tokens when `tokens` extends them, else the position of the newest
    /// prompt-cache checkpoint within the common prefix, else 0. Servers use it to pick, among
    /// several sessions, the one that already holds a conversation.
    pub fn reusable_prefix(&self, tokens: &[u32]) -> usize {
        with_core!(&self.core, c => c.reusable_prefix(tokens))
    }

    /// Renders `messages` with the model's chat template (plus the assistant generation prompt)
    /// and streams the assistant's reply. The session keeps the conversation: call again with
    /// the reply and the next user message appended, and only the tokens after the reusable
    /// prefix are processed (after the session's tokens when the rendering extends them, else
    /// after the prompt-cache checkpoint before the last turn's assistant reply, for templates
    /// that re-render earlier replies differently).
    pub fn chat(
        &mut self,
        messages: &[ChatMessage],
        params: SamplingParams,
        stop: StopConditions,
    ) -> Result<Generation<'_, 'e>> {
        let text = self.engine().render_chat(messages)?;
        let full = self.engine().tokenizer().encode(&text)?;
        let run = with_core!(&mut self.core, c => c.start_sequence(&full))?;
        Ok(Generation::new(self, params, stop, run))
    }
}

/// What processing a generation's prompt did: tokens processed, tokens reused, time taken.
struct PromptRun {
    processed: usize,
    reused: usize,
    time: Duration,
}

/// The last speculative step's run `[x_n, accepted drafts, next]`, how many of its tokens
/// after `x_n` were emitted, and the length of the session's tokens before it. The session's
/// tokens follow the emitted ones; its state may be ahead until it settles.
#[derive(Default)]
struct SpecRun {
    tokens: Vec<u32>,
    emitted: usize,
    base: usize,
}

/// A session on backend `B`: everything [`Session`] does, written once for every backend.
struct SessionCore<'e, B: Backend> {
    engine: &'e Engine,
    model: &'e Model<B>,
    state: State<B>,
    ws: Workspace<B>,
    /// Tokens the state has processed.
    fed: Vec<u32>,
    /// A sampled token not yet processed (it is, before anything else is).
    pending: Option<u32>,
    /// Logits after the last fed token, valid when `has_logits`.
    logits: Vec<f32>,
    has_logits: bool,
    /// Checkpoints of the recurrent state at positions of `fed`, to continue from a prefix when
    /// a new sequence diverges from this one (the recurrent layers cannot be rewound otherwise).
    cache: PromptCache<B>,
    progress: Option<ProgressFn>,
    /// Speculative decoder (MTP cache catch-up, draft/verify/accept), when speculation is on.
    spec: Option<SpecDecoder<B>>,
}

impl<'e, B: Backend> SessionCore<'e, B> {
    fn new(engine: &'e Engine, model: &'e Model<B>) -> Result<SessionCore<'e, B>> {
        Ok(SessionCore {
            engine,
            model,
            state: model.new_state_with_kv_types(
                engine.context(),
                engine.options().kv_type_k,
                engine.options().kv_type_v,
            )?,
            ws: model.new_workspace(engine.options().batch.max(1))?,
            fed: Vec::new(),
            pending: None,
            logits: vec![0.0; model.config.vocab],
            has_logits: false,
            cache: PromptCache::new(
                engine.options().prompt_cache_interval,
                engine.options().prompt_cache_checkpoints,
            ),
            progress: None,
            spec: SpecDecoder::for_model(model, engine.options().speculation),
        })
    }

    /// A generation that stopped inside a speculative run leaves the state ahead of the
    /// session's tokens (the emitted ones): roll it back before the state is used again.
    fn settle_spec(&mut self) -> Result<()> {
        let n = self.fed.len();
        if self.state.pos() > n {
            let sp = self.spec.as_mut().ok_or(EngineError::EmptyPrompt)?;
            sp.rollback_to(self.model, &mut self.state, &mut self.ws, n)?;
        }
        Ok(())
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
        let m = self.model;
        self.fed.clear();
        self.pending = None;
        self.has_logits = false;
        self.cache.clear();
        self.state.reset(&m.config, &m.backend)?;
        Ok(())
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

    /// Processes `all` (after `fed`, pending token already included), leaving the logits after
    /// the last one. Chunks end at each of `marks` (absolute positions, ascending), where a
    /// prompt-cache checkpoint is taken; a mark at the current position is taken first.
    fn run_tokens(&mut self, all: &[u32], marks: &[usize]) -> Result<()> {
        self.settle_spec()?;
        let m = self.model;
        let total = all.len();
        let step = self.ws.max_rows();
        let start = self.fed.len();
        self.has_logits = false;
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
        let start = self.fed.len();
        let mut marks = self.cache.interval_marks(start, start + all.len());
        if let Some(id) = self.engine.tokenizer().token_id("<|im_start|>") {
            let turns = (0..all.len()).rev().filter(|&i| all[i] == id).take(2);
            marks.extend(turns.map(|i| start + i));
            marks.sort_unstable();
            marks.dedup();
        }
        self.run_tokens(all, &marks)?;
        let m = self.model;
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

    fn feed_all_logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.settle_spec()?;
        if let Some(p) = self.pending.take() {
            self.feed(&[p])?;
        }
        if tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        self.check_room(tokens.len())?;
        let model = self.model;
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

    fn check_room(&self, n: usize) -> Result<()> {
        let used = self.fed.len();
        if used + n > self.context() {
            return Err(EngineError::PromptTooLong {
                prompt: n,
                used,
                context: self.context(),
            });
        }
        Ok(())
    }

    /// [`Session::generate`]'s prompt processing: appends the pending token and `tokens`.
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

    fn check_room_total(&self, n: usize) -> Result<()> {
        if n > self.context() {
            return Err(EngineError::PromptTooLong {
                prompt: n,
                used: 0,
                context: self.context(),
            });
        }
        Ok(())
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
        match self.plan(tokens) {
            Start::Live(n) | Start::Checkpoint(n) => n,
            Start::Empty => 0,
        }
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
        let m = self.model;
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
            // `feed` processes the pending token first.
            self.feed(&[])?;
        }
        if self.fed.len() >= self.context() {
            // No room for the sampled token: stop before sampling one that cannot be kept.
            return Ok(None);
        }
        let id = sampler.sample(&mut self.logits, &self.fed);
        self.has_logits = false;
        self.pending = Some(id);
        Ok(Some(id))
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
        let room = self.context() - self.fed.len() - 2;
        let Some(sp) = self.spec.as_mut() else {
            return Err(EngineError::EmptyPrompt);
        };
        let (accepted, next) = sp.step(
            self.model,
            &mut self.state,
            &mut self.ws,
            sampler,
            &self.fed,
            x_n,
            budget.min(room),
        )?;
        run.base = self.fed.len();
        run.tokens.clear();
        run.tokens.push(x_n);
        run.tokens.extend_from_slice(&accepted);
        run.tokens.push(next);
        run.emitted = 1;
        Ok(self.emit_from_run(run))
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

/// A streaming generation: an iterator of [`TokenEvent`]s, ending after the event that carries
/// the [`FinishReason`].
pub struct Generation<'s, 'e> {
    session: &'s mut Session<'e>,
    sampler: Sampler,
    stop_tokens: StopTokens,
    stop_strings: StopStrings,
    decoder: StreamDecoder,
    max_tokens: Option<usize>,
    cancel: CancelToken,
    timings: Timings,
    finish: Option<FinishReason>,
    /// The current speculative run (empty until a speculative step).
    run: SpecRun,
}

impl std::fmt::Debug for Generation<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generation")
            .field("timings", &self.timings)
            .field("finish", &self.finish)
            .finish_non_exhaustive()
    }
}

impl<'s, 'e> Generation<'s, 'e> {
    fn new(
        session: &'s mut Session<'e>,
        params: SamplingParams,
        stop: StopConditions,
        prompt: PromptRun,
    ) -> Self {
        let engine = session.engine();
        let stop_tokens = if stop.ignore_eog {
            StopTokens::new(stop.tokens.iter().copied())
        } else {
            engine
                .stop_tokens()
                .clone()
                .with(stop.tokens.iter().copied())
        };
        Generation {
            sampler: Sampler::new(params, engine.token_mask().clone()),
            stop_tokens,
            stop_strings: StopStrings::new(stop.strings),
            decoder: StreamDecoder::new(),
            max_tokens: stop.max_tokens,
            cancel: stop.cancel.unwrap_or_default(),
            timings: Timings {
                prompt_tokens: prompt.processed,
                prompt_reused: prompt.reused,
                prompt_time: prompt.time,
                ..Timings::default()
            },
            finish: None,
            run: SpecRun::default(),
            session: {
                with_core!(&mut session.core, c => {
                    if let Some(sp) = c.spec.as_mut() {
                        sp.reset_stats();
                    }
                });
                session
            },
        }
    }

    /// Speculative decoding counters of this generation (`None` when speculation is off).
    pub fn spec_stats(&self) -> Option<SpecStats> {
        with_core!(&self.session.core, c => c.spec.as_ref().map(|sp| sp.stats()))
    }

    /// The next token (see `SessionCore::next_id`); speculative drafts stop short of
    /// `max_tokens`.
    fn next_id(&mut self) -> Result<Option<u32>> {
        let budget = self.max_tokens.map_or(usize::MAX, |m| {
            m.saturating_sub(self.timings.generated_tokens + 1)
        });
        with_core!(&mut self.session.core, c => c.next_id(&mut self.sampler, &mut self.run, budget))
    }

    /// A handle that cancels this generation (checked before every token).
    pub fn cancel_token(&self) -> CancelToken {
        self.cancel.clone()
    }

    /// Token counts and times so far.
    pub fn timings(&self) -> Timings {
        self.timings
    }

    /// Why the generation ended, once it has.
    pub fn finish_reason(&self) -> Option<&FinishReason> {
        self.finish.as_ref()
    }

    /// Runs the generation to its end and returns the text.
    pub fn text(self) -> Result<String> {
        let mut s = String::new();
        for e in self {
            s.push_str(&e?.text);
        }
        Ok(s)
    }

    /// Text still held back (an incomplete character, a possible stop-string start), released
    /// at the end.
    fn flush(&mut self) -> (String, Option<String>) {
        let rest = self.decoder.finish();
        let mut chunk = self.stop_strings.push(&rest);
        if chunk.stop.is_none() {
            let last = self.stop_strings.finish();
            chunk.text.push_str(&last.text);
            chunk.stop = last.stop;
        }
        (chunk.text, chunk.stop)
    }

    fn end(&mut self, token: Option<u32>, mut text: String, reason: FinishReason) -> TokenEvent {
        let (rest, stop) = self.flush();
        text.push_str(&rest);
        let reason = match stop {
            Some(s) => FinishReason::StopString(s),
            None => reason,
        };
        self.finish = Some(reason.clone());
        TokenEvent {
            token,
            text,
            finish: Some(reason),
        }
    }

    fn step(&mut self) -> Result<TokenEvent> {
        if self.cancel.is_cancelled() {
            return Ok(self.end(None, String::new(), FinishReason::Cancelled));
        }
        if self
            .max_tokens
            .is_some_and(|m| self.timings.generated_tokens >= m)
        {
            return Ok(self.end(None, String::new(), FinishReason::MaxTokens));
        }
        let t0 = Instant::now();
        let Some(id) = self.next_id()? else {
            return Ok(self.end(None, String::new(), FinishReason::ContextFull));
        };
        self.timings.generated_tokens += 1;
        let event = if self.stop_tokens.contains(id) {
            self.end(Some(id), String::new(), FinishReason::EndOfGeneration)
        } else {
            let piece = self
                .session
                .engine()
                .tokenizer()
                .decode_next(&mut self.decoder, id)?;
            let chunk = self.stop_strings.push(&piece);
            if let Some(stop) = chunk.stop {
                self.finish = Some(FinishReason::StopString(stop.clone()));
                TokenEvent {
                    token: Some(id),
                    text: chunk.text,
                    finish: Some(FinishReason::StopString(stop)),
                }
            } else if self.max_tokens == Some(self.timings.generated_tokens) {
                self.end(Some(id), chunk.text, FinishReason::MaxTokens)
            } else {
                TokenEvent {
                    token: Some(id),
                    text: chunk.text,
                    finish: None,
                }
            }
        };
        self.timings.generation_time += t0.elapsed();
        Ok(event)
    }
}

impl Iterator for Generation<'_, '_> {
    type Item = Result<TokenEvent>;

    fn next(&mut self) -> Option<Result<TokenEvent>> {
        if self.finish.is_some() {
            return None;
        }
        let r = self.step();
        if r.is_err() {
            // An error ends the stream.
            self.finish = Some(FinishReason::Cancelled);
        }
        Some(r)
    }
}
