//! The tiled product of [`super::tiles`] on CPUs without AMX: AVX-512 VNNI `vpdpbusd` with the
//! 16 input rows of a group in the 16 lanes of a vector (AMD Zen 4/5, Intel Ice Lake and later).
//!
//! [`TileActs`] already holds each group's activations as the AMX `B` operand: per block and
//! code quad `kq` (four consecutive tile positions `kk = 4 kq .. 4 kq + 4`), 64 bytes = 16
//! inputs x the four bytes of one plane of `q`. That is exactly one `vpdpbusd` operand with the
//! inputs in the lanes, so one weight row's four codes of a quad, broadcast to every lane,
//! multiply all 16 inputs at once and the sums land per input: no horizontal reduction.
//!
//! Per pass of [`ROWS`] weight rows and `CHUNK` blocks, the codes are unpacked once into
//! bytes (`[row][block][slot]`, the quads in the order the unpacker emits them, see
//! [`slot_quad`]) with the block scales as f32; then every group of 16 inputs walks the chunk:
//! per quad two vector loads (the planes) feed `2 ROWS` multiply-adds, each row's quad broadcast
//! from the buffer once for both planes:
//!
//! - high plane: `vpdpbusd(acc_h, codes as u8, hi as s8)`;
//! - low plane: `vpdpbusd(acc_l, lo as u8, codes as s8)` (codes `0..=15` are valid either way).
//!
//! So `256 acc_h + acc_l = sum n q` exactly, and with [`TileActs`]' `z * sum(q)` per input and
//! block subtracted, `sum (n - z) q`: the integer the AMX kernels and the reference compute
//! (`|sum (n - z) q| <= 80 * 4 * 32767 < 2^24`, exact in f32), scaled and summed over blocks in
//! the same order, so the results are bit-identical to theirs.
//!
//! The passes walk the matrix in K panels whose activations stay in L2 (`tiles_walk`), the
//! sums carried across panels; the next chunk's weights are prefetched while the groups run.
//!
//! Speed (`cargo run --release -p pn-format --example tiled_ab`, one thread's CPU clock, AMD
//! Zen 5 at about 3.5 GHz, 64 inputs): 195-214 GMAC/s with the weights in L2 and 165-200 for the
//! 27B `ffn_up`/`ffn_down` shapes, against a `vpdpbusd` peak of 224 (two per cycle, 32 int16
//! multiply-adds each across the two planes); the fused multi-vector int16 kernels it replaces
//! on such CPUs reached about 58 (`pn_tiled` bench: 100.7 ms against 44.6 for pn3t, before the
//! prefetch and the unrolled slots).

use super::amx::write_rows;
use super::tiles::{TileActs, TilePrecision, TILE};
use super::tiles_walk::{panel_blocks, CHUNK, MAX_BPW};
use crate::types::{PnType, BLOCK_BYTES};
use std::arch::x86_64::*;

/// Weight rows per pass: two int32 accumulators and one f32 sum per row stay in registers
/// (`3 ROWS` of the 32 vector registers), with the two planes and the broadcast code quad.
pub const ROWS: usize = 8;

/// The unpacked codes of one pass: `[row][block][slot quad][4]`.
#[repr(C, align(64))]
struct Codes([[[u8; MAX_BPW]; CHUNK]; ROWS]);

/// Tile quad `kq` (activation bytes `4 kq .. 4 kq + 4` of a block) that unpacked slot `s`
/// holds. The unpacker reads the block's four code qwords `Q` (words `2Q`, `2Q + 1`: 16-bit
/// lanes `l = 4Q .. 4Q + 4`) and writes, for slots `0..16`, qword `i = s / 2` of a vector with
/// pair `j = 2 (i / 4) + s % 2` of qword `Q = i % 4`; slots `16..20` (pn3t) hold pair 4 of
/// `Q = s - 16`. Quad `kq = 4 j + Q` is tile positions `kk = 16 j + 4 Q + lq`.
pub const fn slot_quad(s: usize) -> usize {
    if s < 16 {
        let i = s / 2;
        let (q, j) = (i % 4, 2 * (i / 4) + s % 2);
        4 * j + q
    } else {
        16 + (s - 16)
    }
}

