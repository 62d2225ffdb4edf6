//! Reference quantizers for Q3_K, Q4_K and Q6_K (this project's own: a small scale search with
//! a least-squares refit per sub-block, then 6/8-bit super-block scales). Output decodes with
//! the stock decoders; the error stays within the bounds ggml's own tests use.

use super::fp::{f16_at, f32_to_f16_bits};
use super::kquants::QK_K;

/// Relative perturbations of the initial scale that the search tries (the extreme element maps
/// to `n + step` instead of exactly `n` levels; slightly larger scales often reduce the error).
const SCALE_STEPS: [f32; 13] = [
    -0.5, -0.4, -0.3, -0.2, -0.1, 0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5,
];

fn sq_err(x: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    x.iter().map(|&v| (f(v) - v) * (f(v) - v)).sum()
}

/// Fits `x ~ s*q - m` with `q` in `0..=nmax`, `s >= 0`, `m >= 0`: returns `(s, m)`.
fn fit_asymmetric(x: &[f32], nmax: u8) -> (f32, f32) {
    let lo = x.iter().fold(0f32, |a, &v| a.min(v));
    let hi = x.iter().fold(f32::MIN, |a, &v| a.max(v));
    if hi <= lo {
        return (0.0, -lo);
    }
    let n = nmax as f32;
    let mut best = ((hi - lo) / n, -lo);
    let mut best_err = f32::INFINITY;
    for step in SCALE_STEPS {
        let s0 = (hi - lo) / (n + step);
        if s0 <= 0.0 {
            continue;
        }
        let qs: Vec<f32> = x
            .iter()
            .map(|&v| ((v - lo) / s0).round().clamp(0.0, n))
            .collect();
        // Least-squares refit of s and the offset b = -m for these levels.
        let k = x.len() as f32;
        let (sq, sx) = (qs.iter().sum::<f32>(), x.iter().sum::<f32>());
        let sqq: f32 = qs.iter().map(|q| q * q).sum();
        let sqx: f32 = qs.iter().zip(x).map(|(q, v)| q * v).sum();
        let det = k * sqq - sq * sq;
        let (mut s, mut b) = if det > 0.0 {
            ((k * sqx - sq * sx) / det, (sqq * sx - sq * sqx) / det)
        } else {
            (s0, lo)
        };
        if b > 0.0 {
            // The format subtracts a non-negative min: clamp the offset to 0 and refit s.
            b = 0.0;
            s = if sqq > 0.0 { sqx / sqq } else { 0.0 };
        }
        if s <= 0.0 {
            continue;
        }
        let err: f32 = qs.iter().zip(x).map(|(q, v)| (s * q + b - v).powi(2)).sum();
        if err < best_err {
            best_err = err;
            best = (s, -b);
        }
    }
    best
}

/// Fits `x ~ s*q` with `q` in `-nneg..=npos`: returns `s` (either sign).
fn fit_symmetric(x: &[f32], nneg: i32, npos: i32) -> f32 {
    let amax_el = x
        .iter()
        .fold(0f32, |a, &v| if v.abs() > a.abs() { v } else { a });
    if amax_el == 0.0 {
        return 0.0;
    }
    let mut best = 0.0;
    let mut best_err = f32::INFINITY;
    // Map the largest-magnitude element to either end of the level range.
    for end in [-(nneg as f32), npos as f32] {
        for step in SCALE_STEPS {
            let denom = end + step * end.signum();
            let s0 = amax_el / denom;
            if !(s0.is_finite()) || s0 == 0.0 {
                continue;
            }
            let quant = |v: f32| (v / s0).round().clamp(-(nneg as f32), npos as f32);
            let sqq: f32 = x.iter().map(|&v| quant(v) * quant(v)).sum();
            let sqx: f32 = x.iter().map(|&v| quant(v) * v).sum();
            if sqq == 0.0 {
                continue;
            }
            let s = sqx / sqq;
            let err = sq_err(x, |v| s * quant(v));
            if err < best_err {
                best_err = err;
                best = s;
            }
        }
    }
    best
}

/// Reads back an f16 just stored, so later steps use exactly the value the decoder will see.
pub(crate) fn stored_f16(x: f32) -> (u16, f32) {
    let bits = f32_to_f16_bits(x);
    (bits, f16_at(&bits.to_le_bytes(), 0))
}

