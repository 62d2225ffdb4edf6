//! Importance-weighted quantizers for Q3_K, Q4_K, Q5_K, Q6_K and Q8_0 (this project's own).
//!
//! Each block is encoded to minimise `sum_i imp_i (x_i - q_i)^2`, the importance-weighted
//! squared error (an imatrix's per-column mean squared activation is the usual `imp`):
//! 1. per sub-block, a search over candidate scales (and, for the asymmetric types, mins) with
//!    a weighted least-squares refit of the scale/min for the levels each candidate gives;
//! 2. a search over the super-block's f16 scale(s) that quantize the sub-block scales, each
//!    candidate scored by the weighted error of the whole super-block as the decoder will see
//!    it, then a coordinate pass moving each quantized sub-block scale by one step;
//! 3. the unweighted reference encoding of the same block is scored too, and the better of the
//!    two is written, so the result is never worse than the reference on the weighted error.
//!
//! Weights that are negative or not finite count as 0; a block whose weights are all 0 is
//! weighted uniformly. Inputs that are not finite do not panic (the caller rejects them first).

use super::kquantize::{self, stored_f16, QuantBlockAsym};
use super::kquants::QK_K;
use crate::types::GgmlType;
use std::cmp::Ordering;

/// Relative perturbations of the sub-block's initial scale (the extreme element maps to
/// `n + step` levels).
const SUB_STEPS: [f32; 17] = [
    -0.6, -0.5, -0.4, -0.3, -0.2, -0.15, -0.1, -0.05, 0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5,
];

/// Factors applied to the super-block scale's initial value.
const SUPER_STEPS: [f32; 9] = [0.85, 0.9, 0.94, 0.97, 1.0, 1.03, 1.06, 1.1, 1.15];

/// Factors for the two super-block scales of Q4_K/Q5_K (scales x mins grid).
const SUPER_STEPS_ASYM: [f32; 5] = [0.9, 0.95, 1.0, 1.05, 1.1];

/// Least-squares refit rounds after the first rounding of a sub-block.
const REFIT_ROUNDS: usize = 2;

fn clean_weights(w: &[f32]) -> Vec<f32> {
    let mut v: Vec<f32> = w
        .iter()
        .map(|&x| if x.is_finite() && x > 0.0 { x } else { 0.0 })
        .collect();
    if v.iter().all(|&x| x == 0.0) {
        v.iter_mut().for_each(|x| *x = 1.0);
    }
    v
}

fn werr(x: &[f32], w: &[f32], d: &[f32]) -> f64 {
    x.iter()
        .zip(w)
        .zip(d)
        .map(|((&a, &wi), &b)| {
            let e = f64::from(a) - f64::from(b);
            f64::from(wi) * e * e
        })
        .sum()
}

/// Weighted fit `x ~ s*L`, `L` in `-nneg..=npos`: returns `s` (either sign), 0 for a zero block.
fn fit_sym(x: &[f32], w: &[f32], nneg: f32, npos: f32) -> f32 {
    let amax_el = x
        .iter()
        .fold(0f32, |a, &v| if v.abs() > a.abs() { v } else { a });
    if amax_el == 0.0 || !amax_el.is_finite() {
        return 0.0;
    }
    let (mut best, mut best_err) = (0f32, f32::INFINITY);
    for end in [-nneg, npos] {
        for step in SUB_STEPS {
            let s0 = amax_el / (end + step * end.signum());
            if !s0.is_finite() || s0 == 0.0 {
                continue;
            }
            let mut s = s0;
            for _ in 0..=REFIT_ROUNDS {
                let (mut swl2, mut swlx) = (0f32, 0f32);
                for (&v, &wi) in x.iter().zip(w) {
                    let l = (v / s).round().clamp(-nneg, npos);
                    swl2 += wi * l * l;
                    swlx += wi * l * v;
                }
                if swl2 <= 0.0 {
                    break;
                }
                let err: f32 = x
                    .iter()
                    .zip(w)
                    .map(|(&v, &wi)| {
                        let l = (v / s).round().clamp(-nneg, npos);
                        let fit = swlx / swl2;
                        wi * (v - fit * l) * (v - fit * l)
                    })
                    .sum();
                if err < best_err {
                    (best, best_err) = (swlx / swl2, err);
                }
                let next = swlx / swl2;
                if next == 0.0 || !next.is_finite() || next == s {
                    break;
                }
                s = next;
            }
        }
    }
    best
}

