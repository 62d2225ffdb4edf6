//! Prefill matrix products over every weight type (`kernels/matmul.cu`: 64 x 64 output tiles).

use super::{drv, Gpu, MatrixShape, RowStrides};
use crate::error::{check, KernelError};
use crate::types::WeightType;
use cudarc::driver::{CudaView, CudaViewMut, PushKernelArg};

impl Gpu {
    /// Prefill product `Y[t][n] = sum_k X[t][k] W[n][k]` for `t < rows.rows` tokens, X rows
    /// `rows.x_stride` and Y rows `rows.y_stride` floats apart.
    pub fn matmul(
        &self,
        m: MatrixShape,
        w: &CudaView<'_, u8>,
        x: &CudaView<'_, f32>,
        y: &mut CudaViewMut<'_, f32>,
        rows: RowStrides,
    ) -> Result<(), KernelError> {
        const OP: &str = "matmul";
        let MatrixShape { ty, n, k } = m;
        let RowStrides {
            rows: t_len,
            x_stride,
            y_stride,
        } = rows;
        let name = match ty {
            WeightType::F32 => "matmul_f32w",
            WeightType::F16 => "matmul_f16w",
            WeightType::Q8_0 => "matmul_q8_0w",
            WeightType::Q4K => "matmul_q4_kw",
            WeightType::Q3K => "matmul_q3_kw",
            WeightType::Pn3t => "matmul_pn3tw",
            WeightType::Pn4t => "matmul_pn4tw",
        };
        let row_bytes = ty.row_bytes(k).ok_or_else(|| KernelError::Shape {
            op: OP,
            what: format!("k = {k} not a block multiple"),
        })?;
        check(
            n > 0 && t_len > 0 && x_stride >= k && y_stride >= n,
            OP,
            || format!("bad shape n {n} k {k} t {t_len} strides {x_stride} {y_stride}"),
        )?;
        check(w.len() >= n * row_bytes, OP, || {
            format!("weight has {} bytes, needs {}", w.len(), n * row_bytes)
        })?;
        check(x.len() >= (t_len - 1) * x_stride + k, OP, || {
            format!("x has {} elements", x.len())
        })?;
        check(y.len() >= (t_len - 1) * y_stride + n, OP, || {
            format!("y has {} elements", y.len())
        })?;
        let f = self.func("matmul", name)?;
        let (rb, xs, ys) = (row_bytes as i64, x_stride as i64, y_stride as i64);
        let (n_i, k_i, t_i) = (n as i32, k as i32, t_len as i32);
        let mut b = self.stream.launch_builder(f);
        b.arg(w)
            .arg(&rb)
            .arg(x)
            .arg(&xs)
            .arg(y)
            .arg(&ys)
            .arg(&n_i)
            .arg(&k_i)
            .arg(&t_i);
        let grid = (n.div_ceil(64) as u32, t_len.div_ceil(64) as u32, 1);
        // SAFETY: arguments as declared in matmul.cu; lengths checked.
        unsafe { b.launch(Self::cfg(grid, 256, 0)) }.map_err(drv(name))?;
        Ok(())
    }
}
