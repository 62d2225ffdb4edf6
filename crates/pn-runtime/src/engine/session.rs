//! Sessions: one sequence's state, prompt processing and streaming generation.

use super::error::{EngineError, Result};
use super::Engine;
use crate::chat_template::ChatMessage;
use crate::sampling::{Sampler, SamplingParams, StopStrings, StopTokens};
use crate::tokenizer::StreamDecoder;
use qwen_model::{CpuBackend, Outputs, Snapshot, State, Workspace};
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
pub struct Session<'e> {
    engine: &'e Engine,
    state: State<CpuBackend>,
    ws: Workspace<CpuBackend>,
    /// Tokens the state has processed.
    fed: Vec<u32>,
    /// A sampled token not yet processed (it is, before anything else is).
    pending: Option<u32>,
    /// Logits after the last fed token, valid when `has_logits`.
    logits: Vec<f32>,
    has_logits: bool,
    /// State after the last chat prompt, to continue a conversation whose earlier turns were
    /// re-rendered differently (the recurrent layers cannot be rewound otherwise).
    prompt_snapshot: Option<(usize, Snapshot<CpuBackend>)>,
    progress: Option<ProgressFn>,
}

impl std::fmt::Debug for Session<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("tokens", &self.fed.len())
            .field("pending", &self.pending)
            .field("context", &self.state.capacity())
            .finish_non_exhaustive()
    }
}

impl<'e> Session<'e> {
    pub(super) fn new(engine: &'e Engine) -> Result<Session<'e>> {
        let model = engine.model();
        Ok(Session {
            engine,
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
            prompt_snapshot: None,
            progress: None,
        })
    }

    /// The engine this session runs on.
    pub fn engine(&self) -> &'e Engine {
        self.engine
    }

    /// Reports progress of long prompts (for a progress bar).
    pub fn set_progress(&mut self, f: Option<ProgressFn>) {
        self.progress = f;
    }

    /// Every token of the sequence (prompts and generated tokens).
    pub fn tokens(&self) -> Vec<u32> {
        let mut t = self.fed.clone();
        t.extend(self.pending);
        t
    }

    /// Positions in use.
    pub fn len(&self) -> usize {
        self.fed.len() + usize::from(self.pending.is_some())
    }

    /// Whether the session holds no tokens.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Positions the session can hold.
    pub fn context(&self) -> usize {
        self.state.capacity()
    }

    /// Back to an empty sequence.
    pub fn reset(&mut self) {
        let m = self.engine.model();
        self.state.reset(&m.config, &m.backend);
        self.fed.clear();
        self.pending = None;
        self.has_logits = false;
        self.prompt_snapshot = None;
    }

    /// Appends `tokens` to the sequence and returns the logits after the last one.
    pub fn feed(&mut self, tokens: &[u32]) -> Result<&[f32]> {
        let mut all: Vec<u32> = self.pending.take().into_iter().collect();
        all.extend_from_slice(tokens);
        if all.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        self.check_room(all.len())?;
        let model = self.engine.model();
        let total = all.len();
        let step = self.ws.max_rows();
        self.has_logits = false;
        for (i, chunk) in all.chunks(step).enumerate() {
            let last = (i + 1) * step >= total;
            let out = if last {
                Outputs::last_logits(&mut self.logits)
            } else {
                Outputs::default()
            };
            model.forward(&mut self.state, &mut self.ws, chunk, out)?;
            self.fed.extend_from_slice(chunk);
            if total > step {
                if let Some(p) = self.progress.as_mut() {
                    p((i * step + chunk.len()).min(total), total);
                }
            }
        }
        self.has_logits = true;
        Ok(self.logits.as_slice())
    }

    /// Appends `tokens` and returns the logits after each of them (`tokens.len() x vocab`,
    /// row `t` predicting the token after `tokens[t]`), for perplexity and KL measurements.
    pub fn feed_all_logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        if let Some(p) = self.pending.take() {
            self.feed(&[p])?;
        }
        if tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        self.check_room(tokens.len())?;
        let model = self.engine.model();
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