/// Weighted fit `x ~ s*L - m`, `L` in `0..=nmax`, `s >= 0`, `m >= 0`: returns `(s, m)`.
fn fit_asym(x: &[f32], w: &[f32], nmax: f32) -> (f32, f32) {
    let lo = x.iter().fold(0f32, |a, &v| a.min(v));
    let hi = x.iter().fold(f32::MIN, |a, &v| a.max(v));
    if hi.partial_cmp(&lo) != Some(Ordering::Greater) || !(hi - lo).is_finite() {
        return (0.0, (-lo).max(0.0));
    }
    let (mut best, mut best_err) = (((hi - lo) / nmax, -lo), f32::INFINITY);
    for step in SUB_STEPS {
        let s0 = (hi - lo) / (nmax + step);
        if s0 <= 0.0 {
            continue;
        }
        let (mut s, mut b) = (s0, lo);
        for _ in 0..=REFIT_ROUNDS {
            let level = |v: f32| ((v - b) / s).round().clamp(0.0, nmax);
            let (mut sw, mut sl, mut sll, mut sx, mut slx) = (0f32, 0f32, 0f32, 0f32, 0f32);
            for (&v, &wi) in x.iter().zip(w) {
                let l = level(v);
                sw += wi;
                sl += wi * l;
                sll += wi * l * l;
                sx += wi * v;
                slx += wi * l * v;
            }
            let det = sw * sll - sl * sl;
            let (mut ns, mut nb) = if det > 0.0 {
                ((sw * slx - sl * sx) / det, (sll * sx - sl * slx) / det)
            } else {
                (s, b)
            };
            if nb > 0.0 {
                // The format subtracts a non-negative min: offset 0, refit the scale alone.
                nb = 0.0;
                ns = if sll > 0.0 { slx / sll } else { 0.0 };
            }
            if !ns.is_finite() || ns <= 0.0 || !nb.is_finite() {
                break;
            }
            let err: f32 = x
                .iter()
                .zip(w)
                .map(|(&v, &wi)| {
                    let e = ns * level(v) + nb - v;
                    wi * e * e
                })
                .sum();
            if err < best_err {
                (best, best_err) = ((ns, -nb), err);
            }
            if ns == s && nb == b {
                break;
            }
            (s, b) = (ns, nb);
        }
    }
    best
}

/// A symmetric K-quant (Q3_K, Q6_K): sub-block length, level range, sub-scale range.
struct SymKind {
    sub: usize,
    nneg: f32,
    npos: f32,
    scmax: f32,
}

const Q3K: SymKind = SymKind {
    sub: 16,
    nneg: 4.0,
    npos: 3.0,
    scmax: 31.0,
};
const Q6K: SymKind = SymKind {
    sub: 16,
    nneg: 32.0,
    npos: 31.0,
    scmax: 127.0,
};

/// Weighted error of one symmetric super-block with stored scale `d` and sub-scales `sc`;
/// fills `levels` (the signed codes).
fn sym_eval(kind: &SymKind, x: &[f32], w: &[f32], d: f32, sc: &[i8], levels: &mut [i8]) -> f64 {
    let mut err = 0f64;
    for (j, &s) in sc.iter().enumerate() {
        let step = d * f32::from(s);
        let r = j * kind.sub..(j + 1) * kind.sub;
        for ((&v, &wi), l) in x[r.clone()].iter().zip(&w[r.clone()]).zip(&mut levels[r]) {
            let q = if step != 0.0 {
                (v / step).round().clamp(-kind.nneg, kind.npos)
            } else {
                0.0
            };
            *l = q as i8;
            let e = f64::from(v) - f64::from(step * q);
            err += f64::from(wi) * e * e;
        }
    }
    err
}

