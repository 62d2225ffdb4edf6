//! The kernels' own sources run on the host by the SIMT emulator (`host/simt_emu.h`, compiled
//! from `host/emu_*.cpp`), with what their memory accesses would cost on the device: bank
//! conflicts per warp-wide shared-memory access, 32-byte sectors per warp-wide global load, and
//! per launch the bytes requested and the distinct sectors touched (the DRAM footprint). For the
//! host tests and the traffic model (`cargo xtask traffic`); not a production API.
//!
//! Global loads are counted where the kernels use `__ldg` (every read-only input of the decode
//! GEMVs); plain loads and stores are executed but not counted.

use crate::launch::Launch;
use std::ffi::{c_void, CString};

mod batch;
mod fuse;
mod group;
mod norm_grid;
mod q8_group;
mod quant_batch;
pub use batch::{pn_gemv_batch, pn_prepare_rows};
pub use fuse::{add_rms_norm_hadamard_prep, swiglu_hadamard_prep, FuseShape, NormOut, Prepared};
pub use group::{pn_gemv_group, GroupMember};
pub use norm_grid::norm_strided;
pub use q8_group::q8_0_gemv_group;
pub use quant_batch::quant_gemv_batch;

/// Regions the counters split global loads by.
pub mod region {
    /// Weights (the matrix of a GEMV).
    pub const WEIGHT: usize = 1;
    /// The activation vector (x, or its fp16 copy).
    pub const X: usize = 2;
    /// The K cache.
    pub const K_CACHE: usize = 3;
    /// The V cache.
    pub const V_CACHE: usize = 4;
}

/// Per-launch cost counters (layout of `PnEmuStats` in `host/simt_emu.h`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct EmuStats {
    /// Warp-wide shared-memory instructions.
    pub smem_instr: u64,
    /// Wavefronts they take (bank conflicts replay).
    pub smem_wave: u64,
    /// Wavefronts without conflicts.
    pub smem_ideal: u64,
    /// Worst instruction: wavefronts / minimum (1.0: conflict-free).
    pub smem_max_degree: f64,
    /// Instructions with a conflict.
    pub smem_bad_instr: u64,
    /// Warp-wide global loads, per region (0: not registered).
    pub g_instr: [u64; 8],
    /// Distinct 32-byte sectors per instruction, summed, per region.
    pub g_sectors: [u64; 8],
    /// Minimum sectors for the bytes each instruction requested, summed, per region.
    pub g_min_sectors: [u64; 8],
    /// Bytes requested, per region.
    pub g_bytes: [u64; 8],
    /// Distinct sectors of the whole launch, per region: its DRAM footprint / 32.
    pub g_unique_sectors: [u64; 8],
    /// Set when a block deadlocked on mismatched barriers.
    pub deadlock: i32,
}

impl EmuStats {
    /// Sectors over the minimum for the loads of `region` (1.0: perfectly coalesced).
    pub fn sector_ratio(&self, region: usize) -> f64 {
        self.g_sectors[region] as f64 / self.g_min_sectors[region].max(1) as f64
    }
    /// Mean shared-memory wavefronts per conflict-free wavefront.
    pub fn smem_mean_degree(&self) -> f64 {
        self.smem_wave as f64 / self.smem_ideal.max(1) as f64
    }
    /// Distinct bytes of `region` the launch read (sectors x 32).
    pub fn unique_bytes(&self, region: usize) -> u64 {
        32 * self.g_unique_sectors[region]
    }
    /// Distinct bytes over all regions.
    pub fn unique_bytes_total(&self) -> u64 {
        32 * self.g_unique_sectors.iter().sum::<u64>()
    }
}

