//! The fused producer-and-projection ops ([`crate::Backend::norm_hadamard_matmul`],
//! [`crate::Backend::swiglu_hadamard_matmul`]) on the device: where every matrix reads the
//! prepared fp16 input (PN at 1..=8 rows), one kernel (`kernels/fuse.cu`) does the residual add,
//! the norm or SwiGLU, the rotation and the fp16 copy, and the matrices read that copy (no
//! `pn_prepare_x` launch, no separate add); elsewhere the trait defaults' unfused sequence.

use super::error::CudaError;
use super::weight::MatDesc;
use super::{lock, view, view_mut, CudaBackend, CudaBuf, CudaWeight, PN_H2_MAX_K};
use crate::fused::{norm_hadamard_matmul_default, swiglu_hadamard_matmul_default};
use crate::{ModelError, NormIn, NormRot, SwigluRot};
use pn_kernels::launch::PN_BATCH_MAX_T;
use pn_kernels::{FusedRows, Gpu, NormShape, NormX, PreparedOut};

/// Most matrices one fused op takes (the GDN input projections are 4).
const MAX_OUTS: usize = 8;

/// The launch plan's view of `outs` (without allocating), `None` past [`MAX_OUTS`].
fn descs(outs: &[(&CudaWeight, &mut CudaBuf)]) -> Option<([MatDesc; MAX_OUTS], usize)> {
    let first = outs.first()?.0.desc();
    if outs.len() > MAX_OUTS {
        return None;
    }
    let mut d = [first; MAX_OUTS];
    for (slot, (w, _)) in d.iter_mut().zip(outs) {
        *slot = w.desc();
    }
    Some((d, outs.len()))
}

/// Whether [`CudaBackend::fused_norm_matmul`] takes the fused kernel for `rows` rows of `n`
/// rotated in blocks of `block` feeding `mats` (else the unfused sequence).
pub(crate) fn norm_fuses(rows: usize, n: usize, block: usize, mats: &[MatDesc]) -> bool {
    n <= Gpu::RMS_NORM_HADAMARD_MAX_N && swiglu_fuses(rows, n, block, mats)
}

/// Whether [`CudaBackend::fused_swiglu_matmul`] takes the fused kernel.
pub(crate) fn swiglu_fuses(rows: usize, n: usize, block: usize, mats: &[MatDesc]) -> bool {
    Gpu::rotation_fits(n, block)
        && n.is_multiple_of(16)
        && mats.first().is_some_and(|m| m.cols == n)
        && CudaBackend::all_read_prepared(rows, mats)
}

impl CudaBackend {
    /// [`crate::Backend::norm_hadamard_matmul`].
    pub(super) fn fused_norm_matmul(
        &self,
        x: NormIn<'_, CudaBuf>,
        norm: &NormRot<'_, CudaBuf>,
        rot: &mut CudaBuf,
        outs: &mut [(&CudaWeight, &mut CudaBuf)],
    ) -> Result<(), ModelError> {
        const OP: &str = "norm_hadamard_matmul";
        let NormRot {
            w,
            rows,
            n,
            eps,
            block,
        } = *norm;
        let fits = descs(outs).is_some_and(|(d, m)| norm_fuses(rows, n, block, &d[..m]));
        if !fits {
            return norm_hadamard_matmul_default(self, x, norm, rot, outs);
        }
        {
            let mut guard = lock(&self.scratch);
            let sc = &mut *guard;
            let xh = self.grow(&mut sc.xh, PN_H2_MAX_K.max(rows * n), "fp16 activations")?;
            let e = self.grow(&mut sc.e, PN_BATCH_MAX_T, "activation exponents")?;
            let (mut xhm, mut em) = (xh.slice_mut(0..rows * n), e.slice_mut(0..rows));
            let prep = PreparedOut {
                xh: &mut xhm,
                e: &mut em,
            };
            let wv = view(OP, w, 0, n)?;
            let mut rv = view_mut(OP, rot, 0, rows * n)?;
            let g = FusedRows { rows, n, r: block };
            let shape = NormShape { n, eps };
            let (xv, mut xm, av);
            let input = match x {
                NormIn::Plain(x) => {
                    xv = view(OP, x, 0, rows * n)?;
                    NormX::Plain(&xv)
                }
                NormIn::AddFirst { x, add } => {
                    av = view(OP, add, 0, rows * n)?;
                    xm = view_mut(OP, x, 0, rows * n)?;
                    NormX::AddFirst(&mut xm, &av)
                }
            };
            self.gpu
                .add_rms_norm_hadamard_prep(input, &mut rv, (&wv, shape), g, Some(prep))
                .map_err(CudaError::from)?;
        }
        Ok(self.try_matmul_from(rot, rows, outs, true)?)
    }

    /// [`crate::Backend::swiglu_hadamard_matmul`].
    pub(super) fn fused_swiglu_matmul(
        &self,
        s: &SwigluRot<'_, CudaBuf>,
        out: &mut CudaBuf,
        outs: &mut [(&CudaWeight, &mut CudaBuf)],
    ) -> Result<(), ModelError> {
        const OP: &str = "swiglu_hadamard_matmul";
        let SwigluRot {
            gate,
            up,
            rows,
            n,
            block,
        } = *s;
        let fits = descs(outs).is_some_and(|(d, m)| swiglu_fuses(rows, n, block, &d[..m]));
        if !fits {
            return swiglu_hadamard_matmul_default(self, s, out, outs);
        }
        {
            let mut guard = lock(&self.scratch);
            let sc = &mut *guard;
            let xh = self.grow(&mut sc.xh, PN_H2_MAX_K.max(rows * n), "fp16 activations")?;
            let e = self.grow(&mut sc.e, PN_BATCH_MAX_T, "activation exponents")?;
            let (mut xhm, mut em) = (xh.slice_mut(0..rows * n), e.slice_mut(0..rows));
            let prep = PreparedOut {
                xh: &mut xhm,
                e: &mut em,
            };
            let gv = view(OP, gate, 0, rows * n)?;
            let uv = view(OP, up, 0, rows * n)?;
            let mut ov = view_mut(OP, out, 0, rows * n)?;
            let g = FusedRows { rows, n, r: block };
            self.gpu
                .swiglu_hadamard_prep((&gv, &uv), &mut ov, g, Some(prep))
                .map_err(CudaError::from)?;
        }
        Ok(self.try_matmul_from(out, rows, outs, true)?)
    }
}
