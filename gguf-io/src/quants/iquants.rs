//! Decoders of the i-quants (IQ4_NL, IQ4_XS, IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S,
//! IQ1_M) and the ternary types (TQ1_0, TQ2_0).
//!
//! Each decoder's comment gives its block layout (ggml's `block_iq*` / `block_tq*` structs in
//! `ggml-common.h`; offsets in bytes inside the block, every block starting with or ending in
//! its f16 scale `d`, except IQ1_M's, split over four nibbles). Each decoder forms the per-group factor first (`d * (0.5 + s) * 0.25`, `d * (1 + 2 s)`, ...) and
//! multiplies it by the grid value, the order gguf-py's and ggml's references use, so the
//! results are bit-identical to theirs (`tests/data/real-gguf/stock-types.gguf`).

use super::fp::f16_at;
use super::iq1_grid::IQ1S_GRID;
use super::iq_tables::{
    IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS, KVALUES_IQ4NL,
};
use super::kquants::QK_K;
use super::legacy::QK;

/// Bytes per block of each type.
pub(crate) const IQ4NL_BYTES: usize = 18;
pub(crate) const IQ4XS_BYTES: usize = 136;
pub(crate) const IQ3XXS_BYTES: usize = 98;
pub(crate) const IQ3S_BYTES: usize = 110;
pub(crate) const IQ2XXS_BYTES: usize = 66;
pub(crate) const IQ2XS_BYTES: usize = 74;
pub(crate) const IQ2S_BYTES: usize = 82;
pub(crate) const IQ1S_BYTES: usize = 50;
pub(crate) const IQ1M_BYTES: usize = 56;
pub(crate) const TQ1_BYTES: usize = 54;
pub(crate) const TQ2_BYTES: usize = 66;

/// The offset every IQ1 grid value gets, its sign chosen per group.
const IQ1_DELTA: f32 = 0.125;

#[inline(always)]
fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

#[inline(always)]
fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Byte `j` of a packed grid entry.
#[inline(always)]
fn grid_byte(entry: u64, j: usize) -> u8 {
    (entry >> (8 * j)) as u8
}

/// Writes the 8 values `±(db * grid[j])` of one group, element `j` negative when bit `j` of
/// `signs` is set.
#[inline(always)]
fn signed_group(y: &mut [f32], db: f32, entry: u64, signs: u8) {
    for (j, o) in y.iter_mut().enumerate().take(8) {
        let v = db * grid_byte(entry, j) as f32;
        *o = if (signs >> j) & 1 != 0 { -v } else { v };
    }
}

/// The 6-bit signed scale of IQ4_XS sub-block `ib` (0..8).
#[inline(always)]
pub(crate) fn iq4xs_scale(b: &[u8], ib: usize) -> i32 {
    let lo = (b[4 + ib / 2] >> (4 * (ib % 2))) & 15;
    let hi = ((u16_at(b, 2) >> (2 * ib)) & 3) as u8;
    (lo | (hi << 4)) as i32 - 32
}

pub(crate) fn dequantize_iq4_nl(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(IQ4NL_BYTES).zip(dst.chunks_exact_mut(QK)) {
        let d = f16_at(b, 0);
        for j in 0..16 {
            y[j] = d * KVALUES_IQ4NL[(b[2 + j] & 15) as usize] as f32;
            y[j + 16] = d * KVALUES_IQ4NL[(b[2 + j] >> 4) as usize] as f32;
        }
    }
}

