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
//!   most 2^-16 of the block's largest activation. Prepared at [`TilePrecision::I8`]
//!   ([`decode_precision`], `PN_DECODE_ACTS=8`), the same rule rounds
//!   to `|q| <= 127` (error at most 1/254 of the block's largest) and the one-row kernel reads
//!   the values as bytes (`x86_i8`, `vpdpbusd`: twice the products per instruction).
//!
//! The row length `k` must be a whole number of blocks.
//!
//! [`matvec_multi`] multiplies a matrix with up to [`MAX_ACTS`] int16-prepared vectors in one pass
//! over the weights (each block unpacked once), for speculative verification and small batches
//! (int8-prepared ones: one row at a time, each output the one-row kernel's exact bits);
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
mod x86_i8;
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

        /// `out[r] = row r . x` for the rows of `weights`, each exactly `row_bytes(k)` bytes
        /// and one per output (checked by the callers). An implementation may choose its
        /// kernel once for all the rows instead of once per row.
        fn matvec_unchecked(&self, isa: Isa, weights: &[u8], out: &mut [f32]) {
            let rb = weights.len() / out.len().max(1);
            for (o, row) in out.iter_mut().zip(weights.chunks_exact(rb.max(1))) {
                *o = self.dot_row_unchecked(isa, row);
            }
        }
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

/// The most weights one block holds (pn3t's 80): the size of per-block scratch arrays.
const MAX_BLOCK_WEIGHTS: usize = PnType::Pn3t.weights_per_block();
const _: () = assert!(PnType::Pn4t.weights_per_block() <= MAX_BLOCK_WEIGHTS);

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
///
/// At [`TilePrecision::I8`] ([`PreparedI16::with_precision`], what the model's CPU backend
/// takes where [`decode_precision`] says so) the same rule rounds to `|q| <= 127` instead of
/// 32767: every kernel computes the same integer block sums from those values, and on a CPU
/// with the int8 decode kernel ([`int8_decode_available`]) the one-row product reads them as
/// bytes, one `vpdpbusd` per 64 products instead of one `vpdpwssd` per 32.
#[derive(Clone, Debug)]
pub struct PreparedI16 {
    ty: PnType,
    k: usize,
    precision: TilePrecision,
    /// Quantized values in `layout::i16_index` order, zero-padded to an even block count;
    /// cache-line aligned, as the kernels load them 64 bytes at a time.
    xq: AlignedVec<i16>,
    /// At [`TilePrecision::I8`] where the int8 decode kernel runs: the same values in
    /// `layout::i8_index` order, `i8_extractions * 64` bytes per pair of blocks (unused slots
    /// and the padding block zero). Empty otherwise.
    xq8: AlignedVec<i8>,
    /// Per-block scale `sx_b`; zero-padded to a multiple of 16 blocks.
    sx: Vec<f32>,
    /// `z * sum(q over block b)` (exact in f32); zero-padded like `sx`.
    zq: Vec<f32>,
}

impl PreparedI16 {
    /// Quantizes and prepares `x` (length a multiple of the block size) for rows of type `ty`.
    /// Non-finite activations make the whole block's scale NaN, so the result is NaN, not a panic.
    pub fn new(ty: PnType, x: &[f32]) -> Result<Self, PnError> {
        Self::with_precision(ty, TilePrecision::I16, x)
    }

    /// [`PreparedI16::new`] rounding to the grid of `precision` (`|q| <= 32767` or `127`).
    pub fn with_precision(
        ty: PnType,
        precision: TilePrecision,
        x: &[f32],
    ) -> Result<Self, PnError> {
        let mut p = PreparedI16 {
            ty,
            k: 0,
            precision,
            xq: AlignedVec::new(),
            xq8: AlignedVec::new(),
            sx: Vec::new(),
            zq: Vec::new(),
        };
        p.update(x)?;
        Ok(p)
    }

    /// The grid the values were rounded to.
    pub fn precision(&self) -> TilePrecision {
        self.precision
    }

