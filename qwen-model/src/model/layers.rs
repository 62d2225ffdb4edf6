//! One decoder block (reference: `qwen38-architecture.md` section 4): the mixer (gated full
//! attention or Gated DeltaNet), then the SwiGLU FFN, each added to the residual stream; and
//! the projections every block starts its mixers and FFN with.

use super::{Model, Workspace};
use crate::backend::{
    Backend, ConvShape, GateLayout, GdnArgs, GdnRowScratch, GdnTrace, RopeLayout,
};
use crate::error::ModelError;
use crate::state::{GdnState, LayerState};
use crate::weights::{AttnWeights, GdnWeights, LayerWeights, Matrix, Mixer};

/// The rows of one internal step through a block: `rows` tokens whose K/V go to cache rows
/// `cache_pos0..` and whose RoPE positions start at `rope_pos0` (the same in the trunk; the MTP
/// block's cache has its own length).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Step {
    pub(crate) rows: usize,
    pub(crate) cache_pos0: usize,
    pub(crate) rope_pos0: usize,
}

/// Where one GDN layer of a traced pass records its states.
pub(crate) struct LayerTrace<'a, B: Backend> {
    /// Conv states `[max_rows, conv_state_len]`.
    pub(crate) conv: &'a mut B::Buf,
    /// Recurrent states `[max_rows, state_len]`.
    pub(crate) ssm: &'a mut B::Buf,
    /// One-row work buffers of the backend's traced delta rule.
    pub(crate) scratch: &'a mut GdnRowScratch<B::Buf>,
    /// Trace row of the first row of this chunk.
    pub(crate) row0: usize,
}

/// `outs[i].1 = outs[i].0 x` for matrices sharing the input `x` (row length K), feeding rotated
/// matrices the Hadamard-rotated input (computed once into `rot`).
pub(crate) fn project<B: Backend, const N: usize>(
    be: &B,
    rot: &mut B::Buf,
    block: usize,
    x: &B::Buf,
    rows: usize,
    outs: [(&Matrix<B>, &mut B::Buf); N],
) -> Result<(), ModelError> {
    let k = outs[0].0.cols;
    let n_rot = outs.iter().filter(|(m, _)| m.rotated).count();
    if n_rot == 0 {
        let mut o = outs.map(|(m, b)| (&m.w, b));
        return be.matmul(x, rows, &mut o);
    }
    be.copy(x, 0, rot, 0, rows * k)?;
    be.hadamard(rot, rows * k, block)?;
    if n_rot == N {
        let mut o = outs.map(|(m, b)| (&m.w, b));
        return be.matmul(rot, rows, &mut o);
    }
    for (m, b) in outs {
        let src = if m.rotated { &*rot } else { x };
        be.matmul(src, rows, &mut [(&m.w, b)])?;
    }
    Ok(())
}

impl<B: Backend> Model<B> {
    pub(crate) fn rot_block(&self) -> usize {
        self.config.rotation.map_or(0, |r| r.block_size)
    }

    /// [`project`] of the RMSNorm of `x` (rows of the hidden size, weight `norm`), with the
    /// rotated input of the rotated matrices produced by the fused
    /// [`Backend::rms_norm_hadamard`] straight from `x` into `rot` (instead of a copy of the
    /// norm output rotated in place). The unrotated norm goes to `normed` only when an
    /// unrotated matrix reads it.
    pub(crate) fn norm_project<const N: usize>(
        &self,
        x: &B::Buf,
        norm: &B::Buf,
        normed: &mut B::Buf,
        rot: &mut B::Buf,
        rows: usize,
        outs: [(&Matrix<B>, &mut B::Buf); N],
    ) -> Result<(), ModelError> {
        let (be, n, eps, block) = (
            &self.backend,
            self.config.hidden,
            self.config.rms_eps,
            self.rot_block(),
        );
        let n_rot = outs.iter().filter(|(m, _)| m.rotated).count();
        if n_rot == 0 {
            be.rms_norm(x, norm, normed, rows, n, eps)?;
            let mut o = outs.map(|(m, b)| (&m.w, b));
            return be.matmul(normed, rows, &mut o);
        }
        be.rms_norm_hadamard(x, norm, rot, rows, n, eps, block)?;
        if n_rot == N {
            let mut o = outs.map(|(m, b)| (&m.w, b));
            return be.matmul(rot, rows, &mut o);
        }
        // Mixed (GDN: PN qkv/gate, unquantized beta/alpha): the norm twice, both from `x`,
        // costs less than norm, copy and rotation, and gives the same bits.
        be.rms_norm(x, norm, normed, rows, n, eps)?;
        for (m, b) in outs {
            let src = if m.rotated { &*rot } else { &*normed };
            be.matmul(src, rows, &mut [(&m.w, b)])?;
        }
        Ok(())
    }

