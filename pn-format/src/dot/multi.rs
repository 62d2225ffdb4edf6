//! One pass over a PN matrix for several activation vectors: `out[m][r] = dot(row r, acts[m])`.
//!
//! Decode streams every weight once per token; verifying `N` speculative tokens (or a small
//! batch) would stream it `N` times with [`super::matvec`]. Here each block is loaded and
//! unpacked once and multiplied with every vector, so the pass costs about one weight read plus
//! `M` times the (cheap, in-register) multiply-adds. Only [`PreparedI16`] activations: that is
//! the decode path.

use super::{check_k, scalar, PreparedI16};
use crate::error::PnError;
use crate::isa::Isa;
use crate::types::{PnType, BLOCK_BYTES};

/// Activation vectors one kernel call serves (more are taken in groups of this many per row).
pub const MAX_ACTS: usize = 8;

/// `outs[m][r] = dot(row r, acts[m])` for `rows` consecutive rows of `weights`, on the best SIMD
/// path. Every `acts[m]` must be prepared for `ty` with the same length `k`, and every `outs[m]`
/// hold `rows` values. Single-threaded: callers parallelise over row ranges.
pub fn matvec_multi(
    ty: PnType,
    weights: &[u8],
    rows: usize,
    acts: &[PreparedI16],
    outs: &mut [&mut [f32]],
) -> Result<(), PnError> {
    matvec_multi_with(Isa::detect(), ty, weights, rows, acts, outs)
}

/// [`matvec_multi`] on a chosen instruction set (falls back to scalar if the CPU lacks it).
/// [`Isa::Scalar`] is the reference: `scalar::dot_i16` per row and vector.
pub fn matvec_multi_with(
    isa: Isa,
    ty: PnType,
    weights: &[u8],
    rows: usize,
    acts: &[PreparedI16],
    outs: &mut [&mut [f32]],
) -> Result<(), PnError> {
    let rb = check_shapes(ty, weights, rows, acts, outs)?;
    if acts.is_empty() {
        return Ok(());
    }
    if rb == 0 {
        outs.iter_mut().for_each(|o| o.fill(0.0));
        return Ok(());
    }
    let nb = rb / BLOCK_BYTES;
    let isa = isa.or_scalar();
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512Vnni && acts.iter().all(|a| !a.xq8.is_empty()) {
        // int8 activations where the int8 decode kernel runs: each output is bit for bit the
        // one-row kernel's (`x86_i8::matvec_multi_i8_avx512`).
        for (g, group) in acts.chunks(MAX_ACTS).enumerate() {
            let outs = &mut outs[g * MAX_ACTS..g * MAX_ACTS + group.len()];
            let mut ptrs = [super::x86_i8::I8Acts {
                xq8: std::ptr::null(),
                sx: std::ptr::null(),
                zq: std::ptr::null(),
            }; MAX_ACTS];
            for (p, a) in ptrs.iter_mut().zip(group) {
                *p = super::x86_i8::I8Acts {
                    xq8: a.xq8.as_ptr(),
                    sx: a.sx.as_ptr(),
                    zq: a.zq.as_ptr(),
                };
            }
            let ptrs = &ptrs[..group.len()];
            // SAFETY: VNNI checked by `or_scalar`; `check_shapes` checked every length (each
            // vector prepared for `nb` blocks of `ty`, its `xq8` filled since non-empty).
            unsafe { super::x86_i8::matvec_multi_i8_avx512(ty, weights, rows, nb, ptrs, outs) };
        }
        return Ok(());
    }
    for (g, group) in acts.chunks(MAX_ACTS).enumerate() {
        let outs = &mut outs[g * MAX_ACTS..g * MAX_ACTS + group.len()];
        #[cfg(target_arch = "x86_64")]
        if isa != Isa::Scalar {
            tiled_simd(isa, ty, weights, rows, nb, group, outs);
            continue;
        }
        for (r, row) in weights.chunks_exact(rb).enumerate() {
            for (o, a) in outs.iter_mut().zip(group) {
                o[r] = scalar::dot_i16(ty, row, &a.xq, &a.sx, &a.zq);
            }
        }
    }
    Ok(())
}

