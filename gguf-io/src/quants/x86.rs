//! AVX2/FMA kernels. Every function here has a scalar counterpart in the parent module and is
//! tested against it; the dispatchers return `None` when the CPU lacks the features, so callers
//! fall back to the portable code.
//!
//! Callers have already checked that `row` and the activations have matching, whole-block
//! lengths.

use std::arch::x86_64::*;

use super::fp::f16_at;
use super::kquants::{scale_min_k4, Q4K_BYTES, Q6K_BYTES, QK_K};
use super::q8::QuantizedActs;
use super::{blockwise_dot, decoder};
use crate::types::GgmlType;

fn has_avx2_fma() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
}

/// `vec_dot_f32` on AVX2, or `None` without AVX2+FMA.
pub(crate) fn vec_dot_f32(ty: GgmlType, row: &[u8], x: &[f32]) -> Option<f32> {
    if !has_avx2_fma() {
        return None;
    }
    // SAFETY: the required CPU features were detected above; lengths were checked by the caller.
    unsafe {
        Some(match ty {
            GgmlType::F32 => dot_f32(row, x),
            GgmlType::F16 if is_x86_feature_detected!("f16c") => dot_f16(row, x),
            GgmlType::Q8_0 => dot_q8_0_f32(row, x),
            GgmlType::Q4K if super::x86_avx512::allowed() => super::x86_avx512::dot_q4k_f32(row, x),
            _ => match super::x86_stock::vec_dot_f32(ty, row, x) {
                Some(v) => v,
                None => blockwise_avx2(ty, row, x)?,
            },
        })
    }
}

/// `vec_dot_q` on AVX2, or `None` without AVX2+FMA or for a type without a kernel.
pub(crate) fn vec_dot_q(ty: GgmlType, row: &[u8], a: &QuantizedActs) -> Option<f32> {
    if !has_avx2_fma() {
        return None;
    }
    // SAFETY: as above.
    unsafe {
        match ty {
            GgmlType::Q4K => Some(dot_q4k_q8k(row, a)),
            GgmlType::Q6K => Some(dot_q6k_q8k(row, a)),
            GgmlType::Q8_0 => Some(dot_q8_0_q8_0(row, a)),
            _ => None,
        }
    }
}

/// The sum of the 8 lanes.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// The portable block-at-a-time loop compiled for AVX2 (the decoder stays scalar, the dot
/// product vectorizes).
#[target_feature(enable = "avx2,fma")]
unsafe fn blockwise_avx2(ty: GgmlType, row: &[u8], x: &[f32]) -> Option<f32> {
    Some(blockwise_dot(decoder(ty)?, ty, row, x))
}

#[target_feature(enable = "avx2,fma")]
unsafe fn dot_f32(row: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let w = row.as_ptr();
    let mut i = 0;
    while i + 16 <= n {
        a0 = _mm256_fmadd_ps(
            _mm256_loadu_ps(w.add(4 * i) as *const f32),
            _mm256_loadu_ps(x.as_ptr().add(i)),
            a0,
        );
        a1 = _mm256_fmadd_ps(
            _mm256_loadu_ps(w.add(4 * i + 32) as *const f32),
            _mm256_loadu_ps(x.as_ptr().add(i + 8)),
            a1,
        );
        i += 16;
    }
    let mut s = hsum(_mm256_add_ps(a0, a1));
    for j in i..n {
        s +=
            f32::from_le_bytes([row[4 * j], row[4 * j + 1], row[4 * j + 2], row[4 * j + 3]]) * x[j];
    }
    s
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f16(row: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let w = row.as_ptr();
    let mut i = 0;
    while i + 16 <= n {
        let h0 = _mm256_cvtph_ps(_mm_loadu_si128(w.add(2 * i) as *const __m128i));
        let h1 = _mm256_cvtph_ps(_mm_loadu_si128(w.add(2 * i + 16) as *const __m128i));
        a0 = _mm256_fmadd_ps(h0, _mm256_loadu_ps(x.as_ptr().add(i)), a0);
        a1 = _mm256_fmadd_ps(h1, _mm256_loadu_ps(x.as_ptr().add(i + 8)), a1);
        i += 16;
    }
    let mut s = hsum(_mm256_add_ps(a0, a1));
    for (j, xj) in x.iter().enumerate().skip(i) {
        s += f16_at(row, 2 * j) * xj;
    }
    s
}

#[target_feature(enable = "avx2,fma")]
unsafe fn dot_q8_0_f32(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (i, (b, xb)) in row.chunks_exact(34).zip(x.chunks_exact(32)).enumerate() {
        // Prefetch 4 KiB ahead (see `x86_avx512`); `wrapping_add`: a prefetch never faults.
        let ahead = row.as_ptr().wrapping_add(34 * i + 4096);
        _mm_prefetch::<_MM_HINT_T0>(ahead as *const i8);
        let q = b.as_ptr().add(2);
        let mut s = _mm256_setzero_ps();
        for g in 0..4 {
            let v = _mm256_cvtepi8_epi32(_mm_loadl_epi64(q.add(8 * g) as *const __m128i));
            s = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(v),
                _mm256_loadu_ps(xb.as_ptr().add(8 * g)),
                s,
            );
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(b, 0)), s, acc);
    }
    hsum(acc)
}

/// Q4_K sub-blocks `2c` and `2c + 1` of a block with super-scales `d` / `dmin` and packed 6-bit
/// `scales` (the block's bytes 4..16): their scale and min, each `d * sc` / `dmin * m` in f32
/// and broadcast to 8 lanes: `[scale 2c, min 2c, scale 2c+1, min 2c+1]`. Shared by the one- and
/// the multi-vector dot products so both round the same way.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) unsafe fn q4k_pair_scales(d: f32, dmin: f32, scales: &[u8], c: usize) -> [__m256; 4] {
    let (sc1, m1) = scale_min_k4(2 * c, scales);
    let (sc2, m2) = scale_min_k4(2 * c + 1, scales);
    [
        _mm256_set1_ps(d * sc1 as f32),
        _mm256_set1_ps(dmin * m1 as f32),
        _mm256_set1_ps(d * sc2 as f32),
        _mm256_set1_ps(dmin * m2 as f32),
    ]
}

