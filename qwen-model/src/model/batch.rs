//! Batched passes: the rows of several sequences, each at its own position with its own
//! [`State`], through one pass over the weights ([`Model::forward_batch`]). A lone sequence's
//! [`Model::forward`] is the one-sequence case of the same pass.
//!
//! Every matrix multiply sees the rows of all sequences together; RMSNorms, activations and
//! the output gate run row by row over all of them; RoPE, the KV cache write and attention,
//! the conv1d and the gated delta rule run per sequence on its own rows, positions, KV cache
//! and recurrent state (see `layers`).

use super::layers::{BlockRows, BlockSeg, LayerTrace, Step};
use super::{Head, Model, Outputs, Workspace};
use crate::backend::Backend;
use crate::error::ModelError;
use crate::state::{State, StateTrace};

/// One sequence's part of a [`Model::forward_batch`] pass: `tokens` appended to `state` (1 for
/// a decode step; a few for a prefill chunk or a speculative verification), the outputs it
/// wants, and optionally a trace of its GDN states after every row (as
/// [`Model::forward_traced`]).
pub struct BatchSeq<'a, B: Backend> {
    /// The sequence's state (KV caches, recurrent state, position).
    pub state: &'a mut State<B>,
    /// Its input tokens of this pass (at least one).
    pub tokens: &'a [u32],
    /// The outputs it wants (rows relative to its own `tokens`).
    pub out: Outputs<'a>,
    /// Records its recurrent state after every row (at most `trace.max_rows()` tokens).
    pub trace: Option<&'a mut StateTrace<B>>,
}

/// A sequence's rows in one trunk pass: its state, the tokens of this pass, where its outputs
/// go, and where the pass sits in its call (`done` rows of `n_tok` before it).
pub(super) struct Seg<'s, 'o, B: Backend> {
    pub(super) state: &'s mut State<B>,
    pub(super) tokens: &'s [u32],
    pub(super) out: &'s mut Outputs<'o>,
    pub(super) done: usize,
    pub(super) n_tok: usize,
    pub(super) trace: Option<&'s mut StateTrace<B>>,
}

/// Layer `l` of the trunk for the sequences `segs`: their [`BlockSeg`]s, made on demand.
struct TrunkLayer<'x, 's, 'o, B: Backend> {
    segs: &'x mut [Seg<'s, 'o, B>],
    l: usize,
}

impl<B: Backend> BlockRows<B> for TrunkLayer<'_, '_, '_, B> {
    fn count(&self) -> usize {
        self.segs.len()
    }

    fn seg(&mut self, i: usize) -> BlockSeg<'_, B> {
        let row0 = row0(self.segs, i);
        let l = self.l;
        let s = &mut self.segs[i];
        let pos = s.state.pos;
        let done = s.done;
        let trace = s.trace.as_deref_mut().and_then(|t| {
            let scratch = &mut t.scratch;
            t.layers[l].as_mut().map(|(conv, ssm)| LayerTrace {
                conv,
                ssm,
                scratch,
                row0: done,
            })
        });
        BlockSeg {
            ls: &mut s.state.layers[l],
            step: Step {
                rows: s.tokens.len(),
                cache_pos0: pos,
                rope_pos0: pos,
            },
            row0,
            trace,
        }
    }
}

/// Per row of a pass, whether it only feeds its sequence's state ([`Outputs::state_only`]),
/// from each sequence's `(outputs, first row in the call, rows in the pass, rows in the call)`.
pub(super) fn state_rows<'a, I>(segs: I) -> impl Iterator<Item = bool> + use<'a, I>
where
    I: Iterator<Item = (&'a Outputs<'a>, usize, usize, usize)>,
{
    segs.flat_map(|(out, done, n, n_tok)| (done..done + n).map(move |t| out.state_only(t, n_tok)))
}

/// The first workspace row of sequence `i` of a pass (the rows of those before it).
pub(super) fn row0<B: Backend>(segs: &[Seg<'_, '_, B>], i: usize) -> usize {
    segs[..i].iter().map(|s| s.tokens.len()).sum()
}