/// Bytes of int16 activations (all vectors of a group together) that one pass over a tile of
/// rows keeps hot: well inside a 32..48 KB L1 data cache, which must also hold the weights
/// streaming through. A whole 5120-long vector is 10 KB, so five or more would spill to L2 and
/// every multiply-add would wait for it.
const ACT_TILE_BYTES: usize = 28 * 1024;

/// Rows that share one activation tile before the next tile is loaded.
const ROW_TILE: usize = 16;

/// Blocks per activation tile for `m` vectors of `nb` blocks: a multiple of 16 (the per-block
/// tables are read 16 at a time, so a tile starts on a table boundary and an even block), or
/// the whole row where `whole_rows` allows it and the vectors fill at most two thirds of the L1
/// data cache of `l1d` bytes.
///
/// Whole rows read the matrix front to back, and the two-row kernel then keeps DRAM streaming:
/// in tiles, a pass reads the first `kc` blocks of 16 rows and comes back for the rest, and
/// from DRAM that cost the 27B `ffn_up` pass with 3 vectors (pn3t, 30 KB of activations, 48 KB
/// L1) 5.9 ms against 4.7-4.8 in whole rows (`pn_verify`, one thread; 3.1 against 2.4 on two).
/// At the `ffn_down` shape (104 KB of activations) whole rows, from L2, were slower than tiles
/// (5.6 ms against 5.2-5.4), and tiles of 16, 20 or 28 KB alike.
fn tile_blocks(ty: PnType, m: usize, nb: usize, whole_rows: bool, l1d: usize) -> usize {
    let per_block = m * ty.weights_per_block() * 2;
    if whole_rows && per_block * nb * 3 <= l1d * 2 {
        return nb;
    }
    (ACT_TILE_BYTES / per_block / 16 * 16).max(16)
}

/// Where the weights of a tiled pass are read, piece by piece: rows `ROW_TILE` at a time; in each
/// row tile, block tiles of `kc` blocks; in each block tile, one piece per row.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug)]
struct Walk {
    rows: usize,
    nb: usize,
    kc: usize,
}

/// A position in a [`Walk`]: the row tile's first row, the block tile's first block, the row
/// within the row tile and the byte within that row's piece.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cursor {
    r0: usize,
    b0: usize,
    i: usize,
    off: usize,
}

#[cfg(target_arch = "x86_64")]
impl Cursor {
    /// The first piece of a pass.
    const START: Cursor = Cursor {
        r0: 0,
        b0: 0,
        i: 0,
        off: 0,
    };
}

#[cfg(target_arch = "x86_64")]
impl Walk {
    /// The piece at `c` (ignoring `c.off`): its first byte's offset in the matrix and its length,
    /// or `None` past the last piece.
    fn piece(&self, c: Cursor) -> Option<(usize, usize)> {
        let nr = ROW_TILE.min(self.rows.checked_sub(c.r0)?);
        (c.r0 < self.rows && c.i < nr && c.b0 < self.nb).then(|| {
            let nbc = self.kc.min(self.nb - c.b0);
            let row = (c.r0 + c.i) * self.nb + c.b0;
            (row * BLOCK_BYTES, nbc * BLOCK_BYTES)
        })
    }

    /// The first bytes of the two pieces `lead` and `lead + 1` steps after `c`'s in the walk
    /// (null past the last piece): where the two-row kernel working on the pieces at `c` and
    /// after it prefetches.
    fn pieces_ahead(&self, c: Cursor, lead: usize, weights: &[u8]) -> [*const u8; 2] {
        let mut out = [std::ptr::null(); 2];
        let mut at = c;
        // `next` only of cursors that name a piece (past the last one it is undefined).
        for step in 0..lead + 2 {
            let Some((start, _)) = self.piece(at) else {
                break;
            };
            if step >= lead {
                out[step - lead] = weights[start..].as_ptr();
            }
            at = self.next(at);
        }
        out
    }

