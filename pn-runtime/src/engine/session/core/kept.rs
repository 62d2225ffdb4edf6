//! Decoding from logits kept on the backend (`qwen_model::Workspace::keep_next_logits`): on a
//! backend where a row download is expensive (CUDA: about 1 MB per token at the 27B
//! vocabulary, a synchronous copy), a decode step's pass keeps its logits, the sampler's best
//! candidates come back (`Backend::top_k`: one id for greedy decoding) and the whole row is
//! downloaded only where a sampling stage reads it ([`Sampler::candidates_needed`] says
//! `None`: log probabilities, a grammar, penalties, top-k off or over
//! [`DEVICE_TOP_K_MAX`], top-p off). The tokens are the same either way.
//!
//! Which passes keep: a lone session's decode step (one row), a speculative step's MTP draft
//! rows and its verification (`SpecDecoder`: drafts drawn and judged from candidates), and
//! every pass and draft round of a batch (each slot that wants logits reads its own row:
//! candidates, or the row when its sampler needs it, its prompt-end checkpoint included). The
//! last row of a prompt is downloaded as before (the prompt cache stores it), as are `feed` /
//! `feed_all_logits`.

use crate::sampling::Sampler;
use qwen_model::topk::DEVICE_TOP_K_MAX;
use qwen_model::{Backend, Model, ModelError, Workspace};
use std::sync::atomic::{AtomicU64, Ordering};

/// Logits rows read as candidates instead of whole, process-wide.
static CANDIDATE_ROWS: AtomicU64 = AtomicU64::new(0);

/// Logits rows decoding has read as the sampler's best candidates (`Backend::top_k`) instead
/// of downloading them, since the process started (all sessions and batches; a diagnostic:
/// on CUDA each is about 1 MB not copied at the 27B vocabulary).
pub fn candidate_rows() -> u64 {
    CANDIDATE_ROWS.load(Ordering::Relaxed)
}

/// Counts one row read as candidates.
pub(crate) fn count_candidate_row() {
    CANDIDATE_ROWS.fetch_add(1, Ordering::Relaxed);
}

/// Where a session's logits after its last fed token are, when they were kept on the backend,
/// and the candidates read from them.
#[derive(Debug)]
pub(crate) struct KeptLogits {
    /// Whether decoding takes the candidates path (`LogitsPath::candidates`).
    pub(crate) on: bool,
    /// The sequence of the last pass (in its order: 0 alone) whose kept row holds the logits
    /// after the last fed token; `None`: they are in the host buffer (or not at hand).
    pub(crate) seq: Option<usize>,
    /// The best candidates of the last kept row read: `[<= DEVICE_TOP_K_MAX]`.
    cand: Vec<(u32, f32)>,
}

impl KeptLogits {
    /// Decoding from candidates when `on`.
    pub(crate) fn new(on: bool) -> KeptLogits {
        KeptLogits {
            on,
            seq: None,
            cand: Vec::with_capacity(DEVICE_TOP_K_MAX),
        }
    }

    /// Whether the next decode pass should keep its logits for `sampler`.
    pub(crate) fn wanted(&self, sampler: &Sampler) -> bool {
        self.on && sampler.candidates_needed(DEVICE_TOP_K_MAX).is_some()
    }

    /// Brings kept logits into the host row `logits` (`[vocab]`); nothing when none are kept.
    pub(crate) fn fetch<B: Backend>(
        &mut self,
        model: &Model<B>,
        ws: &Workspace<B>,
        logits: &mut [f32],
    ) -> Result<(), ModelError> {
        match self.seq.take() {
            Some(seq) => model.kept_logits(ws, (seq, 0), logits),
            None => Ok(()),
        }
    }

    /// The next token from the logits after the last fed token: from the best candidates of
    /// the kept row where the sampler takes them, else from the whole row (`logits`, fetched
    /// first when kept), as [`Sampler::sample`] with `history`.
    pub(crate) fn sample<B: Backend>(
        &mut self,
        model: &Model<B>,
        ws: &Workspace<B>,
        logits: &mut [f32],
        sampler: &mut Sampler,
        history: &[u32],
    ) -> Result<u32, ModelError> {
        if let Some(seq) = self.seq {
            if let Some(k) = sampler.candidates_needed(DEVICE_TOP_K_MAX) {
                self.seq = None;
                let v = model.config.vocab;
                model.kept_top_k(ws, (seq, 0), sampler.candidate_ids(v), k, &mut self.cand)?;
                count_candidate_row();
                return Ok(sampler.sample_candidates(&self.cand, v));
            }
        }
        self.fetch(model, ws, logits)?;
        Ok(sampler.sample(logits, history))
    }
}
