//! The MTP (multi-token prediction) block (reference: `qwen38-architecture.md` section 6): one
//! extra decoder block over `[enorm(embedding) ; hnorm(h)]`, with its own KV cache, drafting
//! the token after next.
//!
//! [`Model::mtp_forward`] runs it for one sequence; [`Model::mtp_forward_batch`] runs the draft
//! rows of several sequences (each with its own MTP cache and position) through one pass over
//! the block's weights and the LM head, as the trunk's batched pass does. Both go through
//! [`Model::mtp_pass`].

use super::batch::Seg;
use super::layers::{project, BlockRows, BlockSeg, Step};
use super::{Head, Model, Outputs, Workspace};
use crate::backend::Backend;
use crate::error::ModelError;
use crate::state::State;

/// One sequence's rows of a [`Model::mtp_forward_batch`] pass: `(tokens[i], hidden[i])`
/// appended to its MTP cache at RoPE positions `rope_pos0..`, and the outputs it wants.
pub struct MtpSeq<'a, B: Backend> {
    /// The sequence's state (its MTP cache is appended to).
    pub state: &'a mut State<B>,
    /// Input tokens (at least one).
    pub tokens: &'a [u32],
    /// The hidden state paired with each token, `[tokens.len(), hidden]`.
    pub hidden: &'a [f32],
    /// RoPE position of the first row.
    pub rope_pos0: usize,
    /// The outputs it wants (rows relative to its own `tokens`).
    pub out: Outputs<'a>,
}

/// A sequence's rows in one MTP pass: as [`MtpSeq`], plus where the pass sits in its call
/// (`done` rows of `n_tok` before it; a lone call longer than the workspace takes chunks).
struct MtpPart<'s, 'o, B: Backend> {
    state: &'s mut State<B>,
    tokens: &'s [u32],
    hidden: &'s [f32],
    rope_pos0: usize,
    out: &'s mut Outputs<'o>,
    done: usize,
    n_tok: usize,
}

impl<B: Backend> Model<B> {
    /// Runs the MTP block over rows `(tokens[i], hidden[i])`, appending them to the MTP KV cache
    /// (RoPE positions `rope_pos0..`), and writes its logits (and its own normed hidden state,
    /// the `h` of a chained draft step).
    ///
    /// Convention (vLLM / transformers): the row for token `x_{p+1}` takes the trunk's
    /// post-`output_norm` state `h_p` and sits at position `p + 1`; it predicts `x_{p+2}`.
    pub fn mtp_forward(
        &self,
        state: &mut State<B>,
        ws: &mut Workspace<B>,
        tokens: &[u32],
        hidden: &[f32],
        rope_pos0: usize,
        mut out: Outputs<'_>,
    ) -> Result<(), ModelError> {
        self.check_mtp_call(state, tokens, hidden, &out)?;
        let d = self.config.hidden;
        let mut done = 0;
        for chunk in tokens.chunks(ws.max_rows) {
            let rows = chunk.len();
            let mut part = [MtpPart {
                state: &mut *state,
                tokens: chunk,
                hidden: &hidden[done * d..(done + rows) * d],
                rope_pos0: rope_pos0 + done,
                out: &mut out,
                done,
                n_tok: tokens.len(),
            }];
            self.mtp_pass(ws, &mut part)?;
            done += rows;
        }
        Ok(())
    }