    /// One decoder block on the first `step.rows` rows of `ws.resid` (a GDN layer records its
    /// states into `trace` when given one).
    pub(crate) fn block(
        &self,
        lw: &LayerWeights<B>,
        ls: &mut LayerState<B>,
        ws: &mut Workspace<B>,
        step: Step,
        trace: Option<LayerTrace<'_, B>>,
    ) -> Result<(), ModelError> {
        let (be, c) = (&self.backend, &self.config);
        let (d, blk, rows) = (c.hidden, self.rot_block(), step.rows);
        // The mixers start with their input projections of the attention norm of the residual.
        let norm = &lw.attn_norm;
        match (&lw.mixer, ls) {
            (Mixer::Attention(aw), LayerState::Attention { k, v }) => {
                self.attention(aw, norm, k, v, ws, step)?
            }
            (Mixer::DeltaNet(gw), LayerState::DeltaNet(st)) => {
                self.deltanet(gw, norm, st, ws, rows, trace)?
            }
            _ => {
                return Err(ModelError::BadArgument(
                    "state does not match the model's layers".into(),
                ))
            }
        }
        be.add(&mut ws.resid, &ws.mixer_out, rows * d)?;
        let f = &lw.ffn;
        self.norm_project(
            &ws.resid,
            &lw.post_norm,
            &mut ws.normed,
            &mut ws.rotated,
            rows,
            [(&f.gate, &mut ws.ffn_gate), (&f.up, &mut ws.ffn_up)],
        )?;
        if f.down.rotated {
            // Nothing reads the unrotated SwiGLU output: one fused op straight into `rotated`.
            be.swiglu_hadamard(&ws.ffn_gate, &ws.ffn_up, &mut ws.rotated, rows * c.ffn, blk)?;
            be.matmul(&ws.rotated, rows, &mut [(&f.down.w, &mut ws.mixer_out)])?;
        } else {
            be.swiglu(&mut ws.ffn_gate, &ws.ffn_up, rows * c.ffn)?;
            project(
                be,
                &mut ws.rotated,
                blk,
                &ws.ffn_gate,
                rows,
                [(&f.down, &mut ws.mixer_out)],
            )?;
        }
        be.add(&mut ws.resid, &ws.mixer_out, rows * d)?;
        Ok(())
    }

    /// Gated full attention of `rms_norm(ws.resid) * norm` -> `ws.mixer_out`, appending K/V at
    /// cache row `step.cache_pos0`.
    fn attention(
        &self,
        aw: &AttnWeights<B>,
        norm: &B::Buf,
        kc: &mut B::KvBuf,
        vc: &mut B::KvBuf,
        ws: &mut Workspace<B>,
        step: Step,
    ) -> Result<(), ModelError> {
        let (be, c) = (&self.backend, &self.config);
        let (dh, eps, blk) = (c.head_dim, c.rms_eps, self.rot_block());
        let (hq, hkv, kv) = (c.n_q_heads, c.n_kv_heads, c.kv_dim());
        let Step {
            rows,
            cache_pos0,
            rope_pos0,
        } = step;
        self.norm_project(
            &ws.resid,
            norm,
            &mut ws.normed,
            &mut ws.rotated,
            rows,
            [
                (&aw.q, &mut ws.q_gate),
                (&aw.k, &mut ws.k),
                (&aw.v, &mut ws.v),
            ],
        )?;
        // Per-head q/k RMSNorm, then RoPE on the first `rope_dims` dims (norm before rope).
        be.rms_norm_strided(&mut ws.q_gate, &aw.q_norm, dh, 2 * dh, rows * hq, eps)?;
        be.rms_norm_strided(&mut ws.k, &aw.k_norm, dh, dh, rows * hkv, eps)?;
        let q_rope = RopeLayout {
            n_heads: hq,
            head_stride: 2 * dh,
            token_stride: c.q_proj_dim(),
            n_rot: c.rope_dims,
        };
        let k_rope = RopeLayout {
            n_heads: hkv,
            head_stride: dh,
            token_stride: kv,
            n_rot: c.rope_dims,
        };
        be.rope(&mut ws.q_gate, &q_rope, rows, rope_pos0, c.rope_theta)?;
        be.rope(&mut ws.k, &k_rope, rows, rope_pos0, c.rope_theta)?;
        be.kv_write(&ws.k, kc, cache_pos0 * kv, rows * kv)?;
        be.kv_write(&ws.v, vc, cache_pos0 * kv, rows * kv)?;
        be.attention(
            &ws.q_gate,
            kc,
            vc,
            &mut ws.attn_out,
            &c.attn_layout(),
            cache_pos0..cache_pos0 + rows,
        )?;
        // Output gate: the second half of each head's q-projection slice, through a sigmoid.
        let gate = GateLayout {
            n_heads: hq,
            head_dim: dh,
            offset: dh,
            token_stride: c.q_proj_dim(),
            head_stride: 2 * dh,
        };
        be.sigmoid_gate(&mut ws.attn_out, &ws.q_gate, &gate, rows)?;
        project(
            be,
            &mut ws.rotated,
            blk,
            &ws.attn_out,
            rows,
            [(&aw.o, &mut ws.mixer_out)],
        )
    }

