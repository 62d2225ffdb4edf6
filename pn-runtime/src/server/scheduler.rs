//! Slots, the waiting queue and the engine thread.
//!
//! The `--parallel N` slots are the slots of one [`Batch`]: a single engine thread owns it and
//! steps it, so every request generating decodes its next token in the same forward pass
//! (one pass over the weights for all of them), and a new request's prompt is processed in
//! chunks interleaved with the others' decode steps. Requests join and leave between steps;
//! the async HTTP side only waits on channels. A request waits in a bounded FIFO queue for a
//! free slot; among free slots it takes the one whose cached tokens (live state or prompt-cache
//! checkpoint) share the longest prefix with its prompt, so a continuing conversation does not
//! re-process its history. With `--spec mtp` each sequence's decode step is a speculative one
//! inside the batch (its MTP drafts verified in the shared pass, its own accepted prefix and
//! rollback); `/metrics` sums the counters (`pn_spec_*`).

use super::error::ApiError;
use super::metrics::{Gauges, Metrics};
use crate::engine::batch::{Batch, BatchEvent, BatchOptions, SeqId, SeqOptions};
use crate::engine::{
    CancelToken, Engine, EngineError, FinishReason, Prompt, StopConditions, Timings,
};
use crate::sampling::SamplingParams;
use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex};
use tokio::sync::mpsc::UnboundedSender;

/// What the engine thread reports back about a request.
#[derive(Debug)]
pub enum Event {
    /// The prompt was processed (`processed` tokens run, the rest reused from the cache).
    Started {
        /// Prompt tokens run through the model.
        processed: usize,
    },
    /// Generated text (never empty).
    Text(String),
    /// A generated token's log probability (when the job asks for them), sent before the
    /// text it adds to (which may come with a later token's `Text`).
    Logprob(super::logprobs::TokenInfo),
    /// The generation ended.
    Done {
        /// Why.
        finish: FinishReason,
        /// Counts and times.
        timings: Timings,
    },
    /// The request failed.
    Failed(ApiError),
}

/// A generation request for a slot.
#[derive(Debug)]
pub struct Job {
    /// The whole token sequence (the slot reuses what it can of it).
    pub prompt: Vec<u32>,
    /// Sampler settings.
    pub params: SamplingParams,
    /// Stop conditions (their cancel token is `cancel`).
    pub stop: StopConditions,
    /// Cancels the generation (client gone, shutdown).
    pub cancel: CancelToken,
    /// Log probabilities with this many alternatives per token.
    pub logprobs: Option<usize>,
    /// The thinking block to follow (reasoning count, budget).
    pub thinking: Option<crate::engine::ThinkingControl>,
    /// Where events go.
    pub events: UnboundedSender<Event>,
}

/// How many slots, how long a queue, and the optional hook called before each request joins
/// the batch (see [`SlotHook`](super::SlotHook)).
#[derive(Clone, Default)]
pub struct SlotConfig {
    /// Slots (at least one is made): the batch width.
    pub n_slots: usize,
    /// Requests that may wait for a slot.
    pub max_queue: usize,
    /// Called with each request's prompt on the engine thread, inside a panic guard.
    pub before_generate: Option<super::SlotHook>,
}

#[derive(Default)]
struct Inner {
    queue: VecDeque<Job>,
    /// The cancel token of the request each slot runs, `None` when free.
    running: Vec<Option<CancelToken>>,
    shutting_down: bool,
}

/// The batch's engine thread and the waiting queue.
pub struct Scheduler {
    inner: Mutex<Inner>,
    /// Wakes the engine thread when a request arrives.
    wake: Condvar,
    n_slots: usize,
    max_queue: usize,
    metrics: Arc<Metrics>,
    before_generate: Option<super::SlotHook>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("slots", &self.n_slots)
            .field("max_queue", &self.max_queue)
            .finish_non_exhaustive()
    }
}

/// A request in the batch.
struct Running {
    job: Job,
    slot: usize,
}

/// The engine thread's own state: the batch and the requests in it.
struct EngineLoop {
    batch: Batch,
    jobs: HashMap<SeqId, Running>,
    options: BatchOptions,
}

