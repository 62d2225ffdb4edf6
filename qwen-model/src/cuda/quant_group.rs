//! The grouped Q8_0 GEMV on the device (`kernels/q8_group.cu`): where one row goes through 2..=4
//! Q8_0 matrices of one K (the GDN's ssm_alpha and ssm_beta, which read the same normed x), one
//! launch for all of them, each output with the bits of its own `q8_0_gemv_f32` launch.

use super::error::CudaError;
use super::weight::MatDesc;
use super::{view_mut, CudaBackend, CudaBuf, CudaWeight};
use pn_kernels::cudarc::driver::CudaView;
use pn_kernels::{Gpu, GroupMat, MatrixShape, WeightType};

/// Whether [`CudaBackend::try_matmul_from`](super::CudaBackend) runs `mats` at `rows` rows as
/// one grouped Q8_0 launch (also what [`super::LaunchCounter`] counts with).
pub(crate) fn q8_grouped(rows: usize, mats: &[MatDesc]) -> bool {
    if rows != 1 || mats.len() < 2 || mats.iter().any(|m| m.ty != WeightType::Q8_0) {
        return false;
    }
    let shapes: Vec<MatrixShape> = mats
        .iter()
        .map(|m| MatrixShape {
            ty: m.ty,
            n: m.rows,
            k: m.cols,
        })
        .collect();
    Gpu::q8_groupable(&shapes)
}

impl CudaBackend {
    /// `y = x W^T` for every `(W, y)` of `outs` ([`q8_grouped`] holds), one launch.
    pub(super) fn try_q8_group(
        &self,
        x: &CudaView<'_, f32>,
        outs: &mut [(&CudaWeight, &mut CudaBuf)],
    ) -> Result<(), CudaError> {
        const OP: &str = "matmul";
        let ws: Vec<&CudaWeight> = outs.iter().map(|(w, _)| *w).collect();
        let wvs: Vec<_> = ws.iter().map(|w| w.bytes.slice(..)).collect();
        let mut yvs = outs
            .iter_mut()
            .map(|(w, y)| view_mut(OP, y, 0, w.rows))
            .collect::<Result<Vec<_>, _>>()?;
        let mut mats: Vec<GroupMat<'_, '_>> = ws
            .iter()
            .zip(&wvs)
            .zip(yvs.iter_mut())
            .map(|((w, wv), y)| GroupMat {
                m: MatrixShape {
                    ty: w.ty,
                    n: w.rows,
                    k: w.cols,
                },
                w: wv,
                y,
            })
            .collect();
        self.gpu
            .q8_0_gemv_group(&mut mats, x)
            .map_err(|e| CudaError::Driver {
                op: format!(
                    "grouped Q8_0 matmul of `{}` and {} more",
                    ws[0].name,
                    ws.len() - 1
                ),
                msg: e.to_string(),
            })
    }
}
