//! The Gated DeltaNet ops on the device: the causal conv1d + SiLU and the gated delta rule
//! (token by token for decode, chunked for prefill: [`gdn_chunked`](super::gdn_chunked)).

use super::{gdn_chunked, view, view_mut, CudaBackend, CudaBuf, CudaError, CONV_KERNEL};
use super::{shape_error, GDN_HEAD_DIM};
use crate::{ConvShape, GdnArgs};
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
