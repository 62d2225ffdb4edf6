//! The mixers' output projections on the device ([`crate::Backend::mixer_out_matmul`]): the
//! attention merge + gate + rotation, or the GDN gated norm + rotation, writes the PN
//! projection's prepared fp16 input itself (`kernels/mixer.cu` with `xh`), so the projection
//! runs without a `pn_prepare_x` launch; elsewhere the trait default's two ops.

use super::attention::attention_preps;
use super::mixer::gate_rotation;
use super::weight::MatDesc;
use super::{lock, view, view_mut, CudaBackend, CudaBuf, CudaWeight, PN_H2_MAX_K, SYNC_WORDS};
use crate::backend::mixer_proj;
use crate::{GatedNormShape, MixerOut, ModelError, RotatedOut};
use pn_kernels::launch::PN_BATCH_MAX_T;
use pn_kernels::{GatedNormRotation, PreparedOut, RowPrepOut};

/// The kernel shape of a [`GatedNormShape`].
pub(crate) fn gated_rotation(sh: &GatedNormShape) -> GatedNormRotation {
    GatedNormRotation {
        len: sh.len,
        n: sh.n,
        eps: sh.eps,
        block: sh.block,
    }
}

/// Whether the fused gated norm + rotation (`fused_gated_rms_norm_hadamard`) takes `sh`.
pub(crate) fn gated_norm_fuses(sh: &GatedNormShape) -> bool {
    sh.len > 0 && super::mixer::gated_norm_rotation(sh).is_some()
}

/// Whether `mats` at `rows` rows of `row_len` read the prepared fp16 input a mixer kernel can
/// write (the matrices' K is the row, at most the small-batch rows).
pub(crate) fn reads_mixer_prep(rows: usize, row_len: usize, mats: &[MatDesc]) -> bool {
    rows <= PN_BATCH_MAX_T
        && mats.first().is_some_and(|m| m.cols == row_len)
        && CudaBackend::all_read_prepared(rows, mats)
}

/// Whether [`CudaBackend::fused_mixer_out_matmul`] has the producer of `src` write the fp16
/// copy for `mats` (the same predicate counts its launches in [`super::LaunchCounter`]).
pub(crate) fn mixer_out_preps<B: crate::Backend + ?Sized>(
    src: &MixerOut<'_, B>,
    block: usize,
    rows: usize,
    mats: &[MatDesc],
) -> bool {
    match src {
        MixerOut::GatedNorm { shape, .. } => {
            let row_len = shape.len / rows.max(1);
            gated_norm_fuses(shape)
                && shape.len == rows * row_len
                && row_len.is_multiple_of(gated_rotation(shape).span())
                && reads_mixer_prep(rows, row_len, mats)
        }
        MixerOut::Attention(a) => {
            let n = a.positions.len();
            let gr = gate_rotation(&a.g, n, block);
            let row_len = a.layout.n_q_heads * super::HEAD_DIM;
            n == rows
                && a.g.head_dim == super::HEAD_DIM
                && attention_preps(n, a.layout.n_q_heads, &gr)
                && reads_mixer_prep(rows, row_len, mats)
        }
    }
}

impl CudaBackend {
    /// [`crate::Backend::mixer_out_matmul`].
    pub(super) fn fused_mixer_out_matmul(
        &self,
        src: MixerOut<'_, Self>,
        o: RotatedOut<'_, CudaBuf>,
        rows: usize,
        outs: &mut [(&CudaWeight, &mut CudaBuf)],
    ) -> Result<(), ModelError> {
        const OP: &str = "mixer_out_matmul";
        let descs: Vec<MatDesc> = outs.iter().map(|(w, _)| w.desc()).collect();
        if rows == 0 || !mixer_out_preps(&src, o.block, rows, &descs) {
            return mixer_proj::mixer_out_matmul(self, src, o, rows, outs);
        }
        match src {
            MixerOut::GatedNorm { x, z, w, shape } => {
                let s = gated_rotation(&shape);
                let row_len = shape.len / rows;
                let mut guard = lock(&self.scratch);
                let sc = &mut *guard;
                let xh = self.grow(&mut sc.xh, PN_H2_MAX_K.max(shape.len), "fp16 activations")?;
                let e = self.grow(&mut sc.e, PN_BATCH_MAX_T, "activation exponents")?;
                let sy = self.grow(&mut sc.sync, SYNC_WORDS, "cross-block sync words")?;
                let (mut xhm, mut em) = (xh.slice_mut(0..shape.len), e.slice_mut(0..rows));
                let mut syn = sy.slice_mut(0..2 * rows);
                let prep = RowPrepOut {
                    prep: PreparedOut {
                        xh: &mut xhm,
                        e: &mut em,
                    },
                    sync: &mut syn,
                    row_len,
                };
                let (xv, zv, wv) = (
                    view(OP, x, 0, s.len)?,
                    view(OP, z, 0, s.len)?,
                    view(OP, w, 0, s.n)?,
                );
                let mut ov = view_mut(OP, o.out, 0, s.len)?;
                self.gpu
                    .gated_rms_norm_hadamard_prep(&s, (&xv, &zv, &wv), &mut ov, Some(prep))
                    .map_err(super::CudaError::from)?;
            }
            MixerOut::Attention(a) => {
                let gr = gate_rotation(&a.g, rows, o.block);
                let call = (a.q, a.k_cache, a.v_cache);
                let at = (a.layout, a.positions.clone());
                let gate = (a.gate, a.g.offset, gr);
                let done = self.try_attention_gate_hadamard(call, at, gate, (&mut *o.out, true))?;
                if done.is_none() {
                    return Err(
                        super::shape_error(OP, "the fused merge refused its shape".into()).into(),
                    );
                }
            }
        }
        Ok(self.try_matmul_from(o.out, rows, outs, true)?)
    }
}