/// Why an emulated launch failed.
#[derive(Debug, thiserror::Error)]
pub enum EmuError {
    /// The threads of a block deadlocked on mismatched barriers.
    #[error("{kernel}: the threads of a block deadlocked on their barriers")]
    Deadlock {
        /// Kernel name.
        kernel: String,
    },
    /// The emulator does not know the kernel (or type).
    #[error("{kernel}: not a kernel the emulator runs")]
    Unknown {
        /// Kernel name.
        kernel: String,
    },
    /// Buffers too short for the shape.
    #[error("{kernel}: {what}")]
    Shape {
        /// Kernel name.
        kernel: String,
        /// What is short, with the numbers.
        what: String,
    },
}

#[allow(clippy::too_many_arguments)] // the C side mirrors the kernels' own parameter lists
extern "C" {
    fn pn_emu_reset();
    fn pn_emu_region(id: i32, p: *const c_void, len: u64);
    fn pn_emu_stats(out: *mut EmuStats);
    fn pn_emu_pn_gemv(
        name: *const std::ffi::c_char,
        w: *const c_void,
        x: *const f32,
        xh: *const c_void,
        e: *const i32,
        y: *mut f32,
        n: i32,
        k: i32,
        grid: u32,
        threads: u32,
        smem: u32,
    ) -> i32;
    fn pn_emu_quant_gemv(
        ty: i32,
        w: *const c_void,
        x: *const f32,
        y: *mut f32,
        n: i32,
        k: i32,
        grid: u32,
        threads: u32,
        smem: u32,
    ) -> i32;
    fn pn_emu_norm(
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
    ) -> i32;
    fn pn_emu_hadamard(
        kind: i32,
        x: *const f32,
        x_stride: i64,
        z: *const f32,
        y: *mut f32,
        y_stride: i64,
        w: *const f32,
        n: i32,
        eps: f32,
        r: i32,
        scale: f32,
        grid: u32,
        threads: u32,
        smem: u32,
    ) -> i32;
    fn pn_emu_attention(
        kv_type: i32,
        q: *const f32,
        q_tok_stride: i64,
        q_head_stride: i64,
        kc: *const c_void,
        vc: *const c_void,
        pos_stride: i64,
        head_stride: i64,
        n_head: i32,
        group: i32,
        p0: i32,
        t: i32,
        n_split: i32,
        chunk: i32,
        scale: f32,
        part_o: *mut f32,
        part_ml: *mut f32,
        o: *mut f32,
        o_tok_stride: i64,
    ) -> i32;
    fn pn_emu_kv_store(
        kv_type: i32,
        k: *const f32,
        v: *const f32,
        tok_stride: i64,
        kc: *mut c_void,
        vc: *mut c_void,
        pos_stride: i64,
        head_stride: i64,
        p0: i32,
        n_kv: i32,
        t: i32,
    ) -> i32;
}

/// Resets the counters, names the regions, runs `f` (one or more emulated launches), returns the
/// counters.
pub(crate) fn counted(
    kernel: &str,
    regions: &[(usize, *const c_void, usize)],
    f: impl FnOnce() -> i32,
) -> Result<EmuStats, EmuError> {
    // SAFETY: the emulator's state is per OS thread; the regions are only compared as addresses.
    unsafe {
        pn_emu_reset();
        for &(id, p, len) in regions {
            pn_emu_region(id as i32, p, len as u64);
        }
    }
    let rc = f();
    let mut s = EmuStats::default();
    // SAFETY: `s` is a PnEmuStats-layout struct.
    unsafe { pn_emu_stats(&mut s) };
    match rc {
        0 => Ok(s),
        -1 => Err(EmuError::Deadlock {
            kernel: kernel.into(),
        }),
        _ => Err(EmuError::Unknown {
            kernel: kernel.into(),
        }),
    }
}

pub(crate) fn need(kernel: &str, ok: bool, what: impl FnOnce() -> String) -> Result<(), EmuError> {
    if ok {
        Ok(())
    } else {
        Err(EmuError::Shape {
            kernel: kernel.into(),
            what: what(),
        })
    }
}

