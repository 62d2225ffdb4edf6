//! PN (pn3t / pn4t) matrix-vector products (`kernels/pn_gemv.cu`): the fp32 reference kernels,
//! the half2 decode kernels, and the one-off fp16 conversion of an activation they can share.

use super::{drv, Gpu, MatrixShape};
use crate::error::{check, KernelError};
use crate::launch::{self, Launch, PN_BATCH_MAX_T, PN_H2_MAX_K as H2_MAX_K};
use crate::types::{PnPrecision, WeightType};
use cudarc::driver::{CudaView, CudaViewMut, PushKernelArg};

impl Gpu {
    /// Checks a PN matrix-vector call; returns the code width (3/4) and blocks per row.
    pub(super) fn pn_check(
        &self,
        op: &'static str,
        m: MatrixShape,
        w: &CudaView<'_, u8>,
        y_len: usize,
    ) -> Result<(u32, usize), KernelError> {
        let MatrixShape { ty, n, k } = m;
        let bits = match ty {
            WeightType::Pn3t => 3,
            WeightType::Pn4t => 4,
            other => {
                return Err(KernelError::Shape {
                    op,
                    what: format!("{} is not a PN type", other.name()),
                })
            }
        };
        let row_bytes = ty.row_bytes(k).ok_or_else(|| KernelError::Shape {
            op,
            what: format!("k = {k} is not a multiple of {}", ty.block_elems()),
        })?;
        check(
            n > 0 && k > 0 && n <= i32::MAX as usize && k <= i32::MAX as usize,
            op,
            || format!("bad shape n = {n}, k = {k}"),
        )?;
        check(w.len() >= n * row_bytes, op, || {
            format!(
                "weight has {} bytes, {n} x {k} {} needs {}",
                w.len(),
                ty.name(),
                n * row_bytes
            )
        })?;
        check(y_len >= n, op, || {
            format!("y has {y_len} elements, n = {n}")
        })?;
        self.check_align(op, "weight", w, 4)?;
        Ok((bits, k / ty.block_elems()))
    }

    /// The half2 kernel and launch geometry for a shape ([`launch::pn_h2`]).
    fn pn_h2_launch(
        op: &'static str,
        bits: u32,
        n: usize,
        k: usize,
        prepared: bool,
    ) -> Result<Launch, KernelError> {
        launch::pn_h2(bits, n, k, prepared, None).ok_or_else(|| KernelError::Shape {
            op,
            what: format!(
                "k = {k} exceeds {H2_MAX_K}, the shared-memory limit of the half2 kernel"
            ),
        })
    }

    /// `y[0..n) = W x` for a PN weight of `m.n` rows by `m.k` columns (`w` = the tensor's
    /// bytes). `k` must be a multiple of 80 (pn3t) or 64 (pn4t); with `Half2`, `k <= 23040`
    /// ([`launch::PN_H2_MAX_K`]: the padded fp16 copy of x and a weight tile live in 48 KB). Each thread block stages x itself;
    /// when several matrices read the same x, [`Gpu::pn_prepare_x`] + [`Gpu::pn_gemv_prepared`]
    /// convert it once (same results, bit for bit).
    pub fn pn_gemv(
        &self,
        m: MatrixShape,
        precision: PnPrecision,
        w: &CudaView<'_, u8>,
        x: &CudaView<'_, f32>,
        y: &mut CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "pn_gemv";
        let (bits, _) = self.pn_check(OP, m, w, y.len())?;
        let MatrixShape { n, k, .. } = m;
        check(x.len() >= k, OP, || {
            format!("x has {} elements, k = {k}", x.len())
        })?;
        self.check_align(OP, "x", x, 8)?;
        let l = match precision {
            PnPrecision::F32 => Launch {
                kernel: if bits == 3 {
                    "pn3t_gemv_f32"
                } else {
                    "pn4t_gemv_f32"
                },
                grid: n.div_ceil(8) as u32,
                threads: 256,
                smem: 0,
                rows_per_warp: 1,
            },
            PnPrecision::Half2 => Self::pn_h2_launch(OP, bits, n, k, false)?,
        };
        let name = l.kernel;
        let f = self.func("pn_gemv", name)?;
        let (n_i, k_i) = (n as i32, k as i32);
        let mut b = self.stream.launch_builder(f);
        b.arg(w).arg(x).arg(y).arg(&n_i).arg(&k_i);
        // SAFETY: argument list matches the kernel signature (w, x, y, N, K); buffer lengths
        // were checked above; the f32 grid covers n rows with 8 warps per block, the half2
        // kernels loop over row groups; shared memory as launch::pn_h2 sized it (<= 48 KB).
        unsafe { b.launch(Self::cfg((l.grid, 1, 1), l.threads, l.smem)) }.map_err(drv(name))?;
        Ok(())
    }

