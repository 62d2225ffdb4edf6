//! The register-blocked AMX kernel of [`super::tiles`]: several 16-row weight tiles share each
//! load of an activation tile.
//!
//! The one-tile kernel ([`super::amx`]) loads, per 16 x 16 result and block, one code tile and
//! two activation-byte tiles per K half (6 `tileloadd` for 4 `tdp*`), and perf showed it
//! bound by those loads. Here one pass holds `R` row tiles of codes in tile registers and walks the
//! two byte planes of `q` one at a time, so each activation tile is loaded once for `R` row
//! tiles and each code tile once for both planes:
//!
//! - pn3t (80 codes per block: two K halves of 40 bytes), `R = 2`: `tmm0..3` the codes (tile,
//!   half), `tmm4..5` one plane's two halves, `tmm6..7` the int32 results of the two tiles;
//!   8 loads for 8 `tdp*` (the one-tile kernel: 12 for 8).
//! - pn4t (64 codes: the whole block is one 64-byte K step), `R = 3`: `tmm0..2` the codes,
//!   `tmm3..4` the planes, `tmm5..7` the results; 5 loads for 6 `tdp*` (the one-tile kernel:
//!   18 loads for 12 `tdp*` on half-width K).
//!
//! The integer sums per block are the same as the one-tile kernel's (and the reference's), so
//! the results are bit-identical to it: only the order of loads changes.

use super::amx::{accumulate, unpack, write_rows, TileConfig, SCRATCH};
use super::tiles::{TileActs, TILE};
use crate::types::{PnType, BLOCK_BYTES};
use std::arch::asm;
use std::arch::x86_64::*;

/// Weight rows one pass of the blocked kernel covers: callers that split rows across threads
/// keep their ranges multiples of it, or the last pass of each range computes zero rows.
pub const fn pass_rows(ty: PnType) -> usize {
    match ty {
        PnType::Pn3t => 2 * TILE,
        PnType::Pn4t => 3 * TILE,
    }
}

/// The int32 results of one block for the two planes of `q` and `R` row tiles:
/// `[plane][tile][row 16][input 16]`.
#[repr(C, align(64))]
struct Planes<const R: usize>([[[i32; TILE * TILE]; R]; 2]);

/// `outs[t][r] = dot(row r, acts[t])`.
///
/// # Safety
/// As [`super::amx::matmul`].
pub unsafe fn matmul(
    ty: PnType,
    weights: &[u8],
    rows: usize,
    nb: usize,
    acts: &TileActs,
    outs: &mut [&mut [f32]],
) {
    match ty {
        PnType::Pn3t => kernel::<3, 5, 2>(weights, rows, nb, acts, outs),
        PnType::Pn4t => kernel::<4, 4, 3>(weights, rows, nb, acts, outs),
    }
}

/// The tile shapes of each kernel (see the module docs for the register roles).
fn config(s: usize) -> TileConfig {
    let (h16, w64) = (16u8, 64u16);
    let mut cfg = TileConfig {
        palette: 1,
        start_row: 0,
        reserved: [0; 14],
        colsb: [0; 16],
        rows: [0; 16],
    };
    if s == 5 {
        // Codes: 16 rows x 40 bytes (one K half); planes: 10 rows (40 / 4) x 64; results.
        for t in 0..4 {
            cfg.colsb[t] = 40;
            cfg.rows[t] = h16;
        }
        for t in 4..6 {
            cfg.colsb[t] = w64;
            cfg.rows[t] = 10;
        }
        for t in 6..8 {
            cfg.colsb[t] = w64;
            cfg.rows[t] = h16;
        }
    } else {
        // Everything 16 x 64 bytes: one K step covers a whole 64-code block.
        for t in 0..8 {
            cfg.colsb[t] = w64;
            cfg.rows[t] = h16;
        }
    }
    cfg
}

/// One block of pn3t for two row tiles: `a` points at the block's codes (`[row 32][kk 80]`),
/// `p[i]` at plane `i` (high, low byte of `q`) of the block's activations (`[kk / 4 = 20][input
/// 16][4]`, the second K half 640 bytes in), results to `c`.
#[inline(always)]
unsafe fn block_pn3(a: *const u8, p: [*const u8; 2], c: *mut i32) {
    asm!(
        "tileloadd tmm0, [{a} + {sa}*1]",
        "tileloadd tmm1, [{a} + {sa}*1 + 40]",
        "tileloadd tmm2, [{a1} + {sa}*1]",
        "tileloadd tmm3, [{a1} + {sa}*1 + 40]",
        // The high byte (signed).
        "tileloadd tmm4, [{ph} + {sb}*1]",
        "tileloadd tmm5, [{ph} + {sb}*1 + 640]",
        "tilezero tmm6",
        "tilezero tmm7",
        "tdpbssd tmm6, tmm0, tmm4",
        "tdpbssd tmm7, tmm2, tmm4",
        "tdpbssd tmm6, tmm1, tmm5",
        "tdpbssd tmm7, tmm3, tmm5",
        "tilestored [{c} + {sb}*1], tmm6",
        "tilestored [{c} + {sb}*1 + 1024], tmm7",
        // The low byte (unsigned).
        "tileloadd tmm4, [{pl} + {sb}*1]",
        "tileloadd tmm5, [{pl} + {sb}*1 + 640]",
        "tilezero tmm6",
        "tilezero tmm7",
        "tdpbsud tmm6, tmm0, tmm4",
        "tdpbsud tmm7, tmm2, tmm4",
        "tdpbsud tmm6, tmm1, tmm5",
        "tdpbsud tmm7, tmm3, tmm5",
        "tilestored [{c} + {sb}*1 + 2048], tmm6",
        "tilestored [{c} + {sb}*1 + 3072], tmm7",
        a = in(reg) a,
        a1 = in(reg) a.add(TILE * 80),
        ph = in(reg) p[0],
        pl = in(reg) p[1],
        sa = in(reg) 80usize,
        sb = in(reg) 64usize,
        c = in(reg) c,
        options(nostack),
    );
}

