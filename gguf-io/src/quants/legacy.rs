//! The 32-element block formats: Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 (decode and quantize).
//!
//! Decoders follow ggml's reference order of operations (`q * d`, `q * d + m`), so results are
//! bit-identical to ggml's `to_float`.

use super::fp::{f16_at, f32_to_f16_bits};

/// Elements per block.
pub(crate) const QK: usize = 32;

pub(crate) fn dequantize_q4_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(18).zip(dst.chunks_exact_mut(QK)) {
        let d = f16_at(b, 0);
        let qs = &b[2..18];
        for j in 0..16 {
            y[j] = ((qs[j] & 15) as i32 - 8) as f32 * d;
            y[j + 16] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
        }
    }
}

pub(crate) fn dequantize_q4_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(20).zip(dst.chunks_exact_mut(QK)) {
        let d = f16_at(b, 0);
        let m = f16_at(b, 2);
        let qs = &b[4..20];
        for j in 0..16 {
            y[j] = (qs[j] & 15) as f32 * d + m;
            y[j + 16] = (qs[j] >> 4) as f32 * d + m;
        }
    }
}

/// The fifth bits of a Q5 block: bit `j` belongs to element `j`.
fn qh_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

pub(crate) fn dequantize_q5_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(22).zip(dst.chunks_exact_mut(QK)) {
        let d = f16_at(b, 0);
        let qh = qh_at(b, 2);
        let qs = &b[6..22];
        for j in 0..16 {
            let h0 = ((qh >> j) & 1) << 4;
            let h1 = ((qh >> (j + 16)) & 1) << 4;
            y[j] = (((qs[j] & 15) as u32 | h0) as i32 - 16) as f32 * d;
            y[j + 16] = (((qs[j] >> 4) as u32 | h1) as i32 - 16) as f32 * d;
        }
    }
}

pub(crate) fn dequantize_q5_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(24).zip(dst.chunks_exact_mut(QK)) {
        let d = f16_at(b, 0);
        let m = f16_at(b, 2);
        let qh = qh_at(b, 4);
        let qs = &b[8..24];
        for j in 0..16 {
            let h0 = ((qh >> j) & 1) << 4;
            let h1 = ((qh >> (j + 16)) & 1) << 4;
            y[j] = ((qs[j] & 15) as u32 | h0) as f32 * d + m;
            y[j + 16] = ((qs[j] >> 4) as u32 | h1) as f32 * d + m;
        }
    }
}

pub(crate) fn dequantize_q8_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(34).zip(dst.chunks_exact_mut(QK)) {
        let d = f16_at(b, 0);
        for (o, &q) in y.iter_mut().zip(&b[2..34]) {
            *o = (q as i8) as f32 * d;
        }
    }
}

/// Q8_0 reference quantizer: per block `d = max|x| / 127` (stored as f16), `q = round(x / d)`
/// with ties away from zero, as ggml's reference does.
pub(crate) fn quantize_q8_0(src: &[f32], dst: &mut Vec<u8>) {
    for x in src.chunks_exact(QK) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        dst.extend_from_slice(&f32_to_f16_bits(d).to_le_bytes());
        dst.extend(x.iter().map(|&v| (v * id).round() as i8 as u8));
    }
}

/// The element of largest magnitude (the first of equals), with its sign.
fn signed_amax(x: &[f32]) -> f32 {
    x.iter()
        .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m })
}

/// The smallest and the largest element.
fn min_max(x: &[f32]) -> (f32, f32) {
    x.iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        })
}

/// Packs 32 levels of at most 5 bits: low nibbles (element `j` low, `j + 16` high) and, with
/// `fifth`, the fifth bits as a u32 (bit `j` = element `j`) before them.
fn pack_levels(q: &[u8; QK], fifth: bool, dst: &mut Vec<u8>) {
    if fifth {
        let qh = (0..QK).fold(0u32, |h, j| h | (u32::from(q[j] >> 4) << j));
        dst.extend_from_slice(&qh.to_le_bytes());
    }
    dst.extend((0..16).map(|j| (q[j] & 15) | ((q[j + 16] & 15) << 4)));
}

/// Q4_0 / Q5_0 reference quantizer: per block `d = max / -(2^(bits-1))` with `max` the signed
/// element of largest magnitude (so it maps to level 0), `q = min(2^bits - 1, trunc(x / d +
/// 2^(bits-1) + 0.5))`; the rule of ggml's and gguf-py's references, bit for bit.
pub(crate) fn quantize_symmetric(bits: u32, src: &[f32], dst: &mut Vec<u8>) {
    let half = (1u32 << (bits - 1)) as f32;
    let top = (1u32 << bits) - 1;
    for x in src.chunks_exact(QK) {
        let d = signed_amax(x) / -half;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        dst.extend_from_slice(&f32_to_f16_bits(d).to_le_bytes());
        let q: [u8; QK] =
            std::array::from_fn(|j| ((x[j] * id + (half + 0.5)) as u32).min(top) as u8);
        pack_levels(&q, bits == 5, dst);
    }
}

/// Q4_1 / Q5_1 reference quantizer: per block `d = (max - min) / (2^bits - 1)`, `m = min`,
/// `q = min(2^bits - 1, trunc((x - min) / d + 0.5))`, as ggml's and gguf-py's references.
pub(crate) fn quantize_affine(bits: u32, src: &[f32], dst: &mut Vec<u8>) {
    let top = (1u32 << bits) - 1;
    for x in src.chunks_exact(QK) {
        let (min, max) = min_max(x);
        let d = (max - min) / top as f32;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        dst.extend_from_slice(&f32_to_f16_bits(d).to_le_bytes());
        dst.extend_from_slice(&f32_to_f16_bits(min).to_le_bytes());
        let q: [u8; QK] =
            std::array::from_fn(|j| (((x[j] - min) * id + 0.5) as u32).min(top) as u8);
        pack_levels(&q, bits == 5, dst);
    }
}
