//! Quantizing input rows into [`super::tiles::TileActs`]' layout: int16 per block (decode's
//! [`super::PreparedI16`] rule: the same scale and the same rounded values) or int8 (the same
//! rule with `127` for `32767`), in AMX tile order.
//!
//! This runs once per prompt chunk for every distinct matmul input (for `ffn_down`, 64 x 17408
//! values feeding one 5120-row matrix), so it must cost little next to the tile kernel: the
//! loop works on one block of one input at a time, with the rounding done by integer and
//! comparison steps the compiler vectorizes (`f32::round` is a libm call on baseline x86-64),
//! and writes each tile row's four bytes of a plane as one word.

use super::tiles::{TilePrecision, TILE};
use crate::types::PnType;

/// Most values per block (pn3t).
const MAX_BPW: usize = 80;

/// One part of a [`super::tiles::TileActs`] being filled: the `[group][block]` entries
/// `first..first + sx.len() / TILE` of its buffers (same layouts, starting at entry `first`;
/// `lo` empty for int8).
pub(super) struct Piece<'a> {
    pub(super) first: usize,
    pub(super) hi: &'a mut [i8],
    pub(super) lo: &'a mut [u8],
    pub(super) sx: &'a mut [f32],
    pub(super) zq: &'a mut [i32],
}

/// Tile position `kk = 16 j + l` holds the code in 16-bit lane `l` of pair `j` of an unpacked
/// word: element `perm[kk]` of the block (`kk < ty.weights_per_block()`).
fn tile_perm(ty: PnType) -> [u8; MAX_BPW] {
    let cpw = ty.codes_per_word();
    let mut perm = [0u8; MAX_BPW];
    for (kk, e) in perm.iter_mut().enumerate().take(ty.weights_per_block()) {
        let (j, l) = (kk / 16, kk % 16);
        *e = ((l / 2) * cpw + 2 * j + l % 2) as u8;
    }
    perm
}

/// `v.round() as i32` (half away from zero) for `|v| <= 32767` or NaN (0), without the libm
/// call: the truncation is exact below 2^31 and so is the fraction `v - trunc(v)`.
#[inline(always)]
pub(super) fn round_away(v: f32) -> i32 {
    let t = v as i32;
    let f = v - t as f32;
    t + i32::from(f >= 0.5) - i32::from(f <= -0.5)
}

/// One block's scale `sx = amax / q_max` (NaN if any value is not finite) and its inverse
/// `q_max / amax` (0 for an all-zero or non-finite block).
pub(super) fn block_scale(xb: &[f32], q_max: f32) -> (f32, f32) {
    let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let amax = if xb.iter().all(|v| v.is_finite()) {
        amax
    } else {
        f32::NAN
    };
    let inv = if amax > 0.0 { q_max / amax } else { 0.0 };
    (amax / q_max, inv)
}

