//! The software-pipelined AMX kernel of [`super::tiles`]: one 16-row weight tile per pass,
//! with the vector combination of block `b - 1` placed between the tile products of block `b`
//! and their stores.
//!
//! Measured on Sapphire Rapids (perf, and A/B variants of [`super::tiles_amx`]): the kernel is
//! bound neither by the tile multiplies nor by the AVX-512 work alone (each is well under half
//! of the time) but by their interaction: vector loads issued after a `tilestored` wait for it,
//! and the store waits for its multiplies. Here every vector load of block `b - 1`'s results is
//! *older* in program order than block `b`'s stores, and its data were stored one block earlier
//! (the multiplies of `b` run on the tile unit meanwhile). That needs all three result tiles of
//! a block in registers until after the vector work, so one row tile per pass (pn3t: `tmm0..1`
//! the codes' two K halves, `tmm2..3` one plane's halves, `tmm4..6` the results; pn4t: `tmm0`
//! the codes, `tmm2` a plane, `tmm4..6` the results), and the 16 row accumulators stay in
//! registers.
//!
//! The integer sums per block and their f32 combination ([`accumulate`]) are the same as the
//! other kernels', in the same order: results are bit-identical to them.

use super::amx::{accumulate, unpack, write_rows, TileConfig, SCRATCH};
use super::tiles::{TileActs, TILE};
use crate::types::{PnType, BLOCK_BYTES};
use std::arch::asm;
use std::arch::x86_64::*;

/// Weight rows one pass covers.
pub const PASS: usize = TILE;

/// The int32 results of one block: `[plane: top, middle, low][row 16][input 16]`.
#[repr(C, align(64))]
struct Planes([[i32; TILE * TILE]; 3]);

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
        PnType::Pn3t => kernel::<3, 5>(weights, rows, nb, acts, outs),
        PnType::Pn4t => kernel::<4, 4>(weights, rows, nb, acts, outs),
    }
}

