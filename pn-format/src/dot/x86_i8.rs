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

/// Vectors one pass over a row serves: each takes four accumulators (`t0`, `t1`, `corr` and
/// its scales), and with four of them the loop's registers still fit in 32.
pub const I8_MULTI_ACTS: usize = 4;

/// One int8-prepared vector's tables (`PreparedI16` at `TilePrecision::I8`), from block 0.
#[derive(Clone, Copy, Debug)]
pub struct I8Acts {
    /// Values in `layout::i8_index` order.
    pub xq8: *const i8,
    /// Per-block scales, zero-padded to a multiple of 16 blocks.
    pub sx: *const f32,
    /// `z * sum(q)` per block, padded like `sx`.
    pub zq: *const f32,
}

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
    let acts = [I8Acts {
        xq8: xq8.as_ptr(),
        sx: sx.as_ptr(),
        zq: zq.as_ptr(),
    }];
    let [out] = match ty {
        PnType::Pn3t => i8_avx512::<3, 3, 1>(row.as_ptr(), nb, &acts),
        PnType::Pn4t => i8_avx512::<4, 2, 1>(row.as_ptr(), nb, &acts),
    };
    out
}

/// `outs[m][r] = dot(row r, acts[m])` for `rows` consecutive rows of `nb` blocks, every vector
/// through [`dot_i8_avx512`]'s exact f32 steps: the rows are not split into block tiles (as
/// the int16 `multi` kernels do), and each vector keeps its own accumulators in the one-row
/// kernel's order, so every output is bit for bit what the one-row kernel gives. A sequence's
/// logits then do not depend on how many rows it shares a pass with, which int8's coarse
/// rounding steps would otherwise amplify from last-bit differences to about 1e-3. The codes
/// are unpacked once per [`I8_MULTI_ACTS`] vectors.
///
/// Safety: the CPU has AVX-512 F/BW and VNNI; `weights` holds `rows * nb` blocks; every
/// vector's tables are prepared for `nb` blocks of `ty` at int8 (see the module docs);
/// `outs[m]` holds `rows` values.
pub unsafe fn matvec_multi_i8_avx512(
    ty: PnType,
    weights: &[u8],
    rows: usize,
    nb: usize,
    acts: &[I8Acts],
    outs: &mut [&mut [f32]],
) {
    debug_assert!(weights.len() >= rows * nb * BLOCK_BYTES && outs.len() == acts.len());
    if nb == 0 {
        return;
    }
    for (r, row) in weights
        .chunks_exact(nb * BLOCK_BYTES)
        .take(rows)
        .enumerate()
    {
        let p = row.as_ptr();
        for (c, group) in acts.chunks(I8_MULTI_ACTS).enumerate() {
            let mut got = [0f32; I8_MULTI_ACTS];
            macro_rules! run {
                ($m:literal) => {{
                    let g: &[I8Acts; $m] = group.try_into().expect("group length");
                    let o = match ty {
                        PnType::Pn3t => i8_avx512::<3, 3, $m>(p, nb, g),
                        PnType::Pn4t => i8_avx512::<4, 2, $m>(p, nb, g),
                    };
                    got[..$m].copy_from_slice(&o);
                }};
            }
            match group.len() {
                1 => run!(1),
                2 => run!(2),
                3 => run!(3),
                _ => run!(4),
            }
            for (j, v) in got.iter().enumerate().take(group.len()) {
                outs[c * I8_MULTI_ACTS + j][r] = *v;
            }
        }
    }
}

/// The code bytes of blocks `b` (lanes 0..8) and `b + 1` (lanes 8..16), one register per
/// extraction (`layout::i8_extractions`; unused ones repeat); with `ONE`, only block `b` (the
/// padding activations of the missing block are 0).
///
/// The codes move into bytes by shifts and byte masks only (`layout::i8_slot_offset`): on
/// Zen 4 `vpmultishiftqb` took about 2.5 cycles per 512-bit pick, which made the pn3t kernel
/// no faster than the int16 one (27B `ffn_up` rows in L2, one thread: 16.7 us against 16.4),
/// and a byte shuffle with variable 16-bit shifts took 12.1.
#[inline(always)]
unsafe fn pair_codes<const BITS: u32, const ONE: bool>(p: *const u8, b: usize) -> [__m512i; 3] {
    let w0 = _mm256_loadu_si256(p.add(BLOCK_BYTES * b + 2) as *const __m256i);
    let w = if ONE {
        _mm512_zextsi256_si512(w0)
    } else {
        let w1 = _mm256_loadu_si256(p.add(BLOCK_BYTES * (b + 1) + 2) as *const __m256i);
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(w0), w1)
    };
    if BITS == 4 {
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
    }
}

