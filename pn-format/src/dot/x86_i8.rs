//! The int8 one-row decode kernel: AVX-512 VNNI `vpdpbusd` (unsigned codes x signed int8
//! activations, four products per 32-bit lane) with the codes moved into bytes by shifts and
//! byte masks.
//!
//! Per pair of blocks (one 512-bit register of code words, the even block in the low half) and
//! per extraction `m` (`layout::i8_extractions`: 3 for pn3t, 2 for pn4t): one byte mask after a
//! shift (pn3t: plus one shift and one bitwise select shared by two extractions), one
//! `vpdpbusd` with the 64 activation bytes of `layout::i8_index`. That is 10 vector
//! operations for pn3t's 160
//! products where the int16 kernels take 25 (AVX-512) or 40 (AVX2), which is what a core with
//! no spare multiply width (Zen 4: 512-bit operations in two halves) needs to keep up with the
//! read.
//!
//! The 32-bit lanes 0..8 hold block `b`'s products and 8..16 block `b + 1`'s (each qword's bytes
//! stay in its own lanes), so the per-block integer sums, the scales and the f32 epilogue are
//! those of the int16 AVX-512 kernel (`x86::i16_avx512_body`), operation for operation: on the
//! same int8-grid values both give the same result up to the association of the final
//! horizontal sums.
//!
//! Safety contract: that of `x86` (the CPU has AVX-512 F/BW and VNNI; `row` holds `nb`
//! blocks; `xq8` holds `nb` blocks rounded up to a pair in `layout::i8_index` order; `sx` and
//! `zq` are zero-padded to a multiple of 16 blocks).

use super::layout::i8_extractions;
use super::tiles_vnni::dpbusd;
use super::x86::{prefetch_ahead, prefetch_bytes, scales16};
use super::x86_cache::int8_prefetch_level;
use crate::types::{PnType, BLOCK_BYTES};
use std::arch::x86_64::*;

/// `sum(n q)` per block of one row against int8 activations (see the module docs).
pub unsafe fn dot_i8_avx512(
    ty: PnType,
    row: &[u8],
    xq8: &[i8],
    sx: &[f32],
    zq: &[f32],
    nb: usize,
) -> f32 {
    debug_assert!(xq8.len() >= nb.div_ceil(2) * i8_extractions(ty) * 64);
    match ty {
        PnType::Pn3t => i8_avx512::<3, 3>(row, xq8, sx, zq, nb),
        PnType::Pn4t => i8_avx512::<4, 2>(row, xq8, sx, zq, nb),
    }
}

