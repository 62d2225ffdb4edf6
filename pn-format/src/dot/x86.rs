//! x86-64 kernels (AVX2+FMA+F16C and AVX-512 F/BW, optionally VNNI) for the prepared dot products.
//!
//! All loads are unaligned: a block's words sit at `34*b + 2`, 4-byte aligned only in odd blocks.
//! Block scales are converted 16 (or 8) at a time with `vcvtph2ps` into a small table.
//!
//! Safety contract of every function here: the CPU supports the enabled features, `row` holds
//! `nb` blocks, the activation buffers hold `nb` blocks (i16: rounded up to an even count) and the
//! per-block tables are zero-padded to a multiple of 16 blocks.

use super::x86_cache::{prefetch_level, PrefetchLevel};
use crate::types::{PnType, BLOCK_BYTES};
use std::arch::x86_64::*;

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

// ---------------------------------------------------------------- f32 activations

pub unsafe fn dot_f32_avx512(ty: PnType, row: &[u8], xs: &[f32], zsum: &[f32], nb: usize) -> f32 {
    match ty {
        PnType::Pn3t => f32_avx512::<3, 5>(row, xs, zsum, nb),
        PnType::Pn4t => f32_avx512::<4, 4>(row, xs, zsum, nb),
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
unsafe fn f32_avx512<const BITS: u32, const S: usize>(
    row: &[u8],
    xs: &[f32],
    zsum: &[f32],
    nb: usize,
) -> f32 {
    let p = row.as_ptr();
    let xp = xs.as_ptr();
    let (mut t0, mut t1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut corr = _mm512_setzero_ps();
    let mut b = 0;
    while b < nb {
        let n = (nb - b).min(16);
        let hs = scale_bits(p, b, n);
        let dv = _mm512_cvtph_ps(_mm256_loadu_si256(hs.as_ptr() as *const __m256i));
        corr = _mm512_fmadd_ps(dv, _mm512_loadu_ps(zsum.as_ptr().add(b)), corr);
        let mut ds = [0f32; 16];
        _mm512_storeu_ps(ds.as_mut_ptr(), dv);
        // Two accumulators in named locals (an indexed array would live in memory).
        let mut i = 0;
        while i + 1 < n {
            let a0 = f32_block_avx512::<BITS, S>(p, xp, b + i);
            let a1 = f32_block_avx512::<BITS, S>(p, xp, b + i + 1);
            t0 = _mm512_fmadd_ps(a0, _mm512_set1_ps(ds[i]), t0);
            t1 = _mm512_fmadd_ps(a1, _mm512_set1_ps(ds[i + 1]), t1);
            i += 2;
        }
        if i < n {
            let a0 = f32_block_avx512::<BITS, S>(p, xp, b + i);
            t0 = _mm512_fmadd_ps(a0, _mm512_set1_ps(ds[i]), t0);
        }
        b += n;
    }
    _mm512_reduce_add_ps(_mm512_add_ps(t0, t1)) - _mm512_reduce_add_ps(corr)
}

/// `sum(n * x)` of block `b` in 16 lanes (low-half codes in lanes 0..8, high-half in 8..16).
#[inline(always)]
unsafe fn f32_block_avx512<const BITS: u32, const S: usize>(
    p: *const u8,
    xp: *const f32,
    b: usize,
) -> __m512 {
    let mask = (1i32 << BITS) - 1;
    // Low half of the broadcast words in lanes 0..8, high half shifted down in lanes 8..16.
    let halves = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 16, 16, 16, 16, 16, 16, 16, 16);
    let w = _mm512_broadcast_i64x4(_mm256_loadu_si256(words(p, b) as *const __m256i));
    let w = _mm512_srlv_epi32(w, halves);
    let x = xp.add(b * S * 16);
    let c0 = _mm512_cvtepi32_ps(_mm512_and_si512(w, _mm512_set1_epi32(mask)));
    let mut acc = _mm512_mul_ps(c0, _mm512_loadu_ps(x));
    for j in 1..S {
        let m = _mm512_set1_epi32(mask << (BITS as usize * j));
        let c = _mm512_cvtepi32_ps(_mm512_and_si512(w, m));
        acc = _mm512_fmadd_ps(c, _mm512_loadu_ps(x.add(16 * j)), acc);
    }
    acc
}

pub unsafe fn dot_f32_avx2(ty: PnType, row: &[u8], xs: &[f32], zsum: &[f32], nb: usize) -> f32 {
    match ty {
        PnType::Pn3t => f32_avx2::<3, 5>(row, xs, zsum, nb),
        PnType::Pn4t => f32_avx2::<4, 4>(row, xs, zsum, nb),
    }
}

#[inline(always)]
unsafe fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f32_avx2<const BITS: u32, const S: usize>(
    row: &[u8],
    xs: &[f32],
    zsum: &[f32],
    nb: usize,
) -> f32 {
    let p = row.as_ptr();
    let xp = xs.as_ptr();
    let (mut t0, mut t1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut corr = _mm256_setzero_ps();
    let mut b = 0;
    while b < nb {
        let n = (nb - b).min(8);
        let hs = scale_bits(p, b, n);
        let dv = _mm256_cvtph_ps(_mm_loadu_si128(hs.as_ptr() as *const __m128i));
        corr = _mm256_fmadd_ps(dv, _mm256_loadu_ps(zsum.as_ptr().add(b)), corr);
        let mut ds = [0f32; 8];
        _mm256_storeu_ps(ds.as_mut_ptr(), dv);
        let mut i = 0;
        while i + 1 < n {
            let a0 = f32_block_avx2::<BITS, S>(p, xp, b + i);
            let a1 = f32_block_avx2::<BITS, S>(p, xp, b + i + 1);
            t0 = _mm256_fmadd_ps(a0, _mm256_set1_ps(ds[i]), t0);
            t1 = _mm256_fmadd_ps(a1, _mm256_set1_ps(ds[i + 1]), t1);
            i += 2;
        }
        if i < n {
            let a0 = f32_block_avx2::<BITS, S>(p, xp, b + i);
            t0 = _mm256_fmadd_ps(a0, _mm256_set1_ps(ds[i]), t0);
        }
        b += n;
    }
    hsum256(_mm256_add_ps(t0, t1)) - hsum256(corr)
}

/// `sum(n * x)` of block `b` in 8 lanes.
#[inline(always)]
unsafe fn f32_block_avx2<const BITS: u32, const S: usize>(
    p: *const u8,
    xp: *const f32,
    b: usize,
) -> __m256 {
    let mask = (1i32 << BITS) - 1;
    let lo = _mm256_loadu_si256(words(p, b) as *const __m256i);
    let hi = _mm256_srli_epi32::<16>(lo);
    let x = xp.add(b * S * 16);
    let m = _mm256_set1_epi32(mask);
    let mut a0 = _mm256_mul_ps(
        _mm256_cvtepi32_ps(_mm256_and_si256(lo, m)),
        _mm256_loadu_ps(x),
    );
    let mut a1 = _mm256_mul_ps(
        _mm256_cvtepi32_ps(_mm256_and_si256(hi, m)),
        _mm256_loadu_ps(x.add(8)),
    );
    for j in 1..S {
        let m = _mm256_set1_epi32(mask << (BITS as usize * j));
        let xj = x.add(16 * j);
        a0 = _mm256_fmadd_ps(
            _mm256_cvtepi32_ps(_mm256_and_si256(lo, m)),
            _mm256_loadu_ps(xj),
            a0,
        );
        a1 = _mm256_fmadd_ps(
            _mm256_cvtepi32_ps(_mm256_and_si256(hi, m)),
            _mm256_loadu_ps(xj.add(8)),
            a1,
        );
    }
    _mm256_add_ps(a0, a1)
}

// ---------------------------------------------------------------- int16 activations

/// The AVX-512 decode kernel (with `VNNI`, `vpdpwssd`), or the AVX2 one where
/// [`decode_prefers_256`] says so.
pub unsafe fn dot_i16_avx512<const VNNI: bool>(
    ty: PnType,
    row: &[u8],
    xq: &[i16],
    sx: &[f32],
    zq: &[f32],
    nb: usize,
) -> f32 {
    if decode_prefers_256() {
        return dot_i16_avx2(ty, row, xq, sx, zq, nb);
    }
    match (ty, VNNI, VNNI && shift_by_multishift()) {
        (PnType::Pn3t, true, true) => i16_avx512_vbmi::<3, 5>(row, xq, sx, zq, nb),
        (PnType::Pn4t, true, true) => i16_avx512_vbmi::<4, 4>(row, xq, sx, zq, nb),
        (PnType::Pn3t, true, false) => i16_avx512_vnni::<3, 5>(row, xq, sx, zq, nb),
        (PnType::Pn4t, true, false) => i16_avx512_vnni::<4, 4>(row, xq, sx, zq, nb),
        (PnType::Pn3t, false, _) => i16_avx512_bw::<3, 5>(row, xq, sx, zq, nb),
        (PnType::Pn4t, false, _) => i16_avx512_bw::<4, 4>(row, xq, sx, zq, nb),
    }
}

/// Whether the CPU has AVX-512 VBMI (`vpmultishiftqb`): every VNNI core from Ice Lake on, not
/// Cascade Lake, so it is a variant of the VNNI level rather than a level of its own.
pub fn has_vbmi() -> bool {
    static VBMI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *VBMI.get_or_init(|| std::arch::is_x86_feature_detected!("avx512vbmi"))
}

/// Whether the decode kernels move code fields with `vpmultishiftqb` (VBMI) rather than
/// 16-bit shifts. On Intel cores a shift and `vpdpwssd` share one port, so the multishift,
/// which runs on another, wins. On Zen 5 it is the other way round: `vpmultishiftqb`,
/// `vpdpwssd` and FMA share two pipes while `vpsrlw` runs beside them (measured, 8 independent
/// `vpdpwssd` with 8 more ops: 4.3 cycles alone, 4.4 with `vpsrlw`, 7.7 with `vpmultishiftqb`).
pub fn shift_by_multishift() -> bool {
    has_vbmi() && !is_amd()
}

/// Multiply-accumulate of 32 i16 code/activation pairs into 16 i32 lanes.
#[inline(always)]
unsafe fn madd512<const VNNI: bool>(acc: __m512i, c: __m512i, x: __m512i) -> __m512i {
    if VNNI {
        // Not `_mm512_dpwssd_epi32`: LLVM splits that into `vpmaddwd` + `vpaddd` for a generic
        // target (see `x86_multi::dpwssd_asm`).
        super::x86_multi::dpwssd_asm(acc, c, x)
    } else {
        _mm512_add_epi32(acc, _mm512_madd_epi16(c, x))
    }
}

/// How far ahead of the blocks being multiplied the weights are prefetched, in bytes, on
/// Intel cores. Without it the hardware prefetcher let the loads wait on the next level (L3 or
/// DRAM) between bursts of arithmetic, so the kernel ran at about `1 / (1/compute + 1/read)`
/// instead of the slower of the two (measured: 5.1 GB/s against 14.5 GB/s in L2 and an 8.6 GB/s
/// read). Rows follow each other in a matrix, so prefetching past the end of a row fetches the
/// next row. 2 KiB rather than 4 on Sapphire Rapids: farther ahead, the prefetched lines of a
/// 27B matrix streaming from DRAM were partly evicted or late (`pn_decode` bench, DRAM ring,
/// 1 thread, alternated: AVX-512 pn3t 4.67/4.64 ms at 4 KiB, 3.59/3.55 at 2 KiB, 3.50/3.55 at
/// 1.5 KiB, 3.78/3.79 at 1 KiB, 5.11/4.98 at 8 KiB; pn4t 4.56/4.49 -> 3.98/3.77; the whole 27B
/// decode, 2 threads: 1.35/1.34 -> 1.54/1.53 tokens/s).
pub(super) const PREFETCH_BYTES: usize = 2048;

/// The prefetch distance on AMD cores. One Zen 5 core reads about 30 GB/s from DRAM, three
/// times a Sapphire Rapids core, so 2 KiB ahead is only ~65 ns of lead, less than a DRAM
/// access: the pn4t kernel then ran at the sum of its compute and read times (`pn_decode`,
/// DRAM ring, 1 thread, Zen 5, four alternated runs: pn4t 3.11-3.61 ms at 2 KiB, 2.14-2.48 at
/// 6 KiB, 2.39-2.65 at 8 KiB; pn3t 1.59-2.05 -> 1.51-1.90).
pub(super) const PREFETCH_BYTES_AMD: usize = 6144;

/// The prefetch distance on Emerald Rapids (Intel family 6, model 0xCF). Unlike Sapphire
/// Rapids (see [`PREFETCH_BYTES`]), 2 KiB is too short there: from DRAM the kernels waited on
/// their loads (`pn_decode`, DRAM ring, 2 vCPUs of an Emerald Rapids Xeon, four alternated runs of 2 and
/// 4 KiB, `read time / kernel time`, 1 / 2 threads: AVX-512 pn3t 0.90/0.89 -> 0.94/0.92, AVX2
/// pn3t 0.86/0.83 -> 0.89/0.87, AVX-512 pn4t 0.93/0.94 -> 0.95/0.94, AVX2 pn4t 0.91/0.90 ->
/// 0.93/0.93; 3 and 6 KiB within the noise of 4, 8 KiB slower; the whole 27B decode, `pn
/// bench -n 16 --spec none -t 2`, alternated: 1.55-1.71 tokens/s at 2 KiB, 1.60-1.74 at 4).
pub(super) const PREFETCH_BYTES_EMR: usize = 4096;

/// The prefetch distance in bytes: `PN_PREFETCH_BYTES` if set (for tuning on a new machine),
/// else [`PREFETCH_BYTES_AMD`] on AMD, [`PREFETCH_BYTES_EMR`] on Emerald Rapids and
/// [`PREFETCH_BYTES`] elsewhere.
pub fn prefetch_bytes() -> usize {
    static BYTES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BYTES.get_or_init(|| {
        let env = std::env::var("PN_PREFETCH_BYTES").ok();
        match env.and_then(|v| v.parse::<usize>().ok()) {
            Some(b) => b.min(1 << 16),
            None if is_amd() => PREFETCH_BYTES_AMD,
            None if is_emerald_rapids() => PREFETCH_BYTES_EMR,
            None => PREFETCH_BYTES,
        }
    })
}

/// Whether the AVX-512 levels' int16 decode kernel hands over to the AVX2 one:
/// `PN_DECODE_256=1` or `0` forces it either way (A/B runs, a new CPU); otherwise on Zen 4 (AMD
/// family 0x19 with AVX-512; Zen 3, the same family, has none).
///
/// Zen 4 splits every 512-bit operation into two 256-bit halves, so the 512-bit kernel does no
/// more work per cycle there, and from DRAM its pn4t kernel was 1.4-1.7x slower than the AVX2
/// one (27B `ffn_down`, K = 17408, `pn_decode` DRAM ring, one thread, alternated: 4.2-4.9 ms
/// against 2.6-3.1; pn3t `ffn_up` even within the noise). The whole 27B decode (`pn bench -n 16
/// --spec none`, alternated): 2 threads 2.11-2.25 tokens/s against 1.88-1.94 (three pairs of
/// runs, quiet), 1.64-1.80 against 1.48-1.72 (three more, noisy); 1 thread 1.15-1.18 against
/// 0.98-1.04.
pub fn decode_prefers_256() -> bool {
    static MODE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *MODE.get_or_init(|| match std::env::var("PN_DECODE_256").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => is_zen4(),
    })
}

/// Whether this is an AMD family 0x19 core with AVX-512, that is Zen 4 (read once, by
/// [`decode_prefers_256`]).
fn is_zen4() -> bool {
    is_amd() && amd_family() == 0x19 && std::arch::is_x86_feature_detected!("avx512f")
}

/// The CPU's family from CPUID leaf 1: the base family, plus the extended family when the base
/// is 0xf (every AMD core since K8).
fn amd_family() -> u32 {
    let eax = __cpuid(1).eax;
    let base = (eax >> 8) & 0xf;
    if base == 0xf {
        base + ((eax >> 20) & 0xff)
    } else {
        base
    }
}

/// Whether this is an Intel Emerald Rapids core: family 6, display model 0xCF (the extended
/// model in bits 16..20 of CPUID leaf 1's `eax`, the base model in bits 4..8).
fn is_emerald_rapids() -> bool {
    !is_amd() && intel_family_model(__cpuid(1).eax) == (6, 0xcf)
}

/// Intel's display family and model from CPUID leaf 1's `eax`: the extended model (bits
/// 16..20) is the model's high nibble for families 6 and 15.
fn intel_family_model(eax: u32) -> (u32, u32) {
    let family = (eax >> 8) & 0xf;
    let base = (eax >> 4) & 0xf;
    let model = if family == 6 || family == 0xf {
        ((eax >> 12) & 0xf0) | base
    } else {
        base
    };
    (family, model)
}

/// Whether the CPU is an AMD one (CPUID vendor "AuthenticAMD"): its ports differ from Intel's
/// where the kernels care (see [`shift_by_multishift`] and [`prefetch_bytes`]).
pub fn is_amd() -> bool {
    static AMD: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AMD.get_or_init(|| {
        // Leaf 0 exists on every x86-64 CPU.
        let r = __cpuid(0);
        let mut v = [0u8; 12];
        v[..4].copy_from_slice(&r.ebx.to_le_bytes());
        v[4..8].copy_from_slice(&r.edx.to_le_bytes());
        v[8..].copy_from_slice(&r.ecx.to_le_bytes());
        &v == b"AuthenticAMD"
    })
}

/// Prefetches the cache lines of `n` blocks starting at block `b` plus `ahead` bytes into
/// `level` (the caller reads [`prefetch_bytes`] and chooses the level once per row, not per
/// group).
#[inline(always)]
pub(super) unsafe fn prefetch_ahead(
    p: *const u8,
    b: usize,
    n: usize,
    ahead: usize,
    level: PrefetchLevel,
) {
    // `wrapping_add`: the address may lie past the end of the slice (a prefetch never faults).
    let start = p.wrapping_add(BLOCK_BYTES * b + ahead);
    let mut off = 0;
    while off < BLOCK_BYTES * n {
        let line = start.wrapping_add(off) as *const i8;
        match level {
            PrefetchLevel::L1 => _mm_prefetch::<_MM_HINT_T0>(line),
            PrefetchLevel::L2 => _mm_prefetch::<_MM_HINT_T1>(line),
        }
        off += 64;
    }
}

/// Prefetches (into L1) every cache line of `[start, start + len)`: a hint, so the range may lie
/// outside any allocation.
pub(super) fn prefetch_range(start: *const u8, len: usize) {
    let mut off = 0;
    while off < len {
        // SAFETY: a prefetch never faults, whatever the address; SSE is baseline on x86-64.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(off) as *const i8) };
        off += 64;
    }
}

/// Whether the AVX-512 kernels read the 16 scales of a block group with one gather
/// ([`scales16`]): `PN_SCALE_GATHER=1` or `0` forces it either way (A/B runs, a new CPU);
/// otherwise on Intel. There the 16 inserts of the other way are 15 shuffle-port operations per
/// group, on the port that the multishifts and permutes of the kernels also need; the gather's
/// loads go to the load ports. Weights in L2 (`cargo run --release -p pn-format --example
/// kernel_cpu`, Emerald Rapids, two alternated runs each): the AVX-512 decode kernel's pn3t
/// 14.56-14.58 -> 15.13 B/ns, pn4t 18.00 -> 18.15-18.17 B/ns; the three-vector kernel within
/// 1%. Not measured on AMD, where the inserts stay.
pub fn scales_by_gather() -> bool {
    static MODE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *MODE.get_or_init(|| match std::env::var("PN_SCALE_GATHER").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => !is_amd(),
    })
}

/// Sixteen consecutive block scales (raw fp16) starting at block `b`, as one vector: one gather
/// of the 16 scales' dwords (each the scale and the first two code bytes; the last ends inside
/// block `b + 15`) narrowed to 16 bits when `gather` ([`scales_by_gather`]; the callers are
/// AVX-512F code), else each a scalar load inserted in a register: a table on the stack read
/// back as a vector would stall on store forwarding (measured: the scale table was most of the
/// kernel's time).
#[inline(always)]
pub(super) unsafe fn scales16(p: *const u8, b: usize, gather: bool) -> __m256i {
    if gather {
        // Byte offsets of the 16 blocks' scales.
        let idx = _mm512_setr_epi32(
            0, 34, 68, 102, 136, 170, 204, 238, 272, 306, 340, 374, 408, 442, 476, 510,
        );
        let dwords = _mm512_i32gather_epi32::<1>(idx, p.add(BLOCK_BYTES * b) as *const i32);
        return _mm512_cvtepi32_epi16(dwords);
    }
    let h = |i: usize| std::ptr::read_unaligned(p.add(BLOCK_BYTES * (b + i)) as *const u16) as i16;
    _mm256_setr_epi16(
        h(0),
        h(1),
        h(2),
        h(3),
        h(4),
        h(5),
        h(6),
        h(7),
        h(8),
        h(9),
        h(10),
        h(11),
        h(12),
        h(13),
        h(14),
        h(15),
    )
}

/// Eight consecutive block scales (raw fp16) starting at block `b` (see [`scales16`]).
#[inline(always)]
pub(super) unsafe fn scales8(p: *const u8, b: usize) -> __m128i {
    let h = |i: usize| std::ptr::read_unaligned(p.add(BLOCK_BYTES * (b + i)) as *const u16) as i16;
    _mm_setr_epi16(h(0), h(1), h(2), h(3), h(4), h(5), h(6), h(7))
}

/// The `multishift` control that moves every 16-bit half of a word right by `shift` bits: byte
/// `i` of each qword takes the 8 bits that start at bit `8i + shift` (the odd bytes, the high
/// bytes of the halves, are masked off after).
#[inline(always)]
unsafe fn half_shift_ctl(shift: u32) -> __m512i {
    let ctl = (0..8).fold(0u64, |c, i| c | (u64::from(8 * i + shift) & 63) << (8 * i));
    _mm512_set1_epi64(ctl as i64)
}

/// `sum(n * q)` of blocks `b` (lanes 0..8) and `b + 1` (lanes 8..16), in i32 lanes; with
/// `ONE`, only block `b` (the upper half is zero: the padding activations are 0 anyway).
///
/// Pair `j` of every word is `(w >> BITS*j) & mask` in each 16-bit half. With `MS` (VBMI on
/// Intel cores, see [`shift_by_multishift`]) the shift is a `vpmultishiftqb`, which runs on
/// another port than `vpdpwssd` there (a shift and the multiply-add share one port on Intel
/// cores, and that port was the bottleneck). The last pair of a pn4t word needs no mask: a
/// 16-bit shift by 12 leaves exactly the top nibble.
#[inline(always)]
unsafe fn pair_acc_avx512<
    const BITS: u32,
    const S: usize,
    const VNNI: bool,
    const MS: bool,
    const ONE: bool,
>(
    p: *const u8,
    xp: *const i16,
    b: usize,
) -> __m512i {
    let mask = _mm512_set1_epi32(((1i32 << BITS) - 1) * 0x10001);
    let w0 = _mm256_loadu_si256(words(p, b) as *const __m256i);
    let w = if ONE {
        _mm512_zextsi256_si512(w0)
    } else {
        let w1 = _mm256_loadu_si256(words(p, b + 1) as *const __m256i);
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(w0), w1)
    };
    let x = xp.add(b / 2 * S * 32);
    // Two integer chains (even and odd slots): a pair's slots are otherwise one chain of `S`
    // dependent multiply-adds (4 cycles each on Zen 5), longer than the out-of-order window
    // hides. Integer sums are exact in any order.
    let mut accs = [_mm512_setzero_si512(); 2];
    for j in 0..S {
        let sh = BITS * j as u32;
        let c = if j == 0 {
            _mm512_and_si512(w, mask)
        } else if BITS * (j as u32 + 1) == 16 {
            _mm512_srl_epi16(w, _mm_cvtsi32_si128(sh as i32))
        } else if MS {
            _mm512_and_si512(_mm512_multishift_epi64_epi8(half_shift_ctl(sh), w), mask)
        } else {
            // 16-bit shifts (each half holds its own codes): `vpsrlw` runs beside `vpdpwssd`
            // on Zen 5, `vpsrld` partly does not.
            _mm512_and_si512(_mm512_srl_epi16(w, _mm_cvtsi32_si128(sh as i32)), mask)
        };
        accs[j & 1] = madd512::<VNNI>(
            accs[j & 1],
            c,
            _mm512_loadu_si512(x.add(32 * j) as *const _),
        );
    }
    _mm512_add_epi32(accs[0], accs[1])
}

