//! The batch core: the slots, their sequences and the batched step, written once over the
//! backend `B` (the public [`Batch`](super::Batch) holds it behind the object-safe
//! [`BatchOps`]).

use super::{BatchEvent, BatchOptions, SeqId, SeqOptions, StepInfo};
use crate::engine::error::{EngineError, Result};
use crate::engine::session::{SessionCore, TokenStream};
use crate::engine::{Engine, FinishReason, StopConditions, Timings};
use crate::sampling::SamplingParams;
use qwen_model::{Backend, BatchSeq, Model, Outputs, Workspace};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

/// What [`Batch`](super::Batch) asks of the core of the engine's backend.
pub(super) trait BatchOps: Send {
    /// The engine.
    fn engine(&self) -> &Engine;
    /// Slots in all.
    fn n_slots(&self) -> usize;
    /// Whether `slot` exists and runs no sequence.
    fn is_free(&self, slot: usize) -> bool;
    /// Leading tokens of `tokens` slot `slot` would not process again.
    fn reusable_prefix(&self, slot: usize, tokens: &[u32]) -> usize;
    /// Starts a sequence in the free `slot`.
    fn add(&mut self, slot: usize, req: NewSeq) -> Result<SeqId>;
    /// One batched step.
    fn step(&mut self) -> Result<Vec<BatchEvent>>;
    /// Removes a running sequence.
    fn remove(&mut self, id: SeqId) -> Option<Timings>;
    /// Sequences running.
    fn active(&self) -> usize;
    /// What the last step ran.
    fn last_step(&self) -> StepInfo;
    /// The slot running `id`.
    fn slot_of(&self, id: SeqId) -> Option<usize>;
}

/// A sequence to start, its prompt already tokenized.
pub(super) struct NewSeq {
    pub(super) tokens: Vec<u32>,
    pub(super) params: SamplingParams,
    pub(super) stop: StopConditions,
    pub(super) options: SeqOptions,
}

/// Where a running sequence is.
enum Phase {
    /// Its prompt is being processed: `prompt[next..]` is still to run; a prompt-cache
    /// checkpoint is taken before the chunk starting at each of `marks` (absolute positions).
    Prefill {
        prompt: Vec<u32>,
        next: usize,
        marks: VecDeque<usize>,
    },
    /// The logits after its last token are at hand: it samples next.
    Sample,
    /// A sampled token waits to be fed.
    Decode,
}

/// A sequence running in a slot.
struct Active {
    id: SeqId,
    stream: TokenStream,
    phase: Phase,
    /// When it was added (the prompt time runs from here).
    added: Instant,
    /// When its prompt was done (the generation time runs from here).
    prompt_done: Option<Instant>,
    /// Whether its [`BatchEvent::Started`] went out.
    started: bool,
}

/// One slot: a session core (state, tokens, prompt cache) and the sequence it runs.
struct Slot<B: Backend> {
    core: SessionCore<B>,
    seq: Option<Active>,
    /// The rows the slot feeds in the current step.
    rows: Vec<u32>,
    /// Whether the current step writes its logits.
    wants_logits: bool,
}

/// The batch on backend `B`.
pub(super) struct BatchCore<B: Backend> {
    engine: Engine,
    model: Arc<Model<B>>,
    slots: Vec<Slot<B>>,
    /// Rows of one step: a decode row per slot plus a prefill chunk.
    ws: Workspace<B>,
    chunk: usize,
    next_id: u64,
    last: StepInfo,
}

