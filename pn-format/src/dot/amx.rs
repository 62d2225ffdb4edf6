//! The AMX kernel of [`super::tiles`]: 16 weight rows x 16 input rows per tile pass.
//!
//! Per 16-row tile of weights, the codes are unpacked once (AVX-512BW: shift, mask, subtract
//! the zero point, narrow to signed bytes) into `A` tiles, `[block][row 16][kk]` with
//! `kk = 16 j + l`, and the block scales into `d[block][row 16]`. Then for each group of 16
//! inputs and each block, two K-halves of `8 S` bytes: `tdpbssd` (codes x the signed high byte
//! of `q`) and `tdpbsud` (codes x the unsigned low byte) into two int32 tiles, which AVX-512
//! combines and scales into 16 f32 accumulators of 16 inputs each.
//!
//! The tile registers are used in `asm!` only (the compiler never touches them); the tile
//! configuration is loaded at the start of [`matmul`] and released at its end, with no call in
//! between that could use AMX.

use super::tiles::{TileActs, TILE};
use super::x86_multi::codes512;
use crate::types::{PnType, BLOCK_BYTES};
use std::arch::asm;
use std::arch::x86_64::*;

/// Asks the kernel for the AMX tile data state (Linux `arch_prctl(ARCH_REQ_XCOMP_PERM,
/// XFEATURE_XTILEDATA)`) after checking CPUID for AMX-TILE and AMX-INT8; false if either fails.
pub fn request() -> bool {
    // CPUID leaf 7 exists on every x86-64 CPU that has AVX-512 (checked by the caller).
    let leaf7 = __cpuid_count(7, 0);
    let (tile, int8) = (leaf7.edx >> 24 & 1 == 1, leaf7.edx >> 25 & 1 == 1);
    if !(tile && int8 && cfg!(target_os = "linux")) {
        return false;
    }
    const SYS_ARCH_PRCTL: usize = 158;
    const ARCH_REQ_XCOMP_PERM: usize = 0x1023;
    const XFEATURE_XTILEDATA: usize = 18;
    let ret: isize;
    // SAFETY: a plain Linux system call; it only changes this process's permitted xsave state.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL as isize => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret == 0
}

/// The 64-byte tile configuration (palette 1).
#[repr(C, align(64))]
pub(super) struct TileConfig {
    pub(super) palette: u8,
    pub(super) start_row: u8,
    pub(super) reserved: [u8; 14],
    pub(super) colsb: [u16; 16],
    pub(super) rows: [u8; 16],
}

/// Weight rows per pass (one row tile: the two result tiles, the codes and the two byte tiles of
/// `q` take five of the eight tile registers).
const PASS: usize = TILE;

/// 16 x 16 int32 results, aligned for the tile store and the vector loads.
#[repr(C, align(64))]
struct Acc([i32; TILE * TILE]);

/// `outs[t][r] = dot(row r, acts[t])`.
///
/// # Safety
/// AMX-TILE, AMX-INT8 and AVX-512BW are available and the tile state was granted
/// ([`request`]); `weights` holds `rows` rows of `nb` blocks of `ty`; `acts` was built for `nb`
/// blocks of `ty`; `outs` holds `acts.n_rows()` slices of `rows` values.
pub unsafe fn matmul(
    ty: PnType,
    weights: &[u8],
    rows: usize,
    nb: usize,
    acts: &TileActs,
    outs: &mut [&mut [f32]],
) {
    match ty {
        PnType::Pn3t => kernel::<3, 5>(weights, rows, nb, acts, outs),
        PnType::Pn4t => kernel::<4, 4>(weights, rows, nb, acts, outs),
    }
}

