//! Rotary position embedding (`kernels/rope.cu`: partial NeoX RoPE in place).

use super::{drv, Gpu, RowLayout};
use crate::error::{check, KernelError};
use cudarc::driver::{CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

impl Gpu {
    /// Partial NeoX RoPE in place on the heads of `xl` (rows = heads of tokens), rotating the
    /// first `n_rot` dims by `theta = pos * base^(-2i/n_rot)`. Positions: `pos[t]` when given,
    /// else `pos0 + t`.
    pub fn rope_neox(
        &self,
        x: &mut CudaViewMut<'_, f32>,
        xl: RowLayout,
        pos: Option<&CudaView<'_, i32>>,
        pos0: usize,
        n_rot: usize,
        base: f32,
    ) -> Result<(), KernelError> {
        const OP: &str = "rope_neox";
        check(
            n_rot.is_multiple_of(2) && n_rot > 0 && n_rot <= 2048,
            OP,
            || format!("n_rot = {n_rot}"),
        )?;
        Self::check_layout(OP, "x", x.len(), &xl, n_rot)?;
        if let Some(p) = pos {
            check(p.len() >= xl.tokens, OP, || {
                format!("{} positions for {} tokens", p.len(), xl.tokens)
            })?;
        }
        check(pos0 + xl.tokens <= i32::MAX as usize, OP, || {
            format!("position {pos0} too large")
        })?;
        let f = self.func("rope", "rope_neox_f32")?;
        let (ts, hs, p0, nr, nt) = (
            xl.tok_stride as i64,
            xl.head_stride as i64,
            pos0 as i32,
            n_rot as i32,
            xl.tokens as i32,
        );
        let null: u64 = 0;
        let mut b = self.stream.launch_builder(f);
        b.arg(x).arg(&ts).arg(&hs);
        match pos {
            Some(p) => b.arg(p),
            None => b.arg(&null),
        };
        b.arg(&p0).arg(&nr).arg(&base).arg(&nt);
        let cfg = LaunchConfig {
            // Grid y strides over the tokens (any count; 65535 blocks at most).
            grid_dim: (xl.heads as u32, crate::launch::grid_y_blocks(xl.tokens), 1),
            block_dim: ((n_rot / 2) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: arguments as declared; lengths checked.
        unsafe { b.launch(cfg) }.map_err(drv("rope_neox_f32"))?;
        Ok(())
    }
}
