//! Launch geometry of the decode kernels (`kernels/pn_gemv.cu`, the Q4_K GEMV of
//! `kernels/quant_gemv.cu`): one definition used by the CUDA wrappers and by the host emulator
//! tests, so the emulator runs exactly the grids the device would.

/// Dynamic shared memory a block may use on sm_60 without an opt-in.
pub const SMEM_LIMIT: usize = 49152;
/// Streaming multiprocessors of the Tesla P100.
pub const P100_SMS: usize = 56;
/// Blocks of the row-looping GEMVs: a few per SM, so that x is staged a few hundred times per
/// call (not once per 8 rows) while every SM stays busy.
pub const GEMV_MAX_GRID: usize = 4 * P100_SMS;
/// Words of one warp's weight tile per row (32 pairs of 17 words, `PN_TILE_WORDS`).
pub const PN_TILE_WORDS: usize = 32 * 17;
/// Longest row the half2 PN kernels take: the padded fp16 copy of x plus one warp's weight tile
/// fit in 48 KB (23040 is a multiple of both block sizes, 64 and 80).
pub const PN_H2_MAX_K: usize = 23040;
/// Longest row of the Q4_K GEMV: x as f32 in 48 KB of shared memory.
pub const Q4K_MAX_K: usize = SMEM_LIMIT / 4;

/// Most blocks a launch grid has along y (and z).
pub const GRID_Y_LIMIT: usize = 65535;

/// Blocks on grid y (or z) for a kernel that strides over `count` rows (tokens) with
/// `for (t = blockIdx.y; t < count; t += gridDim.y)`: one block per row up to the grid limit
/// (review finding 8: a 16,384-token prefill chunk times the KV heads, or any chunk past 65,535
/// tokens, would otherwise fail to launch). At least 1.
pub fn grid_y_blocks(count: usize) -> u32 {
    count.clamp(1, GRID_Y_LIMIT) as u32
}

/// Largest k of the device top-k (`TK_MAX` in kernels/topk.cu).
pub const TOP_K_MAX: usize = 64;
/// Logits each block of `topk_partial_f32` takes (`TK_SLICE`).
pub const TOP_K_SLICE: usize = 4096;

/// Floats (and ints) of scratch the device top-k of `n` values needs: the `k` results first,
/// then the `ceil(n / TOP_K_SLICE) * k` per-block candidates.
pub fn top_k_scratch_len(n: usize, k: usize) -> usize {
    k + n.div_ceil(TOP_K_SLICE) * k
}

/// One launch: kernel name, grid (x), threads per block, dynamic shared memory in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    /// Kernel entry point.
    pub kernel: &'static str,
    /// Blocks (grid.x).
    pub grid: u32,
    /// Threads per block.
    pub threads: u32,
    /// Dynamic shared memory per block, bytes.
    pub smem: u32,
    /// Rows each warp computes at once.
    pub rows_per_warp: usize,
}

/// Words of the padded staged x of a PN half2 kernel (`pn_xs_words`): K/2 half2 plus one pad word
/// per pair of blocks (2 x 64 or 2 x 80 elements).
pub fn pn_xs_words(bits: u32, k: usize) -> usize {
    let w = if bits == 3 { 80 } else { 64 };
    k / 2 + (k / 2).div_ceil(w)
}

