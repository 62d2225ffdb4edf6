//! Elementwise ops on the device: SwiGLU, the attention output gate, the residual add, zeroing.

use super::{lock, view, view_mut, CudaBackend, CudaBuf, CudaError};
use pn_kernels::RowLayout;

impl CudaBackend {
    /// [`crate::Backend::zero`]: `buf[0..len) = 0`.
    pub(super) fn try_zero(&self, buf: &mut CudaBuf, len: usize) -> Result<(), CudaError> {
        let mut v = view_mut("zero", buf, 0, len)?;
        self.gpu
            .stream()
            .memset_zeros(&mut v)
            .map_err(|e| CudaError::driver("zero", e))
    }

    /// [`crate::Backend::sigmoid_gate`]: `x[t][h][i] *= sigmoid(gate[offset + t*token_stride +
    /// h*head_stride + i])` over `gl.tokens` tokens of `gl.heads` heads of `head_dim`, with
    /// `gl`'s strides those of the gate.
    pub(super) fn try_sigmoid_gate(
        &self,
        x: &mut CudaBuf,
        (gate, gate_offset): (&CudaBuf, usize),
        gl: RowLayout,
        head_dim: usize,
    ) -> Result<(), CudaError> {
        const OP: &str = "sigmoid_gate";
        let n = gl.tokens * gl.heads * head_dim;
        if n == 0 {
            return Ok(());
        }
        let gv = view(OP, gate, gate_offset, gl.min_len(head_dim))?;
        let mut xv = view_mut(OP, x, 0, n)?;
        Ok(self.gpu.sigmoid_gate(&mut xv, &gv, gl, head_dim)?)
    }

    /// [`crate::Backend::swiglu`]: `gate = silu(gate) * up` over `len` values.
    pub(super) fn try_swiglu(
        &self,
        gate: &mut CudaBuf,
        up: &CudaBuf,
        len: usize,
    ) -> Result<(), CudaError> {
        const OP: &str = "swiglu";
        if len == 0 {
            return Ok(());
        }
        // The wrapper writes a separate output (a buffer cannot be both a view and a mutable
        // view): into scratch, then back.
        let mut sc = lock(&self.scratch);
        let tmp = self.grow(&mut sc.f32s, len, "swiglu scratch")?;
        {
            let gv = view(OP, gate, 0, len)?;
            let uv = view(OP, up, 0, len)?;
            let mut tv = tmp.slice_mut(0..len);
            self.gpu.swiglu(&gv, &uv, &mut tv, len)?;
        }
        let tv = tmp.slice(0..len);
        let mut gv = view_mut(OP, gate, 0, len)?;
        self.gpu
            .stream()
            .memcpy_dtod(&tv, &mut gv)
            .map_err(|e| CudaError::driver(OP, e))
    }

    /// [`crate::Backend::add`]: `x += y` over `len` values.
    pub(super) fn try_add(
        &self,
        x: &mut CudaBuf,
        y: &CudaBuf,
        len: usize,
    ) -> Result<(), CudaError> {
        const OP: &str = "add";
        if len == 0 {
            return Ok(());
        }
        let yv = view(OP, y, 0, len)?;
        let mut xv = view_mut(OP, x, 0, len)?;
        Ok(self.gpu.add_inplace(&mut xv, &yv, len)?)
    }
}
