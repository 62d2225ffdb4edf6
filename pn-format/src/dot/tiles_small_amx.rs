//! The AMX kernel of [`super::tiles_small`] (see its docs for the layout).
//!
//! Tile registers: `tmm0` the codes of 16 weight rows (`B`, K half 0), `tmm5` K half 1 (pn3t
//! only: 80 codes per block do not fit one 64-byte K step), `tmm1`/`tmm2` the high/low byte
//! planes of the inputs (`A`, half 0), `tmm6`/`tmm7` half 1, `tmm3`/`tmm4` the int32 results of
//! the two planes (`T` rows of 16 weight rows).

use super::amx::TileConfig;
use super::tiles_small::SmallActs;
use crate::types::{PnType, BLOCK_BYTES};
use std::arch::asm;
use std::arch::x86_64::*;

/// Weight rows per pass (the `B` tile width in int32 columns).
const ROWS: usize = 16;

/// One block's codes in `B` layout: `[kk / 4][row 16][kk % 4]`, up to 20 rows of 64 bytes.
#[repr(C, align(64))]
struct Codes([u8; 20 * 64]);

/// The two planes' int32 results: `[plane][input 16][row 16]`.
#[repr(C, align(64))]
struct Results([[i32; ROWS * 16]; 2]);

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
    match ty {
        PnType::Pn3t => kernel::<3, 5>(weights, rows, acts, outs),
        PnType::Pn4t => kernel::<4, 4>(weights, rows, acts, outs),
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

#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx2,fma,f16c")]
unsafe fn kernel<const BITS: u32, const S: usize>(
    weights: &[u8],
    rows: usize,
    acts: &SmallActs,
    outs: &mut [&mut [f32]],
) {
    let (n, nb) = (acts.n_rows(), acts.nb);
    let bpw = 16 * S;
    let rb = nb * BLOCK_BYTES;
    let two_halves = S == 5;
    // K bytes per `A` tile row (one half of a pn3t block, a whole pn4t block).
    let kb: u16 = if two_halves { 40 } else { 64 };
    let mut cfg = TileConfig {
        palette: 1,
        start_row: 0,
        reserved: [0; 14],
        colsb: [0; 16],
        rows: [0; 16],
    };
    for (t, colsb, r) in [
        (0, 64, kb / 4),
        (1, kb, n as u16),
        (2, kb, n as u16),
        (3, 64, n as u16),
        (4, 64, n as u16),
        (5, 64, kb / 4),
        (6, kb, n as u16),
        (7, kb, n as u16),
    ] {
        if t < 5 || two_halves {
            cfg.colsb[t] = colsb;
            cfg.rows[t] = r as u8;
        }
    }
    asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly));
    // Two of each, alternating by block: one block's stores need not wait for the previous
    // block's tile loads (and its tile stores for the previous block's vector loads).
    let mut codes = [Codes([0; 20 * 64]), Codes([0; 20 * 64])];
    let mut res = [Results([[0; ROWS * 16]; 2]), Results([[0; ROWS * 16]; 2])];
    let mask = _mm512_set1_epi8(((1i32 << BITS) - 1) as i8);
    let ctl = [0, 2, 4].map(|j| _mm512_set1_epi64(pair_control(BITS, j)));
    // Dword 0 (even) or 1 (odd) of each qword of two registers: rows 0..8 then 8..16.
    let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    let cps = [codes[0].0.as_mut_ptr(), codes[1].0.as_mut_ptr()];
    let rps = [
        res[0].0.as_mut_ptr() as *mut i32,
        res[1].0.as_mut_ptr() as *mut i32,
    ];
    for r0 in (0..rows).step_by(ROWS) {
        let nr = ROWS.min(rows - r0);
        let base = weights.as_ptr().add(r0 * rb);
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
        let mut f = [_mm512_setzero_ps(); 16];
        for b in 0..nb {
            let (cp, rp) = (cps[b & 1], rps[b & 1]);
            let blk = base.add(b * BLOCK_BYTES);
            for g in 0..4 {
                // Lanes 4g..4g+4 (a qword) of the 16 rows' code words.
                let p = blk.add(2 + 8 * g) as *const i64;
                let zl = _mm512_i64gather_epi64::<1>(idx_lo, p);
                let zh = _mm512_i64gather_epi64::<1>(idx_hi, p);
                for (jp, c) in ctl.iter().enumerate().take(S.div_ceil(2)) {
                    let j = 2 * jp;
                    let cl = _mm512_and_si512(_mm512_multishift_epi64_epi8(*c, zl), mask);
                    let ch = _mm512_and_si512(_mm512_multishift_epi64_epi8(*c, zh), mask);
                    _mm512_store_si512(
                        cp.add((4 * j + g) * 64) as *mut _,
                        _mm512_permutex2var_epi32(cl, even, ch),
                    );
                    if j + 1 < S {
                        _mm512_store_si512(
                            cp.add((4 * (j + 1) + g) * 64) as *mut _,
                            _mm512_permutex2var_epi32(cl, odd, ch),
                        );
                    }
                }
            }
            // The 16 rows' block scales (an f16 in the low half of each gathered dword).
            let h = _mm512_i32gather_epi32::<1>(idx32, blk as *const i32);
            let dv = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h));
            let at = b * n * bpw;
            let (ah, al) = (acts.hi.as_ptr().add(at), acts.lo.as_ptr().add(at));
            if two_halves {
                asm!(
                    "tileloadd tmm0, [{c} + {s64}*1]",
                    "tileloadd tmm5, [{c} + {s64}*1 + 640]",
                    "tileloadd tmm1, [{ah} + {sa}*1]",
                    "tileloadd tmm2, [{al} + {sa}*1]",
                    "tileloadd tmm6, [{ah} + {sa}*1 + 40]",
                    "tileloadd tmm7, [{al} + {sa}*1 + 40]",
                    "tilezero tmm3",
                    "tilezero tmm4",
                    "tdpbsud tmm3, tmm1, tmm0",
                    "tdpbuud tmm4, tmm2, tmm0",
                    "tdpbsud tmm3, tmm6, tmm5",
                    "tdpbuud tmm4, tmm7, tmm5",
                    "tilestored [{r} + {s64}*1], tmm3",
                    "tilestored [{r} + {s64}*1 + 1024], tmm4",
                    c = in(reg) cp,
                    ah = in(reg) ah,
                    al = in(reg) al,
                    r = in(reg) rp,
                    sa = in(reg) bpw,
                    s64 = in(reg) 64usize,
                    options(nostack),
                );
            } else {
                asm!(
                    "tileloadd tmm0, [{c} + {s64}*1]",
                    "tileloadd tmm1, [{ah} + {sa}*1]",
                    "tileloadd tmm2, [{al} + {sa}*1]",
                    "tilezero tmm3",
                    "tilezero tmm4",
                    "tdpbsud tmm3, tmm1, tmm0",
                    "tdpbuud tmm4, tmm2, tmm0",
                    "tilestored [{r} + {s64}*1], tmm3",
                    "tilestored [{r} + {s64}*1 + 1024], tmm4",
                    c = in(reg) cp,
                    ah = in(reg) ah,
                    al = in(reg) al,
                    r = in(reg) rp,
                    sa = in(reg) bpw,
                    s64 = in(reg) 64usize,
                    options(nostack),
                );
            }
            for (t, ft) in f.iter_mut().enumerate().take(n) {
                let top = _mm512_load_si512(rp.add(16 * t) as *const _);
                let low = _mm512_load_si512(rp.add(ROWS * 16 + 16 * t) as *const _);
                // Exact in int32: |256 c_hi + c_lo| <= 64 * 15 * 32767 < 2^25.
                let sum = _mm512_add_epi32(_mm512_slli_epi32::<8>(top), low);
                let sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(acts.zq[b * n + t]));
                let ds = _mm512_mul_ps(dv, _mm512_set1_ps(acts.sx[b * n + t]));
                *ft = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), ds, *ft);
            }
        }
        let mut vals = [0f32; ROWS];
        for (t, ft) in f.iter().enumerate().take(n) {
            _mm512_storeu_ps(vals.as_mut_ptr(), *ft);
            outs[t][r0..r0 + nr].copy_from_slice(&vals[..nr]);
        }
    }
    asm!("tilerelease", options(nostack, nomem));
}