/// The half2 PN kernel for `n` rows of `k` columns (`bits` 3 or 4): the `even` kernels (coalesced
/// weight tiles) when rows have an even block count, two rows per warp from 4096 rows (or
/// `rows_override`), as many warps (up to 8) as shared memory allows; the `any` kernel otherwise.
/// None when `k` exceeds [`PN_H2_MAX_K`] or is not a multiple of the block size.
pub fn pn_h2(
    bits: u32,
    n: usize,
    k: usize,
    prepared: bool,
    rows_override: Option<usize>,
) -> Option<Launch> {
    let wpb = if bits == 3 { 80 } else { 64 };
    if n == 0 || k == 0 || !k.is_multiple_of(wpb) || k > PN_H2_MAX_K || !(3..=4).contains(&bits) {
        return None;
    }
    let even = (k / wpb).is_multiple_of(2);
    let stage = 4 * pn_xs_words(bits, k);
    // The self-staging kernels also hold 128 bytes of static shared memory (the amax scratch).
    let limit = SMEM_LIMIT - if prepared { 0 } else { 128 };
    let p = if prepared { "h2p" } else { "h2" };
    if !even {
        let warps = 8;
        return Some(Launch {
            kernel: name(bits, p, "any"),
            grid: n.div_ceil(warps).min(GEMV_MAX_GRID) as u32,
            threads: 32 * warps as u32,
            smem: stage as u32,
            rows_per_warp: 1,
        });
    }
    let mut rows = rows_override.unwrap_or(if n >= 4096 { 2 } else { 1 });
    let fit = |rows: usize| (limit - stage) / (rows * 4 * PN_TILE_WORDS);
    if rows == 2 && fit(2) == 0 {
        rows = 1;
    }
    let warps = fit(rows).min(8);
    if warps == 0 || !(1..=2).contains(&rows) {
        return None;
    }
    Some(Launch {
        kernel: name(bits, p, if rows == 2 { "r2" } else { "r1" }),
        grid: n.div_ceil(warps * rows).min(GEMV_MAX_GRID) as u32,
        threads: 32 * warps as u32,
        smem: (stage + warps * rows * 4 * PN_TILE_WORDS) as u32,
        rows_per_warp: rows,
    })
}

fn name(bits: u32, p: &str, v: &str) -> &'static str {
    match (bits, p, v) {
        (3, "h2", "r1") => "pn3t_gemv_h2_r1",
        (3, "h2", "r2") => "pn3t_gemv_h2_r2",
        (3, "h2", _) => "pn3t_gemv_h2_any",
        (3, _, "r1") => "pn3t_gemv_h2p_r1",
        (3, _, "r2") => "pn3t_gemv_h2p_r2",
        (3, _, _) => "pn3t_gemv_h2p_any",
        (_, "h2", "r1") => "pn4t_gemv_h2_r1",
        (_, "h2", "r2") => "pn4t_gemv_h2_r2",
        (_, "h2", _) => "pn4t_gemv_h2_any",
        (_, _, "r1") => "pn4t_gemv_h2p_r1",
        (_, _, "r2") => "pn4t_gemv_h2p_r2",
        _ => "pn4t_gemv_h2p_any",
    }
}

/// The Q4_K GEMV: 8 warps, x staged in shared memory (`k` floats), row-looping grid. None when
/// `k` exceeds [`Q4K_MAX_K`] or is not a multiple of 256.
pub fn q4_k(n: usize, k: usize) -> Option<Launch> {
    if n == 0 || k == 0 || !k.is_multiple_of(256) || k > Q4K_MAX_K {
        return None;
    }
    Some(Launch {
        kernel: "q4_k_gemv_f32",
        grid: n.div_ceil(8).min(GEMV_MAX_GRID) as u32,
        threads: 256,
        smem: (4 * k) as u32,
        rows_per_warp: 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_27b_shapes_fit_and_take_the_coalesced_kernels() {
        for (bits, n, k) in [
            (3, 10240, 5120),
            (4, 5120, 6144),
            (4, 5120, 17408),
            (4, 17408, 5120),
        ] {
            let l = pn_h2(bits, n, k, true, None).unwrap();
            assert!(
                l.kernel.ends_with("_r1") || l.kernel.ends_with("_r2"),
                "{l:?}"
            );
            assert!(l.smem as usize + 128 <= SMEM_LIMIT, "{l:?}");
            assert!(l.threads >= 64, "{l:?}");
        }
        assert!(pn_h2(4, 8, PN_H2_MAX_K, false, None).is_some());
        assert!(pn_h2(4, 8, PN_H2_MAX_K + 64, false, None).is_none());
        assert!(pn_h2(3, 8, PN_H2_MAX_K + 80, false, None).is_none());
        assert_eq!(q4_k(248_320, 5120).unwrap().grid as usize, GEMV_MAX_GRID);
    }
}
