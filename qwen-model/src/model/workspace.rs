//! The forward pass's scratch activations (as llama2.c's `RunState`): every buffer named for
//! what it holds, sized for the largest step.

use crate::backend::Backend;
use crate::config::ModelConfig;
use crate::error::ModelError;

/// Scratch activations for up to `max_rows` tokens per call; reused across calls so decode
/// allocates nothing. Shapes below are per call of `rows <= max_rows` tokens, with `D` the
/// hidden size, `Hq`/`Hkv` the attention heads of `Dh`, `Hv` the GDN value heads, `F` the FFN
/// width and `V` the vocabulary.
pub struct Workspace<B: Backend> {
    /// Tokens one internal step processes (longer inputs are split).
    pub(crate) max_rows: usize,
    /// The residual stream `[rows, D]` (the embeddings, then each layer's output; in the MTP
    /// block the `eh_proj` output).
    pub(crate) resid: B::Buf,
    /// RMSNorm of the residual `[rows, D]`, when an unrotated matrix reads it (MTP: the
    /// normed embeddings).
    pub(crate) normed: B::Buf,
    /// The Hadamard-rotated input of rotated (PN) matrices, `[rows, K]` with `K` the widest
    /// matrix input (`max(2D, F, Hq * Dh, Hv * dv)`).
    pub(crate) rotated: B::Buf,
    /// Attention q projection `[rows, Hq * 2 * Dh]`: per head `Dh` query values then `Dh`
    /// output-gate values.
    pub(crate) q_gate: B::Buf,
    /// Attention keys `[rows, Hkv * Dh]` (normed and rotated before the cache write).
    pub(crate) k: B::Buf,
    /// Attention values `[rows, Hkv * Dh]`.
    pub(crate) v: B::Buf,
    /// Attention output `[rows, Hq * Dh]` (gated in place).
    pub(crate) attn_out: B::Buf,
    /// The mixer's (then the FFN's) output projection `[rows, D]`, added to the residual
    /// (MTP: the normed trunk hidden states first).
    pub(crate) mixer_out: B::Buf,
    /// GDN `attn_qkv` projection, the conv input `[rows, conv_dim]`.
    pub(crate) conv_in: B::Buf,
    /// GDN conv + SiLU output `[rows, conv_dim]` (q | k | v per row).
    pub(crate) conv_out: B::Buf,
    /// GDN output gate `z` `[rows, Hv * dv]`.
    pub(crate) gdn_gate: B::Buf,
    /// GDN beta inputs `[rows, Hv]`.
    pub(crate) beta: B::Buf,
    /// GDN decay inputs `[rows, Hv]`.
    pub(crate) alpha: B::Buf,
    /// GDN delta-rule output `[rows, Hv * dv]` (gated-normed in place).
    pub(crate) gdn_out: B::Buf,
    /// FFN gate projection `[rows, F]` (SwiGLU output in place).
    pub(crate) ffn_gate: B::Buf,
    /// FFN up projection `[rows, F]`.
    pub(crate) ffn_up: B::Buf,
    /// The final normed hidden states `[rows, D]`: the LM head's input, the MTP block's `h`.
    pub(crate) final_normed: B::Buf,
    /// MTP token embeddings `[rows, D]`; also the last residual row alone `[1, D]` when only
    /// the last token's outputs are asked for.
    pub(crate) embed_rows: B::Buf,
    /// MTP `eh_proj` input `[rows, 2D]`: per row the normed embedding, then the normed `h`.
    pub(crate) eh_in: B::Buf,
    /// LM head output `[rows, V]`.
    pub(crate) logits: B::Buf,
    /// Per-sequence buffers of a batched pass ([`SegBufs`]), made on the first pass over more
    /// than one sequence (a single-sequence workspace never pays for them).
    pub(crate) seg: Option<SegBufs<B>>,
    /// Set by [`keep_next_logits`](Self::keep_next_logits): the next pass leaves its logits in
    /// `logits` instead of downloading them (cleared by that pass).
    pub(crate) keep_logits: bool,
    /// Where the kept logits of the last pass that wrote logits sit: per sequence of that pass
    /// (in order), its first row in `logits` and its row count (`NO_ROW`: it wanted none). Empty when that pass
    /// downloaded its logits. `[<= max_rows]`, capacity reserved once (decoding allocates
    /// nothing).
    pub(crate) kept_rows: Vec<(usize, usize)>,
    /// Floats per row of each [`SegBufs`] buffer, in field order.
    seg_widths: [usize; 9],
}

