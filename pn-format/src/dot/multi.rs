//! One pass over a PN matrix for several activation vectors: `out[m][r] = dot(row r, acts[m])`.
//!
//! Decode streams every weight once per token; verifying `N` speculative tokens (or a small
//! batch) would stream it `N` times with [`super::matvec`]. Here each block is loaded and
//! unpacked once and multiplied with every vector, so the pass costs about one weight read plus
//! `M` times the (cheap, in-register) multiply-adds. Only [`PreparedI16`] activations: that is
//! the decode path.

use super::{check_k, scalar, PreparedI16};
use crate::error::PnError;
use crate::isa::Isa;
use crate::types::{PnType, BLOCK_BYTES};

/// Activation vectors one kernel call serves (more are taken in groups of this many per row).
pub const MAX_ACTS: usize = 8;

/// `outs[m][r] = dot(row r, acts[m])` for `rows` consecutive rows of `weights`, on the best SIMD
/// path. Every `acts[m]` must be prepared for `ty` with the same length `k`, and every `outs[m]`
/// hold `rows` values. Single-threaded: callers parallelise over row ranges.
pub fn matvec_multi(
    ty: PnType,
    weights: &[u8],
    rows: usize,
    acts: &[PreparedI16],
    outs: &mut [&mut [f32]],
) -> Result<(), PnError> {
    matvec_multi_with(Isa::detect(), ty, weights, rows, acts, outs)
}

/// [`matvec_multi`] on a chosen instruction set (falls back to scalar if the CPU lacks it).
/// [`Isa::Scalar`] is the reference: `scalar::dot_i16` per row and vector.
pub fn matvec_multi_with(
    isa: Isa,
    ty: PnType,
    weights: &[u8],
    rows: usize,
    acts: &[PreparedI16],
    outs: &mut [&mut [f32]],
) -> Result<(), PnError> {
    let rb = check_shapes(ty, weights, rows, acts, outs)?;
    if acts.is_empty() {
        return Ok(());
    }
    if rb == 0 {
        outs.iter_mut().for_each(|o| o.fill(0.0));
        return Ok(());
    }
    let nb = rb / BLOCK_BYTES;
    let isa = isa.or_scalar();
    for (g, group) in acts.chunks(MAX_ACTS).enumerate() {
        let outs = &mut outs[g * MAX_ACTS..g * MAX_ACTS + group.len()];
        #[cfg(target_arch = "x86_64")]
        if isa != Isa::Scalar {
            tiled_simd(isa, ty, weights, rows, nb, group, outs);
            continue;
        }
        for (r, row) in weights.chunks_exact(rb).enumerate() {
            for (o, a) in outs.iter_mut().zip(group) {
                o[r] = scalar::dot_i16(ty, row, &a.xq, &a.sx, &a.zq);
            }
        }
    }
    Ok(())
}

/// Bytes of int16 activations (all vectors of a group together) that one pass over a tile of
/// rows keeps hot: well inside a 32..48 KB L1 data cache, which must also hold the weights
/// streaming through. A whole 5120-long vector is 10 KB, so five or more would spill to L2 and
/// every multiply-add would wait for it.
const ACT_TILE_BYTES: usize = 28 * 1024;

/// Rows that share one activation tile before the next tile is loaded.
const ROW_TILE: usize = 16;

/// Blocks per activation tile for `m` vectors: a multiple of 16 (the per-block tables are read
/// 16 at a time, so a tile starts on a table boundary and an even block).
fn tile_blocks(ty: PnType, m: usize) -> usize {
    let per_block = m * ty.weights_per_block() * 2;
    (ACT_TILE_BYTES / per_block / 16 * 16).max(16)
}

