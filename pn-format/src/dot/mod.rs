//! Dot products of PN rows with activations, and the matrix-vector product built on them.
//!
//! Every fast path factors the block scale out: `dot(block, x) = d * sum((n - z) * x)`, and
//! computes `sum((n - z) * x)` as `sum(n * x) - z * sum(x)`, with `z * sum(x)` per block prepared
//! once per activation vector. Activations are also permuted once, into the order in which the
//! codes come out of a word with one shift and one mask (see the `layout` module), so that the
//! inner loop needs no shuffles. Two activation formats:
//!
//! - [`PreparedF32`]: f32 activations (no rounding of the activations).
//! - [`PreparedI16`]: activations quantized to int16 with one f32 scale per weight block
//!   (`x ~= sx * q`, |q| <= 32767): the integer path (int16 rather than int8 because the codes
//!   already sit in 16-bit halves, so it costs no extra unpacking and is ~256x more accurate), `vpmaddwd`/`vpdpwssd` on the codes
//!   exactly as they sit in the 16-bit halves of a word. Its relative error per activation is at
//!   most 2^-16 of the block's largest activation.
//!
//! The row length `k` must be a whole number of blocks.
//!
//! [`matvec_multi`] multiplies a matrix with up to [`MAX_ACTS`] int16-prepared vectors in one pass
//! over the weights (each block unpacked once), for speculative verification and small batches;
//! [`matmul_tiled`] multiplies it with many (prompt chunks) in 16 x 16 AMX tiles (or 16-lane
//! AVX-512 VNNI vectors without AMX, or, for int8 activations, AVX2 vectors), with the same
//! per-block integer sums.

/// Repeats `$body` with `$s` bound to each constant slot below `$n` (at most 20).
#[cfg(target_arch = "x86_64")]
macro_rules! slots {
    ($s:ident < $n:expr, $body:block) => {
        slots!(@ $s, $n, $body, 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19)
    };
    (@ $s:ident, $n:expr, $body:block, $($k:literal)*) => {
        $(
            if $k < $n {
                let $s: usize = $k;
                $body
            }
        )*
    };
}

mod aligned;
#[cfg(target_arch = "x86_64")]
mod amx;
pub(crate) mod layout;
mod multi;
mod scalar;
mod tiles;
#[cfg(target_arch = "x86_64")]
mod tiles_amx;
#[cfg(target_arch = "x86_64")]
mod tiles_avx2;
#[cfg(target_arch = "x86_64")]
mod tiles_quant;
mod tiles_small;
#[cfg(target_arch = "x86_64")]
mod tiles_small_amx;
#[cfg(target_arch = "x86_64")]
mod tiles_vnni;
#[cfg(target_arch = "x86_64")]
mod tiles_walk;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
mod x86_cache;
#[cfg(target_arch = "x86_64")]
mod x86_multi;

pub use multi::{matvec_multi, matvec_multi_with, MAX_ACTS};
pub use tiles::{
    amx_available, avx2_tiles_available, default_kernel, default_tile_precision, int8_kernel,
    matmul_tiled, matmul_tiled_kernel, matmul_tiled_with, tiled_pass_rows, tiles_available,
    vnni_tiles_available, TileActs, TileKernel, TilePrecision, TILE, TILED_ROWS_MIN,
};
pub use tiles_small::{matvec_small, matvec_small_reference, SmallActs, SMALL_MAX_ROWS};

use crate::block::blocks;
use crate::error::PnError;
use crate::isa::Isa;
use crate::types::{PnType, BLOCK_BYTES};
use aligned::AlignedVec;

/// Activations prepared for one PN type (sealed: implemented by [`PreparedF32`] and
/// [`PreparedI16`]). Prepare once per input vector, then reuse for every row of every matrix of
/// that type that reads the same input.
pub trait PreparedActs: Sync + sealed::Sealed {
    /// The weight type these activations were prepared for.
    fn ty(&self) -> PnType;
    /// Number of activations (the row length `k`).
    fn k(&self) -> usize;
}

