//! Slots and the waiting queue.
//!
//! Each of the `--parallel N` slots is one OS thread owning one [`Session`]: the model runs on
//! the CPU backend's own thread pool, so blocking threads are the natural unit, and the async
//! HTTP side only waits on channels. Sessions on different threads interleave their forward
//! passes fairly on the shared backend. A request waits in a bounded FIFO queue for a free
//! slot; among free slots it takes the one whose cached tokens share the longest prefix with
//! its prompt, so a continuing conversation does not re-process its history.

use super::error::ApiError;
use super::metrics::{Gauges, Metrics};
use crate::engine::{
    CancelToken, Engine, EngineError, FinishReason, Prompt, Session, StopConditions, Timings,
};
use crate::sampling::SamplingParams;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{mpsc, Arc, Mutex};
use tokio::sync::mpsc::UnboundedSender;

/// What a slot reports back about a request.
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

/// How many slots, how long a queue, and the optional hook every slot calls before it
/// generates (see [`SlotHook`](super::SlotHook)).
#[derive(Clone, Default)]
pub struct SlotConfig {
    /// Slots (at least one is made).
    pub n_slots: usize,
    /// Requests that may wait for a slot.
    pub max_queue: usize,
    /// Called with each request's prompt inside the slot's panic guard.
    pub before_generate: Option<super::SlotHook>,
}

struct Slot {
    session: Mutex<Session>,
    jobs: mpsc::Sender<Job>,
}

#[derive(Default)]
struct Inner {
    queue: VecDeque<Job>,
    /// The cancel token of the request each slot runs, `None` when free.
    running: Vec<Option<CancelToken>>,
    /// When each slot last got a request (a dispatch counter), for least-recently-used ties.
    last_used: Vec<u64>,
    dispatched: u64,
    shutting_down: bool,
}

/// The slots, their worker threads and the waiting queue.
pub struct Scheduler {
    inner: Mutex<Inner>,
    slots: Vec<Slot>,
    max_queue: usize,
    metrics: Arc<Metrics>,
    before_generate: Option<super::SlotHook>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("slots", &self.slots.len())
            .field("max_queue", &self.max_queue)
            .finish_non_exhaustive()
    }
}

