//! The tiled matrix-matrix product for many input rows (prompt chunks): `out[t][r] = dot(row r,
//! x[t])` for groups of 16 input rows at a time: on AMX tiles where the CPU has them (16 x 16),
//! else with AVX-512 VNNI (the 16 inputs in the lanes of a vector, 8 weight rows per pass;
//! `tiles_vnni`), else, for int8 activations, with AVX2 (`tiles_avx2`), else the portable
//! reference.
//!
//! Activations are quantized per weight block to int16 exactly as decode quantizes them
//! ([`super::PreparedI16`]: `x ~= sx * q`, `sx = amax / 32767`, `q` rounded half away from
//! zero), so a prompt row gets the same integer block sums as the same row decoded alone: prefill
//! and decode differ only in the order of the f32 sums. (Until this design, prefill used 24-bit
//! activations, three byte planes instead of two: 1.5x the tile products and stores for numerics
//! that decode, and every token after the prompt, do not have.)
//! `q` is split into a signed high byte and an unsigned low byte; the codes enter as signed
//! `n - z`, so `tdpbssd` (high byte) and `tdpbsud` (low byte) give two exact int32 block sums,
//! combined as `256 c1 + c0` (`|sum (n - z) q| <= 80 * 4 * 32767 < 2^24`: exact in int32 and
//! in its f32 conversion).
//!
//! [`TileActs`] quantizes and arranges a set of input rows once per call into the AMX "B"
//! layout; [`matmul_tiled`] then runs any number of row ranges against it (one per thread).
//!
//! Prompt chunks on CPUs with AVX-512 VNNI but no AMX quantize to int8 instead
//! ([`TilePrecision::I8`], [`default_tile_precision`]): one `vpdpbusd` per four products
//! instead of two, so the tile kernel does twice the multiply-adds per instruction (llama.cpp's
//! 8-bit activations do the same). On AVX2 CPUs (no int16 tile kernel) they take int8 too, on
//! the `vpmaddubsw` kernel of `tiles_avx2`. The int8 error, at most `1/254` of a block's largest
//! activation, is two orders below the 3-4-bit weights' own; decode and the verify pass keep
//! int16, and `PN_TILE_ACTS=16` keeps prompt rows on decode's integer sums.

use super::aligned::AlignedVec;
use crate::error::PnError;
use crate::types::{PnType, BLOCK_BYTES};

/// Weight rows (and input rows) per tile: the AMX tile height.
pub const TILE: usize = 16;

/// Input rows at or above which [`matmul_tiled`] beats the fused multi-vector kernels
/// ([`super::matvec_multi`]) when AMX is available: the codes of a 16-row tile are unpacked
/// once and a tile of 16 input rows is computed at once, so a few rows waste most of it.
pub const TILED_ROWS_MIN: usize = super::MAX_ACTS + 1;

/// How [`TileActs`] quantizes a block of an input row: `x ~= sx * q`, `q` rounded half away
/// from zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TilePrecision {
    /// `|q| <= 32767`, decode's rule ([`super::PreparedI16`]): a prompt row gets the integer
    /// block sums a decode step would compute. Two byte planes: two products per `q`.
    I16,
    /// `|q| <= 127`: one byte plane, one product per `q` (VNNI kernel only; the AMX kernels run
    /// int8 activations through it).
    I8,
}

impl TilePrecision {
    /// Largest `|q|`.
    pub fn q_max(self) -> f32 {
        match self {
            TilePrecision::I16 => 32_767.0,
            TilePrecision::I8 => 127.0,
        }
    }
}

