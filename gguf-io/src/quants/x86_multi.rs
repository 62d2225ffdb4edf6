//! AVX2/FMA kernels of `vec_dot_f32_multi`: each weight element is decoded once into a register
//! and multiplied with up to five vectors (sixteen registers: more vectors go in groups of five,
//! re-reading the row from L1). Callers have checked every length.

use std::arch::x86_64::*;

use super::fp::f16_at;
use super::kquants::{Q4K_BYTES, QK_K};
use super::x86::q4k_pair_scales;
use super::{decoder, Decoder};
use crate::types::GgmlType;

/// Vectors per kernel call (five accumulators, the decoded weights and the block's scales fit
/// the sixteen registers; MTP verification takes up to five rows).
const GROUP: usize = 5;

/// Runs the AVX2 kernels; `false` when the CPU lacks AVX2+FMA (the caller falls back).
pub(crate) fn vec_dot_f32_multi(ty: GgmlType, row: &[u8], xs: &[&[f32]], out: &mut [f32]) -> bool {
    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
        return false;
    }
    let f16c = is_x86_feature_detected!("f16c");
    for (x, o) in xs.chunks(GROUP).zip(out.chunks_mut(GROUP)) {
        // SAFETY: features detected above (F16 also needs F16C); lengths checked by the caller.
        unsafe {
            match x.len() {
                1 => group::<1>(ty, f16c, row, x, o),
                2 => group::<2>(ty, f16c, row, x, o),
                3 => group::<3>(ty, f16c, row, x, o),
                4 => group::<4>(ty, f16c, row, x, o),
                _ => group::<5>(ty, f16c, row, x, o),
            }
        }
    }
    true
}

#[inline(always)]
unsafe fn group<const M: usize>(
    ty: GgmlType,
    f16c: bool,
    row: &[u8],
    xs: &[&[f32]],
    out: &mut [f32],
) {
    let xp: [*const f32; M] = std::array::from_fn(|m| xs[m].as_ptr());
    let n = xs[0].len();
    let r = match ty {
        GgmlType::F32 => f32_rows::<M>(row, xp, n),
        GgmlType::F16 if f16c => f16_rows::<M>(row, xp, n),
        GgmlType::Q8_0 => q8_0_rows::<M>(row, xp),
        GgmlType::Q4K => q4k_rows::<M>(row, xp),
        _ => match decoder(ty) {
            Some(dec) => blockwise_rows::<M>(dec, ty, row, xp, n),
            None => return,
        },
    };
    out.copy_from_slice(&r);
}

#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Adds `w * x_m[off..off+8]` to every accumulator.
#[inline(always)]
unsafe fn fma_all<const M: usize>(
    acc: &mut [__m256; M],
    w: __m256,
    xp: &[*const f32; M],
    off: usize,
) {
    for m in 0..M {
        acc[m] = _mm256_fmadd_ps(w, _mm256_loadu_ps(xp[m].add(off)), acc[m]);
    }
}

/// Two accumulators per vector over 16 elements a step, summed, then the scalar tail: the
/// arithmetic of the one-vector `x86::dot_f32`, so every output has its bits.
#[target_feature(enable = "avx2,fma")]
unsafe fn f32_rows<const M: usize>(row: &[u8], xp: [*const f32; M], n: usize) -> [f32; M] {
    let w = row.as_ptr() as *const f32;
    let (mut a0, mut a1) = ([_mm256_setzero_ps(); M], [_mm256_setzero_ps(); M]);
    let mut i = 0;
    while i + 16 <= n {
        fma_all(&mut a0, _mm256_loadu_ps(w.add(i)), &xp, i);
        fma_all(&mut a1, _mm256_loadu_ps(w.add(i + 8)), &xp, i + 8);
        i += 16;
    }
    let mut out = [0f32; M];
    for m in 0..M {
        out[m] = hsum(_mm256_add_ps(a0[m], a1[m]));
        for j in i..n {
            out[m] += std::ptr::read_unaligned(w.add(j)) * *xp[m].add(j);
        }
    }
    out
}