thread_local! {
    /// Per-thread unpacked codes of one 16-row tile (`[block][row][kk]`) and its scales
    /// (`[block][row]`); grows to the longest row seen, never shrinks.
    pub(super) static SCRATCH: std::cell::RefCell<(Vec<u8>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
unsafe fn kernel<const BITS: u32, const S: usize>(
    weights: &[u8],
    rows: usize,
    nb: usize,
    acts: &TileActs,
    outs: &mut [&mut [f32]],
) {
    let bpw = 16 * S;
    let half = 8 * S;
    let rb = nb * BLOCK_BYTES;
    let n_in = acts.n_rows();
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        let (a, d) = &mut *s;
        a.resize(nb * PASS * bpw, 0);
        d.resize(nb * PASS, 0.0);
        let (h16, w64, wk) = (16u8, 64u16, half as u16);
        let b_rows = (2 * S) as u8;
        let cfg = TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            // tmm0..1: int32 results per byte of `q` (16 x 64 bytes); tmm3: codes (16 x 8S
            // bytes); tmm4..5: the bytes of `q` (2S x 64 bytes).
            colsb: [w64, w64, 0, wk, w64, w64, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            rows: [
                h16, h16, 0, h16, b_rows, b_rows, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            ],
        };
        asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly));
        // Results for the high and low byte of `q`.
        let mut c = [Acc([0; TILE * TILE]), Acc([0; TILE * TILE])];
        for r0 in (0..rows).step_by(PASS) {
            let nr = PASS.min(rows - r0);
            unpack::<BITS, S>(&weights[r0 * rb..(r0 + nr) * rb], nr, nb, a, d, PASS);
            for g in 0..n_in.div_ceil(TILE) {
                let mut f = [_mm512_setzero_ps(); PASS];
                for b in 0..nb {
                    let gb = g * nb + b;
                    let ap = a.as_ptr().add(b * PASS * bpw);
                    let at = gb * TILE * bpw;
                    let (ph, pl) = (
                        acts.hi.as_ptr().add(at) as *const u8,
                        acts.lo.as_ptr().add(at),
                    );
                    let cp = c.as_mut_ptr() as *mut i32;
                    // The two K halves of the block, each: codes x the two bytes of `q`.
                    asm!(
                        "tilezero tmm0",
                        "tilezero tmm1",
                        "tileloadd tmm3, [{a} + {sa}*1]",
                        "tileloadd tmm4, [{ph} + {sb}*1]",
                        "tileloadd tmm5, [{pl} + {sb}*1]",
                        "tdpbssd tmm0, tmm3, tmm4",
                        "tdpbsud tmm1, tmm3, tmm5",
                        "tileloadd tmm3, [{a2} + {sa}*1]",
                        "tileloadd tmm4, [{qh} + {sb}*1]",
                        "tileloadd tmm5, [{ql} + {sb}*1]",
                        "tdpbssd tmm0, tmm3, tmm4",
                        "tdpbsud tmm1, tmm3, tmm5",
                        "tilestored [{c} + {sb}*1], tmm0",
                        "tilestored [{c} + {sb}*1 + 1024], tmm1",
                        a = in(reg) ap,
                        a2 = in(reg) ap.add(half),
                        ph = in(reg) ph,
                        pl = in(reg) pl,
                        qh = in(reg) ph.add(half * TILE),
                        ql = in(reg) pl.add(half * TILE),
                        sa = in(reg) bpw,
                        sb = in(reg) 64usize,
                        c = in(reg) cp,
                        options(nostack),
                    );
                    let sx = _mm512_loadu_ps(acts.sx.as_ptr().add(gb * TILE));
                    let db = d.as_ptr().add(b * PASS);
                    for (r, fr) in f.iter_mut().enumerate() {
                        let at = r * TILE;
                        let planes = [0, 1].map(|p| c[p].0.as_ptr().add(at));
                        *fr = accumulate(planes, *db.add(r), sx, *fr);
                    }
                }
                write_rows(&f, nr, r0, g, outs);
            }
        }
        asm!("tilerelease", options(nostack, nomem));
    });
}

