//! SIMD kernels of the int16-activation path (`i16acts`): Q4_K and Q8_0 weight rows against
//! [`ActsI16`], in exact integer arithmetic per block, on AVX-512 (VNNI `vpdpwssd`, or
//! `vpmaddwd` + add without VNNI) and on AVX2 (`vpmaddwd` + add). Each is tested against
//! `i16acts::reference`.
//!
//! Integer bounds (why nothing overflows): Q4_K weights are nibbles `q <= 15` times 6-bit
//! scales `sc <= 63`, so `q * sc <= 945` fits an i16; with `|x| <= 32767` one `vpmaddwd` lane
//! holds two products, `<= 6.2e7`, and a block adds at most 16 such pairs per i32 lane
//! (`<= 9.9e8 < 2^31`). The mins term is `m <= 63` times a 32-value sum `<= 1.05e6`. Q8_0: one
//! block of 32 per `vpmaddwd`, pairs `<= 8.4e6`.
//!
//! Callers have checked the lengths (`i16acts::check`): `row` holds exactly the blocks of
//! `a.len()` elements, a multiple of 256.

use std::arch::x86_64::*;

use super::i16acts::ActsI16;
use super::kquants::{Q4K_BYTES, QK_K};
use crate::types::GgmlType;

/// Bytes ahead of the block being multiplied that the weights are prefetched (as in
/// `x86_avx512`: without it the loads wait on DRAM between bursts of arithmetic).
pub(super) const PREFETCH_BYTES: usize = 4096;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Level {
    Avx512Vnni,
    Avx512,
    Avx2,
    None,
}

fn level() -> Level {
    static L: std::sync::OnceLock<Level> = std::sync::OnceLock::new();
    *L.get_or_init(|| {
        let scalar = std::env::var("PN_ISA").is_ok_and(|v| v.trim().eq_ignore_ascii_case("scalar"));
        let avx2 = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        if scalar || !avx2 {
            Level::None
        } else if super::x86_avx512::allowed() {
            if is_x86_feature_detected!("avx512vnni") {
                Level::Avx512Vnni
            } else {
                Level::Avx512
            }
        } else {
            Level::Avx2
        }
    })
}

/// Whether any kernel here may run (AVX2, FMA and F16C, and `PN_ISA` is not `scalar`).
pub(crate) fn available() -> bool {
    level() != Level::None
}

/// `Some(vnni)` when the AVX-512 kernels run here (`vnni`: with `vpdpwssd`), for the
/// multi-set kernels of `x86_i16_multi`.
pub(super) fn level_avx512() -> Option<bool> {
    match level() {
        Level::Avx512Vnni => Some(true),
        Level::Avx512 => Some(false),
        _ => None,
    }
}

/// `row . a` with the best kernel of this CPU, or `None` without one (or for another type).
pub(crate) fn dot(ty: GgmlType, row: &[u8], a: &ActsI16) -> Option<f32> {
    let lv = level();
    // SAFETY: each kernel's features were detected by `level`; lengths were checked by the
    // caller.
    unsafe {
        match (ty, lv) {
            (_, Level::None) => None,
            (GgmlType::Q4K, Level::Avx512Vnni) => Some(q4k_512_vnni(row, a)),
            (GgmlType::Q4K, Level::Avx512) => Some(q4k_512(row, a)),
            (GgmlType::Q4K, _) => Some(q4k_avx2(row, a)),
            (GgmlType::Q8_0, Level::Avx512Vnni | Level::Avx512) => Some(q8_0_512(row, a)),
            (GgmlType::Q8_0, _) => Some(q8_0_avx2(row, a)),
            _ => None,
        }
    }
}

/// A kernel: a weight row times int16 activations.
#[cfg(test)]
pub(crate) type Kernel = unsafe fn(&[u8], &ActsI16) -> f32;