/// The precision prompt chunks should quantize to here: int8 where the tile kernel is the
/// AVX-512 VNNI one ([`TileKernel::Vnni`]: twice the products per instruction) or where only
/// the AVX2 int8 kernel exists ([`TileKernel::Avx2`]), int16 on AMX (whose int16 kernels are
/// already far ahead of the weights' read) and on the reference.
/// `PN_TILE_ACTS=16` (or `8`) forces one, for A/B runs and for prefill numerics identical to
/// decode's. Cached after the first call.
pub fn default_tile_precision() -> TilePrecision {
    static P: std::sync::OnceLock<TilePrecision> = std::sync::OnceLock::new();
    *P.get_or_init(|| match std::env::var("PN_TILE_ACTS").as_deref() {
        Ok("16") => TilePrecision::I16,
        Ok("8") => TilePrecision::I8,
        _ if default_kernel() == TileKernel::Vnni => TilePrecision::I8,
        // AVX2 without VNNI: int16 rows have no tile kernel, int8 rows do.
        _ if default_kernel() == TileKernel::Reference
            && int8_kernel() != TileKernel::Reference =>
        {
            TilePrecision::I8
        }
        _ => TilePrecision::I16,
    })
}

/// Input rows quantized per block ([`TilePrecision`]), in AMX tile order: per group of 16 input
/// rows and per block, the byte planes of `q` as `4S x 64`-byte tiles (`S` code pairs per word;
/// row `kk / 4` holds byte `kk % 4` of each of the 16 inputs at `4 n + kk % 4`, where block
/// position `kk = 16 j + l` is the code in 16-bit lane `l` of pair `j` of an unpacked word).
#[derive(Clone, Debug)]
pub struct TileActs {
    ty: PnType,
    precision: TilePrecision,
    k: usize,
    n: usize,
    /// `[group][block][kk / 4][input 16][kk % 4]` (cache-line aligned: the kernels load 64-byte
    /// rows of it): the signed plane: bits 8..16 of `q` (int16)
    /// or `q` itself (int8).
    pub(super) hi: AlignedVec<i8>,
    /// The same layout, bits 0..8 of `q` (unsigned; int16 only, empty for int8).
    pub(super) lo: AlignedVec<u8>,
    /// `[group][block][input 16]` activation scales (0 for padding inputs).
    pub(super) sx: Vec<f32>,
    /// `[group][block][input 16]` the zero point times the block's `sum(q)` (0 for padding
    /// inputs): the VNNI kernel multiplies the unsigned codes `n` and subtracts it to get
    /// `sum (n - z) q`.
    pub(super) zq: Vec<i32>,
}

/// A parallel loop: `run(n, f)` calls `f(i)` once for every `i` in `0..n`, on any threads (see
/// [`TileActs::update_with`]).
pub type ParallelFor<'a> = dyn Fn(usize, &(dyn Fn(usize) + Sync)) + Sync + 'a;

impl TileActs {
    /// Quantizes and arranges the `n` input rows of `x` (row-major, `n x k` with `k` a whole
    /// number of `ty` blocks) to int16. Non-finite values make their block's scale NaN (NaN
    /// results).
    pub fn new(ty: PnType, x: &[f32], n: usize) -> Result<Self, PnError> {
        Self::with_precision(ty, TilePrecision::I16, x, n)
    }

    /// [`TileActs::new`] at the precision given.
    pub fn with_precision(
        ty: PnType,
        precision: TilePrecision,
        x: &[f32],
        n: usize,
    ) -> Result<Self, PnError> {
        let mut t = TileActs {
            ty,
            precision,
            k: 0,
            n: 0,
            hi: AlignedVec::new(),
            lo: AlignedVec::new(),
            sx: Vec::new(),
            zq: Vec::new(),
        };
        t.update(x, n)?;
        Ok(t)
    }

    /// Re-prepares for new input rows, reusing the buffers.
    pub fn update(&mut self, x: &[f32], n: usize) -> Result<(), PnError> {
        self.update_with(x, n, 1, &|parts, f| (0..parts).for_each(f))
    }