/// One block of pn4t for three row tiles: `a` points at the block's codes (`[row 48][kk 64]`),
/// `p[i]` at plane `i` (`[kk / 4 = 16][input 16][4]`), results to `c`.
#[inline(always)]
unsafe fn block_pn4(a: *const u8, p: [*const u8; 2], c: *mut i32) {
    asm!(
        "tileloadd tmm0, [{a} + {s}*1]",
        "tileloadd tmm1, [{a} + {s}*1 + 1024]",
        "tileloadd tmm2, [{a} + {s}*1 + 2048]",
        "tileloadd tmm3, [{ph} + {s}*1]",
        "tileloadd tmm4, [{pl} + {s}*1]",
        "tilezero tmm5",
        "tilezero tmm6",
        "tilezero tmm7",
        "tdpbssd tmm5, tmm0, tmm3",
        "tdpbssd tmm6, tmm1, tmm3",
        "tdpbssd tmm7, tmm2, tmm3",
        "tilestored [{c} + {s}*1], tmm5",
        "tilestored [{c} + {s}*1 + 1024], tmm6",
        "tilestored [{c} + {s}*1 + 2048], tmm7",
        "tilezero tmm5",
        "tilezero tmm6",
        "tilezero tmm7",
        "tdpbsud tmm5, tmm0, tmm4",
        "tdpbsud tmm6, tmm1, tmm4",
        "tdpbsud tmm7, tmm2, tmm4",
        "tilestored [{c} + {s}*1 + 3072], tmm5",
        "tilestored [{c} + {s}*1 + 4096], tmm6",
        "tilestored [{c} + {s}*1 + 5120], tmm7",
        a = in(reg) a,
        ph = in(reg) p[0],
        pl = in(reg) p[1],
        s = in(reg) 64usize,
        c = in(reg) c,
        options(nostack),
    );
}

#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
unsafe fn kernel<const BITS: u32, const S: usize, const R: usize>(
    weights: &[u8],
    rows: usize,
    nb: usize,
    acts: &TileActs,
    outs: &mut [&mut [f32]],
) {
    let bpw = 16 * S;
    let pass = R * TILE;
    let rb = nb * BLOCK_BYTES;
    let n_in = acts.n_rows();
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        let (a, d) = &mut *s;
        a.resize(nb * pass * bpw, 0);
        d.resize(nb * pass, 0.0);
        let cfg = config(S);
        asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly));
        let mut c = Planes::<R>([[[0; TILE * TILE]; R]; 2]);
        for r0 in (0..rows).step_by(pass) {
            let nr = pass.min(rows - r0);
            unpack::<BITS, S>(&weights[r0 * rb..(r0 + nr) * rb], nr, nb, a, d, pass);
            // Row tiles holding real rows (the rest of the pass is zero codes, zero scales).
            let live = nr.div_ceil(TILE);
            for g in 0..n_in.div_ceil(TILE) {
                let mut f = [[_mm512_setzero_ps(); TILE]; R];
                for b in 0..nb {
                    let gb = g * nb + b;
                    let ap = a.as_ptr().add(b * pass * bpw);
                    let at = gb * TILE * bpw;
                    let planes = [
                        acts.hi.as_ptr().add(at) as *const u8,
                        acts.lo.as_ptr().add(at),
                    ];
                    let cp = c.0.as_mut_ptr() as *mut i32;
                    if S == 5 {
                        block_pn3(ap, planes, cp);
                    } else {
                        block_pn4(ap, planes, cp);
                    }
                    let sx = _mm512_loadu_ps(acts.sx.as_ptr().add(gb * TILE));
                    let db = d.as_ptr().add(b * pass);
                    for (i, fi) in f.iter_mut().enumerate().take(live) {
                        for (r, fr) in fi.iter_mut().enumerate() {
                            let at = r * TILE;
                            let planes = [0, 1].map(|p| c.0[p][i].as_ptr().add(at));
                            *fr = accumulate(planes, *db.add(i * TILE + r), sx, *fr);
                        }
                    }
                }
                for (i, fi) in f.iter().enumerate().take(live) {
                    write_rows(fi, nr - i * TILE, r0 + i * TILE, g, outs);
                }
            }
        }
        asm!("tilerelease", options(nostack, nomem));
    });
}
