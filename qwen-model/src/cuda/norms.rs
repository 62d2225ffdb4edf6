//! Norms, rotations and RoPE on the device: RMSNorm (contiguous, strided in place, gated),
//! the block-diagonal Hadamard rotation, NeoX RoPE, and the fused norm/SwiGLU + rotation
//! kernels with their two-op fallbacks.

use super::{view, view_mut, CudaBackend, CudaBuf, CudaError};
use crate::RopeLayout;
use pn_kernels::{Gpu, NormShape, RowLayout, RowStrides};

/// Whether [`CudaBackend::try_rms_norm_hadamard`] takes the fused kernel for rows of `n` in
/// rotation blocks of `block` (else RMSNorm then the rotation). The launch counter asks too.
pub(crate) fn rms_norm_hadamard_fuses(n: usize, block: usize) -> bool {
    Gpu::rotation_fits(n, block) && n <= Gpu::RMS_NORM_HADAMARD_MAX_N
}

/// Whether [`CudaBackend::try_swiglu_hadamard`] takes the fused kernel for `len` values in
/// rotation blocks of `block` (else copy, SwiGLU and the rotation).
pub(crate) fn swiglu_hadamard_fuses(len: usize, block: usize) -> bool {
    Gpu::rotation_fits(len, block)
}

impl CudaBackend {
    /// [`crate::Backend::hadamard`]: rotation in place of `x[0..len)` in blocks of `block`.
    pub(super) fn try_hadamard(
        &self,
        x: &mut CudaBuf,
        len: usize,
        block: usize,
    ) -> Result<(), CudaError> {
        let mut v = view_mut("hadamard", x, 0, len)?;
        Ok(self.gpu.hadamard_inplace(&mut v, len, block)?)
    }

    /// [`crate::Backend::rms_norm`]: `rows` contiguous rows of `n` from `x` into `out`.
    pub(super) fn try_rms_norm(
        &self,
        (x, w): (&CudaBuf, &CudaBuf),
        out: &mut CudaBuf,
        rows: usize,
        norm: NormShape,
    ) -> Result<(), CudaError> {
        const OP: &str = "rms_norm";
        let n = norm.n;
        let l = RowLayout::contiguous(rows, n);
        let xv = view(OP, x, 0, rows * n)?;
        let wv = view(OP, w, 0, n)?;
        let mut ov = view_mut(OP, out, 0, rows * n)?;
        Ok(self.gpu.rms_norm(&xv, l, &mut ov, l, Some(&wv), norm)?)
    }

    /// [`crate::Backend::rms_norm_strided`]: `count` rows of `n`, `stride` apart, in place.
    pub(super) fn try_rms_norm_strided(
        &self,
        x: &mut CudaBuf,
        w: &CudaBuf,
        norm: NormShape,
        (stride, count): (usize, usize),
    ) -> Result<(), CudaError> {
        const OP: &str = "rms_norm_strided";
        if count == 0 {
            return Ok(());
        }
        let l = RowLayout {
            tokens: count,
            heads: 1,
            tok_stride: stride,
            head_stride: stride,
        };
        let wv = view(OP, w, 0, norm.n)?;
        let mut xv = view_mut(OP, x, 0, l.min_len(norm.n))?;
        Ok(self.gpu.rms_norm_inplace(&mut xv, l, Some(&wv), norm)?)
    }

    /// [`crate::Backend::gated_rms_norm`]: `x = rms(x) * w * silu(z)` over `len` values in
    /// rows of `norm.n`.
    pub(super) fn try_gated_rms_norm(
        &self,
        x: &mut CudaBuf,
        (z, w): (&CudaBuf, &CudaBuf),
        len: usize,
        norm: NormShape,
    ) -> Result<(), CudaError> {
        const OP: &str = "gated_rms_norm";
        let n = norm.n;
        if n == 0 || !len.is_multiple_of(n) {
            return Err(CudaError::Unsupported {
                op: OP,
                what: format!("len {len} is not a multiple of n = {n}"),
            });
        }
        let l = RowLayout::contiguous(len / n, n);
        let zv = view(OP, z, 0, len)?;
        let wv = view(OP, w, 0, n)?;
        let mut xv = view_mut(OP, x, 0, len)?;
        Ok(self
            .gpu
            .gated_rms_norm_inplace(&mut xv, l, &zv, l, &wv, norm)?)
    }

    /// [`crate::Backend::rope`]: NeoX RoPE in place on `n_tokens` tokens from `pos0`.
    pub(super) fn try_rope(
        &self,
        x: &mut CudaBuf,
        layout: &RopeLayout,
        n_tokens: usize,
        pos0: usize,
        theta: f32,
    ) -> Result<(), CudaError> {
        const OP: &str = "rope";
        if n_tokens == 0 {
            return Ok(());
        }
        let l = RowLayout {
            tokens: n_tokens,
            heads: layout.n_heads,
            tok_stride: layout.token_stride,
            head_stride: layout.head_stride,
        };
        let mut xv = view_mut(OP, x, 0, l.min_len(layout.n_rot))?;
        Ok(self
            .gpu
            .rope_neox(&mut xv, l, None, pos0, layout.n_rot, theta)?)
    }

    /// [`crate::Backend::rms_norm_hadamard`]: the fused kernel, or RMSNorm then the rotation
    /// when a row is longer than its shared memory (or the block is one it refuses).
    pub(super) fn try_rms_norm_hadamard(
        &self,
        (x, w): (&CudaBuf, &CudaBuf),
        out: &mut CudaBuf,
        rows: usize,
        norm: NormShape,
        block: usize,
    ) -> Result<(), CudaError> {
        const OP: &str = "rms_norm_hadamard";
        let n = norm.n;
        if rows == 0 {
            return Ok(());
        }
        if !rms_norm_hadamard_fuses(n, block) {
            // The two ops, which report a refused block themselves.
            self.try_rms_norm((x, w), out, rows, norm)?;
            return self.try_hadamard(out, rows * n, block);
        }
        let xv = view(OP, x, 0, rows * n)?;
        let wv = view(OP, w, 0, n)?;
        let mut ov = view_mut(OP, out, 0, rows * n)?;
        let strides = RowStrides::contiguous(rows, n);
        Ok(self
            .gpu
            .rms_norm_hadamard(&xv, &mut ov, &wv, strides, norm, block)?)
    }

    /// [`crate::Backend::swiglu_hadamard`]: the fused kernel, or copy + SwiGLU + rotation when
    /// the block is one it refuses.
    pub(super) fn try_swiglu_hadamard(
        &self,
        (gate, up): (&CudaBuf, &CudaBuf),
        out: &mut CudaBuf,
        len: usize,
        block: usize,
    ) -> Result<(), CudaError> {
        const OP: &str = "swiglu_hadamard";
        if len == 0 {
            return Ok(());
        }
        if !swiglu_hadamard_fuses(len, block) {
            self.try_copy(gate, 0, out, 0, len)?;
            self.try_swiglu(out, up, len)?;
            return self.try_hadamard(out, len, block);
        }
        let gv = view(OP, gate, 0, len)?;
        let uv = view(OP, up, 0, len)?;
        let mut ov = view_mut(OP, out, 0, len)?;
        Ok(self.gpu.swiglu_hadamard(&gv, &uv, &mut ov, len, block)?)
    }
}
