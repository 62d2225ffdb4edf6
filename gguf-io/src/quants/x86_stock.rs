//! AVX2/FMA fused row x f32-activation dot products of Q4_K, Q5_K, Q6_K, Q5_0, Q5_1, IQ4_XS
//! and IQ3_S: each block's levels are unpacked in registers and multiplied with the activations
//! without a decoded buffer. Their scalar reference is `reference::vec_dot_f32` (full decode,
//! f64 sums); they differ from it only by f32 rounding (FMA, per-block partial sums), tested
//! within `2e-6 * sum |w x|` in `tests/quants.rs` and `tests/stock_types.rs`.
//!
//! Callers have checked that the CPU has AVX2+FMA and that `row` holds exactly the blocks of
//! `x.len()` elements.

use std::arch::x86_64::*;

use super::fp::f16_at;
use super::iq_tables::KVALUES_IQ4NL;
use super::iquants::{iq3s_entry, iq3s_factor, iq4xs_scale, IQ3S_BYTES, IQ4XS_BYTES};
use super::kquants::{Q4K_BYTES, Q5K_BYTES, Q6K_BYTES, QK_K};
use super::x86::{high_bits, hsum, q4k_pair_scales};
use crate::types::GgmlType;

/// The fused kernel of `ty`, if there is one.
///
/// # Safety
/// The CPU must have AVX2 and FMA; `row` must hold exactly the blocks of `x.len()` elements.
pub(crate) unsafe fn vec_dot_f32(ty: GgmlType, row: &[u8], x: &[f32]) -> Option<f32> {
    Some(match ty {
        GgmlType::Q5_0 => dot_q5_f32::<false>(row, x),
        GgmlType::Q5_1 => dot_q5_f32::<true>(row, x),
        GgmlType::Q4K => dot_q45k_f32::<false>(row, x),
        GgmlType::Q5K => dot_q45k_f32::<true>(row, x),
        GgmlType::Q6K => dot_q6k_f32(row, x),
        GgmlType::Iq4Xs => dot_iq4xs_f32(row, x),
        GgmlType::Iq3S => dot_iq3s_f32(row, x),
        _ => return None,
    })
}

/// Eight signed bytes at `p`, widened to f32.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn i8x8_ps(p: *const i8) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i)))
}

/// Eight unsigned bytes at `p`, widened to i32.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn u8x8_epi32(p: *const u8) -> __m256i {
    _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i))
}

/// Bit `shift` of each i32 lane, as 0 or 16 (`one` = 1 in every lane).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn bit_to_16(v: __m256i, shift: __m128i, one: __m256i) -> __m256i {
    _mm256_slli_epi32(_mm256_and_si256(_mm256_srl_epi32(v, shift), one), 4)
}

/// The 32 bits of `qh` as 32 bytes, byte `j` = `0x10` when bit `j` is set, else 0.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn fifth_bits(qh: u32) -> __m256i {
    // Byte j takes byte j / 8 of qh, then tests its bit j % 8.
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(qh as i32),
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        ),
    );
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// Q5_0 (`AFFINE = false`: `d * (q - 16)`) and Q5_1 (`AFFINE`: `d * q + m`): per block the
/// integer levels times x, then `d * sum(q x)` (plus `m * sum(x)`).
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_q5_f32<const AFFINE: bool>(row: &[u8], x: &[f32]) -> f32 {
    let (bytes, qs_off) = if AFFINE { (24, 8) } else { (22, 6) };
    let m4 = _mm_set1_epi8(15);
    let (mut acc, mut acc_m) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut lv = [0i8; 32];
    for (b, xb) in row.chunks_exact(bytes).zip(x.chunks_exact(32)) {
        let qh_off = qs_off - 4;
        let qh = u32::from_le_bytes([b[qh_off], b[qh_off + 1], b[qh_off + 2], b[qh_off + 3]]);
        let qs = _mm_loadu_si128(b.as_ptr().add(qs_off) as *const __m128i);
        let lo = _mm_and_si128(qs, m4);
        let hi = _mm_and_si128(_mm_srli_epi16(qs, 4), m4);
        let mut q = _mm256_or_si256(_mm256_set_m128i(hi, lo), fifth_bits(qh));
        if !AFFINE {
            q = _mm256_sub_epi8(q, _mm256_set1_epi8(16));
        }
        _mm256_storeu_si256(lv.as_mut_ptr() as *mut __m256i, q);
        let mut s = _mm256_setzero_ps();
        let mut sx = _mm256_setzero_ps();
        for g in 0..4 {
            let xv = _mm256_loadu_ps(xb.as_ptr().add(8 * g));
            s = _mm256_fmadd_ps(i8x8_ps(lv.as_ptr().add(8 * g)), xv, s);
            if AFFINE {
                sx = _mm256_add_ps(sx, xv);
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(b, 0)), s, acc);
        if AFFINE {
            acc_m = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(b, 2)), sx, acc_m);
        }
    }
    hsum(_mm256_add_ps(acc, acc_m))
}

