//! The small-batch stock GEMVs (`q4_k_gemv_b2` .. `_b8`, `q8_0_gemv_b2` .. `_b8`,
//! kernels/q4k_batch.cu) run by the emulator.

use super::{counted, need, region, Aligned, EmuError, EmuStats, StockType};
use crate::launch::QuantBatchLaunch;
use std::ffi::c_void;

/// The launch's arguments (the parameter list of `pn_emu_quant_gemv_batch` in
/// host/emu_ops.cpp, passed through one struct).
#[repr(C)]
struct QuantBatchArgs {
    ty: i32,
    t: i32,
    w: *const c_void,
    x: *const f32,
    y: *mut f32,
    n: i32,
    k: i32,
    s: i32,
    grid: u32,
    threads: u32,
    smem: u32,
}

extern "C" {
    fn pn_emu_quant_gemv_batch(a: *const QuantBatchArgs) -> i32;
}

/// Runs the small-batch kernel `b` (Q4_K or Q8_0, as `ty`) on `w` (`n` rows of `k`) for `b.t`
/// activation rows `x` (`t * k` floats, row r at `r * k`) into `y` (`t` rows of `n`).
/// Regions: [`region::WEIGHT`], [`region::X`].
pub fn quant_gemv_batch(
    ty: StockType,
    b: &QuantBatchLaunch,
    w: &[u8],
    x: &[f32],
    y: &mut [f32],
    (n, k): (usize, usize),
) -> Result<EmuStats, EmuError> {
    let kernel = b.launch.kernel;
    let (code, row_bytes) = match ty {
        StockType::Q4K if k.is_multiple_of(256) => (3, k / 256 * 144),
        StockType::Q8_0 if k.is_multiple_of(32) => (2, k / 32 * 34),
        _ => {
            return Err(EmuError::Shape {
                kernel: kernel.into(),
                what: format!("{ty:?} rows of {k}: no small-batch kernel"),
            })
        }
    };
    let t = b.t;
    let wbytes = n * row_bytes;
    need(
        kernel,
        w.len() >= wbytes && x.len() >= t * k && y.len() >= t * n,
        || {
            format!(
                "w {} bytes, x {}, y {} for {t} x {n} x {k}",
                w.len(),
                x.len(),
                y.len()
            )
        },
    )?;
    let wa = Aligned::new(&w[..wbytes]);
    counted(
        kernel,
        &[
            (region::WEIGHT, wa.as_ptr(), wbytes),
            (region::X, x.as_ptr().cast(), 4 * t * k),
        ],
        || {
            let a = QuantBatchArgs {
                ty: code,
                t: t as i32,
                w: wa.as_ptr(),
                x: x.as_ptr(),
                y: y.as_mut_ptr(),
                n: n as i32,
                k: k as i32,
                s: b.chunk_sbs as i32,
                grid: b.launch.grid,
                threads: b.launch.threads,
                smem: b.launch.smem,
            };
            // SAFETY: buffers checked for the shape above; the kernel reads w (wbytes), x (t*k)
            // and writes y[0..t*n); `a` lives across the call.
            unsafe { pn_emu_quant_gemv_batch(&a) }
        },
    )
}