/// The kernels by level, for the tests (each against the reference, whatever `dot` picks).
#[cfg(test)]
pub(crate) fn all_kernels() -> Vec<(&'static str, GgmlType, Kernel)> {
    let mut v: Vec<(&'static str, GgmlType, Kernel)> = Vec::new();
    if !available() {
        return v;
    }
    v.push(("q4k_avx2", GgmlType::Q4K, q4k_avx2));
    v.push(("q8_0_avx2", GgmlType::Q8_0, q8_0_avx2));
    if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") {
        v.push(("q4k_512", GgmlType::Q4K, q4k_512));
        v.push(("q8_0_512", GgmlType::Q8_0, q8_0_512));
        if is_x86_feature_detected!("avx512vnni") {
            v.push(("q4k_512_vnni", GgmlType::Q4K, q4k_512_vnni));
        }
    }
    v
}

/// The 8 six-bit scales and the 8 six-bit mins of a Q4_K block from its 12 packed bytes
/// (`b[4..16]`), one per byte of each u64: the packing `kquants::scale_min_k4` decodes one at a
/// time (sub-blocks 0..3 in the low 6 bits of bytes 0..3 / 4..7; 4..7 split between the nibbles
/// of bytes 8..11 and the top 2 bits of bytes 0..3 / 4..7), all eight at once.
#[inline(always)]
fn q4k_scales_mins(s: &[u8]) -> (u64, u64) {
    let w = |o: usize| u32::from_le_bytes([s[o], s[o + 1], s[o + 2], s[o + 3]]);
    let (a, b, c) = (w(0), w(4), w(8));
    let sc_lo = a & 0x3f3f_3f3f;
    let mn_lo = b & 0x3f3f_3f3f;
    let sc_hi = (c & 0x0f0f_0f0f) | (((a >> 6) & 0x0303_0303) << 4);
    let mn_hi = ((c >> 4) & 0x0f0f_0f0f) | (((b >> 6) & 0x0303_0303) << 4);
    (
        u64::from(sc_lo) | (u64::from(sc_hi) << 32),
        u64::from(mn_lo) | (u64::from(mn_hi) << 32),
    )
}

/// `vpshufb` indices that spread byte `k` of each 64-bit lane over every 16-bit word (high byte
/// zero: index bit 7 set), i.e. the word-broadcast of scale `k` from a `set1_epi64` of the 8.
#[inline(always)]
pub(super) fn word_pick(k: usize) -> i16 {
    (0x8000u16 | k as u16) as i16
}

/// The f16 pair at `p` (Q4_K's `d`, `dmin`; Q8_0's `d` and its first quant byte) as f32 in lanes
/// 0 and 1, times `dx`.
#[inline(always)]
pub(super) unsafe fn f16_pair(p: *const u8, dx: f32) -> __m128 {
    let h = _mm_cvtsi32_si128(std::ptr::read_unaligned(p as *const i32));
    _mm_mul_ps(_mm_cvtph_ps(h), _mm_set1_ps(dx))
}

/// Prefetches the block `PREFETCH_BYTES` ahead of the Q4_K block at `b` (144 bytes: up to
/// three cache lines; `wrapping_add`: a prefetch never faults) and returns its scales and mins
/// (`q4k_scales_mins`).
#[inline(always)]
pub(super) unsafe fn q4k_block_start(b: *const u8) -> (u64, u64) {
    let ahead = b.wrapping_add(PREFETCH_BYTES);
    for l in 0..3 {
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * l) as *const i8);
    }
    q4k_scales_mins(std::slice::from_raw_parts(b.add(4), 12))
}

/// `accm + dmin * dx * (m_j * sum_j)` lane-wise over the 8 sub-blocks: the mins term of one
/// Q4_K block (`mn` its mins, `sums` its 8 activation sums, `dd` lane 1 = `dmin * dx`).
#[inline(always)]
pub(super) unsafe fn q4k_mins(accm: __m256, mn: u64, sums: *const i32, dd: __m128) -> __m256 {
    let sums = _mm256_loadu_si256(sums as *const __m256i);
    let m = _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(mn as i64)), sums);
    _mm256_fmadd_ps(
        _mm256_cvtepi32_ps(m),
        _mm256_broadcastss_ps(_mm_movehdup_ps(dd)),
        accm,
    )
}

