//! Decoders of the 256-element K-quant super-blocks: Q2_K, Q3_K, Q4_K, Q5_K and Q6_K.
//!
//! Layouts are described in `docs/gguf-and-ggml-types.md` section 3. Each decoder forms the
//! sub-block factor first (`d * sc`, `dmin * m`) and then `factor * q - min`, the order ggml's
//! reference uses, so the results are bit-identical to ggml's `to_float`.

use super::fp::f16_at;

/// Elements per super-block.
pub(crate) const QK_K: usize = 256;

/// Bytes per block of each K-quant type.
pub(crate) const Q2K_BYTES: usize = 84;
pub(crate) const Q3K_BYTES: usize = 110;
pub(crate) const Q4K_BYTES: usize = 144;
pub(crate) const Q5K_BYTES: usize = 176;
pub(crate) const Q6K_BYTES: usize = 210;

/// Scale and min (6 bits each) of sub-block `j` (0..8) from the 12 packed bytes of a Q4_K or
/// Q5_K block.
#[inline(always)]
pub(crate) fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// The sixteen signed 6-bit scales of a Q3_K block from its 12 packed bytes.
#[inline(always)]
pub(crate) fn q3k_scales(s: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let low4 = if j < 8 { s[j] & 15 } else { s[j - 8] >> 4 };
        let hi2 = (s[8 + (j % 4)] >> (2 * (j / 4))) & 3;
        *o = (low4 | (hi2 << 4)) as i8 - 32;
    }
    out
}

pub(crate) fn dequantize_q2_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q2K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let scales = &b[0..16];
        let d = f16_at(b, 80);
        let dmin = f16_at(b, 82);
        let mut is = 0;
        let mut out = 0;
        for half in 0..2 {
            let q = &b[16 + 32 * half..16 + 32 * half + 32];
            for shift in [0, 2, 4, 6] {
                for part in 0..2 {
                    let sc = scales[is];
                    is += 1;
                    let dl = d * (sc & 15) as f32;
                    let ml = dmin * (sc >> 4) as f32;
                    for &qb in &q[16 * part..16 * part + 16] {
                        y[out] = dl * ((qb >> shift) & 3) as f32 - ml;
                        out += 1;
                    }
                }
            }
        }
    }
}

pub(crate) fn dequantize_q3_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q3K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let hmask = &b[0..32];
        let sc = q3k_scales(&b[96..108]);
        let d = f16_at(b, 108);
        let mut is = 0;
        let mut out = 0;
        for h in 0..2 {
            let q = &b[32 + 32 * h..64 + 32 * h];
            for j in 0..4 {
                let shift = 2 * j;
                let bit = 1u8 << (4 * h + j);
                for part in 0..2 {
                    let dl = d * sc[is] as f32;
                    is += 1;
                    for l in 16 * part..16 * part + 16 {
                        let q2 = ((q[l] >> shift) & 3) as i8;
                        let v = if hmask[l] & bit != 0 { q2 } else { q2 - 4 };
                        y[out] = dl * v as f32;
                        out += 1;
                    }
                }
            }
        }
    }
}

pub(crate) fn dequantize_q4_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q4K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_at(b, 0);
        let dmin = f16_at(b, 2);
        let scales = &b[4..16];
        for c in 0..4 {
            let q = &b[16 + 32 * c..48 + 32 * c];
            let (sc1, m1) = scale_min_k4(2 * c, scales);
            let (sc2, m2) = scale_min_k4(2 * c + 1, scales);
            let (d1, min1) = (d * sc1 as f32, dmin * m1 as f32);
            let (d2, min2) = (d * sc2 as f32, dmin * m2 as f32);
            let yc = &mut y[64 * c..64 * c + 64];
            for l in 0..32 {
                yc[l] = d1 * (q[l] & 15) as f32 - min1;
                yc[l + 32] = d2 * (q[l] >> 4) as f32 - min2;
            }
        }
    }
}

pub(crate) fn dequantize_q5_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q5K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_at(b, 0);
        let dmin = f16_at(b, 2);
        let scales = &b[4..16];
        let qh = &b[16..48];
        for c in 0..4 {
            let q = &b[48 + 32 * c..80 + 32 * c];
            let (sc1, m1) = scale_min_k4(2 * c, scales);
            let (sc2, m2) = scale_min_k4(2 * c + 1, scales);
            let (d1, min1) = (d * sc1 as f32, dmin * m1 as f32);
            let (d2, min2) = (d * sc2 as f32, dmin * m2 as f32);
            let yc = &mut y[64 * c..64 * c + 64];
            for l in 0..32 {
                let h1 = ((qh[l] >> (2 * c)) & 1) << 4;
                let h2 = ((qh[l] >> (2 * c + 1)) & 1) << 4;
                yc[l] = d1 * ((q[l] & 15) + h1) as f32 - min1;
                yc[l + 32] = d2 * ((q[l] >> 4) + h2) as f32 - min2;
            }
        }
    }
}

pub(crate) fn dequantize_q6_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q6K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_at(b, 208);
        for h in 0..2 {
            let ql = &b[64 * h..64 * h + 64];
            let qh = &b[128 + 32 * h..160 + 32 * h];
            let sc = &b[192 + 8 * h..200 + 8 * h];
            let yh = &mut y[128 * h..128 * h + 128];
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 15) | ((qh[l] & 3) << 4)) as i8 - 32;
                let q2 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
                yh[l] = d * (sc[is] as i8) as f32 * q1 as f32;
                yh[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
                yh[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
                yh[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
            }
        }
    }
}
