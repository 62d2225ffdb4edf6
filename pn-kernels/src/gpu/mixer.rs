//! The fused mixer kernels (`kernels/mixer.cu`): the q/k head norms with RoPE, the attention
//! output gate with the o-projection's rotation, the GDN output norm with ssm_out's rotation;
//! each one launch where the decode path took two to four.

use super::{drv, AttnShape, Gpu, KvElem, PreparedOut, SplitK};
use crate::error::{check, KernelError};
use crate::mixer_types::{rotation_scale, GateRotation, GatedNormRotation, QkNormRopeShape};
use cudarc::driver::{CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

/// Where a mixer kernel also writes the prepared fp16 copy of its output rows (the input of
/// the PN projection that follows, with the bits of [`Gpu::pn_prepare_rows`]): `prep` for
/// `rows` rows of `row_len` values, and `sync`, 2 words per row that must be zero before the
/// launch (the kernel leaves them zero: allocate them zeroed once).
pub struct RowPrepOut<'a, 'b> {
    /// fp16 rows and exponents.
    pub prep: PreparedOut<'a, 'b>,
    /// The rows' arrival counters and maxima.
    pub sync: &'a mut CudaViewMut<'b, u32>,
    /// Values per row.
    pub row_len: usize,
}

impl RowPrepOut<'_, '_> {
    /// Checks the copy's buffers for `len` output values in rows of `row_len` made of whole
    /// blocks of `chunk` values.
    fn check(&self, op: &'static str, len: usize, chunk: usize) -> Result<(), KernelError> {
        let r = self.row_len;
        let rows = len / r.max(1);
        check(
            r > 0
                && r.is_multiple_of(chunk)
                && r.is_multiple_of(2)
                && len.is_multiple_of(r)
                && r <= i32::MAX as usize,
            op,
            || format!("{len} values in rows of {r} (whole blocks of {chunk})"),
        )?;
        check(
            self.prep.xh.len() >= len && self.prep.e.len() >= rows && self.sync.len() >= 2 * rows,
            op,
            || {
                format!(
                    "xh/e/sync have {}/{}/{}, {rows} rows of {r} need {len}/{rows}/{}",
                    self.prep.xh.len(),
                    self.prep.e.len(),
                    self.sync.len(),
                    2 * rows
                )
            },
        )
    }
}

impl Gpu {
    /// Per-head RMSNorm (weights `wq`, `wk` of `s.head_dim`) then partial NeoX RoPE at
    /// positions `s.pos0..` of the q heads of `q` and the k heads of `k`, in place: one launch
    /// for what `rms_norm_inplace` twice and `rope_neox` twice do, with their bits.
    pub fn qk_norm_rope(
        &self,
        s: &QkNormRopeShape,
        (q, k): (&mut CudaViewMut<'_, f32>, &mut CudaViewMut<'_, f32>),
        (wq, wk): (&CudaView<'_, f32>, &CudaView<'_, f32>),
    ) -> Result<(), KernelError> {
        const OP: &str = "qk_norm_rope";
        check(s.refusal().is_none(), OP, || {
            s.refusal().unwrap_or_default()
        })?;
        check(
            q.len() >= s.q_len()
                && k.len() >= s.k_len()
                && wq.len() >= s.head_dim
                && wk.len() >= s.head_dim,
            OP,
            || {
                format!(
                    "q/k/wq/wk have {}/{}/{}/{} floats, {s:?} needs {}/{}/{n}/{n}",
                    q.len(),
                    k.len(),
                    wq.len(),
                    wk.len(),
                    s.q_len(),
                    s.k_len(),
                    n = s.head_dim
                )
            },
        )?;
        let f = self.func("mixer", "qk_norm_rope_f32")?;
        let (qts, qhs, kts, khs) = (
            s.q_tok_stride as i64,
            s.q_head_stride as i64,
            s.k_tok_stride as i64,
            s.k_head_stride as i64,
        );
        let (nq, n, p0, nr, nt) = (
            s.n_q_heads as i32,
            s.head_dim as i32,
            s.pos0 as i32,
            s.n_rot as i32,
            s.n_tokens as i32,
        );
        let mut b = self.stream.launch_builder(f);
        b.arg(q).arg(&qts).arg(&qhs).arg(k).arg(&kts).arg(&khs);
        b.arg(wq).arg(wk).arg(&nq).arg(&n).arg(&s.eps);
        b.arg(&p0).arg(&nr).arg(&s.base).arg(&nt);
        let cfg = LaunchConfig {
            // Grid y strides over the tokens (any count; 65535 blocks at most).
            grid_dim: (
                (s.n_q_heads + s.n_k_heads) as u32,
                crate::launch::grid_y_blocks(s.n_tokens),
                1,
            ),
            // 256 threads: rms_norm_f32's block, so the sum of squares reduces in its order.
            block_dim: (256, 1, 1),
            shared_mem_bytes: (s.head_dim * 4) as u32,
        };
        // SAFETY: arguments as declared; lengths checked; shared memory head_dim floats.
        unsafe { b.launch(cfg) }.map_err(drv("qk_norm_rope_f32"))?;
        Ok(())
    }

    /// `out = H(x * sigmoid(g))` laid out as `s` (the gate of value `(t, h, i)` at `g[t *
    /// gate_tok_stride + h * gate_head_stride + i]`): the attention output gate and the rotation
    /// of the o-projection's input in one launch; `x` is not written.
    pub fn sigmoid_gate_hadamard(
        &self,
        s: &GateRotation,
        x: &CudaView<'_, f32>,
        g: &CudaView<'_, f32>,
        out: &mut CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "sigmoid_gate_hadamard";
        check(s.refusal().is_none(), OP, || {
            s.refusal().unwrap_or_default()
        })?;
        check(
            x.len() >= s.len && out.len() >= s.len && g.len() >= s.gate_len(),
            OP,
            || {
                format!(
                    "x/g/out have {}/{}/{} floats, {s:?} needs {}/{}/{}",
                    x.len(),
                    g.len(),
                    out.len(),
                    s.len,
                    s.gate_len(),
                    s.len
                )
            },
        )?;
        let f = self.func("mixer", "sigmoid_gate_hadamard_f32")?;
        let (hd, nh, gts, ghs) = (
            s.head_dim as i32,
            s.n_heads as i32,
            s.gate_tok_stride as i64,
            s.gate_head_stride as i64,
        );
        let (r, scale) = (s.block as i32, rotation_scale(s.block));
        let mut b = self.stream.launch_builder(f);
        b.arg(x)
            .arg(g)
            .arg(out)
            .arg(&hd)
            .arg(&nh)
            .arg(&gts)
            .arg(&ghs);
        b.arg(&r).arg(&scale);
        // SAFETY: arguments as declared; lengths checked; shared memory R floats.
        unsafe {
            b.launch(Self::cfg(
                ((s.len / s.block) as u32, 1, 1),
                (s.block / 2).clamp(32, 512) as u32,
                (s.block * 4) as u32,
            ))
        }
        .map_err(drv("sigmoid_gate_hadamard_f32"))?;
        Ok(())
    }

    /// `out = H(rms(o) * w * silu(z))` per row of `s.n` (`w` of `s.n` floats) over `s.len`
    /// values: the GDN output norm and the rotation of ssm_out's input in one launch; `o` is
    /// not written.
    pub fn gated_rms_norm_hadamard(
        &self,
        s: &GatedNormRotation,
        ozw: (&CudaView<'_, f32>, &CudaView<'_, f32>, &CudaView<'_, f32>),
        out: &mut CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        self.gated_rms_norm_hadamard_prep(s, ozw, out, None)
    }

    /// [`Gpu::gated_rms_norm_hadamard`] that, with `prep`, also writes the prepared fp16 copy
    /// of `out`'s rows (ssm_out's input): one launch, no `pn_prepare_x` after it.
    pub fn gated_rms_norm_hadamard_prep(
        &self,
        s: &GatedNormRotation,
        (o, z, w): (&CudaView<'_, f32>, &CudaView<'_, f32>, &CudaView<'_, f32>),
        out: &mut CudaViewMut<'_, f32>,
        prep: Option<RowPrepOut<'_, '_>>,
    ) -> Result<(), KernelError> {
        const OP: &str = "gated_rms_norm_hadamard";
        check(s.refusal().is_none(), OP, || {
            s.refusal().unwrap_or_default()
        })?;
        check(
            o.len() >= s.len && z.len() >= s.len && out.len() >= s.len && w.len() >= s.n,
            OP,
            || {
                format!(
                    "o/z/w/out have {}/{}/{}/{} floats, {s:?} needs {l}/{l}/{}/{l}",
                    o.len(),
                    z.len(),
                    w.len(),
                    out.len(),
                    s.n,
                    l = s.len
                )
            },
        )?;
        let span = s.span();
        if let Some(p) = &prep {
            p.check(OP, s.len, span)?;
        }
        let f = self.func("mixer", "gated_rms_norm_hadamard_f32")?;
        let (n, sp, r, scale) = (
            s.n as i32,
            span as i32,
            s.block as i32,
            rotation_scale(s.block),
        );
        let (null, row_len) = (0u64, prep.as_ref().map_or(0, |p| p.row_len as i32));
        let mut b = self.stream.launch_builder(f);
        b.arg(o).arg(z).arg(w).arg(out).arg(&n).arg(&s.eps);
        b.arg(&sp).arg(&r).arg(&scale);
        match prep {
            Some(p) => b.arg(p.prep.xh).arg(p.prep.e).arg(p.sync),
            None => b.arg(&null).arg(&null).arg(&null),
        };
        b.arg(&row_len);
        // SAFETY: arguments as declared; lengths checked; shared memory span floats. 128
        // threads as gated_rms_norm_f32, so both reduce in the same order.
        unsafe {
            b.launch(Self::cfg(
                ((s.len / span) as u32, 1, 1),
                128,
                (span * 4) as u32,
            ))
        }
        .map_err(drv("gated_rms_norm_hadamard_f32"))?;
        Ok(())
    }

    /// [`Gpu::attention`] whose merge of the splits also applies the output gate and the
    /// rotation: `out = H(attention(q) * sigmoid(g))`, the gate and rotation laid out as `gr`
    /// (`gr.len` the whole output, heads of 256). The partial kernel, then
    /// `attn_combine_gate_hadamard_f32`: two launches for what attention, the gate, a copy and
    /// the rotation took five.
    pub fn attention_gate_hadamard<T: KvElem>(
        &self,
        sq: (&AttnShape, &CudaView<'_, f32>),
        caches: (&CudaView<'_, T>, &CudaView<'_, T>),
        split: SplitK<'_, '_>,
        gate: (&GateRotation, &CudaView<'_, f32>),
        out: &mut CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        self.attention_gate_hadamard_prep(sq, caches, split, gate, (out, None))
    }

    /// [`Gpu::attention_gate_hadamard`] whose merge, with `prep` (rows of `n_head * 256`),
    /// also writes the prepared fp16 copy of each token's output row (the o-projection's
    /// input): still two launches, and no `pn_prepare_x` after them.
    pub fn attention_gate_hadamard_prep<T: KvElem>(
        &self,
        (s, q): (&AttnShape, &CudaView<'_, f32>),
        (kc, vc): (&CudaView<'_, T>, &CudaView<'_, T>),
        split: SplitK<'_, '_>,
        (gr, g): (&GateRotation, &CudaView<'_, f32>),
        (out, prep): (&mut CudaViewMut<'_, f32>, Option<RowPrepOut<'_, '_>>),
    ) -> Result<(), KernelError> {
        const OP: &str = "attention_gate_hadamard";
        if let Some(p) = &prep {
            check(p.row_len == s.n_head * 256, OP, || {
                format!("rows of {} for {} heads of 256", p.row_len, s.n_head)
            })?;
            p.check(OP, gr.len, gr.block)?;
        }
        check(s.refusal_free(gr), OP, || {
            gr.refusal()
                .unwrap_or_else(|| format!("{gr:?} is not the output of {s:?}"))
        })?;
        check(out.len() >= gr.len && g.len() >= gr.gate_len(), OP, || {
            format!(
                "out/g have {}/{} floats, need {}/{}",
                out.len(),
                g.len(),
                gr.len,
                gr.gate_len()
            )
        })?;
        // The output rows the partial kernel's checks see: contiguous, as the rotation reads.
        self.check_attention(OP, s, q.len(), kc, vc, gr.len)?;
        let (n_split, mut part_o, mut part_ml) = self.attention_partials(s, q, (kc, vc), split)?;
        let f = self.func("mixer", "attn_combine_gate_hadamard_f32")?;
        let (ns, nh, gts, ghs) = (
            n_split as i32,
            s.n_head as i32,
            gr.gate_tok_stride as i64,
            gr.gate_head_stride as i64,
        );
        let (r, scale) = (gr.block as i32, rotation_scale(gr.block));
        let null = 0u64;
        let mut b = self.stream.launch_builder(f);
        b.arg(&mut part_o)
            .arg(&mut part_ml)
            .arg(&ns)
            .arg(&nh)
            .arg(g)
            .arg(&gts)
            .arg(&ghs);
        b.arg(out).arg(&r).arg(&scale);
        match prep {
            Some(p) => b.arg(p.prep.xh).arg(p.prep.e).arg(p.sync),
            None => b.arg(&null).arg(&null).arg(&null),
        };
        // SAFETY: arguments as declared; reads the partials written above on the same stream;
        // lengths checked (the copy's too); shared memory R floats.
        unsafe {
            b.launch(Self::cfg(
                ((gr.len / gr.block) as u32, 1, 1),
                (gr.block / 2).clamp(32, 512) as u32,
                (gr.block * 4) as u32,
            ))
        }
        .map_err(drv("attn_combine_gate_hadamard_f32"))?;
        Ok(())
    }
}
