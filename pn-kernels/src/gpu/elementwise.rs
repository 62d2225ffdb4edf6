//! Elementwise ops (`kernels/elementwise.cu`): SwiGLU, the attention output gate, residual add.

use super::{drv, Gpu, RowLayout};
use crate::error::{check, KernelError};
use cudarc::driver::{CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

impl Gpu {
    fn elementwise_cfg(n: usize) -> LaunchConfig {
        Self::cfg((n.div_ceil(256).clamp(1, 65535) as u32, 1, 1), 256, 0)
    }

    /// `out = silu(gate) * up` over `n` values.
    pub fn swiglu(
        &self,
        gate: &CudaView<'_, f32>,
        up: &CudaView<'_, f32>,
        out: &mut CudaViewMut<'_, f32>,
        n: usize,
    ) -> Result<(), KernelError> {
        check(
            gate.len() >= n && up.len() >= n && out.len() >= n && n > 0,
            "swiglu",
            || format!("n = {n} exceeds a buffer"),
        )?;
        let f = self.func("elementwise", "swiglu_f32")?;
        let n_l = n as i64;
        let mut b = self.stream.launch_builder(f);
        b.arg(gate).arg(up).arg(out).arg(&n_l);
        // SAFETY: (gate, up, out, n); lengths checked.
        unsafe { b.launch(Self::elementwise_cfg(n)) }.map_err(drv("swiglu_f32"))?;
        Ok(())
    }

    /// The attention output gate: `x[t][h][i] *= sigmoid(g[t*gl.tok_stride + h*gl.head_stride + i])`
    /// for `gl.tokens` tokens of `gl.heads` heads of `hd` (x contiguous: `[tokens][heads][hd]`).
    pub fn sigmoid_gate(
        &self,
        x: &mut CudaViewMut<'_, f32>,
        g: &CudaView<'_, f32>,
        gl: RowLayout,
        hd: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "sigmoid_gate";
        let (tokens, n_heads) = (gl.tokens, gl.heads);
        let n = tokens * n_heads * hd;
        check(n > 0 && x.len() >= n, OP, || {
            format!(
                "{tokens} tokens x {n_heads} heads x {hd}: x has {}",
                x.len()
            )
        })?;
        Self::check_layout(OP, "gate", g.len(), &gl, hd)?;
        let f = self.func("elementwise", "sigmoid_gate_f32")?;
        let (n_l, hd_i, nh, gts, ghs) = (
            n as i64,
            hd as i32,
            n_heads as i32,
            gl.tok_stride as i64,
            gl.head_stride as i64,
        );
        let mut b = self.stream.launch_builder(f);
        b.arg(x)
            .arg(g)
            .arg(&n_l)
            .arg(&hd_i)
            .arg(&nh)
            .arg(&gts)
            .arg(&ghs);
        // SAFETY: arguments as declared; lengths checked.
        unsafe { b.launch(Self::elementwise_cfg(n)) }.map_err(drv("sigmoid_gate_f32"))?;
        Ok(())
    }

    /// `acc += b` over `n` values (residual add).
    pub fn add_inplace(
        &self,
        acc: &mut CudaViewMut<'_, f32>,
        b_in: &CudaView<'_, f32>,
        n: usize,
    ) -> Result<(), KernelError> {
        check(acc.len() >= n && b_in.len() >= n && n > 0, "add", || {
            format!("n = {n} exceeds a buffer")
        })?;
        let f = self.func("elementwise", "add_inplace_f32")?;
        let n_l = n as i64;
        let mut b = self.stream.launch_builder(f);
        b.arg(acc).arg(b_in).arg(&n_l);
        // SAFETY: (a, b, n); lengths checked.
        unsafe { b.launch(Self::elementwise_cfg(n)) }.map_err(drv("add_inplace_f32"))?;
        Ok(())
    }
}
