//! x86-64 kernels for one weight row against several int16-prepared activation vectors at once:
//! the codes of a block are unpacked once and multiplied with every vector, so a pass over the
//! weights serves up to [`super::multi::MAX_ACTS`] inputs (MTP verification, small batches).
//!
//! Same safety contract as `x86`: the CPU has the enabled features, `row` holds `nb` blocks and
//! every activation set was prepared for `nb` blocks of the same type (i16 values padded to an
//! even block count, per-block tables padded to a multiple of 16 blocks).

use super::x86::{prefetch_ahead, scales16, scales8, scales_by_gather};
use super::x86_cache::PrefetchLevel;
use crate::types::{PnType, BLOCK_BYTES};
use std::arch::x86_64::*;

/// The raw buffers of one prepared activation vector.
#[derive(Clone, Copy)]
pub struct ActPtrs {
    /// Quantized values (kernel order).
    pub xq: *const i16,
    /// Per-block activation scales.
    pub sx: *const f32,
    /// Per-block `z * sum(q)`.
    pub zq: *const f32,
}

/// Reads `n <= 16` block scales (raw fp16) starting at block `b` into a zero-padded table.
#[inline(always)]
unsafe fn scale_bits(row: *const u8, b: usize, n: usize) -> [u16; 16] {
    let mut hs = [0u16; 16];
    for (i, h) in hs.iter_mut().enumerate().take(n) {
        *h = std::ptr::read_unaligned(row.add(BLOCK_BYTES * (b + i)) as *const u16);
    }
    hs
}

/// Pointer to the 32 code bytes of block `b`.
#[inline(always)]
unsafe fn words(row: *const u8, b: usize) -> *const u8 {
    row.add(BLOCK_BYTES * b + 2)
}

/// Dispatches a runtime activation count `1..=8` to a kernel monomorphised for it.
macro_rules! by_count {
    ($m:expr, $f:ident::<$($g:tt),*>($($arg:expr),*)) => {
        match $m {
            1 => $f::<$($g,)* 1>($($arg),*),
            2 => $f::<$($g,)* 2>($($arg),*),
            3 => $f::<$($g,)* 3>($($arg),*),
            4 => $f::<$($g,)* 4>($($arg),*),
            5 => $f::<$($g,)* 5>($($arg),*),
            6 => $f::<$($g,)* 6>($($arg),*),
            7 => $f::<$($g,)* 7>($($arg),*),
            _ => $f::<$($g,)* 8>($($arg),*),
        }
    };
}