impl<B: Backend> BatchCore<B> {
    pub(super) fn new(
        engine: Engine,
        model: Arc<Model<B>>,
        opts: BatchOptions,
    ) -> Result<BatchCore<B>> {
        let n = opts.slots.max(1);
        let chunk = opts.prefill_chunk.max(1);
        let slots = (0..n)
            .map(|_| {
                Ok(Slot {
                    core: SessionCore::for_batch(engine.clone(), Arc::clone(&model))?,
                    seq: None,
                    rows: Vec::new(),
                    wants_logits: false,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(BatchCore {
            ws: model.new_workspace(n + chunk)?,
            engine,
            model,
            slots,
            chunk,
            next_id: 0,
            last: StepInfo::default(),
        })
    }

    /// Samples the next token of the sequence in slot `i` (its logits at hand) and pushes its
    /// events; the sequence leaves the slot when it ends.
    fn sample(&mut self, i: usize, events: &mut Vec<BatchEvent>) -> Result<()> {
        let slot = &mut self.slots[i];
        let Some(a) = slot.seq.as_mut() else {
            return Ok(());
        };
        if !a.started {
            a.started = true;
            events.push(BatchEvent::Started {
                id: a.id,
                processed: a.stream.timings.prompt_tokens,
                reused: a.stream.timings.prompt_reused,
            });
        }
        let event = match a.stream.stop_before_sampling() {
            Some(end) => end,
            None => {
                let forced = a.stream.next_forced();
                let id = match forced {
                    Some(f) => slot.core.batch_force(&mut a.stream.sampler, f),
                    None => slot.core.batch_sample(&mut a.stream.sampler),
                };
                match id {
                    Some(id) => a.stream.on_token(&self.engine, id, forced.is_some())?,
                    None => a.stream.end(None, String::new(), FinishReason::ContextFull),
                }
            }
        };
        if let Some(t) = a.prompt_done {
            a.stream.timings.generation_time = t.elapsed();
        }
        a.phase = Phase::Decode;
        let done = event.finish.is_some();
        events.push(BatchEvent::Token {
            id: a.id,
            event,
            timings: a.stream.timings,
            logprob: a.stream.take_logprob(),
        });
        if done {
            slot.seq = None;
        }
        Ok(())
    }

    /// Plans the rows of every slot for this step: a decode row per decoding sequence, then
    /// prefill chunks of at most `chunk` rows in all, each ending before the sequence's next
    /// prompt-cache mark (taken here, before the chunk). Prompts with the fewest tokens left
    /// go first, and while some prompt finishes in this step, a prompt that cannot finish
    /// takes no more rows than the finishing ones: a short request arriving during a long
    /// prompt gets its first token after one step at most about twice as long as its own
    /// prefill (the time-to-first-token bound of chunked prefill).
    fn plan(&mut self) -> Result<()> {
        // (prompt tokens left, sequence, slot) of the prefilling sequences.
        let mut prefill = Vec::new();
        for (i, slot) in self.slots.iter_mut().enumerate() {
            slot.rows.clear();
            slot.wants_logits = false;
            let Some(a) = slot.seq.as_mut() else {
                continue;
            };
            match &a.phase {
                Phase::Decode => {
                    if let Some(p) = slot.core.batch_take_pending() {
                        slot.rows.push(p);
                        slot.wants_logits = true;
                    }
                }
                Phase::Prefill { prompt, next, .. } => {
                    prefill.push((prompt.len() - next, a.id, i));
                }
                Phase::Sample => {}
            }
        }
        prefill.sort_unstable();
        let (mut budget, mut finishing) = (self.chunk, 0);
        for (left, _, i) in prefill {
            if budget == 0 {
                break;
            }
            let slot = &mut self.slots[i];
            let Some(Active {
                phase:
                    Phase::Prefill {
                        prompt,
                        next,
                        marks,
                    },
                ..
            }) = slot.seq.as_mut()
            else {
                continue;
            };
            let pos = slot.core.batch_pos();
            if marks.front() == Some(&pos) {
                marks.pop_front();
                slot.core.batch_checkpoint(false)?;
            }
            let to_mark = marks.front().map_or(left, |&m| m - pos);
            let mut n = budget.min(left).min(to_mark);
            if n == left {
                finishing += n;
            } else if finishing > 0 {
                n = n.min(finishing);
            }
            slot.rows.extend_from_slice(&prompt[*next..*next + n]);
            *next += n;
            slot.wants_logits = *next == prompt.len();
            budget -= n;
        }
        Ok(())
    }

    /// The forward pass over the planned rows. On an error the sequences in it end and their
    /// slots start afresh (the pass may have updated some states and not others).
    fn run_pass(&mut self) -> Result<()> {
        let mut seqs: Vec<BatchSeq<'_, B>> = Vec::new();
        for s in &mut self.slots {
            if s.rows.is_empty() {
                continue;
            }
            let (state, logits) = s.core.batch_parts();
            let out = if s.wants_logits {
                Outputs::last_logits(logits)
            } else {
                Outputs::default()
            };
            seqs.push(BatchSeq {
                state,
                tokens: &s.rows,
                out,
                trace: None,
            });
        }
        self.last = StepInfo {
            sequences: seqs.len(),
            rows: seqs.iter().map(|s| s.tokens.len()).sum(),
        };
        if seqs.is_empty() {
            return Ok(());
        }
        let r = self.model.forward_batch(&mut self.ws, &mut seqs);
        drop(seqs);
        if let Err(e) = r {
            for s in &mut self.slots {
                if !s.rows.is_empty() {
                    s.seq = None;
                    s.rows.clear();
                    s.core.batch_reset()?;
                }
            }
            return Err(e.into());
        }
        Ok(())
    }
}

impl<B: Backend> BatchOps for BatchCore<B>
where
    BatchCore<B>: Send,
{
    fn engine(&self) -> &Engine {
        &self.engine
    }

    fn n_slots(&self) -> usize {
        self.slots.len()
    }

    fn is_free(&self, slot: usize) -> bool {
        self.slots.get(slot).is_some_and(|s| s.seq.is_none())
    }

    fn reusable_prefix(&self, slot: usize, tokens: &[u32]) -> usize {
        self.slots
            .get(slot)
            .map_or(0, |s| s.core.reusable_prefix_of(tokens))
    }

    fn add(&mut self, slot: usize, req: NewSeq) -> Result<SeqId> {
        let n_slots = self.slots.len();
        if !self.is_free(slot) {
            return Err(EngineError::BatchSlot {
                slot,
                slots: n_slots,
            });
        }
        let added = Instant::now();
        let s = &mut self.slots[slot];
        let (reused, marks) = s.core.batch_begin(&req.tokens)?;
        let whole = reused == req.tokens.len() && s.core.batch_has_logits();
        let phase = if whole {
            Phase::Sample
        } else {
            Phase::Prefill {
                prompt: req.tokens[reused..].to_vec(),
                next: 0,
                marks: marks.into(),
            }
        };
        let id = SeqId(self.next_id);
        self.next_id += 1;
        let timings = Timings {
            prompt_reused: reused,
            prompt_tokens: req.tokens.len() - reused,
            ..Timings::default()
        };
        let mut stream = TokenStream::new(&self.engine, req.params, req.stop, timings);
        if let Some(n) = req.options.logprobs {
            stream.set_logprobs(n);
        }
        if let Some(t) = req.options.thinking {
            stream.set_thinking(t);
        }
        s.seq = Some(Active {
            id,
            stream,
            phase,
            added,
            prompt_done: whole.then_some(added),
            started: false,
        });
        Ok(id)
    }

    fn step(&mut self) -> Result<Vec<BatchEvent>> {
        let mut events = Vec::new();
        // Sequences cancelled since the last step leave before it.
        for s in &mut self.slots {
            if let Some(a) = s.seq.as_mut() {
                if a.stream.cancelled() {
                    let event = a.stream.end(None, String::new(), FinishReason::Cancelled);
                    let (id, timings) = (a.id, a.stream.timings);
                    events.push(BatchEvent::Token {
                        id,
                        event,
                        timings,
                        logprob: None,
                    });
                    s.seq = None;
                }
            }
        }
        // A prompt the cache held whole samples first (its token is fed in this pass).
        for i in 0..self.slots.len() {
            if let Some(Active {
                phase: Phase::Sample,
                ..
            }) = self.slots[i].seq
            {
                self.sample(i, &mut events)?;
            }
        }
        self.plan()?;
        self.run_pass()?;
        for i in 0..self.slots.len() {
            let s = &mut self.slots[i];
            if s.rows.is_empty() {
                continue;
            }
            s.core.batch_fed(&s.rows, s.wants_logits);
            let Some(a) = s.seq.as_mut() else {
                continue;
            };
            if !s.wants_logits {
                continue;
            }
            if matches!(a.phase, Phase::Prefill { .. }) {
                // The prompt's last chunk: its checkpoint (with the logits), then sample.
                s.core.batch_checkpoint(true)?;
                a.stream.timings.prompt_time = a.added.elapsed();
                a.prompt_done = Some(Instant::now());
            }
            self.sample(i, &mut events)?;
        }
        Ok(events)
    }

    fn remove(&mut self, id: SeqId) -> Option<Timings> {
        let slot = self.slot_of(id)?;
        let a = self.slots[slot].seq.take()?;
        Some(a.stream.timings)
    }

    fn active(&self) -> usize {
        self.slots.iter().filter(|s| s.seq.is_some()).count()
    }

    fn last_step(&self) -> StepInfo {
        self.last
    }

    fn slot_of(&self, id: SeqId) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.seq.as_ref().is_some_and(|a| a.id == id))
    }
}
