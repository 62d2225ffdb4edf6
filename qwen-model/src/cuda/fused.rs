//! The fused producer-and-projection ops ([`crate::Backend::norm_matmul`],
//! [`crate::Backend::swiglu_hadamard_matmul`]) on the device: where every rotated matrix reads
//! the prepared fp16 input (PN at 1..=8 rows), one kernel (`kernels/fuse.cu`) does the residual
//! add, the norm or SwiGLU, the rotation and the fp16 copy (and, for a norm, the unrotated rows
//! its stock matrices read), and the matrices read that copy (no `pn_prepare_x` launch, no
//! separate add or second norm); a residual add before an unrotated norm alone (the final norm
//! before the Q4_K head) is one launch of the same kernel; elsewhere the trait defaults' unfused
//! sequence.

use super::error::CudaError;
use super::weight::MatDesc;
use super::{lock, view, view_mut, CudaBackend, CudaBuf, CudaWeight, PN_H2_MAX_K};
use crate::fused::{norm_matmul_default, swiglu_hadamard_matmul_default};
use crate::{Backend, ModelError, NormDest, NormIn, NormRot, SwigluRot};
use pn_kernels::launch::PN_BATCH_MAX_T;
use pn_kernels::{FusedRows, Gpu, NormOutputs, NormShape, NormX, PreparedOut};

/// Most matrices one fused op takes (the GDN input projections are 4).
const MAX_OUTS: usize = 8;

/// Whether the fused norm kernel takes `rows` rows of `n` rotated in blocks of `block` feeding
/// the rotated matrices `mats` (writing their fp16 input).
pub(crate) fn norm_fuses(rows: usize, n: usize, block: usize, mats: &[MatDesc]) -> bool {
    n <= Gpu::RMS_NORM_HADAMARD_MAX_N && swiglu_fuses(rows, n, block, mats)
}

/// How [`CudaBackend::fused_norm_matmul`] runs a [`crate::Backend::norm_matmul`] call (the
/// dispatch and the launch counter both ask [`norm_plan`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NormPlan {
    /// One `add_rms_norm_hadamard_prep_f32` launch: the add, the rotated rows and their fp16
    /// copy (read by the rotated matrices without a conversion), and the unrotated rows when
    /// asked; then the matrices.
    Prepared,
    /// One launch of the same kernel writing the unrotated rows alone (the residual add fused
    /// into a norm nothing rotated reads); then the matrices.
    AddPlain,
    /// The trait default's ops.
    Unfused,
}

/// The plan for a norm of `rows` rows of `n` (rotation block `block`) taking the residual add
/// (`add`), with rotated matrices `rot` (their shapes) and/or unrotated rows (`plain`).
pub(crate) fn norm_plan(
    (add, rows, n, block): (bool, usize, usize, usize),
    rot: Option<&[MatDesc]>,
    plain: bool,
) -> NormPlan {
    match rot {
        Some(m) if norm_fuses(rows, n, block, m) => NormPlan::Prepared,
        None if add && plain && rows > 0 && n <= Gpu::RMS_NORM_HADAMARD_MAX_N => NormPlan::AddPlain,
        _ => NormPlan::Unfused,
    }
}

/// [`norm_plan`] of a [`crate::Backend::norm_matmul`] call's arguments.
pub(crate) fn norm_plan_of<Buf, W: Described>(
    x: &NormIn<'_, Buf>,
    norm: &NormRot<'_, Buf>,
    rot: Option<&NormDest<'_, '_, Buf, W>>,
    plain: bool,
) -> NormPlan {
    let add = matches!(x, NormIn::AddFirst { .. });
    let shape = (add, norm.rows, norm.n, norm.block);
    let Some(r) = rot else {
        return norm_plan(shape, None, plain);
    };
    // More matrices than one launch plan holds: the unfused ops.
    match descs_of(&*r.outs) {
        Some((d, m)) => norm_plan(shape, Some(&d[..m]), plain),
        None => NormPlan::Unfused,
    }
}

/// A weight whose launch-plan shape is known (the device's, the launch counter's).
pub(crate) trait Described {
    /// Its launch-plan shape.
    fn mat_desc(&self) -> MatDesc;
}

impl Described for CudaWeight {
    fn mat_desc(&self) -> MatDesc {
        self.desc()
    }
}

