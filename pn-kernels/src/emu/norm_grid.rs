//! The norm.cu kernels on a grid smaller than their token count (review finding 8: grid y
//! strides over the tokens), run by the emulator.

use super::{counted, need, EmuError, EmuStats, Norm};

extern "C" {
    fn pn_emu_norm_grid(
        kind: i32,
        x: *const f32,
        x_ts: i64,
        x_hs: i64,
        z: *const f32,
        z_ts: i64,
        z_hs: i64,
        y: *mut f32,
        y_ts: i64,
        y_hs: i64,
        w: *const f32,
        n: i32,
        eps: f32,
        scale: f32,
        gx: u32,
        gy: u32,
        threads: u32,
        n_tokens: i32,
    ) -> i32;
}

/// [`super::norm`] of `x` (rows of `n`) into `y` with the rows on grid y in `grid_y` blocks
/// (1..=rows; each block strides over the rows).
pub fn norm_strided(
    kind: Norm<'_>,
    (x, y): (&[f32], &mut [f32]),
    n: usize,
    threads: u32,
    grid_y: u32,
) -> Result<EmuStats, EmuError> {
    let rows = x.len() / n.max(1);
    need(
        "norm",
        n > 0 && y.len() >= x.len() && rows > 0 && (1..=rows).contains(&(grid_y as usize)),
        || format!("{rows} rows of {n} on {grid_y} blocks, y {}", y.len()),
    )?;
    let (k, z, w, eps, scale) = match kind {
        Norm::Rms { w, eps } => (
            0,
            std::ptr::null(),
            w.map_or(std::ptr::null(), <[f32]>::as_ptr),
            eps,
            1.0,
        ),
        Norm::L2 { eps, scale } => (1, std::ptr::null(), std::ptr::null(), eps, scale),
        Norm::Gated { z, w, eps } => {
            need("gated_rms_norm", z.len() >= x.len() && w.len() >= n, || {
                "z or w short".into()
            })?;
            (2, z.as_ptr(), w.as_ptr(), eps, 1.0)
        }
    };
    let nl = n as i64;
    counted("norm", &[], || {
        // SAFETY: rows x n values in x, z, y; w n values; the kernel visits rows < n_tokens.
        unsafe {
            pn_emu_norm_grid(
                k,
                x.as_ptr(),
                nl,
                0,
                z,
                nl,
                0,
                y.as_mut_ptr(),
                nl,
                0,
                w,
                n as i32,
                eps,
                scale,
                1,
                grid_y,
                threads,
                rows as i32,
            )
        }
    })
}
