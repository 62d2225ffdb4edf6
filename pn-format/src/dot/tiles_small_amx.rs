//! The AMX kernel of [`super::tiles_small`] (see its docs for the layout).
//!
//! Tile registers, alternating by block parity so that one block's products need not wait for
//! the previous block's result store (tile registers are not renamed: a load into a register
//! an in-flight product still reads waits for it):
//! - even blocks: `tmm0` the codes of 16 weight rows (`B`, K step 0), `tmm1` the group's `A`
//!   tile (K step 0), `tmm4` the int32 result (`2 m + 1` rows of 16 weight rows);
//! - odd blocks: `tmm2`, `tmm3`, `tmm5` the same;
//! - pn3t only (80 codes per block do not fit one 64-byte K step): `tmm6`/`tmm7` the `B`/`A`
//!   tiles of K step 1 (40 codes each step), shared by both parities.

use super::amx::TileConfig;
use super::tiles_small::{SmallActs, SmallGroup, GROUP_MAX};
use crate::types::{PnType, BLOCK_BYTES};
use std::arch::asm;
use std::arch::x86_64::*;

/// Weight rows per pass (the `B` tile width in int32 columns).
const ROWS: usize = 16;

/// The largest 16-row tile (bytes) whose successor is prefetched while it is multiplied.
const PREFETCH_TILE_MAX: usize = 64 << 10;

/// Weight bytes one run of rows should span when several input groups take turns over it
/// (each group's pass then reads it from L2, not DRAM).
const RUN_BYTES: usize = 1 << 20;

/// One block's codes in `B` layout: `[kk / 4][row 16][kk % 4]`, up to 20 rows of 64 bytes.
#[repr(C, align(64))]
struct Codes([u8; 20 * 64]);

/// One block's int32 results: `[plane row p < 16][weight row 16]`.
#[repr(C, align(64))]
struct Results([i32; 16 * ROWS]);

/// `outs[t][r] = dot(row r, acts[t])`; `false` (nothing written) without AVX-512 VBMI.
///
/// # Safety
/// AMX-TILE, AMX-INT8 and AVX-512BW are available and the tile state was granted
/// (`super::amx_available`); `weights` holds `rows` rows of the blocks `acts` was built for,
/// `outs` holds `acts.n_rows()` slices of `rows` values, `16 * row bytes` fits an `i32`.
pub(super) unsafe fn matvec(
    ty: PnType,
    weights: &[u8],
    rows: usize,
    acts: &SmallActs,
    outs: &mut [&mut [f32]],
) -> bool {
    if !is_x86_feature_detected!("avx512vbmi") {
        return false;
    }
    let rb = acts.nb * BLOCK_BYTES;
    // One group: one pass over every row. More: runs of rows (a multiple of the pass height)
    // that each group multiplies in turn while the run stays in L2.
    let run = if acts.groups.len() == 1 {
        rows
    } else {
        (RUN_BYTES / rb).next_multiple_of(ROWS).max(ROWS)
    };
    for r0 in (0..rows).step_by(run.max(1)) {
        let r1 = rows.min(r0 + run);
        for g in &acts.groups {
            match ty {
                PnType::Pn3t => kernel::<3, 5>(weights, r0, r1, acts.nb, g, outs),
                PnType::Pn4t => kernel::<4, 4>(weights, r0, r1, acts.nb, g, outs),
            }
        }
    }
    true
}

/// The `vpmultishiftqb` control that puts code `j` of the four 16-bit lanes of a qword into
/// bytes 0..4 and code `j + 1` into bytes 4..8 (each byte the 8 bits at the code's offset; the
/// mask keeps the code).
fn pair_control(bits: u32, j: usize) -> i64 {
    let mut c = 0u64;
    for i in 0..4u64 {
        let lo = (16 * i + u64::from(bits) * j as u64) & 63;
        let hi = (16 * i + u64::from(bits) * (j as u64 + 1)) & 63;
        c |= lo << (8 * i) | hi << (8 * (i + 4));
    }
    c as i64
}

