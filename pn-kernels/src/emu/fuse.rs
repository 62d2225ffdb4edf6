//! The fused producers of `kernels/fuse.cu` (residual add + RMSNorm + rotation + fp16 copy;
//! SwiGLU + rotation + fp16 copy) run by the emulator.

use super::{counted, need, EmuError, EmuStats};
use std::ffi::c_void;

/// The launch's arguments (layout of `PnFuseArgs` in host/emu_fuse.cpp).
#[repr(C)]
struct FuseArgs {
    kind: i32,
    x: *mut f32,
    r: *const f32,
    y: *mut f32,
    yp: *mut f32,
    w: *const f32,
    n: i32,
    eps: f32,
    big_r: i32,
    cap: i32,
    scale: f32,
    xh: *mut c_void,
    e: *mut i32,
    rows: i32,
    grid: u32,
    threads: u32,
    smem: u32,
}

extern "C" {
    fn pn_emu_fuse(a: *const FuseArgs) -> i32;
}

/// What a fused producer wrote besides its f32 rows: the prepared fp16 copy (`rows * n`
/// halves, row t at `t * n`) and one exponent per row, as `pn_prepare_rows` gives them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prepared {
    /// fp16 bits of each value times 2^e of its row.
    pub xh: Vec<u16>,
    /// The exponent of each row.
    pub e: Vec<i32>,
}

/// The shape of one fused launch: `rows` rows of `n` values rotated in chunks of `r`, on
/// `grid` blocks (rows are grid-strided) of `threads`.
#[derive(Clone, Copy, Debug)]
pub struct FuseShape {
    /// Rows.
    pub rows: usize,
    /// Values per row.
    pub n: usize,
    /// Rotation block (a power of two dividing `n`).
    pub r: usize,
    /// Thread blocks.
    pub grid: u32,
    /// Threads per block.
    pub threads: u32,
}

impl FuseShape {
    fn check(&self, kernel: &str, lens: &[usize]) -> Result<(), EmuError> {
        let Self { rows, n, r, .. } = *self;
        let ok = rows > 0
            && n > 0
            && n.is_multiple_of(r)
            && r.is_power_of_two()
            && n.is_multiple_of(2)
            && lens.iter().all(|&l| l >= rows * n);
        need(kernel, ok, || {
            format!("{rows} rows of {n}, chunk {r}, buffers {lens:?}")
        })
    }
}

/// Where [`add_rms_norm_hadamard_prep`] writes its rows (`rows * n` values each).
pub struct NormOut<'a> {
    /// The rotated rows `H_r(rms(x) * w)` (none: no rotation and no fp16 copy).
    pub rot: Option<&'a mut [f32]>,
    /// The unrotated rows `rms(x) * w`.
    pub plain: Option<&'a mut [f32]>,
    /// Whether the fp16 copy of the rotated rows is written (needs `rot`).
    pub prep: bool,
}

/// `add_rms_norm_hadamard_prep_f32`: for each row, `x += add` (when given; written back), then
/// the rows of `out`: `H_r(rms(x) * w)` with (when `out.prep`) its fp16 copy, and/or the
/// unrotated `rms(x) * w`. Dynamic shared memory `n` floats.
pub fn add_rms_norm_hadamard_prep(
    x: &mut [f32],
    add: Option<&[f32]>,
    (w, eps): (&[f32], f32),
    out: NormOut<'_>,
    shape: FuseShape,
) -> Result<(EmuStats, Option<Prepared>), EmuError> {
    const K: &str = "add_rms_norm_hadamard_prep_f32";
    let NormOut { rot, plain, prep } = out;
    let mut lens = vec![x.len()];
    lens.extend(add.map(<[f32]>::len));
    lens.extend(rot.as_deref().map(<[f32]>::len));
    lens.extend(plain.as_deref().map(<[f32]>::len));
    shape.check(K, &lens)?;
    need(K, w.len() >= shape.n && (rot.is_some() || !prep), || {
        format!(
            "weight has {} values; fp16 copy without rotated rows: {}",
            w.len(),
            rot.is_none() && prep
        )
    })?;
    let mut p = Prepared {
        xh: vec![0; if prep { shape.rows * shape.n } else { 0 }],
        e: vec![0; if prep { shape.rows } else { 0 }],
    };
    let a = FuseArgs {
        kind: 0,
        x: x.as_mut_ptr(),
        r: add.map_or(std::ptr::null(), <[f32]>::as_ptr),
        y: rot.map_or(std::ptr::null_mut(), <[f32]>::as_mut_ptr),
        yp: plain.map_or(std::ptr::null_mut(), <[f32]>::as_mut_ptr),
        w: w.as_ptr(),
        n: shape.n as i32,
        eps,
        big_r: shape.r as i32,
        cap: shape.n as i32,
        scale: scale(shape.r),
        xh: if prep {
            p.xh.as_mut_ptr().cast()
        } else {
            std::ptr::null_mut()
        },
        e: if prep {
            p.e.as_mut_ptr()
        } else {
            std::ptr::null_mut()
        },
        rows: shape.rows as i32,
        grid: shape.grid,
        threads: shape.threads,
        smem: (4 * shape.n) as u32,
    };
    // SAFETY: every buffer given holds rows * n values (checked), xh/e rows * n halves / rows
    // ints; a null output is skipped by the kernel.
    let s = counted(K, &[], || unsafe { pn_emu_fuse(&a) })?;
    Ok((s, prep.then_some(p)))
}

/// `swiglu_hadamard_prep_f32`: for each row, `out = H_r(silu(gate) * up)` and (when `prep`)
/// its fp16 copy, `cap` values (whole chunks) per pass. Dynamic shared memory `cap` floats.
pub fn swiglu_hadamard_prep(
    (gate, up): (&[f32], &[f32]),
    out: &mut [f32],
    (shape, cap): (FuseShape, usize),
    prep: bool,
) -> Result<(EmuStats, Option<Prepared>), EmuError> {
    const K: &str = "swiglu_hadamard_prep_f32";
    shape.check(K, &[gate.len(), up.len(), out.len()])?;
    need(K, cap > 0 && cap.is_multiple_of(shape.r), || {
        format!(
            "{cap} values per pass is not a multiple of the chunk {}",
            shape.r
        )
    })?;
    let mut p = Prepared {
        xh: vec![0; if prep { shape.rows * shape.n } else { 0 }],
        e: vec![0; if prep { shape.rows } else { 0 }],
    };
    let a = FuseArgs {
        kind: 1,
        // Read only (the kernel's `gate` is const).
        x: gate.as_ptr().cast_mut(),
        r: up.as_ptr(),
        y: out.as_mut_ptr(),
        yp: std::ptr::null_mut(),
        w: std::ptr::null(),
        n: shape.n as i32,
        eps: 0.0,
        big_r: shape.r as i32,
        cap: cap as i32,
        scale: scale(shape.r),
        xh: if prep {
            p.xh.as_mut_ptr().cast()
        } else {
            std::ptr::null_mut()
        },
        e: if prep {
            p.e.as_mut_ptr()
        } else {
            std::ptr::null_mut()
        },
        rows: shape.rows as i32,
        grid: shape.grid,
        threads: shape.threads,
        smem: (4 * cap) as u32,
    };
    // SAFETY: as above; gate is only read.
    let s = counted(K, &[], || unsafe { pn_emu_fuse(&a) })?;
    Ok((s, prep.then_some(p)))
}

/// 1/sqrt(r) rounded once from f64, as the device wrappers and pn-format scale.
fn scale(r: usize) -> f32 {
    (1.0f64 / (r as f64).sqrt()) as f32
}
