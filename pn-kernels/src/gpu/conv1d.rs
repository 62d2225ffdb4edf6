//! The GDN's causal depthwise convolution (`kernels/conv1d.cu`: kernel 4, then SiLU).

use super::{drv, Gpu, RowStrides};
use crate::error::{check, KernelError};
use cudarc::driver::{CudaView, CudaViewMut, PushKernelArg};

impl Gpu {
    /// Causal conv1d (kernel 4) + SiLU over `rows.rows` tokens of `c` channels (input `u` rows
    /// `rows.x_stride`, output `y` rows `rows.y_stride` floats apart), updating the rolling
    /// `state` `[3][c]` of pre-conv inputs; weights `w` `[c][4]`.
    pub fn conv1d_silu(
        &self,
        u: &CudaView<'_, f32>,
        state: &mut CudaViewMut<'_, f32>,
        w: &CudaView<'_, f32>,
        y: &mut CudaViewMut<'_, f32>,
        rows: RowStrides,
        c: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "conv1d_silu";
        Self::check_rows(OP, u.len(), y.len(), &rows, c)?;
        check(state.len() >= 3 * c && w.len() >= 4 * c, OP, || {
            format!(
                "state {} (needs {}), w {} (needs {})",
                state.len(),
                3 * c,
                w.len(),
                4 * c
            )
        })?;
        let f = self.func("conv1d", "conv1d_silu_f32")?;
        let (us, ys) = (rows.x_stride as i64, rows.y_stride as i64);
        let (c_i, t_i) = (c as i32, rows.rows as i32);
        let mut b = self.stream.launch_builder(f);
        b.arg(u)
            .arg(&us)
            .arg(state)
            .arg(w)
            .arg(y)
            .arg(&ys)
            .arg(&c_i)
            .arg(&t_i);
        // SAFETY: arguments as declared; lengths checked.
        unsafe { b.launch(Self::cfg((c.div_ceil(256) as u32, 1, 1), 256, 0)) }
            .map_err(drv("conv1d_silu_f32"))?;
        Ok(())
    }
}
