//! The fused mixer ops of [`Backend`] (issue #23: fewer launches per decode token): their
//! argument types and their default implementations, each the sequence of existing ops it
//! replaces, so a backend without a fused kernel (the CPU) keeps its bits.

use super::{AttnLayout, Backend, GateLayout, RopeLayout};
use crate::error::ModelError;
use std::ops::Range;

/// The q and k heads of one [`Backend::qk_norm_rope`] call over `n_tokens` tokens: per-head
/// RMSNorm (weights `q_norm` / `k_norm`, `head_dim` floats each) then NeoX RoPE at positions
/// `pos0..`, in place. Each layout's heads are `head_stride` apart and its tokens
/// `n_heads * head_stride` apart (the projections' rows; q's heads interleaved with their gates
/// when `head_stride` is `2 * head_dim`).
pub struct QkNormRope<'a, T> {
    /// q rows `[n_tokens, q.n_heads * q.head_stride]`, normalised and rotated in place.
    pub q: &'a mut T,
    /// k rows `[n_tokens, k.n_heads * k.head_stride]`, normalised and rotated in place.
    pub k: &'a mut T,
    /// q norm weights `[head_dim]`.
    pub q_norm: &'a T,
    /// k norm weights `[head_dim]`.
    pub k_norm: &'a T,
    /// Layout of the q heads (and the dims RoPE rotates).
    pub q_layout: RopeLayout,
    /// Layout of the k heads.
    pub k_layout: RopeLayout,
    /// Floats per head the norms cover.
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// Tokens.
    pub n_tokens: usize,
    /// RoPE position of the first token.
    pub pos0: usize,
    /// RoPE frequency base.
    pub theta: f32,
}

/// The output of [`Backend::sigmoid_gate_hadamard`]: `len` floats into `out`, rotated in
/// blocks of `block`.
pub struct RotatedOut<'a, T> {
    /// Output `[len]`.
    pub out: &'a mut T,
    /// Rotation block (a power of two dividing `len`).
    pub block: usize,
}

/// One [`Backend::attention_gate_hadamard`] call: attention of the query tokens at
/// `positions` (rows of `q` laid out as `layout`) against the caches, gated by `gate` (laid out
/// as `g`, as [`Backend::sigmoid_gate`]).
pub struct AttnGateRot<'a, B: Backend + ?Sized> {
    /// Query rows (with their gates: `q` and `gate` are one buffer in the model).
    pub q: &'a B::Buf,
    /// K cache (holds positions `0..positions.end`).
    pub k_cache: &'a B::KvBuf,
    /// V cache.
    pub v_cache: &'a B::KvBuf,
    /// Layout of `q` and the heads.
    pub layout: &'a AttnLayout,
    /// Sequence positions of the query tokens.
    pub positions: Range<usize>,
    /// The output gate values.
    pub gate: &'a B::Buf,
    /// Where the gates sit in `gate`.
    pub g: GateLayout,
    /// Attention output rows `[positions.len(), Hq * head_dim]` (where the default writes the
    /// ungated output; unspecified afterwards).
    pub attn_out: &'a mut B::Buf,
}

/// Shape of one [`Backend::gated_rms_norm_hadamard`] call: `len` floats in rows of `n`,
/// normalised with epsilon `eps`, rotated in blocks of `block`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GatedNormShape {
    /// Floats (rows x n).
    pub len: usize,
    /// Row length (the value head dim).
    pub n: usize,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// Rotation block (a power of two dividing `len`).
    pub block: usize,
}

/// The default [`Backend::qk_norm_rope`]: `rms_norm_strided` of the q heads and of the k
/// heads, then `rope` of each.
pub(crate) fn qk_norm_rope<B: Backend + ?Sized>(
    be: &B,
    a: QkNormRope<'_, B::Buf>,
) -> Result<(), ModelError> {
    let count = |l: &RopeLayout| -> Result<usize, ModelError> {
        if l.token_stride != l.n_heads * l.head_stride {
            return Err(ModelError::BadArgument(format!(
                "qk_norm_rope: token stride {} is not {} heads of stride {}",
                l.token_stride, l.n_heads, l.head_stride
            )));
        }
        Ok(a.n_tokens * l.n_heads)
    };
    let (nq, nk) = (count(&a.q_layout)?, count(&a.k_layout)?);
    let (hq, hk) = (a.q_layout.head_stride, a.k_layout.head_stride);
    be.rms_norm_strided(a.q, a.q_norm, a.head_dim, hq, nq, a.eps)?;
    be.rms_norm_strided(a.k, a.k_norm, a.head_dim, hk, nk, a.eps)?;
    be.rope(a.q, &a.q_layout, a.n_tokens, a.pos0, a.theta)?;
    be.rope(a.k, &a.k_layout, a.n_tokens, a.pos0, a.theta)
}

/// The default [`Backend::sigmoid_gate_hadamard`]: `sigmoid_gate` in place on `x`, a copy to
/// `out`, `hadamard` of `out`.
pub(crate) fn sigmoid_gate_hadamard<B: Backend + ?Sized>(
    be: &B,
    (x, gate, g): (&mut B::Buf, &B::Buf, &GateLayout),
    n_tokens: usize,
    o: RotatedOut<'_, B::Buf>,
) -> Result<(), ModelError> {
    let len = n_tokens * g.n_heads * g.head_dim;
    be.sigmoid_gate(x, gate, g, n_tokens)?;
    be.copy(x, 0, o.out, 0, len)?;
    be.hadamard(o.out, len, o.block)
}

/// The default [`Backend::gated_rms_norm_hadamard`]: `gated_rms_norm` in place on `x`, a copy
/// to `out`, `hadamard` of `out`.
pub(crate) fn gated_rms_norm_hadamard<B: Backend + ?Sized>(
    be: &B,
    (x, z, w): (&mut B::Buf, &B::Buf, &B::Buf),
    out: &mut B::Buf,
    s: GatedNormShape,
) -> Result<(), ModelError> {
    be.gated_rms_norm(x, z, w, s.len, s.n, s.eps)?;
    be.copy(x, 0, out, 0, s.len)?;
    be.hadamard(out, s.len, s.block)
}

/// The default [`Backend::attention_gate_hadamard`]: `attention` into `a.attn_out`, then
/// [`Backend::sigmoid_gate_hadamard`] of it.
pub(crate) fn attention_gate_hadamard<B: Backend + ?Sized>(
    be: &B,
    a: AttnGateRot<'_, B>,
    o: RotatedOut<'_, B::Buf>,
) -> Result<(), ModelError> {
    let n = a.positions.len();
    be.attention(a.q, a.k_cache, a.v_cache, a.attn_out, a.layout, a.positions)?;
    be.sigmoid_gate_hadamard((a.attn_out, a.gate, &a.g), n, o)
}