/// The body shared by the VNNI and plain AVX-512BW versions (inlined into each).
#[inline(always)]
unsafe fn i16_avx512_body<const BITS: u32, const S: usize, const VNNI: bool, const MS: bool>(
    row: &[u8],
    xq: &[i16],
    sx: &[f32],
    zq: &[f32],
    nb: usize,
) -> f32 {
    let p = row.as_ptr();
    let xp = xq.as_ptr();
    let ahead = prefetch_bytes();
    let level = prefetch_level(2 * S * 16 * nb, ahead);
    let gather = scales_by_gather();
    // Two f32 accumulators, even and odd pairs: one FMA per pair into a single accumulator
    // is a dependency chain of 4 cycles per pair on Zen 5, which was most of pn4t's time
    // (5.8 cycles per pair with the weights in L2).
    let mut t0 = _mm512_setzero_ps();
    let mut t1 = _mm512_setzero_ps();
    let mut corr = _mm512_setzero_ps();
    // Lanes 0..8 take scale 2k, lanes 8..16 scale 2k + 1 (pair k of a 16-block group).
    let first = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    let two = _mm512_set1_epi32(2);
    let four = _mm512_set1_epi32(4);
    let mut b = 0;
    // Whole groups of 16 blocks: scales in one vector, spread to each pair by a permute.
    while b + 16 <= nb {
        prefetch_ahead(p, b, 16, ahead, level);
        let dv = _mm512_cvtph_ps(scales16(p, b, gather));
        let dsx = _mm512_mul_ps(dv, _mm512_loadu_ps(sx.as_ptr().add(b)));
        corr = _mm512_fmadd_ps(dsx, _mm512_loadu_ps(zq.as_ptr().add(b)), corr);
        let mut idx = first;
        for k in 0..4 {
            let a0 = pair_acc_avx512::<BITS, S, VNNI, MS, false>(p, xp, b + 4 * k);
            let a1 = pair_acc_avx512::<BITS, S, VNNI, MS, false>(p, xp, b + 4 * k + 2);
            t0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a0), _mm512_permutexvar_ps(idx, dsx), t0);
            let idx1 = _mm512_add_epi32(idx, two);
            t1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a1), _mm512_permutexvar_ps(idx1, dsx), t1);
            idx = _mm512_add_epi32(idx, four);
        }
        b += 16;
    }
    t0 = _mm512_add_ps(t0, t1);
    // The last partial group (at most 15 blocks), through a small table.
    if b < nb {
        let n = nb - b;
        let hs = scale_bits(p, b, n);
        let dv = _mm512_cvtph_ps(_mm256_loadu_si256(hs.as_ptr() as *const __m256i));
        let dsx = _mm512_mul_ps(dv, _mm512_loadu_ps(sx.as_ptr().add(b)));
        corr = _mm512_fmadd_ps(dsx, _mm512_loadu_ps(zq.as_ptr().add(b)), corr);
        let mut idx = first;
        let mut i = 0;
        while i + 1 < n {
            let a = pair_acc_avx512::<BITS, S, VNNI, MS, false>(p, xp, b + i);
            t0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_permutexvar_ps(idx, dsx), t0);
            idx = _mm512_add_epi32(idx, two);
            i += 2;
        }
        if i < n {
            let a = pair_acc_avx512::<BITS, S, VNNI, MS, true>(p, xp, b + i);
            t0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_permutexvar_ps(idx, dsx), t0);
        }
    }
    _mm512_reduce_add_ps(t0) - _mm512_reduce_add_ps(corr)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn i16_avx512_vnni<const BITS: u32, const S: usize>(
    row: &[u8],
    xq: &[i16],
    sx: &[f32],
    zq: &[f32],
    nb: usize,
) -> f32 {
    i16_avx512_body::<BITS, S, true, false>(row, xq, sx, zq, nb)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi,avx2,fma,f16c")]
unsafe fn i16_avx512_vbmi<const BITS: u32, const S: usize>(
    row: &[u8],
    xq: &[i16],
    sx: &[f32],
    zq: &[f32],
    nb: usize,
) -> f32 {
    i16_avx512_body::<BITS, S, true, true>(row, xq, sx, zq, nb)
}

/// The plain AVX-512BW int16 kernel (also the int8 kernel's reference in its tests).
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(super) unsafe fn i16_avx512_bw<const BITS: u32, const S: usize>(
    row: &[u8],
    xq: &[i16],
    sx: &[f32],
    zq: &[f32],
    nb: usize,
) -> f32 {
    i16_avx512_body::<BITS, S, false, false>(row, xq, sx, zq, nb)
}

pub unsafe fn dot_i16_avx2(
    ty: PnType,
    row: &[u8],
    xq: &[i16],
    sx: &[f32],
    zq: &[f32],
    nb: usize,
) -> f32 {
    match ty {
        PnType::Pn3t => i16_avx2::<3, 5>(row, xq, sx, zq, nb),
        PnType::Pn4t => i16_avx2::<4, 4>(row, xq, sx, zq, nb),
    }
}

/// `sum(n * q)` of block `bb` in 8 i32 lanes.
#[inline(always)]
unsafe fn block_acc_avx2<const BITS: u32, const S: usize>(
    p: *const u8,
    xp: *const i16,
    bb: usize,
) -> __m256i {
    let mask = _mm256_set1_epi32(((1i32 << BITS) - 1) * 0x10001);
    let w = _mm256_loadu_si256(words(p, bb) as *const __m256i);
    let x = xp.add(bb / 2 * S * 32 + (bb & 1) * 16);
    // Two accumulators: the adds of the even and odd pairs run in parallel.
    let (mut a0, mut a1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
    for j in 0..S {
        let sh = _mm_cvtsi32_si128(BITS as i32 * j as i32);
        // As in `pair_acc_avx512`: pn4t's last pair is a bare 16-bit shift.
        let c = if BITS * (j as u32 + 1) == 16 {
            _mm256_srl_epi16(w, sh)
        } else {
            _mm256_and_si256(_mm256_srl_epi16(w, sh), mask)
        };
        let xj = _mm256_loadu_si256(x.add(32 * j) as *const __m256i);
        if j % 2 == 0 {
            a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(c, xj));
        } else {
            a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(c, xj));
        }
    }
    _mm256_add_epi32(a0, a1)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn i16_avx2<const BITS: u32, const S: usize>(
    row: &[u8],
    xq: &[i16],
    sx: &[f32],
    zq: &[f32],
    nb: usize,
) -> f32 {
    let p = row.as_ptr();
    let xp = xq.as_ptr();
    let ahead = prefetch_bytes();
    let level = prefetch_level(2 * S * 16 * nb, ahead);
    // Two accumulators, even and odd blocks: with one, the FMA latency (4 cycles) per 34-byte
    // block capped the kernel at about 31 GB/s on Zen 5, one core's DRAM read.
    let mut t0 = _mm256_setzero_ps();
    let mut t1 = _mm256_setzero_ps();
    let mut corr = _mm256_setzero_ps();
    let mut b = 0;
    // Whole groups of 8 blocks: scales in one vector (no table on the stack).
    while b + 8 <= nb {
        prefetch_ahead(p, b, 8, ahead, level);
        let dv = _mm256_cvtph_ps(scales8(p, b));
        let dsx = _mm256_mul_ps(dv, _mm256_loadu_ps(sx.as_ptr().add(b)));
        corr = _mm256_fmadd_ps(dsx, _mm256_loadu_ps(zq.as_ptr().add(b)), corr);
        for i in (0..8).step_by(2) {
            let a0 = block_acc_avx2::<BITS, S>(p, xp, b + i);
            let a1 = block_acc_avx2::<BITS, S>(p, xp, b + i + 1);
            let d0 = _mm256_permutevar8x32_ps(dsx, _mm256_set1_epi32(i as i32));
            let d1 = _mm256_permutevar8x32_ps(dsx, _mm256_set1_epi32(i as i32 + 1));
            t0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a0), d0, t0);
            t1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a1), d1, t1);
        }
        b += 8;
    }
    t0 = _mm256_add_ps(t0, t1);
    if b < nb {
        let n = nb - b;
        let hs = scale_bits(p, b, n);
        let dv = _mm256_cvtph_ps(_mm_loadu_si128(hs.as_ptr() as *const __m128i));
        let dsx = _mm256_mul_ps(dv, _mm256_loadu_ps(sx.as_ptr().add(b)));
        corr = _mm256_fmadd_ps(dsx, _mm256_loadu_ps(zq.as_ptr().add(b)), corr);
        let mut ds = [0f32; 8];
        _mm256_storeu_ps(ds.as_mut_ptr(), dsx);
        for (i, &d) in ds.iter().enumerate().take(n) {
            let a = block_acc_avx2::<BITS, S>(p, xp, b + i);
            t0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a), _mm256_set1_ps(d), t0);
        }
    }
    hsum256(t0) - hsum256(corr)
}