/// Weighted search for a symmetric super-block: `(d_bits, sc [16], codes [256])`.
fn search_sym(kind: &SymKind, x: &[f32], w: &[f32]) -> (u16, [i8; 16], [i8; QK_K]) {
    let nsub = QK_K / kind.sub;
    let mut s = [0f32; 16];
    for (j, sj) in s.iter_mut().enumerate().take(nsub) {
        let r = j * kind.sub..(j + 1) * kind.sub;
        *sj = fit_sym(&x[r.clone()], &w[r], kind.nneg, kind.npos);
    }
    let amax = s.iter().fold(0f32, |a, &v| a.max(v.abs()));
    let mut levels = [0i8; QK_K];
    if amax == 0.0 || !amax.is_finite() {
        return (0, [0; 16], [0; QK_K]);
    }
    let quant_sc = |d: f32| {
        let mut sc = [0i8; 16];
        for (c, &v) in sc.iter_mut().zip(&s) {
            *c = if d > 0.0 {
                (v / d).round().clamp(-kind.scmax - 1.0, kind.scmax) as i8
            } else {
                0
            };
        }
        sc
    };
    // The grid over the super-block scale, then one coordinate pass on the best candidate
    // (each sub-scale one step either way, kept when it helps).
    let mut best: Option<(u16, f32, [i8; 16], f64)> = None;
    for f in SUPER_STEPS {
        let (bits, d) = stored_f16(amax / kind.scmax * f);
        if !d.is_finite() || d <= 0.0 {
            continue;
        }
        let sc = quant_sc(d);
        let err = sym_eval(kind, x, w, d, &sc[..nsub], &mut levels);
        if best.as_ref().is_none_or(|b| err < b.3) {
            best = Some((bits, d, sc, err));
        }
    }
    let Some((bits, d, mut sc, mut err)) = best else {
        return (0, [0; 16], [0; QK_K]);
    };
    for j in 0..nsub {
        for delta in [-1i16, 1] {
            let cand = i16::from(sc[j]) + delta;
            if cand < -(kind.scmax as i16) - 1 || cand > kind.scmax as i16 {
                continue;
            }
            let old = sc[j];
            sc[j] = cand as i8;
            let e = sym_eval(kind, x, w, d, &sc[..nsub], &mut levels);
            if e < err {
                err = e;
            } else {
                sc[j] = old;
            }
        }
    }
    sym_eval(kind, x, w, d, &sc[..nsub], &mut levels);
    (bits, sc, levels)
}

/// Weighted error of one Q4_K/Q5_K super-block; fills `levels`.
fn asym_eval(
    x: &[f32],
    w: &[f32],
    dm: (f32, f32),
    b: &QuantBlockAsym,
    nmax: f32,
    levels: &mut [u8],
) -> f64 {
    let mut err = 0f64;
    for j in 0..8 {
        let step = dm.0 * f32::from(b.sc[j]);
        let min = dm.1 * f32::from(b.mq[j]);
        let r = 32 * j..32 * j + 32;
        for ((&v, &wi), l) in x[r.clone()].iter().zip(&w[r.clone()]).zip(&mut levels[r]) {
            let q = if step > 0.0 {
                ((v + min) / step).round().clamp(0.0, nmax)
            } else {
                0.0
            };
            *l = q as u8;
            let e = f64::from(v) - f64::from(step * q - min);
            err += f64::from(wi) * e * e;
        }
    }
    err
}

