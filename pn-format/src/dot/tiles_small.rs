//! A few input rows (2..=16: the MTP verify, small batches) against PN rows on AMX, with the
//! int16 activations of decode ([`PreparedI16`]): `out[t][r] = dot(row r, acts[t])`.
//!
//! The prompt-chunk kernel ([`super::tiles`]) puts 16 weight rows in the tiles' `A` operand, so
//! its per-block epilogue converts and scales a 16 x 16 result whatever the number of inputs,
//! and its unpack writes every code twice (scratch, then tile). Here the roles are swapped:
//! the `A` tile holds the `T` input rows (their int16 values split into a signed high and an
//! unsigned low byte plane), `B` the codes of 16 weight rows, unsigned, in the VNNI layout
//! (`B[kk / 4][4 n + kk % 4]` = code `kk` of weight row `n`, `kk = 16 j + lane`), so a block's
//! result is `T` rows of 16 weight rows each and the epilogue costs `T` vector operations, not
//! 16. The codes are moved straight from the packed words into `B`: per 8 weight rows one
//! gather of a qword (4 lanes of 16 bits), one `vpmultishiftqb` that picks code `j` and `j + 1`
//! of each lane into bytes, one mask, one `vpermt2d` per `B` row: about 5 vector operations
//! per weight block of 16 rows and code pair, so the pass is bound by reading the weights.
//!
//! Per block the integer sum `sum(n q) = 256 sum(n hi) + sum(n lo)` is exact (`tdpbsud` and
//! `tdpbuud`), then `- z sum(q)` in int32 (exact) and one multiply-add by `d * sx` in f32: the
//! integer block sums of [`super::matvec`], so results differ from decode's only by f32
//! rounding order.

use super::{check_k, PreparedI16};
use crate::error::PnError;
use crate::types::{PnType, BLOCK_BYTES};

/// Input rows one call takes at most (the tile height).
pub const SMALL_MAX_ROWS: usize = 16;

/// The activations of `n` input rows as AMX `A` tiles: per block, the high (signed) and low
/// (unsigned) bytes of each int16 value, `[block][input][kk]` with `kk = 16 j + lane` (the
/// order of `B`), and per block and input the scale `sx` and `z * sum(q)` as an exact int32.
#[derive(Clone, Debug, Default)]
pub struct SmallActs {
    pub(super) ty: Option<PnType>,
    pub(super) nb: usize,
    pub(super) n: usize,
    /// `[block][input n][kk]`: `q >> 8` (signed).
    pub(super) hi: Vec<i8>,
    /// The same layout: `q & 255`.
    pub(super) lo: Vec<u8>,
    /// `[block][input n]`: `sx`.
    pub(super) sx: Vec<f32>,
    /// `[block][input n]`: `z * sum(q)`.
    pub(super) zq: Vec<i32>,
}

impl SmallActs {
    /// Arranges `acts` (1..=[`SMALL_MAX_ROWS`] vectors prepared for the same type and length),
    /// reusing the buffers.
    pub fn update(&mut self, acts: &[PreparedI16]) -> Result<(), PnError> {
        let first = acts.first().ok_or(PnError::LengthMismatch {
            what: "small-tile activations (1..=16 input rows)",
            expected: 1,
            got: 0,
        })?;
        if acts.len() > SMALL_MAX_ROWS {
            return Err(PnError::LengthMismatch {
                what: "small-tile activations (1..=16 input rows)",
                expected: SMALL_MAX_ROWS,
                got: acts.len(),
            });
        }
        let (ty, k) = (first.ty, first.k);
        for a in acts {
            if a.ty != ty {
                return Err(PnError::TypeMismatch {
                    prepared: a.ty,
                    weights: ty,
                });
            }
            if a.k != k {
                return Err(PnError::LengthMismatch {
                    what: "small-tile activation length",
                    expected: k,
                    got: a.k,
                });
            }
        }
        let nb = check_k(ty, k)?;
        let (n, bpw, s) = (acts.len(), ty.weights_per_block(), ty.pairs_per_word());
        self.ty = Some(ty);
        self.nb = nb;
        self.n = n;
        self.hi.clear();
        self.hi.resize(nb * n * bpw, 0);
        self.lo.clear();
        self.lo.resize(nb * n * bpw, 0);
        self.sx.clear();
        self.sx.resize(nb * n, 0.0);
        self.zq.clear();
        self.zq.resize(nb * n, 0);
        for (t, a) in acts.iter().enumerate() {
            for b in 0..nb {
                let dst = (b * n + t) * bpw;
                for j in 0..s {
                    // Lanes 0..16 of pair `j` of block `b` (`layout::i16_index` order).
                    let src = (b >> 1) * s * 32 + j * 32 + (b & 1) * 16;
                    for (l, &q) in a.xq[src..src + 16].iter().enumerate() {
                        self.hi[dst + 16 * j + l] = (q >> 8) as i8;
                        self.lo[dst + 16 * j + l] = q as u8;
                    }
                }
                self.sx[b * n + t] = a.sx[b];
                // `z * sum(q)` is an integer below 2^24 (exact in f32, see `PreparedI16`).
                self.zq[b * n + t] = a.zq[b] as i32;
            }
        }
        Ok(())
    }

