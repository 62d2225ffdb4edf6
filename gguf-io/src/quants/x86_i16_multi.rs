//! One Q4_K or Q8_0 weight row against up to `I16_MULTI` int16 activation sets at once (the MTP
//! verify pass and small batches: `out[m] = row . a[m]`): each block's weights are unpacked and
//! scaled once and multiplied with every set, so a pass over the 715 MB Q4_K head for 3 rows
//! reads and unpacks it once instead of three times.
//!
//! Per activation set the arithmetic is exactly the single-set kernel's of `x86_i16` (the same
//! integer block sums, the same f32 operations in the same order), so each output is
//! bit-identical to [`super::vec_dot_i16`] on that set: a verify row gets the logits a decode
//! step would. On AVX-512 (VNNI or not); elsewhere the caller loops the single-set kernel.
//!
//! Callers have checked the lengths (`i16acts::check` for every set): `row` holds exactly the
//! blocks of each set's `len()` elements, a multiple of 256.

use std::arch::x86_64::*;

use super::i16acts::ActsI16;
use super::kquants::{Q4K_BYTES, QK_K};
use super::x86_i16::{even_odd, f16_pair, q4k_block_start, word_pick, PREFETCH_BYTES};
use crate::types::GgmlType;

// Sets per kernel call: with 4 the accumulators, the unpacked weights and the scale-pick
// constants fit the 32 vector registers.
use super::i16acts::I16_MULTI as MULTI;

/// Repeats `$body` with `$i` bound to each constant `0..$n` (`$n <= 4`, a constant): the
/// per-set accumulators are then indexed by literals and stay in registers.
macro_rules! unroll4 {
    ($i:ident < $n:expr, $body:block) => {
        unroll4!(@ $i, $n, $body, 0 1 2 3)
    };
    (@ $i:ident, $n:expr, $body:block, $($k:literal)*) => {
        $(
            if $k < $n {
                let $i: usize = $k;
                $body
            }
        )*
    };
}

/// `out[m] = row . a[m]` for `a.len()` in `1..=MULTI` on AVX-512 (`None`: no AVX-512 here, or
/// another type; the caller then uses the single-set kernel per set).
pub(crate) fn dot_multi(ty: GgmlType, row: &[u8], a: &[&ActsI16], out: &mut [f32]) -> Option<()> {
    debug_assert!((1..=MULTI).contains(&a.len()) && out.len() == a.len());
    let vnni = super::x86_i16::level_avx512()?;
    macro_rules! by_count {
        ($f:ident) => {
            match a.len() {
                1 => $f::<1>(row, a, out),
                2 => $f::<2>(row, a, out),
                3 => $f::<3>(row, a, out),
                _ => $f::<4>(row, a, out),
            }
        };
    }
    // SAFETY: `level_avx512` detected AVX-512F/BW (and VNNI when `vnni`), AVX2, FMA and F16C;
    // lengths were checked by the caller.
    unsafe {
        match (ty, vnni) {
            (GgmlType::Q4K, true) => by_count!(q4k_vnni),
            (GgmlType::Q4K, false) => by_count!(q4k_bw),
            (GgmlType::Q8_0, _) => by_count!(q8_0_512),
            _ => return None,
        }
    }
    Some(())
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn q4k_vnni<const M: usize>(row: &[u8], a: &[&ActsI16], out: &mut [f32]) {
    q4k_body::<true, M>(row, a, out)
}

#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
unsafe fn q4k_bw<const M: usize>(row: &[u8], a: &[&ActsI16], out: &mut [f32]) {
    q4k_body::<false, M>(row, a, out)
}

/// The Q4_K body for `M` sets: per block the 8 scaled sub-block vectors are built once (two at
/// a time) and multiplied with every set; per set the operations of `x86_i16::q4k_512_body`.
#[inline(always)]
unsafe fn q4k_body<const VNNI: bool, const M: usize>(row: &[u8], a: &[&ActsI16], out: &mut [f32]) {
    let low4 = _mm512_set1_epi16(15);
    let pick: [__m512i; 8] = std::array::from_fn(|k| _mm512_set1_epi16(word_pick(k)));
    let xq: [*const i16; M] = std::array::from_fn(|m| a[m].q.as_ptr());
    let mut acc = [_mm512_setzero_ps(); M];
    let mut accm = [_mm256_setzero_ps(); M];
    let base = row.as_ptr();
    for i in 0..row.len() / Q4K_BYTES {
        let b = base.add(i * Q4K_BYTES);
        let (sc, mn) = q4k_block_start(b);
        let scv = _mm512_set1_epi64(sc as i64);
        let mut isum = [_mm512_setzero_si512(); M];
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
            unroll4!(m < M, {
                let x = xq[m].add(QK_K * i + 64 * c);
                let xlo = _mm512_loadu_si512(x as *const _);
                let xhi = _mm512_loadu_si512(x.add(32) as *const _);
                if VNNI {
                    isum[m] = _mm512_dpwssd_epi32(isum[m], lo, xlo);
                    isum[m] = _mm512_dpwssd_epi32(isum[m], hi, xhi);
                } else {
                    isum[m] = _mm512_add_epi32(isum[m], _mm512_madd_epi16(lo, xlo));
                    isum[m] = _mm512_add_epi32(isum[m], _mm512_madd_epi16(hi, xhi));
                }
            });
        }
        unroll4!(m < M, {
            let dd = f16_pair(b, a[m].d[i]);
            acc[m] = _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(isum[m]),
                _mm512_broadcastss_ps(dd),
                acc[m],
            );
            accm[m] = super::x86_i16::q4k_mins(accm[m], mn, a[m].sums.as_ptr().add(8 * i), dd);
        });
    }
    unroll4!(m < M, {
        out[m] = _mm512_reduce_add_ps(acc[m]) - super::x86::hsum(accm[m]);
    });
}

/// Q8_0 for `M` sets: each 34-byte block's weights widened once; per set the operations of
/// `x86_i16::q8_0_512`, in its order (even and odd blocks in two accumulators, added at the end).
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
unsafe fn q8_0_512<const M: usize>(row: &[u8], a: &[&ActsI16], out: &mut [f32]) {
    let xq: [*const i16; M] = std::array::from_fn(|m| a[m].q.as_ptr());
    let base = row.as_ptr();
    let block = |j: usize, mut acc: [__m512; M]| {
        let b = base.add(34 * j);
        _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(PREFETCH_BYTES) as *const i8);
        let w = _mm512_cvtepi8_epi16(_mm256_loadu_si256(b.add(2) as *const __m256i));
        unroll4!(m < M, {
            let x = _mm512_loadu_si512(xq[m].add(32 * j) as *const _);
            let d = f16_pair(b, a[m].d[j / 8]);
            acc[m] = _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(_mm512_madd_epi16(w, x)),
                _mm512_broadcastss_ps(d),
                acc[m],
            );
        });
        acc
    };
    // Set m's even blocks in `even[m]`, its odd ones in `odd[m]`.
    let (even, odd) = even_odd(row.len() / 34, [_mm512_setzero_ps(); M], block);
    unroll4!(m < M, {
        out[m] = _mm512_reduce_add_ps(_mm512_add_ps(even[m], odd[m]));
    });
}
