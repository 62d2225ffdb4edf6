//! The small-batch PN GEMV (`pn*_gemv_h2p_b2` .. `_b8`, kernels/pn_gemv.cu) and the per-row fp16
//! conversion it reads, run by the emulator.

use super::{counted, need, region, Aligned, EmuError, EmuStats};
use crate::launch::BatchLaunch;
use std::ffi::{c_void, CString};

/// The small-batch launch's arguments (layout of `PnBatchArgs` in host/emu_pn_gemv.cpp).
#[repr(C)]
struct BatchArgs {
    name: *const std::ffi::c_char,
    w: *const c_void,
    xh: *const c_void,
    e: *const i32,
    y: *mut f32,
    n: i32,
    k: i32,
    xp: i32,
    groups: i32,
    grid: u32,
    threads: u32,
    smem: u32,
}

extern "C" {
    fn pn_emu_pn_gemv_batch(a: *const BatchArgs) -> i32;
    fn pn_emu_pn_prepare_rows(x: *const f32, k: i32, t: i32, xh: *mut c_void, e: *mut i32) -> i32;
}

/// `pn_prepare_x_h2` on a grid of `t` blocks: rows `x[r*k..(r+1)*k)` (`x`: `t` rows of `k`) to
/// their fp16 copies (`t * k` halves, row r at `r * k`) and exponents (`t`).
pub fn pn_prepare_rows(x: &[f32], t: usize, k: usize) -> Result<(Vec<u16>, Vec<i32>), EmuError> {
    const K: &str = "pn_prepare_x_h2";
    need(K, t > 0 && x.len() >= t * k && k.is_multiple_of(2), || {
        format!("x has {} values for {t} rows of {k}", x.len())
    })?;
    let mut xh = vec![0u16; t * k];
    let mut e = vec![0i32; t];
    counted(K, &[], || {
        // SAFETY: x has t*k floats, xh t*k halves, e t ints; block r touches row r only.
        unsafe {
            pn_emu_pn_prepare_rows(
                x.as_ptr(),
                k as i32,
                t as i32,
                xh.as_mut_ptr().cast(),
                e.as_mut_ptr(),
            )
        }
    })?;
    Ok((xh, e))
}

/// Runs the small-batch kernel `b` on `w` (`n` rows of `k` PN elements) for `b.t` prepared
/// activation rows (`xh`: `t * k` halves, `e`: `t` exponents, as [`pn_prepare_rows`] gives
/// them) into `y` (`t` rows of `n`). Regions: [`region::WEIGHT`], [`region::X`].
pub fn pn_gemv_batch(
    b: &BatchLaunch,
    w: &[u8],
    (xh, e): (&[u16], &[i32]),
    y: &mut [f32],
    n: usize,
    k: usize,
) -> Result<EmuStats, EmuError> {
    let kernel = b.launch.kernel;
    let wpb = if kernel.contains("pn3t") { 80 } else { 64 };
    let wbytes = n * k / wpb * 34;
    let t = b.t;
    need(
        kernel,
        k.is_multiple_of(2 * wpb)
            && w.len() >= wbytes
            && xh.len() >= t * k
            && e.len() >= t
            && y.len() >= t * n,
        || {
            format!(
                "w {} bytes, xh {}, e {}, y {} for {t} x {n} x {k}",
                w.len(),
                xh.len(),
                e.len(),
                y.len()
            )
        },
    )?;
    let wa = Aligned::new(&w[..wbytes]);
    let name = CString::new(kernel).expect("kernel names have no NUL");
    counted(
        kernel,
        &[
            (region::WEIGHT, wa.as_ptr(), wbytes),
            (region::X, xh.as_ptr().cast(), 2 * t * k),
        ],
        || {
            // SAFETY: buffers checked for the shape above; the kernel reads w (wbytes), xh
            // (t*k halves), e (t), and writes y[0..t*n).
            let a = BatchArgs {
                name: name.as_ptr(),
                w: wa.as_ptr(),
                xh: xh.as_ptr().cast(),
                e: e.as_ptr(),
                y: y.as_mut_ptr(),
                n: n as i32,
                k: k as i32,
                xp: b.xp as i32,
                groups: b.groups as i32,
                grid: b.launch.grid,
                threads: b.launch.threads,
                smem: b.launch.smem,
            };
            // SAFETY: `a` lives across the call.
            unsafe { pn_emu_pn_gemv_batch(&a) }
        },
    )
}