    /// [`TileActs::update`] in `parts` independent pieces (contiguous runs of `[group][block]`
    /// of every buffer), handed to `run(n_parts, f)`, which must call `f(i)` once for every `i`
    /// in `0..n_parts`, on any threads (a thread pool's parallel loop). The result does not
    /// depend on `parts`.
    pub fn update_with(
        &mut self,
        x: &[f32],
        n: usize,
        parts: usize,
        run: &ParallelFor<'_>,
    ) -> Result<(), PnError> {
        let (ty, precision) = (self.ty, self.precision);
        if n == 0 || !x.len().is_multiple_of(n) {
            return Err(PnError::LengthMismatch {
                what: "tiled activations (a whole number of input rows)",
                expected: n.max(1) * (x.len() / n.max(1)),
                got: x.len(),
            });
        }
        let k = x.len() / n;
        let nb = super::check_k(ty, k)?;
        let bpw = ty.weights_per_block();
        let groups = n.div_ceil(TILE);
        self.k = k;
        self.n = n;
        let values = groups * nb * bpw * TILE;
        let lo_values = match self.precision {
            TilePrecision::I16 => values,
            TilePrecision::I8 => 0,
        };
        // Every byte is rewritten below except padding inputs' (zero here).
        self.lo.reset_zeroed(lo_values);
        self.hi.reset_zeroed(values);
        self.sx.clear();
        self.sx.resize(groups * nb * TILE, 0.0);
        self.zq.clear();
        self.zq.resize(groups * nb * TILE, 0);
        let total = groups * nb;
        let parts = parts.clamp(1, total.max(1));
        // Per part: its first `[group][block]` index and its slices of the three buffers.
        let mut pieces = Vec::with_capacity(parts);
        let (mut hi, mut lo) = (&mut self.hi[..], &mut self.lo[..]);
        let (mut sx, mut zq) = (&mut self.sx[..], &mut self.zq[..]);
        let mut first = 0;
        for i in 0..parts {
            let len = total / parts + usize::from(i < total % parts);
            let (hh, th) = hi.split_at_mut(len * bpw * TILE);
            let (hl, tl) = lo.split_at_mut(if lo_values == 0 { 0 } else { len * bpw * TILE });
            let (hs, ts) = sx.split_at_mut(len * TILE);
            let (hz, tz) = zq.split_at_mut(len * TILE);
            (hi, lo, sx, zq) = (th, tl, ts, tz);
            pieces.push(std::sync::Mutex::new(super::tiles_quant::Piece {
                first,
                hi: hh,
                lo: hl,
                sx: hs,
                zq: hz,
            }));
            first += len;
        }
        let piece = |i: usize| {
            // Each part locks only its own piece: never contended.
            let mut p = pieces[i].lock().unwrap_or_else(|e| e.into_inner());
            super::tiles_quant::quantize_blocks(ty, precision, x, n, nb, &mut p);
        };
        run(parts, &piece);
        Ok(())
    }

    /// Input rows held.
    pub fn n_rows(&self) -> usize {
        self.n
    }

    /// The weight type these activations are for.
    pub fn ty(&self) -> PnType {
        self.ty
    }

    /// How each block was quantized.
    pub fn precision(&self) -> TilePrecision {
        self.precision
    }

    /// Blocks per row.
    pub(super) fn nb(&self) -> usize {
        self.k / self.ty.weights_per_block()
    }
}

/// Whether [`matmul_tiled`] runs on AMX here: the CPU has AMX-TILE and AMX-INT8, the OS grants
/// this process the tile state, AVX-512BW is available and not capped away by
/// [`crate::ISA_ENV`], and `PN_AMX` is not `0` (for A/B runs). Cached after the first call.
pub fn amx_available() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        if matches!(std::env::var("PN_AMX").as_deref(), Ok("0")) {
            return false;
        }
        #[cfg(target_arch = "x86_64")]
        {
            crate::Isa::detect() >= crate::Isa::Avx512 && super::amx::request()
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}

/// Whether the AVX-512 VNNI tile kernel ([`TileKernel::Vnni`]) can run here: the CPU has
/// AVX-512 F/BW/VNNI, not capped away by [`crate::ISA_ENV`], and `PN_VNNI_TILES` is not `0`
/// (for A/B runs against the fused multi-vector kernels). Cached after the first call.
pub fn vnni_tiles_available() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        !matches!(std::env::var("PN_VNNI_TILES").as_deref(), Ok("0"))
            && crate::Isa::detect() >= crate::Isa::Avx512Vnni
    })
}

