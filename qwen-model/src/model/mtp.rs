//! The MTP (multi-token prediction) block (reference: `qwen38-architecture.md` section 6): one
//! extra decoder block over `[enorm(embedding) ; hnorm(h)]`, with its own KV cache, drafting
//! the token after next.

use super::batch::Seg;
use super::layers::{project, BlockRows, BlockSeg, Step};
use super::{Head, Model, Outputs, Workspace};
use crate::backend::Backend;
use crate::error::ModelError;
use crate::state::{LayerState, State};

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
        let mtp = self.weights.mtp.as_ref().ok_or(ModelError::NoMtp)?;
        if state.mtp.is_none() {
            return Err(ModelError::NoMtp);
        }
        let (be, c) = (&self.backend, &self.config);
        let (d, eps) = (c.hidden, c.rms_eps);
        if tokens.is_empty() || hidden.len() != tokens.len() * d {
            return Err(ModelError::BadArgument(format!(
                "MTP: {} tokens need {} hidden floats, got {}",
                tokens.len(),
                tokens.len() * d,
                hidden.len()
            )));
        }
        self.check_tokens(tokens)?;
        self.check_outputs(tokens.len(), &out)?;
        let needed = state.mtp_len + tokens.len();
        if needed > state.capacity {
            return Err(ModelError::ContextFull {
                needed,
                capacity: state.capacity,
            });
        }
        let embed = mtp.embed.as_ref().unwrap_or(&self.weights.token_embd);
        let head = Head {
            norm: mtp.head_norm.as_ref().unwrap_or(&self.weights.output_norm),
            matrix: mtp.head.as_ref().unwrap_or(self.weights.lm_head()),
        };
        let mut done = 0;
        for chunk in tokens.chunks(ws.max_rows) {
            let rows = chunk.len();
            be.embed(&embed.w, chunk, &mut ws.embed_rows)?;
            be.upload(
                &hidden[done * d..(done + rows) * d],
                &mut ws.final_normed,
                0,
            )?;
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
            let step = Step {
                rows,
                cache_pos0: state.mtp_len,
                rope_pos0: rope_pos0 + done,
            };
            let ls = state.mtp.as_mut().ok_or(ModelError::NoMtp)?;
            self.block(&mtp.block, &mut MtpRows { ls, step }, ws, rows)?;
            state.mtp_len += rows;
            let mut emit = [Seg {
                state: &mut *state,
                tokens: chunk,
                out: &mut out,
                done,
                n_tok: tokens.len(),
                trace: None,
            }];
            self.emit(ws, &head, &mut emit)?;
            done += rows;
        }
        Ok(())
    }
}

/// The MTP block's one sequence as the [`BlockRows`] of a block pass.
struct MtpRows<'a, B: Backend> {
    ls: &'a mut LayerState<B>,
    step: Step,
}

impl<B: Backend> BlockRows<B> for MtpRows<'_, B> {
    fn count(&self) -> usize {
        1
    }

    fn seg(&mut self, _: usize) -> BlockSeg<'_, B> {
        BlockSeg {
            ls: &mut *self.ls,
            step: self.step,
            row0: 0,
            trace: None,
        }
    }
}
