//! One decoder block (reference: `qwen38-architecture.md` section 4): the mixer (gated full
//! attention or Gated DeltaNet), then the SwiGLU FFN, each added to the residual stream; and
//! the projections every block starts its mixers and FFN with.

use super::{Model, Workspace};
use crate::backend::{
    AttnGateRot, Backend, ConvIn, ConvShape, GateLayout, GatedNormShape, GdnArgs, GdnRowScratch,
    GdnTrace, MixerOut, QkNormRope, RopeLayout, RotatedOut,
};
use crate::error::ModelError;
use crate::fused::{NormDest, NormIn, NormRot, SwigluRot};
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

/// One sequence's rows in a pass through a block: its layer state, its positions, and where
/// its rows sit in the workspace (`row0..row0 + step.rows`).
pub(crate) struct BlockSeg<'a, B: Backend> {
    /// The sequence's state of this layer.
    pub(crate) ls: &'a mut LayerState<B>,
    /// Its rows and positions.
    pub(crate) step: Step,
    /// Its first row in the workspace buffers.
    pub(crate) row0: usize,
    /// Where a GDN layer records its states (traced passes).
    pub(crate) trace: Option<LayerTrace<'a, B>>,
}

/// The sequences of one pass through a block, each seen as a [`BlockSeg`] on demand (so a
/// pass allocates nothing).
pub(crate) trait BlockRows<B: Backend> {
    /// Sequences in the pass.
    fn count(&self) -> usize;
    /// Sequence `i` (`< count()`).
    fn seg(&mut self, i: usize) -> BlockSeg<'_, B>;
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

    /// [`project`] of the RMSNorm of `x` (rows of the hidden size, weight `norm`; after the
    /// residual add `x += add` for [`NormIn::AddFirst`]) in one [`Backend::norm_matmul`]: the
    /// rotated matrices read the rotated norm, produced straight from `x` into `rot` (instead of
    /// a copy of the norm output rotated in place), the unrotated ones the plain norm in
    /// `normed` (GDN: PN qkv/gate and the Q8_0 beta/alpha; a backend writes both forms in one
    /// kernel). `normed` is written only when an unrotated matrix reads it.
    pub(crate) fn norm_project<const N: usize>(
        &self,
        x: NormIn<'_, B::Buf>,
        norm: &B::Buf,
        normed: &mut B::Buf,
        rot: &mut B::Buf,
        rows: usize,
        outs: [(&Matrix<B>, &mut B::Buf); N],
    ) -> Result<(), ModelError> {
        let nr = NormRot {
            w: norm,
            rows,
            n: self.config.hidden,
            eps: self.config.rms_eps,
            block: self.rot_block(),
        };
        let n_rot = outs.iter().filter(|(m, _)| m.rotated).count();
        // The rotated matrices first, each group in its order (an in-place sort of the array: no
        // allocation); the backend runs each group in one launch where it can.
        let mut i = 0;
        let mut o = outs.map(|(m, b)| {
            i += 1;
            ((!m.rotated, i), &m.w, b)
        });
        o.sort_unstable_by_key(|t| t.0);
        let mut o = o.map(|(_, w, b)| (w, b));
        let (rotated, plain) = o.split_at_mut(n_rot);
        let rot = (!rotated.is_empty()).then_some(NormDest {
            buf: rot,
            outs: rotated,
        });
        let plain = (!plain.is_empty()).then_some(NormDest {
            buf: normed,
            outs: plain,
        });
        self.backend.norm_matmul(x, &nr, rot, plain)
    }