/// Whether the AVX2 int8 tile kernel ([`TileKernel::Avx2`]) can run here: the CPU has AVX2,
/// FMA and F16C, not capped away by [`crate::ISA_ENV`], and `PN_AVX2_TILES` is not `0` (for A/B
/// runs against the fused multi-vector kernels). Cached after the first call.
pub fn avx2_tiles_available() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        !matches!(std::env::var("PN_AVX2_TILES").as_deref(), Ok("0"))
            && crate::Isa::detect() >= crate::Isa::Avx2
    })
}

/// Whether [`matmul_tiled`] runs a fast kernel here for int16 activations (AMX, or AVX-512 VNNI
/// without it): where it does not, callers with many such input rows use
/// [`super::matvec_multi`] instead. Int8 activations have more ([`int8_kernel`]).
pub fn tiles_available() -> bool {
    default_kernel() != TileKernel::Reference
}

/// The kernel [`matmul_tiled`] runs int8 activations on: AVX-512 VNNI (also on AMX CPUs, all of
/// which have it), else AVX2, else the reference.
pub fn int8_kernel() -> TileKernel {
    if vnni_tiles_available() {
        TileKernel::Vnni
    } else if avx2_tiles_available() {
        TileKernel::Avx2
    } else {
        TileKernel::Reference
    }
}

/// `outs[t][r] = dot(row r, acts[t])` for `rows` consecutive rows of `weights`, in tiles of 16
/// input rows on the fastest kernel here for the activations' precision: [`default_kernel`]
/// for int16 (AMX, AVX-512 VNNI, or the portable reference: same arithmetic, slow, so callers
/// use [`super::matvec_multi`] where [`tiles_available`] is false), [`int8_kernel`] for int8
/// (AVX-512 VNNI or AVX2). Single-threaded: callers split the rows into ranges.
pub fn matmul_tiled(
    ty: PnType,
    weights: &[u8],
    rows: usize,
    acts: &TileActs,
    outs: &mut [&mut [f32]],
) -> Result<(), PnError> {
    matmul_tiled_kernel(fast_kernel(acts.precision), ty, weights, rows, acts, outs)
}

/// The fastest kernel here for activations of `precision`: [`default_kernel`] for int16,
/// [`int8_kernel`] for int8.
fn fast_kernel(precision: TilePrecision) -> TileKernel {
    match precision {
        TilePrecision::I16 => default_kernel(),
        TilePrecision::I8 => int8_kernel(),
    }
}

/// [`matmul_tiled`] with the kernel chosen: `fast` (the fastest here for the activations'
/// precision, as [`matmul_tiled`] picks it) or the portable reference.
pub fn matmul_tiled_with(
    fast: bool,
    ty: PnType,
    weights: &[u8],
    rows: usize,
    acts: &TileActs,
    outs: &mut [&mut [f32]],
) -> Result<(), PnError> {
    let kernel = if fast {
        fast_kernel(acts.precision)
    } else {
        TileKernel::Reference
    };
    matmul_tiled_kernel(kernel, ty, weights, rows, acts, outs)
}

/// The kernels behind [`matmul_tiled`], for tests and A/B benchmarks. Each falls back to the
/// reference where its instructions are missing ([`amx_available`],
/// [`vnni_tiles_available`], [`avx2_tiles_available`]); all give the same integer sums per block, summed in the same
/// order: bit-identical results. Int8 activations ([`TilePrecision::I8`]) run on
/// [`int8_kernel`] whichever fast kernel is named, except [`TileKernel::Avx2`] itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TileKernel {
    /// The portable reference (slow).
    Reference,
    /// One 16-row weight tile per pass: 8 tile loads per 16 x 16 result and block.
    AmxOneTile,
    /// Two (pn3t) or three (pn4t) row tiles per pass sharing each activation-tile load.
    AmxBlocked,
    /// AVX-512 VNNI: 16 inputs in the lanes of a vector, 8 weight rows per pass.
    Vnni,
    /// AVX2 `vpmaddubsw`, int8 activations only (int16 ones run the reference): 16 inputs in
    /// the lanes of two vectors, 3 weight rows per pass.
    Avx2,
}