    /// Converts the activation `x[0..k)` once for every PN matrix that reads it: `xh` gets
    /// `k` fp16 values (x scaled by a power of two), `e[0]` the exponent. `k` a multiple of 16
    /// (every PN row length is).
    pub fn pn_prepare_x(
        &self,
        x: &CudaView<'_, f32>,
        k: usize,
        xh: &mut CudaViewMut<'_, half::f16>,
        e: &mut CudaViewMut<'_, i32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "pn_prepare_x";
        check(k > 0 && k.is_multiple_of(16) && k <= H2_MAX_K, OP, || {
            format!("k = {k} must be a multiple of 16 up to {H2_MAX_K}")
        })?;
        check(x.len() >= k && xh.len() >= k && !e.is_empty(), OP, || {
            format!(
                "x has {}, xh {} (k = {k}), e {}",
                x.len(),
                xh.len(),
                e.len()
            )
        })?;
        self.check_align(OP, "x", x, 8)?;
        let f = self.func("pn_gemv", "pn_prepare_x_h2")?;
        let k_i = k as i32;
        let mut b = self.stream.launch_builder(f);
        b.arg(x).arg(&k_i).arg(xh).arg(e);
        // SAFETY: (x, K, xh, e_out); lengths checked; one block.
        unsafe { b.launch(Self::cfg((1, 1, 1), 1024, 0)) }.map_err(drv("pn_prepare_x_h2"))?;
        Ok(())
    }

    /// [`Gpu::pn_gemv`] with `Half2` from an activation converted by [`Gpu::pn_prepare_x`]
    /// (`xh`: `m.k` fp16 values, `e[0]`: their exponent).
    pub fn pn_gemv_prepared(
        &self,
        m: MatrixShape,
        w: &CudaView<'_, u8>,
        xh: &CudaView<'_, half::f16>,
        e: &CudaView<'_, i32>,
        y: &mut CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "pn_gemv_prepared";
        let (bits, _) = self.pn_check(OP, m, w, y.len())?;
        let MatrixShape { n, k, .. } = m;
        check(k <= H2_MAX_K && xh.len() >= k && !e.is_empty(), OP, || {
            format!(
                "k = {k} (max {H2_MAX_K}), xh has {}, e has {}",
                xh.len(),
                e.len()
            )
        })?;
        self.check_align(OP, "xh", xh, 16)?;
        let l = Self::pn_h2_launch(OP, bits, n, k, true)?;
        let name = l.kernel;
        let f = self.func("pn_gemv", name)?;
        let (n_i, k_i) = (n as i32, k as i32);
        let mut b = self.stream.launch_builder(f);
        b.arg(w).arg(xh).arg(e).arg(y).arg(&n_i).arg(&k_i);
        // SAFETY: (w, xh, e, y, N, K) as declared; lengths checked; geometry from launch::pn_h2.
        unsafe { b.launch(Self::cfg((l.grid, 1, 1), l.threads, l.smem)) }.map_err(drv(name))?;
        Ok(())
    }