impl Scheduler {
    /// Creates the batch of `config.n_slots` slots and its engine thread. The prefill chunk
    /// (prompt rows per step) is the engine's batch size (`-b`).
    pub fn start(
        engine: &Engine,
        config: SlotConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Arc<Scheduler>, EngineError> {
        let SlotConfig {
            n_slots,
            max_queue,
            before_generate,
        } = config;
        let n_slots = n_slots.max(1);
        let options = BatchOptions {
            slots: n_slots,
            prefill_chunk: engine.options().batch.max(1),
        };
        let batch = Batch::new(engine, options)?;
        let sched = Arc::new(Scheduler {
            inner: Mutex::new(Inner {
                running: vec![None; n_slots],
                ..Inner::default()
            }),
            wake: Condvar::new(),
            n_slots,
            max_queue,
            metrics,
            before_generate,
        });
        let s = Arc::clone(&sched);
        let mut lp = EngineLoop {
            batch,
            jobs: HashMap::new(),
            options,
        };
        std::thread::Builder::new()
            .name("pn-engine".into())
            .spawn(move || s.engine_loop(&mut lp))
            .map_err(|e| {
                EngineError::Model(qwen_model::ModelError::BadArgument(format!(
                    "cannot start the engine thread: {e}"
                )))
            })?;
        Ok(sched)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a request: an error when the server is shutting down or every slot is busy and
    /// the queue is full (429 with a Retry-After).
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        let mut inner = self.lock();
        if inner.shutting_down {
            return Err(ApiError::shutting_down());
        }
        let free = inner.running.iter().filter(|r| r.is_none()).count();
        if inner.queue.len() >= free + self.max_queue {
            let waiting = inner.queue.len();
            // Roughly one slot's turn per queued request per slot, at least a second.
            let retry = (1 + waiting / self.n_slots).min(60) as u64;
            return Err(ApiError::overloaded(waiting, retry));
        }
        inner.queue.push_back(job);
        self.wake.notify_one();
        Ok(())
    }

    /// The engine thread: admits queued requests into free slots, steps the batch while any
    /// request runs, and routes each step's events to their requests.
    fn engine_loop(&self, lp: &mut EngineLoop) {
        loop {
            let jobs = {
                let mut inner = self.lock();
                while lp.jobs.is_empty() && inner.queue.is_empty() {
                    inner = self.wake.wait(inner).unwrap_or_else(|e| e.into_inner());
                }
                let free = lp.batch.free_slots().len();
                let n = free.min(inner.queue.len());
                inner.queue.drain(..n).collect::<Vec<_>>()
            };
            for job in jobs {
                self.admit(lp, job);
            }
            if lp.jobs.is_empty() {
                continue;
            }
            // A request whose client left (or that shutdown cancelled) leaves before the step.
            let gone: Vec<SeqId> = lp
                .jobs
                .iter()
                .filter(|(_, r)| r.job.cancel.is_cancelled())
                .map(|(&id, _)| id)
                .collect();
            for id in gone {
                let timings = lp.batch.cancel(id).unwrap_or_default();
                self.finish(lp, id, FinishReason::Cancelled, timings);
            }
            if lp.jobs.is_empty() {
                continue;
            }
            match catch_unwind(AssertUnwindSafe(|| lp.batch.step())) {
                Ok(Ok(events)) => {
                    let info = lp.batch.last_step();
                    if info.sequences > 0 {
                        self.metrics.record_step(info.sequences, info.rows);
                    }
                    for e in events {
                        self.route(lp, e);
                    }
                }
                Ok(Err(e)) => self.fail_all(lp, engine_error(e)),
                Err(_) => {
                    // The batch may be half-updated: every request in it fails and the slots
                    // start afresh.
                    self.metrics.record_panic();
                    self.fail_all(
                        lp,
                        ApiError::internal(
                            "internal error while generating (the request was aborted; the server goes on)",
                        ),
                    );
                    let engine = lp.batch.engine().clone();
                    match Batch::new(&engine, lp.options) {
                        Ok(b) => lp.batch = b,
                        Err(e) => eprintln!("pn serve: cannot rebuild the batch: {e}"),
                    }
                }
            }
        }
    }

    /// Puts `job` into the free slot that can reuse the most of its prompt (the least recently
    /// used among equals, [`Batch::add`]), after the hook, inside a panic guard.
    fn admit(&self, lp: &mut EngineLoop, job: Job) {
        if job.cancel.is_cancelled() {
            // The client left while waiting.
            self.metrics.record_cancelled();
            return;
        }
        let added = catch_unwind(AssertUnwindSafe(|| {
            if let Some(hook) = &self.before_generate {
                hook(&job.prompt);
            }
            let mut stop = job.stop.clone();
            stop.cancel = Some(job.cancel.clone());
            // The free slot that can reuse the most of the prompt (least recently used
            // among equals).
            let options = SeqOptions {
                logprobs: job.logprobs,
                thinking: job.thinking.clone(),
            };
            lp.batch.add_with(
                Prompt::Tokens(job.prompt.clone()),
                job.params.clone(),
                stop,
                options,
            )
        }));
        let id = match added {
            Ok(Ok(id)) => id,
            Ok(Err(e)) => {
                let _ = job.events.send(Event::Failed(engine_error(e)));
                return;
            }
            Err(_) => {
                self.metrics.record_panic();
                let _ = job.events.send(Event::Failed(ApiError::internal(
                    "internal error while generating (the request was aborted; the server goes on)",
                )));
                return;
            }
        };
        let Some(slot) = lp.batch.slot_of(id) else {
            return;
        };
        self.lock().running[slot] = Some(job.cancel.clone());
        lp.jobs.insert(id, Running { job, slot });
    }

    /// Sends one batch event to its request.
    fn route(&self, lp: &mut EngineLoop, event: BatchEvent) {
        match event {
            BatchEvent::Started { id, processed, .. } => {
                if let Some(r) = lp.jobs.get(&id) {
                    let _ = r.job.events.send(Event::Started { processed });
                }
            }
            BatchEvent::Token {
                id,
                event,
                timings,
                logprob,
                spec,
            } => {
                let Some(r) = lp.jobs.get(&id) else {
                    return;
                };
                if event.token.is_some() {
                    self.metrics.record_token();
                }
                if let Some(l) = logprob {
                    let info = super::logprobs::TokenInfo::new(lp.batch.engine().tokenizer(), &l);
                    let _ = r.job.events.send(Event::Logprob(info));
                }
                if !event.text.is_empty() && r.job.events.send(Event::Text(event.text)).is_err() {
                    // Nobody is listening any more: stop before the next token.
                    r.job.cancel.cancel();
                }
                if let Some(f) = event.finish {
                    if let Some(st) = spec {
                        self.metrics.record_spec(&st);
                    }
                    self.finish(lp, id, f, timings);
                }
            }
        }
    }

    /// Ends request `id`: its metrics, its slot marked free, then its last event. The slot is
    /// marked free before the client hears the end: a client's next request then finds this
    /// slot (and the conversation it holds) free.
    fn finish(&self, lp: &mut EngineLoop, id: SeqId, finish: FinishReason, timings: Timings) {
        let Some(r) = lp.jobs.remove(&id) else {
            return;
        };
        self.metrics.record_generation(
            timings.prompt_tokens,
            r.job.prompt.len().saturating_sub(timings.prompt_tokens),
            timings.prompt_time,
            timings.generation_time,
        );
        if finish == FinishReason::Cancelled {
            self.metrics.record_cancelled();
        }
        self.lock().running[r.slot] = None;
        let _ = r.job.events.send(Event::Done { finish, timings });
    }

    /// Fails every request in the batch with `error`.
    fn fail_all(&self, lp: &mut EngineLoop, error: ApiError) {
        for (_, r) in lp.jobs.drain() {
            self.lock().running[r.slot] = None;
            let _ = r.job.events.send(Event::Failed(error.clone()));
        }
    }

    /// Stops taking requests, drops queued ones (they get a 503), and returns the number of
    /// requests still generating.
    pub fn begin_shutdown(&self) -> usize {
        let mut inner = self.lock();
        inner.shutting_down = true;
        for job in inner.queue.drain(..) {
            let _ = job.events.send(Event::Failed(ApiError::shutting_down()));
        }
        inner.running.iter().filter(|r| r.is_some()).count()
    }

    /// Cancels every running generation.
    pub fn cancel_all(&self) {
        let inner = self.lock();
        for c in inner.running.iter().flatten() {
            c.cancel();
        }
        self.wake.notify_one();
    }

    /// Requests generating now.
    pub fn busy(&self) -> usize {
        self.lock().running.iter().filter(|r| r.is_some()).count()
    }

    /// Queue depth and slot use.
    pub fn gauges(&self) -> Gauges {
        let inner = self.lock();
        Gauges {
            queue_depth: inner.queue.len(),
            busy_slots: inner.running.iter().filter(|r| r.is_some()).count(),
            slots: self.n_slots,
        }
    }
}

fn engine_error(e: EngineError) -> ApiError {
    match e {
        EngineError::PromptTooLong { .. } | EngineError::EmptyPrompt => {
            ApiError::invalid(e.to_string())
        }
        other => ApiError::internal(format!("generation failed: {other}")),
    }
}
