//! One generation's handling of its emitted tokens, shared by [`Generation`](super::Generation)
//! (a session's own forward passes) and the batch (tokens sampled from a batched pass): the
//! sampler (its own seed and random stream), the stop conditions, the text decoding, the
//! thinking block ([`ThinkState`]), the log probability of each token, and the timings.

use super::request::{CancelToken, FinishReason, StopConditions, Timings, TokenEvent};
use super::thinking::{ThinkState, ThinkingControl};
use crate::engine::error::Result;
use crate::engine::Engine;
use crate::sampling::{Sampler, SamplingParams, StopStrings, StopTokens, TokenLogprob};
use crate::tokenizer::StreamDecoder;

/// The per-generation token state.
pub(crate) struct TokenStream {
    /// The generation's own sampler.
    pub(crate) sampler: Sampler,
    stop_tokens: StopTokens,
    stop_strings: StopStrings,
    decoder: StreamDecoder,
    max_tokens: Option<usize>,
    cancel: CancelToken,
    /// Counts and times so far.
    pub(crate) timings: Timings,
    /// Set once the generation has ended.
    pub(crate) finish: Option<FinishReason>,
    /// Log probabilities are recorded ([`with_logprobs`](Self::with_logprobs)).
    logprobs: bool,
    /// The log probability of the last event's token.
    last_logprob: Option<TokenLogprob>,
    /// The thinking block followed ([`with_thinking`](Self::with_thinking)).
    think: Option<ThinkState>,
}

impl TokenStream {
    /// A stream for `params` and `stop` on `engine`'s tokenizer and end tokens, starting
    /// from `timings` (the prompt's).
    pub(crate) fn new(
        engine: &Engine,
        params: SamplingParams,
        stop: StopConditions,
        timings: Timings,
    ) -> Self {
        let stop_tokens = if stop.ignore_eog {
            StopTokens::new(stop.tokens.iter().copied())
        } else {
            engine
                .stop_tokens()
                .clone()
                .with(stop.tokens.iter().copied())
        };
        TokenStream {
            sampler: Sampler::new(params, engine.token_mask().clone()),
            stop_tokens,
            stop_strings: StopStrings::new(stop.strings),
            decoder: StreamDecoder::new(),
            max_tokens: stop.max_tokens,
            cancel: stop.cancel.unwrap_or_default(),
            timings,
            finish: None,
            logprobs: false,
            last_logprob: None,
            think: None,
        }
    }

    /// Records each token's log probability and its `top_n` most likely alternatives.
    pub(crate) fn set_logprobs(&mut self, top_n: usize) {
        self.sampler.set_logprobs(Some(top_n));
        self.logprobs = true;
    }

    /// Follows the thinking block `control` describes; ignored for grammar-constrained
    /// output (a forced token would break the grammar).
    pub(crate) fn set_thinking(&mut self, control: ThinkingControl) {
        if !self.sampler.is_constrained() {
            self.think = Some(ThinkState::new(control));
        }
    }

    /// The log probability of the last event's token (once).
    pub(crate) fn take_logprob(&mut self) -> Option<TokenLogprob> {
        self.last_logprob.take()
    }

    /// The cancel handle.
    pub(crate) fn cancel_token(&self) -> &CancelToken {
        &self.cancel
    }

    /// Whether the generation was cancelled.
    pub(crate) fn cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Most draft tokens a speculative step may propose: none for constrained output (a
    /// verify row's mask would need the grammar's state after the drafts) or with log
    /// probabilities (each token from a row of its own), else what keeps the step short of
    /// `max_tokens` and of the thinking budget (a step emits at most its drafts + 1).
    pub(crate) fn draft_budget(&self) -> usize {
        if self.sampler.is_constrained() || self.logprobs {
            return 0;
        }
        let max = self.max_tokens.map_or(usize::MAX, |m| {
            m.saturating_sub(self.timings.generated_tokens + 1)
        });
        let think = self
            .think
            .as_ref()
            .and_then(ThinkState::room)
            .map_or(usize::MAX, |r| r.saturating_sub(1));
        max.min(think)
    }

    /// Whether the next token is forced ([`next_forced`](Self::next_forced) would give one):
    /// the batch then feeds the pending token without a speculative step, as a lone
    /// generation does.
    pub(crate) fn forces_next(&self) -> bool {
        self.think.as_ref().is_some_and(ThinkState::forces_next)
    }

    /// The token to emit without sampling next (the thinking budget's closing sequence).
    pub(crate) fn next_forced(&mut self) -> Option<u32> {
        self.think.as_mut().and_then(ThinkState::next_forced)
    }

    /// The final event when the generation must stop before another token (cancelled, or
    /// `max_tokens` generated).
    pub(crate) fn stop_before_sampling(&mut self) -> Option<TokenEvent> {
        if self.cancelled() {
            return Some(self.end(None, String::new(), FinishReason::Cancelled));
        }
        if self
            .max_tokens
            .is_some_and(|m| self.timings.generated_tokens >= m)
        {
            return Some(self.end(None, String::new(), FinishReason::MaxTokens));
        }
        None
    }

    /// Text still held back (an incomplete character, a possible stop-string start),
    /// released at the end.
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

    /// The final event (held-back text released; a stop string found in it wins).
    pub(crate) fn end(
        &mut self,
        token: Option<u32>,
        mut text: String,
        reason: FinishReason,
    ) -> TokenEvent {
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

    /// The event for the emitted token `id` (`forced`: from [`next_forced`](Self::next_forced)):
    /// its text, and the end when it is an end token, completes a stop string or the grammar,
    /// or is the last `max_tokens` allows.
    pub(crate) fn on_token(
        &mut self,
        engine: &Engine,
        id: u32,
        forced: bool,
    ) -> Result<TokenEvent> {
        self.timings.generated_tokens += 1;
        self.sampler.advance(id);
        self.last_logprob = self.sampler.take_logprob(id);
        let grammar_done = self.sampler.constraint().is_some_and(|c| c.is_finished());
        if self.stop_tokens.contains(id) {
            self.last_logprob = None;
            return Ok(self.end(Some(id), String::new(), FinishReason::EndOfGeneration));
        }
        let piece = engine.tokenizer().decode_next(&mut self.decoder, id)?;
        if let Some(t) = self.think.as_mut() {
            t.observe(&piece, forced);
            self.timings.reasoning_tokens = t.reasoning_tokens();
        }
        let chunk = self.stop_strings.push(&piece);
        Ok(if let Some(stop) = chunk.stop {
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
        })
    }
}