/// The launch plan's view of `outs` (without allocating), `None` when empty or past
/// [`MAX_OUTS`].
pub(crate) fn descs_of<W: Described, Buf>(
    outs: &[(&W, &mut Buf)],
) -> Option<([MatDesc; MAX_OUTS], usize)> {
    let first = outs.first()?.0.mat_desc();
    if outs.len() > MAX_OUTS {
        return None;
    }
    let mut d = [first; MAX_OUTS];
    for (slot, (w, _)) in d.iter_mut().zip(outs) {
        *slot = w.mat_desc();
    }
    Some((d, outs.len()))
}

/// [`swiglu_fuses`] of a [`crate::Backend::swiglu_hadamard_matmul`] call's arguments (more
/// matrices than one launch plan holds: not fused).
pub(crate) fn swiglu_fuses_of<Buf, W: Described>(
    s: &SwigluRot<'_, Buf>,
    outs: &[(&W, &mut Buf)],
) -> bool {
    descs_of(outs).is_some_and(|(d, m)| swiglu_fuses(s.rows, s.n, s.block, &d[..m]))
}

/// Whether [`CudaBackend::fused_swiglu_matmul`] takes the fused kernel.
pub(crate) fn swiglu_fuses(rows: usize, n: usize, block: usize, mats: &[MatDesc]) -> bool {
    Gpu::rotation_fits(n, block)
        && n.is_multiple_of(16)
        && mats.first().is_some_and(|m| m.cols == n)
        && CudaBackend::all_read_prepared(rows, mats)
}

impl CudaBackend {
    /// [`crate::Backend::norm_matmul`], as [`norm_plan`] says.
    pub(super) fn fused_norm_matmul(
        &self,
        x: NormIn<'_, CudaBuf>,
        norm: &NormRot<'_, CudaBuf>,
        rot: Option<NormDest<'_, '_, CudaBuf, CudaWeight>>,
        plain: Option<NormDest<'_, '_, CudaBuf, CudaWeight>>,
    ) -> Result<(), ModelError> {
        const OP: &str = "norm_matmul";
        let plan = norm_plan_of(&x, norm, rot.as_ref(), plain.is_some());
        if plan == NormPlan::Unfused {
            return norm_matmul_default(self, x, norm, rot, plain);
        }
        let NormRot {
            w,
            rows,
            n,
            eps,
            block,
        } = *norm;
        // The destinations taken apart (no matrices where none is given).
        let (mut rot_buf, rot_outs) = match rot {
            Some(NormDest { buf, outs }) => (Some(buf), outs),
            None => (None, Default::default()),
        };
        let (mut plain_buf, plain_outs) = match plain {
            Some(NormDest { buf, outs }) => (Some(buf), outs),
            None => (None, Default::default()),
        };
        {
            let mut guard = lock(&self.scratch);
            let sc = &mut *guard;
            let (mut xhm, mut em);
            let prep = if plan == NormPlan::Prepared {
                let xh = self.grow(&mut sc.xh, PN_H2_MAX_K.max(rows * n), "fp16 activations")?;
                let e = self.grow(&mut sc.e, PN_BATCH_MAX_T, "activation exponents")?;
                (xhm, em) = (xh.slice_mut(0..rows * n), e.slice_mut(0..rows));
                Some(PreparedOut {
                    xh: &mut xhm,
                    e: &mut em,
                })
            } else {
                None
            };
            let wv = view(OP, w, 0, n)?;
            let mut rv = match rot_buf.as_deref_mut() {
                Some(b) => Some(view_mut(OP, b, 0, rows * n)?),
                None => None,
            };
            let mut pv = match plain_buf.as_deref_mut() {
                Some(b) => Some(view_mut(OP, b, 0, rows * n)?),
                None => None,
            };
            let out = NormOutputs {
                rot: rv.as_mut(),
                prep,
                plain: pv.as_mut(),
            };
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
                .add_rms_norm_hadamard_prep(input, out, (&wv, shape), g)
                .map_err(CudaError::from)?;
        }
        if let Some(r) = rot_buf {
            self.try_matmul_from(r, rows, rot_outs, true)?;
        }
        if let Some(p) = plain_buf {
            if !plain_outs.is_empty() {
                self.matmul(p, rows, plain_outs)?;
            }
        }
        Ok(())
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
        if !swiglu_fuses_of(s, outs) {
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
