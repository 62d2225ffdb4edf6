//! [`Generation`]: a streaming generation, the iterator [`Session::generate`] and its siblings
//! return.

use super::core::{PromptRun, SpecRun};
use super::request::{CancelToken, FinishReason, StopConditions, Timings, TokenEvent};
use super::thinking::ThinkingControl;
use super::token_stream::TokenStream;
use super::Session;
use crate::engine::error::Result;
use crate::sampling::{SamplingParams, TokenLogprob};
use crate::speculative::SpecStats;
use std::time::Instant;

/// A streaming generation: an iterator of [`TokenEvent`]s, ending after the event that carries
/// the [`FinishReason`].
pub struct Generation<'s> {
    session: &'s mut Session,
    /// Sampler, stop conditions, text, thinking block, log probabilities, timings.
    stream: TokenStream,
    /// The current speculative run (empty until a speculative step).
    run: SpecRun,
}

impl std::fmt::Debug for Generation<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generation")
            .field("timings", &self.stream.timings)
            .field("finish", &self.stream.finish)
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
        let timings = Timings {
            prompt_tokens: prompt.processed,
            prompt_reused: prompt.reused,
            prompt_time: prompt.time,
            ..Timings::default()
        };
        Generation {
            stream: TokenStream::new(session.engine(), params, stop, timings),
            run: SpecRun::default(),
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
        self.stream.set_logprobs(top_n);
        self
    }

    /// The log probability of the token of the last event (once; `None` for an end token,
    /// for events without a token, or without [`with_logprobs`](Self::with_logprobs)).
    pub fn take_logprob(&mut self) -> Option<TokenLogprob> {
        self.stream.take_logprob()
    }

    /// Follows the thinking block `control` describes: its tokens are counted
    /// ([`Timings::reasoning_tokens`]) and, with a budget, the block is closed by forced
    /// tokens when the budget runs out ([`ThinkingControl`]). Call it before the first token.
    /// Ignored for grammar-constrained generations (a forced token would break the grammar).
    pub fn with_thinking(mut self, control: ThinkingControl) -> Self {
        self.stream.set_thinking(control);
        self
    }

    /// Speculative decoding counters of this generation (`None` when speculation is off).
    pub fn spec_stats(&self) -> Option<SpecStats> {
        self.session.core.spec_stats()
    }

    /// A handle that cancels this generation (checked before every token).
    pub fn cancel_token(&self) -> CancelToken {
        self.stream.cancel_token().clone()
    }

    /// Token counts and times so far.
    pub fn timings(&self) -> Timings {
        self.stream.timings
    }

    /// Why the generation ended, once it has.
    pub fn finish_reason(&self) -> Option<&FinishReason> {
        self.stream.finish.as_ref()
    }

    /// Runs the generation to its end and returns the text.
    pub fn text(self) -> Result<String> {
        let mut s = String::new();
        for e in self {
            s.push_str(&e?.text);
        }
        Ok(s)
    }

    /// The next token: forced by the thinking budget, or from `CoreOps::next_id` with the
    /// stream's draft budget (see [`TokenStream::draft_budget`]).
    fn step(&mut self) -> Result<TokenEvent> {
        if let Some(end) = self.stream.stop_before_sampling() {
            return Ok(end);
        }
        let t0 = Instant::now();
        let forced = self.stream.next_forced();
        let next = match forced {
            Some(f) => self
                .session
                .core
                .force_next(&mut self.stream.sampler, &mut self.run, f)?,
            None => {
                let budget = self.stream.draft_budget();
                self.session
                    .core
                    .next_id(&mut self.stream.sampler, &mut self.run, budget)?
            }
        };
        let Some(id) = next else {
            return Ok(self
                .stream
                .end(None, String::new(), FinishReason::ContextFull));
        };
        let event = self
            .stream
            .on_token(self.session.engine(), id, forced.is_some())?;
        self.stream.timings.generation_time += t0.elapsed();
        Ok(event)
    }
}

impl Iterator for Generation<'_> {
    type Item = Result<TokenEvent>;

    fn next(&mut self) -> Option<Result<TokenEvent>> {
        if self.stream.finish.is_some() {
            return None;
        }
        let r = self.step();
        if r.is_err() {
            // An error ends the stream.
            self.stream.finish = Some(FinishReason::Cancelled);
        }
        Some(r)
    }
}
