//! The walk over a PN matrix shared by the lane-parallel tile kernels (`tiles_vnni`,
//! `tiles_avx2`: the 16 inputs of a group in vector lanes, each weight row's code quads
//! broadcast): K panels of blocks whose activations stay in L2, in each panel passes of `R`
//! weight rows, in each pass chunks of [`CHUNK`] blocks unpacked once into bytes (with the block
//! scales as f32) while every group of inputs then walks the chunk. The next chunk's weights
//! are prefetched into L2 before the groups run on this one.

use crate::types::BLOCK_BYTES;
use std::arch::x86_64::*;

/// Blocks unpacked per pass before the input groups walk them: `R x CHUNK x 80` bytes of codes
/// (20 KiB for 8 rows) stay in L1 while every group passes.
pub(super) const CHUNK: usize = 32;

/// Most code bytes per block (pn3t).
pub(super) const MAX_BPW: usize = 80;

/// Bytes of activations (every plane, every group) one K panel keeps: the panel is walked once
/// per pass of weight rows, so it should stay in L2 (1 MiB on Zen 4/5, 1.25-2 MiB on Intel)
/// while the weights stream through it. Without panels, `ffn_down`'s 64 x 17408 activations
/// (2.2 MB) came from L3 on every pass (`pn_tiled` bench, one thread, VNNI int16: pn4t 43.1 ms
/// against 40.0 with 512 KiB panels); a third of L2 rather than most of it because the
/// weights, the unpacked codes and the sums share it (27B-shaped pp64, 2 threads, alternated
/// on a noisy hour: 8.96 and 9.68 t/s at 320 KiB against 7.58 and 9.38 at 768 KiB).
const PANEL_BYTES: usize = 384 * 1024;

/// Blocks per K panel for `groups` groups of 16 inputs of `planes` byte planes (`bpw` bytes
/// each per input and block): a whole number of chunks, at least one.
pub(super) fn panel_blocks(bpw: usize, groups: usize, planes: usize) -> usize {
    let per_block = groups * planes * bpw * super::TILE;
    (PANEL_BYTES / per_block / CHUNK).max(1) * CHUNK
}

/// The unpacked chunk of one pass: per row of the pass and block of the chunk, the codes in
/// the kernel's slot order (`[row][block][slot][4]`) and the block scale.
#[repr(C, align(64))]
pub(super) struct Chunk<const R: usize> {
    pub(super) scales: [[f32; CHUNK]; R],
    pub(super) codes: [[[u8; MAX_BPW]; CHUNK]; R],
}

impl<const R: usize> Chunk<R> {
    pub(super) fn new() -> Self {
        Chunk {
            codes: [[[0; MAX_BPW]; CHUNK]; R],
            scales: [[0.0; CHUNK]; R],
        }
    }
}

/// A kernel's unpacker: the codes of block `b` of the row at `row` into the 80 bytes at `out`,
/// in the kernel's slot order. A type rather than a closure so that it inlines into the
/// kernel's `#[target_feature]` function (a closure of an `#[inline(always)]` function without
/// one is compiled without the features: its intrinsics became calls, 50x slower).
pub(super) trait Unpack {
    /// # Safety
    /// The CPU has the kernel's features; `row` holds block `b`; `out` has 80 bytes.
    unsafe fn unpack(row: *const u8, b: usize, out: *mut u8);
}

/// A walk over a matrix for a lane-parallel tile kernel: the chunk to unpack next.
pub(super) struct Walk {
    rows: usize,
    nb: usize,
    panel: usize,
    /// Passes of `R` rows per panel.
    passes: usize,
    /// First block of the current panel.
    k0: usize,
    pass: usize,
    b0: usize,
}

impl Walk {
    /// A walk over `rows` rows of `nb` blocks in panels of `panel` blocks and passes of `r`
    /// rows.
    pub(super) fn new(rows: usize, nb: usize, panel: usize, r: usize) -> Walk {
        Walk {
            rows,
            nb,
            panel: panel.max(1),
            passes: rows.div_ceil(r),
            k0: 0,
            pass: 0,
            b0: 0,
        }
    }

