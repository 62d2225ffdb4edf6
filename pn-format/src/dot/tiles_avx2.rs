//! The tiled product of [`super::tiles`] for int8 activations on CPUs with AVX2 but no AVX-512
//! VNNI (Haswell and Broadwell Xeons, the usual P100 hosts; AMD Zen 1-3): the 16 input rows of
//! a group in the lanes of two 8-lane vectors, as in [`super::tiles_vnni`], with the multiply
//! done by `vpmaddubsw` instead of `vpdpbusd`.
//!
//! [`TileActs`] holds per block and code quad `kq` 64 bytes: 16 inputs x the four int8 `q` of
//! tile positions `4 kq .. 4 kq + 4`, so inputs 0..8 and 8..16 are each one 32-byte operand.
//! One weight row's four codes of a quad, broadcast to every lane, go in as the unsigned
//! operand of `vpmaddubsw(codes, q)`: each 16-bit lane gets two products' sum, at most
//! `2 * 15 * 127` in magnitude, so nothing saturates; eight quads' such sums add up in 16 bits
//! (at most `8 * 3810 < 2^15`) before one `vpmaddwd` with ones widens them to int32. That is the
//! same integer `sum n q` per input and block as the VNNI kernel's, minus the same `z sum(q)`,
//! scaled and summed over blocks in the same order: results bit-identical to the reference.
//!
//! The driver is the VNNI kernel's (weights unpacked once per pass of [`ROWS`] rows and
//! `CHUNK` blocks, K panels of activations kept in L2, the next chunk prefetched), with fewer
//! rows per pass for AVX2's 16 vector registers: per row two int32 and two int16 accumulators,
//! plus the two activation halves and the broadcast quad.

use super::tiles::{TileActs, TILE};
use super::tiles_walk::{panel_blocks, Chunk, Unpack, Walk};
use crate::types::{PnType, BLOCK_BYTES};
use std::arch::x86_64::*;

/// Weight rows per pass: `4 ROWS` accumulators, two activation halves and the broadcast codes
/// fill 15 of the 16 vector registers.
pub const ROWS: usize = 3;

/// Quads summed in 16 bits before widening (`8 * 2 * 15 * 127 < 2^15`).
const I16_QUADS: usize = 8;

/// The unpacked chunk of one pass.
type Codes = Chunk<ROWS>;

/// Tile quad `kq` that unpacked slot `s` holds. The unpacker narrows pairs `j` and `j + 1` (the
/// 16 codes of pair `j` are tile positions `16 j .. 16 j + 16`) into one 32-byte store with
/// `vpackuswb`, which interleaves them per 128-bit half: slots `8 (j / 2) ..` hold quads `4 j`,
/// `4 j + 1`, `4 (j + 1)`, `4 (j + 1) + 1`, `4 j + 2`, `4 j + 3`, `4 (j + 1) + 2`,
/// `4 (j + 1) + 3`; slots `16..20` (pn3t) hold pair 4's quads in order.
pub const fn slot_quad(s: usize) -> usize {
    if s < 16 {
        let sl = s % 8;
        let pair = 2 * (s / 8) + (sl / 2) % 2;
        4 * pair + sl % 2 + 2 * (sl / 4)
    } else {
        s
    }
}

/// `outs[t][r] = dot(row r, acts[t])` for `rows` rows of `nb` blocks, `acts` in int8.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `weights` holds `rows` rows of `nb` blocks of `ty`, `acts`
/// was built for `nb` blocks of `ty` at [`super::TilePrecision::I8`] and every output holds
/// `rows` values.
pub unsafe fn matmul(
    ty: PnType,
    weights: &[u8],
    rows: usize,
    nb: usize,
    acts: &TileActs,
    outs: &mut [&mut [f32]],
) {
    match ty {
        PnType::Pn3t => kernel::<3, 5>(weights, rows, nb, acts, outs),
        PnType::Pn4t => kernel::<4, 4>(weights, rows, nb, acts, outs),
    }
}

