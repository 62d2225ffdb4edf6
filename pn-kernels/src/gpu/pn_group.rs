//! The grouped PN GEMV (`pn_gemv_h2p_group` in `kernels/pn_gemv.cu`): the matrices that read
//! one prepared x in one launch ([`launch::pn_group`]).

use super::{drv, Gpu, MatrixShape};
use crate::error::{check, KernelError};
use crate::launch::{self, PN_GROUP_MAX};
use cudarc::driver::{CudaView, CudaViewMut, DevicePtr, DevicePtrMut, PushKernelArg};

/// `PnGroup` of pn_gemv.cu, passed by value (device addresses as u64).
#[repr(C)]
#[derive(Clone, Copy)]
struct GroupArg {
    w: [u64; PN_GROUP_MAX],
    y: [u64; PN_GROUP_MAX],
    n: [i32; PN_GROUP_MAX],
    kind: [i32; PN_GROUP_MAX],
    first: [i32; PN_GROUP_MAX + 1],
    count: i32,
}

// SAFETY: plain old data with the C layout of PnGroup.
unsafe impl cudarc::driver::DeviceRepr for GroupArg {}

/// One matrix of a grouped launch and its output (`m.n` values).
pub struct GroupMat<'a, 'b> {
    /// Shape and type (PN, one K for the group).
    pub m: MatrixShape,
    /// The matrix bytes.
    pub w: &'a CudaView<'b, u8>,
    /// Its output.
    pub y: &'a mut CudaViewMut<'b, f32>,
}

impl Gpu {
    /// Whether [`Gpu::pn_gemv_group`] takes these matrices (2..=4 PN matrices of one K whose
    /// own prepared launches are even-block kernels of one block size).
    pub fn pn_groupable(mats: &[MatrixShape]) -> bool {
        Self::group_launch(mats).is_some()
    }

    fn group_launch(mats: &[MatrixShape]) -> Option<launch::GroupLaunch> {
        let k = mats.first()?.k;
        let members: Option<Vec<(u32, usize)>> = mats
            .iter()
            .map(|m| {
                let bits = match m.ty {
                    crate::WeightType::Pn3t => 3,
                    crate::WeightType::Pn4t => 4,
                    _ => return None,
                };
                (m.k == k).then_some((bits, m.n))
            })
            .collect();
        launch::pn_group(&members?, k, None)
    }

    /// `y = W x` for every member from the x that [`Gpu::pn_prepare_x`] converted (`xh`: `k`
    /// fp16 values, `e[0]`), in one launch; member i gets the bits of
    /// [`Gpu::pn_gemv_prepared`] on its own.
    pub fn pn_gemv_group(
        &self,
        mats: &mut [GroupMat<'_, '_>],
        (xh, e): (&CudaView<'_, half::f16>, &CudaView<'_, i32>),
    ) -> Result<(), KernelError> {
        const OP: &str = "pn_gemv_group";
        const K: &str = "pn_gemv_h2p_group";
        let shapes: Vec<MatrixShape> = mats.iter().map(|m| m.m).collect();
        let g = Self::group_launch(&shapes).ok_or_else(|| KernelError::Shape {
            op: OP,
            what: format!("{shapes:?} cannot share one launch"),
        })?;
        let k = shapes[0].k;
        check(xh.len() >= k && !e.is_empty(), OP, || {
            format!("xh has {}, e {} for k = {k}", xh.len(), e.len())
        })?;
        self.check_align(OP, "xh", xh, 16)?;
        let mut arg = GroupArg {
            w: [0; PN_GROUP_MAX],
            y: [0; PN_GROUP_MAX],
            n: [0; PN_GROUP_MAX],
            kind: [0; PN_GROUP_MAX],
            first: [0; PN_GROUP_MAX + 1],
            count: mats.len() as i32,
        };
        let mut guards = Vec::with_capacity(2 * mats.len());
        for (i, gm) in mats.iter_mut().enumerate() {
            self.pn_check(OP, gm.m, gm.w, gm.y.len())?;
            let (wp, gw) = gm.w.device_ptr(&self.stream);
            let (yp, gy) = gm.y.device_ptr_mut(&self.stream);
            guards.push(gw);
            guards.push(gy);
            arg.w[i] = wp;
            arg.y[i] = yp;
            arg.n[i] = gm.m.n as i32;
            arg.kind[i] = g.kinds[i];
        }
        for (slot, f) in arg.first.iter_mut().zip(&g.first) {
            *slot = *f;
        }
        let f = self.func("pn_gemv", K)?;
        let k_i = k as i32;
        let mut b = self.stream.launch_builder(f);
        b.arg(&arg).arg(xh).arg(e).arg(&k_i);
        // SAFETY: (PnGroup, xh, e, K) as declared; every member checked by pn_check (weights
        // and output long enough); geometry from launch::pn_group.
        unsafe { b.launch(Self::cfg((g.grid, 1, 1), g.threads, g.smem)) }.map_err(drv(K))?;
        drop(guards);
        Ok(())
    }
}