    /// Re-prepares for a new vector (at the same precision), reusing the buffers.
    pub fn update(&mut self, x: &[f32]) -> Result<(), PnError> {
        let ty = self.ty;
        let nb = check_k(ty, x.len())?;
        let bpw = ty.weights_per_block();
        let z = ty.zero_point();
        let q_max = self.precision.q_max();
        let bytes = self.precision == TilePrecision::I8 && int8_decode_available();
        self.k = x.len();
        self.xq.reset_zeroed(nb.next_multiple_of(2) * bpw);
        if bytes {
            let pairs = nb.div_ceil(2);
            self.xq8
                .reset_zeroed(pairs * layout::i8_extractions(ty) * 64);
        } else {
            self.xq8.reset_zeroed(0);
        }
        self.sx.clear();
        self.sx.resize(padded_blocks(nb), 0.0);
        self.zq.clear();
        self.zq.resize(padded_blocks(nb), 0.0);
        // Where each element of a block goes, relative to the block's first slot: both
        // layouts place a block at an offset of its own plus the element's offset in it
        // (`layout`'s tests), so the index arithmetic (divisions by the codes per word) runs
        // once per element of one block instead of once per element of every block.
        let mut off16 = [0usize; MAX_BLOCK_WEIGHTS];
        let mut off8 = [0usize; MAX_BLOCK_WEIGHTS];
        for e in 0..bpw {
            off16[e] = layout::i16_index(ty, 0, e);
            off8[e] = layout::i8_index(ty, 0, e);
        }
        // The block's values on the grid (`[bpw]`).
        let mut q = [0i32; MAX_BLOCK_WEIGHTS];
        for (b, xb) in x.chunks_exact(bpw).enumerate() {
            let (sx, inv) = tiles_quant::block_scale(xb, q_max);
            // Clamped, then rounded half away from zero without a libm call per value (the
            // tiles' quantizer: the same values as `(v * inv).round().clamp(..)`, NaN to 0).
            for (qe, &v) in q.iter_mut().zip(xb) {
                *qe = tiles_quant::round_away((v * inv).clamp(-q_max, q_max));
            }
            let q = &q[..bpw];
            let sum: i32 = q.iter().sum();
            let base = layout::i16_index(ty, b, 0) - off16[0];
            for (&o, &v) in off16[..bpw].iter().zip(q) {
                self.xq[base + o] = v as i16;
            }
            if bytes {
                // |q| <= 127 at this precision.
                let base = layout::i8_index(ty, b, 0) - off8[0];
                for (&o, &v) in off8[..bpw].iter().zip(q) {
                    self.xq8[base + o] = v as i8;
                }
            }
            self.sx[b] = sx;
            self.zq[b] = (z * sum) as f32;
        }
        Ok(())
    }
}