/// The products of one block: `tmm{c} = A . B` over both K steps (pn3t) or one (pn4t), stored
/// to the result buffer. `$b`/`$a`/`$c`: the parity's registers as literals.
macro_rules! block_product {
    ($two:expr, $cp:expr, $ap:expr, $rp:expr, $sa:expr, $b:literal, $a:literal, $c:literal) => {
        if $two {
            asm!(
                concat!("tileloadd tmm", $b, ", [{c} + {s64}*1]"),
                concat!("tileloadd tmm", $a, ", [{ap} + {sa}*1]"),
                "tileloadd tmm6, [{c} + {s64}*1 + 640]",
                "tileloadd tmm7, [{ap} + {sa}*1 + 40]",
                concat!("tilezero tmm", $c),
                concat!("tdpbuud tmm", $c, ", tmm", $a, ", tmm", $b),
                concat!("tdpbuud tmm", $c, ", tmm7, tmm6"),
                concat!("tilestored [{r} + {s64}*1], tmm", $c),
                c = in(reg) $cp,
                ap = in(reg) $ap,
                r = in(reg) $rp,
                sa = in(reg) $sa,
                s64 = in(reg) 64usize,
                options(nostack),
            );
        } else {
            asm!(
                concat!("tileloadd tmm", $b, ", [{c} + {s64}*1]"),
                concat!("tileloadd tmm", $a, ", [{ap} + {sa}*1]"),
                concat!("tilezero tmm", $c),
                concat!("tdpbuud tmm", $c, ", tmm", $a, ", tmm", $b),
                concat!("tilestored [{r} + {s64}*1], tmm", $c),
                c = in(reg) $cp,
                ap = in(reg) $ap,
                r = in(reg) $rp,
                sa = in(reg) $sa,
                s64 = in(reg) 64usize,
                options(nostack),
            );
        }
    };
}