/// `sum(n * q)` of blocks `b` (lanes 0..8) and `b + 1` (lanes 8..16) in i32 lanes; with `ONE`,
/// only block `b` (the padding activations of the missing block are 0).
///
/// The codes move into bytes by shifts and byte masks only (`layout::i8_slot_offset`): on
/// Zen 4 `vpmultishiftqb` took about 2.5 cycles per 512-bit pick, which made the pn3t kernel
/// no faster than the int16 one (27B `ffn_up` rows in L2, one thread: 16.7 us against 16.4),
/// and a byte shuffle with variable 16-bit shifts took 12.1.
#[inline(always)]
unsafe fn pair_acc_i8<const BITS: u32, const E: usize, const ONE: bool>(
    p: *const u8,
    xp: *const i8,
    b: usize,
) -> __m512i {
    let w0 = _mm256_loadu_si256(p.add(BLOCK_BYTES * b + 2) as *const __m256i);
    let w = if ONE {
        _mm512_zextsi256_si512(w0)
    } else {
        let w1 = _mm256_loadu_si256(p.add(BLOCK_BYTES * (b + 1) + 2) as *const __m256i);
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(w0), w1)
    };
    let x = xp.add(b / 2 * E * 64);
    let codes: [__m512i; 3] = if BITS == 4 {
        // Byte `k` holds codes at bits `8k` (low nibble) and `8k + 4` (high nibble).
        let mask = _mm512_set1_epi8(0x0f);
        let lo = _mm512_and_si512(w, mask);
        let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(w), mask);
        [lo, hi, lo]
    } else {
        // Each half's low byte holds codes 0 and 1 at bits 0 and 3; shifted right by one, its
        // high byte holds codes 3 and 4 at bits 0 and 3. One bitwise select takes the low
        // bytes from `w` and the high bytes from `w >> 1`; then a mask, and a shift by 3 and a
        // mask, give four codes per dword each. Code 2 straddles the bytes: it comes from the
        // plain halves, two per dword.
        let mask = _mm512_set1_epi8(7);
        let high_bytes = _mm512_set1_epi16(0xff00u16 as i16);
        // `vpternlogd` 0xca: `a ? b : c`, bit by bit.
        let v = _mm512_ternarylogic_epi32::<0xca>(high_bytes, _mm512_srli_epi16::<1>(w), w);
        let c0 = _mm512_and_si512(v, mask);
        let c1 = _mm512_and_si512(_mm512_srli_epi16::<3>(v), mask);
        let c2 = _mm512_and_si512(_mm512_srli_epi16::<6>(w), _mm512_set1_epi16(7));
        [c0, c1, c2]
    };
    // Two chains: each `vpdpbusd` depends on the last one in its accumulator.
    let mut accs = [_mm512_setzero_si512(); 2];
    for (m, c) in codes.iter().enumerate().take(E) {
        let xm = _mm512_load_si512(x.add(64 * m) as *const __m512i);
        accs[m & 1] = dpbusd(accs[m & 1], *c, xm);
    }
    _mm512_add_epi32(accs[0], accs[1])
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn i8_avx512<const BITS: u32, const E: usize>(
    row: &[u8],
    xq8: &[i8],
    sx: &[f32],
    zq: &[f32],
    nb: usize,
) -> f32 {
    let p = row.as_ptr();
    let xp = xq8.as_ptr();
    let ahead = prefetch_bytes();
    let level = int8_prefetch_level(E * 32 * nb, ahead);
    // From here on `x86::i16_avx512_body` with `pair_acc_i8` for its pair sums (same f32
    // operations in the same order; see there for the two accumulators).
    let mut t0 = _mm512_setzero_ps();
    let mut t1 = _mm512_setzero_ps();
    let mut corr = _mm512_setzero_ps();
    let first = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    let two = _mm512_set1_epi32(2);
    let four = _mm512_set1_epi32(4);
    let mut b = 0;
    while b + 16 <= nb {
        prefetch_ahead(p, b, 16, ahead, level);
        let dv = _mm512_cvtph_ps(scales16(p, b));
        let dsx = _mm512_mul_ps(dv, _mm512_loadu_ps(sx.as_ptr().add(b)));
        corr = _mm512_fmadd_ps(dsx, _mm512_loadu_ps(zq.as_ptr().add(b)), corr);
        let mut idx = first;
        for k in 0..4 {
            let a0 = pair_acc_i8::<BITS, E, false>(p, xp, b + 4 * k);
            let a1 = pair_acc_i8::<BITS, E, false>(p, xp, b + 4 * k + 2);
            t0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a0), _mm512_permutexvar_ps(idx, dsx), t0);
            let idx1 = _mm512_add_epi32(idx, two);
            t1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a1), _mm512_permutexvar_ps(idx1, dsx), t1);
            idx = _mm512_add_epi32(idx, four);
        }
        b += 16;
    }
    t0 = _mm512_add_ps(t0, t1);
    if b < nb {
        let n = nb - b;
        let mut hs = [0u16; 16];
        for (i, h) in hs.iter_mut().enumerate().take(n) {
            *h = std::ptr::read_unaligned(p.add(BLOCK_BYTES * (b + i)) as *const u16);
        }
        let dv = _mm512_cvtph_ps(_mm256_loadu_si256(hs.as_ptr() as *const __m256i));
        let dsx = _mm512_mul_ps(dv, _mm512_loadu_ps(sx.as_ptr().add(b)));
        corr = _mm512_fmadd_ps(dsx, _mm512_loadu_ps(zq.as_ptr().add(b)), corr);
        let mut idx = first;
        let mut i = 0;
        while i + 1 < n {
            let a = pair_acc_i8::<BITS, E, false>(p, xp, b + i);
            t0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_permutexvar_ps(idx, dsx), t0);
            idx = _mm512_add_epi32(idx, two);
            i += 2;
        }
        if i < n {
            let a = pair_acc_i8::<BITS, E, true>(p, xp, b + i);
            t0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_permutexvar_ps(idx, dsx), t0);
        }
    }
    _mm512_reduce_add_ps(t0) - _mm512_reduce_add_ps(corr)
}

#[cfg(test)]
mod tests {
    //! The int8 kernel against the scalar kernel and against the 512-bit int16 kernel on the
    //! same int8-grid values (same integer sums, same f32 operations up to the final sums).
    use super::*;
    use crate::dot::x86::tests::xorshift;
    use crate::dot::{dot_prepared_with, scalar, PreparedI16, TilePrecision};
    use crate::isa::Isa;
    use crate::quantize::quantize_row_ref;