/// Whether this CPU has the int8 one-row decode kernel: AVX-512 BW with VNNI (`vpdpbusd`), from
/// Cascade Lake and Zen 4 on (and not under an ISA cap below that level).
pub fn int8_decode_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        Isa::detect() == Isa::Avx512Vnni
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The activation grid of the products whose outputs are read (decode, verification, prompt
/// rows with logits): int16 unless `PN_DECODE_ACTS=8` asks for int8 (`16` is the default).
///
/// What int8 buys: on a CPU with the int8 decode kernel ([`int8_decode_available`]) it halves
/// the multiply-adds of the one-row product; on Zen 4, where the int16 kernel computes below
/// the DRAM read (17-18 GB/s of weights per core against 23-25 GB/s), whole-model decode ran
/// 10-20% faster. Its error per activation, at most `1/254` of its block's largest (80 or 64
/// values), is what prompt rows that only feed the state already take on these CPUs, and
/// finer than llama.cpp's 8-bit activations (one scale per 256 or 32 values): on the demo
/// model the mean KL to the f16 model's next-token distribution moved from 1.713e-3 to
/// 1.722e-3. Several read rows at once ([`matvec_multi`]: verification, batches of up to 8
/// read rows; the model gives more the int8 tiles) get the one-row kernel's exact bits.
///
/// Why it is not the default: int8's rounding steps are 256 times int16's, so the last-bit
/// differences between one row and several rows at once in the rest of the forward pass
/// (attention, the delta rule, stock types decoded once) move the next layer's activations
/// across them, and the logits by 3e-3 to 2e-2 where int16 keeps them within 1e-3. That
/// breaks what pn guarantees and tests: greedy decoding with MTP speculation equals plain
/// greedy (`pn-runtime/tests/spec_engine.rs`), batched rows equal each sequence alone
/// (`qwen-model/tests/batch_forward.rs`), reported log probabilities equal a fresh pass's.
/// int8 can become the default once the whole multi-row forward pass computes each row's
/// one-row bits.
pub fn decode_precision() -> TilePrecision {
    static P: std::sync::OnceLock<TilePrecision> = std::sync::OnceLock::new();
    *P.get_or_init(|| match std::env::var("PN_DECODE_ACTS").as_deref() {
        Ok("8") => TilePrecision::I8,
        _ => TilePrecision::I16,
    })
}

impl PreparedActs for PreparedI16 {
    fn ty(&self) -> PnType {
        self.ty
    }
    fn k(&self) -> usize {
        self.k
    }
}

/// A one-row int16-grid kernel: `(type, row, xq, sx, zq, blocks) -> row . x`.
#[cfg(target_arch = "x86_64")]
type I16Kernel = unsafe fn(PnType, &[u8], &[i16], &[f32], &[f32], usize) -> f32;

/// The one-row kernel [`PreparedI16`] takes on an instruction set, chosen once per matrix (the
/// choice reads several CPU feature flags; per 2-9 KB row it cost about 2% of decode).
#[derive(Clone, Copy)]
enum RowKernel {
    /// `x86_i8::dot_i8_avx512` on the int8 copy.
    #[cfg(target_arch = "x86_64")]
    I8,
    /// An int16 SIMD kernel.
    #[cfg(target_arch = "x86_64")]
    I16(I16Kernel),
    /// `scalar::dot_i16`.
    Scalar,
}

impl PreparedI16 {
    /// The kernel for rows multiplied on `isa` (scalar where the CPU lacks it).
    fn row_kernel(&self, isa: Isa) -> RowKernel {
        match isa.or_scalar() {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni if !self.xq8.is_empty() => RowKernel::I8,
            // Zen 4: the AVX-512 levels hand over to the AVX2 kernel (`decode_prefers_256`);
            // taking it here skips that check per row.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni | Isa::Avx512 if x86::decode_prefers_256() => {
                RowKernel::I16(x86::dot_i16_avx2)
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => RowKernel::I16(x86::dot_i16_avx512::<true>),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => RowKernel::I16(x86::dot_i16_avx512::<false>),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => RowKernel::I16(x86::dot_i16_avx2),
            _ => RowKernel::Scalar,
        }
    }

    /// One row through `kernel`.
    ///
    /// # Safety
    /// `kernel` comes from [`PreparedI16::row_kernel`] of these activations (so the CPU has its
    /// features and `xq8` is filled where it reads it); `row` is `k / weights_per_block`
    /// blocks.
    #[inline]
    unsafe fn dot_with(&self, kernel: RowKernel, row: &[u8]) -> f32 {
        let nb = self.k / self.ty.weights_per_block();
        debug_assert_eq!(row.len(), nb * BLOCK_BYTES);
        match kernel {
            // SAFETY: VNNI checked by `or_scalar` in `row_kernel`; `xq8` holds `nb` blocks
            // rounded up to a pair (filled at `TilePrecision::I8` where
            // `int8_decode_available`).
            #[cfg(target_arch = "x86_64")]
            RowKernel::I8 => unsafe {
                x86_i8::dot_i8_avx512(self.ty, row, &self.xq8, &self.sx, &self.zq, nb)
            },
            // SAFETY: features checked by `or_scalar` in `row_kernel`; buffers padded as
            // documented.
            #[cfg(target_arch = "x86_64")]
            RowKernel::I16(f) => unsafe { f(self.ty, row, &self.xq, &self.sx, &self.zq, nb) },
            RowKernel::Scalar => scalar::dot_i16(self.ty, row, &self.xq, &self.sx, &self.zq),
        }
    }
}

impl Sealed for PreparedI16 {
    fn dot_row_unchecked(&self, isa: Isa, row: &[u8]) -> f32 {
        // SAFETY: the kernel is these activations' own; the row length is the caller's
        // contract.
        unsafe { self.dot_with(self.row_kernel(isa), row) }
    }

    fn matvec_unchecked(&self, isa: Isa, weights: &[u8], out: &mut [f32]) {
        let kernel = self.row_kernel(isa);
        let rb = self.k / self.ty.weights_per_block() * BLOCK_BYTES;
        for (o, row) in out.iter_mut().zip(weights.chunks_exact(rb.max(1))) {
            // SAFETY: as in `dot_row_unchecked`, the kernel chosen once for every row.
            *o = unsafe { self.dot_with(kernel, row) };
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
    acts.matvec_unchecked(isa.or_scalar(), weights, out);
    Ok(())
}

#[cfg(test)]
mod prepare_tests {
    //! [`PreparedI16::update`] against the rule as first written: per element, `f32::round`
    //! then clamp, each index from the layout functions.
    use super::*;

    /// `(xq, xq8, sx, zq)` of `x` by the plain rule (`xq8` only where `update` fills it).
    fn reference(ty: PnType, precision: TilePrecision, x: &[f32]) -> Prepared {
        let bpw = ty.weights_per_block();
        let nb = x.len() / bpw;
        let q_max = precision.q_max();
        let bytes = precision == TilePrecision::I8 && int8_decode_available();
        let mut xq = vec![0i16; nb.next_multiple_of(2) * bpw];
        let mut xq8 = vec![
            0i8;
            if bytes {
                nb.div_ceil(2) * layout::i8_extractions(ty) * 64
            } else {
                0
            }
        ];
        let (mut sx, mut zq) = (vec![0f32; padded_blocks(nb)], vec![0f32; padded_blocks(nb)]);
        for (b, xb) in x.chunks_exact(bpw).enumerate() {
            let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let amax = if xb.iter().all(|v| v.is_finite()) {
                amax
            } else {
                f32::NAN
            };
            let inv = if amax > 0.0 { q_max / amax } else { 0.0 };
            let mut sum = 0i32;
            for (e, &v) in xb.iter().enumerate() {
                let q = (v * inv).round().clamp(-q_max, q_max) as i16;
                sum += i32::from(q);
                xq[layout::i16_index(ty, b, e)] = q;
                if bytes {
                    xq8[layout::i8_index(ty, b, e)] = q as i8;
                }
            }
            sx[b] = amax / q_max;
            zq[b] = (ty.zero_point() * sum) as f32;
        }
        (xq, xq8, sx, zq)
    }

    type Prepared = (Vec<i16>, Vec<i8>, Vec<f32>, Vec<f32>);

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|f| f.to_bits()).collect()
    }

    #[test]
    fn update_equals_the_plain_rule() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for ty in PnType::ALL {
            let bpw = ty.weights_per_block();
            for precision in [TilePrecision::I16, TilePrecision::I8] {
                let mut p = PreparedI16::with_precision(ty, precision, &vec![0.0; bpw]).unwrap();
                for nb in [1usize, 2, 3, 7, 64] {
                    // Random magnitudes over many octaves, exact halves of the grid, zeros,
                    // a non-finite block.
                    let mut x: Vec<f32> = (0..nb * bpw)
                        .map(|_| {
                            let r = next();
                            let m = f32::from_bits(0x3f80_0000 | (r as u32 & 0x007f_ffff)) - 1.0;
                            let e = ((r >> 32) % 40) as i32 - 20;
                            let s = if r >> 63 == 1 { -1.0 } else { 1.0 };
                            s * m * 2f32.powi(e)
                        })
                        .collect();
                    x[..bpw].iter_mut().enumerate().for_each(|(i, v)| {
                        *v = (i as f32 - 40.0) * 0.5;
                    });
                    if nb > 2 {
                        x[bpw..2 * bpw].fill(0.0);
                        x[2 * bpw + 3] = if nb % 2 == 0 { f32::NAN } else { f32::INFINITY };
                    }
                    p.update(&x).unwrap();
                    let (xq, xq8, sx, zq) = reference(ty, precision, &x);
                    assert_eq!(&p.xq[..], &xq[..], "{ty} {precision:?} nb={nb}: xq");
                    assert_eq!(&p.xq8[..], &xq8[..], "{ty} {precision:?} nb={nb}: xq8");
                    assert_eq!(bits(&p.sx), bits(&sx), "{ty} {precision:?} nb={nb}: sx");
                    assert_eq!(bits(&p.zq), bits(&zq), "{ty} {precision:?} nb={nb}: zq");
                }
            }
        }
    }
}