/// Q4_K (`FIVE = false`) and Q5_K (`FIVE`: the fifth bit of element `l` of chunk `c` is bit
/// `2c` / `2c + 1` of `qh[l]`): `d * sc * q - dmin * m` per 32-element sub-block, formed with
/// one FMA, times x. The chunk's scale pair is `q4k_pair_scales` (shared with the multi-vector
/// kernel, so both round alike).
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_q45k_f32<const FIVE: bool>(row: &[u8], x: &[f32]) -> f32 {
    let (bytes, qs_off) = if FIVE {
        (Q5K_BYTES, 48)
    } else {
        (Q4K_BYTES, 16)
    };
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let (low4, one) = (_mm256_set1_epi32(15), _mm256_set1_epi32(1));
    for (i, (b, xb)) in row
        .chunks_exact(bytes)
        .zip(x.chunks_exact(QK_K))
        .enumerate()
    {
        // Prefetch 4 KiB ahead (see `x86_avx512`); `wrapping_add`: a prefetch never faults.
        let ahead = row.as_ptr().wrapping_add(i * bytes + 4096);
        for l in 0..bytes.div_ceil(64) {
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * l) as *const i8);
        }
        let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
        for c in 0..4 {
            let [d1, mn1, d2, mn2] = q4k_pair_scales(d, dmin, &b[4..16], c);
            let (sh1, sh2) = (
                _mm_cvtsi32_si128(2 * c as i32),
                _mm_cvtsi32_si128(2 * c as i32 + 1),
            );
            let q = b.as_ptr().add(qs_off + 32 * c);
            let xc = xb.as_ptr().add(64 * c);
            for g in 0..4 {
                let v = u8x8_epi32(q.add(8 * g));
                let (mut lo, mut hi) = (_mm256_and_si256(v, low4), _mm256_srli_epi32(v, 4));
                if FIVE {
                    let h = u8x8_epi32(b.as_ptr().add(16 + 8 * g));
                    lo = _mm256_or_si256(lo, bit_to_16(h, sh1, one));
                    hi = _mm256_or_si256(hi, bit_to_16(h, sh2, one));
                }
                let wlo = _mm256_fmsub_ps(_mm256_cvtepi32_ps(lo), d1, mn1);
                let whi = _mm256_fmsub_ps(_mm256_cvtepi32_ps(hi), d2, mn2);
                acc0 = _mm256_fmadd_ps(wlo, _mm256_loadu_ps(xc.add(8 * g)), acc0);
                acc1 = _mm256_fmadd_ps(whi, _mm256_loadu_ps(xc.add(32 + 8 * g)), acc1);
            }
        }
    }
    hsum(_mm256_add_ps(acc0, acc1))
}