/// Repeats `$body` with `$i` bound to each constant `0..$n` (`$n <= 8`, a constant): the
/// per-vector accumulators and the code registers are then indexed by literals, which keeps
/// them in registers (a loop over an array index would keep the arrays on the stack).
macro_rules! unroll {
    ($i:ident < $n:expr, $body:block) => {
        unroll!(@ $i, $n, $body, 0 1 2 3 4 5 6 7)
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

// ---------------------------------------------------------------- AVX-512

/// `out[m] = dot(row, acts[m])` for `acts.len()` in `1..=8` (AVX-512BW, VNNI optional).
pub unsafe fn multi_i16_avx512<const VNNI: bool>(
    ty: PnType,
    row: *const u8,
    nb: usize,
    acts: &[ActPtrs],
    out: &mut [f32],
) {
    let m = acts.len();
    if VNNI && super::x86::shift_by_multishift() {
        return match ty {
            PnType::Pn3t => by_count!(m, vbmi512::<3, 5>(row, nb, acts, out)),
            PnType::Pn4t => by_count!(m, vbmi512::<4, 4>(row, nb, acts, out)),
        };
    }
    match (ty, VNNI) {
        (PnType::Pn3t, true) => by_count!(m, vnni512::<3, 5>(row, nb, acts, out)),
        (PnType::Pn4t, true) => by_count!(m, vnni512::<4, 4>(row, nb, acts, out)),
        (PnType::Pn3t, false) => by_count!(m, bw512::<3, 5>(row, nb, acts, out)),
        (PnType::Pn4t, false) => by_count!(m, bw512::<4, 4>(row, nb, acts, out)),
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi,avx2,fma,f16c")]
unsafe fn vbmi512<const BITS: u32, const S: usize, const M: usize>(
    row: *const u8,
    nb: usize,
    acts: &[ActPtrs],
    out: &mut [f32],
) {
    body512::<BITS, S, M, true, true>(row, nb, acts, out)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn vnni512<const BITS: u32, const S: usize, const M: usize>(
    row: *const u8,
    nb: usize,
    acts: &[ActPtrs],
    out: &mut [f32],
) {
    body512::<BITS, S, M, true, false>(row, nb, acts, out)
}

#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
unsafe fn bw512<const BITS: u32, const S: usize, const M: usize>(
    row: *const u8,
    nb: usize,
    acts: &[ActPtrs],
    out: &mut [f32],
) {
    body512::<BITS, S, M, false, false>(row, nb, acts, out)
}

/// Multiply-accumulate of 32 i16 code/activation pairs into 16 i32 lanes.
#[inline(always)]
unsafe fn madd512<const VNNI: bool>(acc: __m512i, c: __m512i, x: __m512i) -> __m512i {
    if VNNI {
        // Inline asm: for a generic target LLVM splits `_mm512_dpwssd_epi32` into
        // `vpmaddwd` + `vpaddd` (its tuning assumes a slow VNNI unit), which costs an extra
        // vector uop per 32 multiply-adds; the kernels are bound by those uops.
        dpwssd_asm(acc, c, x)
    } else {
        _mm512_add_epi32(acc, _mm512_madd_epi16(c, x))
    }
}

/// `vpdpwssd` as written (see `madd512`).
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
pub(super) unsafe fn dpwssd_asm(mut acc: __m512i, c: __m512i, x: __m512i) -> __m512i {
    std::arch::asm!(
        "vpdpwssd {acc}, {c}, {x}",
        acc = inout(zmm_reg) acc,
        c = in(zmm_reg) c,
        x = in(zmm_reg) x,
        options(pure, nomem, nostack, preserves_flags),
    );
    acc
}

/// The codes of two blocks (even block in the low 256 bits), split into `S` registers of 32
/// int16 lanes: register `j` holds pair `j` of every word, the order `layout::i16_index` uses.
///
/// With `VBMI`, pairs `j >= 1` come from `vpmultishiftqb` (which runs on the shuffle port)
/// instead of a 32-bit shift (which competes with `vpdpwssd` for the multiply port): each 16-bit
/// lane's low byte takes the 8 bits at the code's offset in its qword, and the mask keeps the code.
#[inline(always)]
pub(super) unsafe fn codes512<const BITS: u32, const S: usize, const VBMI: bool>(
    w: __m512i,
) -> [__m512i; S] {
    let mut c = [_mm512_setzero_si512(); S];
    unroll!(j < S, {
        c[j] = code512::<BITS, VBMI>(w, j);
    });
    c
}

/// Pair `j` of every word of `w` in 32 int16 lanes (one register of [`codes512`]).
#[inline(always)]
unsafe fn code512<const BITS: u32, const VBMI: bool>(w: __m512i, j: usize) -> __m512i {
    let mask = _mm512_set1_epi32(((1i32 << BITS) - 1) * 0x10001);
    if j > 0 && BITS as usize * (j + 1) == 16 {
        // The top code of each 16-bit half (pn4t's last pair): a 16-bit shift leaves exactly
        // it, no mask needed.
        _mm512_srl_epi16(w, _mm_cvtsi32_si128((BITS as usize * j) as i32))
    } else {
        let shifted = if j == 0 {
            w
        } else if VBMI {
            // Lane L (0..4) of a qword: its code j starts at bit 16 L + BITS j.
            let sh = (BITS as usize * j) as i64;
            let ctrl = sh | (16 + sh) << 16 | (32 + sh) << 32 | (48 + sh) << 48;
            _mm512_multishift_epi64_epi8(_mm512_set1_epi64(ctrl), w)
        } else {
            // 16-bit shifts: each half holds its own codes, and `vpsrlw` runs beside
            // `vpdpwssd` on Zen 5 where `vpsrld` partly does not.
            _mm512_srl_epi16(w, _mm_cvtsi32_si128(BITS as i32 * j as i32))
        };
        _mm512_and_si512(shifted, mask)
    }
}

#[inline(always)]
unsafe fn body512<
    const BITS: u32,
    const S: usize,
    const M: usize,
    const VNNI: bool,
    const VBMI: bool,
>(
    p: *const u8,
    nb: usize,
    acts: &[ActPtrs],
    out: &mut [f32],
) {
    debug_assert!(acts.len() == M && out.len() == M);
    let a: [ActPtrs; M] = std::array::from_fn(|m| acts[m]);
    let gather = scales_by_gather();
    let mut t = [_mm512_setzero_ps(); M];
    // Lanes 0..8 select the even block's scale, 8..16 the odd block's.
    let pair_idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    let mut b = 0;
    while b < nb {
        let n = (nb - b).min(16);
        // Whole groups' scales inserted into a register: a table on the stack read back as a
        // vector stalls on store forwarding. (The caller prefetches the weights, in the order
        // in which it hands out rows and blocks: see `multi::Prefetch`.)
        let hv = if n == 16 {
            scales16(p, b, gather)
        } else {
            let hs = scale_bits(p, b, n);
            _mm256_loadu_si256(hs.as_ptr() as *const __m256i)
        };
        let dv = _mm512_cvtph_ps(hv);
        let mut dsx = [_mm512_setzero_ps(); M];
        unroll!(m < M, {
            dsx[m] = _mm512_mul_ps(dv, _mm512_loadu_ps(a[m].sx.add(b)));
            // The `z * sum(q)` correction goes into the same accumulator: only the sum of all
            // lanes matters, not which lane holds what.
            t[m] = _mm512_fnmadd_ps(dsx[m], _mm512_loadu_ps(a[m].zq.add(b)), t[m]);
        });
        let mut i = 0;
        while i < n {
            let w0 = _mm256_loadu_si256(words(p, b + i) as *const __m256i);
            // The last block of an odd count: zero upper half (its padding activations are 0).
            let w = if i + 1 < n {
                let w1 = _mm256_loadu_si256(words(p, b + i + 1) as *const __m256i);
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(w0), w1)
            } else {
                _mm512_zextsi256_si512(w0)
            };
            let c = codes512::<BITS, S, VBMI>(w);
            let idx = _mm512_add_epi32(pair_idx, _mm512_set1_epi32(i as i32));
            let off = (b + i) / 2 * S * 32;
            unroll!(m < M, {
                let x = a[m].xq.add(off);
                let mut acc = _mm512_setzero_si512();
                unroll!(j < S, {
                    let xj = _mm512_loadu_si512(x.add(32 * j) as *const _);
                    acc = madd512::<VNNI>(acc, c[j], xj);
                });
                let dvec = _mm512_permutexvar_ps(idx, dsx[m]);
                t[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), dvec, t[m]);
            });
            i += 2;
        }
        b += n;
    }
    unroll!(m < M, {
        out[m] = _mm512_reduce_add_ps(t[m]);
    });
}

/// Most vectors [`multi2_i16_avx512`] takes: its two rows' accumulators, sums and scales
/// (`6 M` registers) and the codes and constants must fit the 32 vector registers.
pub const PAIR_MAX_ACTS: usize = 4;

/// [`multi_i16_avx512`] for two rows of `nb` blocks at once (`outs[r][m] = dot(rows[r],
/// acts[m])`, `acts.len()` in `1..=`[`PAIR_MAX_ACTS`]): each activation vector is loaded once
/// for both rows. With three vectors the one-row kernel issued one 64-byte activation load per
/// `vpdpwssd`, and those loads, not the multiply-adds, set its pace on pn3t (15 loads a block
/// pair).
///
/// `ahead[r]`, where not null, is where the weights `rows[r]` will be followed in the pass (the
/// same blocks some rows further on): each 16-block group of the row is prefetched there as the
/// group is multiplied, so the prefetches spread over the arithmetic instead of coming in a
/// burst per call.
pub unsafe fn multi2_i16_avx512<const VNNI: bool>(
    ty: PnType,
    rows: [*const u8; 2],
    ahead: [*const u8; 2],
    nb: usize,
    acts: &[ActPtrs],
    outs: [&mut [f32]; 2],
) {
    macro_rules! by_count4 {
        ($f:ident::<$b:literal, $s:literal, $v:literal, $ms:literal>) => {
            match acts.len() {
                1 => $f::<$b, $s, 1, $v, $ms>(rows, ahead, nb, acts, outs),
                2 => $f::<$b, $s, 2, $v, $ms>(rows, ahead, nb, acts, outs),
                3 => $f::<$b, $s, 3, $v, $ms>(rows, ahead, nb, acts, outs),
                _ => $f::<$b, $s, 4, $v, $ms>(rows, ahead, nb, acts, outs),
            }
        };
    }
    debug_assert!((1..=PAIR_MAX_ACTS).contains(&acts.len()));
    match (ty, VNNI, VNNI && super::x86::shift_by_multishift()) {
        (PnType::Pn3t, true, true) => by_count4!(pair_vbmi512::<3, 5, true, true>),
        (PnType::Pn4t, true, true) => by_count4!(pair_vbmi512::<4, 4, true, true>),
        (PnType::Pn3t, true, false) => by_count4!(pair_vnni512::<3, 5, true, false>),
        (PnType::Pn4t, true, false) => by_count4!(pair_vnni512::<4, 4, true, false>),
        (PnType::Pn3t, false, _) => by_count4!(pair_bw512::<3, 5, false, false>),
        (PnType::Pn4t, false, _) => by_count4!(pair_bw512::<4, 4, false, false>),
    }
}

/// The entry points of [`pair_body512`], one per feature set (the body is inlined into each).
macro_rules! pair_entries {
    ($($name:ident: $features:literal;)*) => {
        $(
            #[target_feature(enable = $features)]
            unsafe fn $name<
                const BITS: u32,
                const S: usize,
                const M: usize,
                const VNNI: bool,
                const VBMI: bool,
            >(
                rows: [*const u8; 2],
                ahead: [*const u8; 2],
                nb: usize,
                acts: &[ActPtrs],
                outs: [&mut [f32]; 2],
            ) {
                pair_body512::<BITS, S, M, VNNI, VBMI>(rows, ahead, nb, acts, outs)
            }
        )*
    };
}

pair_entries! {
    pair_vbmi512: "avx512f,avx512bw,avx512vnni,avx512vbmi,avx2,fma,f16c";
    pair_vnni512: "avx512f,avx512bw,avx512vnni,avx2,fma,f16c";
    pair_bw512: "avx512f,avx512bw,avx2,fma,f16c";
}

/// [`body512`] for two rows: the same operations per row (so the same bits as two calls of
/// it), with the slots of a block pair taken one at a time so that each activation register
/// serves both rows.
#[inline(always)]
unsafe fn pair_body512<
    const BITS: u32,
    const S: usize,
    const M: usize,
    const VNNI: bool,
    const VBMI: bool,
>(
    rows: [*const u8; 2],
    ahead: [*const u8; 2],
    nb: usize,
    acts: &[ActPtrs],
    outs: [&mut [f32]; 2],
) {
    debug_assert!(acts.len() == M && outs.iter().all(|o| o.len() == M));
    let gather = scales_by_gather();
    let a: [ActPtrs; M] = std::array::from_fn(|m| acts[m]);
    // `[row][vector]`: the running sums and the group's per-block scales `d * sx`.
    let mut t = [[_mm512_setzero_ps(); M]; 2];
    let pair_idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    let mut b = 0;
    while b < nb {
        let n = (nb - b).min(16);
        let mut dsx = [[_mm512_setzero_ps(); M]; 2];
        unroll!(r < 2, {
            if !ahead[r].is_null() {
                prefetch_ahead(ahead[r], b, n, 0, PrefetchLevel::L1);
            }
        });
        unroll!(r < 2, {
            let hv = if n == 16 {
                scales16(rows[r], b, gather)
            } else {
                let hs = scale_bits(rows[r], b, n);
                _mm256_loadu_si256(hs.as_ptr() as *const __m256i)
            };
            let dv = _mm512_cvtph_ps(hv);
            unroll!(m < M, {
                dsx[r][m] = _mm512_mul_ps(dv, _mm512_loadu_ps(a[m].sx.add(b)));
                t[r][m] = _mm512_fnmadd_ps(dsx[r][m], _mm512_loadu_ps(a[m].zq.add(b)), t[r][m]);
            });
        });
        let mut i = 0;
        while i < n {
            let mut w = [_mm512_setzero_si512(); 2];
            unroll!(r < 2, {
                let w0 = _mm256_loadu_si256(words(rows[r], b + i) as *const __m256i);
                w[r] = if i + 1 < n {
                    let w1 = _mm256_loadu_si256(words(rows[r], b + i + 1) as *const __m256i);
                    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(w0), w1)
                } else {
                    _mm512_zextsi256_si512(w0)
                };
            });
            let idx = _mm512_add_epi32(pair_idx, _mm512_set1_epi32(i as i32));
            let off = (b + i) / 2 * S * 32;
            let mut acc = [[_mm512_setzero_si512(); M]; 2];
            unroll!(j < S, {
                let c0 = code512::<BITS, VBMI>(w[0], j);
                let c1 = code512::<BITS, VBMI>(w[1], j);
                unroll!(m < M, {
                    let xj = _mm512_loadu_si512(a[m].xq.add(off + 32 * j) as *const _);
                    acc[0][m] = madd512::<VNNI>(acc[0][m], c0, xj);
                    acc[1][m] = madd512::<VNNI>(acc[1][m], c1, xj);
                });
            });
            unroll!(r < 2, {
                unroll!(m < M, {
                    let dvec = _mm512_permutexvar_ps(idx, dsx[r][m]);
                    t[r][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][m]), dvec, t[r][m]);
                });
            });
            i += 2;
        }
        b += n;
    }
    let [o0, o1] = outs;
    unroll!(m < M, {
        o0[m] = _mm512_reduce_add_ps(t[0][m]);
        o1[m] = _mm512_reduce_add_ps(t[1][m]);
    });
}