    fn row_and_acts(ty: PnType, nb: usize, seed: u64, spiky: bool) -> (Vec<u8>, PreparedI16) {
        let k = nb * ty.weights_per_block();
        let mut s = seed;
        let w: Vec<f32> = (0..k).map(|_| xorshift(&mut s)).collect();
        let x: Vec<f32> = (0..k)
            .map(|i| {
                let v = xorshift(&mut s);
                // Adversarial: one huge value per block, the rest tiny (codes of the extremes).
                if spiky && i % ty.weights_per_block() == 7 {
                    v * 1e4
                } else {
                    v
                }
            })
            .collect();
        let row = quantize_row_ref(ty, &w).unwrap();
        let acts = PreparedI16::with_precision(ty, TilePrecision::I8, &x).unwrap();
        (row, acts)
    }

    #[test]
    fn int8_kernel_matches_the_int16_kernels_on_int8_values() {
        if !crate::dot::int8_decode_available() {
            eprintln!("skipped: no AVX-512 VNNI on this CPU");
            return;
        }
        for ty in PnType::ALL {
            for nb in [1, 2, 3, 15, 16, 17, 31, 33, 64, 218] {
                for spiky in [false, true] {
                    let (row, acts) = row_and_acts(ty, nb, 0x9e37 + nb as u64, spiky);
                    assert!(
                        acts.xq.iter().all(|q| q.abs() <= 127),
                        "{ty}: not int8 values"
                    );
                    // SAFETY: the CPU has the features (checked above); buffers as prepared.
                    let got = unsafe { dot_i8_avx512(ty, &row, &acts.xq8, &acts.sx, &acts.zq, nb) };
                    // SAFETY: as above (the BW kernel needs a subset of the features).
                    let bw = unsafe {
                        match ty {
                            PnType::Pn3t => crate::dot::x86::i16_avx512_bw_for_tests::<3, 5>(
                                &row, &acts.xq, &acts.sx, &acts.zq, nb,
                            ),
                            PnType::Pn4t => crate::dot::x86::i16_avx512_bw_for_tests::<4, 4>(
                                &row, &acts.xq, &acts.sx, &acts.zq, nb,
                            ),
                        }
                    };
                    // Same integer sums and f32 steps; only the final horizontal sums may
                    // associate differently (`_mm512_reduce_add_ps` leaves the order to the
                    // code generator, which sees other target features here).
                    let tol_bw = 2e-6 * bw.abs().max(1.0) * (nb as f32).sqrt();
                    assert!((got - bw).abs() <= tol_bw, "{ty} nb={nb}: {got} vs {bw}");
                    let want = scalar::dot_i16(ty, &row, &acts.xq, &acts.sx, &acts.zq);
                    let tol = 1e-5 * want.abs().max(1.0) * (nb as f32).sqrt();
                    assert!((got - want).abs() <= tol, "{ty} nb={nb}: {got} vs {want}");
                    // The dispatcher takes this kernel for int8 activations.
                    let via = dot_prepared_with(Isa::Avx512Vnni, ty, &row, &acts).unwrap();
                    assert_eq!(via.to_bits(), got.to_bits(), "{ty} nb={nb}: dispatch");
                }
            }
        }
    }

    /// Codes at their extremes (all 0, all max) against activations at +-127: the byte products
    /// and the lanes' sums stay exact.
    #[test]
    fn int8_kernel_is_exact_at_the_extremes() {
        if !crate::dot::int8_decode_available() {
            eprintln!("skipped: no AVX-512 VNNI on this CPU");
            return;
        }
        for ty in PnType::ALL {
            let nb = 5;
            let k = nb * ty.weights_per_block();
            for (code_word, sign) in [(0u32, 1.0f32), (u32::MAX, 1.0), (u32::MAX, -1.0)] {
                let mut row = vec![0u8; nb * BLOCK_BYTES];
                for blk in row.chunks_exact_mut(BLOCK_BYTES) {
                    blk[..2].copy_from_slice(&half::f16::from_f32(1.0).to_bits().to_le_bytes());
                    for w in blk[2..].chunks_exact_mut(4) {
                        let v = code_word & !ty.reserved_mask();
                        w.copy_from_slice(&v.to_le_bytes());
                    }
                }
                let x = vec![sign; k];
                let acts = PreparedI16::with_precision(ty, TilePrecision::I8, &x).unwrap();
                // SAFETY: features checked above; buffers as prepared.
                let got = unsafe { dot_i8_avx512(ty, &row, &acts.xq8, &acts.sx, &acts.zq, nb) };
                let want = scalar::dot_i16(ty, &row, &acts.xq, &acts.sx, &acts.zq);
                let n = if code_word == 0 {
                    0
                } else {
                    i32::from(ty.max_code())
                };
                let exact = sign * (n - ty.zero_point()) as f32 * k as f32;
                assert!(
                    (got - want).abs() <= 1e-6 * want.abs(),
                    "{ty}: {got} vs {want}"
                );
                assert!(
                    (got - exact).abs() <= 1e-3 * exact.abs(),
                    "{got} vs {exact}"
                );
            }
        }
    }
}
