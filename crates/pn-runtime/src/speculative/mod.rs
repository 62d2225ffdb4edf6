//! Greedy speculative decoding with the model's MTP head as the drafter.
//!
//! One step, with the trunk having processed `x_0..x_{n-1}` and the next token `x_n` known:
//! 1. Draft: the MTP block runs the row `(x_n, h_{n-1})` at position `n`, then chains its own
//!    hidden state for up to `n_draft` tokens `d_1..d_N`.
//! 2. Verify: snapshot the GDN state, run the trunk over `[x_n, d_1..d_N]` in one batched pass
//!    (all rows' logits and hidden states).
//! 3. Accept by exact match with the target's argmax; the first mismatch gives the bonus token.
//! 4. Roll back when some draft was rejected: restore the snapshot and replay the accepted
//!    tokens `[x_n, d_1..d_a]` (recompute; KV rows past them are simply overwritten later).
//! 5. Keep the MTP cache in step: drop the draft rows, then (merged with the next step's first
//!    draft row) feed `(d_i, h_{n+i-1})` with the target's hidden states of the accepted rows.
//!
//! The MTP rows follow the vLLM/transformers convention (architecture reference section 6): the
//! row for `x_{p+1}` pairs with the trunk's post-norm `h_p` at position `p + 1`, and the first
//! token has no row, so the MTP cache holds `pos - 1` rows between steps.

mod decode;
mod stats;

pub use decode::{greedy_generate, plain_greedy, Drafter, SpecError};
pub use stats::SpecStats;
