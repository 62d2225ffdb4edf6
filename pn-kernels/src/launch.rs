//! Launch geometry of the decode kernels (`kernels/pn_gemv.cu`, the Q4_K GEMV of
//! `kernels/quant_gemv.cu`, the small-batch stock GEMVs of `kernels/q4k_batch.cu`): one
//! definition used by the CUDA wrappers and by the host emulator tests, so the emulator runs
//! exactly the grids the device would.

mod quant_batch;
pub use quant_batch::{
    q4_k_batch, q4_k_batch_rows, q4_k_batch_x_bytes, q8_0_batch, QuantBatchLaunch,
};

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

/// Largest activation batch of the small-batch PN kernels (`pn*_gemv_h2p_b2` .. `_b8`).
pub const PN_BATCH_MAX_T: usize = 8;

/// A launch of a small-batch PN kernel: the geometry, the activation rows, and the pairs of x
/// staged per phase (`XP`, the kernel's last argument: 32 / `xp` phases per 32-pair chunk).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchLaunch {
    /// Grid, threads, dynamic shared memory (x chunk + one weight tile per warp).
    pub launch: Launch,
    /// Activation rows (2..=8).
    pub t: usize,
    /// Pairs of blocks whose x (all `t` rows) one phase stages: 32, 16, 8 or 4.
    pub xp: usize,
    /// Row groups (of one row per warp) a block computes per staged x chunk, 1..=
    /// [`PN_BATCH_G`] (the kernel's last argument `G`).
    pub groups: usize,
}

/// Most row groups the small-batch PN kernel shares one staged x chunk between (`PN_BATCH_G`
/// in pn_gemv.cu).
pub const PN_BATCH_G: usize = 4;

/// Row groups per staged x of the small-batch PN kernel (one-phase chunks, `xp` = 32) for `n`
/// rows on `warps` warps: as many as
/// [`PN_BATCH_G`] while the launch keeps two blocks' worth of work per SM (x is then read from
/// L2 once per `groups x warps` weight rows instead of once per `warps`).
fn batch_groups(n: usize, warps: usize) -> usize {
    (n.div_ceil(warps) / (2 * P100_SMS)).clamp(1, PN_BATCH_G)
}

impl BatchLaunch {
    /// Bytes of staged x the launch reads from L2 for `n` weight rows of `k`: each set of
    /// `groups` row groups stages all `t` rows of x (fp16) once when a chunk is one phase
    /// (`xp` = 32); with several phases every row group of every set restages it (the last
    /// set too, rows past `n` included: the barriers need the whole block).
    pub fn x_l2_bytes(&self, n: usize, k: usize) -> u64 {
        let sets = n
            .div_ceil(self.launch.threads as usize / 32)
            .div_ceil(self.groups);
        let stagings = if self.xp == 32 {
            sets
        } else {
            sets * self.groups
        };
        (stagings * self.t * k * 2) as u64
    }
}

/// The small-batch PN kernel for `t` (2..=8) activation rows times `n` weight rows of `k`
/// columns (`bits` 3 or 4): x prepared by `pn_prepare_x_h2` (one block per row). The widest x
/// chunk (`xp` pairs) that leaves room for at least 4 warps' weight tiles, with up to 8 warps;
/// [`BatchLaunch::groups`] row groups per staged chunk.
/// Any `k` (x is staged in K-chunks). None when rows have an odd block count (the caller falls
/// back to one single-row GEMV per activation row) or the shape is empty.
pub fn pn_batch(bits: u32, t: usize, n: usize, k: usize) -> Option<BatchLaunch> {
    let wpb = if bits == 3 { 80 } else { 64 };
    if n == 0 || k == 0 || !k.is_multiple_of(2 * wpb) || !(3..=4).contains(&bits) {
        return None;
    }
    if !(2..=PN_BATCH_MAX_T).contains(&t) || k > i32::MAX as usize || n > i32::MAX as usize {
        return None;
    }
    let tile = 4 * PN_TILE_WORDS;
    for xp in [32usize, 16, 8, 4] {
        let stage = 4 * t * xp * (wpb + 1);
        let warps = SMEM_LIMIT.saturating_sub(stage) / tile;
        if warps >= 4 {
            let warps = warps.min(8);
            // Row groups share a staged chunk only when it is one phase (pn_gemv.cu).
            let groups = if xp == 32 { batch_groups(n, warps) } else { 1 };
            return Some(BatchLaunch {
                launch: Launch {
                    kernel: batch_name(bits, t),
                    grid: n.div_ceil(warps).div_ceil(groups).min(GEMV_MAX_GRID) as u32,
                    threads: 32 * warps as u32,
                    smem: (stage + warps * tile) as u32,
                    rows_per_warp: 1,
                },
                t,
                xp,
                groups,
            });
        }
    }
    None
}