    /// The piece after `c`'s, in the order the pass reads them (offset 0).
    fn next(&self, c: Cursor) -> Cursor {
        let nr = ROW_TILE.min(self.rows - c.r0);
        if c.i + 1 < nr {
            Cursor {
                i: c.i + 1,
                off: 0,
                ..c
            }
        } else if c.b0 + self.kc < self.nb {
            Cursor {
                b0: c.b0 + self.kc,
                i: 0,
                off: 0,
                ..c
            }
        } else {
            Cursor {
                r0: c.r0 + ROW_TILE,
                b0: 0,
                i: 0,
                off: 0,
            }
        }
    }
}

/// How many pieces of `len` bytes ahead of a two-row step its prefetches go: at least the
/// next pair of rows, and at least `ahead` bytes ([`super::x86::prefetch_bytes`]). Farther, at
/// twice the bytes, the 27B `ffn_up` pass with 3 vectors in whole rows was 7% slower from DRAM.
#[cfg(target_arch = "x86_64")]
fn pair_lead(ahead: usize, len: usize) -> usize {
    ahead.div_ceil(len.max(1)).max(2)
}

/// Software prefetch for a tiled AVX-512 pass of the one-row kernel (more than
/// [`super::x86_multi::PAIR_MAX_ACTS`] vectors; the two-row kernel prefetches itself, see
/// [`Walk::pieces_ahead`]): a cursor kept [`super::x86::prefetch_bytes`]
/// ahead of the reads, in the order the pass makes them. The decode kernels prefetch a fixed
/// distance along the row, but here the next piece read is usually the next row's: fetched
/// along the row, a later block tile of the same row came in early and the next row's piece
/// waited on DRAM (measured, 27B `ffn_down` with 3 vectors: the pass took about the sum of its
/// compute and read times).
#[cfg(target_arch = "x86_64")]
struct Prefetch<'a> {
    walk: Walk,
    weights: &'a [u8],
    at: Cursor,
}

#[cfg(target_arch = "x86_64")]
impl<'a> Prefetch<'a> {
    /// Starts the pass: prefetches its first `ahead` bytes.
    fn start(walk: Walk, weights: &'a [u8], ahead: usize) -> Self {
        let mut p = Prefetch {
            walk,
            weights,
            at: Cursor::START,
        };
        p.advance(ahead);
        p
    }

    /// Prefetches the next `bytes` bytes of the walk (call it with each piece's length as the
    /// piece is read, which keeps the cursor the same distance ahead).
    fn advance(&mut self, bytes: usize) {
        let weights = self.weights;
        self.advance_with(bytes, |start, n| {
            super::x86::prefetch_range(weights[start..].as_ptr(), n)
        });
    }

    /// [`Self::advance`], handing each range (offset in the matrix, length) to `fetch`.
    fn advance_with(&mut self, mut bytes: usize, mut fetch: impl FnMut(usize, usize)) {
        while bytes > 0 {
            let Some((start, len)) = self.walk.piece(self.at) else {
                return;
            };
            let n = bytes.min(len - self.at.off);
            fetch(start + self.at.off, n);
            bytes -= n;
            self.at.off += n;
            if self.at.off == len {
                self.at = self.walk.next(self.at);
            }
        }
    }
}