    /// Converts `t` activation rows (`x`: `t` rows of `k`, contiguous) for the small-batch
    /// kernel: `xh` gets `t * k` fp16 values (row r at `r * k`, each row scaled by its own power
    /// of two, the same bits as [`Gpu::pn_prepare_x`] on that row), `e[0..t)` the exponents.
    /// One launch of `t` blocks.
    pub fn pn_prepare_rows(
        &self,
        x: &CudaView<'_, f32>,
        (t, k): (usize, usize),
        xh: &mut CudaViewMut<'_, half::f16>,
        e: &mut CudaViewMut<'_, i32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "pn_prepare_rows";
        check(
            k > 0
                && k.is_multiple_of(16)
                && k <= i32::MAX as usize
                && (1..=PN_BATCH_MAX_T).contains(&t),
            OP,
            || format!("k = {k} must be a multiple of 16, t = {t} in 1..={PN_BATCH_MAX_T}"),
        )?;
        check(
            x.len() >= t * k && xh.len() >= t * k && e.len() >= t,
            OP,
            || {
                format!(
                    "x has {}, xh {}, e {} for {t} rows of {k}",
                    x.len(),
                    xh.len(),
                    e.len()
                )
            },
        )?;
        self.check_align(OP, "x", x, 8)?;
        let f = self.func("pn_gemv", "pn_prepare_x_h2")?;
        let k_i = k as i32;
        let mut b = self.stream.launch_builder(f);
        b.arg(x).arg(&k_i).arg(xh).arg(e);
        // SAFETY: (x, K, xh, e_out); block r reads x[r*k..), writes xh[r*k..) and e[r]: lengths
        // checked for t rows.
        unsafe { b.launch(Self::cfg((t as u32, 1, 1), 1024, 0)) }
            .map_err(drv("pn_prepare_x_h2"))?;
        Ok(())
    }

    /// `y[r*n..(r+1)*n) = W x_r` for the `t` (2..=8) activation rows that [`Gpu::pn_prepare_rows`]
    /// converted (`xh`: `t * m.k` fp16, `e`: `t` exponents): the small-batch kernel, each weight
    /// pair read and decoded once for all rows, row r bit-identical to
    /// [`Gpu::pn_gemv_prepared`] on row r. Rows with an even block count (every 27B matrix);
    /// others are refused ([`launch::pn_batch`]).
    pub fn pn_gemv_batch(
        &self,
        m: MatrixShape,
        t: usize,
        w: &CudaView<'_, u8>,
        (xh, e): (&CudaView<'_, half::f16>, &CudaView<'_, i32>),
        y: &mut CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "pn_gemv_batch";
        let (bits, _) = self.pn_check(OP, m, w, y.len())?;
        let MatrixShape { n, k, .. } = m;
        let l = launch::pn_batch(bits, t, n, k).ok_or_else(|| KernelError::Shape {
            op: OP,
            what: format!("t = {t} rows of k = {k}: the batch kernel needs t in 2..={PN_BATCH_MAX_T} and an even block count per row"),
        })?;
        check(
            xh.len() >= t * k && e.len() >= t && y.len() >= t * n,
            OP,
            || {
                format!(
                    "xh has {}, e {}, y {} for {t} x {n} x {k}",
                    xh.len(),
                    e.len(),
                    y.len()
                )
            },
        )?;
        self.check_align(OP, "xh", xh, 4)?;
        let name = l.launch.kernel;
        let f = self.func("pn_gemv", name)?;
        let (n_i, k_i, xp_i, g_i) = (n as i32, k as i32, l.xp as i32, l.groups as i32);
        let mut b = self.stream.launch_builder(f);
        b.arg(w)
            .arg(xh)
            .arg(e)
            .arg(y)
            .arg(&n_i)
            .arg(&k_i)
            .arg(&xp_i)
            .arg(&g_i);
        // SAFETY: (w, xh, e, y, N, K, XP, G) as declared; lengths checked; geometry, shared
        // memory (<= 48 KB) and G (<= PN_BATCH_G) from launch::pn_batch.
        let c = Self::cfg((l.launch.grid, 1, 1), l.launch.threads, l.launch.smem);
        unsafe { b.launch(c) }.map_err(drv(name))?;
        Ok(())
    }
}