mod sealed {
    use crate::isa::Isa;

    /// The kernel entry point lives in this private trait so that no code outside the crate
    /// can call it with a row of the wrong length (the SIMD kernels trust the length).
    pub trait Sealed {
        /// Dot product with one row of exactly `row_bytes(k)` bytes (checked by the callers).
        fn dot_row_unchecked(&self, isa: Isa, row: &[u8]) -> f32;
    }
}
use sealed::Sealed;

fn check_k(ty: PnType, k: usize) -> Result<usize, PnError> {
    let bpw = ty.weights_per_block();
    if !k.is_multiple_of(bpw) {
        return Err(PnError::RaggedWeights {
            ty,
            len: k,
            block: bpw,
        });
    }
    Ok(k / bpw)
}

/// Rounds a block count up to the 16-block batches the SIMD kernels read per-block tables in.
fn padded_blocks(nb: usize) -> usize {
    nb.div_ceil(16) * 16
}

/// f32 activations, permuted into kernel order, with `z * sum(x)` per block.
#[derive(Clone, Debug)]
pub struct PreparedF32 {
    ty: PnType,
    k: usize,
    /// `k` values in `layout::f32_slot` order, each pre-multiplied by `2^-(BITS*j)`.
    xs: Vec<f32>,
    /// `z * sum(x over block b)`; zero-padded to a multiple of 16 blocks.
    zsum: Vec<f32>,
}

impl PreparedF32 {
    /// Prepares `x` (length a multiple of the block size) for rows of type `ty`.
    pub fn new(ty: PnType, x: &[f32]) -> Result<Self, PnError> {
        let mut p = PreparedF32 {
            ty,
            k: 0,
            xs: Vec::new(),
            zsum: Vec::new(),
        };
        p.update(x)?;
        Ok(p)
    }

    /// Re-prepares for a new vector, reusing the buffers.
    pub fn update(&mut self, x: &[f32]) -> Result<(), PnError> {
        let ty = self.ty;
        let nb = check_k(ty, x.len())?;
        let bpw = ty.weights_per_block();
        let z = f64::from(ty.zero_point());
        self.k = x.len();
        self.xs.resize(x.len(), 0.0);
        self.zsum.clear();
        self.zsum.resize(padded_blocks(nb), 0.0);
        for (b, xb) in x.chunks_exact(bpw).enumerate() {
            let out = &mut self.xs[b * bpw..(b + 1) * bpw];
            for (e, &v) in xb.iter().enumerate() {
                let (idx, scale) = layout::f32_slot(ty, e);
                out[idx] = v * scale;
            }
            self.zsum[b] = (z * xb.iter().map(|&v| f64::from(v)).sum::<f64>()) as f32;
        }
        Ok(())
    }
}

impl PreparedActs for PreparedF32 {
    fn ty(&self) -> PnType {
        self.ty
    }
    fn k(&self) -> usize {
        self.k
    }
}

impl Sealed for PreparedF32 {
    fn dot_row_unchecked(&self, isa: Isa, row: &[u8]) -> f32 {
        let nb = self.k / self.ty.weights_per_block();
        debug_assert_eq!(row.len(), nb * BLOCK_BYTES);
        match isa.or_scalar() {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 | Isa::Avx512Vnni => {
                // SAFETY: the CPU has the features (checked by `or_scalar`); lengths checked by
                // every caller (row = nb blocks, xs = k values, zsum padded to 16 blocks).
                unsafe { x86::dot_f32_avx512(self.ty, row, &self.xs, &self.zsum, nb) }
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                // SAFETY: as above.
                unsafe { x86::dot_f32_avx2(self.ty, row, &self.xs, &self.zsum, nb) }
            }
            _ => scalar::dot_f32(self.ty, row, &self.xs, &self.zsum),
        }
    }
}