/// Writes one pass's row accumulators for input group `g`: `f[r]` holds the results of weight
/// row `r0 + r` (the first `nr` of them real) for inputs `16 g..16 g + 16` (those below
/// `outs.len()` real) into `outs[input][row]`.
#[inline(always)]
pub(super) unsafe fn write_rows(
    f: &[__m512],
    nr: usize,
    r0: usize,
    g: usize,
    outs: &mut [&mut [f32]],
) {
    let mut vals = [0f32; TILE];
    let n_in = outs.len();
    for (r, fr) in f.iter().enumerate().take(nr) {
        _mm512_storeu_ps(vals.as_mut_ptr(), *fr);
        for (n, &v) in vals.iter().enumerate().take(n_in - g * TILE) {
            outs[g * TILE + n][r0 + r] = v;
        }
    }
}

/// `f + (256 hi + lo) * d * sx` for one weight row's 16 int32 block sums per byte plane of `q`
/// (`planes`: high, low; 64-byte aligned), its block scale `d` and the 16 inputs' scales `sx`.
#[inline(always)]
pub(super) unsafe fn accumulate(planes: [*const i32; 2], d: f32, sx: __m512, f: __m512) -> __m512 {
    let [hi, lo] = planes.map(|p| _mm512_load_si512(p as *const _));
    // Exact in int32 and in f32: |256 c1 + c0| = |sum (n - z) q| <= 80 * 4 * 32767 < 2^24.
    let v = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32::<8>(hi), lo));
    _mm512_fmadd_ps(v, _mm512_mul_ps(_mm512_set1_ps(d), sx), f)
}

/// Unpacks `nr <= pass` rows of `nb` blocks into `a` (`[block][row pass][kk]`, rows past `nr`
/// zero) and their scales into `d` (`[block][row pass]`).
#[inline(always)]
pub(super) unsafe fn unpack<const BITS: u32, const S: usize>(
    rows: &[u8],
    nr: usize,
    nb: usize,
    a: &mut [u8],
    d: &mut [f32],
    pass: usize,
) {
    let bpw = 16 * S;
    let rb = nb * BLOCK_BYTES;
    let ap = a.as_mut_ptr();
    for r in 0..pass {
        if r >= nr {
            for b in 0..nb {
                std::ptr::write_bytes(ap.add((b * pass + r) * bpw), 0, bpw);
                d[b * pass + r] = 0.0;
            }
            continue;
        }
        let p = rows.as_ptr().add(r * rb);
        let mut b = 0;
        while b < nb {
            let w0 = _mm256_loadu_si256(p.add(BLOCK_BYTES * b + 2) as *const __m256i);
            let w = if b + 1 < nb {
                let w1 = _mm256_loadu_si256(p.add(BLOCK_BYTES * (b + 1) + 2) as *const __m256i);
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(w0), w1)
            } else {
                _mm512_zextsi256_si512(w0)
            };
            let c = codes512::<BITS, S, false>(w);
            let z = _mm512_set1_epi16(1 << (BITS - 1));
            for (j, cj) in c.iter().enumerate() {
                // `n - z` as signed bytes; lanes 0..16 (even block) to bytes 0..16, lanes
                // 16..32 (odd block) above.
                let bytes = _mm512_cvtepi16_epi8(_mm512_sub_epi16(*cj, z));
                _mm_storeu_si128(
                    ap.add((b * pass + r) * bpw + 16 * j) as *mut __m128i,
                    _mm256_castsi256_si128(bytes),
                );
                if b + 1 < nb {
                    _mm_storeu_si128(
                        ap.add(((b + 1) * pass + r) * bpw + 16 * j) as *mut __m128i,
                        _mm256_extracti128_si256::<1>(bytes),
                    );
                }
            }
            b += 2;
        }
        let mut b = 0;
        while b < nb {
            let n = (nb - b).min(16);
            let mut hs = [0u16; 16];
            for (i, h) in hs.iter_mut().enumerate().take(n) {
                *h = std::ptr::read_unaligned(p.add(BLOCK_BYTES * (b + i)) as *const u16);
            }
            let mut ds = [0f32; 16];
            _mm512_storeu_ps(
                ds.as_mut_ptr(),
                _mm512_cvtph_ps(_mm256_loadu_si256(hs.as_ptr() as *const __m256i)),
            );
            for (i, &v) in ds.iter().enumerate().take(n) {
                d[(b + i) * pass + r] = v;
            }
            b += n;
        }
    }
}