/// `outs[t][r] = dot(row r, acts[t])` for `rows` rows of `nb` blocks.
///
/// # Safety
/// The CPU has AVX-512 F, BW and VNNI; `weights` holds `rows` rows of `nb` blocks of `ty`,
/// `acts` was built for `nb` blocks of `ty` and every output holds `rows` values.
pub unsafe fn matmul(
    ty: PnType,
    weights: &[u8],
    rows: usize,
    nb: usize,
    acts: &TileActs,
    outs: &mut [&mut [f32]],
) {
    let vbmi = super::x86::has_vbmi();
    let i8 = acts.precision() == TilePrecision::I8;
    let (w, a, o) = (weights, acts, outs);
    match (ty, vbmi, i8) {
        (PnType::Pn3t, true, false) => kernel_vbmi::<3, 5, false>(w, rows, nb, a, o),
        (PnType::Pn4t, true, false) => kernel_vbmi::<4, 4, false>(w, rows, nb, a, o),
        (PnType::Pn3t, false, false) => kernel_bw::<3, 5, false>(w, rows, nb, a, o),
        (PnType::Pn4t, false, false) => kernel_bw::<4, 4, false>(w, rows, nb, a, o),
        (PnType::Pn3t, true, true) => kernel_vbmi::<3, 5, true>(w, rows, nb, a, o),
        (PnType::Pn4t, true, true) => kernel_vbmi::<4, 4, true>(w, rows, nb, a, o),
        (PnType::Pn3t, false, true) => kernel_bw::<3, 5, true>(w, rows, nb, a, o),
        (PnType::Pn4t, false, true) => kernel_bw::<4, 4, true>(w, rows, nb, a, o),
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi,avx2,fma,f16c")]
unsafe fn kernel_vbmi<const BITS: u32, const S: usize, const I8: bool>(
    weights: &[u8],
    rows: usize,
    nb: usize,
    acts: &TileActs,
    outs: &mut [&mut [f32]],
) {
    kernel::<BITS, S, true, I8>(weights, rows, nb, acts, outs)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn kernel_bw<const BITS: u32, const S: usize, const I8: bool>(
    weights: &[u8],
    rows: usize,
    nb: usize,
    acts: &TileActs,
    outs: &mut [&mut [f32]],
) {
    kernel::<BITS, S, false, I8>(weights, rows, nb, acts, outs)
}

/// Unpacks block `b` of `row` into `out` (`4 S` quads in slot order, see [`slot_quad`]) with
/// `vpmultishiftqb`: each output byte takes the eight bits at its code's offset in its qword,
/// and a byte mask keeps the code.
#[inline(always)]
unsafe fn unpack_vbmi<const BITS: u32, const S: usize>(row: *const u8, b: usize, out: *mut u8) {
    // The block's 32 code bytes in both halves: output qword i reads source qword i % 4.
    let w = _mm512_broadcast_i64x4(_mm256_loadu_si256(
        row.add(BLOCK_BYTES * b + 2) as *const __m256i
    ));
    let mask = _mm512_set1_epi8(((1u32 << BITS) - 1) as i8);
    // Byte lq (0..4) of the low dword takes pair `ja` of 16-bit lane lq, the high dword pair `jb`.
    let ctl = |ja: u64, jb: u64| {
        let mut c = 0u64;
        for lq in 0..4u64 {
            c |= ((16 * lq + u64::from(BITS) * ja) & 63) << (8 * lq);
            c |= ((16 * lq + u64::from(BITS) * jb) & 63) << (8 * (lq + 4));
        }
        c as i64
    };
    let (c01, c23) = (ctl(0, 1), ctl(2, 3));
    let lo_hi = _mm512_setr_epi64(c01, c01, c01, c01, c23, c23, c23, c23);
    let v = _mm512_and_si512(_mm512_multishift_epi64_epi8(lo_hi, w), mask);
    _mm512_storeu_si512(out as *mut _, v);
    if S == 5 {
        // Pair 4 of each qword in its low dword; the narrowing keeps qwords 0..4's.
        let c4 = ctl(4, 4);
        let v4 = _mm512_and_si512(_mm512_multishift_epi64_epi8(_mm512_set1_epi64(c4), w), mask);
        let d4 = _mm512_cvtepi64_epi32(v4);
        _mm_storeu_si128(out.add(64) as *mut __m128i, _mm256_castsi256_si128(d4));
    }
}

/// [`unpack_vbmi`] without VBMI: per pair a 16-bit shift and mask, narrowed to bytes (lane `l`
/// of pair `j` is tile position `16 j + l`), then moved into slot order.
#[inline(always)]
unsafe fn unpack_bw<const BITS: u32, const S: usize>(row: *const u8, b: usize, out: *mut u8) {
    let w = _mm256_loadu_si256(row.add(BLOCK_BYTES * b + 2) as *const __m256i);
    let mask = _mm256_set1_epi16(((1u32 << BITS) - 1) as i16);
    let mut kk = [0u8; MAX_BPW];
    for j in 0..S {
        let c = _mm256_and_si256(
            _mm256_srl_epi16(w, _mm_cvtsi32_si128((BITS as usize * j) as i32)),
            mask,
        );
        let bytes = _mm256_cvtepi16_epi8(c);
        _mm_storeu_si128(kk.as_mut_ptr().add(16 * j) as *mut __m128i, bytes);
    }
    for s in 0..4 * S {
        let q = slot_quad(s);
        std::ptr::copy_nonoverlapping(kk.as_ptr().add(4 * q), out.add(4 * s), 4);
    }
}

/// The kernel keeps its own copy of `tiles_walk::Walk`'s loop (the same panels, passes, chunks
/// and prefetch): driven through `Walk`, LLVM allocated the int8 pair pass's registers worse
/// (619 vector spills and reloads in the pn4t int8 kernel against 108; `tiled_ab` pn4t int8
/// 166 GMAC/s against 305-336).
#[inline(always)]
unsafe fn kernel<const BITS: u32, const S: usize, const VBMI: bool, const I8: bool>(
    weights: &[u8],
    rows: usize,
    nb: usize,
    acts: &TileActs,
    outs: &mut [&mut [f32]],
) {
    let bpw = 16 * S;
    let rb = nb * BLOCK_BYTES;
    let groups = outs.len().div_ceil(TILE);
    let passes = rows.div_ceil(ROWS);
    let mut codes = Codes([[[0u8; MAX_BPW]; CHUNK]; ROWS]);
    let mut scales = [[0f32; CHUNK]; ROWS];
    // `[pass][group][row of the pass]`: the 16 inputs' f32 sums over the panels done so far
    // (carried across panels, so every sum still runs over the blocks in order).
    let mut sums = vec![_mm512_setzero_ps(); passes * groups * ROWS];
    let p = weights.as_ptr();
    let panel = panel_blocks(bpw, groups, if I8 { 1 } else { 2 });
    for k0 in (0..nb).step_by(panel) {
        let k1 = nb.min(k0 + panel);
        for pass in 0..passes {
            let r0 = pass * ROWS;
            let nr = ROWS.min(rows - r0);
            let f = &mut sums[pass * groups * ROWS..(pass + 1) * groups * ROWS];
            for b0 in (k0..k1).step_by(CHUNK) {
                let nbc = CHUNK.min(k1 - b0);
                let chunk_rows = codes.0.iter_mut().zip(scales.iter_mut()).enumerate();
                for (r, (row_codes, row_scales)) in chunk_rows {
                    let (row_codes, row_scales) = (&mut row_codes[..nbc], &mut row_scales[..nbc]);
                    if r >= nr {
                        // Rows past the end: zero codes and scales (their sums are never
                        // written).
                        row_codes.iter_mut().for_each(|c| c.fill(0));
                        row_scales.fill(0.0);
                        continue;
                    }
                    let row = p.add((r0 + r) * rb);
                    for (i, (c, d)) in row_codes.iter_mut().zip(row_scales).enumerate() {
                        if VBMI {
                            unpack_vbmi::<BITS, S>(row, b0 + i, c.as_mut_ptr());
                        } else {
                            unpack_bw::<BITS, S>(row, b0 + i, c.as_mut_ptr());
                        }
                        let h =
                            std::ptr::read_unaligned(row.add(BLOCK_BYTES * (b0 + i)) as *const u16);
                        *d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h))));
                    }
                }
                // The next chunk's weights into L2 while the groups run on this one: unpacked
                // straight from DRAM, the chunk's loads stalled the unpack (a fifth of the
                // kernel's time in the 27B-shaped pp64 profile).
                let (next_r0, next_b0) = if b0 + CHUNK < k1 {
                    (r0, b0 + CHUNK)
                } else if pass + 1 < passes {
                    (r0 + ROWS, k0)
                } else {
                    (0, k1)
                };
                if next_b0 < nb {
                    let next_nbc = CHUNK.min(nb - next_b0);
                    for r in next_r0..rows.min(next_r0 + ROWS) {
                        let start = p.add(r * rb + next_b0 * BLOCK_BYTES);
                        let mut off = 0;
                        while off < next_nbc * BLOCK_BYTES {
                            _mm_prefetch::<_MM_HINT_T1>(start.add(off) as *const i8);
                            off += 64;
                        }
                    }
                }
                if I8 {
                    // Groups in pairs: each broadcast code quad feeds both.
                    let mut g = 0;
                    while g + 2 <= groups {
                        let fg = &mut f[g * ROWS..(g + 2) * ROWS];
                        group_pass_i8::<S, 2>(&codes, &scales, nbc, acts, g * nb + b0, bpw, fg);
                        g += 2;
                    }
                    if g < groups {
                        let fg = &mut f[g * ROWS..(g + 1) * ROWS];
                        group_pass_i8::<S, 1>(&codes, &scales, nbc, acts, g * nb + b0, bpw, fg);
                    }
                } else {
                    for g in 0..groups {
                        let fg = &mut f[g * ROWS..(g + 1) * ROWS];
                        group_pass::<S>(&codes, &scales, nbc, acts, g * nb + b0, bpw, fg);
                    }
                }
            }
        }
    }
    for pass in 0..passes {
        let r0 = pass * ROWS;
        let nr = ROWS.min(rows - r0);
        for g in 0..groups {
            let at = (pass * groups + g) * ROWS;
            write_rows(&sums[at..at + ROWS], nr, r0, g, outs);
        }
    }
}