/// The Q4_K body on AVX-512; `VNNI` picks `vpdpwssd` over `vpmaddwd` + `vpaddd` (same sums).
#[inline(always)]
unsafe fn q4k_512_body<const VNNI: bool>(row: &[u8], a: &ActsI16) -> f32 {
    let low4 = _mm512_set1_epi16(15);
    let pick: [__m512i; 8] = std::array::from_fn(|k| _mm512_set1_epi16(word_pick(k)));
    let mut acc = _mm512_setzero_ps();
    let mut accm = _mm256_setzero_ps();
    let base = row.as_ptr();
    for i in 0..row.len() / Q4K_BYTES {
        let b = base.add(i * Q4K_BYTES);
        let (sc, mn) = q4k_block_start(b);
        let scv = _mm512_set1_epi64(sc as i64);
        let xq = a.q.as_ptr().add(QK_K * i);
        let mut isum = _mm512_setzero_si512();
        for c in 0..4 {
            // 32 bytes: low nibbles are sub-block 2c, high nibbles 2c + 1 (weights 0..31).
            let v = _mm512_cvtepu8_epi16(_mm256_loadu_si256(b.add(16 + 32 * c) as *const __m256i));
            let lo = _mm512_mullo_epi16(
                _mm512_and_si512(v, low4),
                _mm512_shuffle_epi8(scv, pick[2 * c]),
            );
            let hi = _mm512_mullo_epi16(
                _mm512_srli_epi16(v, 4),
                _mm512_shuffle_epi8(scv, pick[2 * c + 1]),
            );
            let xlo = _mm512_loadu_si512(xq.add(64 * c) as *const _);
            let xhi = _mm512_loadu_si512(xq.add(64 * c + 32) as *const _);
            if VNNI {
                isum = _mm512_dpwssd_epi32(isum, lo, xlo);
                isum = _mm512_dpwssd_epi32(isum, hi, xhi);
            } else {
                isum = _mm512_add_epi32(isum, _mm512_madd_epi16(lo, xlo));
                isum = _mm512_add_epi32(isum, _mm512_madd_epi16(hi, xhi));
            }
        }
        let dd = f16_pair(b, a.d[i]);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_broadcastss_ps(dd), acc);
        accm = q4k_mins(accm, mn, a.sums.as_ptr().add(8 * i), dd);
    }
    _mm512_reduce_add_ps(acc) - super::x86::hsum(accm)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn q4k_512_vnni(row: &[u8], a: &ActsI16) -> f32 {
    q4k_512_body::<true>(row, a)
}

#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
unsafe fn q4k_512(row: &[u8], a: &ActsI16) -> f32 {
    q4k_512_body::<false>(row, a)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4k_avx2(row: &[u8], a: &ActsI16) -> f32 {
    let low4 = _mm256_set1_epi16(15);
    let pick: [__m256i; 8] = std::array::from_fn(|k| _mm256_set1_epi16(word_pick(k)));
    let mut acc = _mm256_setzero_ps();
    let mut accm = _mm256_setzero_ps();
    let base = row.as_ptr();
    for i in 0..row.len() / Q4K_BYTES {
        let b = base.add(i * Q4K_BYTES);
        let (sc, mn) = q4k_block_start(b);
        let scv = _mm256_set1_epi64x(sc as i64);
        let xq = a.q.as_ptr().add(QK_K * i);
        let mut isum = _mm256_setzero_si256();
        for c in 0..4 {
            let (slo, shi) = (
                _mm256_shuffle_epi8(scv, pick[2 * c]),
                _mm256_shuffle_epi8(scv, pick[2 * c + 1]),
            );
            for h in 0..2 {
                // Weights 16h..16h+16 of sub-blocks 2c (low nibbles) and 2c + 1 (high).
                let v = _mm256_cvtepu8_epi16(_mm_loadu_si128(
                    b.add(16 + 32 * c + 16 * h) as *const __m128i
                ));
                let lo = _mm256_mullo_epi16(_mm256_and_si256(v, low4), slo);
                let hi = _mm256_mullo_epi16(_mm256_srli_epi16(v, 4), shi);
                let xlo = _mm256_loadu_si256(xq.add(64 * c + 16 * h) as *const __m256i);
                let xhi = _mm256_loadu_si256(xq.add(64 * c + 32 + 16 * h) as *const __m256i);
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(lo, xlo));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(hi, xhi));
            }
        }
        let dd = f16_pair(b, a.d[i]);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_broadcastss_ps(dd), acc);
        accm = q4k_mins(accm, mn, a.sums.as_ptr().add(8 * i), dd);
    }
    super::x86::hsum(acc) - super::x86::hsum(accm)
}

