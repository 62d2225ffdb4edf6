//! Row norms (`kernels/norm.cu`): RMSNorm (out of place or in place), the gated RMSNorm of the
//! GDN output and the scaled L2 norm of the GDN q/k heads (in place).

use super::{drv, Gpu, RowLayout};
use crate::error::{check, KernelError};
use crate::launch::grid_y_blocks;
use cudarc::driver::{CudaView, CudaViewMut, PushKernelArg};

/// The kernels' `n_tokens` argument (grid y strides over them, so only i32 bounds it).
fn tokens_arg(op: &'static str, tokens: usize) -> Result<i32, KernelError> {
    i32::try_from(tokens).map_err(|_| KernelError::Shape {
        op,
        what: format!("{tokens} tokens"),
    })
}

/// Row length and epsilon of a norm.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NormShape {
    /// Values per row (the weight, when there is one, holds `n` floats).
    pub n: usize,
    /// Added to the mean square (RMSNorm) or the lower bound of the norm (L2) against division
    /// by zero.
    pub eps: f32,
}

/// The input of [`Gpu::rms_norm_launch`]: read only, or also the output (in place).
enum NormIn<'a, 'b> {
    Read(&'a CudaView<'b, f32>),
    InPlace(&'a mut CudaViewMut<'b, f32>),
}

impl Gpu {
    fn check_norm_weight(
        op: &'static str,
        w: &CudaView<'_, f32>,
        n: usize,
    ) -> Result<(), KernelError> {
        check(w.len() >= n, op, || {
            format!("weight has {} elements, n = {n}", w.len())
        })
    }

    /// RMSNorm of every row of `xl` (rows of `norm.n` values) into the same row of `yl`:
    /// `y = x / sqrt(mean(x^2) + eps) * w` (`w` optional). `x` and `y` must not overlap.
    pub fn rms_norm(
        &self,
        x: &CudaView<'_, f32>,
        xl: RowLayout,
        y: &mut CudaViewMut<'_, f32>,
        yl: RowLayout,
        w: Option<&CudaView<'_, f32>>,
        norm: NormShape,
    ) -> Result<(), KernelError> {
        const OP: &str = "rms_norm";
        Self::same_rows(OP, &xl, &yl)?;
        Self::check_layout(OP, "y", y.len(), &yl, norm.n)?;
        self.rms_norm_launch(OP, (NormIn::Read(x), xl), Some((y, yl)), w, norm)
    }

    /// [`Gpu::rms_norm`] in place (the per-head q/k norms of the attention mixer).
    pub fn rms_norm_inplace(
        &self,
        x: &mut CudaViewMut<'_, f32>,
        xl: RowLayout,
        w: Option<&CudaView<'_, f32>>,
        norm: NormShape,
    ) -> Result<(), KernelError> {
        self.rms_norm_launch("rms_norm_inplace", (NormIn::InPlace(x), xl), None, w, norm)
    }

