//! Choosing the next token from logits, and deciding when generation stops.
//!
//! [`Sampler`] applies, in llama.cpp's default order: the token mask (untrained padding ids),
//! repetition/presence/frequency penalties, top-k, top-p, min-p, temperature, then draws from
//! the softmax with a seeded generator (or takes the argmax when the temperature is 0).
//! [`StopStrings`] cuts streamed text exactly at a stop string; [`StopTokens`] holds the ids
//! that end a generation.

pub mod logprobs;
mod rng;
mod sampler;
mod stop;

pub use logprobs::{LogprobRecorder, TokenLogprob};
pub use rng::SplitMix64;
pub use sampler::{argmax, Sampler, SamplingParams, TokenDist, TokenMask};
pub use stop::{StopChunk, StopStrings, StopTokens};