/// Where the per-sequence ops of a batched pass (RoPE, KV write and attention; conv1d and the
/// delta rule) work on the rows of one sequence that does not start at row 0 of the batch:
/// its rows are copied here, the ops run from offset 0 as for a lone sequence, and the output
/// rows are copied back. Shapes as the workspace's buffers of the same names, `[max_rows, ..]`.
pub(crate) struct SegBufs<B: Backend> {
    /// `[rows, Hq * 2 * Dh]`.
    pub(crate) q_gate: B::Buf,
    /// `[rows, Hkv * Dh]`.
    pub(crate) k: B::Buf,
    /// `[rows, Hkv * Dh]`.
    pub(crate) v: B::Buf,
    /// `[rows, Hq * Dh]`.
    pub(crate) attn_out: B::Buf,
    /// `[rows, conv_dim]`.
    pub(crate) conv_in: B::Buf,
    /// `[rows, conv_dim]`.
    pub(crate) conv_out: B::Buf,
    /// `[rows, Hv]`.
    pub(crate) beta: B::Buf,
    /// `[rows, Hv]`.
    pub(crate) alpha: B::Buf,
    /// `[rows, Hv * dv]`.
    pub(crate) gdn_out: B::Buf,
}

impl<B: Backend> Workspace<B> {
    /// Buffers for up to `max_rows` (at least 1) tokens per step of a model shaped `c`.
    pub(crate) fn new(c: &ModelConfig, be: &B, max_rows: usize) -> Result<Self, ModelError> {
        let r = max_rows.max(1);
        let d = c.hidden;
        let g = &c.gdn;
        let rot_k = [2 * d, c.ffn, c.attn_out_dim(), g.value_dim()]
            .into_iter()
            .max()
            .unwrap_or(d);
        Ok(Workspace {
            max_rows: r,
            resid: be.alloc(r * d)?,
            normed: be.alloc(r * d)?,
            rotated: be.alloc(r * rot_k)?,
            q_gate: be.alloc(r * c.q_proj_dim())?,
            k: be.alloc(r * c.kv_dim())?,
            v: be.alloc(r * c.kv_dim())?,
            attn_out: be.alloc(r * c.attn_out_dim())?,
            mixer_out: be.alloc(r * d)?,
            conv_in: be.alloc(r * g.conv_dim())?,
            conv_out: be.alloc(r * g.conv_dim())?,
            gdn_gate: be.alloc(r * g.value_dim())?,
            beta: be.alloc(r * g.n_v_heads)?,
            alpha: be.alloc(r * g.n_v_heads)?,
            gdn_out: be.alloc(r * g.value_dim())?,
            ffn_gate: be.alloc(r * c.ffn)?,
            ffn_up: be.alloc(r * c.ffn)?,
            final_normed: be.alloc(r * d)?,
            embed_rows: be.alloc(r * d)?,
            eh_in: be.alloc(r * 2 * d)?,
            logits: be.alloc(r * c.vocab)?,
            seg: None,
            keep_logits: false,
            kept_rows: Vec::with_capacity(r),
            seg_widths: [
                c.q_proj_dim(),
                c.kv_dim(),
                c.kv_dim(),
                c.attn_out_dim(),
                g.conv_dim(),
                g.conv_dim(),
                g.n_v_heads,
                g.n_v_heads,
                g.value_dim(),
            ],
        })
    }

    /// Makes the per-sequence buffers of batched passes, once.
    pub(crate) fn ensure_seg(&mut self, be: &B) -> Result<(), ModelError> {
        if self.seg.is_some() {
            return Ok(());
        }
        let r = self.max_rows;
        let [q, k, v, a, ci, co, b, al, go] = self.seg_widths.map(|w| r * w);
        self.seg = Some(SegBufs {
            q_gate: be.alloc(q)?,
            k: be.alloc(k)?,
            v: be.alloc(v)?,
            attn_out: be.alloc(a)?,
            conv_in: be.alloc(ci)?,
            conv_out: be.alloc(co)?,
            beta: be.alloc(b)?,
            alpha: be.alloc(al)?,
            gdn_out: be.alloc(go)?,
        });
        Ok(())
    }

    /// Makes the next pass (the next forward call, whose tokens must fit one step of
    /// [`max_rows`](Self::max_rows); a pass without logits just clears this) leave its logits
    /// on the backend (in this workspace) instead of downloading them into its
    /// [`Outputs::logits`](crate::Outputs) buffers, which must still be given (they ask for
    /// the logits) but are not written. Read them with
    /// [`Model::kept_top_k`](crate::Model::kept_top_k) (only the best `k` come back: on a
    /// device backend about 1 MB less per token at the 27B vocabulary) or
    /// [`Model::kept_logits`](crate::Model::kept_logits) (the whole row), before the next
    /// pass that writes logits.
    pub fn keep_next_logits(&mut self) {
        self.keep_logits = true;
    }

    /// Tokens one internal step processes (longer inputs are split).
    pub fn max_rows(&self) -> usize {
        self.max_rows
    }
}