#[cfg(test)]
pub(super) mod tests {
    //! The AVX-512 decode kernel has variants that a given CPU does not all take (the
    //! multishift one on Intel, the shift one on AMD, the BW one without VNNI): each one that
    //! this CPU can run is checked here against the others, which must agree bit for bit (the
    //! integer sums are exact and the f32 operations the same), and against the scalar kernel;
    //! and the dispatcher's hand-over to the AVX2 kernel (Zen 4) runs one of them.
    use super::*;
    use crate::dot::{scalar, PreparedI16};
    use crate::quantize::quantize_row_ref;

    /// A uniform value in [-1, 1) from an xorshift64 state (the kernel tests' generator).
    pub(in crate::dot) fn xorshift(s: &mut u64) -> f32 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        (*s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    #[test]
    fn scale_gather_reads_what_the_inserts_read() {
        if !std::arch::is_x86_feature_detected!("avx512bw") {
            return;
        }
        #[target_feature(enable = "avx512f,avx512bw,avx2")]
        unsafe fn both(p: *const u8, b: usize) -> ([u16; 16], [u16; 16]) {
            let (mut g, mut i) = ([0u16; 16], [0u16; 16]);
            _mm256_storeu_si256(g.as_mut_ptr() as *mut __m256i, scales16(p, b, true));
            _mm256_storeu_si256(i.as_mut_ptr() as *mut __m256i, scales16(p, b, false));
            (g, i)
        }
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        // 40 blocks of random bytes at every alignment: groups at blocks 0..=24, so the last
        // group's gather ends 2 bytes into the row's last block.
        let bytes: Vec<u8> = (0..40 * BLOCK_BYTES + 3)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                s as u8
            })
            .collect();
        for offset in 0..4 {
            let row = &bytes[offset..offset + 40 * BLOCK_BYTES];
            for b in 0..=24 {
                // SAFETY: AVX-512BW checked; blocks `b..b + 16` lie inside `row`.
                let (g, i) = unsafe { both(row.as_ptr(), b) };
                let want: Vec<u16> = (b..b + 16)
                    .map(|k| u16::from_le_bytes([row[k * BLOCK_BYTES], row[k * BLOCK_BYTES + 1]]))
                    .collect();
                assert_eq!(g.to_vec(), want, "gather, offset {offset} block {b}");
                assert_eq!(i.to_vec(), want, "inserts, offset {offset} block {b}");
            }
        }
    }

    #[test]
    fn intel_models_decode_from_cpuid() {
        // Signatures (CPUID leaf 1 `eax`) of an Emerald Rapids, a Sapphire Rapids, a Broadwell
        // Xeon and a Pentium 4 (family 15 keeps its extended model too).
        assert_eq!(intel_family_model(0x000c_06f2), (6, 0xcf));
        assert_eq!(intel_family_model(0x0008_06f8), (6, 0x8f));
        assert_eq!(intel_family_model(0x0004_06f1), (6, 0x4f));
        assert_eq!(intel_family_model(0x0000_0f29), (0xf, 0x2));
        assert_eq!(intel_family_model(0x0001_0f41), (0xf, 0x14));
    }

    #[test]
    fn avx512_variants_agree_bit_for_bit() {
        if !(is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw")) {
            return;
        }
        let vnni = is_x86_feature_detected!("avx512vnni");
        let vbmi = vnni && has_vbmi();
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        for ty in PnType::ALL {
            for nb in [1, 2, 3, 15, 16, 17, 31, 33, 48, 50] {
                let k = nb * ty.weights_per_block();
                let w: Vec<f32> = (0..k).map(|_| xorshift(&mut s)).collect();
                // One row of real blocks, one of all-maximum codes (the widest products).
                let mut rows = vec![quantize_row_ref(ty, &w).unwrap()];
                let mut max = rows[0].clone();
                for b in 0..nb {
                    let fill = if ty == PnType::Pn3t { 0x7fff } else { 0xffff };
                    for h in max[b * BLOCK_BYTES + 2..(b + 1) * BLOCK_BYTES].chunks_mut(2) {
                        h.copy_from_slice(&u16::to_le_bytes(fill));
                    }
                }
                rows.push(max);
                let x: Vec<f32> = (0..k).map(|_| 4.0 * xorshift(&mut s)).collect();
                let a = PreparedI16::new(ty, &x).unwrap();
                let (xq, sx, zq) = (&a.xq, &a.sx, &a.zq);
                for row in &rows {
                    let reference = scalar::dot_i16(ty, row, xq, sx, zq);
                    // SAFETY: the features were checked above; `a` is padded as documented.
                    let bw = unsafe {
                        match ty {
                            PnType::Pn3t => i16_avx512_bw::<3, 5>(row, xq, sx, zq, nb),
                            PnType::Pn4t => i16_avx512_bw::<4, 4>(row, xq, sx, zq, nb),
                        }
                    };
                    let tol = 1e-5 * (reference.abs() + 1.0);
                    assert!(
                        (bw - reference).abs() <= tol,
                        "{ty} nb {nb}: {bw} vs {reference}"
                    );
                    if vnni {
                        let bits = |n: usize| match (ty, n) {
                            // SAFETY: as above, and VNNI/VBMI were checked.
                            (PnType::Pn3t, 0) => unsafe {
                                i16_avx512_vnni::<3, 5>(row, xq, sx, zq, nb)
                            },
                            (PnType::Pn4t, 0) => unsafe {
                                i16_avx512_vnni::<4, 4>(row, xq, sx, zq, nb)
                            },
                            (PnType::Pn3t, _) => unsafe {
                                i16_avx512_vbmi::<3, 5>(row, xq, sx, zq, nb)
                            },
                            (PnType::Pn4t, _) => unsafe {
                                i16_avx512_vbmi::<4, 4>(row, xq, sx, zq, nb)
                            },
                        };
                        assert_eq!(bits(0).to_bits(), bw.to_bits(), "{ty} nb {nb}: shifts");
                        if vbmi {
                            assert_eq!(bits(1).to_bits(), bw.to_bits(), "{ty} nb {nb}: multishift");
                        }
                    }
                    if vnni {
                        // The dispatcher runs one of the checked kernels: the AVX2 one where it
                        // hands over (Zen 4), else the 512-bit one.
                        // SAFETY: as above (AVX-512 implies AVX2, FMA and F16C here).
                        let (chosen, avx2) = unsafe {
                            (
                                dot_i16_avx512::<true>(ty, row, xq, sx, zq, nb),
                                dot_i16_avx2(ty, row, xq, sx, zq, nb),
                            )
                        };
                        // Every 512-bit variant gives `bw`'s bits (checked above).
                        let want = if decode_prefers_256() { avx2 } else { bw };
                        assert_eq!(chosen.to_bits(), want.to_bits(), "{ty} nb {nb}: dispatch");
                    }
                }
            }
        }
    }
}
