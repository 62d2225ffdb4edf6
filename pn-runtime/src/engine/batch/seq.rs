//! One sequence's generation inside a batch: its sampler (own seed, own random stream, so its
//! tokens do not depend on what else is in the batch), stop conditions, text decoding and
//! timings. The token handling is that of [`Generation`](crate::engine::Generation), for a
//! token the batch sampled instead of one the generation's own forward pass produced.

use crate::engine::error::Result;
use crate::engine::{CancelToken, Engine, FinishReason, StopConditions, Timings, TokenEvent};
use crate::sampling::{Sampler, SamplingParams, StopStrings, StopTokens};
use crate::tokenizer::StreamDecoder;

/// The per-sequence generation state.
pub(super) struct SeqStream {
    /// The sequence's own sampler.
    pub(super) sampler: Sampler,
    stop_tokens: StopTokens,
    stop_strings: StopStrings,
    decoder: StreamDecoder,
    max_tokens: Option<usize>,
    cancel: CancelToken,
    /// Counts and times so far.
    pub(super) timings: Timings,
    /// Set once the sequence has ended.
    pub(super) finish: Option<FinishReason>,
}

impl SeqStream {
    /// A stream for `params` and `stop` on `engine`'s tokenizer and end tokens.
    pub(super) fn new(engine: &Engine, params: SamplingParams, stop: StopConditions) -> Self {
        let stop_tokens = if stop.ignore_eog {
            StopTokens::new(stop.tokens.iter().copied())
        } else {
            engine
                .stop_tokens()
                .clone()
                .with(stop.tokens.iter().copied())
        };
        SeqStream {
            sampler: Sampler::new(params, engine.token_mask().clone()),
            stop_tokens,
            stop_strings: StopStrings::new(stop.strings),
            decoder: StreamDecoder::new(),
            max_tokens: stop.max_tokens,
            cancel: stop.cancel.unwrap_or_default(),
            timings: Timings::default(),
            finish: None,
        }
    }

    /// Whether the sequence was cancelled.
    pub(super) fn cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// The final event when the sequence must stop before sampling another token (cancelled,
    /// or `max_tokens` generated).
    pub(super) fn stop_before_sampling(&mut self) -> Option<TokenEvent> {
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

    /// Text still held back, released at the end.
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
    pub(super) fn end(
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

    /// The event for the sampled token `id`: its text, and the end when it is an end token,
    /// completes a stop string or the grammar, or is the last `max_tokens` allows.
    pub(super) fn on_token(&mut self, engine: &Engine, id: u32) -> Result<TokenEvent> {
        self.timings.generated_tokens += 1;
        self.sampler.advance(id);
        let grammar_done = self.sampler.constraint().is_some_and(|c| c.is_finished());
        if self.stop_tokens.contains(id) {
            return Ok(self.end(Some(id), String::new(), FinishReason::EndOfGeneration));
        }
        let piece = engine.tokenizer().decode_next(&mut self.decoder, id)?;
        let chunk = self.stop_strings.push(&piece);
        Ok(if let Some(stop) = chunk.stop {
            self.finish = Some(FinishReason::StopString(stop.clone()));
            TokenEvent {
                token: Some(id),
                text: chunk.text,
                finish: Some(FinishReason::StopString(stop)),
            }
        } else if grammar_done {
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