/// The SIMD kernels over tiles of `ROW_TILE` rows x `tile_blocks` blocks: the activations of a
/// tile stay in L1 while the tile's rows stream past; partial sums are added per tile.
#[cfg(target_arch = "x86_64")]
fn tiled_simd(
    isa: Isa,
    ty: PnType,
    weights: &[u8],
    rows: usize,
    nb: usize,
    acts: &[PreparedI16],
    outs: &mut [&mut [f32]],
) {
    use super::x86_multi::{
        multi2_i16_avx512, multi_i16_avx2, multi_i16_avx512, ActPtrs, PAIR_MAX_ACTS,
    };
    let m = acts.len();
    debug_assert!((1..=MAX_ACTS).contains(&m) && outs.len() == m);
    // Two rows at a time where the kernel exists (AVX-512, few vectors).
    let pairs = isa != Isa::Avx2 && m <= PAIR_MAX_ACTS;
    let kc = tile_blocks(ty, m, nb, pairs, super::x86_cache::l1d_bytes());
    let values_per_pair = 2 * ty.weights_per_block();
    let null = ActPtrs {
        xq: std::ptr::null(),
        sx: std::ptr::null(),
        zq: std::ptr::null(),
    };
    let walk = Walk { rows, nb, kc };
    let ahead = super::x86::prefetch_bytes();
    // The one-row AVX-512 kernel (more than `PAIR_MAX_ACTS` vectors) takes this cursor's
    // prefetch, a burst ahead of each piece in the walk's order. The two-row kernel prefetches
    // the pieces `pair_lead` steps ahead itself, a 16-block group at a time between its
    // multiply-adds: the bursts had it wait on L1's miss buffers (27B `ffn_down`, 3 vectors,
    // from DRAM: 6.2 ms against 5.2-5.3 one thread, 3.1-3.3 against 2.6-2.8 two). The AVX2
    // kernel prefetches along its row itself: its arithmetic is slow enough that the pass is
    // compute-bound, and there this cursor's burst of prefetches ahead of each piece cost more
    // than it saved (27B `ffn_up`, 3 vectors, from DRAM: 8.1-8.9 ns a block pair against
    // 7.5-7.8 with the kernel's own prefetch, 7.1-7.7 with the weights in L2).
    let mut prefetch = (isa != Isa::Avx2 && !pairs).then(|| Prefetch::start(walk, weights, ahead));
    // `[row of the tile][vector]`: the partial sums of the current row tile.
    let mut sums = [[0f32; MAX_ACTS]; ROW_TILE];
    let mut ptrs = [null; MAX_ACTS];
    let mut at = Cursor::START;
    while let Some((start, len)) = walk.piece(at) {
        if at.i == 0 {
            // A new block tile: its activations.
            for (p, a) in ptrs.iter_mut().zip(acts) {
                // `b0` is a multiple of 16, so even: the tile's values start at pair `b0 / 2`.
                *p = ActPtrs {
                    xq: a.xq[at.b0 / 2 * values_per_pair..].as_ptr(),
                    sx: a.sx[at.b0..].as_ptr(),
                    zq: a.zq[at.b0..].as_ptr(),
                };
            }
        }
        let nbc = len / BLOCK_BYTES;
        // Two rows of the block tile at once where the kernel exists (AVX-512, few vectors):
        // each activation load then serves both.
        let next = walk.next(at);
        let pair = pairs && next.r0 == at.r0 && next.i > 0;
        let mut part = [[0f32; MAX_ACTS]; 2];
        let [p0, p1] = &mut part;
        let row = weights[start..start + len].as_ptr();
        // SAFETY: `isa` passed `or_scalar` (the CPU has the features); each row slice holds
        // `nbc` blocks (the pieces of one block tile have one length); every vector was prepared
        // for `nb` blocks of `ty` (`check_shapes`), so from block `at.b0` it holds `nbc` blocks
        // of values (padded to an even count) and its tables hold 16-block batches up to the
        // padding.
        unsafe {
            if pair {
                let (start1, _) = walk.piece(next).expect("the next row of the block tile");
                let rows = [row, weights[start1..start1 + len].as_ptr()];
                let later = walk.pieces_ahead(at, pair_lead(ahead, len), weights);
                let outs = [&mut p0[..m], &mut p1[..m]];
                match isa {
                    Isa::Avx512Vnni => {
                        multi2_i16_avx512::<true>(ty, rows, later, nbc, &ptrs[..m], outs)
                    }
                    _ => multi2_i16_avx512::<false>(ty, rows, later, nbc, &ptrs[..m], outs),
                }
            } else {
                if let Some(p) = &mut prefetch {
                    p.advance(len);
                }
                let part = &mut p0[..m];
                match isa {
                    Isa::Avx512Vnni => multi_i16_avx512::<true>(ty, row, nbc, &ptrs[..m], part),
                    Isa::Avx512 => multi_i16_avx512::<false>(ty, row, nbc, &ptrs[..m], part),
                    _ => multi_i16_avx2(ty, row, nbc, &ptrs[..m], part),
                }
            }
        }
        for (k, p) in part.iter().enumerate().take(1 + usize::from(pair)) {
            for (s, v) in sums[at.i + k].iter_mut().zip(&p[..m]) {
                *s += v;
            }
        }
        // The last piece this step read, and the one after it (`next` already, without a pair).
        let (last, next) = if pair {
            (next, walk.next(next))
        } else {
            (at, next)
        };
        if next.r0 != last.r0 {
            // The row tile is done: its outputs.
            for (j, o) in outs.iter_mut().enumerate() {
                for (i, sum) in sums.iter_mut().enumerate().take(last.i + 1) {
                    o[last.r0 + i] = std::mem::take(&mut sum[j]);
                }
            }
        }
        at = next;
    }
}