impl TileKernel {
    /// Whether this kernel runs here (the reference always does).
    pub fn is_available(self) -> bool {
        match self {
            TileKernel::Reference => true,
            TileKernel::AmxOneTile | TileKernel::AmxBlocked => amx_available(),
            TileKernel::Vnni => vnni_tiles_available(),
            TileKernel::Avx2 => avx2_tiles_available(),
        }
    }
}

/// Weight rows per pass of [`matmul_tiled`]'s kernel for activations of `precision`: row
/// ranges that are multiples of it waste no tile work (a range that is not computes zero rows
/// in its last pass).
pub fn tiled_pass_rows(ty: PnType, precision: TilePrecision) -> usize {
    let kernel = fast_kernel(precision);
    #[cfg(target_arch = "x86_64")]
    match kernel {
        TileKernel::AmxBlocked => return super::tiles_amx::pass_rows(ty),
        TileKernel::Vnni => return super::tiles_vnni::ROWS,
        TileKernel::Avx2 => return super::tiles_avx2::ROWS,
        _ => {}
    }
    let _ = kernel;
    let _ = ty;
    TILE
}

/// The kernel [`matmul_tiled`] runs: on AMX the register-blocked one, else the AVX-512 VNNI one,
/// else the reference; `PN_TILE_KERNEL` (`blocked`, `one`, `vnni`) names another available one
/// for A/B runs of a whole model on one machine (all are bit-identical). Blocked is the AMX
/// default because it is the fastest (`cargo run --release -p pn-format --example tiled_ab`).
/// A software-pipelined one-tile kernel was tried and removed: slower than blocked on the whole
/// 27B-shaped prefill (pp64 at 2 threads, alternated: 4.61 and 4.05 tok/s against 5.85 and
/// 4.98). Cached after the first call.
pub fn default_kernel() -> TileKernel {
    static K: std::sync::OnceLock<TileKernel> = std::sync::OnceLock::new();
    *K.get_or_init(|| {
        let named = match std::env::var("PN_TILE_KERNEL").as_deref() {
            Ok("blocked") => Some(TileKernel::AmxBlocked),
            Ok("one") => Some(TileKernel::AmxOneTile),
            Ok("vnni") => Some(TileKernel::Vnni),
            _ => None,
        };
        [named, Some(TileKernel::AmxBlocked), Some(TileKernel::Vnni)]
            .into_iter()
            .flatten()
            .find(|k| k.is_available())
            .unwrap_or(TileKernel::Reference)
    })
}

