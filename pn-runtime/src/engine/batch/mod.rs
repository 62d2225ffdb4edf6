//! Continuous batching: several sequences decoded together, every active sequence's next
//! token from one pass over the weights ([`qwen_model::Model::forward_batch`]).
//!
//! A [`Batch`] has a fixed number of slots, each a sequence state with its own prompt cache
//! (as a [`Session`](super::Session)). Sequences join ([`Batch::add`]) and leave (they finish,
//! or [`Batch::cancel`]) between steps; each [`Batch::step`] runs one forward pass over the
//! rows of every running sequence: one row for each decoding sequence, and a chunk of at most
//! [`BatchOptions::prefill_chunk`] prompt rows for sequences whose prompt is being processed
//! (chunked prefill: a long prompt never stalls the others' streams for more than a chunk).
//! Each sequence samples with its own sampler and seed, so its tokens do not depend on what
//! else is in the batch.
//!
//! With the engine's speculation on ([`EngineOptions::speculation`](super::EngineOptions)) and
//! a model with an MTP block, a decoding sequence's step is a speculative one, as a lone
//! generation's: it drafts with the MTP head (on its own MTP cache), the step's pass carries
//! its `[x_n, drafts]` rows (recording its recurrent state after each), and it accepts its own
//! prefix and rolls back its own state ([`SpecDecoder`](crate::speculative::SpecDecoder)'s
//! `draft`, `verify_parts` and `finish`, the phases of its `step`). So a step may give a
//! sequence several tokens. Sequences that record log probabilities or follow a grammar draft
//! nothing: one row, one token per step.
//!
//! ```
//! use pn_runtime::engine::batch::{Batch, BatchEvent, BatchOptions};
//! use pn_runtime::{Engine, EngineOptions, SamplingParams, StopConditions};
//!
//! let engine = Engine::load(pn_runtime::DEMO_MODEL_PATH, EngineOptions::default())?;
//! let mut batch = Batch::new(&engine, BatchOptions { slots: 2, prefill_chunk: 32 })?;
//! let a = batch.add("def add(a, b):", SamplingParams::greedy(), StopConditions::max_tokens(4))?;
//! let b = batch.add("import os\n", SamplingParams::greedy(), StopConditions::max_tokens(4))?;
//! let mut text = [String::new(), String::new()];
//! while batch.active() > 0 {
//!     for event in batch.step()? {
//!         if let BatchEvent::Token { id, event, .. } = event {
//!             text[usize::from(id == b)].push_str(&event.text);
//!         }
//!     }
//! }
//! assert!(!text[0].is_empty() && !text[1].is_empty());
//! # let _ = a;
//! # Ok::<(), pn_runtime::EngineError>(())
//! ```

mod core;

use self::core::{BatchCore, BatchOps, NewSeq};
use super::error::Result;
use super::ThinkingControl;
use super::{Engine, EngineError, LoadedModel, Prompt, StopConditions, Timings, TokenEvent};
use crate::sampling::{SamplingParams, TokenLogprob};
use crate::speculative::SpecStats;
use std::sync::Arc;

/// How a [`Batch`] is shaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchOptions {
    /// Sequences that can run at once (each slot holds one sequence state of the engine's
    /// context, and its prompt cache).
    pub slots: usize,
    /// Most prompt rows one step processes (all prefilling sequences together).
    pub prefill_chunk: usize,
}

impl Default for BatchOptions {
    /// Four slots, prefill chunks of 64 rows.
    fn default() -> Self {
        BatchOptions {
            slots: 4,
            prefill_chunk: 64,
        }
    }
}

/// A sequence of a [`Batch`] (unique for the batch's life).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub(crate) u64);

impl std::fmt::Display for SeqId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "seq{}", self.0)
    }
}

/// What a [`Batch::step`] reports.
#[derive(Debug, Clone, PartialEq)]
pub enum BatchEvent {
    /// A sequence's prompt is processed (its first token follows in the same step).
    Started {
        /// The sequence.
        id: SeqId,
        /// Prompt tokens run through the model.
        processed: usize,
        /// Prompt tokens reused from the slot's state or prompt cache.
        reused: usize,
    },
    /// A sequence's next token (as [`Generation`](super::Generation) streams it); the one with
    /// `event.finish` set is its last, and the sequence has left the batch.
    Token {
        /// The sequence.
        id: SeqId,
        /// The token, its text, and the finish reason on the last.
        event: TokenEvent,
        /// The sequence's counts and times so far.
        timings: Timings,
        /// The token's log probability, when the sequence records them
        /// ([`SeqOptions::logprobs`]; `None` for an end token).
        logprob: Option<TokenLogprob>,
        /// The sequence's speculative decoding counters so far (`None`: speculation off).
        spec: Option<SpecStats>,
    },
}

/// Per-sequence options beyond sampling and stopping (what
/// [`Generation::with_logprobs`](super::Generation::with_logprobs) and
/// [`Generation::with_thinking`](super::Generation::with_thinking) set on a lone generation).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeqOptions {
    /// Record each token's log probability with this many alternatives
    /// ([`BatchEvent::Token::logprob`]).
    pub logprobs: Option<usize>,
    /// Follow (and with a budget, close) the thinking block.
    pub thinking: Option<ThinkingControl>,
}

/// What the last step ran.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepInfo {
    /// Sequences in the forward pass (the batch size).
    pub sequences: usize,
    /// Rows of the pass (decode rows plus prefill chunk rows).
    pub rows: usize,
}