    /// `rms_norm_f32` from `x` into `y`, or in place on `x` (`y` None: the kernel's null
    /// output); `y`'s layout is checked by the caller.
    fn rms_norm_launch(
        &self,
        op: &'static str,
        (x, xl): (NormIn<'_, '_>, RowLayout),
        y: Option<(&mut CudaViewMut<'_, f32>, RowLayout)>,
        w: Option<&CudaView<'_, f32>>,
        norm: NormShape,
    ) -> Result<(), KernelError> {
        let NormShape { n, eps } = norm;
        let x_len = match &x {
            NormIn::Read(x) => x.len(),
            NormIn::InPlace(x) => x.len(),
        };
        Self::check_layout(op, "x", x_len, &xl, n)?;
        if let Some(w) = w {
            Self::check_norm_weight(op, w, n)?;
        }
        let f = self.func("norm", "rms_norm_f32")?;
        let (xts, xhs, n_i) = (xl.tok_stride as i64, xl.head_stride as i64, n as i32);
        let (yts, yhs) = y.as_ref().map_or((0, 0), |(_, yl)| {
            (yl.tok_stride as i64, yl.head_stride as i64)
        });
        let null: u64 = 0;
        let nt = tokens_arg(op, xl.tokens)?;
        let mut b = self.stream.launch_builder(f);
        match x {
            NormIn::Read(x) => b.arg(x),
            NormIn::InPlace(x) => b.arg(x),
        };
        b.arg(&xts).arg(&xhs);
        match y {
            Some((y, _)) => b.arg(y),
            None => b.arg(&null),
        };
        b.arg(&yts).arg(&yhs);
        match w {
            Some(w) => b.arg(w),
            None => b.arg(&null),
        };
        b.arg(&n_i).arg(&eps).arg(&nt);
        // SAFETY: (x, x_ts, x_hs, y or null: in place, y_ts, y_hs, w or null, n, eps, n_tokens);
        // lengths checked; grid y strides over the tokens.
        unsafe {
            b.launch(Self::cfg(
                (xl.heads as u32, grid_y_blocks(xl.tokens), 1),
                256,
                0,
            ))
        }
        .map_err(drv("rms_norm_f32"))?;
        Ok(())
    }

    /// Gated RMSNorm in place of every row of `xl`: `x = rms(x) * w * silu(z)` with `z`'s rows
    /// laid out as `zl` (the GDN output norm; `w`: `norm.n` floats).
    pub fn gated_rms_norm_inplace(
        &self,
        x: &mut CudaViewMut<'_, f32>,
        xl: RowLayout,
        z: &CudaView<'_, f32>,
        zl: RowLayout,
        w: &CudaView<'_, f32>,
        norm: NormShape,
    ) -> Result<(), KernelError> {
        const OP: &str = "gated_rms_norm_inplace";
        let NormShape { n, eps } = norm;
        Self::same_rows(OP, &xl, &zl)?;
        Self::check_layout(OP, "x", x.len(), &xl, n)?;
        Self::check_layout(OP, "z", z.len(), &zl, n)?;
        Self::check_norm_weight(OP, w, n)?;
        let f = self.func("norm", "gated_rms_norm_f32")?;
        let (xts, xhs, zts, zhs) = (
            xl.tok_stride as i64,
            xl.head_stride as i64,
            zl.tok_stride as i64,
            zl.head_stride as i64,
        );
        let (n_i, nt) = (n as i32, tokens_arg(OP, xl.tokens)?);
        let (null, zero): (u64, i64) = (0, 0);
        let mut b = self.stream.launch_builder(f);
        b.arg(x)
            .arg(&xts)
            .arg(&xhs)
            .arg(z)
            .arg(&zts)
            .arg(&zhs)
            .arg(&null)
            .arg(&zero)
            .arg(&zero);
        b.arg(w).arg(&n_i).arg(&eps).arg(&nt);
        // SAFETY: arguments as declared, output null: in place; lengths checked; grid y
        // strides over the tokens.
        unsafe {
            b.launch(Self::cfg(
                (xl.heads as u32, grid_y_blocks(xl.tokens), 1),
                128,
                0,
            ))
        }
        .map_err(drv("gated_rms_norm_f32"))?;
        Ok(())
    }

    /// L2 normalisation with scale in place of every row of `xl` (rows of `norm.n`):
    /// `x = x * scale / max(||x||, eps)` (GDN q/k heads inside the conv output).
    pub fn l2_norm_inplace(
        &self,
        x: &mut CudaViewMut<'_, f32>,
        xl: RowLayout,
        norm: NormShape,
        scale: f32,
    ) -> Result<(), KernelError> {
        const OP: &str = "l2_norm_inplace";
        let NormShape { n, eps } = norm;
        Self::check_layout(OP, "x", x.len(), &xl, n)?;
        let f = self.func("norm", "l2_norm_f32")?;
        let (xts, xhs, n_i) = (xl.tok_stride as i64, xl.head_stride as i64, n as i32);
        let nt = tokens_arg(OP, xl.tokens)?;
        let (null, zero): (u64, i64) = (0, 0);
        let mut b = self.stream.launch_builder(f);
        b.arg(x)
            .arg(&xts)
            .arg(&xhs)
            .arg(&null)
            .arg(&zero)
            .arg(&zero)
            .arg(&n_i)
            .arg(&eps)
            .arg(&scale)
            .arg(&nt);
        // SAFETY: arguments as declared, y null: in place; lengths checked; grid y strides
        // over the tokens.
        unsafe {
            b.launch(Self::cfg(
                (xl.heads as u32, grid_y_blocks(xl.tokens), 1),
                128,
                0,
            ))
        }
        .map_err(drv("l2_norm_f32"))?;
        Ok(())
    }
}
