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
use crate::types::{PnType, BLOCK_BYTES};
use crate::weighted::{pack_at_scale, weighted_scale};

/// PN blocks per lazy-update run (the columns whose errors are applied to the rest at once).
pub const LAZY_GROUPS: usize = 4;

/// Relative damping GPTQ uses by default: `lambda = 0.01 * mean(diag H)`.
pub const DEFAULT_DAMP: f64 = 0.01;

/// Columns of the trailing update handled per pass (a `[run, COL_CHUNK]` slice of `U` stays in
/// cache while every row of the tile passes over it).
const COL_CHUNK: usize = 256;

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
        for _ in 0..4 {
            // The reversed matrix B = J A J, so that its lower Cholesky factor M gives the upper
            // factor of A: A = (J M J)(J M J)^T, hence A^-1 = U^T U with U = J M^-1 J.
            let mut b = vec![0f64; k * k];
            for i in 0..k {
                for j in 0..=i {
                    let (ri, rj) = (k - 1 - i, k - 1 - j);
                    // A's lower triangle holds (ri, rj) with ri <= rj mirrored: read (rj, ri).
                    let mut v = h[rj * k + ri];
                    if i == j {
                        v = if h[ri * k + ri] > 0.0 {
                            v + damp
                        } else {
                            1.0 + damp
                        };
                    }
                    b[i * k + j] = v;
                }
            }
            match cholesky_lower(&mut b, k) {
                Ok(()) => {
                    let minv = invert_lower(&b, k);
                    let mut u = vec![0f64; k * k];
                    for i in 0..k {
                        for j in i..k {
                            u[i * k + j] = minv[(k - 1 - i) * k + (k - 1 - j)];
                        }
                    }
                    return Ok(GptqFactor { k, u, diag, damp });
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

/// In-place Cholesky of the lower triangle of `a` (`[k, k]` row-major): `a = L L^T`, `L` left in
/// the lower triangle. `Err(col)` where a pivot is not positive.
fn cholesky_lower(a: &mut [f64], k: usize) -> Result<(), usize> {
    for i in 0..k {
        for j in 0..=i {
            let (ri, rj) = (i * k, j * k);
            let mut s = a[ri + j];
            for t in 0..j {
                s -= a[ri + t] * a[rj + t];
            }
            if i == j {
                if !(s > 0.0 && s.is_finite()) {
                    return Err(i);
                }
                a[ri + i] = s.sqrt();
            } else {
                a[ri + j] = s / a[rj + j];
            }
        }
    }
    Ok(())
}

/// The inverse of the lower-triangular `m` (`[k, k]`; only the lower triangle is read), row by
/// row: row `i` of `M^-1` is `(e_i - sum_{t<i} m[i,t] row_t) / m[i,i]`.
fn invert_lower(m: &[f64], k: usize) -> Vec<f64> {
    let mut x = vec![0f64; k * k];
    for i in 0..k {
        let (done, rest) = x.split_at_mut(i * k);
        let row = &mut rest[..k];
        row[i] = 1.0;
        for t in 0..i {
            let c = m[i * k + t];
            let src = &done[t * k..t * k + t + 1];
            for (d, &s) in row[..=t].iter_mut().zip(src) {
                *d -= c * s;
            }
        }
        let p = m[i * k + i];
        for d in row[..=i].iter_mut() {
            *d /= p;
        }
    }
    x
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
                    err[r * run + (j - c0)] = e;
                    let urow = &u[j * k..(j + 1) * k];
                    for (d, &uu) in wr[j + 1..c1].iter_mut().zip(&urow[j + 1..c1]) {
                        *d -= e * uu;
                    }
                }
                let dst = &mut out[r * row_bytes + grp * BLOCK_BYTES..][..BLOCK_BYTES];
                dst.copy_from_slice(&pack_at_scale(ty, &blockw[..g], s));
            }
        }
        // The run's errors onto every later column: W[:, c1..] -= E U[c0..c1, c1..].
        let mut cc = c1;
        while cc < k {
            let ce = (cc + COL_CHUNK).min(k);
            for r in 0..rows {
                let wr = &mut wk[r * k + cc..r * k + ce];
                for t in 0..width {
                    let e = err[r * run + t];
                    let urow = &u[(c0 + t) * k + cc..(c0 + t) * k + ce];
                    for (d, &uu) in wr.iter_mut().zip(urow) {
                        *d -= e * uu;
                    }
                }
            }
            cc = ce;
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