/// One group of 16 inputs against the unpacked chunk: `f[r] += sum over blocks of the 16
/// inputs' products with row r`, blocks in order. `gb0` is the `[group][block]` index of the
/// chunk's first block.
#[inline(always)]
unsafe fn group_pass<const S: usize>(
    codes: &Codes,
    scales: &[[f32; CHUNK]; ROWS],
    nbc: usize,
    acts: &TileActs,
    gb0: usize,
    bpw: usize,
    f: &mut [__m512],
) {
    let mut sum: [__m512; ROWS] = std::array::from_fn(|r| f[r]);
    // `i` addresses the codes, the scales and the activations of block `i` alike.
    #[allow(clippy::needless_range_loop)]
    for i in 0..nbc {
        let gb = gb0 + i;
        let hi = acts.hi.as_ptr().add(gb * bpw * TILE) as *const u8;
        let lo = acts.lo.as_ptr().add(gb * bpw * TILE);
        let mut acc_h = [_mm512_setzero_si512(); ROWS];
        let mut acc_l = [_mm512_setzero_si512(); ROWS];
        // Every slot unrolled: the quad offsets are constants (a loop computed `slot_quad` and
        // branched per slot, a dozen scalar instructions per 16 multiply-adds).
        slots!(s < 4 * S, {
            let kq = slot_quad(s);
            let bh = _mm512_loadu_si512(hi.add(64 * kq) as *const _);
            let bl = _mm512_loadu_si512(lo.add(64 * kq) as *const _);
            for r in 0..ROWS {
                let c = _mm512_set1_epi32(std::ptr::read(
                    codes.0[r][i].as_ptr().add(4 * s) as *const i32
                ));
                acc_h[r] = dpbusd(acc_h[r], c, bh);
                acc_l[r] = dpbusd(acc_l[r], bl, c);
            }
        });
        let zq = _mm512_loadu_si512(acts.zq.as_ptr().add(gb * TILE) as *const _);
        let sx = _mm512_loadu_ps(acts.sx.as_ptr().add(gb * TILE));
        for r in 0..ROWS {
            let v = _mm512_sub_epi32(
                _mm512_add_epi32(_mm512_slli_epi32::<8>(acc_h[r]), acc_l[r]),
                zq,
            );
            let ds = _mm512_mul_ps(_mm512_set1_ps(scales[r][i]), sx);
            sum[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), ds, sum[r]);
        }
    }
    f.copy_from_slice(&sum);
}

