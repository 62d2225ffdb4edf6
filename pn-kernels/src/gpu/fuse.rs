//! The fused producers of the PN GEMVs' input (`kernels/fuse.cu`): residual add + RMSNorm +
//! rotation + fp16 copy (and the unrotated normed rows beside them, or alone), and SwiGLU +
//! rotation + fp16 copy, each one launch where the decode path took three or four. The fp16 copy has the layout and the bits of
//! [`Gpu::pn_prepare_rows`] on the f32 rows they write.

use super::{drv, Gpu, NormShape, MAX_GRID_Y};
use crate::error::{check, KernelError};
use cudarc::driver::{CudaView, CudaViewMut, PushKernelArg};

/// Where a fused producer writes the prepared fp16 copy of its rows: `xh` `rows * n` halves
/// (row t at `t * n`), `e` one exponent per row.
pub struct PreparedOut<'a, 'b> {
    /// fp16 values.
    pub xh: &'a mut CudaViewMut<'b, half::f16>,
    /// Exponents.
    pub e: &'a mut CudaViewMut<'b, i32>,
}

/// The input rows of [`Gpu::add_rms_norm_hadamard_prep`].
pub enum NormX<'a, 'b> {
    /// Normalise these rows.
    Plain(&'a CudaView<'b, f32>),
    /// `x += add` first (written back), then normalise `x`.
    AddFirst(&'a mut CudaViewMut<'b, f32>, &'a CudaView<'b, f32>),
}

/// Where [`Gpu::add_rms_norm_hadamard_prep`] writes (each output `rows * n` floats; at least
/// one of `rot` and `plain`).
pub struct NormOutputs<'a, 'b> {
    /// The rotated rows `H_r(rms(x) * w)` (none: no rotation, and then no `prep`).
    pub rot: Option<&'a mut CudaViewMut<'b, f32>>,
    /// The fp16 copy of the rotated rows.
    pub prep: Option<PreparedOut<'a, 'b>>,
    /// The unrotated rows `rms(x) * w`.
    pub plain: Option<&'a mut CudaViewMut<'b, f32>>,
}

/// The geometry both fused producers share: `rows` contiguous rows of `n` values rotated in
/// chunks of `r`.
#[derive(Clone, Copy, Debug)]
pub struct FusedRows {
    /// Rows.
    pub rows: usize,
    /// Values per row.
    pub n: usize,
    /// Rotation block (a power of two in 2..=1024 dividing `n`).
    pub r: usize,
}

impl Gpu {
    fn fused_checks(
        op: &'static str,
        g: FusedRows,
        lens: &[usize],
        prep: &Option<PreparedOut<'_, '_>>,
    ) -> Result<(i32, f32), KernelError> {
        let FusedRows { rows, n, r } = g;
        check(
            rows > 0 && n.is_multiple_of(16) && rows * n <= i32::MAX as usize,
            op,
            || format!("{rows} rows of n = {n} (a multiple of 16)"),
        )?;
        let (r_i, scale) = Self::hadamard_params(op, n, r)?;
        check(lens.iter().all(|&l| l >= rows * n), op, || {
            format!("buffers {lens:?} shorter than {rows} rows of {n}")
        })?;
        if let Some(p) = prep {
            check(p.xh.len() >= rows * n && p.e.len() >= rows, op, || {
                format!(
                    "xh has {}, e {} for {rows} rows of {n}",
                    p.xh.len(),
                    p.e.len()
                )
            })?;
        }
        Ok((r_i, scale))
    }