/// The activation of a PN half2 GEMV: f32 (the kernel stages it) or prepared (fp16 bits of x
/// times 2^e, and e, as `pn_prepare_x_h2` writes them).
#[derive(Clone, Copy, Debug)]
pub enum PnInput<'a> {
    /// x as f32 (also the input of the f32 kernels).
    F32(&'a [f32]),
    /// The prepared fp16 copy and its exponent.
    Prepared(&'a [u16], i32),
}

/// Runs a pn_gemv.cu kernel (`launch.kernel`, or `legacy_pn{3,4}t_gemv_h2_r{1,2}`: the layout
/// before the counters, host-only) on `w` (`n` rows of `k` PN elements) into `y[0..n)`.
/// Regions: [`region::WEIGHT`], [`region::X`].
pub fn pn_gemv(
    launch: &Launch,
    w: &[u8],
    x: PnInput<'_>,
    y: &mut [f32],
    n: usize,
    k: usize,
) -> Result<EmuStats, EmuError> {
    let kernel = launch.kernel;
    let wpb = if kernel.contains("pn3t") { 80 } else { 64 };
    need(
        kernel,
        k.is_multiple_of(wpb) && w.len() >= n * k / wpb * 34 && y.len() >= n,
        || format!("w {} bytes, y {} for {n} x {k}", w.len(), y.len()),
    )?;
    // The kernels read whole 4-byte words: give them an aligned copy (as a device allocation is).
    let wa = Aligned::new(&w[..n * k / wpb * 34]);
    let (xp, xhp, e, xlen) = match x {
        PnInput::F32(x) => {
            need(kernel, x.len() >= k, || format!("x has {}", x.len()))?;
            (x.as_ptr(), std::ptr::null::<u16>(), 0i32, 4 * k)
        }
        PnInput::Prepared(xh, e) => {
            need(kernel, xh.len() >= k, || format!("xh has {}", xh.len()))?;
            (std::ptr::null(), xh.as_ptr(), e, 2 * k)
        }
    };
    let xbase: *const c_void = if xp.is_null() { xhp.cast() } else { xp.cast() };
    let name = CString::new(kernel).expect("kernel names have no NUL");
    counted(
        kernel,
        &[
            (region::WEIGHT, wa.as_ptr(), n * k / wpb * 34),
            (region::X, xbase, xlen),
        ],
        || {
            // SAFETY: buffers checked for the shape above; the kernel reads w (n*k/wpb*34
            // bytes), x or xh (k), e, and writes y[0..n).
            unsafe {
                pn_emu_pn_gemv(
                    name.as_ptr(),
                    wa.as_ptr(),
                    xp,
                    xhp.cast(),
                    &e,
                    y.as_mut_ptr(),
                    n as i32,
                    k as i32,
                    launch.grid,
                    launch.threads,
                    launch.smem,
                )
            }
        },
    )
}

/// `pn_prepare_x_h2` (one block of 1024 threads): the fp16 copy of x and its exponent.
pub fn pn_prepare_x(x: &[f32]) -> Result<(Vec<u16>, i32), EmuError> {
    let k = x.len();
    let mut xh = vec![0u16; k];
    let mut e = 0i32;
    let name = CString::new("pn_prepare_x_h2").expect("no NUL");
    counted("pn_prepare_x_h2", &[], || {
        // SAFETY: x has k floats, xh k halves, e one int.
        unsafe {
            pn_emu_pn_gemv(
                name.as_ptr(),
                std::ptr::null(),
                x.as_ptr(),
                xh.as_mut_ptr().cast(),
                std::ptr::from_mut(&mut e),
                std::ptr::null_mut(),
                0,
                k as i32,
                1,
                1024,
                0,
            )
        }
    })?;
    Ok((xh, e))
}

/// Stock GEMV types of quant_gemv.cu.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StockType {
    /// f32 weights.
    F32,
    /// f16 weights.
    F16,
    /// Q8_0 blocks.
    Q8_0,
    /// Q4_K super-blocks.
    Q4K,
}