fn batch_name(bits: u32, t: usize) -> &'static str {
    const P3: [&str; 7] = [
        "pn3t_gemv_h2p_b2",
        "pn3t_gemv_h2p_b3",
        "pn3t_gemv_h2p_b4",
        "pn3t_gemv_h2p_b5",
        "pn3t_gemv_h2p_b6",
        "pn3t_gemv_h2p_b7",
        "pn3t_gemv_h2p_b8",
    ];
    const P4: [&str; 7] = [
        "pn4t_gemv_h2p_b2",
        "pn4t_gemv_h2p_b3",
        "pn4t_gemv_h2p_b4",
        "pn4t_gemv_h2p_b5",
        "pn4t_gemv_h2p_b6",
        "pn4t_gemv_h2p_b7",
        "pn4t_gemv_h2p_b8",
    ];
    if bits == 3 {
        P3[t - 2]
    } else {
        P4[t - 2]
    }
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

    #[test]
    fn the_small_batch_kernel_fits_every_27b_shape_and_batch() {
        for (bits, n, k) in [
            (3, 10240, 5120),
            (4, 5120, 6144),
            (4, 5120, 17408),
            (4, 17408, 5120),
        ] {
            for t in 2..=PN_BATCH_MAX_T {
                let b = pn_batch(bits, t, n, k).unwrap();
                assert!(b.launch.smem as usize <= SMEM_LIMIT, "{b:?}");
                assert!((128..=256).contains(&b.launch.threads), "{b:?}");
                assert!(32 % b.xp == 0 && b.xp >= 4, "{b:?}");
                assert!(b.launch.kernel.ends_with(&format!("_b{t}")), "{b:?}");
            }
            // The MTP verify (draft 2: 3 rows) keeps every lane busy (one phase).
            assert_eq!(pn_batch(bits, 3, n, k).unwrap().xp, 32);
            // Wide matrices share each staged x between the most row groups.
            let b = pn_batch(bits, 3, n, k).unwrap();
            assert_eq!(b.groups, PN_BATCH_G, "{b:?}");
            assert!(b.launch.grid as usize >= P100_SMS, "{b:?}");
        }
        // Odd block counts and out-of-range batches are refused.
        assert!(pn_batch(4, 2, 8, 64 * 3).is_none());
        assert!(pn_batch(4, 1, 8, 5120).is_none());
        assert!(pn_batch(4, 9, 8, 5120).is_none());
        // Narrow matrices (the attention K/V projections, 1024 rows) keep one group per
        // staging, so the grid still covers the SMs twice.
        let kv = pn_batch(3, 3, 1024, 5120).unwrap();
        assert_eq!((kv.groups, kv.launch.grid), (1, 128), "{kv:?}");
    }
}

/// Most matrices one grouped PN GEMV launch takes (`PN_GROUP_MAX` in `pn_gemv.cu`).
pub const PN_GROUP_MAX: usize = 4;

/// The grouped PN GEMV (`pn_gemv_h2p_group`): matrices that read one prepared x in one launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupLaunch {
    /// Blocks: the members' grids side by side.
    pub grid: u32,
    /// Threads per block (every member's).
    pub threads: u32,
    /// Dynamic shared memory: the largest member's.
    pub smem: u32,
    /// Per member: 0 pn3t r1, 1 pn3t r2, 2 pn4t r1, 3 pn4t r2.
    pub kinds: Vec<i32>,
    /// Per member its first block; then the grid (`members + 1` entries).
    pub first: Vec<i32>,
}

/// The grouped launch for `members` (`(bits, n)` each, one K for all): each member's own
/// prepared launch ([`pn_h2`]) must be an even-block kernel (`r1` / `r2`) with the same block
/// size; 2..=[`PN_GROUP_MAX`] members. None otherwise (run them one launch each).
/// `rows_override` as [`pn_h2`]'s (tests: two rows per warp on small matrices).
pub fn pn_group(
    members: &[(u32, usize)],
    k: usize,
    rows_override: Option<usize>,
) -> Option<GroupLaunch> {
    if !(2..=PN_GROUP_MAX).contains(&members.len()) {
        return None;
    }
    let mut g = GroupLaunch {
        grid: 0,
        threads: 0,
        smem: 0,
        kinds: Vec::new(),
        first: vec![0],
    };
    for &(bits, n) in members {
        let l = pn_h2(bits, n, k, true, rows_override)?;
        if l.kernel.ends_with("any") || (g.threads != 0 && l.threads != g.threads) {
            return None;
        }
        g.threads = l.threads;
        g.smem = g.smem.max(l.smem);
        g.kinds
            .push(if bits == 4 { 2 } else { 0 } + i32::from(l.rows_per_warp == 2));
        g.grid = g.grid.checked_add(l.grid)?;
        g.first.push(i32::try_from(g.grid).ok()?);
    }
    Some(g)
}