    /// For each of `g.rows` rows: `x += add` for [`NormX::AddFirst`] (the residual stream,
    /// written back), then (`n <=` [`Gpu::RMS_NORM_HADAMARD_MAX_N`]) the outputs of `out`:
    /// `H_r(rms(x) * w)` and its fp16 copy, and the unrotated `rms(x) * w`. Bit-identical to the
    /// add, [`Gpu::rms_norm_hadamard`] and [`Gpu::pn_prepare_rows`] in sequence, and to
    /// [`Gpu::rms_norm`] for the unrotated rows; one launch. Without `out.rot`, `g.r` is not
    /// used (no rotation) and `n` need not be a multiple of 16.
    pub fn add_rms_norm_hadamard_prep(
        &self,
        x: NormX<'_, '_>,
        out: NormOutputs<'_, '_>,
        (w, norm): (&CudaView<'_, f32>, NormShape),
        g: FusedRows,
    ) -> Result<(), KernelError> {
        const OP: &str = "add_rms_norm_hadamard_prep";
        const K: &str = "add_rms_norm_hadamard_prep_f32";
        let NormShape { n, eps } = norm;
        let NormOutputs { rot, prep, plain } = out;
        check(
            n == g.n
                && n <= Self::RMS_NORM_HADAMARD_MAX_N
                && w.len() >= n
                && (rot.is_some() || (plain.is_some() && prep.is_none())),
            OP,
            || {
                format!(
                    "n = {n} (rows of {}, max {}), weight {}; rotated rows {}, fp16 copy {}, \
                     unrotated rows {}",
                    g.n,
                    Self::RMS_NORM_HADAMARD_MAX_N,
                    w.len(),
                    rot.is_some(),
                    prep.is_some(),
                    plain.is_some()
                )
            },
        )?;
        let mut lens = vec![match &x {
            NormX::Plain(v) => v.len(),
            NormX::AddFirst(v, a) => v.len().min(a.len()),
        }];
        lens.extend(rot.as_ref().map(|v| v.len()));
        lens.extend(plain.as_ref().map(|v| v.len()));
        let (r_i, scale) = if rot.is_some() {
            Self::fused_checks(OP, g, &lens, &prep)?
        } else {
            let rows = g.rows;
            check(
                rows > 0 && rows * n <= i32::MAX as usize && lens.iter().all(|&l| l >= rows * n),
                OP,
                || format!("buffers {lens:?} shorter than {rows} rows of {n}"),
            )?;
            (1, 1.0)
        };
        let f = self.func("fuse", K)?;
        let (n_i, rows_i, null) = (n as i32, g.rows as i32, 0u64);
        let mut b = self.stream.launch_builder(f);
        match x {
            NormX::Plain(v) => b.arg(v).arg(&null),
            NormX::AddFirst(v, a) => b.arg(v).arg(a),
        };
        match rot {
            Some(y) => b.arg(y),
            None => b.arg(&null),
        };
        match plain {
            Some(yp) => b.arg(yp),
            None => b.arg(&null),
        };
        b.arg(w).arg(&n_i).arg(&eps).arg(&r_i).arg(&scale);
        match prep {
            Some(p) => b.arg(p.xh).arg(p.e),
            None => b.arg(&null).arg(&null),
        };
        b.arg(&rows_i);
        let grid = g.rows.min(MAX_GRID_Y) as u32;
        // SAFETY: (x, r, y, yp, w, n, eps, R, scale, xh, e, rows) as declared; lengths checked;
        // null outputs skipped by the kernel (xh only with y); shared memory n floats; 256
        // threads as rms_norm_hadamard and rms_norm (same reduction order).
        unsafe { b.launch(Self::cfg((grid, 1, 1), 256, (n * 4) as u32)) }.map_err(drv(K))?;
        Ok(())
    }

    /// For each of `g.rows` rows: `out = H_r(silu(gate) * up)` and, with `prep`, its fp16 copy.
    /// Bit-identical to [`Gpu::swiglu_hadamard`] then [`Gpu::pn_prepare_rows`]; one launch (one
    /// block per row).
    pub fn swiglu_hadamard_prep(
        &self,
        (gate, up): (&CudaView<'_, f32>, &CudaView<'_, f32>),
        out: &mut CudaViewMut<'_, f32>,
        g: FusedRows,
        prep: Option<PreparedOut<'_, '_>>,
    ) -> Result<(), KernelError> {
        const OP: &str = "swiglu_hadamard_prep";
        const K: &str = "swiglu_hadamard_prep_f32";
        let (r_i, scale) = Self::fused_checks(OP, g, &[gate.len(), up.len(), out.len()], &prep)?;
        let f = self.func("fuse", K)?;
        let (n_i, rows_i, null) = (g.n as i32, g.rows as i32, 0u64);
        let mut b = self.stream.launch_builder(f);
        // Values per pass: whole chunks, at most 8192 (32 KB of shared memory).
        let cap = (8192 / g.r * g.r).min(g.n);
        let cap_i = cap as i32;
        b.arg(gate)
            .arg(up)
            .arg(out)
            .arg(&n_i)
            .arg(&r_i)
            .arg(&cap_i)
            .arg(&scale);
        match prep {
            Some(p) => b.arg(p.xh).arg(p.e),
            None => b.arg(&null).arg(&null),
        };
        b.arg(&rows_i);
        let grid = g.rows.min(MAX_GRID_Y) as u32;
        // SAFETY: (gate, up, out, n, R, cap, scale, xh, e, rows) as declared; lengths checked;
        // shared memory cap floats.
        unsafe { b.launch(Self::cfg((grid, 1, 1), 512, (cap * 4) as u32)) }.map_err(drv(K))?;
        Ok(())
    }
}