/// Fills a [`Piece`]: per input row `t` of the group (`x` is `n x k` row-major, `nb` blocks per
/// row) and block, the scale and the byte planes of each `q` in tile order (`[kk / 4]
/// [input 16][kk % 4]` per `[group][block]`; int16: two planes, int8: `q` in `hi`). Padding
/// inputs (`t >= n`) stay zero. Non-finite values make their block's scale NaN and its `q`
/// zero.
pub(super) fn quantize_blocks(
    ty: PnType,
    precision: TilePrecision,
    x: &[f32],
    n: usize,
    nb: usize,
    p: &mut Piece<'_>,
) {
    let q_max = precision.q_max();
    let bpw = ty.weights_per_block();
    let k = nb * bpw;
    let perm = tile_perm(ty);
    let mut q = [0i32; MAX_BPW];
    for i in 0..p.sx.len() / TILE {
        let gb = p.first + i;
        let (g, b) = (gb / nb, gb % nb);
        for col in 0..TILE.min(n.saturating_sub(g * TILE)) {
            let t = g * TILE + col;
            let xb = &x[t * k + b * bpw..t * k + (b + 1) * bpw];
            let inv;
            (p.sx[i * TILE + col], inv) = block_scale(xb, q_max);
            for (qk, &e) in q[..bpw].iter_mut().zip(&perm[..bpw]) {
                // Clamping first equals clamping after rounding (integer bounds); NaN stays
                // NaN and becomes 0.
                *qk = round_away((xb[usize::from(e)] * inv).clamp(-q_max, q_max));
            }
            // `|sum(q)| <= 80 * 32767`: exact in i32, and so is `z` times it.
            p.zq[i * TILE + col] = ty.zero_point() * q[..bpw].iter().sum::<i32>();
            let base = i * bpw * TILE + 4 * col;
            for (r, w) in q[..bpw].chunks_exact(4).enumerate() {
                let at = base + r * 4 * TILE;
                let w: [i32; 4] = [w[0], w[1], w[2], w[3]];
                match precision {
                    TilePrecision::I16 => {
                        p.hi[at..at + 4].copy_from_slice(&w.map(|v| (v >> 8) as i8));
                        p.lo[at..at + 4].copy_from_slice(&w.map(|v| v as u8));
                    }
                    TilePrecision::I8 => p.hi[at..at + 4].copy_from_slice(&w.map(|v| v as i8)),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Largest `|q|` of any precision (int16).
    const Q_MAX: f32 = 32_767.0;

    /// The quantizer as first written (`f32::round`, one byte at a time): the new one must
    /// reproduce its bytes exactly.
    fn reference(
        ty: PnType,
        precision: TilePrecision,
        x: &[f32],
        n: usize,
        nb: usize,
        p: &mut Piece<'_>,
    ) {
        let q_max = precision.q_max();
        let bpw = ty.weights_per_block();
        let k = nb * bpw;
        let perm = tile_perm(ty);
        for i in 0..p.sx.len() / TILE {
            let gb = p.first + i;
            let (g, b) = (gb / nb, gb % nb);
            for col in 0..TILE.min(n.saturating_sub(g * TILE)) {
                let t = g * TILE + col;
                let xb = &x[t * k + b * bpw..t * k + (b + 1) * bpw];
                let inv;
                (p.sx[i * TILE + col], inv) = block_scale(xb, q_max);
                let base = i * bpw * TILE + 4 * col;
                let mut sum = 0;
                for (kk, &e) in perm.iter().enumerate().take(bpw) {
                    let q = (xb[usize::from(e)] * inv).round().clamp(-q_max, q_max) as i32;
                    sum += q;
                    let at = base + (kk / 4) * 4 * TILE + kk % 4;
                    if precision == TilePrecision::I16 {
                        p.hi[at] = (q >> 8) as i8;
                        p.lo[at] = q as u8;
                    } else {
                        p.hi[at] = q as i8;
                    }
                }
                p.zq[i * TILE + col] = ty.zero_point() * sum;
            }
        }
    }

    type Bufs = (Vec<i8>, Vec<u8>, Vec<f32>, Vec<i32>);

    fn run(
        f: fn(PnType, TilePrecision, &[f32], usize, usize, &mut Piece<'_>),
        (ty, precision): (PnType, TilePrecision),
        x: &[f32],
        n: usize,
        nb: usize,
        first: usize,
        len: usize,
    ) -> Bufs {
        let bpw = ty.weights_per_block();
        let lo = if precision == TilePrecision::I16 {
            len
        } else {
            0
        };
        let mut b: Bufs = (
            vec![0; len * bpw * TILE],
            vec![0; lo * bpw * TILE],
            vec![0.0; len * TILE],
            vec![0; len * TILE],
        );
        let mut p = Piece {
            first,
            hi: &mut b.0,
            lo: &mut b.1,
            sx: &mut b.2,
            zq: &mut b.3,
        };
        f(ty, precision, x, n, nb, &mut p);
        b
    }

    #[test]
    fn round_away_equals_f32_round() {
        let mut vals = vec![
            0.5f32,
            -0.5,
            1.5,
            -1.5,
            2.5,
            0.49999997,
            -0.49999997,
            Q_MAX,
            -Q_MAX,
        ];
        vals.extend([Q_MAX - 0.5, 16_383.5, -16_382.5, 0.0, -0.0, 1e-30, f32::NAN]);
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..200_000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let v = f32::from_bits(s as u32);
            if v.is_finite() && v.abs() <= Q_MAX {
                vals.push(v);
            }
            vals.push(((s >> 40) as f32 / 64.0) - 65536.0);
        }
        for v in vals {
            assert_eq!(round_away(v), v.round() as i32, "{v:e}");
        }
    }

    #[test]
    fn bytes_equal_the_reference() {
        let mut s = 7u64;
        let mut next = move || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
        };
        for ty in PnType::ALL {
            let bpw = ty.weights_per_block();
            for (n, nb) in [(1, 1), (5, 3), (16, 2), (17, 7), (40, 5)] {
                let mut x: Vec<f32> = (0..n * nb * bpw).map(|_| next() * 3.0).collect();
                // Adversarial values: exact halves after scaling, a huge one, zeros, NaN, inf.
                x[0] = 1e30;
                if x.len() > 2 * bpw {
                    x[bpw..2 * bpw].fill(0.0);
                    x[bpw + 1] = f32::NAN;
                }
                if x.len() > 4 * bpw {
                    for (i, v) in x[3 * bpw..4 * bpw].iter_mut().enumerate() {
                        *v = (i as f32 - 40.0) * 0.5;
                    }
                    x[4 * bpw + 3] = f32::INFINITY;
                }
                let total = n.div_ceil(TILE) * nb;
                let parts = [(0, total), (total / 2, total - total / 2), (total - 1, 1)];
                for ((first, len), pr) in parts
                    .into_iter()
                    .flat_map(|p| [TilePrecision::I16, TilePrecision::I8].map(|pr| (p, pr)))
                {
                    let want = run(reference, (ty, pr), &x, n, nb, first, len);
                    let got = run(quantize_blocks, (ty, pr), &x, n, nb, first, len);
                    let what = format!("{ty} {pr:?} n {n} nb {nb}");
                    assert_eq!((&got.0, &got.1), (&want.0, &want.1), "{what}");
                    assert_eq!(got.3, want.3, "{what}: z sum(q)");
                    for (g, w) in got.2.iter().zip(&want.2) {
                        assert_eq!(g.to_bits(), w.to_bits(), "{what}");
                    }
                }
            }
        }
    }
}