    /// Runs the MTP block for several sequences in one pass over its weights and the LM head:
    /// each [`MtpSeq`] gets what [`mtp_forward`](Self::mtp_forward) would give it alone, up to
    /// the rounding of the multi-row matrix kernels (as [`forward_batch`](Self::forward_batch)).
    /// The rows of all sequences together must fit the workspace (`ws.max_rows()`).
    pub fn mtp_forward_batch(
        &self,
        ws: &mut Workspace<B>,
        seqs: &mut [MtpSeq<'_, B>],
    ) -> Result<(), ModelError> {
        let rows: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        if seqs.is_empty() || rows > ws.max_rows {
            return Err(ModelError::BadArgument(format!(
                "batched MTP pass of {rows} rows ({} sequences), the workspace takes {}",
                seqs.len(),
                ws.max_rows
            )));
        }
        for s in seqs.iter() {
            self.check_mtp_call(s.state, s.tokens, s.hidden, &s.out)?;
        }
        let mut parts: Vec<MtpPart<'_, '_, B>> = seqs
            .iter_mut()
            .map(|s| MtpPart {
                state: &mut *s.state,
                tokens: s.tokens,
                hidden: s.hidden,
                rope_pos0: s.rope_pos0,
                out: &mut s.out,
                done: 0,
                n_tok: s.tokens.len(),
            })
            .collect();
        self.mtp_pass(ws, &mut parts)
    }

    /// The checks of one sequence's MTP call: the block exists, `hidden` pairs with `tokens`,
    /// the tokens and outputs fit, and the MTP cache has room.
    fn check_mtp_call(
        &self,
        state: &State<B>,
        tokens: &[u32],
        hidden: &[f32],
        out: &Outputs<'_>,
    ) -> Result<(), ModelError> {
        if self.weights.mtp.is_none() || state.mtp.is_none() {
            return Err(ModelError::NoMtp);
        }
        let d = self.config.hidden;
        if tokens.is_empty() || hidden.len() != tokens.len() * d {
            return Err(ModelError::BadArgument(format!(
                "MTP: {} tokens need {} hidden floats, got {}",
                tokens.len(),
                tokens.len() * d,
                hidden.len()
            )));
        }
        self.check_tokens(tokens)?;
        self.check_outputs(tokens.len(), out)?;
        let needed = state.mtp_len + tokens.len();
        if needed > state.capacity {
            return Err(ModelError::ContextFull {
                needed,
                capacity: state.capacity,
            });
        }
        Ok(())
    }

    /// One pass of the MTP block over the rows of `parts` side by side in the workspace
    /// (checked, at most `ws.max_rows` in all): embeddings and hidden states normed and joined,
    /// `eh_proj`, the block on each sequence's own MTP cache, then the outputs each asks for.
    fn mtp_pass(
        &self,
        ws: &mut Workspace<B>,
        parts: &mut [MtpPart<'_, '_, B>],
    ) -> Result<(), ModelError> {
        let mtp = self.weights.mtp.as_ref().ok_or(ModelError::NoMtp)?;
        let (be, c) = (&self.backend, &self.config);
        let (d, eps) = (c.hidden, c.rms_eps);
        let embed = mtp.embed.as_ref().unwrap_or(&self.weights.token_embd);
        let head = Head {
            norm: mtp.head_norm.as_ref().unwrap_or(&self.weights.output_norm),
            matrix: mtp.head.as_ref().unwrap_or(self.weights.lm_head()),
        };
        let rows: usize = parts.iter().map(|p| p.tokens.len()).sum();
        be.set_state_rows(&mut super::batch::state_rows(
            parts
                .iter()
                .map(|p| (&*p.out, p.done, p.tokens.len(), p.n_tok)),
        ));
        // Embeddings `[rows, D]` in `embed_rows` and the paired hidden states in
        // `final_normed`, each sequence's rows after those of the ones before it.
        if let [one] = &*parts {
            be.embed(&embed.w, one.tokens, &mut ws.embed_rows)?;
        } else {
            let all: Vec<u32> = parts
                .iter()
                .flat_map(|p| p.tokens.iter().copied())
                .collect();
            be.embed(&embed.w, &all, &mut ws.embed_rows)?;
        }
        let mut r0 = 0;
        for p in parts.iter() {
            be.upload(p.hidden, &mut ws.final_normed, r0 * d)?;
            r0 += p.tokens.len();
        }
        be.rms_norm(&ws.embed_rows, &mtp.enorm, &mut ws.normed, rows, d, eps)?;
        be.rms_norm(
            &ws.final_normed,
            &mtp.hnorm,
            &mut ws.mixer_out,
            rows,
            d,
            eps,
        )?;
        // eh_proj input: [enorm(embedding) ; hnorm(h)] per row (embedding first).
        for t in 0..rows {
            be.copy(&ws.normed, t * d, &mut ws.eh_in, 2 * t * d, d)?;
            be.copy(&ws.mixer_out, t * d, &mut ws.eh_in, 2 * t * d + d, d)?;
        }
        project(
            be,
            &mut ws.rotated,
            self.rot_block(),
            &ws.eh_in,
            rows,
            [(&mtp.eh_proj, &mut ws.resid)],
        )?;
        // The block's FFN output is added to the residual by the head's norm (`emit`).
        let mut block_rows = MtpRows { parts: &mut *parts };
        self.block(&mtp.block, &mut block_rows, ws, (rows, false))?;
        for p in parts.iter_mut() {
            p.state.mtp_len += p.tokens.len();
        }
        if let [p] = parts {
            // One sequence (a lone call, every decode step): no allocation.
            let mut one = [Seg {
                state: &mut *p.state,
                tokens: p.tokens,
                out: &mut *p.out,
                done: p.done,
                n_tok: p.n_tok,
                trace: None,
            }];
            return self.emit(ws, &head, &mut one, true);
        }
        let mut emit: Vec<Seg<'_, '_, B>> = parts
            .iter_mut()
            .map(|p| Seg {
                state: &mut *p.state,
                tokens: p.tokens,
                out: &mut *p.out,
                done: p.done,
                n_tok: p.n_tok,
                trace: None,
            })
            .collect();
        self.emit(ws, &head, &mut emit, true)
    }
}

/// The sequences of an MTP pass as the [`BlockRows`] of a block pass: each on its own MTP
/// layer state, at its own cache length and RoPE position.
struct MtpRows<'x, 's, 'o, B: Backend> {
    parts: &'x mut [MtpPart<'s, 'o, B>],
}

impl<B: Backend> BlockRows<B> for MtpRows<'_, '_, '_, B> {
    fn count(&self) -> usize {
        self.parts.len()
    }

    fn seg(&mut self, i: usize) -> BlockSeg<'_, B> {
        let row0 = self.parts[..i].iter().map(|p| p.tokens.len()).sum();
        let p = &mut self.parts[i];
        let step = Step {
            rows: p.tokens.len(),
            cache_pos0: p.state.mtp_len,
            rope_pos0: p.rope_pos0,
        };
        BlockSeg {
            // Checked by `check_mtp_call` before the pass.
            ls: p.state.mtp.as_mut().expect("MTP layer state checked"),
            step,
            row0,
            trace: None,
        }
    }
}
