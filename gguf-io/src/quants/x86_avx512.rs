//! AVX-512 versions of the f32-activation dot products that decode reads most bytes through:
//! Q4_K (the 248320 x 5120 output head of the 27B model, the largest single read per token).
//! The per-lane arithmetic is the AVX2 kernel's (`x86_stock::dot_q45k_f32`): each weight is
//! `d * sc * q - dmin * m` (one `fmsub`, the same per-sub-block scales from
//! `x86::q4k_pair_scales`), then one `fma` with its activation; only the number of lanes, and so
//! the order of the final f32 sums, differs. The weights are prefetched ahead of use, as in
//! `pn-format`'s decode kernels: without it the loads wait on DRAM between bursts of arithmetic.
//!
//! Callers have checked that the CPU has AVX-512 F (and AVX2/FMA) and that `row` holds exactly
//! the blocks of `x.len()` elements.

use std::arch::x86_64::*;

use super::fp::f16_at;
use super::kquants::{Q4K_BYTES, QK_K};
use super::x86::q4k_pair_scales;

/// Bytes ahead of the block being multiplied that its weights are prefetched.
const PREFETCH_BYTES: usize = 4096;

/// Whether the AVX-512 kernels may run: the CPU has AVX-512 F and BW, and `PN_ISA` (the
/// workspace's ISA cap, see `pn_format::isa`) does not name a lower level (`scalar`, `avx2`).
pub(crate) fn allowed() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| {
        let capped = std::env::var("PN_ISA").is_ok_and(|v| {
            let v = v.trim().to_ascii_lowercase();
            v == "scalar" || v == "avx2"
        });
        !capped
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
    })
}

/// The low 128 bits of `v` broadcast to 16 lanes (`v` holds one value in every lane).
#[inline(always)]
unsafe fn wide(v: __m256) -> __m512 {
    _mm512_broadcastss_ps(_mm256_castps256_ps128(v))
}

/// Q4_K row times f32 activations: per sub-block pair `c`, 32 low nibbles (sub-block `2c`) and
/// 32 high nibbles (`2c + 1`) of `qs[32c..32c+32]`, 16 lanes at a time.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
pub(crate) unsafe fn dot_q4k_f32(row: &[u8], x: &[f32]) -> f32 {
    let (mut acc0, mut acc1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let low4 = _mm512_set1_epi32(15);
    let base = row.as_ptr();
    for (i, (b, xb)) in row
        .chunks_exact(Q4K_BYTES)
        .zip(x.chunks_exact(QK_K))
        .enumerate()
    {
        // 144 bytes per block: three cache lines; `wrapping_add`: a prefetch never faults.
        let ahead = base.wrapping_add(i * Q4K_BYTES + PREFETCH_BYTES);
        for l in 0..3 {
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * l) as *const i8);
        }
        let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
        for c in 0..4 {
            let [d1, mn1, d2, mn2] = q4k_pair_scales(d, dmin, &b[4..16], c);
            let (d1, mn1, d2, mn2) = (wide(d1), wide(mn1), wide(d2), wide(mn2));
            let q = b.as_ptr().add(16 + 32 * c);
            let xc = xb.as_ptr().add(64 * c);
            for g in 0..2 {
                let v = _mm512_cvtepu8_epi32(_mm_loadu_si128(q.add(16 * g) as *const __m128i));
                let (lo, hi) = (_mm512_and_si512(v, low4), _mm512_srli_epi32(v, 4));
                let wlo = _mm512_fmsub_ps(_mm512_cvtepi32_ps(lo), d1, mn1);
                let whi = _mm512_fmsub_ps(_mm512_cvtepi32_ps(hi), d2, mn2);
                acc0 = _mm512_fmadd_ps(wlo, _mm512_loadu_ps(xc.add(16 * g)), acc0);
                acc1 = _mm512_fmadd_ps(whi, _mm512_loadu_ps(xc.add(32 + 16 * g)), acc1);
            }
        }
    }
    _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1))
}