/// Weighted search for a Q4_K (`nmax` 15) or Q5_K (31) super-block: the scales and levels.
fn search_asym(x: &[f32], w: &[f32], nmax: f32) -> (QuantBlockAsym, [u8; QK_K]) {
    let mut s = [0f32; 8];
    let mut m = [0f32; 8];
    for j in 0..8 {
        let r = 32 * j..32 * j + 32;
        (s[j], m[j]) = fit_asym(&x[r.clone()], &w[r], nmax);
    }
    let smax = s.iter().fold(0f32, |a, &v| a.max(v));
    let mmax = m.iter().fold(0f32, |a, &v| a.max(v));
    let q6 = |v: f32, d: f32| {
        if d > 0.0 {
            (v / d).round().clamp(0.0, 63.0) as u8
        } else {
            0
        }
    };
    let mut levels = [0u8; QK_K];
    // The grid over the two super-block scales, then one coordinate pass on the best candidate.
    let mut best: Option<(QuantBlockAsym, (f32, f32), f64)> = None;
    for fs in SUPER_STEPS_ASYM {
        for fm in SUPER_STEPS_ASYM {
            let (d_bits, d) = stored_f16(smax / 63.0 * fs);
            let (dmin_bits, dmin) = stored_f16(mmax / 63.0 * fm);
            if !d.is_finite() || !dmin.is_finite() {
                continue;
            }
            let b = QuantBlockAsym {
                d_bits,
                dmin_bits,
                sc: std::array::from_fn(|j| q6(s[j], d)),
                mq: std::array::from_fn(|j| q6(m[j], dmin)),
            };
            let err = asym_eval(x, w, (d, dmin), &b, nmax, &mut levels);
            if best.as_ref().is_none_or(|bb| err < bb.2) {
                best = Some((b, (d, dmin), err));
            }
        }
    }
    let Some((mut b, dm, mut err)) = best else {
        let zero = QuantBlockAsym {
            d_bits: 0,
            dmin_bits: 0,
            sc: [0; 8],
            mq: [0; 8],
        };
        return (zero, [0; QK_K]);
    };
    for j in 0..8 {
        for which in 0..2 {
            for delta in [-1i16, 1] {
                let slot = if which == 0 {
                    &mut b.sc[j]
                } else {
                    &mut b.mq[j]
                };
                let old = *slot;
                let cand = i16::from(old) + delta;
                if !(0..=63).contains(&cand) {
                    continue;
                }
                *slot = cand as u8;
                let e = asym_eval(x, w, dm, &b, nmax, &mut levels);
                if e < err {
                    err = e;
                } else if which == 0 {
                    b.sc[j] = old;
                } else {
                    b.mq[j] = old;
                }
            }
        }
    }
    asym_eval(x, w, dm, &b, nmax, &mut levels);
    (b, levels)
}

/// Encodes one block (`x`, `w` of the type's block length) as `ty` with the weighted search.
fn encode_block(ty: GgmlType, x: &[f32], w: &[f32], dst: &mut Vec<u8>) {
    match ty {
        GgmlType::Q3K | GgmlType::Q6K => {
            let kind = if ty == GgmlType::Q3K { &Q3K } else { &Q6K };
            let (bits, sc, levels) = search_sym(kind, x, w);
            let off = kind.nneg as i16;
            let u: [u8; QK_K] = std::array::from_fn(|i| (i16::from(levels[i]) + off) as u8);
            if ty == GgmlType::Q3K {
                kquantize::pack_q3_k(bits, &sc, &u, dst);
            } else {
                kquantize::pack_q6_k(bits, &sc, &u, dst);
            }
        }
        GgmlType::Q4K => {
            let (b, levels) = search_asym(x, w, 15.0);
            kquantize::pack_q4_k(&b, &levels, dst);
        }
        GgmlType::Q5K => {
            let (b, levels) = search_asym(x, w, 31.0);
            kquantize::pack_q5_k(&b, &levels, dst);
        }
        GgmlType::Q8_0 => encode_q8_0(x, w, dst),
        _ => {}
    }
}

