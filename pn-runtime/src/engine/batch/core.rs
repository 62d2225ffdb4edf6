//! The batch core: the slots, their sequences and the batched step, written once over the
//! backend `B` (the public [`Batch`](super::Batch) holds it behind the object-safe
//! [`BatchOps`]).

use super::{BatchEvent, BatchOptions, SeqId, SeqOptions, StepInfo};
use crate::engine::error::{EngineError, Result};
use crate::engine::session::{SessionCore, SpecRun, TokenStream};
use crate::engine::TokenEvent;
use crate::engine::{Engine, FinishReason, StopConditions, Timings};
use crate::sampling::SamplingParams;
use crate::speculative::{DraftNeed, Speculation};
use qwen_model::{Backend, BatchSeq, Model, ModelError, MtpSeq, Outputs, Workspace};
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

/// One slot: a session core (state, tokens, prompt cache, speculative decoder) and the
/// sequence it runs.
struct Slot<B: Backend> {
    core: SessionCore<B>,
    seq: Option<Active>,
    /// The rows the slot feeds in the current step.
    rows: Vec<u32>,
    /// Whether the current step writes its logits.
    wants_logits: bool,
    /// Whether `rows` are a speculative verification `[x_n, drafts]` (the decoder's outputs).
    verify: bool,
    /// The last speculative step's run, emitted after its pass.
    run: SpecRun,
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
                    verify: false,
                    run: SpecRun::default(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        // A decoding sequence feeds `1 + drafts` rows (its verification), the prefill chunk
        // the rest.
        let per_seq = match engine.options().speculation {
            Speculation::Mtp { draft } if model.config.n_mtp > 0 => 1 + draft,
            _ => 1,
        };
        Ok(BatchCore {
            ws: model.new_workspace(n * per_seq + chunk)?,
            engine,
            model,
            slots,
            chunk,
            next_id: 0,
            last: StepInfo::default(),
        })
    }

    /// Whether the batch's passes keep their logits on the backend (the slots' decode path).
    fn keeps_logits(&self) -> bool {
        self.slots
            .first()
            .is_some_and(|s| s.core.batch_keeps_logits())
    }

    /// Samples the next token of the sequence in slot `i` (its logits at hand) and pushes its
    /// events; the sequence leaves the slot when it ends.
    fn sample(&mut self, i: usize, events: &mut Vec<BatchEvent>) -> Result<()> {
        let slot = &mut self.slots[i];
        let Some(a) = slot.seq.as_mut() else {
            return Ok(());
        };
        started(a, events);
        let event = match a.stream.stop_before_sampling() {
            Some(end) => end,
            None => {
                let forced = a.stream.next_forced();
                let (ws, sampler) = (&self.ws, &mut a.stream.sampler);
                let id = match forced {
                    Some(f) => slot.core.batch_force(ws, sampler, f)?,
                    None => slot.core.batch_sample(ws, sampler)?,
                };
                match id {
                    Some(id) => a.stream.on_token(&self.engine, id, forced.is_some())?,
                    None => a.stream.end(None, String::new(), FinishReason::ContextFull),
                }
            }
        };
        push_token(slot, event, events);
        Ok(())
    }