impl<B: Backend> Model<B> {
    /// Runs the trunk over the rows of several sequences in one pass over the weights: each
    /// [`BatchSeq`] appends its `tokens` to its own state, at its own position, and gets the
    /// outputs it asks for, as [`forward`](Self::forward) (or, with a trace,
    /// [`forward_traced`](Self::forward_traced)) would give it alone.
    ///
    /// Numerics: a sequence's rows go through matrix kernels that take every row of the pass
    /// (the CPU's fused multi-row dot products below 9 rows, its decode-once path above), so
    /// its outputs equal those of a lone pass up to the rounding of the kernel the row count
    /// picks (tested against a naive product within `1e-5 + 1e-4 * sum|w x|` in
    /// `qwen-model/tests/matmul.rs`); the per-sequence ops see only the sequence's rows and
    /// give the bits of a lone pass over the same rows.
    ///
    /// The rows of all sequences together must fit the workspace (`ws.max_rows()`); a state
    /// may appear once (each is borrowed mutably).
    pub fn forward_batch(
        &self,
        ws: &mut Workspace<B>,
        seqs: &mut [BatchSeq<'_, B>],
    ) -> Result<(), ModelError> {
        if seqs.is_empty() {
            return Err(ModelError::BadArgument(
                "batched pass of no sequences".into(),
            ));
        }
        let rows: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        if rows > ws.max_rows {
            return Err(ModelError::BadArgument(format!(
                "batched pass of {rows} rows ({} sequences), the workspace takes {}",
                seqs.len(),
                ws.max_rows
            )));
        }
        for s in seqs.iter_mut() {
            self.check_call(s.state, s.tokens, &s.out)?;
            if let Some(t) = s.trace.as_deref_mut() {
                if s.tokens.len() > t.max_rows() || t.layers.len() != self.config.n_layers {
                    return Err(ModelError::BadArgument(format!(
                        "traced batch row of {} tokens, the trace holds {} rows of {} layers",
                        s.tokens.len(),
                        t.max_rows(),
                        t.layers.len()
                    )));
                }
                t.rows = 0;
                t.pos0 = s.state.pos;
            }
        }
        let mut segs: Vec<Seg<'_, '_, B>> = seqs
            .iter_mut()
            .map(|s| Seg {
                state: &mut *s.state,
                tokens: s.tokens,
                out: &mut s.out,
                done: 0,
                n_tok: s.tokens.len(),
                trace: s.trace.as_deref_mut(),
            })
            .collect();
        self.trunk_pass(ws, &mut segs)?;
        drop(segs);
        for s in seqs.iter_mut() {
            if let Some(t) = s.trace.as_deref_mut() {
                t.rows = s.tokens.len();
            }
        }
        Ok(())
    }

    /// One pass of the trunk over the rows of `segs` side by side in the workspace (their
    /// tokens already checked, all of them at most `ws.max_rows`): embeddings, every block,
    /// the positions advanced, then the outputs each sequence asks for.
    pub(super) fn trunk_pass(
        &self,
        ws: &mut Workspace<B>,
        segs: &mut [Seg<'_, '_, B>],
    ) -> Result<(), ModelError> {
        let (be, d) = (&self.backend, self.config.hidden);
        let rows = row0(segs, segs.len());
        be.set_state_rows(&mut state_rows(
            segs.iter()
                .map(|s| (&*s.out, s.done, s.tokens.len(), s.n_tok)),
        ));
        let table = &self.weights.token_embd.w;
        if let [one] = &*segs {
            be.embed(table, one.tokens, &mut ws.resid)?;
        } else {
            // Each sequence's embeddings through `embed_rows` (`[rows, D]`) to its rows.
            for i in 0..segs.len() {
                let (r0, n) = (row0(segs, i), segs[i].tokens.len());
                be.embed(table, segs[i].tokens, &mut ws.embed_rows)?;
                be.copy(&ws.embed_rows, 0, &mut ws.resid, r0 * d, n * d)?;
            }
        }
        self.save_residuals(0, segs, &ws.resid)?;
        // Each block leaves its FFN output's residual add to the next norm (`Model::block`),
        // unless the residual stream is read after every layer.
        let save = segs.iter().any(|s| s.out.layer_residuals.is_some());
        let mut pending = false;
        for (l, lw) in self.weights.layers.iter().enumerate() {
            let mut layer = TrunkLayer {
                segs: &mut *segs,
                l,
            };
            self.block(lw, &mut layer, ws, (rows, pending))?;
            pending = true;
            if save {
                be.add(&mut ws.resid, &ws.mixer_out, rows * d)?;
                pending = false;
                self.save_residuals(l + 1, segs, &ws.resid)?;
            }
        }
        for s in segs.iter_mut() {
            s.state.pos += s.tokens.len();
        }
        let head = Head {
            norm: &self.weights.output_norm,
            matrix: self.weights.lm_head(),
        };
        self.emit(ws, &head, segs, pending)
    }

    /// Downloads the residual rows of the sequences that ask for them (`layer_residuals`):
    /// the stream after `l` blocks (0: the embeddings).
    fn save_residuals(
        &self,
        l: usize,
        segs: &mut [Seg<'_, '_, B>],
        resid: &B::Buf,
    ) -> Result<(), ModelError> {
        let d = self.config.hidden;
        for i in 0..segs.len() {
            let r0 = row0(segs, i);
            let s = &mut segs[i];
            if let Some(r) = s.out.layer_residuals.as_deref_mut() {
                let (at, n) = ((l * s.n_tok + s.done) * d, s.tokens.len() * d);
                self.backend.download(resid, r0 * d, &mut r[at..at + n])?;
            }
        }
        Ok(())
    }
}
