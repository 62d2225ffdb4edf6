//! The launch plan of the grouped Q8_0 GEMV (`q8_0_gemv_group` in `kernels/q8_group.cu`):
//! 2..=[`Q8_GROUP_MAX`] Q8_0 matrices of one K that read the same f32 x (the GDN's ssm_alpha
//! and ssm_beta) in one launch, each member on the blocks its own `q8_0_gemv_f32` launch would
//! take (`ceil(n / 8)` blocks of 256 threads, a warp per row).

/// Most matrices in one launch (`Q8G_MAX` in the kernel).
pub const Q8_GROUP_MAX: usize = 4;

/// Largest K: x is staged as K / 32 * 33 floats next to the 8 warps' weight tiles (1152 bytes
/// each: 16 pairs of blocks in 18 words), inside the 48 KB a block may use.
pub const Q8_GROUP_MAX_K: usize = 8192;

/// Rows per block (warps of 256 threads), as `q8_0_gemv_f32`.
const ROWS_PER_BLOCK: usize = 8;

/// The geometry of one grouped launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Q8GroupLaunch {
    /// Blocks of the whole launch.
    pub grid: u32,
    /// Threads per block.
    pub threads: u32,
    /// Dynamic shared memory (the staged x), bytes.
    pub smem: u32,
    /// First block of each member, then the grid (`members + 1` entries).
    pub first: Vec<i32>,
}

/// The launch of members with `rows[i]` rows each at reduction length `k`, or `None` where the
/// kernel does not take them: 2..=4 members, each with rows, `k` a positive multiple of 64 (so
/// every row starts on a 4-byte word: whole pairs of 34-byte blocks) up to [`Q8_GROUP_MAX_K`].
pub fn q8_group(rows: &[usize], k: usize) -> Option<Q8GroupLaunch> {
    if !(2..=Q8_GROUP_MAX).contains(&rows.len())
        || k == 0
        || !k.is_multiple_of(64)
        || k > Q8_GROUP_MAX_K
        || rows.contains(&0)
    {
        return None;
    }
    let mut first = vec![0i32];
    let mut total = 0usize;
    for &n in rows {
        total = total.checked_add(n.div_ceil(ROWS_PER_BLOCK))?;
        first.push(i32::try_from(total).ok()?);
    }
    Some(Q8GroupLaunch {
        grid: u32::try_from(total).ok()?,
        threads: 256,
        smem: (k / 32 * 33 * 4) as u32,
        first,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gdn_pair_fits_and_odd_shapes_are_refused() {
        // ssm_alpha and ssm_beta of the 27B: 48 rows of 5120 each, 6 blocks apiece.
        let l = q8_group(&[48, 48], 5120).unwrap();
        assert_eq!(
            (l.grid, l.threads, l.first.clone()),
            (12, 256, vec![0, 6, 12])
        );
        // The staged x and the weight tiles fit a block's 48 KB at the largest K.
        let big = q8_group(&[1, 9], Q8_GROUP_MAX_K).unwrap();
        assert!(big.smem as usize + 8 * 288 * 4 <= 49152, "{}", big.smem);
        assert_eq!(big.first, vec![0, 1, 3]);
        for (rows, k) in [
            (&[48usize][..], 5120),
            (&[48, 48, 48, 48, 48][..], 5120),
            (&[48, 48][..], 5120 + 32),
            (&[48, 0][..], 5120),
            (&[48, 48][..], Q8_GROUP_MAX_K + 64),
        ] {
            assert!(q8_group(rows, k).is_none(), "{rows:?} x {k}");
        }
    }
}