    /// One decoder block on the first `rows` rows of `ws.resid`, the rows of the sequences
    /// `segs` side by side (each its own layer state, positions and rows; a GDN layer records
    /// its states into a sequence's trace when it has one). Every matrix sees all `rows` rows
    /// at once; the ops that read a sequence's own state run per sequence.
    ///
    /// The residual adds of the FFN outputs are left pending: with `pending`, `ws.mixer_out`
    /// holds the previous block's FFN output, added to `ws.resid` by this block's first norm
    /// (one fused op); this block leaves its own FFN output in `ws.mixer_out`, for the next
    /// block's norm, the final norm ([`Model::emit`]) or an explicit [`Backend::add`].
    pub(crate) fn block(
        &self,
        lw: &LayerWeights<B>,
        segs: &mut impl BlockRows<B>,
        ws: &mut Workspace<B>,
        (rows, pending): (usize, bool),
    ) -> Result<(), ModelError> {
        let (be, c) = (&self.backend, &self.config);
        let blk = self.rot_block();
        if segs.count() > 1 {
            ws.ensure_seg(be)?;
        }
        // The mixers start with their input projections of the attention norm of the residual
        // (the pending add fused into it).
        let input = MixerIn {
            norm: &lw.attn_norm,
            pending,
        };
        match &lw.mixer {
            Mixer::Attention(aw) => self.attention(aw, input, segs, ws, rows)?,
            Mixer::DeltaNet(gw) => self.deltanet(gw, input, segs, ws, rows)?,
        }
        let f = &lw.ffn;
        // The residual add of the mixer output goes into the FFN's norm.
        let resid = NormIn::AddFirst {
            x: &mut ws.resid,
            add: &ws.mixer_out,
        };
        self.norm_project(
            resid,
            &lw.post_norm,
            &mut ws.normed,
            &mut ws.rotated,
            rows,
            [(&f.gate, &mut ws.ffn_gate), (&f.up, &mut ws.ffn_up)],
        )?;
        if f.down.rotated {
            // Nothing reads the unrotated SwiGLU output: one fused op straight into `rotated`.
            let s = SwigluRot {
                gate: &ws.ffn_gate,
                up: &ws.ffn_up,
                rows,
                n: c.ffn,
                block: blk,
            };
            be.swiglu_hadamard_matmul(&s, &mut ws.rotated, &mut [(&f.down.w, &mut ws.mixer_out)])?;
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
        // `ws.mixer_out` now holds the FFN output: its residual add is the caller's (pending).
        Ok(())
    }

    /// Gated full attention of `rms_norm(ws.resid) * norm` -> `ws.mixer_out` over `rows` rows
    /// (`ws.resid` first takes the pending add, see [`MixerIn`]), each sequence of `segs`
    /// appending its K/V at its own cache row `step.cache_pos0` and attending over its own
    /// cache.
    fn attention(
        &self,
        aw: &AttnWeights<B>,
        input: MixerIn<'_, B>,
        segs: &mut impl BlockRows<B>,
        ws: &mut Workspace<B>,
        rows: usize,
    ) -> Result<(), ModelError> {
        let (be, c) = (&self.backend, &self.config);
        let (dh, blk) = (c.head_dim, self.rot_block());
        let (hq, kv, qd, ad) = (c.n_q_heads, c.kv_dim(), c.q_proj_dim(), c.attn_out_dim());
        self.norm_project(
            input.resid(&mut ws.resid, &ws.mixer_out),
            input.norm,
            &mut ws.normed,
            &mut ws.rotated,
            rows,
            [
                (&aw.q, &mut ws.q_gate),
                (&aw.k, &mut ws.k),
                (&aw.v, &mut ws.v),
            ],
        )?;
        // Output gate: the second half of each head's q-projection slice (which RoPE does not
        // touch), through a sigmoid.
        let gate = GateLayout {
            n_heads: hq,
            head_dim: dh,
            offset: dh,
            token_stride: qd,
            head_stride: 2 * dh,
        };
        // One sequence with a rotated o-projection: its attention writes the gated, rotated
        // o input straight into `rotated` and the o-projection follows in the same op (the
        // merge of the attention's splits also writes the projection's converted input).
        let fuse_out = aw.o.rotated && segs.count() == 1;
        let mut fused = false;
        // The per-head q/k RMSNorm runs with RoPE per sequence (`attend`: one fused op).
        for i in 0..segs.count() {
            let seg = segs.seg(i);
            let LayerState::Attention { k: kc, v: vc } = seg.ls else {
                return Err(mismatch());
            };
            let (r0, n) = (seg.row0, seg.step.rows);
            if r0 == 0 {
                let bufs = AttnBufs {
                    q_gate: &mut ws.q_gate,
                    k: &mut ws.k,
                    v: &ws.v,
                    out: &mut ws.attn_out,
                };
                let rot = fuse_out.then_some(OutRot {
                    out: &mut ws.rotated,
                    gate: &gate,
                    block: blk,
                    proj: (&aw.o.w, &mut ws.mixer_out),
                });
                fused |= rot.is_some();
                self.attend(aw, bufs, (kc, vc), seg.step, rot)?;
                continue;
            }
            let sb = ws.seg.as_mut().ok_or_else(no_seg)?;
            be.copy(&ws.q_gate, r0 * qd, &mut sb.q_gate, 0, n * qd)?;
            be.copy(&ws.k, r0 * kv, &mut sb.k, 0, n * kv)?;
            be.copy(&ws.v, r0 * kv, &mut sb.v, 0, n * kv)?;
            let bufs = AttnBufs {
                q_gate: &mut sb.q_gate,
                k: &mut sb.k,
                v: &sb.v,
                out: &mut sb.attn_out,
            };
            self.attend(aw, bufs, (kc, vc), seg.step, None)?;
            be.copy(&sb.attn_out, 0, &mut ws.attn_out, r0 * ad, n * ad)?;
        }
        if fused {
            return Ok(());
        }
        if aw.o.rotated {
            // Gate and rotation straight into `rotated`: one fused op instead of the gate, a
            // copy and the rotation.
            let o = RotatedOut {
                out: &mut ws.rotated,
                block: blk,
            };
            be.sigmoid_gate_hadamard((&mut ws.attn_out, &ws.q_gate, &gate), rows, o)?;
            return be.matmul(&ws.rotated, rows, &mut [(&aw.o.w, &mut ws.mixer_out)]);
        }
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

    /// One sequence's part of an attention layer, on its rows at offset 0 of `b`: the per-head
    /// q/k norms with RoPE at its positions, the K/V cache write, attention over its cache
    /// (into `b.out`, or gated and rotated into `rot.out` and projected into `rot.proj` when
    /// `rot` is given).
    fn attend(
        &self,
        aw: &AttnWeights<B>,
        b: AttnBufs<'_, B>,
        (kc, vc): (&mut B::KvBuf, &mut B::KvBuf),
        step: Step,
        rot: Option<OutRot<'_, B>>,
    ) -> Result<(), ModelError> {
        let (be, c) = (&self.backend, &self.config);
        let kv = c.kv_dim();
        let Step {
            rows,
            cache_pos0,
            rope_pos0,
        } = step;
        // RoPE on the first `rope_dims` dims (after the per-head norm).
        let q_rope = RopeLayout {
            n_heads: c.n_q_heads,
            head_stride: 2 * c.head_dim,
            token_stride: c.q_proj_dim(),
            n_rot: c.rope_dims,
        };
        let k_rope = RopeLayout {
            n_heads: c.n_kv_heads,
            head_stride: c.head_dim,
            token_stride: kv,
            n_rot: c.rope_dims,
        };
        be.qk_norm_rope(QkNormRope {
            q: &mut *b.q_gate,
            k: &mut *b.k,
            q_norm: &aw.q_norm,
            k_norm: &aw.k_norm,
            q_layout: q_rope,
            k_layout: k_rope,
            head_dim: c.head_dim,
            eps: c.rms_eps,
            n_tokens: rows,
            pos0: rope_pos0,
            theta: c.rope_theta,
        })?;
        be.kv_write_pair((b.k, b.v), (kc, vc), cache_pos0 * kv, rows * kv)?;
        let (layout, positions) = (c.attn_layout(), cache_pos0..cache_pos0 + rows);
        let Some(r) = rot else {
            return be.attention(b.q_gate, kc, vc, b.out, &layout, positions);
        };
        let a = AttnGateRot {
            q: &*b.q_gate,
            k_cache: &*kc,
            v_cache: &*vc,
            layout: &layout,
            positions,
            gate: &*b.q_gate,
            g: *r.gate,
            attn_out: b.out,
        };
        let o = RotatedOut {
            out: r.out,
            block: r.block,
        };
        be.mixer_out_matmul(MixerOut::Attention(a), o, rows, &mut [r.proj])
    }

    /// Gated DeltaNet of `rms_norm(ws.resid) * norm` -> `ws.mixer_out` over `rows` rows
    /// (`ws.resid` first takes the pending add, see [`MixerIn`]), each sequence of `segs`
    /// updating its own conv and recurrent state.
    fn deltanet(
        &self,
        gw: &GdnWeights<B>,
        input: MixerIn<'_, B>,
        segs: &mut impl BlockRows<B>,
        ws: &mut Workspace<B>,
        rows: usize,
    ) -> Result<(), ModelError> {
        let (be, c) = (&self.backend, &self.config);
        let g = &c.gdn;
        let blk = self.rot_block();
        let (cd, hv, vd) = (g.conv_dim(), g.n_v_heads, g.value_dim());
        self.norm_project(
            input.resid(&mut ws.resid, &ws.mixer_out),
            input.norm,
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
        for i in 0..segs.count() {
            let mut seg = segs.seg(i);
            let LayerState::DeltaNet(st) = seg.ls else {
                return Err(mismatch());
            };
            let (r0, n) = (seg.row0, seg.step.rows);
            let trace = seg.trace.as_mut();
            if r0 == 0 {
                let bufs = GdnBufs {
                    conv_in: &ws.conv_in,
                    conv_out: &mut ws.conv_out,
                    beta: &mut ws.beta,
                    alpha: &mut ws.alpha,
                    out: &mut ws.gdn_out,
                };
                self.gdn_core(gw, st, bufs, n, trace)?;
                continue;
            }
            let sb = ws.seg.as_mut().ok_or_else(no_seg)?;
            be.copy(&ws.conv_in, r0 * cd, &mut sb.conv_in, 0, n * cd)?;
            be.copy(&ws.beta, r0 * hv, &mut sb.beta, 0, n * hv)?;
            be.copy(&ws.alpha, r0 * hv, &mut sb.alpha, 0, n * hv)?;
            let bufs = GdnBufs {
                conv_in: &sb.conv_in,
                conv_out: &mut sb.conv_out,
                beta: &mut sb.beta,
                alpha: &mut sb.alpha,
                out: &mut sb.gdn_out,
            };
            self.gdn_core(gw, st, bufs, n, trace)?;
            be.copy(&sb.gdn_out, 0, &mut ws.gdn_out, r0 * vd, n * vd)?;
        }
        if gw.out.rotated {
            // Norm and rotation straight into `rotated` (one fused op instead of the norm, a
            // copy and the rotation), with ssm_out in the same op (the norm also writes its
            // converted input).
            let shape = GatedNormShape {
                len: rows * vd,
                n: g.dv,
                eps: c.rms_eps,
                block: blk,
            };
            let src = MixerOut::GatedNorm {
                x: &mut ws.gdn_out,
                z: &ws.gdn_gate,
                w: &gw.norm,
                shape,
            };
            let o = RotatedOut {
                out: &mut ws.rotated,
                block: blk,
            };
            let mut outs = [(&gw.out.w, &mut ws.mixer_out)];
            return be.mixer_out_matmul(src, o, rows, &mut outs);
        }
        be.gated_rms_norm(
            &mut ws.gdn_out,
            &ws.gdn_gate,
            &gw.norm,
            rows * vd,
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

    /// One sequence's part of a GDN layer on its `rows` rows at offset 0 of `b`: the conv over
    /// its conv state, then the delta rule over its recurrent state (recorded into `trace`).
    fn gdn_core(
        &self,
        gw: &GdnWeights<B>,
        st: &mut GdnState<B>,
        b: GdnBufs<'_, B>,
        rows: usize,
        mut trace: Option<&mut LayerTrace<'_, B>>,
    ) -> Result<(), ModelError> {
        let (be, g) = (&self.backend, &self.config.gdn);
        if let Some(t) = trace.as_mut() {
            // The conv state after row r is the last `kernel - 1` rows of [state ; u] up to
            // row r: copies taken before the conv shifts `u` into the state.
            let (cd, hist, cl) = (g.conv_dim(), g.conv_kernel - 1, g.conv_state_len());
            let tconv = &mut *t.conv;
            for r in 0..rows {
                let dst = (t.row0 + r) * cl;
                let from_old = hist.saturating_sub(r + 1);
                if from_old > 0 {
                    be.copy(&st.conv, (r + 1) * cd, tconv, dst, from_old * cd)?;
                }
                let first_u = (r + 1).saturating_sub(hist);
                be.copy(
                    b.conv_in,
                    first_u * cd,
                    tconv,
                    dst + from_old * cd,
                    (hist - from_old) * cd,
                )?;
            }
        }
        let shape = ConvShape {
            channels: g.conv_dim(),
            kernel: g.conv_kernel,
        };
        let args = GdnArgs {
            dims: g,
            n_tokens: rows,
            y: b.conv_out,
            b: b.beta,
            alpha: b.alpha,
            a: &gw.a,
            dt_bias: &gw.dt_bias,
            state: &mut st.ssm,
            out: b.out,
        };
        let conv = ConvIn {
            u: b.conv_in,
            w: &gw.conv,
            state: &mut st.conv,
            shape,
        };
        match trace {
            // The conv and the delta rule in one op (one launch for decode where the backend
            // can).
            None => be.conv_gated_delta_rule(conv, args),
            Some(t) => {
                be.conv1d_silu(conv.u, conv.w, conv.state, args.y, shape, rows)?;
                be.gated_delta_rule_traced(
                    args,
                    GdnTrace {
                        states: &mut *t.ssm,
                        row0: t.row0,
                        scratch: &mut *t.scratch,
                    },
                )
            }
        }
    }
}

/// The input of a block's mixer: its norm weight `[D]`, and whether the residual rows still
/// take the previous block's FFN output (held in `ws.mixer_out`) before the norm.
pub(crate) struct MixerIn<'a, B: Backend> {
    /// The mixer's input RMSNorm weight `[D]`.
    pub(crate) norm: &'a B::Buf,
    /// Whether `resid += mixer_out` is still to be done (fused into the norm).
    pub(crate) pending: bool,
}

impl<B: Backend> MixerIn<'_, B> {
    /// The norm's input: the residual rows `resid`, after `resid += add` when the add is
    /// pending.
    pub(crate) fn resid<'x>(&self, resid: &'x mut B::Buf, add: &'x B::Buf) -> NormIn<'x, B::Buf> {
        if self.pending {
            NormIn::AddFirst { x: resid, add }
        } else {
            NormIn::Plain(resid)
        }
    }
}

/// The buffers of one sequence's attention ops ([`Model::attend`]).
struct AttnBufs<'a, B: Backend> {
    /// q projection rows `[rows, Hq * 2 * Dh]` (roped in place).
    q_gate: &'a mut B::Buf,
    /// Key rows `[rows, Hkv * Dh]` (roped in place).
    k: &'a mut B::Buf,
    /// Value rows `[rows, Hkv * Dh]`.
    v: &'a B::Buf,
    /// Attention output rows `[rows, Hq * Dh]`.
    out: &'a mut B::Buf,
}

/// Where [`Model::attend`] writes a gated, rotated output: `out = H(attention * sigmoid(gate))`
/// in blocks of `block`.
struct OutRot<'a, B: Backend> {
    /// The o-projection's rotated input `[rows, Hq * Dh]`.
    out: &'a mut B::Buf,
    /// Where the gates sit in the q-projection rows.
    gate: &'a GateLayout,
    /// Rotation block.
    block: usize,
    /// The o-projection and its output rows `[rows, hidden]`.
    proj: (&'a B::Weight, &'a mut B::Buf),
}

/// The buffers of one sequence's GDN ops ([`Model::gdn_core`]).
struct GdnBufs<'a, B: Backend> {
    /// Conv input rows `[rows, conv_dim]`.
    conv_in: &'a B::Buf,
    /// Conv + SiLU output rows `[rows, conv_dim]`.
    conv_out: &'a mut B::Buf,
    /// Beta input rows `[rows, Hv]`.
    beta: &'a mut B::Buf,
    /// Decay input rows `[rows, Hv]`.
    alpha: &'a mut B::Buf,
    /// Delta-rule output rows `[rows, Hv * dv]`.
    out: &'a mut B::Buf,
}

fn mismatch() -> ModelError {
    ModelError::BadArgument("state does not match the model's layers".into())
}

fn no_seg() -> ModelError {
    ModelError::BadArgument("batched pass without per-sequence buffers".into())
}