    /// Unpacks the next chunk into `chunk` (by `U`) and returns `(pass, b0, nbc)`: the pass's
    /// rows (`R pass ..`) and blocks `b0 .. b0 + nbc` of the current panel; `None` after the
    /// last. Chunks come panel by panel, pass by pass within a panel, in block order within a
    /// pass. Rows past the end get zero codes and scales. The following chunk's weights are
    /// prefetched into L2 (unpacked straight from DRAM, the chunk's loads stalled the unpack:
    /// a fifth of the VNNI kernel's time in the 27B-shaped pp64 profile).
    ///
    /// # Safety
    /// `weights` holds `rows` rows of `nb` blocks; the CPU has `U`'s features and F16C.
    #[inline(always)]
    pub(super) unsafe fn next<U: Unpack, const R: usize>(
        &mut self,
        weights: &[u8],
        chunk: &mut Chunk<R>,
    ) -> Option<(usize, usize, usize)> {
        let (rows, nb) = (self.rows, self.nb);
        if self.k0 >= nb || rows == 0 {
            return None;
        }
        let rb = nb * BLOCK_BYTES;
        let k1 = nb.min(self.k0 + self.panel);
        let (pass, b0) = (self.pass, self.b0);
        let r0 = pass * R;
        let nr = R.min(rows - r0);
        let nbc = CHUNK.min(k1 - b0);
        let p = weights.as_ptr();
        let rows_of_chunk = chunk.codes.iter_mut().zip(chunk.scales.iter_mut());
        for (r, (row_codes, row_scales)) in rows_of_chunk.enumerate() {
            let (row_codes, row_scales) = (&mut row_codes[..nbc], &mut row_scales[..nbc]);
            if r >= nr {
                // Rows past the end: zero codes and scales (their sums are never written).
                row_codes.iter_mut().for_each(|c| c.fill(0));
                row_scales.fill(0.0);
                continue;
            }
            let row = p.add((r0 + r) * rb);
            for (i, (c, d)) in row_codes.iter_mut().zip(row_scales).enumerate() {
                U::unpack(row, b0 + i, c.as_mut_ptr());
                let h = std::ptr::read_unaligned(row.add(BLOCK_BYTES * (b0 + i)) as *const u16);
                *d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h))));
            }
        }
        // Advance: the next chunk of this pass, else the next pass of this panel, else the
        // next panel.
        if b0 + CHUNK < k1 {
            self.b0 = b0 + CHUNK;
        } else if pass + 1 < self.passes {
            (self.pass, self.b0) = (pass + 1, self.k0);
        } else {
            (self.k0, self.pass, self.b0) = (k1, 0, k1);
        }
        if self.k0 < nb {
            let next_nbc = CHUNK.min(nb.min(self.k0 + self.panel) - self.b0);
            let next_r0 = self.pass * R;
            for r in next_r0..rows.min(next_r0 + R) {
                let start = p.add(r * rb + self.b0 * BLOCK_BYTES);
                let mut off = 0;
                while off < next_nbc * BLOCK_BYTES {
                    _mm_prefetch::<_MM_HINT_T1>(start.add(off) as *const i8);
                    off += 64;
                }
            }
        }
        Some((pass, b0, nbc))
    }
}

/// An unpacker under test: `(type, row, block, out)`.
#[cfg(test)]
pub(super) type UnpackFn = dyn Fn(crate::PnType, &[u8], usize, &mut [u8; MAX_BPW]);

/// Test support: checks an unpacker against the format for every bit pattern (reserved bits
/// set too: an unpack must never read them into a code) at odd and even block offsets
/// (unaligned words): slot `s` of its output must hold the four codes of tile quad
/// `slot_quad(s)` (tile position `kk = 16 j + l`: lane `l`, pair `j`).
#[cfg(test)]
pub(super) fn check_unpacker(name: &str, slot_quad: fn(usize) -> usize, unpack: &UnpackFn) {
    use crate::PnType;
    let code = |ty: PnType, words: &[u8], kk: usize| {
        let (j, l) = (kk / 16, kk % 16);
        let w = u32::from_le_bytes(words[4 * (l / 2)..4 * (l / 2) + 4].try_into().unwrap());
        let shift = ty.bits() * j as u32 + 16 * (l % 2) as u32;
        ((w >> shift) & u32::from(ty.max_code())) as u8
    };
    let mut s = 0x1234_5678_9abc_def0u64;
    let mut row = [0u8; 3 * BLOCK_BYTES];
    for round in 0..200 {
        for v in row.iter_mut() {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            *v = s as u8;
        }
        if round == 0 {
            row.fill(0xff);
        }
        for ty in PnType::ALL {
            let slots = ty.weights_per_block() / 4;
            for b in 0..3 {
                let words = &row[BLOCK_BYTES * b + 2..BLOCK_BYTES * (b + 1)];
                let want: Vec<u8> = (0..slots)
                    .flat_map(|s| (0..4).map(move |lq| 4 * slot_quad(s) + lq))
                    .map(|kk| code(ty, words, kk))
                    .collect();
                let mut got = [0u8; MAX_BPW];
                unpack(ty, &row, b, &mut got);
                assert_eq!(&got[..4 * slots], &want[..], "{name} {ty} block {b}");
            }
        }
    }
}