/// Q6_K: per half of 128, the four levels at `l`, `l + 32`, `l + 64`, `l + 96` from `ql[l]`,
/// `ql[l + 32]` and `qh[l]`, each times its `d * sc`.
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_q6k_f32(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 4];
    let (low4, two, off) = (
        _mm256_set1_epi32(15),
        _mm256_set1_epi32(3),
        _mm256_set1_epi32(32),
    );
    for (b, xb) in row.chunks_exact(Q6K_BYTES).zip(x.chunks_exact(QK_K)) {
        let d = f16_at(b, 208);
        let p = b.as_ptr();
        for h in 0..2 {
            let sc = &b[192 + 8 * h..200 + 8 * h];
            for l0 in (0..32).step_by(8) {
                let a = u8x8_epi32(p.add(64 * h + l0));
                let c = u8x8_epi32(p.add(64 * h + 32 + l0));
                let qh = u8x8_epi32(p.add(128 + 32 * h + l0));
                let q = [
                    _mm256_or_si256(_mm256_and_si256(a, low4), high_bits(qh, two)),
                    _mm256_or_si256(
                        _mm256_and_si256(c, low4),
                        high_bits(_mm256_srli_epi32(qh, 2), two),
                    ),
                    _mm256_or_si256(
                        _mm256_srli_epi32(a, 4),
                        high_bits(_mm256_srli_epi32(qh, 4), two),
                    ),
                    _mm256_or_si256(
                        _mm256_srli_epi32(c, 4),
                        high_bits(_mm256_srli_epi32(qh, 6), two),
                    ),
                ];
                let is = l0 / 16;
                for (k, &qk) in q.iter().enumerate() {
                    let ds = _mm256_set1_ps(d * (sc[is + 2 * k] as i8) as f32);
                    let w = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(qk, off)), ds);
                    let xv = _mm256_loadu_ps(xb.as_ptr().add(128 * h + 32 * k + l0));
                    acc[k] = _mm256_fmadd_ps(w, xv, acc[k]);
                }
            }
        }
    }
    hsum(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ))
}

/// IQ4_XS: the 16 non-linear levels looked up with a byte shuffle, per 32-element sub-block
/// `sum(level x)` times `d * scale`.
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_iq4xs_f32(row: &[u8], x: &[f32]) -> f32 {
    let table = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i);
    let m4 = _mm_set1_epi8(15);
    let mut acc = _mm256_setzero_ps();
    let mut lv = [0i8; 32];
    for (b, xb) in row.chunks_exact(IQ4XS_BYTES).zip(x.chunks_exact(QK_K)) {
        let d = f16_at(b, 0);
        for ib in 0..8 {
            let qs = _mm_loadu_si128(b.as_ptr().add(8 + 16 * ib) as *const __m128i);
            let lo = _mm_shuffle_epi8(table, _mm_and_si128(qs, m4));
            let hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(qs, 4), m4));
            _mm256_storeu_si256(lv.as_mut_ptr() as *mut __m256i, _mm256_set_m128i(hi, lo));
            let xs = xb.as_ptr().add(32 * ib);
            let mut s = _mm256_mul_ps(i8x8_ps(lv.as_ptr()), _mm256_loadu_ps(xs));
            for g in 1..4 {
                s = _mm256_fmadd_ps(
                    i8x8_ps(lv.as_ptr().add(8 * g)),
                    _mm256_loadu_ps(xs.add(8 * g)),
                    s,
                );
            }
            let dl = d * iq4xs_scale(b, ib) as f32;
            acc = _mm256_fmadd_ps(_mm256_set1_ps(dl), s, acc);
        }
    }
    hsum(acc)
}

/// IQ3_S: two grid entries (8 magnitudes) per group of 8, their signs applied by flipping the
/// f32 sign bit, per 32-element sub-block `sum(±grid x)` times `d * (1 + 2 s)`.
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_iq3s_f32(row: &[u8], x: &[f32]) -> f32 {
    let bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    let sign = _mm256_set1_epi32(i32::MIN);
    let mut acc = _mm256_setzero_ps();
    for (b, xb) in row.chunks_exact(IQ3S_BYTES).zip(x.chunks_exact(QK_K)) {
        let d = f16_at(b, 0);
        for ib in 0..8 {
            let mut s = _mm256_setzero_ps();
            for l in 0..4 {
                let g = 4 * ib + l;
                let e = iq3s_entry(b, 2 * g) as u64 | (iq3s_entry(b, 2 * g + 1) as u64) << 32;
                let mag = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(e as i64)));
                let sb = _mm256_set1_epi32(b[74 + g] as i32);
                let neg = _mm256_cmpeq_epi32(_mm256_and_si256(sb, bits), bits);
                let w = _mm256_xor_ps(mag, _mm256_castsi256_ps(_mm256_and_si256(neg, sign)));
                s = _mm256_fmadd_ps(w, _mm256_loadu_ps(xb.as_ptr().add(8 * g)), s);
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(iq3s_factor(d, b, ib)), s, acc);
        }
    }
    hsum(acc)
}
