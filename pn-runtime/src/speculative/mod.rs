//! Speculative decoding with the model's MTP head as the drafter.
//!
//! One step, with the trunk having processed `x_0..x_{n-1}` and the next token `x_n` known:
//! 1. Draft: the MTP block runs the row `(x_n, h_{n-1})` at position `n`, then chains its own
//!    hidden state for up to `n_draft` tokens `d_1..d_N`.
//! 2. Verify: run the trunk over `[x_n, d_1..d_N]` in one batched pass (all rows' logits and
//!    hidden states), recording the GDN state after every row (the per-row state trace,
//!    `qwen_model::StateTrace`).
//! 3. Accept by the speculative-sampling rule ([`accept`]; under greedy sampling, an exact
//!    match with the target's argmax); the first rejection gives the replacement token, else
//!    the last row gives the bonus token.
//! 4. Roll back when some draft was rejected: copy the GDN state the trace recorded after the
//!    accepted tokens `[x_n, d_1..d_a]` back into the state. Nothing is recomputed (no replay
//!    pass); the KV rows past the accepted ones are simply overwritten later. A generation
//!    that stops inside an accepted run rolls back the same way
//!    ([`SpecDecoder::rollback_to`]).
//! 5. Keep the MTP cache in step: drop the chained draft rows, then feed `(d_i, h_{n+i-1})`
//!    with the target's hidden states of the accepted rows.
//!
//! The MTP rows follow the vLLM/transformers convention (architecture reference section 6): the
//! row for `x_{p+1}` pairs with the trunk's post-norm `h_p` at position `p + 1`, and the first
//! token has no row, so the MTP cache holds `pos - 1` rows between steps.
//!
//! The decoder ([`SpecDecoder`], used by a session's generation) works for sampling too:
//! drafts are drawn from the MTP head's distribution `q` after the sampler's transforms, and
//! accepted by the standard speculative-sampling rule ([`accept`]), so the output has exactly
//! the target's distribution (greedy sampling gives exactly plain greedy decoding's tokens).

pub mod accept;
mod backoff;
mod session_decoder;
mod stats;

pub use accept::AcceptRule;
pub use backoff::MIN_ACCEPTANCE;
pub use session_decoder::{DraftNeed, MtpRow, SpecControl, SpecDecoder, StepInput};
pub use stats::SpecStats;

use std::fmt;
use std::str::FromStr;

/// A source of draft tokens other than the MTP head (tests force acceptance or rejection).
pub trait Drafter {
    /// Up to `n` tokens proposed to follow `sequence` (prompt and every token generated so far,
    /// including the next token the target already chose).
    fn draft(&mut self, sequence: &[u32], n: usize) -> Vec<u32>;
}

/// Draft tokens per step when speculation is on and none is given. Each draft costs one MTP
/// step and one more verification row; 2 balances that against the acceptance of a trained
/// MTP head (the chance that the k-th draft survives falls off geometrically).
pub const DEFAULT_DRAFT: usize = 2;

/// Whether and how generation drafts tokens ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Speculation {
    /// Plain decoding: one trunk pass per token.
    None,
    /// Draft up to `draft` tokens per step with the model's MTP head (plain decoding when the
    /// model has no MTP block).
    Mtp {
        /// Most draft tokens per step.
        draft: usize,
    },
}

impl Default for Speculation {
    fn default() -> Self {
        Speculation::Mtp {
            draft: DEFAULT_DRAFT,
        }
    }
}

/// An unknown `--spec` value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown speculation mode `{0}` (expected mtp or none)")]
pub struct UnknownSpeculation(pub String);

impl FromStr for Speculation {
    type Err = UnknownSpeculation;

    /// `mtp` (with [`DEFAULT_DRAFT`] drafts) or `none`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "mtp" => Ok(Speculation::default()),
            "none" | "off" => Ok(Speculation::None),
            _ => Err(UnknownSpeculation(s.to_string())),
        }
    }
}

impl fmt::Display for Speculation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Speculation::None => write!(f, "none"),
            Speculation::Mtp { draft } => write!(f, "mtp (draft {draft})"),
        }
    }
}