/// `sum(n * q)` of the pair whose codes are `codes`, against its `E * 64` activation bytes at
/// `x`, in i32 lanes (exact: at most 4 x 15 x 127 per product quad).
#[inline(always)]
unsafe fn pair_sum<const E: usize>(codes: &[__m512i; 3], x: *const i8) -> __m512i {
    // Two chains: each `vpdpbusd` depends on the last one in its accumulator.
    let mut accs = [_mm512_setzero_si512(); 2];
    for (m, c) in codes.iter().enumerate().take(E) {
        let xm = _mm512_load_si512(x.add(64 * m) as *const __m512i);
        accs[m & 1] = dpbusd(accs[m & 1], *c, xm);
    }
    _mm512_add_epi32(accs[0], accs[1])
}

/// One row of `nb` blocks at `p` against `M` vectors: `x86::i16_avx512_body`'s f32 steps, in
/// its order, for each vector (so any `M` gives each vector the bits of `M = 1`), with
/// `pair_codes` and `pair_sum` for its pair sums.
// The loops over `0..M` index four per-vector arrays in step.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn i8_avx512<const BITS: u32, const E: usize, const M: usize>(
    p: *const u8,
    nb: usize,
    acts: &[I8Acts; M],
) -> [f32; M] {
    let ahead = prefetch_bytes();
    let level = int8_prefetch_level(M * E * 32 * nb, ahead);
    let gather = super::x86::scales_by_gather();
    // Per vector: two f32 accumulators (even and odd pairs; see `x86::i16_avx512_body`) and
    // the zero-point correction.
    let mut t0 = [_mm512_setzero_ps(); M];
    let mut t1 = [_mm512_setzero_ps(); M];
    let mut corr = [_mm512_setzero_ps(); M];
    let first = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    let two = _mm512_set1_epi32(2);
    let four = _mm512_set1_epi32(4);
    let x_of = |a: usize, b: usize| acts[a].xq8.add(b / 2 * E * 64);
    let mut b = 0;
    while b + 16 <= nb {
        prefetch_ahead(p, b, 16, ahead, level);
        let dv = _mm512_cvtph_ps(scales16(p, b, gather));
        let mut dsx = [_mm512_setzero_ps(); M];
        for a in 0..M {
            dsx[a] = _mm512_mul_ps(dv, _mm512_loadu_ps(acts[a].sx.add(b)));
            corr[a] = _mm512_fmadd_ps(dsx[a], _mm512_loadu_ps(acts[a].zq.add(b)), corr[a]);
        }
        let mut idx = first;
        for k in 0..4 {
            let idx1 = _mm512_add_epi32(idx, two);
            let c0 = pair_codes::<BITS, false>(p, b + 4 * k);
            let c1 = pair_codes::<BITS, false>(p, b + 4 * k + 2);
            for a in 0..M {
                let s0 = pair_sum::<E>(&c0, x_of(a, b + 4 * k));
                let s1 = pair_sum::<E>(&c1, x_of(a, b + 4 * k + 2));
                let d0 = _mm512_permutexvar_ps(idx, dsx[a]);
                t0[a] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), d0, t0[a]);
                let d1 = _mm512_permutexvar_ps(idx1, dsx[a]);
                t1[a] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), d1, t1[a]);
            }
            idx = _mm512_add_epi32(idx, four);
        }
        b += 16;
    }
    for a in 0..M {
        t0[a] = _mm512_add_ps(t0[a], t1[a]);
    }
    if b < nb {
        let n = nb - b;
        let mut hs = [0u16; 16];
        for (i, h) in hs.iter_mut().enumerate().take(n) {
            *h = std::ptr::read_unaligned(p.add(BLOCK_BYTES * (b + i)) as *const u16);
        }
        let dv = _mm512_cvtph_ps(_mm256_loadu_si256(hs.as_ptr() as *const __m256i));
        let mut dsx = [_mm512_setzero_ps(); M];
        for a in 0..M {
            dsx[a] = _mm512_mul_ps(dv, _mm512_loadu_ps(acts[a].sx.add(b)));
            corr[a] = _mm512_fmadd_ps(dsx[a], _mm512_loadu_ps(acts[a].zq.add(b)), corr[a]);
        }
        let mut idx = first;
        let mut i = 0;
        while i < n {
            let codes = if i + 1 < n {
                pair_codes::<BITS, false>(p, b + i)
            } else {
                pair_codes::<BITS, true>(p, b + i)
            };
            for a in 0..M {
                let s = pair_sum::<E>(&codes, x_of(a, b + i));
                let d = _mm512_permutexvar_ps(idx, dsx[a]);
                t0[a] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), d, t0[a]);
            }
            idx = _mm512_add_epi32(idx, two);
            i += 2;
        }
    }
    let mut out = [0f32; M];
    for a in 0..M {
        out[a] = _mm512_reduce_add_ps(t0[a]) - _mm512_reduce_add_ps(corr[a]);
    }
    out
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
                            PnType::Pn3t => crate::dot::x86::i16_avx512_bw::<3, 5>(
                                &row, &acts.xq, &acts.sx, &acts.zq, nb,
                            ),
                            PnType::Pn4t => crate::dot::x86::i16_avx512_bw::<4, 4>(
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

    /// Several vectors in one pass: every output bit for bit the one-row kernel's (groups of
    /// [`I8_MULTI_ACTS`] and their remainders, odd block counts, rows at odd byte offsets),
    /// and within rounding of the scalar reference.
    #[test]
    fn int8_multi_rows_equal_the_one_row_kernel_bit_for_bit() {
        if !crate::dot::int8_decode_available() {
            eprintln!("skipped: no AVX-512 VNNI on this CPU");
            return;
        }
        for ty in PnType::ALL {
            for nb in [1, 2, 17, 33, 64] {
                let k = nb * ty.weights_per_block();
                let rows = 3;
                let mut s = 0x5eed + nb as u64;
                // One spare byte in front: rows start at odd addresses.
                let mut w = vec![0u8];
                for _ in 0..rows {
                    let r: Vec<f32> = (0..k).map(|_| xorshift(&mut s)).collect();
                    w.extend(quantize_row_ref(ty, &r).unwrap());
                }
                let w = &w[1..];
                let rb = nb * BLOCK_BYTES;
                let acts: Vec<PreparedI16> = (0..9)
                    .map(|_| {
                        let x: Vec<f32> = (0..k).map(|_| xorshift(&mut s) * 3.0).collect();
                        PreparedI16::with_precision(ty, TilePrecision::I8, &x).unwrap()
                    })
                    .collect();
                for m in [1, 2, 3, 4, 5, 8, 9] {
                    let mut outs = vec![vec![0f32; rows]; m];
                    let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| &mut o[..]).collect();
                    crate::dot::matvec_multi_with(
                        Isa::Avx512Vnni,
                        ty,
                        w,
                        rows,
                        &acts[..m],
                        &mut refs,
                    )
                    .unwrap();
                    let mut want = vec![vec![0f32; rows]; m];
                    let mut refs: Vec<&mut [f32]> = want.iter_mut().map(|o| &mut o[..]).collect();
                    crate::dot::matvec_multi_with(Isa::Scalar, ty, w, rows, &acts[..m], &mut refs)
                        .unwrap();
                    for (j, a) in acts[..m].iter().enumerate() {
                        for r in 0..rows {
                            let row = &w[r * rb..(r + 1) * rb];
                            let one = dot_prepared_with(Isa::Avx512Vnni, ty, row, a).unwrap();
                            let got = outs[j][r];
                            assert_eq!(got.to_bits(), one.to_bits(), "{ty} nb={nb} m={m} {j},{r}");
                            let tol = 1e-5 * want[j][r].abs().max(1.0) * (nb as f32).sqrt();
                            assert!((got - want[j][r]).abs() <= tol, "{ty} nb={nb} m={m}");
                        }
                    }
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