/// Q8_0: the scale among `amax / (127 - t)` and their weighted least-squares refits.
fn encode_q8_0(x: &[f32], w: &[f32], dst: &mut Vec<u8>) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let codes = |d: f32| -> [i8; 32] {
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        std::array::from_fn(|i| (x[i] * id).round().clamp(-127.0, 127.0) as i8)
    };
    let score = |d: f32, q: &[i8; 32]| -> f64 {
        x.iter()
            .zip(w)
            .zip(q)
            .map(|((&v, &wi), &c)| {
                let e = f64::from(v) - f64::from(d * f32::from(c));
                f64::from(wi) * e * e
            })
            .sum()
    };
    let mut best = (0u16, [0i8; 32], f64::INFINITY);
    if amax > 0.0 && amax.is_finite() {
        for t in [0.0f32, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0] {
            let (_, d0) = stored_f16(amax / (127.0 - t));
            let q = codes(d0);
            // Refit the scale for these codes, then re-round with the stored refit.
            let (mut swq2, mut swqx) = (0f64, 0f64);
            for ((&v, &wi), &c) in x.iter().zip(w).zip(&q) {
                swq2 += f64::from(wi) * f64::from(c) * f64::from(c);
                swqx += f64::from(wi) * f64::from(c) * f64::from(v);
            }
            let refit = if swq2 > 0.0 { (swqx / swq2) as f32 } else { d0 };
            for d in [d0, refit] {
                let (bits, ds) = stored_f16(d);
                if !ds.is_finite() {
                    continue;
                }
                let q = codes(ds);
                let e = score(ds, &q);
                if e < best.2 {
                    best = (bits, q, e);
                }
            }
        }
    }
    dst.extend_from_slice(&best.0.to_le_bytes());
    dst.extend(best.1.iter().map(|&c| c as u8));
}

/// Quantizes `src` (a whole number of `ty` blocks) minimising the `imp`-weighted squared error
/// (`imp.len() == src.len()`); `ty` is Q3_K, Q4_K, Q5_K, Q6_K or Q8_0. Per block, the better of
/// the weighted search and the unweighted reference (Q5_K has none) on the weighted error.
pub(crate) fn quantize_weighted(ty: GgmlType, src: &[f32], imp: &[f32], dst: &mut Vec<u8>) {
    let bs = ty.block_size();
    let tsz = ty.type_size();
    let mut reference = Vec::with_capacity(tsz);
    let mut cand = Vec::with_capacity(tsz);
    let mut dec = vec![0f32; bs];
    for (x, wraw) in src.chunks_exact(bs).zip(imp.chunks_exact(bs)) {
        let w = clean_weights(wraw);
        cand.clear();
        encode_block(ty, x, &w, &mut cand);
        reference.clear();
        let has_ref = match ty {
            GgmlType::Q3K => {
                kquantize::quantize_q3_k(x, &mut reference);
                true
            }
            GgmlType::Q4K => {
                kquantize::quantize_q4_k(x, &mut reference);
                true
            }
            GgmlType::Q6K => {
                kquantize::quantize_q6_k(x, &mut reference);
                true
            }
            GgmlType::Q8_0 => {
                super::legacy::quantize_q8_0(x, &mut reference);
                true
            }
            _ => false,
        };
        let mut pick = &cand;
        if has_ref && super::dequantize_row(ty, &cand, &mut dec).is_ok() {
            let e_cand = werr(x, &w, &dec);
            if super::dequantize_row(ty, &reference, &mut dec).is_ok() {
                // The search's block stays unless the reference is strictly better (or the
                // search's error is not a number).
                let e_ref = werr(x, &w, &dec);
                if !matches!(
                    e_cand.partial_cmp(&e_ref),
                    Some(Ordering::Less | Ordering::Equal)
                ) {
                    pick = &reference;
                }
            }
        }
        dst.extend_from_slice(pick);
    }
}
