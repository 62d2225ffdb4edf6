//! GPTQ/OPTQ-style error feedback into unchanged PN blocks.
//!
//! For one matrix `W [rows, k]` (already Hadamard-rotated, as the PN file stores it) and the
//! Hessian `H = X^T X [k, k]` of its calibration inputs in the same rotated basis, columns are
//! quantized left to right; the error of column `j` is pushed onto the columns not yet quantized
//! through the upper Cholesky factor `U` of `H^-1` (`H^-1 = U^T U`), which minimises the
//! output error `tr((W - Q) H (W - Q)^T)` column by column. The group is the PN block (80 or 64
//! consecutive columns): when a block starts, its scale is chosen on the *updated* weights with
//! the reference's 36-candidate search weighted by `diag(H)` ([`crate::weighted`]); then its
//! columns are rounded one at a time with feedback. Updates are batched lazily: inside a run of
//! [`LAZY_GROUPS`] blocks immediately, onto the later columns once per run.
//!
//! Rows are independent given `U`, so any split of the rows across threads gives the same bytes;
//! every sum runs in a fixed order in f64.

use crate::error::PnError;
use crate::gptq_linalg;
use crate::types::{PnType, BLOCK_BYTES};
use crate::weighted::{pack_at_scale, weighted_scale};

/// PN blocks per lazy-update run (the columns whose errors are applied to the rest at once).
pub const LAZY_GROUPS: usize = 4;

/// Relative damping GPTQ uses by default: `lambda = 0.01 * mean(diag H)`.
pub const DEFAULT_DAMP: f64 = 0.01;

/// The factor of one Hessian that every row of a matrix is quantized against.
#[derive(Clone, Debug)]
pub struct GptqFactor {
    k: usize,
    /// `[k, k]` row-major, upper triangular: `H_damped^-1 = U^T U`.
    u: Vec<f64>,
    /// `diag(H)` before damping, `[k]`: the importance weighting the scale search.
    diag: Vec<f64>,
    /// The absolute damping added to the diagonal.
    damp: f64,
}

impl GptqFactor {
    /// Factors `h` (`[k, k]` row-major, symmetric; only the lower triangle is read) after
    /// adding `rel_damp * mean(diag h)` to the diagonal (and 1 where a column never saw input).
    /// If the damped matrix is still not positive definite the damping is raised tenfold, up to
    /// three times, before giving up.
    pub fn new(h: &[f64], k: usize, rel_damp: f64) -> Result<GptqFactor, PnError> {
        GptqFactor::new_threaded(h, k, rel_damp, 1)
    }

    /// [`GptqFactor::new`] on `threads` threads (0 = all cores): blocked Cholesky and
    /// triangular inverse ([`crate::gptq_linalg`]), both in place in one `[k, k]` f64 buffer
    /// that becomes the factor, so the memory is `h` plus one more `k * k` f64 (2.42 GB at
    /// `k = 17408`) plus `O(k)` panels. The factor does not depend on the thread count.
    pub fn new_threaded(
        h: &[f64],
        k: usize,
        rel_damp: f64,
        threads: usize,
    ) -> Result<GptqFactor, PnError> {
        if h.len() != k * k {
            return Err(PnError::LengthMismatch {
                what: "Hessian entries",
                expected: k * k,
                got: h.len(),
            });
        }
        let diag: Vec<f64> = (0..k).map(|i| h[i * k + i]).collect();
        let mean = diag.iter().sum::<f64>() / k.max(1) as f64;
        if !(mean.is_finite() && mean > 0.0) {
            return Err(PnError::NotPositiveDefinite {
                column: 0,
                damp: 0.0,
            });
        }
        let mut damp = rel_damp.max(0.0) * mean;
        let mut last = 0;
        let mut b = vec![0f64; k * k];
        for _ in 0..4 {
            // The reversed matrix B = J A J, so that its lower Cholesky factor M gives the upper
            // factor of A: A = (J M J)(J M J)^T, hence A^-1 = U^T U with U = J M^-1 J.
            reversed_lower(h, k, damp, &mut b);
            match gptq_linalg::cholesky_lower(&mut b, k, threads) {
                Ok(()) => {
                    gptq_linalg::invert_lower(&mut b, k, threads);
                    // U[i, j] = M^-1[k-1-i, k-1-j]: flat index i k + j maps to k k - 1 - (i k + j),
                    // so U is the buffer reversed (M^-1's zero upper triangle becomes U's lower).
                    b.reverse();
                    return Ok(GptqFactor {
                        k,
                        u: b,
                        diag,
                        damp,
                    });
                }
                Err(col) => {
                    last = k - 1 - col;
                    damp = if damp > 0.0 { damp * 10.0 } else { mean * 1e-3 };
                }
            }
        }
        Err(PnError::NotPositiveDefinite { column: last, damp })
    }

    /// The row length.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The absolute damping that was added to the diagonal.
    pub fn damp(&self) -> f64 {
        self.damp
    }
}