/// Rows `r0..r1` of `weights` against one input group: `outs[g.first + t][r]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx2,fma,f16c")]
unsafe fn kernel<const BITS: u32, const S: usize>(
    weights: &[u8],
    r0: usize,
    r1: usize,
    nb: usize,
    g: &SmallGroup,
    outs: &mut [&mut [f32]],
) {
    let (m, p) = (g.m, g.plane_rows());
    let bpw = 16 * S;
    let rb = nb * BLOCK_BYTES;
    let two_steps = S == 5;
    // K bytes per `A` tile row (one step of a pn3t block, a whole pn4t block).
    let kb: u16 = if two_steps { 40 } else { 64 };
    let mut cfg = TileConfig {
        palette: 1,
        start_row: 0,
        reserved: [0; 14],
        colsb: [0; 16],
        rows: [0; 16],
    };
    for (t, colsb, r) in [
        (0, 64, kb / 4),
        (1, kb, p as u16),
        (2, 64, kb / 4),
        (3, kb, p as u16),
        (4, 64, p as u16),
        (5, 64, p as u16),
        (6, 64, kb / 4),
        (7, kb, p as u16),
    ] {
        if t < 6 || two_steps {
            cfg.colsb[t] = colsb;
            cfg.rows[t] = r as u8;
        }
    }
    asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly));
    // Two of each, alternating by block: one block's stores need not wait for the previous
    // block's tile loads (and its tile stores for the previous block's vector loads).
    let mut codes = [Codes([0; 20 * 64]), Codes([0; 20 * 64])];
    let mut res = [Results([0; 16 * ROWS]), Results([0; 16 * ROWS])];
    let mask = _mm512_set1_epi8(((1i32 << BITS) - 1) as i8);
    let ctl = [0, 2, 4].map(|j| _mm512_set1_epi64(pair_control(BITS, j)));
    // Dword 0 (even) or 1 (odd) of each qword of two registers: rows 0..8 then 8..16.
    let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    let cps = [codes[0].0.as_mut_ptr(), codes[1].0.as_mut_ptr()];
    let rps = [res[0].0.as_mut_ptr(), res[1].0.as_mut_ptr()];
    // The gathers read 16 rows at once, 16 streams the hardware prefetcher served poorly from
    // DRAM: where a 16-row tile is small (pn3t at K = 5120: 34 KiB), the next one is prefetched
    // into L2 while this one is multiplied (`pn_verify`, DRAM, 3 rows against 1, alternated:
    // pn3t 1.22-1.27x -> 1.05-1.15x with 1 thread, 1.24-1.31x -> 1.09-1.15x with 2; the
    // whole 27B verify pass of 3 rows 1.13-1.15x -> 1.09-1.11x one row). At pn4t's 148 KiB
    // tiles it cost 35-45% (into L1 or L2 alike), so larger tiles go without.
    let prefetch_next = ROWS * rb <= PREFETCH_TILE_MAX;
    for rt in (r0..r1).step_by(ROWS) {
        let nr = ROWS.min(r1 - rt);
        let base = weights.as_ptr().add(rt * rb);
        // Rows past the end repeat the last one (their results are not written).
        let off = |i: usize| (i.min(nr - 1) * rb) as i64;
        let idx_lo = _mm512_setr_epi64(
            off(0),
            off(1),
            off(2),
            off(3),
            off(4),
            off(5),
            off(6),
            off(7),
        );
        let idx_hi = _mm512_setr_epi64(
            off(8),
            off(9),
            off(10),
            off(11),
            off(12),
            off(13),
            off(14),
            off(15),
        );
        let idx32 = _mm512_cvtepi64_epi32(idx_lo);
        let idx32 =
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(idx32), _mm512_cvtepi64_epi32(idx_hi));
        let mut f = [_mm512_setzero_ps(); GROUP_MAX];
        // Software-pipelined by one block: block `b + 1` is unpacked and block `b - 1`'s
        // results are scaled while block `b`'s tile products run, so that neither the tile
        // loads wait for the code stores just made nor the vector loads for the tile store
        // just issued. Measured (`kernel_cpu` example, 64 rows in L2, cost relative to one
        // decode `matvec`, pn3t/pn4t): 1 input 1.51x/1.68x -> 1.05x/1.05x, 3 inputs
        // 1.54x/1.82x -> 1.25x/1.29x. Lagging the results by two blocks gained nothing.
        let unpack = |b: usize| {
            let cp = cps[b & 1];
            let blk = base.add(b * BLOCK_BYTES);
            if prefetch_next {
                // The next 16-row tile (contiguous, `16 rb` bytes), a block's share per block.
                let ahead = base.wrapping_add(ROWS * rb + b * ROWS * BLOCK_BYTES);
                for off in (0..ROWS * BLOCK_BYTES).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(off) as *const i8);
                }
            }
            for q in 0..4 {
                // Lanes 4q..4q+4 (a qword) of the 16 rows' code words.
                let w = blk.add(2 + 8 * q) as *const i64;
                let zl = _mm512_i64gather_epi64::<1>(idx_lo, w);
                let zh = _mm512_i64gather_epi64::<1>(idx_hi, w);
                for (jp, c) in ctl.iter().enumerate().take(S.div_ceil(2)) {
                    let j = 2 * jp;
                    let cl = _mm512_and_si512(_mm512_multishift_epi64_epi8(*c, zl), mask);
                    let ch = _mm512_and_si512(_mm512_multishift_epi64_epi8(*c, zh), mask);
                    _mm512_store_si512(
                        cp.add((4 * j + q) * 64) as *mut _,
                        _mm512_permutex2var_epi32(cl, even, ch),
                    );
                    if j + 1 < S {
                        _mm512_store_si512(
                            cp.add((4 * (j + 1) + q) * 64) as *mut _,
                            _mm512_permutex2var_epi32(cl, odd, ch),
                        );
                    }
                }
            }
        };
        let products = |b: usize| {
            let (cp, rp) = (cps[b & 1], rps[b & 1]);
            let ap = g.planes.as_ptr().add(b * p * bpw);
            if b & 1 == 0 {
                block_product!(two_steps, cp, ap, rp, bpw, "0", "1", "4");
            } else {
                block_product!(two_steps, cp, ap, rp, bpw, "2", "3", "5");
            }
        };
        let accumulate = |b: usize, f: &mut [__m512; GROUP_MAX]| {
            let rp = rps[b & 1];
            // The 16 rows' block scales (an f16 in the low half of each gathered dword).
            let blk = base.add(b * BLOCK_BYTES);
            let h = _mm512_i32gather_epi32::<1>(idx32, blk as *const i32);
            let dv = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h));
            // `32768 sum(n)` of each weight row (the row of ones), for every input.
            let ones = _mm512_slli_epi32::<15>(_mm512_load_si512(rp.add(16 * 2 * m) as *const _));
            for (t, ft) in f.iter_mut().enumerate().take(m) {
                let top = _mm512_load_si512(rp.add(16 * t) as *const _);
                let low = _mm512_load_si512(rp.add(16 * (m + t)) as *const _);
                // Exact in int32: each sum is at most 64 * 15 (pn4t) or 80 * 7 (pn3t) codes
                // times 255, so 256 * 960 * 255 + 960 * 255 < 2^26.
                let sum = _mm512_add_epi32(_mm512_slli_epi32::<8>(top), low);
                let sum = _mm512_sub_epi32(sum, ones);
                let sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(g.zq[b * m + t]));
                let ds = _mm512_mul_ps(dv, _mm512_set1_ps(g.sx[b * m + t]));
                *ft = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), ds, *ft);
            }
        };
        if nb > 0 {
            unpack(0);
            for b in 0..nb {
                if b + 1 < nb {
                    unpack(b + 1);
                }
                products(b);
                if b > 0 {
                    accumulate(b - 1, &mut f);
                }
            }
            accumulate(nb - 1, &mut f);
        }
        let mut vals = [0f32; ROWS];
        for (t, ft) in f.iter().enumerate().take(m) {
            _mm512_storeu_ps(vals.as_mut_ptr(), *ft);
            outs[g.first + t][rt..rt + nr].copy_from_slice(&vals[..nr]);
        }
    }
    asm!("tilerelease", options(nostack, nomem));
}
