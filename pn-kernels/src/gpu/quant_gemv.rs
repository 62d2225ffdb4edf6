//! Matrix-vector products over stock weight types (`kernels/quant_gemv.cu`: f32, f16, q8_0,
//! q4_K); PN types are passed on to [`Gpu::pn_gemv`] (`kernels/pn_gemv.cu`).

use super::{drv, Gpu, MatrixShape};
use crate::error::{check, KernelError};
use crate::types::{PnPrecision, WeightType};
use cudarc::driver::{CudaView, CudaViewMut, PushKernelArg};

impl Gpu {
    /// `y[0..n) = W x` for stock types (F32, F16, Q8_0, Q4_K); dispatches PN types to
    /// [`Gpu::pn_gemv`] with `Half2`.
    pub fn gemv(
        &self,
        m: MatrixShape,
        w: &CudaView<'_, u8>,
        x: &CudaView<'_, f32>,
        y: &mut CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "gemv";
        let MatrixShape { ty, n, k } = m;
        let name = match ty {
            WeightType::Pn3t | WeightType::Pn4t => {
                return self.pn_gemv(m, PnPrecision::Half2, w, x, y)
            }
            WeightType::F32 => "f32_gemv_f32",
            WeightType::F16 => "f16_gemv_f32",
            WeightType::Q8_0 => "q8_0_gemv_f32",
            WeightType::Q4K => "q4_k_gemv_f32",
            WeightType::Q3K => {
                return Err(KernelError::Shape {
                    op: OP,
                    what: "no q3_K matrix-vector kernel (q3_K is only the embedding)".into(),
                })
            }
        };
        let row_bytes = ty.row_bytes(k).ok_or_else(|| KernelError::Shape {
            op: OP,
            what: format!("k = {k} is not a multiple of {}", ty.block_elems()),
        })?;
        check(
            k.is_multiple_of(4) && n > 0 && n <= i32::MAX as usize,
            OP,
            || format!("k = {k} must be a multiple of 4, n = {n} positive"),
        )?;
        check(w.len() >= n * row_bytes, OP, || {
            format!("weight has {} bytes, needs {}", w.len(), n * row_bytes)
        })?;
        check(x.len() >= k && y.len() >= n, OP, || {
            format!("x has {} (k = {k}), y has {} (n = {n})", x.len(), y.len())
        })?;
        self.check_align(OP, "weight", w, if ty == WeightType::Q4K { 16 } else { 4 })?;
        self.check_align(OP, "x", x, 16)?;
        // Q4_K stages x in shared memory and loops over rows (launch::q4_k); the others take
        // one warp per row.
        let (grid, smem) = if ty == WeightType::Q4K {
            let l = crate::launch::q4_k(n, k).ok_or_else(|| KernelError::Shape {
                op: OP,
                what: format!(
                    "k = {k} exceeds {}, the shared-memory limit of the q4_K kernel",
                    crate::launch::Q4K_MAX_K
                ),
            })?;
            (l.grid, l.smem)
        } else {
            (n.div_ceil(8) as u32, 0)
        };
        let f = self.func("quant_gemv", name)?;
        let (n_i, k_i) = (n as i32, k as i32);
        let mut b = self.stream.launch_builder(f);
        b.arg(w).arg(x).arg(y).arg(&n_i).arg(&k_i);
        // SAFETY: (w, x, y, N, K) as declared; lengths checked; q4_K's shared memory K floats.
        unsafe { b.launch(Self::cfg((grid, 1, 1), 256, smem)) }.map_err(drv(name))?;
        Ok(())
    }
}
