//! Block-diagonal Hadamard rotations (`kernels/hadamard.cu`): in place, and fused after an
//! RMSNorm or a SwiGLU so the rotated activation of a PN matrix costs no extra pass.

use super::{drv, Gpu, NormShape, RowStrides};
use crate::error::{check, KernelError};
use cudarc::driver::{CudaView, CudaViewMut, PushKernelArg};

impl Gpu {
    /// The kernels' block size and scale for rotating `len` values in chunks of `r`.
    pub(super) fn hadamard_params(
        op: &'static str,
        len: usize,
        r: usize,
    ) -> Result<(i32, f32), KernelError> {
        check(r.is_power_of_two() && (2..=1024).contains(&r), op, || {
            format!("block size {r} is not a power of two in 2..=1024")
        })?;
        check(len > 0 && len.is_multiple_of(r), op, || {
            format!("len {len} is not a positive multiple of {r}")
        })?;
        // 1/sqrt(R) rounded once from f64, as pn-format scales.
        Ok((r as i32, (1.0f64 / (r as f64).sqrt()) as f32))
    }

    /// Block-diagonal Hadamard rotation in place of `x[0..len)` in chunks of `r` (power of
    /// two, 2..=1024), scaled by 1/sqrt(r).
    pub fn hadamard_inplace(
        &self,
        x: &mut CudaViewMut<'_, f32>,
        len: usize,
        r: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "hadamard";
        let (r_i, scale) = Self::hadamard_params(OP, len, r)?;
        check(x.len() >= len, OP, || format!("buffer shorter than {len}"))?;
        let f = self.func("hadamard", "hadamard_f32")?;
        let null: u64 = 0;
        let mut b = self.stream.launch_builder(f);
        b.arg(x).arg(&null).arg(&r_i).arg(&scale);
        // SAFETY: (x, y = null: in place, R, scale); shared memory R floats.
        unsafe {
            b.launch(Self::cfg(
                ((len / r) as u32, 1, 1),
                (r / 2).min(512) as u32,
                (r * 4) as u32,
            ))
        }
        .map_err(drv("hadamard_f32"))?;
        Ok(())
    }

    /// Longest row [`Gpu::rms_norm_hadamard`] takes: the row is staged in shared memory, which
    /// holds 48 KB per block without an opt-in, 128 bytes of which are the kernel's static
    /// reduction scratch (12256 floats).
    pub const RMS_NORM_HADAMARD_MAX_N: usize = (48 * 1024 - 128) / 4;

    /// Whether the fused rotation kernels take a rotation block of `r` over rows or runs of `n`
    /// values ([`Gpu::swiglu_hadamard`]; [`Gpu::rms_norm_hadamard`] also needs
    /// `n <= RMS_NORM_HADAMARD_MAX_N`): `r` a power of two in 2..=1024 dividing `n`, and one
    /// thread block per chunk within the grid limit.
    pub fn rotation_fits(n: usize, r: usize) -> bool {
        r.is_power_of_two()
            && (2..=1024).contains(&r)
            && n > 0
            && n.is_multiple_of(r)
            && n / r <= i32::MAX as usize
    }

    /// Fused RMSNorm and rotation of `rows.rows` rows of `norm.n` values
    /// (`n <=` [`Gpu::RMS_NORM_HADAMARD_MAX_N`]): `y = H_r(rms(x) * w)`, one kernel instead of
    /// two on the decode path (`w`: `n` floats).
    pub fn rms_norm_hadamard(
        &self,
        x: &CudaView<'_, f32>,
        y: &mut CudaViewMut<'_, f32>,
        w: &CudaView<'_, f32>,
        rows: RowStrides,
        norm: NormShape,
        r: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "rms_norm_hadamard";
        let NormShape { n, eps } = norm;
        let (r_i, scale) = Self::hadamard_params(OP, n, r)?;
        check(n <= Self::RMS_NORM_HADAMARD_MAX_N, OP, || {
            format!(
                "n = {n} exceeds {} (48 KB of shared memory)",
                Self::RMS_NORM_HADAMARD_MAX_N
            )
        })?;
        Self::check_rows(OP, x.len(), y.len(), &rows, n)?;
        check(w.len() >= n, OP, || {
            format!("weight has {} elements, n = {n}", w.len())
        })?;
        let f = self.func("hadamard", "rms_norm_hadamard_f32")?;
        let (xs, ys, n_i) = (rows.x_stride as i64, rows.y_stride as i64, n as i32);
        let mut b = self.stream.launch_builder(f);
        b.arg(x)
            .arg(&xs)
            .arg(y)
            .arg(&ys)
            .arg(w)
            .arg(&n_i)
            .arg(&eps)
            .arg(&r_i)
            .arg(&scale);
        // SAFETY: arguments as declared; lengths checked; shared memory n floats. 256 threads as
        // in rms_norm, so both reduce the sum of squares in the same order (same bits).
        unsafe { b.launch(Self::cfg((rows.rows as u32, 1, 1), 256, (n * 4) as u32)) }
            .map_err(drv("rms_norm_hadamard_f32"))?;
        Ok(())
    }

    /// Fused SwiGLU and rotation: `out = H_r(silu(gate) * up)` over `n` values.
    pub fn swiglu_hadamard(
        &self,
        gate: &CudaView<'_, f32>,
        up: &CudaView<'_, f32>,
        out: &mut CudaViewMut<'_, f32>,
        n: usize,
        r: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "swiglu_hadamard";
        let (r_i, scale) = Self::hadamard_params(OP, n, r)?;
        check(
            gate.len() >= n && up.len() >= n && out.len() >= n,
            OP,
            || format!("buffers shorter than {n}"),
        )?;
        let f = self.func("hadamard", "swiglu_hadamard_f32")?;
        let mut b = self.stream.launch_builder(f);
        b.arg(gate).arg(up).arg(out).arg(&r_i).arg(&scale);
        // SAFETY: arguments as declared; lengths checked; shared memory R floats.
        unsafe {
            b.launch(Self::cfg(
                ((n / r) as u32, 1, 1),
                (r / 2).clamp(32, 512) as u32,
                (r * 4) as u32,
            ))
        }
        .map_err(drv("swiglu_hadamard_f32"))?;
        Ok(())
    }
}
