//! The Gated DeltaNet ops on the device: the causal conv1d + SiLU and the gated delta rule
//! (token by token for decode, chunked for prefill: [`gdn_chunked`](super::gdn_chunked)), and
//! both in one launch for decode ([`conv_delta_fuses`]).

use super::{gdn_chunked, lock, view, view_mut, CudaBackend, CudaBuf, CudaError, CONV_KERNEL};
use super::{shape_error, CONV_SYNC0, GDN_HEAD_DIM, SYNC_WORDS};
use crate::backend::mixer_proj;
use crate::{ConvIn, ConvShape, GdnArgs, ModelError};
use pn_kernels::{ConvViews, DeltaGates};
use pn_kernels::{DeltaRuleInputs, DeltaRuleShape, NormShape, QkL2, RowLayout, RowStrides};

impl CudaBackend {
    /// Causal conv1d (kernel [`CONV_KERNEL`]) + SiLU of `n_tokens` rows of `channels`, with
    /// the rolling `state` of the last `kernel - 1` inputs.
    pub(super) fn try_conv1d_silu(
        &self,
        (u, w): (&CudaBuf, &CudaBuf),
        state: &mut CudaBuf,
        y: &mut CudaBuf,
        ConvShape { channels, kernel }: ConvShape,
        n_tokens: usize,
    ) -> Result<(), CudaError> {
        const OP: &str = "conv1d_silu";
        // Backend::supports refuses any other kernel length at model bind.
        if kernel != CONV_KERNEL {
            return Err(shape_error(
                OP,
                format!("the kernel takes a conv length of {CONV_KERNEL}, got {kernel}"),
            ));
        }
        if n_tokens == 0 {
            return Ok(());
        }
        let uv = view(OP, u, 0, n_tokens * channels)?;
        let wv = view(OP, w, 0, kernel * channels)?;
        let mut sv = view_mut(OP, state, 0, (kernel - 1) * channels)?;
        let mut yv = view_mut(OP, y, 0, n_tokens * channels)?;
        let rows = RowStrides::contiguous(n_tokens, channels);
        Ok(self
            .gpu
            .conv1d_silu(&uv, &mut sv, &wv, &mut yv, rows, channels)?)
    }

    /// The gated delta rule of one call: the recurrence token by token with the L2 norms of q
    /// and k inside the kernel, or (prefill lengths) the norms in place then the chunked form.
    pub(super) fn try_gdn(&self, c: GdnArgs<'_, CudaBuf>) -> Result<(), CudaError> {
        const OP: &str = "gated_delta_rule";
        let (d, n_tokens) = (c.dims, c.n_tokens);
        // Backend::supports refuses any other head dims at model bind.
        if d.dk != GDN_HEAD_DIM || d.dv != GDN_HEAD_DIM {
            return Err(shape_error(
                OP,
                format!("the kernels take key/value head dims {GDN_HEAD_DIM}, got {d:?}"),
            ));
        }
        if n_tokens == 0 {
            return Ok(());
        }
        let (cd, kd, hv) = (d.conv_dim(), d.n_k_heads * d.dk, d.n_v_heads);
        let chunked = gdn_chunked(n_tokens);
        // The token-by-token kernel normalises the raw q and k heads itself (no norm
        // launches: decode's path); the chunked one reads them normalised in place.
        let l2 = QkL2 {
            q_scale: 1.0 / (d.dk as f32).sqrt(),
            eps: 1e-6,
        };
        if chunked {
            let mut yv = view_mut(OP, c.y, 0, n_tokens * cd)?;
            let ql = RowLayout {
                tokens: n_tokens,
                heads: d.n_k_heads,
                tok_stride: cd,
                head_stride: d.dk,
            };
            let norm = NormShape {
                n: d.dk,
                eps: l2.eps,
            };
            self.gpu.l2_norm_inplace(&mut yv, ql, norm, l2.q_scale)?;
            let mut kv = view_mut(OP, c.y, kd, (n_tokens - 1) * cd + kd)?;
            self.gpu.l2_norm_inplace(&mut kv, ql, norm, 1.0)?;
        }
        let y = &*c.y;
        let (b, alpha) = (&*c.b, &*c.alpha);
        let qv = view(OP, y, 0, (n_tokens - 1) * cd + kd)?;
        let kv = view(OP, y, kd, (n_tokens - 1) * cd + kd)?;
        let vv = view(OP, y, 2 * kd, (n_tokens - 1) * cd + d.value_dim())?;
        let bv = view(OP, b, 0, n_tokens * hv)?;
        let av = view(OP, alpha, 0, n_tokens * hv)?;
        let dtv = view(OP, c.dt_bias, 0, hv)?;
        let sav = view(OP, c.a, 0, hv)?;
        let mut sv = view_mut(OP, c.state, 0, d.state_len())?;
        let mut ov = view_mut(OP, c.out, 0, n_tokens * d.value_dim())?;
        let x = DeltaRuleInputs {
            q: &qv,
            k: &kv,
            v: &vv,
            beta_raw: &bv,
            alpha_raw: &av,
            dt_bias: &dtv,
            ssm_a: &sav,
        };
        // q, k and v sit in one conv-output row per token; one raw beta/alpha per value head.
        let sh = DeltaRuleShape {
            qk_stride: cd,
            v_stride: cd,
            ab_stride: hv,
            out_stride: d.value_dim(),
            n_v_heads: hv,
            n_k_heads: d.n_k_heads,
            t_len: n_tokens,
        };
        if chunked {
            self.gpu.delta_rule_chunked(&x, &sh, &mut sv, &mut ov)?;
        } else {
            self.gpu.delta_rule_l2(&x, &sh, l2, &mut sv, &mut ov)?;
        }
        Ok(())
    }
}