/// The SIMD kernels over tiles of `ROW_TILE` rows x `tile_blocks` blocks: the activations of a
/// tile stay in L1 while the tile's rows stream past; partial sums are added per tile.
#[cfg(target_arch = "x86_64")]
fn tiled_simd(
    isa: Isa,
    ty: PnType,
    weights: &[u8],
    rows: usize,
    nb: usize,
    acts: &[PreparedI16],
    outs: &mut [&mut [f32]],
) {
    use super::x86_multi::{multi_i16_avx2, multi_i16_avx512, ActPtrs};
    let m = acts.len();
    debug_assert!((1..=MAX_ACTS).contains(&m) && outs.len() == m);
    let rb = nb * BLOCK_BYTES;
    let kc = tile_blocks(ty, m);
    let values_per_pair = 2 * ty.weights_per_block();
    let null = ActPtrs {
        xq: std::ptr::null(),
        sx: std::ptr::null(),
        zq: std::ptr::null(),
    };
    for r0 in (0..rows).step_by(ROW_TILE) {
        let nr = ROW_TILE.min(rows - r0);
        let mut sums = [[0f32; MAX_ACTS]; ROW_TILE];
        for b0 in (0..nb).step_by(kc) {
            let nbc = kc.min(nb - b0);
            let mut ptrs = [null; MAX_ACTS];
            for (p, a) in ptrs.iter_mut().zip(acts) {
                // `b0` is a multiple of 16, so even: the tile's values start at pair `b0 / 2`.
                *p = ActPtrs {
                    xq: a.xq[b0 / 2 * values_per_pair..].as_ptr(),
                    sx: a.sx[b0..].as_ptr(),
                    zq: a.zq[b0..].as_ptr(),
                };
            }
            let ptrs = &ptrs[..m];
            for (i, sum) in sums.iter_mut().enumerate().take(nr) {
                let start = (r0 + i) * rb + b0 * BLOCK_BYTES;
                let row = weights[start..start + nbc * BLOCK_BYTES].as_ptr();
                let mut part = [0f32; MAX_ACTS];
                let part = &mut part[..m];
                // SAFETY: `isa` passed `or_scalar` (the CPU has the features); the row slice
                // holds `nbc` blocks; every vector was prepared for `nb` blocks of `ty`
                // (`check_shapes`), so from block `b0` it holds `nbc` blocks of values (padded
                // to an even count) and its tables hold 16-block batches up to the padding.
                unsafe {
                    match isa {
                        Isa::Avx512Vnni => multi_i16_avx512::<true>(ty, row, nbc, ptrs, part),
                        Isa::Avx512 => multi_i16_avx512::<false>(ty, row, nbc, ptrs, part),
                        _ => multi_i16_avx2(ty, row, nbc, ptrs, part),
                    }
                }
                for (s, v) in sum.iter_mut().zip(part.iter()) {
                    *s += v;
                }
            }
        }
        for (j, o) in outs.iter_mut().enumerate() {
            for (i, sum) in sums.iter().enumerate().take(nr) {
                o[r0 + i] = sum[j];
            }
        }
    }
}

/// Validates every length; returns the bytes per row.
fn check_shapes(
    ty: PnType,
    weights: &[u8],
    rows: usize,
    acts: &[PreparedI16],
    outs: &[&mut [f32]],
) -> Result<usize, PnError> {
    if outs.len() != acts.len() {
        return Err(PnError::LengthMismatch {
            what: "matvec_multi outputs (one per activation vector)",
            expected: acts.len(),
            got: outs.len(),
        });
    }
    let Some(k) = acts.first().map(|a| a.k) else {
        // No vectors: nothing to compute, whatever the weights.
        return Ok(0);
    };
    for a in acts {
        if a.ty != ty {
            return Err(PnError::TypeMismatch {
                prepared: a.ty,
                weights: ty,
            });
        }
        if a.k != k {
            return Err(PnError::LengthMismatch {
                what: "matvec_multi activation length",
                expected: k,
                got: a.k,
            });
        }
    }
    for o in outs {
        if o.len() != rows {
            return Err(PnError::LengthMismatch {
                what: "matvec_multi output",
                expected: rows,
                got: o.len(),
            });
        }
    }
    let rb = check_k(ty, k)? * BLOCK_BYTES;
    let expected = rows.checked_mul(rb).ok_or(PnError::LengthMismatch {
        what: "matvec_multi weight bytes",
        expected: usize::MAX,
        got: weights.len(),
    })?;
    if weights.len() != expected {
        return Err(PnError::LengthMismatch {
            what: "matvec_multi weight bytes",
            expected,
            got: weights.len(),
        });
    }
    Ok(rb)
}