pub(crate) fn quantize_q4_k(src: &[f32], dst: &mut Vec<u8>) {
    for x in src.chunks_exact(QK_K) {
        let mut s = [0f32; 8];
        let mut m = [0f32; 8];
        for j in 0..8 {
            (s[j], m[j]) = fit_asymmetric(&x[32 * j..32 * j + 32], 15);
        }
        let smax = s.iter().fold(0f32, |a, &v| a.max(v));
        let mmax = m.iter().fold(0f32, |a, &v| a.max(v));
        let (d_bits, d) = stored_f16(smax / 63.0);
        let (dmin_bits, dmin) = stored_f16(mmax / 63.0);
        let mut sc = [0u8; 8];
        let mut mq = [0u8; 8];
        for j in 0..8 {
            sc[j] = if d > 0.0 {
                (s[j] / d).round().clamp(0.0, 63.0) as u8
            } else {
                0
            };
            mq[j] = if dmin > 0.0 {
                (m[j] / dmin).round().clamp(0.0, 63.0) as u8
            } else {
                0
            };
        }
        let mut q = [0u8; QK_K];
        for j in 0..8 {
            let step = d * sc[j] as f32;
            let min = dmin * mq[j] as f32;
            for l in 0..32 {
                let v = x[32 * j + l];
                q[32 * j + l] = if step > 0.0 {
                    ((v + min) / step).round().clamp(0.0, 15.0) as u8
                } else {
                    0
                };
            }
        }
        pack_q4_k(
            &QuantBlockAsym {
                d_bits,
                dmin_bits,
                sc,
                mq,
            },
            &q,
            dst,
        );
    }
}

pub(crate) fn quantize_q6_k(src: &[f32], dst: &mut Vec<u8>) {
    for x in src.chunks_exact(QK_K) {
        let mut s = [0f32; 16];
        for j in 0..16 {
            s[j] = fit_symmetric(&x[16 * j..16 * j + 16], 32, 31);
        }
        let amax = s.iter().fold(0f32, |a, &v| a.max(v.abs()));
        let (d_bits, d) = stored_f16(amax / 127.0);
        let mut sc = [0i8; 16];
        for j in 0..16 {
            sc[j] = if d > 0.0 {
                (s[j] / d).round().clamp(-128.0, 127.0) as i8
            } else {
                0
            };
        }
        let mut u = [0u8; QK_K];
        for (e, ue) in u.iter_mut().enumerate() {
            let step = d * sc[e / 16] as f32;
            let q = if step != 0.0 {
                (x[e] / step).round().clamp(-32.0, 31.0) as i32
            } else {
                0
            };
            *ue = (q + 32) as u8;
        }
        pack_q6_k(d_bits, &sc, &u, dst);
    }
}

pub(crate) fn quantize_q3_k(src: &[f32], dst: &mut Vec<u8>) {
    for x in src.chunks_exact(QK_K) {
        let mut s = [0f32; 16];
        for j in 0..16 {
            s[j] = fit_symmetric(&x[16 * j..16 * j + 16], 4, 3);
        }
        let amax = s.iter().fold(0f32, |a, &v| a.max(v.abs()));
        let (d_bits, d) = stored_f16(amax / 31.0);
        let mut sc = [0i8; 16];
        for j in 0..16 {
            sc[j] = if d > 0.0 {
                (s[j] / d).round().clamp(-32.0, 31.0) as i8
            } else {
                0
            };
        }
        let mut u = [0u8; QK_K];
        for (e, ue) in u.iter_mut().enumerate() {
            let step = d * sc[e / 16] as f32;
            let q = if step != 0.0 {
                (x[e] / step).round().clamp(-4.0, 3.0) as i32
            } else {
                0
            };
            *ue = (q + 4) as u8;
        }
        pack_q3_k(d_bits, &sc, &u, dst);
    }
}

/// The two f16 scales and the 6-bit sub-block scales and mins of one Q4_K/Q5_K super-block.
pub(crate) struct QuantBlockAsym {
    /// f16 bits of the scale of the sub-block scales.
    pub d_bits: u16,
    /// f16 bits of the scale of the sub-block mins.
    pub dmin_bits: u16,
    /// Sub-block scales, `0..=63`, one per 32 weights.
    pub sc: [u8; 8],
    /// Sub-block mins, `0..=63`.
    pub mq: [u8; 8],
}