/// Validates every length; returns the bytes per row.
fn check_shapes(
    ty: PnType,
    weights: &[u8],
    rows: usize,
    acts: &[PreparedI16],
    outs: &[&mut [f32]],
) -> Result<usize, PnError> {
    if outs.len() != acts.len() {
        return Err(PnError::LengthMismatch {
            what: "matvec_multi outputs (one per activation vector)",
            expected: acts.len(),
            got: outs.len(),
        });
    }
    let Some(k) = acts.first().map(|a| a.k) else {
        // No vectors: nothing to compute, whatever the weights.
        return Ok(0);
    };
    for a in acts {
        if a.ty != ty {
            return Err(PnError::TypeMismatch {
                prepared: a.ty,
                weights: ty,
            });
        }
        if a.k != k {
            return Err(PnError::LengthMismatch {
                what: "matvec_multi activation length",
                expected: k,
                got: a.k,
            });
        }
    }
    for o in outs {
        if o.len() != rows {
            return Err(PnError::LengthMismatch {
                what: "matvec_multi output",
                expected: rows,
                got: o.len(),
            });
        }
    }
    let rb = check_k(ty, k)? * BLOCK_BYTES;
    let expected = rows.checked_mul(rb).ok_or(PnError::LengthMismatch {
        what: "matvec_multi weight bytes",
        expected: usize::MAX,
        got: weights.len(),
    })?;
    if weights.len() != expected {
        return Err(PnError::LengthMismatch {
            what: "matvec_multi weight bytes",
            expected,
            got: weights.len(),
        });
    }
    Ok(rb)
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// Every piece of a walk, in order, with its cursor.
    fn pieces(walk: Walk) -> Vec<(Cursor, usize, usize)> {
        let mut out = Vec::new();
        let mut at = Cursor::START;
        while let Some((start, len)) = walk.piece(at) {
            out.push((at, start, len));
            at = walk.next(at);
        }
        out
    }

    #[test]
    fn walk_reads_every_byte_once_in_tile_order() {
        for (rows, nb, kc) in [
            (1, 1, 16),
            (7, 33, 16),
            (16, 64, 48),
            (37, 150, 48),
            (33, 512, 64),
        ] {
            let walk = Walk { rows, nb, kc };
            let got = pieces(walk);
            // The order of the nested loops a tiled pass makes.
            let mut want = Vec::new();
            for r0 in (0..rows).step_by(ROW_TILE) {
                for b0 in (0..nb).step_by(kc) {
                    for i in 0..ROW_TILE.min(rows - r0) {
                        let len = kc.min(nb - b0) * BLOCK_BYTES;
                        want.push(((r0 + i) * nb * BLOCK_BYTES + b0 * BLOCK_BYTES, len));
                    }
                }
            }
            let got_ranges: Vec<(usize, usize)> = got.iter().map(|&(_, s, l)| (s, l)).collect();
            assert_eq!(got_ranges, want, "rows {rows} nb {nb} kc {kc}");
            let mut sorted = got_ranges.clone();
            sorted.sort();
            let mut end = 0;
            for (s, l) in sorted {
                assert_eq!(s, end, "rows {rows} nb {nb} kc {kc}: gap or overlap");
                end = s + l;
            }
            assert_eq!(end, rows * nb * BLOCK_BYTES);
        }
        assert!(pieces(Walk {
            rows: 0,
            nb: 5,
            kc: 16
        })
        .is_empty());
    }

    #[test]
    fn two_row_steps_prefetch_the_pieces_that_follow_them() {
        let walk = Walk {
            rows: 37,
            nb: 150,
            kc: 48,
        };
        let weights = vec![0u8; 37 * 150 * BLOCK_BYTES];
        let all = pieces(walk);
        for (n, &(at, _, _)) in all.iter().enumerate() {
            for lead in [2, 3, 7] {
                let want: Vec<*const u8> = (n + lead..n + lead + 2)
                    .map(|k| {
                        all.get(k)
                            .map_or(std::ptr::null(), |&(_, start, _)| weights[start..].as_ptr())
                    })
                    .collect();
                assert_eq!(
                    walk.pieces_ahead(at, lead, &weights).to_vec(),
                    want,
                    "piece {n}"
                );
            }
        }
        // At least the next pair of rows, and at least `ahead` bytes.
        assert_eq!(pair_lead(4096, 2176), 2);
        assert_eq!(pair_lead(4096, 1088), 4);
        assert_eq!(pair_lead(6144, 2176), 3);
        assert_eq!(pair_lead(0, 544), 2);
    }

    #[test]
    fn tiles_are_whole_rows_only_for_pairs_whose_vectors_fit_l1() {
        // 27B `ffn_up` (pn3t, 64 blocks) with 3 vectors: 30 KB, whole rows in a 48 KB L1.
        assert_eq!(tile_blocks(PnType::Pn3t, 3, 64, true, 48 << 10), 64);
        // Not in a 32 KB one, nor for the one-row kernel, nor with 4 vectors (40 KB).
        assert_eq!(tile_blocks(PnType::Pn3t, 3, 64, true, 32 << 10), 48);
        assert_eq!(tile_blocks(PnType::Pn3t, 3, 64, false, 48 << 10), 48);
        assert_eq!(tile_blocks(PnType::Pn3t, 4, 64, true, 48 << 10), 32);
        // `ffn_down` (pn4t, 272 blocks): 104 KB, tiles.
        assert_eq!(tile_blocks(PnType::Pn4t, 3, 272, true, 48 << 10), 64);
        // Tiles are whole 16-block groups, at least one.
        assert_eq!(tile_blocks(PnType::Pn4t, 8, 272, true, 48 << 10), 16);
    }

    #[test]
    fn prefetch_stays_a_fixed_distance_ahead_in_walk_order() {
        let walk = Walk {
            rows: 37,
            nb: 150,
            kc: 48,
        };
        let (weights, total) = (vec![0u8; 37 * 150 * BLOCK_BYTES], 37 * 150 * BLOCK_BYTES);
        let order: Vec<(usize, usize)> = pieces(walk).iter().map(|&(_, s, l)| (s, l)).collect();
        // Byte `k` of the walk (in read order) as an offset in the matrix.
        let nth = |mut k: usize| {
            for &(s, l) in &order {
                if k < l {
                    return s + k;
                }
                k -= l;
            }
            unreachable!()
        };
        let ahead = 3000;
        let mut p = Prefetch {
            walk,
            weights: &weights,
            at: Cursor::START,
        };
        let fetched = std::cell::Cell::new(0);
        let check = |p: &mut Prefetch, bytes: usize| {
            p.advance_with(bytes, |start, n| {
                // Each range continues the walk where the last one stopped.
                assert_eq!(
                    start,
                    nth(fetched.get()),
                    "at byte {} of the walk",
                    fetched.get()
                );
                fetched.set(fetched.get() + n);
            });
        };
        check(&mut p, ahead);
        let mut read = 0;
        for &(_, len) in &order {
            read += len;
            check(&mut p, len);
            assert_eq!(
                fetched.get(),
                (read + ahead).min(total),
                "after {read} bytes read"
            );
        }
        // Everything was fetched once, and the cursor stopped at the end.
        assert_eq!(p.walk.piece(p.at), None);
        assert_eq!(fetched.get(), total);
    }
}