/// [`group_pass`] on int8 activations for `G` consecutive groups at once (`f`: `[G][ROWS]`):
/// per quad one vector load (the only plane) per group and one `vpdpbusd` per row and group,
/// each row's quad broadcast once for all `G` groups (with one group, nine loads fed eight
/// multiply-adds: more than the two load ports keep up with). `gb0` is the `[group][block]`
/// index of the first group's first block in the chunk.
#[inline(always)]
unsafe fn group_pass_i8<const S: usize, const G: usize>(
    codes: &Codes,
    scales: &[[f32; CHUNK]; ROWS],
    nbc: usize,
    acts: &TileActs,
    gb0: usize,
    bpw: usize,
    f: &mut [__m512],
) {
    let nb = acts.nb();
    // `i` addresses the codes, the scales and the activations of block `i` alike.
    #[allow(clippy::needless_range_loop)]
    for i in 0..nbc {
        let gb: [usize; G] = std::array::from_fn(|g| gb0 + g * nb + i);
        let q: [*const u8; G] =
            std::array::from_fn(|g| acts.hi.as_ptr().add(gb[g] * bpw * TILE) as *const u8);
        let mut acc = [[_mm512_setzero_si512(); ROWS]; G];
        slots!(s < 4 * S, {
            let kq = slot_quad(s);
            let a: [__m512i; G] =
                std::array::from_fn(|g| _mm512_loadu_si512(q[g].add(64 * kq) as *const _));
            for r in 0..ROWS {
                let c = _mm512_set1_epi32(std::ptr::read(
                    codes.0[r][i].as_ptr().add(4 * s) as *const i32
                ));
                for g in 0..G {
                    acc[g][r] = dpbusd(acc[g][r], c, a[g]);
                }
            }
        });
        for g in 0..G {
            // `sum n q - z sum(q)`: exact (`|sum n q| <= 80 * 15 * 127`).
            let zq = _mm512_loadu_si512(acts.zq.as_ptr().add(gb[g] * TILE) as *const _);
            let sx = _mm512_loadu_ps(acts.sx.as_ptr().add(gb[g] * TILE));
            for r in 0..ROWS {
                let v = _mm512_sub_epi32(acc[g][r], zq);
                let ds = _mm512_mul_ps(_mm512_set1_ps(scales[r][i]), sx);
                let at = g * ROWS + r;
                f[at] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), ds, f[at]);
            }
        }
    }
}