/// Runs a quant_gemv.cu kernel on `w` (`row_bytes` per row) into `y[0..n)`; regions as
/// [`pn_gemv`].
pub fn quant_gemv(
    ty: StockType,
    launch: &Launch,
    w: &[u8],
    row_bytes: usize,
    x: &[f32],
    y: &mut [f32],
    n: usize,
) -> Result<EmuStats, EmuError> {
    let k = x.len();
    let kernel = launch.kernel;
    need(kernel, w.len() >= n * row_bytes && y.len() >= n, || {
        format!("w {} bytes, y {}", w.len(), y.len())
    })?;
    let wa = Aligned::new(&w[..n * row_bytes]);
    let t = match ty {
        StockType::F32 => 0,
        StockType::F16 => 1,
        StockType::Q8_0 => 2,
        StockType::Q4K => 3,
    };
    counted(
        kernel,
        &[
            (region::WEIGHT, wa.as_ptr(), n * row_bytes),
            (region::X, x.as_ptr().cast(), 4 * k),
        ],
        || {
            // SAFETY: lengths checked above.
            unsafe {
                pn_emu_quant_gemv(
                    t,
                    wa.as_ptr(),
                    x.as_ptr(),
                    y.as_mut_ptr(),
                    n as i32,
                    k as i32,
                    launch.grid,
                    launch.threads,
                    launch.smem,
                )
            }
        },
    )
}

/// 128 bytes, 128-byte aligned: the unit of [`Aligned`].
#[derive(Clone, Copy)]
#[repr(C, align(128))]
struct Line([u8; 128]);

/// A copy of a weight tensor at a 128-byte aligned address, as a device allocation is (256):
/// the sector counts depend on it.
pub(crate) struct Aligned(Vec<Line>);

impl Aligned {
    pub(crate) fn new(src: &[u8]) -> Self {
        let mut v = vec![Line([0; 128]); src.len().div_ceil(128).max(1)];
        for (line, c) in v.iter_mut().zip(src.chunks(128)) {
            line.0[..c.len()].copy_from_slice(c);
        }
        Aligned(v)
    }
    pub(crate) fn as_ptr(&self) -> *const c_void {
        self.0.as_ptr().cast()
    }
}

/// A per-row normalisation of norm.cu over `rows` contiguous rows of `n` values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Norm<'a> {
    /// `rms_norm_f32` with an optional weight.
    Rms {
        /// Weight (n values) or none.
        w: Option<&'a [f32]>,
        /// Epsilon.
        eps: f32,
    },
    /// `l2_norm_f32`: x * scale / max(||x||, eps).
    L2 {
        /// Epsilon.
        eps: f32,
        /// Scale.
        scale: f32,
    },
    /// `gated_rms_norm_f32`: rms(o) * w * silu(z).
    Gated {
        /// Gate rows (same shape as x).
        z: &'a [f32],
        /// Weight (n values).
        w: &'a [f32],
        /// Epsilon.
        eps: f32,
    },
}