#[target_feature(enable = "avx2,fma")]
unsafe fn dot_q4k_q8k(row: &[u8], a: &QuantizedActs) -> f32 {
    let m4 = _mm256_set1_epi8(15);
    let mut acc = _mm256_setzero_ps();
    let mut mins_total = 0f32;
    for (i, b) in row.chunks_exact(Q4K_BYTES).enumerate() {
        let da = a.d[i];
        let d = f16_at(b, 0) * da;
        let dmin = f16_at(b, 2) * da;
        let q8 = a.qs.as_ptr().add(QK_K * i);
        let bs = &a.bsums[16 * i..16 * i + 16];
        let scales = &b[4..16];
        let mut sumi = _mm256_setzero_si256();
        let mut mins = 0i32;
        for c in 0..4 {
            let (sc1, m1) = scale_min_k4(2 * c, scales);
            let (sc2, m2) = scale_min_k4(2 * c + 1, scales);
            mins += m1 as i32 * (bs[4 * c] as i32 + bs[4 * c + 1] as i32);
            mins += m2 as i32 * (bs[4 * c + 2] as i32 + bs[4 * c + 3] as i32);
            let q4 = _mm256_loadu_si256(b.as_ptr().add(16 + 32 * c) as *const __m256i);
            let lo = _mm256_and_si256(q4, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
            let a_lo = _mm256_loadu_si256(q8.add(64 * c) as *const __m256i);
            let a_hi = _mm256_loadu_si256(q8.add(64 * c + 32) as *const __m256i);
            let p_lo = _mm256_maddubs_epi16(lo, a_lo);
            let p_hi = _mm256_maddubs_epi16(hi, a_hi);
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p_lo, _mm256_set1_epi16(sc1 as i16)));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p_hi, _mm256_set1_epi16(sc2 as i16)));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        mins_total += dmin * mins as f32;
    }
    hsum(acc) - mins_total
}

#[target_feature(enable = "avx2,fma")]
unsafe fn dot_q6k_q8k(row: &[u8], a: &QuantizedActs) -> f32 {
    let m4 = _mm256_set1_epi8(15);
    let m2 = _mm256_set1_epi8(3);
    let mut acc = _mm256_setzero_ps();
    let mut bias_total = 0f32;
    for (i, b) in row.chunks_exact(Q6K_BYTES).enumerate() {
        let d = f16_at(b, 208) * a.d[i];
        let q8 = a.qs.as_ptr().add(QK_K * i);
        let bs = &a.bsums[16 * i..16 * i + 16];
        let sc = &b[192..208];
        // The stored levels are q + 32; subtract 32 * sum(a) per group afterwards.
        let bias: i32 = (0..16)
            .map(|g| (sc[g] as i8) as i32 * bs[g] as i32)
            .sum::<i32>()
            * 32;
        let mut sumi = _mm256_setzero_si256();
        for h in 0..2 {
            let p = b.as_ptr();
            let ql0 = _mm256_loadu_si256(p.add(64 * h) as *const __m256i);
            let ql1 = _mm256_loadu_si256(p.add(64 * h + 32) as *const __m256i);
            let qh = _mm256_loadu_si256(p.add(128 + 32 * h) as *const __m256i);
            let hi0 = high_bits(qh, m2);
            let hi2 = high_bits(_mm256_srli_epi16(qh, 2), m2);
            let hi4 = high_bits(_mm256_srli_epi16(qh, 4), m2);
            let hi6 = high_bits(_mm256_srli_epi16(qh, 6), m2);
            let q = [
                _mm256_or_si256(_mm256_and_si256(ql0, m4), hi0),
                _mm256_or_si256(_mm256_and_si256(ql1, m4), hi2),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), hi4),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), hi6),
            ];
            for (k, &qk) in q.iter().enumerate() {
                let ak = _mm256_loadu_si256(q8.add(128 * h + 32 * k) as *const __m256i);
                let prod = _mm256_maddubs_epi16(qk, ak);
                let g = 8 * h + 2 * k;
                let scv = _mm256_set_m128i(
                    _mm_set1_epi16((sc[g + 1] as i8) as i16),
                    _mm_set1_epi16((sc[g] as i8) as i16),
                );
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(prod, scv));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        bias_total += d * bias as f32;
    }
    hsum(acc) - bias_total
}

/// The two bits of `qh` at the bottom of each byte (or wider lane), moved to bits 4..5.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn high_bits(qh: __m256i, m2: __m256i) -> __m256i {
    _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4)
}

#[target_feature(enable = "avx2,fma")]
unsafe fn dot_q8_0_q8_0(row: &[u8], a: &QuantizedActs) -> f32 {
    let ones = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    for (i, b) in row.chunks_exact(34).enumerate() {
        let w = _mm256_loadu_si256(b.as_ptr().add(2) as *const __m256i);
        let x = _mm256_loadu_si256(a.qs.as_ptr().add(32 * i) as *const __m256i);
        // maddubs needs one unsigned operand: move w's sign onto x.
        let p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
        let s = _mm256_madd_epi16(p, ones);
        acc = _mm256_fmadd_ps(
            _mm256_set1_ps(f16_at(b, 0) * a.d[i]),
            _mm256_cvtepi32_ps(s),
            acc,
        );
    }
    hsum(acc)
}