/// Folds `block(i, acc)` over blocks `0..n` into two accumulators, even blocks into the first
/// and odd ones into the second: two independent FMA chains instead of one.
#[inline(always)]
pub(super) fn even_odd<A: Copy>(n: usize, zero: A, mut block: impl FnMut(usize, A) -> A) -> (A, A) {
    let (mut acc0, mut acc1) = (zero, zero);
    for i in (0..n & !1).step_by(2) {
        acc0 = block(i, acc0);
        acc1 = block(i + 1, acc1);
    }
    if n % 2 == 1 {
        acc0 = block(n - 1, acc0);
    }
    (acc0, acc1)
}

/// Q8_0 on AVX-512: one 34-byte block (f16 `d`, 32 signed bytes) per `vpmaddwd`. Even and
/// odd blocks go to two accumulators: one FMA (4 cycles of latency on Zen 5) per 34-byte block
/// in a single chain capped the kernel at about 31 GB/s, one core's DRAM read.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
unsafe fn q8_0_512(row: &[u8], a: &ActsI16) -> f32 {
    let base = row.as_ptr();
    let block = |i: usize, acc: __m512| {
        let b = base.add(34 * i);
        _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(PREFETCH_BYTES) as *const i8);
        let w = _mm512_cvtepi8_epi16(_mm256_loadu_si256(b.add(2) as *const __m256i));
        let x = _mm512_loadu_si512(a.q.as_ptr().add(32 * i) as *const _);
        let d = f16_pair(b, a.d[i / 8]);
        let s = _mm512_cvtepi32_ps(_mm512_madd_epi16(w, x));
        _mm512_fmadd_ps(s, _mm512_broadcastss_ps(d), acc)
    };
    let (acc0, acc1) = even_odd(row.len() / 34, _mm512_setzero_ps(), block);
    _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1))
}

/// Q8_0 on AVX2: a block in two halves of 16; two accumulators as on AVX-512.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_avx2(row: &[u8], a: &ActsI16) -> f32 {
    let base = row.as_ptr();
    let block = |i: usize, acc: __m256| {
        let b = base.add(34 * i);
        _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(PREFETCH_BYTES) as *const i8);
        let xq = a.q.as_ptr().add(32 * i);
        let w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(b.add(2) as *const __m128i));
        let w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(b.add(18) as *const __m128i));
        let s = _mm256_add_epi32(
            _mm256_madd_epi16(w0, _mm256_loadu_si256(xq as *const __m256i)),
            _mm256_madd_epi16(w1, _mm256_loadu_si256(xq.add(16) as *const __m256i)),
        );
        let d = f16_pair(b, a.d[i / 8]);
        _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_broadcastss_ps(d), acc)
    };
    let (acc0, acc1) = even_odd(row.len() / 34, _mm256_setzero_ps(), block);
    super::x86::hsum(_mm256_add_ps(acc0, acc1))
}