/// `vpdpbusd acc, a (unsigned bytes), b (signed bytes)` as written: LLVM turns the intrinsic
/// into `vpmaddubsw` + `vpmaddwd` + `vpaddd` for a generic target tuning (see
/// `x86_multi::dpwssd_asm`).
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
pub(super) unsafe fn dpbusd(mut acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
    std::arch::asm!(
        "vpdpbusd {acc}, {a}, {b}",
        acc = inout(zmm_reg) acc,
        a = in(zmm_reg) a,
        b = in(zmm_reg) b,
        options(pure, nomem, nostack, preserves_flags),
    );
    acc
}

#[cfg(test)]
mod tests {
    use super::super::tiles_walk::check_unpacker;
    use super::*;

    /// Both unpackers put quad `slot_quad(s)`'s four codes in slot `s`.
    #[test]
    fn unpackers_write_each_slot_its_quad() {
        if !crate::Isa::Avx512Vnni.is_available() {
            return;
        }
        // SAFETY (both): AVX-512 F/BW/VNNI checked above (VBMI below); the row holds block b.
        check_unpacker("bw", slot_quad, &|ty, row, b, got| unsafe {
            match ty {
                PnType::Pn3t => unpack_bw_test::<3, 5>(row.as_ptr(), b, got),
                PnType::Pn4t => unpack_bw_test::<4, 4>(row.as_ptr(), b, got),
            }
        });
        if super::super::x86::has_vbmi() {
            check_unpacker("vbmi", slot_quad, &|ty, row, b, got| unsafe {
                match ty {
                    PnType::Pn3t => unpack_vbmi_test::<3, 5>(row.as_ptr(), b, got),
                    PnType::Pn4t => unpack_vbmi_test::<4, 4>(row.as_ptr(), b, got),
                }
            });
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    unsafe fn unpack_bw_test<const BITS: u32, const S: usize>(
        row: *const u8,
        b: usize,
        out: &mut [u8; MAX_BPW],
    ) {
        unpack_bw::<BITS, S>(row, b, out.as_mut_ptr())
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi,avx2,fma,f16c")]
    unsafe fn unpack_vbmi_test<const BITS: u32, const S: usize>(
        row: *const u8,
        b: usize,
        out: &mut [u8; MAX_BPW],
    ) {
        unpack_vbmi::<BITS, S>(row, b, out.as_mut_ptr())
    }
}