// ---------------------------------------------------------------- AVX2

/// Vectors per AVX2 pass: five codes, five accumulators and the temporaries fill the sixteen
/// registers (MTP verification takes up to five rows).
const AVX2_GROUP: usize = 5;

/// `out[m] = dot(row, acts[m])` for `acts.len()` in `1..=8` on AVX2 (more than
/// [`AVX2_GROUP`] vectors are done in two passes over the row, which is then in L1).
pub unsafe fn multi_i16_avx2(
    ty: PnType,
    row: *const u8,
    nb: usize,
    acts: &[ActPtrs],
    out: &mut [f32],
) {
    for (a, o) in acts.chunks(AVX2_GROUP).zip(out.chunks_mut(AVX2_GROUP)) {
        match (ty, a.len()) {
            (PnType::Pn3t, 1) => avx2::<3, 5, 1>(row, nb, a, o),
            (PnType::Pn3t, 2) => avx2::<3, 5, 2>(row, nb, a, o),
            (PnType::Pn3t, 3) => avx2::<3, 5, 3>(row, nb, a, o),
            (PnType::Pn3t, 4) => avx2::<3, 5, 4>(row, nb, a, o),
            (PnType::Pn3t, _) => avx2::<3, 5, 5>(row, nb, a, o),
            (PnType::Pn4t, 1) => avx2::<4, 4, 1>(row, nb, a, o),
            (PnType::Pn4t, 2) => avx2::<4, 4, 2>(row, nb, a, o),
            (PnType::Pn4t, 3) => avx2::<4, 4, 3>(row, nb, a, o),
            (PnType::Pn4t, 4) => avx2::<4, 4, 4>(row, nb, a, o),
            (PnType::Pn4t, _) => avx2::<4, 4, 5>(row, nb, a, o),
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn avx2<const BITS: u32, const S: usize, const M: usize>(
    p: *const u8,
    nb: usize,
    acts: &[ActPtrs],
    out: &mut [f32],
) {
    debug_assert!(acts.len() == M && out.len() == M);
    let a: [ActPtrs; M] = std::array::from_fn(|m| acts[m]);
    let mask = _mm256_set1_epi32(((1i32 << BITS) - 1) * 0x10001);
    let mut t = [_mm256_setzero_ps(); M];
    // Along the row, as the decode kernels do (see `multi::tiled_simd` for why here).
    let ahead = super::x86::prefetch_bytes();
    // Into L1, whatever the tile's activations: the decode kernels' rule (`x86_cache`) sent
    // pn3t's 3-input pass to L2 on a 32 KB L1 and cost it 17% (27B `ffn_up`, DRAM, one thread,
    // Zen 4: 5.70-5.74 ms -> 6.70-6.71), while pn4t's gained 7% (9.40-9.63 -> 8.71-8.88).
    let level = PrefetchLevel::L1;
    let mut b = 0;
    while b < nb {
        let n = (nb - b).min(8);
        prefetch_ahead(p, b, n, ahead, level);
        let hv = if n == 8 {
            scales8(p, b)
        } else {
            let hs = scale_bits(p, b, n);
            _mm_loadu_si128(hs.as_ptr() as *const __m128i)
        };
        let dv = _mm256_cvtph_ps(hv);
        let mut ds = [[0f32; 8]; M];
        unroll!(m < M, {
            let dsx = _mm256_mul_ps(dv, _mm256_loadu_ps(a[m].sx.add(b)));
            t[m] = _mm256_fnmadd_ps(dsx, _mm256_loadu_ps(a[m].zq.add(b)), t[m]);
            _mm256_storeu_ps(ds[m].as_mut_ptr(), dsx);
        });
        // `i` indexes every vector's scale table inside the unrolled body.
        #[allow(clippy::needless_range_loop)]
        for i in 0..n {
            let bb = b + i;
            let w = _mm256_loadu_si256(words(p, bb) as *const __m256i);
            let mut c = [_mm256_setzero_si256(); S];
            unroll!(j < S, {
                c[j] = _mm256_and_si256(
                    _mm256_srl_epi32(w, _mm_cvtsi32_si128(BITS as i32 * j as i32)),
                    mask,
                );
            });
            let off = bb / 2 * S * 32 + (bb & 1) * 16;
            unroll!(m < M, {
                let x = a[m].xq.add(off);
                let mut acc = _mm256_setzero_si256();
                unroll!(j < S, {
                    let xj = _mm256_loadu_si256(x.add(32 * j) as *const __m256i);
                    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(c[j], xj));
                });
                t[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_set1_ps(ds[m][i]), t[m]);
            });
        }
        b += n;
    }
    unroll!(m < M, {
        out[m] = hsum256(t[m]);
    });
}

#[inline(always)]
unsafe fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

#[cfg(test)]
mod tests {
    //! The multishift and the shift variants (only one of which a CPU's dispatch takes, see
    //! `x86::shift_by_multishift`) against each other, bit for bit: the same f32 operations on
    //! exact integer sums.
    use super::*;
    use crate::dot::PreparedI16;
    use crate::quantize::quantize_row_ref;

    #[test]
    fn two_row_kernel_gives_the_one_row_kernels_bits() {
        if !std::arch::is_x86_feature_detected!("avx512bw") {
            return;
        }
        let vnni = std::arch::is_x86_feature_detected!("avx512vnni");
        let mut s = 0x1234_5678_9abc_def1u64;
        let mut next = || super::super::x86::tests::xorshift(&mut s);
        for ty in PnType::ALL {
            // Odd counts, a partial 16-block group and more than one group.
            for nb in [1, 2, 15, 17, 33, 48] {
                let k = nb * ty.weights_per_block();
                let rows: Vec<Vec<u8>> = (0..2)
                    .map(|_| {
                        let w: Vec<f32> = (0..k).map(|_| next()).collect();
                        quantize_row_ref(ty, &w).unwrap()
                    })
                    .collect();
                let acts: Vec<PreparedI16> = (0..PAIR_MAX_ACTS)
                    .map(|_| {
                        PreparedI16::new(ty, &(0..k).map(|_| 3.0 * next()).collect::<Vec<_>>())
                    })
                    .collect::<Result<_, _>>()
                    .unwrap();
                let ptrs: Vec<ActPtrs> = acts
                    .iter()
                    .map(|a| ActPtrs {
                        xq: a.xq.as_ptr(),
                        sx: a.sx.as_ptr(),
                        zq: a.zq.as_ptr(),
                    })
                    .collect();
                // Without VNNI (`vpmaddwd` + add) on every AVX-512 CPU, with it where present.
                for use_vnni in [false, vnni] {
                    for m in 1..=PAIR_MAX_ACTS {
                        let mut one = [[0f32; PAIR_MAX_ACTS]; 2];
                        let mut two = [[0f32; PAIR_MAX_ACTS]; 2];
                        let [t0, t1] = &mut two;
                        let rp = [rows[0].as_ptr(), rows[1].as_ptr()];
                        let a = &ptrs[..m];
                        // SAFETY: AVX-512BW (and VNNI where used) were checked; the rows hold
                        // `nb` blocks and the activations are padded.
                        unsafe {
                            let outs = [&mut t0[..m], &mut t1[..m]];
                            if use_vnni {
                                multi2_i16_avx512::<true>(ty, rp, rp, nb, a, outs);
                                for (r, o) in one.iter_mut().enumerate() {
                                    multi_i16_avx512::<true>(ty, rp[r], nb, a, &mut o[..m]);
                                }
                            } else {
                                multi2_i16_avx512::<false>(ty, rp, rp, nb, a, outs);
                                for (r, o) in one.iter_mut().enumerate() {
                                    multi_i16_avx512::<false>(ty, rp[r], nb, a, &mut o[..m]);
                                }
                            }
                        }
                        for r in 0..2 {
                            assert_eq!(
                                two[r].map(f32::to_bits),
                                one[r].map(f32::to_bits),
                                "{ty} nb {nb} m {m} row {r} vnni {use_vnni}"
                            );
                            assert!(two[r][..m].iter().all(|v| v.is_finite() && *v != 0.0));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn multishift_and_shift_variants_agree_bit_for_bit() {
        if !(std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vnni")
            && std::arch::is_x86_feature_detected!("avx512vbmi"))
        {
            return;
        }
        let mut s = 0x2545_f491_4f6c_dd1du64;
        let mut next = || super::super::x86::tests::xorshift(&mut s);
        for ty in PnType::ALL {
            for nb in [1, 15, 16, 17, 33] {
                let k = nb * ty.weights_per_block();
                let w: Vec<f32> = (0..k).map(|_| next()).collect();
                let row = quantize_row_ref(ty, &w).unwrap();
                let acts: Vec<PreparedI16> = (0..3)
                    .map(|_| PreparedI16::new(ty, &(0..k).map(|_| next()).collect::<Vec<_>>()))
                    .collect::<Result<_, _>>()
                    .unwrap();
                let ptrs: Vec<ActPtrs> = acts
                    .iter()
                    .map(|a| ActPtrs {
                        xq: a.xq.as_ptr(),
                        sx: a.sx.as_ptr(),
                        zq: a.zq.as_ptr(),
                    })
                    .collect();
                let (mut ms, mut sh) = ([0f32; 3], [0f32; 3]);
                // SAFETY: the features were checked above; the activations are padded.
                unsafe {
                    match ty {
                        PnType::Pn3t => {
                            vbmi512::<3, 5, 3>(row.as_ptr(), nb, &ptrs, &mut ms);
                            vnni512::<3, 5, 3>(row.as_ptr(), nb, &ptrs, &mut sh);
                        }
                        PnType::Pn4t => {
                            vbmi512::<4, 4, 3>(row.as_ptr(), nb, &ptrs, &mut ms);
                            vnni512::<4, 4, 3>(row.as_ptr(), nb, &ptrs, &mut sh);
                        }
                    }
                }
                assert_eq!(ms.map(f32::to_bits), sh.map(f32::to_bits), "{ty} nb {nb}");
                assert!(ms.iter().all(|v| v.is_finite() && *v != 0.0));
            }
        }
    }
}