impl Scheduler {
    /// Creates `config.n_slots` sessions and their worker threads.
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
        let mut slots = Vec::with_capacity(n_slots);
        let mut receivers = Vec::with_capacity(n_slots);
        for _ in 0..n_slots {
            let (tx, rx) = mpsc::channel();
            slots.push(Slot {
                session: Mutex::new(engine.session()?),
                jobs: tx,
            });
            receivers.push(rx);
        }
        let sched = Arc::new(Scheduler {
            inner: Mutex::new(Inner {
                running: vec![None; n_slots],
                last_used: vec![0; n_slots],
                ..Inner::default()
            }),
            slots,
            max_queue,
            metrics,
            before_generate,
        });
        for (i, rx) in receivers.into_iter().enumerate() {
            let s = Arc::clone(&sched);
            std::thread::Builder::new()
                .name(format!("pn-slot-{i}"))
                .spawn(move || s.worker(i, rx))
                .map_err(|e| {
                    EngineError::Model(qwen_model::ModelError::BadArgument(format!(
                        "cannot start slot thread: {e}"
                    )))
                })?;
        }
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
        let free = inner.running.iter().any(Option::is_none);
        if !free && inner.queue.len() >= self.max_queue {
            let waiting = inner.queue.len();
            // Roughly one slot's turn per queued request per slot, at least a second.
            let retry = (1 + waiting / self.slots.len()).min(60) as u64;
            return Err(ApiError::overloaded(waiting, retry));
        }
        inner.queue.push_back(job);
        self.dispatch(&mut inner);
        Ok(())
    }

    /// Hands queued requests to free slots (FIFO; each takes the free slot that can reuse
    /// the most of its prompt).
    fn dispatch(&self, inner: &mut Inner) {
        loop {
            let free: Vec<usize> = (0..self.slots.len())
                .filter(|&i| inner.running[i].is_none())
                .collect();
            if free.is_empty() {
                return;
            }
            let Some(job) = inner.queue.pop_front() else {
                return;
            };
            if job.cancel.is_cancelled() {
                // The client left while waiting.
                self.metrics.record_cancelled();
                continue;
            }
            // A free slot's session lock is released before the slot is marked free, so
            // this never waits on a generation (and never deadlocks with a worker). Among
            // slots that reuse equally much, the least recently used one is taken, so a
            // conversation kept in another slot survives unrelated requests.
            let best = free
                .iter()
                .copied()
                .max_by_key(|&i| {
                    let s = self.slots[i]
                        .session
                        .lock()
                        .unwrap_or_else(|e| e.into_inner());
                    (
                        s.reusable_prefix(&job.prompt),
                        u64::MAX - inner.last_used[i],
                        usize::MAX - i,
                    )
                })
                .unwrap_or(free[0]);
            inner.dispatched += 1;
            inner.last_used[best] = inner.dispatched;
            inner.running[best] = Some(job.cancel.clone());
            if let Err(mpsc::SendError(job)) = self.slots[best].jobs.send(job) {
                // The worker is gone (cannot happen while the scheduler lives).
                inner.running[best] = None;
                let _ = job
                    .events
                    .send(Event::Failed(ApiError::internal("slot worker stopped")));
            }
        }
    }

    fn worker(&self, index: usize, jobs: mpsc::Receiver<Job>) {
        while let Ok(job) = jobs.recv() {
            let events = job.events.clone();
            let last = self.run_job(index, job);
            // The slot is marked free before the client hears the end: a client's next
            // request then finds this slot (and the conversation it holds) free, instead of
            // racing the worker and landing in another slot.
            {
                let mut inner = self.lock();
                inner.running[index] = None;
                self.dispatch(&mut inner);
            }
            if let Some(last) = last {
                let _ = events.send(last);
            }
        }
    }

    /// Runs `job` on slot `index`; returns its last event, to send once the slot is free.
    fn run_job(&self, index: usize, job: Job) -> Option<Event> {
        if job.cancel.is_cancelled() {
            self.metrics.record_cancelled();
            return None;
        }
        let mut session = self.slots[index]
            .session
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            if let Some(hook) = &self.before_generate {
                hook(&job.prompt);
            }
            generate(&mut session, &job, &self.metrics)
        }));
        match outcome {
            Ok(Ok(done)) => Some(done),
            Ok(Err(e)) => Some(Event::Failed(e)),
            Err(_) => {
                // The session may be half-updated: start the slot afresh. A failed reset leaves
                // no tokens behind, so the slot's next sequence resets again and reports it.
                let _ = session.reset();
                self.metrics.record_panic();
                Some(Event::Failed(ApiError::internal(
                    "internal error while generating (the request was aborted; the server goes on)",
                )))
            }
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
            slots: self.slots.len(),
        }
    }
}

/// Runs one request on a session, sending its events but the last, which it returns.
fn generate(session: &mut Session, job: &Job, metrics: &Metrics) -> Result<Event, ApiError> {
    let engine = session.engine().clone();
    let mut generation = session
        .generate_sequence(
            Prompt::Tokens(job.prompt.clone()),
            job.params.clone(),
            job.stop.clone(),
        )
        .map_err(engine_error)?;
    if let Some(n) = job.logprobs {
        generation = generation.with_logprobs(n);
    }
    if let Some(t) = &job.thinking {
        generation = generation.with_thinking(t.clone());
    }
    let processed = generation.timings().prompt_tokens;
    let _ = job.events.send(Event::Started { processed });
    let mut finish = FinishReason::Cancelled;
    while let Some(event) = generation.next() {
        let event = event.map_err(engine_error)?;
        if event.token.is_some() {
            metrics.record_token();
        }
        if let Some(lp) = generation.take_logprob() {
            let info = super::logprobs::TokenInfo::new(engine.tokenizer(), &lp);
            let _ = job.events.send(Event::Logprob(info));
        }
        if !event.text.is_empty() && job.events.send(Event::Text(event.text)).is_err() {
            // Nobody is listening any more: stop before the next token.
            job.cancel.cancel();
        }
        if let Some(f) = event.finish {
            finish = f;
        }
    }
    let timings = generation.timings();
    metrics.record_generation(
        timings.prompt_tokens,
        job.prompt.len().saturating_sub(timings.prompt_tokens),
        timings.prompt_time,
        timings.generation_time,
    );
    if finish == FinishReason::Cancelled {
        metrics.record_cancelled();
    }
    Ok(Event::Done { finish, timings })
}

fn engine_error(e: EngineError) -> ApiError {
    match e {
        EngineError::PromptTooLong { .. } | EngineError::EmptyPrompt => {
            ApiError::invalid(e.to_string())
        }
        other => ApiError::internal(format!("generation failed: {other}")),
    }
}