/// The tile shapes (see the module docs for the register roles).
fn config(s: usize) -> TileConfig {
    let mut cfg = TileConfig {
        palette: 1,
        start_row: 0,
        reserved: [0; 14],
        colsb: [0; 16],
        rows: [0; 16],
    };
    // Codes: 16 rows x the K step (pn3t: 40 bytes, one half; pn4t: the whole 64-byte block).
    let k = if s == 5 { 40 } else { 64 };
    for t in 0..2 {
        cfg.colsb[t] = k;
        cfg.rows[t] = 16;
        // A plane: K step / 4 rows x 64 bytes.
        cfg.colsb[2 + t] = 64;
        cfg.rows[2 + t] = (k / 4) as u8;
    }
    for t in 4..7 {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    cfg
}

/// Tile products of one pn3t block into `tmm4..6` (top, middle, low plane): `a` points at the
/// block's codes (`[row 16][kk 80]`), `p[i]` at plane `i` (`[kk / 4 = 20][input 16][4]`, the
/// second K half 640 bytes in).
#[inline(always)]
unsafe fn products_pn3(a: *const u8, p: [*const u8; 3]) {
    asm!(
        "tileloadd tmm0, [{a} + {sa}*1]",
        "tileloadd tmm1, [{a} + {sa}*1 + 40]",
        "tilezero tmm4",
        "tilezero tmm5",
        "tilezero tmm6",
        "tileloadd tmm2, [{p2} + {sb}*1]",
        "tileloadd tmm3, [{p2} + {sb}*1 + 640]",
        "tdpbssd tmm4, tmm0, tmm2",
        "tdpbssd tmm4, tmm1, tmm3",
        "tileloadd tmm2, [{p1} + {sb}*1]",
        "tileloadd tmm3, [{p1} + {sb}*1 + 640]",
        "tdpbsud tmm5, tmm0, tmm2",
        "tdpbsud tmm5, tmm1, tmm3",
        "tileloadd tmm2, [{p0} + {sb}*1]",
        "tileloadd tmm3, [{p0} + {sb}*1 + 640]",
        "tdpbsud tmm6, tmm0, tmm2",
        "tdpbsud tmm6, tmm1, tmm3",
        a = in(reg) a,
        p2 = in(reg) p[0],
        p1 = in(reg) p[1],
        p0 = in(reg) p[2],
        sa = in(reg) 80usize,
        sb = in(reg) 64usize,
        options(nostack, readonly),
    );
}

/// Tile products of one pn4t block into `tmm4..6`: `a` points at the block's codes (`[row 16]
/// [kk 64]`), `p[i]` at plane `i` (`[kk / 4 = 16][input 16][4]`).
#[inline(always)]
unsafe fn products_pn4(a: *const u8, p: [*const u8; 3]) {
    asm!(
        "tileloadd tmm0, [{a} + {s}*1]",
        "tilezero tmm4",
        "tilezero tmm5",
        "tilezero tmm6",
        "tileloadd tmm2, [{p2} + {s}*1]",
        "tileloadd tmm3, [{p1} + {s}*1]",
        "tdpbssd tmm4, tmm0, tmm2",
        "tileloadd tmm2, [{p0} + {s}*1]",
        "tdpbsud tmm5, tmm0, tmm3",
        "tdpbsud tmm6, tmm0, tmm2",
        a = in(reg) a,
        p2 = in(reg) p[0],
        p1 = in(reg) p[1],
        p0 = in(reg) p[2],
        s = in(reg) 64usize,
        options(nostack, readonly),
    );
}

/// Stores `tmm4..6` to `c` (`[plane][row 16][input 16]` int32).
#[inline(always)]
unsafe fn store(c: *mut i32) {
    asm!(
        "tilestored [{c} + {s}*1], tmm4",
        "tilestored [{c} + {s}*1 + 1024], tmm5",
        "tilestored [{c} + {s}*1 + 2048], tmm6",
        c = in(reg) c,
        s = in(reg) 64usize,
        options(nostack),
    );
}

#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
unsafe fn kernel<const BITS: u32, const S: usize>(
    weights: &[u8],
    rows: usize,
    nb: usize,
    acts: &TileActs,
    outs: &mut [&mut [f32]],
) {
    let bpw = 16 * S;
    let rb = nb * BLOCK_BYTES;
    let n_in = acts.n_rows();
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        let (a, d) = &mut *s;
        a.resize(nb * PASS * bpw, 0);
        d.resize(nb * PASS, 0.0);
        let cfg = config(S);
        asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly));
        let mut c = Planes([[0; TILE * TILE]; 3]);
        for r0 in (0..rows).step_by(PASS) {
            let nr = PASS.min(rows - r0);
            unpack::<BITS, S>(&weights[r0 * rb..(r0 + nr) * rb], nr, nb, a, d, PASS);
            for g in 0..n_in.div_ceil(TILE) {
                let mut f = [_mm512_setzero_ps(); PASS];
                // Combines the stored results of block `b` into the row accumulators.
                let combine = |b: usize, c: &Planes, f: &mut [__m512; PASS]| {
                    let sx = _mm512_loadu_ps(acts.sx.as_ptr().add((g * nb + b) * TILE));
                    let db = d.as_ptr().add(b * PASS);
                    for (r, fr) in f.iter_mut().enumerate() {
                        let at = r * TILE;
                        let planes = [0, 1, 2].map(|p| c.0[p].as_ptr().add(at));
                        *fr = accumulate(planes, *db.add(r), sx, *fr);
                    }
                };
                for b in 0..nb {
                    let ap = a.as_ptr().add(b * PASS * bpw);
                    let at = (g * nb + b) * TILE * bpw;
                    let planes = [
                        acts.b2.as_ptr().add(at) as *const u8,
                        acts.b1.as_ptr().add(at),
                        acts.b0.as_ptr().add(at),
                    ];
                    if S == 5 {
                        products_pn3(ap, planes);
                    } else {
                        products_pn4(ap, planes);
                    }
                    if b > 0 {
                        combine(b - 1, &c, &mut f);
                    }
                    store(c.0.as_mut_ptr() as *mut i32);
                }
                combine(nb - 1, &c, &mut f);
                write_rows(&f, nr, r0, g, outs);
            }
        }
        asm!("tilerelease", options(nostack, nomem));
    });
}