    fn tokenize(&self, prompt: Prompt) -> Result<Vec<u32>> {
        match prompt {
            Prompt::Text(s) => Ok(self.engine.tokenizer().encode(&s)?),
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
        if tokens.is_empty() && !self.has_logits && self.pending.is_none() {
            return Err(EngineError::EmptyPrompt);
        }
        let t0 = Instant::now();
        let n = tokens.len() + usize::from(self.pending.is_some());
        if n > 0 {
            self.feed(&tokens)?;
        }
        let prompt_time = t0.elapsed();
        Ok(Generation::new(self, params, stop, n, prompt_time))
    }

    /// Renders `messages` with the model's chat template (plus the assistant generation prompt)
    /// and streams the assistant's reply. The session keeps the conversation: call again with
    /// the reply and the next user message appended, and only the new tokens are processed.
    pub fn chat(
        &mut self,
        messages: &[ChatMessage],
        params: SamplingParams,
        stop: StopConditions,
    ) -> Result<Generation<'_, 'e>> {
        let text = self.engine.render_chat(messages)?;
        let full = self.engine.tokenizer().encode(&text)?;
        let suffix = self.rewind_to_prefix_of(&full);
        let t0 = Instant::now();
        let n = suffix.len();
        if n > 0 {
            self.feed(&suffix)?;
        }
        let m = self.engine.model();
        let snap = self.state.snapshot(&m.config, &m.backend)?;
        self.prompt_snapshot = Some((self.fed.len(), snap));
        let prompt_time = t0.elapsed();
        Ok(Generation::new(self, params, stop, n, prompt_time))
    }

    /// Brings the session to the longest reusable prefix of `full` and returns the tokens still
    /// to process (never empty: the last prompt token must be run to get logits).
    fn rewind_to_prefix_of(&mut self, full: &[u32]) -> Vec<u32> {
        let current = self.tokens();
        if !current.is_empty() && full.len() > current.len() && full.starts_with(&current) {
            // `feed` processes the pending token first.
            return full[current.len()..].to_vec();
        }
        if let Some((len, snap)) = self.prompt_snapshot.take() {
            if len < full.len() && full.starts_with(&self.fed[..len.min(self.fed.len())]) {
                let m = self.engine.model();
                self.state.restore(&m.config, &m.backend, &snap);
                self.fed.truncate(len);
                self.pending = None;
                self.has_logits = false;
                return full[len..].to_vec();
            }
        }
        self.reset();
        full.to_vec()
    }
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
        prompt_tokens: usize,
        prompt_time: Duration,
    ) -> Self {
        let engine = session.engine;
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
                prompt_tokens,
                prompt_time,
                ..Timings::default()
            },
            finish: None,
            session,
        }
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
        let s = &mut *self.session;
        if !s.has_logits {
            let Some(p) = s.pending else {
                return Err(EngineError::EmptyPrompt);
            };
            if s.fed.len() + 1 > s.context() {
                return Ok(self.end(None, String::new(), FinishReason::ContextFull));
            }
            debug_assert_eq!(s.pending, Some(p));
            // `feed` processes the pending token first.
            s.feed(&[])?;
        }
        if s.fed.len() >= s.context() {
            // No room for the sampled token: stop before sampling one that cannot be kept.
            return Ok(self.end(None, String::new(), FinishReason::ContextFull));
        }
        let id = self.sampler.sample(&mut s.logits, &s.fed);
        s.has_logits = false;
        s.pending = Some(id);
        self.timings.generated_tokens += 1;
        let event = if self.stop_tokens.contains(id) {
            self.end(Some(id), String::new(), FinishReason::EndOfGeneration)
        } else {
            let piece = self
                .session
                .engine
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