/// [`matmul_tiled`] with the kernel named.
pub fn matmul_tiled_kernel(
    kernel: TileKernel,
    ty: PnType,
    weights: &[u8],
    rows: usize,
    acts: &TileActs,
    outs: &mut [&mut [f32]],
) -> Result<(), PnError> {
    if acts.ty != ty {
        return Err(PnError::TypeMismatch {
            prepared: acts.ty,
            weights: ty,
        });
    }
    if outs.len() != acts.n {
        return Err(PnError::LengthMismatch {
            what: "tiled outputs (one per input row)",
            expected: acts.n,
            got: outs.len(),
        });
    }
    if let Some(o) = outs.iter().find(|o| o.len() != rows) {
        return Err(PnError::LengthMismatch {
            what: "tiled output",
            expected: rows,
            got: o.len(),
        });
    }
    let nb = acts.nb();
    let expected = rows
        .checked_mul(nb * BLOCK_BYTES)
        .ok_or(PnError::LengthMismatch {
            what: "tiled weight bytes",
            expected: usize::MAX,
            got: weights.len(),
        })?;
    if weights.len() != expected {
        return Err(PnError::LengthMismatch {
            what: "tiled weight bytes",
            expected,
            got: weights.len(),
        });
    }
    if acts.n == 0 || rows == 0 {
        return Ok(());
    }
    if nb == 0 {
        outs.iter_mut().for_each(|o| o.fill(0.0));
        return Ok(());
    }
    #[cfg(target_arch = "x86_64")]
    if acts.precision == TilePrecision::I8 {
        // SAFETY: the kernel's instructions are available (`int8_kernel`); shapes checked
        // above.
        // The AVX2 kernel when named (to test it on a VNNI CPU), else the best one.
        let kernel = match kernel {
            TileKernel::Reference => TileKernel::Reference,
            TileKernel::Avx2 if avx2_tiles_available() => TileKernel::Avx2,
            _ => int8_kernel(),
        };
        match kernel {
            TileKernel::Avx2 => unsafe {
                super::tiles_avx2::matmul(ty, weights, rows, nb, acts, outs)
            },
            TileKernel::Vnni => unsafe {
                super::tiles_vnni::matmul(ty, weights, rows, nb, acts, outs)
            },
            _ => reference(ty, weights, rows, nb, acts, outs),
        }
        return Ok(());
    }
    #[cfg(target_arch = "x86_64")]
    if !matches!(kernel, TileKernel::Reference | TileKernel::Avx2) && kernel.is_available() {
        // SAFETY: the kernel's instructions are available (AMX: and the tile state granted);
        // `weights` holds `rows` rows of `nb` blocks and `acts` was built for `nb` blocks of `ty`
        // (both checked above), every output holds `rows` values.
        unsafe {
            match kernel {
                TileKernel::AmxOneTile => super::amx::matmul(ty, weights, rows, nb, acts, outs),
                TileKernel::Vnni => super::tiles_vnni::matmul(ty, weights, rows, nb, acts, outs),
                _ => super::tiles_amx::matmul(ty, weights, rows, nb, acts, outs),
            }
        };
        return Ok(());
    }
    reference(ty, weights, rows, nb, acts, outs);
    Ok(())
}

/// The portable form of the kernels' arithmetic: per block the exact int32 sums `c1`, `c0` of
/// `(n - z)` times each byte plane of `q`, combined as `256 c1 + c0` (int16; int8 has `c1`
/// alone), converted to f32, times `d * sx`, summed over blocks in order.
fn reference(
    ty: PnType,
    weights: &[u8],
    rows: usize,
    nb: usize,
    acts: &TileActs,
    outs: &mut [&mut [f32]],
) {
    let bpw = ty.weights_per_block();
    let cpw = ty.codes_per_word();
    let mask = u32::from(ty.max_code());
    let z = ty.zero_point();
    let rb = nb * BLOCK_BYTES;
    let mut codes = vec![0i32; bpw];
    for r in 0..rows {
        let row = &weights[r * rb..(r + 1) * rb];
        for (t, out) in outs.iter_mut().enumerate() {
            let (g, col) = (t / TILE, t % TILE);
            let mut total = 0.0f32;
            for (b, blk) in crate::block::blocks(ty, row)
                .into_iter()
                .flatten()
                .enumerate()
            {
                for (kk, c) in codes.iter_mut().enumerate() {
                    let (j, l) = (kk / 16, kk % 16);
                    let e = (l / 2) * cpw + 2 * j + l % 2;
                    let n = (blk.word(e / cpw) >> ty.code_shift(e % cpw)) & mask;
                    *c = n as i32 - z;
                }
                let gb = g * nb + b;
                let base = gb * bpw * TILE + 4 * col;
                let (mut c1, mut c0) = (0i32, 0i32);
                for (kk, &c) in codes.iter().enumerate() {
                    let at = base + (kk / 4) * 4 * TILE + kk % 4;
                    c1 += c * i32::from(acts.hi[at]);
                    c0 += acts.lo.get(at).map_or(0, |&l| c * i32::from(l));
                }
                let f = match acts.precision {
                    TilePrecision::I16 => (256 * c1 + c0) as f32,
                    TilePrecision::I8 => c1 as f32,
                };
                total = f.mul_add(blk.scale() * acts.sx[gb * TILE + col], total);
            }
            out[r] = total;
        }
    }
}