/// Activations quantized to int16 per weight block (`x ~= sx_b * q`), in kernel order.
#[derive(Clone, Debug)]
pub struct PreparedI16 {
    ty: PnType,
    k: usize,
    /// Quantized values in `layout::i16_index` order, zero-padded to an even block count;
    /// cache-line aligned, as the kernels load them 64 bytes at a time.
    xq: AlignedVec<i16>,
    /// Per-block scale `sx_b`; zero-padded to a multiple of 16 blocks.
    sx: Vec<f32>,
    /// `z * sum(q over block b)` (exact in f32); zero-padded like `sx`.
    zq: Vec<f32>,
}

impl PreparedI16 {
    /// Quantizes and prepares `x` (length a multiple of the block size) for rows of type `ty`.
    /// Non-finite activations make the whole block's scale NaN, so the result is NaN, not a panic.
    pub fn new(ty: PnType, x: &[f32]) -> Result<Self, PnError> {
        let mut p = PreparedI16 {
            ty,
            k: 0,
            xq: AlignedVec::new(),
            sx: Vec::new(),
            zq: Vec::new(),
        };
        p.update(x)?;
        Ok(p)
    }

    /// Re-prepares for a new vector, reusing the buffers.
    pub fn update(&mut self, x: &[f32]) -> Result<(), PnError> {
        let ty = self.ty;
        let nb = check_k(ty, x.len())?;
        let bpw = ty.weights_per_block();
        let z = ty.zero_point();
        self.k = x.len();
        self.xq.reset_zeroed(nb.next_multiple_of(2) * bpw);
        self.sx.clear();
        self.sx.resize(padded_blocks(nb), 0.0);
        self.zq.clear();
        self.zq.resize(padded_blocks(nb), 0.0);
        for (b, xb) in x.chunks_exact(bpw).enumerate() {
            let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let amax = if xb.iter().all(|v| v.is_finite()) {
                amax
            } else {
                f32::NAN
            };
            let sx = amax / 32767.0;
            let inv = if amax > 0.0 { 32767.0 / amax } else { 0.0 };
            let mut sum = 0i32;
            for (e, &v) in xb.iter().enumerate() {
                // `as` saturates and maps NaN to 0: no panic on any input.
                let q = (v * inv).round().clamp(-32767.0, 32767.0) as i16;
                sum += i32::from(q);
                self.xq[layout::i16_index(ty, b, e)] = q;
            }
            self.sx[b] = sx;
            self.zq[b] = (z * sum) as f32;
        }
        Ok(())
    }
}

impl PreparedActs for PreparedI16 {
    fn ty(&self) -> PnType {
        self.ty
    }
    fn k(&self) -> usize {
        self.k
    }
}

impl Sealed for PreparedI16 {
    fn dot_row_unchecked(&self, isa: Isa, row: &[u8]) -> f32 {
        let nb = self.k / self.ty.weights_per_block();
        debug_assert_eq!(row.len(), nb * BLOCK_BYTES);
        match isa.or_scalar() {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => {
                // SAFETY: features checked by `or_scalar`; buffers padded as documented.
                unsafe {
                    x86::dot_i16_avx512::<true>(self.ty, row, &self.xq, &self.sx, &self.zq, nb)
                }
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                // SAFETY: as above.
                unsafe {
                    x86::dot_i16_avx512::<false>(self.ty, row, &self.xq, &self.sx, &self.zq, nb)
                }
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                // SAFETY: as above.
                unsafe { x86::dot_i16_avx2(self.ty, row, &self.xq, &self.sx, &self.zq, nb) }
            }
            _ => scalar::dot_i16(self.ty, row, &self.xq, &self.sx, &self.zq),
        }
    }
}

fn check_row(acts: &(impl PreparedActs + ?Sized), ty: PnType, row: &[u8]) -> Result<(), PnError> {
    if acts.ty() != ty {
        return Err(PnError::TypeMismatch {
            prepared: acts.ty(),
            weights: ty,
        });
    }
    if !row.len().is_multiple_of(BLOCK_BYTES) {
        return Err(PnError::RaggedBytes { ty, len: row.len() });
    }
    let expected = acts.k() / ty.weights_per_block() * BLOCK_BYTES;
    if row.len() != expected {
        return Err(PnError::LengthMismatch {
            what: "row bytes for the prepared activations",
            expected,
            got: row.len(),
        });
    }
    Ok(())
}