    /// After the pass verified slot `i`'s drafts: accepts a prefix of them and pushes the
    /// events of the run (the accepted drafts and the token after them) until the sequence
    /// ends, leaving the slot's state at the emitted tokens (a lone generation's rollback).
    fn emit_run(&mut self, i: usize, events: &mut Vec<BatchEvent>) -> Result<()> {
        let slot = &mut self.slots[i];
        let x_n = slot.rows[0];
        let Some(a) = slot.seq.as_mut() else {
            return Ok(());
        };
        let first =
            slot.core
                .batch_spec_finish(&mut self.ws, &mut a.stream.sampler, x_n, &mut slot.run)?;
        let mut next = Some(first);
        while let Some(id) = next {
            let Some(a) = slot.seq.as_mut() else {
                break;
            };
            let event = match a.stream.stop_before_sampling() {
                Some(end) => end,
                None => a.stream.on_token(&self.engine, id, false)?,
            };
            if !push_token(slot, event, events) {
                break;
            }
            next = slot.core.batch_run_next(&mut slot.run);
        }
        slot.core.batch_settle()
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
        // The slots whose MTP draft wants a row.
        let mut drafting = Vec::new();
        for (i, slot) in self.slots.iter_mut().enumerate() {
            slot.rows.clear();
            slot.wants_logits = false;
            let Some(a) = slot.seq.as_mut() else {
                continue;
            };
            match &a.phase {
                Phase::Decode => {
                    let Some(p) = slot.core.batch_take_pending() else {
                        continue;
                    };
                    if slot.core.batch_can_speculate() && !a.stream.forces_next() {
                        // A speculative step, as a lone generation's: draft now, verify
                        // `[x_n, drafts]` in the pass.
                        // The MTP rows of all drafting slots run together (`draft_rounds`).
                        let budget = a.stream.draft_budget();
                        let sampler = &mut a.stream.sampler;
                        match slot.core.batch_spec_draft_start(sampler, p, budget)? {
                            DraftNeed::MtpRow => drafting.push(i),
                            DraftNeed::Staged(_) => slot.core.batch_spec_rows(&mut slot.rows),
                        }
                        slot.verify = true;
                    } else {
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
        self.draft_rounds(drafting)?;
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
            // With the MTP cache following the prompt (hidden states of every row), the last
            // prompt token runs alone, with the logits (a lone session's two passes): the
            // prompt finishes with the chunk before it.
            let end = if slot.core.batch_tracks_hidden() && left > 1 {
                left - 1
            } else {
                left
            };
            let mut n = budget.min(end).min(to_mark);
            if n == end {
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

    /// Drafts for the slots in `drafting` (their MTP drafts started): one batched MTP pass
    /// per draft round over the rows of every slot still drafting, so the MTP block and the
    /// LM head are read once per round rather than once per sequence; each slot then draws
    /// its draft and asks for its next row or stages its verification rows.
    fn draft_rounds(&mut self, mut drafting: Vec<usize>) -> Result<()> {
        let keep = self.keeps_logits();
        while !drafting.is_empty() {
            let mut seqs: Vec<MtpSeq<'_, B>> = Vec::with_capacity(drafting.len());
            for (i, slot) in self.slots.iter_mut().enumerate() {
                if drafting.contains(&i) {
                    let (state, r) = slot.core.batch_mtp_parts()?;
                    seqs.push(MtpSeq {
                        state,
                        tokens: r.token,
                        hidden: r.hidden,
                        rope_pos0: r.rope_pos,
                        out: r.out,
                    });
                }
            }
            // The draft rows' logits stay on the backend (each slot reads its own).
            if keep {
                self.ws.keep_next_logits();
            }
            self.model.mtp_forward_batch(&mut self.ws, &mut seqs)?;
            // The pass's sequences are the drafting slots in slot order.
            let mut order = drafting.clone();
            order.sort_unstable();
            let mut still = Vec::with_capacity(drafting.len());
            for &i in &drafting {
                let slot = &mut self.slots[i];
                let Some(a) = slot.seq.as_mut() else {
                    continue;
                };
                let kept = if keep {
                    order.iter().position(|&j| j == i)
                } else {
                    None
                };
                let sampler = &mut a.stream.sampler;
                match slot
                    .core
                    .batch_spec_draft_advance(&self.ws, kept, sampler)?
                {
                    DraftNeed::MtpRow => still.push(i),
                    DraftNeed::Staged(_) => slot.core.batch_spec_rows(&mut slot.rows),
                }
            }
            drafting = still;
        }
        Ok(())
    }

    /// The forward pass over the planned rows. On an error the sequences in it end and their
    /// slots start afresh (the pass may have updated some states and not others).
    fn run_pass(&mut self) -> Result<()> {
        let r = self.pass();
        if let Err(e) = r {
            for s in &mut self.slots {
                if !s.rows.is_empty() {
                    s.seq = None;
                    s.rows.clear();
                    s.verify = false;
                    s.core.batch_reset()?;
                }
            }
            return Err(e.into());
        }
        Ok(())
    }

    /// [`run_pass`](Self::run_pass)'s pass: each slot's rows with the outputs it needs (a
    /// verification's every-row logits, hidden states and state trace from its decoder; the
    /// hidden states of every row where the decoder's MTP cache follows them; else the
    /// logits of the last row when wanted).
    fn pass(&mut self) -> std::result::Result<(), ModelError> {
        let (v, d) = (self.model.config.vocab, self.model.config.hidden);
        let keep = self.keeps_logits();
        let mut seqs: Vec<BatchSeq<'_, B>> = Vec::new();
        for s in &mut self.slots {
            if s.rows.is_empty() {
                continue;
            }
            let Slot {
                core,
                rows,
                wants_logits,
                verify,
                ..
            } = s;
            let (state, logits, spec) = core.batch_parts();
            let logits = wants_logits.then_some(logits);
            seqs.push(match spec {
                Some(sp) if *verify => {
                    let (tokens, out, trace) = sp.verify_parts(v, d);
                    BatchSeq {
                        state,
                        tokens,
                        out,
                        trace,
                    }
                }
                Some(sp) => BatchSeq {
                    state,
                    tokens: rows,
                    out: sp.feed_outputs(d, rows.len(), logits)?,
                    trace: None,
                },
                None => BatchSeq {
                    state,
                    tokens: rows,
                    out: logits.map(Outputs::last_logits).unwrap_or_default(),
                    trace: None,
                },
            });
        }
        self.last = StepInfo {
            sequences: seqs.len(),
            rows: seqs.iter().map(|s| s.tokens.len()).sum(),
        };
        if seqs.is_empty() {
            return Ok(());
        }
        if keep {
            // Each slot that wants logits reads its own rows after the pass (`step`).
            self.ws.keep_next_logits();
        }
        self.model.forward_batch(&mut self.ws, &mut seqs)
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
        s.core.batch_reset_spec_stats();
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
                        spec: s.core.batch_spec_stats(),
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
        let keep = self.keeps_logits();
        // The slots with rows are the pass's sequences, in order.
        let mut seq = 0;
        for i in 0..self.slots.len() {
            let s = &mut self.slots[i];
            if s.rows.is_empty() {
                continue;
            }
            seq += 1;
            if keep && s.verify {
                s.core.batch_logits_kept(seq - 1, true);
            }
            if s.verify {
                s.verify = false;
                self.emit_run(i, &mut events)?;
                continue;
            }
            s.core.batch_fed(&mut self.ws, &s.rows, s.wants_logits)?;
            if keep && s.wants_logits {
                s.core.batch_logits_kept(seq - 1, false);
            }
            let Some(a) = s.seq.as_mut() else {
                continue;
            };
            if !s.wants_logits {
                continue;
            }
            if matches!(a.phase, Phase::Prefill { .. }) {
                // The prompt's last chunk: its checkpoint (with the logits), then sample.
                s.core.batch_fetch_kept(&self.ws)?;
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

/// Pushes [`BatchEvent::Started`] before a sequence's first token.
fn started(a: &mut Active, events: &mut Vec<BatchEvent>) {
    if !a.started {
        a.started = true;
        events.push(BatchEvent::Started {
            id: a.id,
            processed: a.stream.timings.prompt_tokens,
            reused: a.stream.timings.prompt_reused,
        });
    }
}

/// Pushes the token event of the sequence in `slot` (emitted already: its stream took it),
/// which leaves the slot on its last. Whether it goes on.
fn push_token<B: Backend>(
    slot: &mut Slot<B>,
    event: TokenEvent,
    events: &mut Vec<BatchEvent>,
) -> bool {
    let Some(a) = slot.seq.as_mut() else {
        return false;
    };
    started(a, events);
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
        spec: slot.core.batch_spec_stats(),
    });
    if done {
        slot.seq = None;
    }
    !done
}