/// Runs a norm.cu kernel on `x` (rows of `n`) into `y` with `threads` per block (one block per
/// row).
pub fn norm(
    kind: Norm<'_>,
    x: &[f32],
    y: &mut [f32],
    n: usize,
    threads: u32,
) -> Result<EmuStats, EmuError> {
    let rows = x.len() / n;
    need("norm", y.len() >= x.len() && rows > 0, || {
        "y shorter than x".into()
    })?;
    let (k, z, w, eps, scale) = match kind {
        Norm::Rms { w, eps } => (
            0,
            std::ptr::null(),
            w.map_or(std::ptr::null(), |w| w.as_ptr()),
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
    counted("norm", &[], || {
        // SAFETY: rows x n values in x, z, y; w n values; one block per row (grid.y = rows).
        unsafe {
            pn_emu_norm(
                k,
                x.as_ptr(),
                n as i64,
                0,
                z,
                n as i64,
                0,
                y.as_mut_ptr(),
                n as i64,
                0,
                w,
                n as i32,
                eps,
                scale,
                1,
                rows as u32,
                threads,
            )
        }
    })
}

/// A hadamard.cu kernel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rotation<'a> {
    /// `rms_norm_hadamard_f32`: y = H(rms(x) * w) per row of `n` (one block per row).
    RmsNorm {
        /// Weight (n values).
        w: &'a [f32],
        /// Row length.
        n: usize,
        /// Epsilon.
        eps: f32,
    },
    /// `swiglu_hadamard_f32`: y = H(silu(x) * up), one block per R-chunk.
    Swiglu {
        /// The up projection (same length as x).
        up: &'a [f32],
    },
    /// `hadamard_f32`, one block per R-chunk.
    Plain,
}

/// Runs a hadamard.cu kernel with chunk `r` (scale 1/sqrt(r)) and `threads` per block.
pub fn hadamard(
    kind: Rotation<'_>,
    x: &[f32],
    y: &mut [f32],
    r: usize,
    threads: u32,
) -> Result<EmuStats, EmuError> {
    need(
        "hadamard",
        y.len() >= x.len() && x.len().is_multiple_of(r) && r.is_power_of_two(),
        || format!("x {} values, chunk {r}", x.len()),
    )?;
    let scale = 1.0 / (r as f32).sqrt();
    let (kind, z, w, n, eps, grid, smem) = match kind {
        Rotation::RmsNorm { w, n, eps } => {
            (0, std::ptr::null(), w.as_ptr(), n, eps, x.len() / n, 4 * n)
        }
        Rotation::Swiglu { up } => (1, up.as_ptr(), std::ptr::null(), r, 0.0, x.len() / r, 4 * r),
        Rotation::Plain => (
            2,
            std::ptr::null(),
            std::ptr::null(),
            r,
            0.0,
            x.len() / r,
            4 * r,
        ),
    };
    counted("hadamard", &[], || {
        // SAFETY: x/z/y hold grid chunks (or rows) of n values; w n values.
        unsafe {
            pn_emu_hadamard(
                kind,
                x.as_ptr(),
                n as i64,
                z,
                y.as_mut_ptr(),
                n as i64,
                w,
                n as i32,
                eps,
                r as i32,
                scale,
                grid as u32,
                threads,
                smem as u32,
            )
        }
    })
}

/// A split-K decode attention call (attention.cu): the shape and the caches' strides.
#[derive(Clone, Copy, Debug)]
pub struct AttnCall {
    /// Query heads.
    pub n_head: usize,
    /// Query heads per KV head.
    pub group: usize,
    /// Position of the first query token.
    pub p0: usize,
    /// Query tokens.
    pub t: usize,
    /// Splits of the context.
    pub n_split: usize,
    /// Positions per split.
    pub chunk: usize,
    /// Score scale.
    pub scale: f32,
    /// The caches.
    pub kv: KvGeom,
}

/// Runs attn_partial_* then attn_combine: `q` (t x n_head x 256) into `o` (same shape); the
/// caches `kc` / `vc` as raw bytes of `kv_type` elements. Regions [`region::K_CACHE`],
/// [`region::V_CACHE`] (counted only where loaded with `__ldg`).
pub fn attention(
    c: &AttnCall,
    q: &[f32],
    kc: &[u8],
    vc: &[u8],
    o: &mut [f32],
) -> Result<EmuStats, EmuError> {
    let hd = c.n_head * 256;
    let need_b = c.kv.bytes(c.p0 + c.t);
    need(
        "attention",
        q.len() >= c.t * hd
            && o.len() >= c.t * hd
            && c.group > 0
            && c.n_head == c.group * c.kv.n_kv
            && kc.len() >= need_b
            && vc.len() >= need_b
            && c.n_split * c.chunk >= c.p0 + c.t
            && (0..4).contains(&c.kv.kv_type),
        || {
            format!(
                "q/o {} / {}, caches {} / {} bytes (need {need_b}), {} heads",
                q.len(),
                o.len(),
                kc.len(),
                vc.len(),
                c.n_head
            )
        },
    )?;
    let mut part_o = vec![0f32; c.t * c.n_head * c.n_split * 256];
    let mut part_ml = vec![0f32; c.t * c.n_head * c.n_split * 2];
    counted(
        "attention",
        &[
            (region::K_CACHE, kc.as_ptr().cast(), kc.len()),
            (region::V_CACHE, vc.as_ptr().cast(), vc.len()),
        ],
        || {
            // SAFETY: the caller's caches cover p0 + t positions at the given strides; scratch
            // sized above.
            unsafe {
                pn_emu_attention(
                    c.kv.kv_type,
                    q.as_ptr(),
                    hd as i64,
                    256,
                    kc.as_ptr().cast(),
                    vc.as_ptr().cast(),
                    c.kv.pos_stride as i64,
                    c.kv.head_stride as i64,
                    c.n_head as i32,
                    c.group as i32,
                    c.p0 as i32,
                    c.t as i32,
                    c.n_split as i32,
                    c.chunk as i32,
                    c.scale,
                    part_o.as_mut_ptr(),
                    part_ml.as_mut_ptr(),
                    o.as_mut_ptr(),
                    hd as i64,
                )
            }
        },
    )
}

/// Cache geometry of a KV call: element type, strides in cache elements (f32 / f16 values or
/// bytes for q8_0 / q4_0), KV heads.
#[derive(Clone, Copy, Debug)]
pub struct KvGeom {
    /// 0 f32, 1 f16 bits, 2 q8_0 bytes, 3 q4_0 bytes.
    pub kv_type: i32,
    /// Elements between positions.
    pub pos_stride: usize,
    /// Elements between KV heads.
    pub head_stride: usize,
    /// KV heads.
    pub n_kv: usize,
}

impl KvGeom {
    /// Bytes of a cache holding `positions` positions.
    pub fn bytes(&self, positions: usize) -> usize {
        let (elem, row) = match self.kv_type {
            0 => (4, 256),
            1 => (2, 256),
            2 => (1, 272),
            _ => (1, 144),
        };
        elem * ((positions.max(1) - 1) * self.pos_stride + (self.n_kv - 1) * self.head_stride + row)
    }
}

/// Runs kv_store_* of the tokens of `k` / `v` (rows of `n_kv` heads of 256, contiguous per token)
/// into the caches at positions `p0..`.
pub fn kv_store(
    g: &KvGeom,
    k: &[f32],
    v: &[f32],
    kc: &mut [u8],
    vc: &mut [u8],
    p0: usize,
) -> Result<EmuStats, EmuError> {
    let t = k.len() / (g.n_kv * 256);
    let need_b = g.bytes(p0 + t);
    need(
        "kv_store",
        v.len() >= k.len()
            && t > 0
            && kc.len() >= need_b
            && vc.len() >= need_b
            && (0..4).contains(&g.kv_type),
        || {
            format!(
                "{t} tokens, caches {} / {} bytes, need {need_b}",
                kc.len(),
                vc.len()
            )
        },
    )?;
    counted("kv_store", &[], || {
        // SAFETY: the caches cover p0 + t positions at the given strides (checked above).
        unsafe {
            pn_emu_kv_store(
                g.kv_type,
                k.as_ptr(),
                v.as_ptr(),
                (g.n_kv * 256) as i64,
                kc.as_mut_ptr().cast(),
                vc.as_mut_ptr().cast(),
                g.pos_stride as i64,
                g.head_stride as i64,
                p0 as i32,
                g.n_kv as i32,
                t as i32,
            )
        }
    })
}