/// Unpacks block `b` of `row` into `out` (`4 S` quads in slot order, see [`slot_quad`]): per
/// pair a 16-bit shift and mask, two pairs narrowed into bytes at once.
#[inline(always)]
unsafe fn unpack<const BITS: u32, const S: usize>(row: *const u8, b: usize, out: *mut u8) {
    let w = _mm256_loadu_si256(row.add(BLOCK_BYTES * b + 2) as *const __m256i);
    let mask = _mm256_set1_epi16(((1u32 << BITS) - 1) as i16);
    let pair = |j: u32| {
        _mm256_and_si256(
            _mm256_srl_epi16(w, _mm_cvtsi32_si128((BITS * j) as i32)),
            mask,
        )
    };
    _mm256_storeu_si256(out as *mut __m256i, _mm256_packus_epi16(pair(0), pair(1)));
    let p23 = _mm256_packus_epi16(pair(2), pair(3));
    _mm256_storeu_si256(out.add(32) as *mut __m256i, p23);
    if S == 5 {
        // Pair 4 narrowed against itself: qwords 0 and 2 hold its 16 codes.
        let p4 = _mm256_packus_epi16(pair(4), pair(4));
        let p4 = _mm256_permute4x64_epi64::<0b1000>(p4);
        _mm_storeu_si128(out.add(64) as *mut __m128i, _mm256_castsi256_si128(p4));
    }
}

/// [`unpack`] for [`Walk`].
struct UnpackAvx2<const BITS: u32, const S: usize>;

impl<const BITS: u32, const S: usize> Unpack for UnpackAvx2<BITS, S> {
    #[inline(always)]
    unsafe fn unpack(row: *const u8, b: usize, out: *mut u8) {
        unpack::<BITS, S>(row, b, out)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kernel<const BITS: u32, const S: usize>(
    weights: &[u8],
    rows: usize,
    nb: usize,
    acts: &TileActs,
    outs: &mut [&mut [f32]],
) {
    let bpw = 16 * S;
    let groups = outs.len().div_ceil(TILE);
    let passes = rows.div_ceil(ROWS);
    // `[pass][group][row of the pass]`: the 16 inputs' f32 sums (two halves) over the panels
    // done so far (carried across panels, so every sum still runs over the blocks in order).
    let mut sums = vec![[_mm256_setzero_ps(); 2]; passes * groups * ROWS];
    let panel = panel_blocks(bpw, groups, 1);
    let mut chunk = Codes::new();
    let mut walk = Walk::new(rows, nb, panel, ROWS);
    while let Some((pass, b0, nbc)) = walk.next::<UnpackAvx2<BITS, S>, ROWS>(weights, &mut chunk) {
        let f = &mut sums[pass * groups * ROWS..(pass + 1) * groups * ROWS];
        for g in 0..groups {
            let fg = &mut f[g * ROWS..(g + 1) * ROWS];
            group_pass::<S>(&chunk, nbc, acts, g * nb + b0, bpw, fg);
        }
    }
    for pass in 0..passes {
        let r0 = pass * ROWS;
        let nr = ROWS.min(rows - r0);
        for g in 0..groups {
            let at = (pass * groups + g) * ROWS;
            let mut vals = [0f32; TILE];
            for (r, [f0, f1]) in sums[at..at + nr].iter().enumerate() {
                _mm256_storeu_ps(vals.as_mut_ptr(), *f0);
                _mm256_storeu_ps(vals.as_mut_ptr().add(8), *f1);
                let n_in = (outs.len() - g * TILE).min(TILE);
                for (n, &v) in vals.iter().enumerate().take(n_in) {
                    outs[g * TILE + n][r0 + r] = v;
                }
            }
        }
    }
}

/// One group of 16 inputs against the unpacked chunk: `f[r] += sum over blocks of the 16
/// inputs' products with row r` (two halves of 8 inputs), blocks in order. `gb0` is the
/// `[group][block]` index of the chunk's first block.
#[inline(always)]
unsafe fn group_pass<const S: usize>(
    chunk: &Codes,
    nbc: usize,
    acts: &TileActs,
    gb0: usize,
    bpw: usize,
    f: &mut [[__m256; 2]],
) {
    let ones = _mm256_set1_epi16(1);
    // `i` addresses the codes, the scales and the activations of block `i` alike.
    #[allow(clippy::needless_range_loop)]
    for i in 0..nbc {
        let gb = gb0 + i;
        let q = acts.hi.as_ptr().add(gb * bpw * TILE) as *const u8;
        // `[row][half]`: int32 sums of the block so far, and the int16 sums of the quads since
        // the last widening.
        let mut acc = [[_mm256_setzero_si256(); 2]; ROWS];
        let mut acc16 = [[_mm256_setzero_si256(); 2]; ROWS];
        // Every slot unrolled: the quad offsets and the widening points are constants.
        slots!(s < 4 * S, {
            if s > 0 && s.is_multiple_of(I16_QUADS) {
                for r in 0..ROWS {
                    for h in 0..2 {
                        let wide = _mm256_madd_epi16(acc16[r][h], ones);
                        acc[r][h] = _mm256_add_epi32(acc[r][h], wide);
                        acc16[r][h] = _mm256_setzero_si256();
                    }
                }
            }
            let kq = slot_quad(s);
            let a = [0, 1].map(|h| _mm256_loadu_si256(q.add(64 * kq + 32 * h) as *const _));
            for r in 0..ROWS {
                let c = _mm256_set1_epi32(std::ptr::read(
                    chunk.codes[r][i].as_ptr().add(4 * s) as *const i32
                ));
                for h in 0..2 {
                    acc16[r][h] = maddubs_add(acc16[r][h], c, a[h]);
                }
            }
        });
        for h in 0..2 {
            // `sum n q - z sum(q)`: exact (`|sum n q| <= 80 * 15 * 127`).
            let zq = _mm256_loadu_si256(acts.zq.as_ptr().add(gb * TILE + 8 * h) as *const _);
            let sx = _mm256_loadu_ps(acts.sx.as_ptr().add(gb * TILE + 8 * h));
            for r in 0..ROWS {
                let wide = _mm256_madd_epi16(acc16[r][h], ones);
                let v = _mm256_sub_epi32(_mm256_add_epi32(acc[r][h], wide), zq);
                let ds = _mm256_mul_ps(_mm256_set1_ps(chunk.scales[r][i]), sx);
                f[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), ds, f[r][h]);
            }
        }
    }
}

/// `acc + vpmaddubsw(c (unsigned bytes), a (signed bytes))` in 16-bit lanes, as written: with
/// the intrinsics, LLVM reassociated the additions of a whole block into trees over every
/// slot's products, which needs more than 16 registers (half the loads were spills; 79 GMAC/s
/// against 114 with this, `tiled_ab` pn3t at one thread).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn maddubs_add(mut acc: __m256i, c: __m256i, a: __m256i) -> __m256i {
    std::arch::asm!(
        "vpmaddubsw {t}, {c}, {a}",
        "vpaddw {acc}, {acc}, {t}",
        acc = inout(ymm_reg) acc,
        c = in(ymm_reg) c,
        a = in(ymm_reg) a,
        t = out(ymm_reg) _,
        options(pure, nomem, nostack, preserves_flags),
    );
    acc
}

