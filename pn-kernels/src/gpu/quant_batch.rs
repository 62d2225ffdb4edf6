//! The small-batch stock GEMVs (`kernels/q4k_batch.cu`): Q4_K and Q8_0 matrices at 2..=8
//! activation rows, each weight byte read once for all rows.

use super::{drv, Gpu, MatrixShape};
use crate::error::{check, KernelError};
use crate::launch::{self, PN_BATCH_MAX_T};
use crate::types::WeightType;
use cudarc::driver::{CudaView, CudaViewMut, PushKernelArg};

impl Gpu {
    /// Whether [`Gpu::gemv_batch`] takes `m` at `t` rows (Q4_K with `k` a multiple of 256, Q8_0
    /// with `k` a multiple of 32, `t` in 2..=8).
    pub fn gemv_batchable(m: MatrixShape, t: usize) -> bool {
        match m.ty {
            WeightType::Q4K => launch::q4_k_batch(t, m.n, m.k).is_some(),
            WeightType::Q8_0 => launch::q8_0_batch(t, m.n, m.k).is_some(),
            _ => false,
        }
    }

    /// `y[r*n..(r+1)*n) = W x_r` for `t` (2..=8) activation rows (`x`: `t * k` floats, row r at
    /// `r * k`) of a Q4_K or Q8_0 matrix: one launch, each weight byte read once for all rows,
    /// row r bit-identical to [`Gpu::gemv`] on row r ([`launch::q4_k_batch`],
    /// [`launch::q8_0_batch`]).
    pub fn gemv_batch(
        &self,
        m: MatrixShape,
        t: usize,
        w: &CudaView<'_, u8>,
        x: &CudaView<'_, f32>,
        y: &mut CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "gemv_batch";
        let MatrixShape { ty, n, k } = m;
        let l = match ty {
            WeightType::Q4K => launch::q4_k_batch(t, n, k),
            WeightType::Q8_0 => launch::q8_0_batch(t, n, k),
            _ => None,
        }
        .ok_or_else(|| KernelError::Shape {
            op: OP,
            what: format!(
                "{} {n} x {k} at {t} rows: the batch kernels take q4_K (k a multiple of 256) and q8_0 (of 32) for t in 2..={PN_BATCH_MAX_T}",
                ty.name()
            ),
        })?;
        let row_bytes = ty.row_bytes(k).ok_or_else(|| KernelError::Shape {
            op: OP,
            what: format!("k = {k} is not a multiple of {}", ty.block_elems()),
        })?;
        check(w.len() >= n * row_bytes, OP, || {
            format!("weight has {} bytes, needs {}", w.len(), n * row_bytes)
        })?;
        check(x.len() >= t * k && y.len() >= t * n, OP, || {
            format!(
                "x has {} (t * k = {}), y has {} (t * n = {})",
                x.len(),
                t * k,
                y.len(),
                t * n
            )
        })?;
        self.check_align(OP, "weight", w, if ty == WeightType::Q4K { 16 } else { 4 })?;
        self.check_align(OP, "x", x, 16)?;
        let name = l.launch.kernel;
        let f = self.func("q4k_batch", name)?;
        let (n_i, k_i, s_i) = (n as i32, k as i32, l.chunk_sbs as i32);
        let mut b = self.stream.launch_builder(f);
        b.arg(w).arg(x).arg(y).arg(&n_i).arg(&k_i);
        if ty == WeightType::Q4K {
            b.arg(&s_i);
        }
        // SAFETY: (w, x, y, N, K[, S]) as declared in q4k_batch.cu; lengths checked; geometry
        // and shared memory (t * S KB <= 16 KB) from launch::q4_k_batch / q8_0_batch.
        let c = Self::cfg((l.launch.grid, 1, 1), l.launch.threads, l.launch.smem);
        unsafe { b.launch(c) }.map_err(drv(name))?;
        Ok(())
    }
}