pub(crate) fn dequantize_iq4_xs(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src
        .chunks_exact(IQ4XS_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
    {
        let d = f16_at(b, 0);
        for ib in 0..8 {
            let dl = d * iq4xs_scale(b, ib) as f32;
            let qs = &b[8 + 16 * ib..24 + 16 * ib];
            let ys = &mut y[32 * ib..32 * ib + 32];
            for j in 0..16 {
                ys[j] = dl * KVALUES_IQ4NL[(qs[j] & 15) as usize] as f32;
                ys[j + 16] = dl * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as f32;
            }
        }
    }
}

pub(crate) fn dequantize_iq2_xxs(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src
        .chunks_exact(IQ2XXS_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
    {
        let d = f16_at(b, 0);
        // Eight 32-element sub-blocks of 8 bytes: 4 grid indices, then a u32 holding four
        // 7-bit sign indices and the 4-bit scale.
        for ib in 0..8 {
            let q = &b[2 + 8 * ib..10 + 8 * ib];
            let aux = u32_at(q, 4);
            let db = d * (0.5 + (aux >> 28) as f32) * 0.25;
            for l in 0..4 {
                let signs = KSIGNS[((aux >> (7 * l)) & 127) as usize];
                let entry = IQ2XXS_GRID[q[l] as usize];
                signed_group(&mut y[32 * ib + 8 * l..], db, entry, signs);
            }
        }
    }
}

pub(crate) fn dequantize_iq2_xs(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src
        .chunks_exact(IQ2XS_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
    {
        let d = f16_at(b, 0);
        // 32 u16 at 2: 9-bit grid index | 7-bit sign index; 8 scale bytes at 66, one nibble
        // per 16 elements.
        for g in 0..32 {
            let v = u16_at(b, 2 + 2 * g);
            let s = (b[66 + g / 4] >> (4 * ((g / 2) % 2))) & 15;
            let db = d * (0.5 + s as f32) * 0.25;
            let entry = IQ2XS_GRID[(v & 511) as usize];
            signed_group(&mut y[8 * g..], db, entry, KSIGNS[(v >> 9) as usize]);
        }
    }
}

pub(crate) fn dequantize_iq2_s(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(IQ2S_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_at(b, 0);
        // qs[32] at 2 (low index bits), signs[32] at 34, qh[8] at 66 (two high index bits per
        // group), scales[8] at 74 (one nibble per 16 elements).
        for g in 0..32 {
            let hi = ((b[66 + g / 4] >> (2 * (g % 4))) & 3) as usize;
            let idx = b[2 + g] as usize | (hi << 8);
            let s = (b[74 + g / 4] >> (4 * ((g / 2) % 2))) & 15;
            let db = d * (0.5 + s as f32) * 0.25;
            signed_group(&mut y[8 * g..], db, IQ2S_GRID[idx], b[34 + g]);
        }
    }
}

pub(crate) fn dequantize_iq3_xxs(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src
        .chunks_exact(IQ3XXS_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
    {
        let d = f16_at(b, 0);
        // 64 grid indices at 2 (4 values each), then 8 u32 at 66: four 7-bit sign indices and
        // the 4-bit scale of each 32-element sub-block.
        for ib in 0..8 {
            let aux = u32_at(b, 66 + 4 * ib);
            let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
            for l in 0..4 {
                let signs = KSIGNS[((aux >> (7 * l)) & 127) as usize];
                let i0 = b[2 + 8 * ib + 2 * l] as usize;
                let i1 = b[3 + 8 * ib + 2 * l] as usize;
                let entry = IQ3XXS_GRID[i0] as u64 | (IQ3XXS_GRID[i1] as u64) << 32;
                signed_group(&mut y[32 * ib + 8 * l..], db, entry, signs);
            }
        }
    }
}

/// The IQ3_S grid entry of index `i` (0..64) of a block.
#[inline(always)]
pub(crate) fn iq3s_entry(b: &[u8], i: usize) -> u32 {
    let hi = ((b[66 + i / 8] >> (i % 8)) & 1) as usize;
    IQ3S_GRID[b[2 + i] as usize | (hi << 8)]
}

/// The factor `d * (1 + 2 s)` of IQ3_S sub-block `ib` (0..8).
#[inline(always)]
pub(crate) fn iq3s_factor(d: f32, b: &[u8], ib: usize) -> f32 {
    let s = (b[106 + ib / 2] >> (4 * (ib % 2))) & 15;
    d * (1 + 2 * s as u32) as f32
}

pub(crate) fn dequantize_iq3_s(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(IQ3S_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_at(b, 0);
        // qs[64] at 2, qh[8] at 66 (9th index bit), signs[32] at 74, scales[4] at 106.
        for g in 0..32 {
            let db = iq3s_factor(d, b, g / 4);
            let entry = iq3s_entry(b, 2 * g) as u64 | (iq3s_entry(b, 2 * g + 1) as u64) << 32;
            signed_group(&mut y[8 * g..], db, entry, b[74 + g]);
        }
    }
}

/// Writes `dl * (grid[j] + delta)` for the 8 values of one IQ1 group.
#[inline(always)]
fn iq1_group(y: &mut [f32], dl: f32, idx: usize, delta: f32) {
    let entry = IQ1S_GRID[idx];
    for (j, o) in y.iter_mut().enumerate().take(8) {
        *o = dl * (grid_byte(entry, j) as i8 as f32 + delta);
    }
}

pub(crate) fn dequantize_iq1_s(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(IQ1S_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_at(b, 0);
        // qs[32] at 2 (low index bits), 8 u16 at 34: per 32 elements four 3-bit high index
        // parts, a 3-bit scale and the sign of the delta.
        for ib in 0..8 {
            let qh = u16_at(b, 34 + 2 * ib);
            let dl = d * (2 * ((qh >> 12) & 7) + 1) as f32;
            let delta = if qh & 0x8000 != 0 {
                -IQ1_DELTA
            } else {
                IQ1_DELTA
            };
            for l in 0..4 {
                let idx = b[2 + 4 * ib + l] as usize | (((qh >> (3 * l)) & 7) as usize) << 8;
                iq1_group(&mut y[32 * ib + 8 * l..], dl, idx, delta);
            }
        }
    }
}

pub(crate) fn dequantize_iq1_m(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(IQ1M_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        // qs[32] at 0, qh[16] at 32 (a nibble per group: 3 high index bits, delta sign),
        // 4 u16 at 48: four 3-bit scales each, and the top nibbles form the f16 scale.
        let sc = [0, 1, 2, 3].map(|i| u16_at(b, 48 + 2 * i));
        let dbits =
            (sc[0] >> 12) | ((sc[1] >> 8) & 0xf0) | ((sc[2] >> 4) & 0xf00) | (sc[3] & 0xf000);
        let d = f16_at(&dbits.to_le_bytes(), 0);
        for g in 0..32 {
            let nib = (b[32 + g / 2] >> (4 * (g % 2))) & 15;
            let k = g / 2; // the scale of 16 elements
            let s = (sc[k / 4] >> (3 * (k % 4))) & 7;
            let dl = d * (2 * s + 1) as f32;
            let delta = if nib & 8 != 0 { -IQ1_DELTA } else { IQ1_DELTA };
            let idx = b[g] as usize | ((nib & 7) as usize) << 8;
            iq1_group(&mut y[8 * g..], dl, idx, delta);
        }
    }
}

/// Powers of three that bring trit `k` of a TQ1_0 byte to the top (times 3, then `>> 8`).
const POW3: [u8; 5] = [1, 3, 9, 27, 81];

/// The trit a TQ1_0 byte `q`, multiplied by `3^k` (mod 256), leaves at the top: 0..=2.
#[inline(always)]
fn trit(q: u8, k: usize) -> i32 {
    let v = q.wrapping_mul(POW3[k]);
    ((v as u16 * 3) >> 8) as i32
}

pub(crate) fn dequantize_tq1_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(TQ1_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        // qs[48] at 0 (5 trits per byte), qh[4] at 48 (4 trits per byte), d at 52. Elements
        // 0..160: byte m of qs[0..32], trit e / 32; 160..240: qs[32..48], trit (e - 160) / 16;
        // 240..256: qh, trit (e - 240) / 4.
        let d = f16_at(b, 52);
        for k in 0..5 {
            for m in 0..32 {
                y[32 * k + m] = d * (trit(b[m], k) - 1) as f32;
            }
            for m in 0..16 {
                y[160 + 16 * k + m] = d * (trit(b[32 + m], k) - 1) as f32;
            }
        }
        for k in 0..4 {
            for m in 0..4 {
                y[240 + 4 * k + m] = d * (trit(b[48 + m], k) - 1) as f32;
            }
        }
    }
}

pub(crate) fn dequantize_tq2_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(TQ2_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        // qs[64] at 0: element 128 h + 32 k + m is bits 2k..2k+2 of qs[32 h + m], minus 1.
        let d = f16_at(b, 64);
        for h in 0..2 {
            for k in 0..4 {
                for m in 0..32 {
                    let q = ((b[32 * h + m] >> (2 * k)) & 3) as i32 - 1;
                    y[128 * h + 32 * k + m] = d * q as f32;
                }
            }
        }
    }
}