/// As [`f32_rows`] for f16 weights (the arithmetic of `x86::dot_f16`).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_rows<const M: usize>(row: &[u8], xp: [*const f32; M], n: usize) -> [f32; M] {
    let w = row.as_ptr();
    let (mut a0, mut a1) = ([_mm256_setzero_ps(); M], [_mm256_setzero_ps(); M]);
    let mut i = 0;
    while i + 16 <= n {
        let h0 = _mm256_cvtph_ps(_mm_loadu_si128(w.add(2 * i) as *const __m128i));
        let h1 = _mm256_cvtph_ps(_mm_loadu_si128(w.add(2 * i + 16) as *const __m128i));
        fma_all(&mut a0, h0, &xp, i);
        fma_all(&mut a1, h1, &xp, i + 8);
        i += 16;
    }
    let mut out = [0f32; M];
    for m in 0..M {
        out[m] = hsum(_mm256_add_ps(a0[m], a1[m]));
        for j in i..n {
            out[m] += f16_at(row, 2 * j) * *xp[m].add(j);
        }
    }
    out
}

/// Per block and vector, the integer codes times the inputs summed first, then scaled into the
/// accumulator: the arithmetic of the one-vector `x86::dot_q8_0_f32`, so every output has its
/// bits (a pass of a few rows gives each the bits of its decode step).
#[target_feature(enable = "avx2,fma")]
unsafe fn q8_0_rows<const M: usize>(row: &[u8], xp: [*const f32; M]) -> [f32; M] {
    let mut acc = [_mm256_setzero_ps(); M];
    for (i, b) in row.chunks_exact(34).enumerate() {
        let q = b.as_ptr().add(2);
        let mut s = [_mm256_setzero_ps(); M];
        for g in 0..4 {
            let v = _mm256_cvtepi8_epi32(_mm_loadl_epi64(q.add(8 * g) as *const __m128i));
            fma_all(&mut s, _mm256_cvtepi32_ps(v), &xp, 32 * i + 8 * g);
        }
        let d = _mm256_set1_ps(f16_at(b, 0));
        for m in 0..M {
            acc[m] = _mm256_fmadd_ps(d, s[m], acc[m]);
        }
    }
    acc.map(|a| hsum(a))
}

#[target_feature(enable = "avx2,fma")]
unsafe fn q4k_rows<const M: usize>(row: &[u8], xp: [*const f32; M]) -> [f32; M] {
    let mut acc = [_mm256_setzero_ps(); M];
    let low4 = _mm256_set1_epi32(15);
    for (i, b) in row.chunks_exact(Q4K_BYTES).enumerate() {
        let d = f16_at(b, 0);
        let dmin = f16_at(b, 2);
        let scales = &b[4..16];
        for c in 0..4 {
            let [d1, mn1, d2, mn2] = q4k_pair_scales(d, dmin, scales, c);
            let q = b.as_ptr().add(16 + 32 * c);
            let base = QK_K * i + 64 * c;
            for g in 0..4 {
                let v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(q.add(8 * g) as *const __m128i));
                let lo = _mm256_cvtepi32_ps(_mm256_and_si256(v, low4));
                let hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4));
                fma_all(&mut acc, _mm256_fmsub_ps(lo, d1, mn1), &xp, base + 8 * g);
                fma_all(
                    &mut acc,
                    _mm256_fmsub_ps(hi, d2, mn2),
                    &xp,
                    base + 32 + 8 * g,
                );
            }
        }
    }
    acc.map(|a| hsum(a))
}

/// Any other type: decode up to 256 elements into a stack buffer, then multiply with every
/// vector.
#[target_feature(enable = "avx2,fma")]
unsafe fn blockwise_rows<const M: usize>(
    dec: Decoder,
    ty: GgmlType,
    row: &[u8],
    xp: [*const f32; M],
    n: usize,
) -> [f32; M] {
    let blck = ty.block_size();
    let per = (256 / blck).max(1);
    let (chunk_elems, chunk_bytes) = (blck * per, ty.type_size() * per);
    let mut buf = [0f32; 256];
    let mut acc = [_mm256_setzero_ps(); M];
    let mut out = [0f32; M];
    for (c, wb) in row.chunks(chunk_bytes).enumerate() {
        let base = c * chunk_elems;
        let len = chunk_elems.min(n - base);
        dec(wb, &mut buf[..len]);
        let mut j = 0;
        while j + 8 <= len {
            fma_all(
                &mut acc,
                _mm256_loadu_ps(buf.as_ptr().add(j)),
                &xp,
                base + j,
            );
            j += 8;
        }
        for (m, o) in out.iter_mut().enumerate() {
            for (jj, &w) in buf.iter().enumerate().take(len).skip(j) {
                *o += w * *xp[m].add(base + jj);
            }
        }
    }
    for m in 0..M {
        out[m] += hsum(acc[m]);
    }
    out
}