    /// Gated DeltaNet of `rms_norm(ws.resid) * norm` -> `ws.mixer_out`, updating the conv and
    /// recurrent state `st`.
    fn deltanet(
        &self,
        gw: &GdnWeights<B>,
        norm: &B::Buf,
        st: &mut GdnState<B>,
        ws: &mut Workspace<B>,
        rows: usize,
        mut trace: Option<LayerTrace<'_, B>>,
    ) -> Result<(), ModelError> {
        let (be, c) = (&self.backend, &self.config);
        let g = &c.gdn;
        let blk = self.rot_block();
        self.norm_project(
            &ws.resid,
            norm,
            &mut ws.normed,
            &mut ws.rotated,
            rows,
            [
                (&gw.qkv, &mut ws.conv_in),
                (&gw.gate, &mut ws.gdn_gate),
                (&gw.beta, &mut ws.beta),
                (&gw.alpha, &mut ws.alpha),
            ],
        )?;
        if let Some(t) = &mut trace {
            // The conv state after row r is the last `kernel - 1` rows of [state ; u] up to
            // row r: copies taken before the conv shifts `u` into the state.
            let (cd, hist, cl) = (g.conv_dim(), g.conv_kernel - 1, g.conv_state_len());
            for r in 0..rows {
                let dst = (t.row0 + r) * cl;
                let from_old = hist.saturating_sub(r + 1);
                if from_old > 0 {
                    be.copy(&st.conv, (r + 1) * cd, t.conv, dst, from_old * cd)?;
                }
                let first_u = (r + 1).saturating_sub(hist);
                be.copy(
                    &ws.conv_in,
                    first_u * cd,
                    t.conv,
                    dst + from_old * cd,
                    (hist - from_old) * cd,
                )?;
            }
        }
        let shape = ConvShape {
            channels: g.conv_dim(),
            kernel: g.conv_kernel,
        };
        be.conv1d_silu(
            &ws.conv_in,
            &gw.conv,
            &mut st.conv,
            &mut ws.conv_out,
            shape,
            rows,
        )?;
        let args = GdnArgs {
            dims: g,
            n_tokens: rows,
            y: &mut ws.conv_out,
            b: &mut ws.beta,
            alpha: &mut ws.alpha,
            a: &gw.a,
            dt_bias: &gw.dt_bias,
            state: &mut st.ssm,
            out: &mut ws.gdn_out,
        };
        match trace {
            None => be.gated_delta_rule(args)?,
            Some(t) => be.gated_delta_rule_traced(
                args,
                GdnTrace {
                    states: t.ssm,
                    row0: t.row0,
                    scratch: t.scratch,
                },
            )?,
        }
        be.gated_rms_norm(
            &mut ws.gdn_out,
            &ws.gdn_gate,
            &gw.norm,
            rows * g.value_dim(),
            g.dv,
            c.rms_eps,
        )?;
        project(
            be,
            &mut ws.rotated,
            blk,
            &ws.gdn_out,
            rows,
            [(&gw.out, &mut ws.mixer_out)],
        )
    }
}