/// Whether [`CudaBackend::fused_conv_gated_delta_rule`] takes one launch for `n_tokens` rows of
/// a layer shaped `d` with a conv of `shape` (the token-by-token path; also what
/// [`super::LaunchCounter`] counts with).
pub(crate) fn conv_delta_fuses(d: &crate::GdnDims, n_tokens: usize, shape: ConvShape) -> bool {
    n_tokens > 0
        && !gdn_chunked(n_tokens)
        && shape.kernel == CONV_KERNEL
        && shape.channels == d.conv_dim()
        && d.dk == GDN_HEAD_DIM
        && d.dv == GDN_HEAD_DIM
        && d.n_k_heads <= SYNC_WORDS - CONV_SYNC0
        && pn_kernels::delta_rule_conv_refusal(&conv_delta_shape(d, n_tokens)).is_none()
}

/// The delta rule's shape over the conv rows (q, k and v in one row of `conv_dim` per token).
fn conv_delta_shape(d: &crate::GdnDims, n_tokens: usize) -> DeltaRuleShape {
    DeltaRuleShape {
        qk_stride: d.conv_dim(),
        v_stride: d.conv_dim(),
        ab_stride: d.n_v_heads,
        out_stride: d.value_dim(),
        n_v_heads: d.n_v_heads,
        n_k_heads: d.n_k_heads,
        t_len: n_tokens,
    }
}

impl CudaBackend {
    /// [`crate::Backend::conv_gated_delta_rule`]: `delta_rule_conv_f32`, one launch, where
    /// [`conv_delta_fuses`]; else the conv and the delta rule.
    pub(super) fn fused_conv_gated_delta_rule(
        &self,
        c: ConvIn<'_, CudaBuf>,
        a: GdnArgs<'_, CudaBuf>,
    ) -> Result<(), ModelError> {
        if !conv_delta_fuses(a.dims, a.n_tokens, c.shape) {
            return mixer_proj::conv_gated_delta_rule(self, c, a);
        }
        Ok(self.try_conv_gdn(c, a)?)
    }

    fn try_conv_gdn(
        &self,
        c: ConvIn<'_, CudaBuf>,
        a: GdnArgs<'_, CudaBuf>,
    ) -> Result<(), CudaError> {
        const OP: &str = "conv_gated_delta_rule";
        let (d, t) = (a.dims, a.n_tokens);
        let (cd, hv) = (d.conv_dim(), d.n_v_heads);
        let sh = conv_delta_shape(d, t);
        let l2 = QkL2 {
            q_scale: 1.0 / (d.dk as f32).sqrt(),
            eps: 1e-6,
        };
        let uv = view(OP, c.u, 0, t * cd)?;
        let wv = view(OP, c.w, 0, CONV_KERNEL * cd)?;
        let mut csv = view_mut(OP, c.state, 0, (CONV_KERNEL - 1) * cd)?;
        let mut yv = view_mut(OP, a.y, 0, t * cd)?;
        let (bv, av) = (view(OP, a.b, 0, t * hv)?, view(OP, a.alpha, 0, t * hv)?);
        let (dtv, sav) = (view(OP, a.dt_bias, 0, hv)?, view(OP, a.a, 0, hv)?);
        let mut sv = view_mut(OP, a.state, 0, d.state_len())?;
        let mut ov = view_mut(OP, a.out, 0, t * d.value_dim())?;
        let mut guard = lock(&self.scratch);
        let sy = self.grow(&mut guard.sync, SYNC_WORDS, "cross-block sync words")?;
        let mut syn = sy.slice_mut(CONV_SYNC0..CONV_SYNC0 + d.n_k_heads);
        let conv = ConvViews {
            u: &uv,
            w: &wv,
            state: &mut csv,
            y: &mut yv,
            sync: &mut syn,
        };
        let gates = DeltaGates {
            beta_raw: &bv,
            alpha_raw: &av,
            dt_bias: &dtv,
            ssm_a: &sav,
        };
        Ok(self
            .gpu
            .delta_rule_conv(conv, &gates, (&sh, l2), &mut sv, &mut ov)?)
    }
}