/// The 12-byte packing of eight 6-bit scales and eight 6-bit mins (Q4_K and Q5_K).
fn pack_scales_mins(sc: &[u8; 8], mq: &[u8; 8]) -> [u8; 12] {
    let mut scales = [0u8; 12];
    for j in 0..4 {
        scales[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        scales[j + 4] = mq[j] | ((mq[j + 4] >> 4) << 6);
        scales[j + 8] = (sc[j + 4] & 15) | ((mq[j + 4] & 15) << 4);
    }
    scales
}

/// Appends one Q4_K super-block: levels `q` `[256]` in `0..=15`.
pub(crate) fn pack_q4_k(b: &QuantBlockAsym, q: &[u8; QK_K], dst: &mut Vec<u8>) {
    dst.extend_from_slice(&b.d_bits.to_le_bytes());
    dst.extend_from_slice(&b.dmin_bits.to_le_bytes());
    dst.extend_from_slice(&pack_scales_mins(&b.sc, &b.mq));
    for c in 0..4 {
        dst.extend((0..32).map(|l| q[64 * c + l] | (q[64 * c + 32 + l] << 4)));
    }
}

/// Appends one Q5_K super-block: levels `q` `[256]` in `0..=31` (low nibbles as Q4_K, the
/// fifth bit of element `64c + l` in bit `2c` of `qh[l]`, of `64c + 32 + l` in bit `2c + 1`).
pub(crate) fn pack_q5_k(b: &QuantBlockAsym, q: &[u8; QK_K], dst: &mut Vec<u8>) {
    dst.extend_from_slice(&b.d_bits.to_le_bytes());
    dst.extend_from_slice(&b.dmin_bits.to_le_bytes());
    dst.extend_from_slice(&pack_scales_mins(&b.sc, &b.mq));
    let mut qh = [0u8; 32];
    for c in 0..4 {
        for l in 0..32 {
            qh[l] |= ((q[64 * c + l] >> 4) & 1) << (2 * c);
            qh[l] |= ((q[64 * c + 32 + l] >> 4) & 1) << (2 * c + 1);
        }
    }
    dst.extend_from_slice(&qh);
    for c in 0..4 {
        dst.extend((0..32).map(|l| (q[64 * c + l] & 15) | ((q[64 * c + 32 + l] & 15) << 4)));
    }
}

/// Appends one Q6_K super-block: signed sub-block scales `sc` `[16]`, levels `u` `[256]` in
/// `0..=63` (the code plus 32).
pub(crate) fn pack_q6_k(d_bits: u16, sc: &[i8; 16], u: &[u8; QK_K], dst: &mut Vec<u8>) {
    let mut ql = [0u8; 128];
    let mut qh = [0u8; 64];
    for (e, &ue) in u.iter().enumerate() {
        let (h, r) = (e / 128, e % 128);
        let (k, l) = (r / 32, r % 32);
        let idx = 64 * h + 32 * (k & 1) + l;
        ql[idx] |= if k < 2 { ue & 15 } else { (ue & 15) << 4 };
        qh[32 * h + l] |= (ue >> 4) << (2 * k);
    }
    dst.extend_from_slice(&ql);
    dst.extend_from_slice(&qh);
    dst.extend(sc.iter().map(|&v| v as u8));
    dst.extend_from_slice(&d_bits.to_le_bytes());
}

/// Appends one Q3_K super-block: signed sub-block scales `sc` `[16]` in `-32..=31`, levels `u`
/// `[256]` in `0..=7` (the code plus 4).
pub(crate) fn pack_q3_k(d_bits: u16, sc: &[i8; 16], u: &[u8; QK_K], dst: &mut Vec<u8>) {
    let mut hmask = [0u8; 32];
    let mut qs = [0u8; 64];
    for (e, &ue) in u.iter().enumerate() {
        let (h, r) = (e / 128, e % 128);
        let (j, l) = (r / 32, r % 32);
        qs[32 * h + l] |= (ue & 3) << (2 * j);
        if ue >= 4 {
            hmask[l] |= 1 << (4 * h + j);
        }
    }
    let mut scales = [0u8; 12];
    for j in 0..16 {
        let u = (sc[j] as i32 + 32) as u8;
        if j < 8 {
            scales[j] |= u & 15;
        } else {
            scales[j - 8] |= (u & 15) << 4;
        }
        scales[8 + j % 4] |= (u >> 4) << (2 * (j / 4));
    }
    dst.extend_from_slice(&hmask);
    dst.extend_from_slice(&qs);
    dst.extend_from_slice(&scales);
    dst.extend_from_slice(&d_bits.to_le_bytes());
}
