//! [`Generation`]: a streaming generation, the iterator [`Session::generate`] and its siblings
//! return.

use super::core::{PromptRun, SpecRun};
use super::request::{CancelToken, FinishReason, StopConditions, Timings, TokenEvent};
use super::thinking::{ThinkState, ThinkingControl};
use super::Session;
use crate::engine::error::Result;
use crate::sampling::{Sampler, SamplingParams, StopStrings, StopTokens, TokenLogprob};
use crate::speculative::SpecStats;
use crate::tokenizer::StreamDecoder;
use std::time::Instant;

/// A streaming generation: an iterator of [`TokenEvent`]s, ending after the event that carries
/// the [`FinishReason`].
pub struct Generation<'s> {
    session: &'s mut Session,
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
    /// Log probabilities are recorded ([`with_logprobs`](Self::with_logprobs)).
    logprobs: bool,
    /// The log probability of the last event's token.
    last_logprob: Option<TokenLogprob>,
    /// The thinking block followed ([`with_thinking`](Self::with_thinking)).
    think: Option<ThinkState>,
}

impl std::fmt::Debug for Generation<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generation")
            .field("timings", &self.timings)
            .field("finish", &self.finish)
            .finish_non_exhaustive()
    }
}

impl<'s> Generation<'s> {
    pub(super) fn new(
        session: &'s mut Session,
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
            logprobs: false,
            last_logprob: None,
            think: None,
            session: {
                session.core.reset_spec_stats();
                session
            },
        }
    }

    /// Records each generated token's log probability and its `top_n` most likely
    /// alternatives ([`crate::sampling::logprobs`] says of which distribution), read with
    /// [`take_logprob`](Self::take_logprob) after each event. Speculative drafting is off for
    /// such a generation (every token is sampled from a row of its own, whose logits are the
    /// ones reported), so call it before the first token.
    pub fn with_logprobs(mut self, top_n: usize) -> Self {
        self.sampler.set_logprobs(Some(top_n));
        self.logprobs = true;
        self
    }

    /// The log probability of the token of the last event (once; `None` for an end token,
    /// for events without a token, or without [`with_logprobs`](Self::with_logprobs)).
    pub fn take_logprob(&mut self) -> Option<TokenLogprob> {
        self.last_logprob.take()
    }

    /// Follows the thinking block `control` describes: its tokens are counted
    /// ([`Timings::reasoning_tokens`]) and, with a budget, the block is closed by forced
    /// tokens when the budget runs out ([`ThinkingControl`]). Call it before the first token.
    /// Ignored for grammar-constrained generations (a forced token would break the grammar).
    pub fn with_thinking(mut self, control: ThinkingControl) -> Self {
        if !self.sampler.is_constrained() {
            self.think = Some(ThinkState::new(control));
        }
        self
    }

    /// Speculative decoding counters of this generation (`None` when speculation is off).
    pub fn spec_stats(&self) -> Option<SpecStats> {
        self.session.core.spec_stats()
    }

    /// The next token (see `CoreOps::next_id`); speculative drafts stop short of
    /// `max_tokens`. A grammar-constrained generation drafts nothing: a verify row's mask
    /// would need the grammar's state after the drafts before it, so every token is sampled
    /// (masked) from the verified row of the last emitted one.
    fn next_id(&mut self) -> Result<Option<u32>> {
        let budget = if self.sampler.is_constrained() || self.logprobs {
            0
        } else {
            let max = self.max_tokens.map_or(usize::MAX, |m| {
                m.saturating_sub(self.timings.generated_tokens + 1)
            });
            // A step emits at most its drafts + 1 tokens: none past the thinking budget.
            let think = self
                .think
                .as_ref()
                .and_then(ThinkState::room)
                .map_or(usize::MAX, |r| r.saturating_sub(1));
            max.min(think)
        };
        self.session
            .core
            .next_id(&mut self.sampler, &mut self.run, budget)
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
        let forced = self.think.as_mut().and_then(ThinkState::next_forced);
        let next = match forced {
            Some(f) => self
                .session
                .core
                .force_next(&mut self.sampler, &mut self.run, f)?,
            None => self.next_id()?,
        };
        let Some(id) = next else {
            return Ok(self.end(None, String::new(), FinishReason::ContextFull));
        };
        self.timings.generated_tokens += 1;
        self.sampler.advance(id);
        self.last_logprob = self.sampler.take_logprob(id);
        let grammar_done = self.sampler.constraint().is_some_and(|c| c.is_finished());
        let event = if self.stop_tokens.contains(id) {
            self.last_logprob = None;
            self.end(Some(id), String::new(), FinishReason::EndOfGeneration)
        } else {
            let piece = self
                .session
                .engine()
                .tokenizer()
                .decode_next(&mut self.decoder, id)?;
            if let Some(t) = self.think.as_mut() {
                t.observe(&piece, forced.is_some());
                self.timings.reasoning_tokens = t.reasoning_tokens();
            }
            let chunk = self.stop_strings.push(&piece);
            if let Some(stop) = chunk.stop {
                self.finish = Some(FinishReason::StopString(stop.clone()));
                TokenEvent {
                    token: Some(id),
                    text: chunk.text,
                    finish: Some(FinishReason::StopString(stop)),
                }
            } else if grammar_done {
                // Nothing may follow the grammar's last token: end here rather than spend a
                // forward pass on the only token allowed next (an end token).
                self.end(Some(id), chunk.text, FinishReason::EndOfGeneration)
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

impl Iterator for Generation<'_> {
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
