//! The grouped Q8_0 GEMV (`q8_0_gemv_group` in `kernels/q8_group.cu`): the Q8_0 matrices that
//! read one f32 x in one launch ([`crate::q8_group::q8_group`]).

use super::{drv, Gpu, GroupMat, MatrixShape};
use crate::error::{check, KernelError};
use crate::q8_group::{q8_group, Q8GroupLaunch, Q8_GROUP_MAX};
use crate::types::WeightType;
use cudarc::driver::{CudaView, DevicePtr, DevicePtrMut, PushKernelArg};

/// `Q8Group` of q8_group.cu, passed by value (device addresses as u64).
#[repr(C)]
#[derive(Clone, Copy)]
struct Q8GroupArg {
    w: [u64; Q8_GROUP_MAX],
    y: [u64; Q8_GROUP_MAX],
    n: [i32; Q8_GROUP_MAX],
    first: [i32; Q8_GROUP_MAX + 1],
    count: i32,
}

// SAFETY: plain old data with the C layout of Q8Group.
unsafe impl cudarc::driver::DeviceRepr for Q8GroupArg {}

impl Gpu {
    /// Whether [`Gpu::q8_0_gemv_group`] takes these matrices: 2..=4 Q8_0 matrices of one K
    /// ([`q8_group`]).
    pub fn q8_groupable(mats: &[MatrixShape]) -> bool {
        Self::q8_group_launch(mats).is_some()
    }

    fn q8_group_launch(mats: &[MatrixShape]) -> Option<Q8GroupLaunch> {
        let k = mats.first()?.k;
        if !mats.iter().all(|m| m.ty == WeightType::Q8_0 && m.k == k) {
            return None;
        }
        let rows: Vec<usize> = mats.iter().map(|m| m.n).collect();
        q8_group(&rows, k)
    }

    /// `y = W x` for every member (Q8_0, one K) in one launch; member i gets the bits of
    /// [`Gpu::gemv`] on its own (`q8_0_gemv_f32`), each weight byte and x read once per block.
    pub fn q8_0_gemv_group(
        &self,
        mats: &mut [GroupMat<'_, '_>],
        x: &CudaView<'_, f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "q8_0_gemv_group";
        const K: &str = "q8_0_gemv_group";
        let shapes: Vec<MatrixShape> = mats.iter().map(|m| m.m).collect();
        let g = Self::q8_group_launch(&shapes).ok_or_else(|| KernelError::Shape {
            op: OP,
            what: format!("{shapes:?} cannot share one launch"),
        })?;
        let k = shapes[0].k;
        check(x.len() >= k, OP, || format!("x has {}, k = {k}", x.len()))?;
        let mut arg = Q8GroupArg {
            w: [0; Q8_GROUP_MAX],
            y: [0; Q8_GROUP_MAX],
            n: [0; Q8_GROUP_MAX],
            first: [0; Q8_GROUP_MAX + 1],
            count: mats.len() as i32,
        };
        let row_bytes = k / 32 * 34;
        let mut guards = Vec::with_capacity(2 * mats.len());
        for (i, gm) in mats.iter_mut().enumerate() {
            let n = gm.m.n;
            check(gm.w.len() >= n * row_bytes && gm.y.len() >= n, OP, || {
                format!(
                    "member {i}: weight {} bytes, y {} for {n} rows of {row_bytes} bytes",
                    gm.w.len(),
                    gm.y.len()
                )
            })?;
            self.check_align(OP, "weight", gm.w, 4)?;
            let (wp, gw) = gm.w.device_ptr(&self.stream);
            let (yp, gy) = gm.y.device_ptr_mut(&self.stream);
            guards.push(gw);
            guards.push(gy);
            arg.w[i] = wp;
            arg.y[i] = yp;
            arg.n[i] = n as i32;
        }
        for (slot, f) in arg.first.iter_mut().zip(&g.first) {
            *slot = *f;
        }
        let f = self.func("q8_group", K)?;
        let k_i = k as i32;
        let mut b = self.stream.launch_builder(f);
        b.arg(&arg).arg(x).arg(&k_i);
        // SAFETY: (Q8Group, x, K) as declared; every member's weights and output checked;
        // geometry from q8_group (x staged in `smem` bytes).
        unsafe { b.launch(Self::cfg((g.grid, 1, 1), g.threads, g.smem)) }.map_err(drv(K))?;
        drop(guards);
        Ok(())
    }
}