/// Fills `b` (`[k, k]`) with the lower triangle of `J (A + damp I) J` (`J` the reversal; `A`'s
/// lower triangle read from `h`) and zeros above, where a diagonal entry that never saw input
/// (`<= 0`) is replaced by `1 + damp`. Tiled so that the transposed reads stay in cache.
fn reversed_lower(h: &[f64], k: usize, damp: f64, b: &mut [f64]) {
    const T: usize = 64;
    b.iter_mut().for_each(|v| *v = 0.0);
    for ib in (0..k).step_by(T) {
        for jb in (0..=ib).step_by(T) {
            for i in ib..(ib + T).min(k) {
                let ri = k - 1 - i;
                for j in jb..(jb + T).min(i + 1) {
                    // A's lower triangle holds (ri, rj) with ri <= rj mirrored: read (rj, ri).
                    let rj = k - 1 - j;
                    b[i * k + j] = h[rj * k + ri];
                }
            }
        }
    }
    for i in 0..k {
        let ri = k - 1 - i;
        b[i * k + i] = if h[ri * k + ri] > 0.0 {
            h[ri * k + ri] + damp
        } else {
            1.0 + damp
        };
    }
}

/// Quantizes the rows `w` (`[rows, k]`, rotated) with error feedback against `f`, writing
/// `rows * k / weights_per_block` blocks into `out`. Errors name the row (within `w`) and group.
pub fn quantize_rows_gptq(
    ty: PnType,
    f: &GptqFactor,
    w: &[f32],
    out: &mut [u8],
) -> Result<(), PnError> {
    let k = f.k;
    let g = ty.weights_per_block();
    if !k.is_multiple_of(g) {
        return Err(PnError::RaggedWeights {
            ty,
            len: k,
            block: g,
        });
    }
    if k == 0 || !w.len().is_multiple_of(k) {
        return Err(PnError::LengthMismatch {
            what: "weights of whole rows",
            expected: k,
            got: w.len(),
        });
    }
    let rows = w.len() / k;
    let row_bytes = k / g * BLOCK_BYTES;
    if out.len() != rows * row_bytes {
        return Err(PnError::LengthMismatch {
            what: "quantized row bytes",
            expected: rows * row_bytes,
            got: out.len(),
        });
    }
    for (r, row) in w.chunks_exact(k).enumerate() {
        if let Some(index) = row.iter().position(|v| !v.is_finite()) {
            return Err(PnError::NonFiniteWeight {
                group: index / g,
                index: index % g,
                value: row[index],
            }
            .in_row(r));
        }
    }
    // The working copy `[rows, k]` in f64 and the errors of the current run `[rows, run]`.
    let mut wk: Vec<f64> = w.iter().map(|&v| f64::from(v)).collect();
    let run = g * LAZY_GROUPS;
    let mut err = vec![0f64; rows * run];
    let z = f64::from(ty.zero_point());
    let u = &f.u;
    let mut c0 = 0;
    while c0 < k {
        let c1 = (c0 + run).min(k);
        let width = c1 - c0;
        for a in (c0..c1).step_by(g) {
            let grp = a / g;
            for r in 0..rows {
                let wr = &mut wk[r * k..(r + 1) * k];
                let s = weighted_scale(ty, &wr[a..a + g], &f.diag[a..a + g], grp)
                    .map_err(|e| e.in_row(r))?;
                // The block as it will be stored: codes of the weights as updated so far.
                let mut blockw = [0f64; 80];
                for j in a..a + g {
                    let v = wr[j];
                    blockw[j - a] = v;
                    let q = match s {
                        Some(s) => s * (crate::quantize::code_of(v, s, z) - z),
                        None => 0.0,
                    };
                    let e = (v - q) / u[j * k + j];
                    err[r * run + (j - c0)] = -e;
                    let urow = &u[j * k..(j + 1) * k];
                    for (d, &uu) in wr[j + 1..c1].iter_mut().zip(&urow[j + 1..c1]) {
                        *d -= e * uu;
                    }
                }
                let dst = &mut out[r * row_bytes + grp * BLOCK_BYTES..][..BLOCK_BYTES];
                dst.copy_from_slice(&pack_at_scale(ty, &blockw[..g], s));
            }
        }
        // The run's errors onto every later column: W[:, c1..] += (-E) U[c0..c1, c1..], one
        // cache-tiled GEMM (`err` holds -E).
        if c1 < k {
            let g = gptq_linalg::Gemm {
                a: &err,
                lda: run,
                b: &u[c0 * k + c1..],
                ldb: k,
                n: k - c1,
                p: width,
                b_lower: None,
                c_lower: None,
            };
            g.run(&mut wk[c1..], k, 0, rows);
        }
        c0 = c1;
    }
    Ok(())
}

/// `tr((W - Q) H (W - Q)^T)` for `w`, `q` of `[rows, k]` and `h` `[k, k]` (row-major,
/// symmetric): the output error the matrix adds on the inputs `H` was collected from.
pub fn hessian_error(h: &[f64], k: usize, w: &[f32], q: &[f32]) -> f64 {
    let mut total = 0.0;
    let mut e = vec![0f64; k];
    for (wr, qr) in w.chunks_exact(k).zip(q.chunks_exact(k)) {
        for ((d, &a), &b) in e.iter_mut().zip(wr).zip(qr) {
            *d = f64::from(a) - f64::from(b);
        }
        for i in 0..k {
            let hi = &h[i * k..(i + 1) * k];
            let s: f64 = hi.iter().zip(&e).map(|(&x, &y)| x * y).sum();
            total += e[i] * s;
        }
    }
    total
}

#[cfg(test)]
#[path = "gptq_tests.rs"]
mod tests;