/// Several sequences decoded together (see the [module docs](self)).
pub struct Batch {
    core: Box<dyn BatchOps>,
    /// When each slot last got a sequence (a counter), for least-recently-used ties.
    last_used: Vec<u64>,
    added: u64,
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("slots", &self.slots())
            .field("active", &self.active())
            .finish_non_exhaustive()
    }
}

impl Batch {
    /// A batch of `options.slots` empty slots on `engine`.
    pub fn new(engine: &Engine, options: BatchOptions) -> Result<Batch> {
        let engine = engine.clone();
        let core: Box<dyn BatchOps> = match engine.loaded() {
            LoadedModel::Cpu(m) => {
                let m = Arc::clone(m);
                Box::new(BatchCore::new(engine, m, options)?)
            }
            LoadedModel::Cuda(m) => {
                let m = Arc::clone(m);
                Box::new(BatchCore::new(engine, m, options)?)
            }
        };
        let n = core.n_slots();
        Ok(Batch {
            core,
            last_used: vec![0; n],
            added: 0,
        })
    }

    /// The engine the batch runs on.
    pub fn engine(&self) -> &Engine {
        self.core.engine()
    }

    /// Slots in all.
    pub fn slots(&self) -> usize {
        self.core.n_slots()
    }

    /// Sequences running.
    pub fn active(&self) -> usize {
        self.core.active()
    }

    /// The slots running no sequence.
    pub fn free_slots(&self) -> Vec<usize> {
        (0..self.slots())
            .filter(|&i| self.core.is_free(i))
            .collect()
    }

    /// How many leading tokens of `tokens` slot `slot` would not process again (its state or
    /// a prompt-cache checkpoint), as [`Session::reusable_prefix`](super::Session::reusable_prefix).
    pub fn reusable_prefix(&self, slot: usize, tokens: &[u32]) -> usize {
        self.core.reusable_prefix(slot, tokens)
    }

    /// The slot running sequence `id`.
    pub fn slot_of(&self, id: SeqId) -> Option<usize> {
        self.core.slot_of(id)
    }

    fn tokenize(&self, prompt: Prompt) -> Result<Vec<u32>> {
        match prompt {
            Prompt::Text(s) => Ok(self.engine().tokenizer().encode(&s)?),
            Prompt::Tokens(t) => Ok(t),
        }
    }

    /// Starts a sequence holding exactly `prompt` (as
    /// [`Session::generate_sequence`](super::Session::generate_sequence)) in the free slot
    /// that can reuse the most of it (among equals the least recently used, so a conversation
    /// kept in one slot survives unrelated sequences). Its prompt runs in the following steps.
    /// [`EngineError::BatchFull`] when no slot is free.
    pub fn add(
        &mut self,
        prompt: impl Into<Prompt>,
        params: SamplingParams,
        stop: StopConditions,
    ) -> Result<SeqId> {
        self.add_with(prompt, params, stop, SeqOptions::default())
    }

    /// [`add`](Self::add) with log probabilities or thinking control.
    pub fn add_with(
        &mut self,
        prompt: impl Into<Prompt>,
        params: SamplingParams,
        stop: StopConditions,
        options: SeqOptions,
    ) -> Result<SeqId> {
        let tokens = self.tokenize(prompt.into())?;
        let slot = self
            .free_slots()
            .into_iter()
            .max_by_key(|&i| {
                (
                    self.reusable_prefix(i, &tokens),
                    u64::MAX - self.last_used[i],
                    usize::MAX - i,
                )
            })
            .ok_or(EngineError::BatchFull {
                slots: self.slots(),
            })?;
        self.add_to_slot_with(slot, Prompt::Tokens(tokens), params, stop, options)
    }

    /// [`add`](Self::add) in slot `slot`, which must be free.
    pub fn add_to_slot(
        &mut self,
        slot: usize,
        prompt: impl Into<Prompt>,
        params: SamplingParams,
        stop: StopConditions,
    ) -> Result<SeqId> {
        self.add_to_slot_with(slot, prompt, params, stop, SeqOptions::default())
    }

    /// [`add_to_slot`](Self::add_to_slot) with log probabilities or thinking control.
    pub fn add_to_slot_with(
        &mut self,
        slot: usize,
        prompt: impl Into<Prompt>,
        params: SamplingParams,
        stop: StopConditions,
        options: SeqOptions,
    ) -> Result<SeqId> {
        let tokens = self.tokenize(prompt.into())?;
        let req = NewSeq {
            tokens,
            params,
            stop,
            options,
        };
        let id = self.core.add(slot, req)?;
        self.added += 1;
        self.last_used[slot] = self.added;
        Ok(id)
    }

    /// One step: one forward pass over the rows of every running sequence, then a token for
    /// each that decodes (sequences whose prompt finished in this pass included). Sequences
    /// cancelled through their [`StopConditions::cancel`] token end here with
    /// [`FinishReason::Cancelled`](super::FinishReason::Cancelled). Returns no events when no
    /// sequence runs.
    ///
    /// An error of the forward pass ends every sequence that was in it (their slots start
    /// afresh); the others keep running.
    pub fn step(&mut self) -> Result<Vec<BatchEvent>> {
        self.core.step()
    }

    /// Removes sequence `id` now (no final event), returning its timings; `None` if it is not
    /// running. Its slot keeps the tokens it processed (a later sequence can reuse them).
    pub fn cancel(&mut self, id: SeqId) -> Option<Timings> {
        self.core.remove(id)
    }

    /// What the last step ran (the batch size per step, for metrics).
    pub fn last_step(&self) -> StepInfo {
        self.core.last_step()
    }
}