#[cfg(test)]
mod tests {
    use super::super::tiles_walk::{check_unpacker, MAX_BPW};
    use super::*;

    /// Every quad appears in exactly one slot.
    #[test]
    fn slots_cover_every_quad_once() {
        for slots in [16, 20] {
            let mut seen: Vec<usize> = (0..slots).map(slot_quad).collect();
            seen.sort_unstable();
            assert_eq!(seen, (0..slots).collect::<Vec<_>>());
        }
    }

    /// The unpacker puts quad `slot_quad(s)`'s four codes in slot `s`.
    #[test]
    fn unpacker_writes_each_slot_its_quad() {
        if !crate::Isa::Avx2.is_available() {
            return;
        }
        // SAFETY: AVX2 checked above; the row holds block b.
        check_unpacker("avx2", slot_quad, &|ty, row, b, got| unsafe {
            match ty {
                PnType::Pn3t => unpack_test::<3, 5>(row.as_ptr(), b, got),
                PnType::Pn4t => unpack_test::<4, 4>(row.as_ptr(), b, got),
            }
        });
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack_test<const BITS: u32, const S: usize>(
        row: *const u8,
        b: usize,
        out: &mut [u8; MAX_BPW],
    ) {
        unpack::<BITS, S>(row, b, out.as_mut_ptr())
    }
}
