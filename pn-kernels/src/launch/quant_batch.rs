//! Launch geometry of the small-batch stock GEMVs (`kernels/q4k_batch.cu`): the Q4_K head and
//! the Q8_0 matrices at 2..=8 activation rows (the MTP verify, batched decode).

use super::{Launch, GEMV_MAX_GRID, PN_BATCH_MAX_T};

/// Super-block bytes of Q4_K.
const Q4K_BLOCK_BYTES: usize = 144;

/// A launch of `q4_k_gemv_b<t>` or `q8_0_gemv_b<t>`: the geometry, the activation rows, and
/// (Q4_K) the super-blocks of x staged per chunk (`S`, the kernel's last argument).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuantBatchLaunch {
    /// Grid, threads, dynamic shared memory (`t * chunk_sbs` KB of staged x for Q4_K).
    pub launch: Launch,
    /// Activation rows (2..=8).
    pub t: usize,
    /// Q4_K: super-blocks (256 values) of each activation row staged per chunk; 0 for Q8_0.
    pub chunk_sbs: usize,
}

/// Weight rows each warp of `q4_k_gemv_b<t>` holds at once (`PN_Q4KB_ROWS` in q4k_batch.cu):
/// `rows x t <= 32` accumulators per lane. x is read from L2 once per `8 x rows` weight rows.
pub fn q4_k_batch_rows(t: usize) -> usize {
    match t {
        2 => 16,
        3 => 10,
        4 => 8,
        5 => 6,
        6 => 5,
        _ => 4,
    }
}

/// Bytes of staged x `q4_k_gemv_b<t>` reads from L2 for `n` weight rows of `k`: each block
/// stages all of x (t rows of k floats) once per tile of `8 x q4_k_batch_rows(t)` rows.
pub fn q4_k_batch_x_bytes(t: usize, n: usize, k: usize) -> u64 {
    (n.div_ceil(8 * q4_k_batch_rows(t)) * t * k * 4) as u64
}

fn shape_ok(t: usize, n: usize, k: usize, block: usize) -> bool {
    (2..=PN_BATCH_MAX_T).contains(&t)
        && n > 0
        && k > 0
        && k.is_multiple_of(block)
        && n <= i32::MAX as usize
        && k <= i32::MAX as usize
}

/// `q4_k_gemv_b<t>` for `t` (2..=8) activation rows times `n` Q4_K rows of `k` columns (a
/// multiple of 256): 8 warps of [`q4_k_batch_rows`] rows each, a row-looping grid of a few
/// blocks per SM, and chunks of `16 / t` super-blocks of x (at most 16 KB of shared memory, so
/// several blocks fit an SM). Any `k` (x is staged in chunks). None for other shapes.
pub fn q4_k_batch(t: usize, n: usize, k: usize) -> Option<QuantBatchLaunch> {
    if !shape_ok(t, n, k, 256) || k / 256 * Q4K_BLOCK_BYTES > i32::MAX as usize {
        return None;
    }
    let chunk_sbs = (16 / t).clamp(1, k / 256);
    Some(QuantBatchLaunch {
        launch: Launch {
            kernel: Q4K_NAMES[t - 2],
            grid: n.div_ceil(8 * q4_k_batch_rows(t)).min(GEMV_MAX_GRID) as u32,
            threads: 256,
            smem: (t * chunk_sbs * 1024) as u32,
            rows_per_warp: q4_k_batch_rows(t),
        },
        t,
        chunk_sbs,
    })
}

/// `q8_0_gemv_b<t>` for `t` (2..=8) activation rows times `n` Q8_0 rows of `k` columns (a
/// multiple of 32): one warp per row (as `q8_0_gemv_f32`), 8 warps per block. None for other
/// shapes.
pub fn q8_0_batch(t: usize, n: usize, k: usize) -> Option<QuantBatchLaunch> {
    if !shape_ok(t, n, k, 32) || n.div_ceil(8) > i32::MAX as usize {
        return None;
    }
    Some(QuantBatchLaunch {
        launch: Launch {
            kernel: Q8_NAMES[t - 2],
            grid: n.div_ceil(8) as u32,
            threads: 256,
            smem: 0,
            rows_per_warp: 1,
        },
        t,
        chunk_sbs: 0,
    })
}

const Q4K_NAMES: [&str; 7] = [
    "q4_k_gemv_b2",
    "q4_k_gemv_b3",
    "q4_k_gemv_b4",
    "q4_k_gemv_b5",
    "q4_k_gemv_b6",
    "q4_k_gemv_b7",
    "q4_k_gemv_b8",
];
const Q8_NAMES: [&str; 7] = [
    "q8_0_gemv_b2",
    "q8_0_gemv_b3",
    "q8_0_gemv_b4",
    "q8_0_gemv_b5",
    "q8_0_gemv_b6",
    "q8_0_gemv_b7",
    "q8_0_gemv_b8",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_27b_head_and_alpha_beta_take_the_batch_kernels() {
        for t in 2..=PN_BATCH_MAX_T {
            let h = q4_k_batch(t, 248_320, 5120).unwrap();
            assert_eq!(h.launch.grid as usize, GEMV_MAX_GRID, "{h:?}");
            assert!(h.launch.smem <= 16 * 1024 && h.chunk_sbs >= 2, "{h:?}");
            assert!(q4_k_batch_rows(t) * t <= 32);
            let a = q8_0_batch(t, 48, 5120).unwrap();
            assert_eq!((a.launch.grid, a.launch.smem), (6, 0), "{a:?}");
            assert!(h.launch.kernel.ends_with(&format!("_b{t}")));
            assert!(a.launch.kernel.ends_with(&format!("_b{t}")));
        }
        assert!(q4_k_batch(1, 8, 256).is_none());
        assert!(q4_k_batch(9, 8, 256).is_none());
        assert!(q4_k_batch(3, 8, 320).is_none());
        assert!(q8_0_batch(3, 8, 48).is_none());
        assert!(q8_0_batch(3, 0, 64).is_none());
        // x from L2 at the verify's 3 rows: once per 80 head rows.
        assert_eq!(q4_k_batch_x_bytes(3, 160, 5120), 2 * 3 * 5120 * 4);
    }
}