/// Dot product of one row of type `ty` with prepared activations, on the best SIMD path.
pub fn dot_prepared(
    ty: PnType,
    row: &[u8],
    acts: &(impl PreparedActs + ?Sized),
) -> Result<f32, PnError> {
    dot_prepared_with(Isa::detect(), ty, row, acts)
}

/// [`dot_prepared`] on a chosen instruction set (falls back to scalar if the CPU lacks it).
pub fn dot_prepared_with(
    isa: Isa,
    ty: PnType,
    row: &[u8],
    acts: &(impl PreparedActs + ?Sized),
) -> Result<f32, PnError> {
    check_row(acts, ty, row)?;
    Ok(acts.dot_row_unchecked(isa, row))
}

/// Dot product of one row with f32 activations in natural order. Prepares `x` on every call:
/// for many rows, prepare once with [`PreparedF32::new`] and use [`matvec`].
pub fn dot_f32(ty: PnType, row: &[u8], x: &[f32]) -> Result<f32, PnError> {
    dot_prepared(ty, row, &PreparedF32::new(ty, x)?)
}

/// The reference: decode each weight exactly and sum `w * x` in f64, in element order.
pub fn dot_ref_f64(ty: PnType, row: &[u8], x: &[f32]) -> Result<f64, PnError> {
    let blocks = blocks(ty, row)?;
    let bpw = ty.weights_per_block();
    if x.len() != blocks.len() * bpw {
        return Err(PnError::LengthMismatch {
            what: "activations",
            expected: blocks.len() * bpw,
            got: x.len(),
        });
    }
    let mut sum = 0.0f64;
    for (blk, xb) in blocks.zip(x.chunks_exact(bpw)) {
        for (e, &v) in xb.iter().enumerate() {
            sum += f64::from(blk.value(e)) * f64::from(v);
        }
    }
    Ok(sum)
}

/// Matrix-vector product `out[r] = dot(row r, x)` over `rows` consecutive rows of `weights`
/// (row-major, each row `row_bytes(k)` bytes), on the best SIMD path. Single-threaded: callers
/// parallelise by splitting `weights` and `out` into row ranges.
pub fn matvec(
    ty: PnType,
    weights: &[u8],
    rows: usize,
    acts: &(impl PreparedActs + ?Sized),
    out: &mut [f32],
) -> Result<(), PnError> {
    matvec_with(Isa::detect(), ty, weights, rows, acts, out)
}

/// [`matvec`] on a chosen instruction set (falls back to scalar if the CPU lacks it).
pub fn matvec_with(
    isa: Isa,
    ty: PnType,
    weights: &[u8],
    rows: usize,
    acts: &(impl PreparedActs + ?Sized),
    out: &mut [f32],
) -> Result<(), PnError> {
    if acts.ty() != ty {
        return Err(PnError::TypeMismatch {
            prepared: acts.ty(),
            weights: ty,
        });
    }
    if out.len() != rows {
        return Err(PnError::LengthMismatch {
            what: "matvec output",
            expected: rows,
            got: out.len(),
        });
    }
    let rb = acts.k() / ty.weights_per_block() * BLOCK_BYTES;
    let expected = rows.checked_mul(rb).ok_or(PnError::LengthMismatch {
        what: "matvec weight bytes",
        expected: usize::MAX,
        got: weights.len(),
    })?;
    if weights.len() != expected {
        return Err(PnError::LengthMismatch {
            what: "matvec weight bytes",
            expected,
            got: weights.len(),
        });
    }
    if rb == 0 {
        out.fill(0.0);
        return Ok(());
    }
    let isa = isa.or_scalar();
    for (o, row) in out.iter_mut().zip(weights.chunks_exact(rb)) {
        *o = acts.dot_row_unchecked(isa, row);
    }
    Ok(())
}
