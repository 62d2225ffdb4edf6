//! A few input rows (2..=16: the MTP verify, small batches) against PN rows on AMX, with the
//! int16 activations of decode ([`PreparedI16`]): `out[t][r] = dot(row r, acts[t])`.
//!
//! The prompt-chunk kernel ([`super::tiles`]) puts 16 weight rows in the tiles' `A` operand, so
//! its per-block epilogue converts and scales a 16 x 16 result whatever the number of inputs,
//! and its unpack writes every code twice (scratch, then tile). Here the roles are swapped:
//! the `A` tile holds the input rows, `B` the codes of 16 weight rows, unsigned, in the VNNI
//! layout (`B[kk / 4][4 n + kk % 4]` = code `kk` of weight row `n`, `kk = 16 j + lane`), so a
//! block's result is a few rows of 16 weight rows each and the epilogue costs a few vector
//! operations, not 16. The codes are moved straight from the packed words into `B`: per 8
//! weight rows one gather of a qword (4 lanes of 16 bits), one `vpmultishiftqb` that picks code
//! `j` and `j + 1` of each lane into bytes, one mask, one `vpermt2d` per `B` row: about 5 vector
//! operations per weight block of 16 rows and code pair, so the pass is bound by reading the
//! weights.
//!
//! One unsigned product (`tdpbuud`) per block and K step covers every input: the `A` tile of a
//! group of `m <= 7` inputs has `2 m + 1` rows, the offset high bytes `h + 128` of each int16
//! value `q = 256 h + l` (rows `0..m`), the low bytes `l` (rows `m..2m`) and a row of ones (row
//! `2m`, giving each weight row's code sum `sum(n)`). Per block the integer sum
//! `sum(n q) = 256 sum(n (h + 128)) + sum(n l) - 32768 sum(n)` is exact, then `- z sum(q)` in
//! int32 (exact) and one multiply-add by `d * sx` in f32: the integer block sums of
//! [`super::matvec`], so results differ from decode's only by f32 rounding order. More than 7
//! inputs are split into groups that each pass over an L2-sized run of rows in turn.

use super::{check_k, PreparedI16};
use crate::error::PnError;
use crate::types::{PnType, BLOCK_BYTES};

/// Input rows one call takes at most.
pub const SMALL_MAX_ROWS: usize = 16;

/// Inputs of one `A` tile: two byte planes each plus the row of ones fit its 16 rows.
pub(super) const GROUP_MAX: usize = 7;

/// One group of `m` inputs (`1..=`[`GROUP_MAX`]) as AMX `A` tiles.
#[derive(Clone, Debug, Default)]
pub(super) struct SmallGroup {
    /// The group's first input (its index among all inputs).
    pub(super) first: usize,
    /// Inputs in the group.
    pub(super) m: usize,
    /// `[block][plane row p < 2m + 1][kk]`: `h + 128` for `p < m`, `l` for `m <= p < 2m`, 1
    /// for `p = 2m` (`kk = 16 j + lane`, the order of `B`).
    pub(super) planes: Vec<u8>,
    /// `[block][input t < m]`: `sx`.
    pub(super) sx: Vec<f32>,
    /// `[block][input t < m]`: `z * sum(q)`.
    pub(super) zq: Vec<i32>,
}

impl SmallGroup {
    /// Rows of the group's `A` tile.
    pub(super) fn plane_rows(&self) -> usize {
        2 * self.m + 1
    }
}

/// The activations of `n` input rows as AMX `A` tiles, in groups of at most [`GROUP_MAX`]
/// inputs, per block and input the scale `sx` and `z * sum(q)` as an exact int32.
#[derive(Clone, Debug, Default)]
pub struct SmallActs {
    pub(super) ty: Option<PnType>,
    pub(super) nb: usize,
    pub(super) n: usize,
    pub(super) groups: Vec<SmallGroup>,
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
        // Groups of equal size where possible (8 inputs: 4 + 4, not 7 + 1).
        let count = n.div_ceil(GROUP_MAX);
        self.groups.resize_with(count, SmallGroup::default);
        let mut at = 0;
        for (gi, g) in self.groups.iter_mut().enumerate() {
            let m = (n - at).div_ceil(count - gi);
            let p = 2 * m + 1;
            g.first = at;
            g.m = m;
            g.planes.clear();
            g.planes.resize(nb * p * bpw, 0);
            g.sx.clear();
            g.sx.resize(nb * m, 0.0);
            g.zq.clear();
            g.zq.resize(nb * m, 0);
            for b in 0..nb {
                g.planes[(b * p + 2 * m) * bpw..(b * p + p) * bpw].fill(1);
            }
            for (t, a) in acts[at..at + m].iter().enumerate() {
                for b in 0..nb {
                    let hi = (b * p + t) * bpw;
                    let lo = (b * p + m + t) * bpw;
                    for j in 0..s {
                        // Lanes 0..16 of pair `j` of block `b` (`layout::i16_index` order).
                        let src = (b >> 1) * s * 32 + j * 32 + (b & 1) * 16;
                        for (l, &q) in a.xq[src..src + 16].iter().enumerate() {
                            g.planes[hi + 16 * j + l] = ((q >> 8) + 128) as u8;
                            g.planes[lo + 16 * j + l] = q as u8;
                        }
                    }
                    g.sx[b * m + t] = a.sx[b];
                    // `z * sum(q)` is an integer below 2^24 (exact in f32, see `PreparedI16`).
                    g.zq[b * m + t] = a.zq[b] as i32;
                }
            }
            at += m;
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
/// int32 sum `256 sum(n (h + 128)) + sum(n l) - 32768 sum(n) - z sum(q)`, times `d * sx` in
/// f32, added in block order with one fused multiply-add.
pub fn matvec_small_reference(
    ty: PnType,
    weights: &[u8],
    rows: usize,
    acts: &SmallActs,
    outs: &mut [&mut [f32]],
) {
    let (nb, bpw) = (acts.nb, ty.weights_per_block());
    let (cpw, mask) = (ty.codes_per_word(), u32::from(ty.max_code()));
    let rb = nb * BLOCK_BYTES;
    for g in &acts.groups {
        let (m, p) = (g.m, g.plane_rows());
        for r in 0..rows {
            let row = &weights[r * rb..(r + 1) * rb];
            for t in 0..m {
                let mut f = 0f32;
                for (b, blk) in crate::block::blocks(ty, row)
                    .into_iter()
                    .flatten()
                    .enumerate()
                {
                    let plane =
                        |row: usize, kk: usize| i32::from(g.planes[(b * p + row) * bpw + kk]);
                    let (mut top, mut low, mut ones) = (0i32, 0i32, 0i32);
                    for kk in 0..bpw {
                        // kk = 16 j + lane; lane 2i + h is half h of word i.
                        let (j, lane) = (kk / 16, kk % 16);
                        let e = (lane / 2) * cpw + 2 * j + lane % 2;
                        let code = ((blk.word(e / cpw) >> ty.code_shift(e % cpw)) & mask) as i32;
                        top += code * plane(t, kk);
                        low += code * plane(m + t, kk);
                        ones += code * plane(2 * m, kk);
                    }
                    let acc = (top << 8) + low - (ones << 15) - g.zq[b * m + t];
                    f = (acc as f32).mul_add(blk.scale() * g.sx[b * m + t], f);
                }
                outs[g.first + t][r] = f;
            }
        }
    }
}