    /// Input rows held.
    pub fn n_rows(&self) -> usize {
        self.n
    }
}

/// `outs[t][r] = dot(row r, acts[t])` for `rows` consecutive rows of `weights` on AMX, or
/// `Ok(false)` (nothing written) where [`super::amx_available`] is false: the caller then uses
/// [`super::matvec_multi`]. Single-threaded: callers split the rows into ranges.
pub fn matvec_small(
    ty: PnType,
    weights: &[u8],
    rows: usize,
    acts: &SmallActs,
    outs: &mut [&mut [f32]],
) -> Result<bool, PnError> {
    if acts.ty != Some(ty) {
        return Err(PnError::TypeMismatch {
            prepared: acts.ty.unwrap_or(ty),
            weights: ty,
        });
    }
    if outs.len() != acts.n {
        return Err(PnError::LengthMismatch {
            what: "small-tile outputs (one per input row)",
            expected: acts.n,
            got: outs.len(),
        });
    }
    if let Some(o) = outs.iter().find(|o| o.len() != rows) {
        return Err(PnError::LengthMismatch {
            what: "small-tile output",
            expected: rows,
            got: o.len(),
        });
    }
    let rb = acts.nb * BLOCK_BYTES;
    let expected = rows.checked_mul(rb).ok_or(PnError::LengthMismatch {
        what: "small-tile weight bytes",
        expected: usize::MAX,
        got: weights.len(),
    })?;
    if weights.len() != expected {
        return Err(PnError::LengthMismatch {
            what: "small-tile weight bytes",
            expected,
            got: weights.len(),
        });
    }
    if !super::amx_available() {
        return Ok(false);
    }
    if rows == 0 {
        return Ok(true);
    }
    #[cfg(target_arch = "x86_64")]
    {
        // The row offsets of a 16-row tile go into 32-bit gather indices.
        if rb
            .checked_mul(SMALL_MAX_ROWS)
            .is_none_or(|v| v > i32::MAX as usize)
        {
            return Ok(false);
        }
        // SAFETY: AMX and AVX-512BW are available and the tile state granted
        // (`amx_available`; VBMI is checked inside); every length was checked above.
        Ok(unsafe { super::tiles_small_amx::matvec(ty, weights, rows, acts, outs) })
    }
    #[cfg(not(target_arch = "x86_64"))]
    Ok(false)
}

/// The exact arithmetic of [`matvec_small`] without SIMD (the tests' reference): per block the
/// int32 sum `256 sum(n hi) + sum(n lo) - z sum(q)`, times `d * sx` in f32, added in block
/// order with one fused multiply-add.
pub fn matvec_small_reference(
    ty: PnType,
    weights: &[u8],
    rows: usize,
    acts: &SmallActs,
    outs: &mut [&mut [f32]],
) {
    let (nb, n, bpw) = (acts.nb, acts.n, ty.weights_per_block());
    let (cpw, mask) = (ty.codes_per_word(), u32::from(ty.max_code()));
    let rb = nb * BLOCK_BYTES;
    for r in 0..rows {
        let row = &weights[r * rb..(r + 1) * rb];
        for (t, out) in outs.iter_mut().enumerate().take(n) {
            let mut f = 0f32;
            for (b, blk) in crate::block::blocks(ty, row)
                .into_iter()
                .flatten()
                .enumerate()
            {
                let base = (b * n + t) * bpw;
                let mut acc = 0i32;
                for kk in 0..bpw {
                    // kk = 16 j + lane; lane 2i + h is half h of word i.
                    let (j, lane) = (kk / 16, kk % 16);
                    let e = (lane / 2) * cpw + 2 * j + lane % 2;
                    let code = (blk.word(e / cpw) >> ty.code_shift(e % cpw)) & mask;
                    let q = 256 * i32::from(acts.hi[base + kk]) + i32::from(acts.lo[base + kk]);
                    acc += code as i32 * q;
                }
                let acc = acc - acts.zq[b * n + t];
                f = (acc as f32).mul_add(blk.scale() * acts.sx[b * n + t], f);
            }
            out[r] = f;
        }
    }
}
