//! The fused mixer ops on the device ([`crate::Backend::qk_norm_rope`],
//! [`crate::Backend::sigmoid_gate_hadamard`], [`crate::Backend::gated_rms_norm_hadamard`]): one
//! kernel each where the shape fits it, else the trait's default sequence of ops.

use super::{view, view_mut, CudaBackend, CudaBuf, CudaError};
use crate::backend::mixer_ops;
use crate::{AttnGateRot, GateLayout, GatedNormShape, ModelError, QkNormRope, RotatedOut};
use pn_kernels::{GateRotation, GatedNormRotation, Gpu, QkNormRopeShape};

/// The kernel's shape of a [`QkNormRope`] call (its layouts' token strides must be whole
/// heads, as the default's strided norms need too).
pub(super) fn qk_shape<T>(a: &QkNormRope<'_, T>) -> Option<QkNormRopeShape> {
    let (q, k) = (&a.q_layout, &a.k_layout);
    let whole = |l: &crate::RopeLayout| l.token_stride == l.n_heads * l.head_stride;
    (whole(q) && whole(k) && q.n_rot == k.n_rot).then_some(QkNormRopeShape {
        n_tokens: a.n_tokens,
        n_q_heads: q.n_heads,
        q_tok_stride: q.token_stride,
        q_head_stride: q.head_stride,
        n_k_heads: k.n_heads,
        k_tok_stride: k.token_stride,
        k_head_stride: k.head_stride,
        head_dim: a.head_dim,
        eps: a.eps,
        pos0: a.pos0,
        n_rot: q.n_rot,
        base: a.theta,
    })
}

/// [`qk_shape`] where the fused kernel takes it (else the default's ops run).
pub(crate) fn qk_fused<T>(a: &QkNormRope<'_, T>) -> Option<QkNormRopeShape> {
    qk_shape(a).filter(|s| s.refusal().is_none())
}

/// The kernel shape of a gated rotation of `n_tokens` rows laid out as `g` in blocks of
/// `block` (the sigmoid gate's, and the attention merge's).
pub(crate) fn gate_rotation(g: &GateLayout, n_tokens: usize, block: usize) -> GateRotation {
    GateRotation {
        len: n_tokens * g.n_heads * g.head_dim,
        n_heads: g.n_heads,
        head_dim: g.head_dim,
        gate_tok_stride: g.token_stride,
        gate_head_stride: g.head_stride,
        block,
    }
}

/// The kernel shape of a gated RMSNorm + rotation where the fused kernel takes it (else the
/// default's ops run).
pub(crate) fn gated_norm_rotation(sh: &GatedNormShape) -> Option<GatedNormRotation> {
    let s = super::mixer_proj::gated_rotation(sh);
    (s.refusal().is_none() && Gpu::rotation_fits(sh.len, sh.block)).then_some(s)
}

impl CudaBackend {
    /// [`crate::Backend::qk_norm_rope`]: `qk_norm_rope_f32`, one launch.
    pub(super) fn fused_qk_norm_rope(&self, a: QkNormRope<'_, CudaBuf>) -> Result<(), ModelError> {
        const OP: &str = "qk_norm_rope";
        if a.n_tokens == 0 {
            return Ok(());
        }
        let Some(s) = qk_fused(&a) else {
            return mixer_ops::qk_norm_rope(self, a);
        };
        let mut run = || -> Result<(), CudaError> {
            let mut qv = view_mut(OP, a.q, 0, s.q_len())?;
            let mut kv = view_mut(OP, a.k, 0, s.k_len())?;
            let wq = view(OP, a.q_norm, 0, s.head_dim)?;
            let wk = view(OP, a.k_norm, 0, s.head_dim)?;
            Ok(self.gpu.qk_norm_rope(&s, (&mut qv, &mut kv), (&wq, &wk))?)
        };
        Ok(run()?)
    }

    /// [`crate::Backend::sigmoid_gate_hadamard`]: `sigmoid_gate_hadamard_f32`, one launch
    /// (`x` is left ungated).
    pub(super) fn fused_sigmoid_gate_hadamard(
        &self,
        (x, gate, g): (&mut CudaBuf, &CudaBuf, &GateLayout),
        n_tokens: usize,
        o: RotatedOut<'_, CudaBuf>,
    ) -> Result<(), ModelError> {
        const OP: &str = "sigmoid_gate_hadamard";
        let s = gate_rotation(g, n_tokens, o.block);
        if n_tokens == 0 {
            return Ok(());
        }
        if s.refusal().is_some() {
            return mixer_ops::sigmoid_gate_hadamard(self, (x, gate, g), n_tokens, o);
        }
        let mut run = || -> Result<(), CudaError> {
            let xv = view(OP, x, 0, s.len)?;
            let gv = view(OP, gate, g.offset, s.gate_len())?;
            let mut ov = view_mut(OP, o.out, 0, s.len)?;
            Ok(self.gpu.sigmoid_gate_hadamard(&s, &xv, &gv, &mut ov)?)
        };
        Ok(run()?)
    }

    /// [`crate::Backend::gated_rms_norm_hadamard`]: `gated_rms_norm_hadamard_f32`, one launch
    /// (`x` is left as it was).
    pub(super) fn fused_gated_rms_norm_hadamard(
        &self,
        (x, z, w): (&mut CudaBuf, &CudaBuf, &CudaBuf),
        out: &mut CudaBuf,
        sh: GatedNormShape,
    ) -> Result<(), ModelError> {
        const OP: &str = "gated_rms_norm_hadamard";
        if sh.len == 0 {
            return Ok(());
        }
        let Some(s) = gated_norm_rotation(&sh) else {
            return mixer_ops::gated_rms_norm_hadamard(self, (x, z, w), out, sh);
        };
        let mut run = || -> Result<(), CudaError> {
            let xv = view(OP, x, 0, s.len)?;
            let zv = view(OP, z, 0, s.len)?;
            let wv = view(OP, w, 0, s.n)?;
            let mut ov = view_mut(OP, out, 0, s.len)?;
            Ok(self
                .gpu
                .gated_rms_norm_hadamard(&s, (&xv, &zv, &wv), &mut ov)?)
        };
        Ok(run()?)
    }

    /// [`crate::Backend::attention_gate_hadamard`]: the split-K partials, then one kernel
    /// merging them, gating and rotating into `o.out` (two launches for five); the tiled
    /// prefill kernel and shapes the merge refuses take the default.
    pub(super) fn fused_attention_gate_hadamard(
        &self,
        a: AttnGateRot<'_, Self>,
        o: RotatedOut<'_, CudaBuf>,
    ) -> Result<(), ModelError> {
        let g = &a.g;
        let gr = gate_rotation(g, a.positions.len(), o.block);
        let call = (a.q, a.k_cache, a.v_cache);
        let at = (a.layout, a.positions.clone());
        let done = self.try_attention_gate_hadamard(
            call,
            at,
            (a.gate, g.offset, gr),
            (&mut *o.out, false),
        )?;
        match done {
            Some(()) => Ok(()),
            None => mixer_ops::attention_gate_hadamard(self, a, o),
        }
    }
}
