//! Blocked, multi-threaded dense f64 linear algebra for GPTQ at 27B shapes: the Cholesky
//! factor of the damped Hessian, its triangular inverse (both in place), the lower triangle of
//! a Gram matrix `X^T X`, and the GEMM-shaped trailing update of the lazy-batch feedback.
//!
//! Everything is built on one cache-tiled kernel, `C += A B` ([`Gemm`]), with a 4 x 8 register
//! tile. Determinism: every element of `C` is computed by the same operation sequence whatever
//! the thread count or the way rows are grouped (a sum over `t` in ascending order inside each
//! [`KC`]-block, blocks at fixed absolute offsets, added to `C` block after block), so the
//! results do not depend on the thread count. No FMA is used (Rust never contracts `a * b + c`),
//! so the AVX2 build of the kernel gives the same bits as the portable one.

/// Rows of the register tile (the kernel below unrolls exactly four).
const MR: usize = 4;
/// Columns of the register tile (two AVX2 vectors of f64).
const NR: usize = 8;
/// Depth of one pass over `A`'s columns / `B`'s rows (an `[MC, KC]` block of `A` stays in L2).
pub(crate) const KC: usize = 256;
/// Rows of `A` per L2 block.
const MC: usize = 64;
/// Block size of the Cholesky factorization and the triangular inverse.
const NB: usize = 128;

/// `C[m, n] += A[m, p] B[p, n]`, all row-major with leading dimensions `lda`, `ldb` (C's is
/// passed to [`Gemm::run`]).
pub(crate) struct Gemm<'a> {
    /// `A[r, t] = a[r * lda + t]`.
    pub a: &'a [f64],
    /// Leading dimension of `a`.
    pub lda: usize,
    /// `B[t, j] = b[t * ldb + j]`.
    pub b: &'a [f64],
    /// Leading dimension of `b`.
    pub ldb: usize,
    /// Columns of `C` (and `B`).
    pub n: usize,
    /// The shared dimension.
    pub p: usize,
    /// `Some(off)`: `B[t, j] == 0` for `t < j + off` (`B` is columns `off..` of a lower
    /// triangular matrix): the sum for a column tile starts at its first column, which skips
    /// only exact zeros (the `KC` blocks of `t` stay at absolute offsets).
    pub b_lower: Option<usize>,
    /// Only `C[r, j]` with `j <= r + diag` is written (the lower triangle of a square `C`
    /// whose row `r` is row `r + diag` of the whole matrix when `diag` rows were split off).
    pub c_lower: Option<usize>,
}

impl Gemm<'_> {
    /// Adds `A[r0.., :] B` to the rows `r0..r0 + rows` of `C`, stored in `c` from row `r0`
    /// (`C[r0 + i, j] = c[i * ldc + j]`).
    pub fn run(&self, c: &mut [f64], ldc: usize, r0: usize, rows: usize) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is present (checked just above); the body is safe code.
            unsafe { self.run_avx2(c, ldc, r0, rows) };
            return;
        }
        self.run_body(c, ldc, r0, rows);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn run_avx2(&self, c: &mut [f64], ldc: usize, r0: usize, rows: usize) {
        self.run_body(c, ldc, r0, rows);
    }

    #[inline(always)]
    fn run_body(&self, c: &mut [f64], ldc: usize, r0: usize, rows: usize) {
        let mut t0 = 0;
        while t0 < self.p {
            let t1 = (t0 + KC).min(self.p);
            let mut g0 = 0;
            while g0 < rows {
                let g1 = (g0 + MC).min(rows);
                let mut j0 = 0;
                while j0 < self.n {
                    let j1 = (j0 + NR).min(self.n);
                    // Lower-triangular B: rows above the tile's first column are zero.
                    let ts = match self.b_lower {
                        Some(off) => t0.max(j0 + off),
                        None => t0,
                    };
                    if ts < t1 {
                        let mut i0 = g0;
                        while i0 < g1 {
                            let i1 = (i0 + MR).min(g1);
                            self.tile(c, ldc, (r0 + i0, i0, i1 - i0), (j0, j1 - j0), (ts, t1));
                            i0 = i1;
                        }
                    }
                    j0 = j1;
                }
                g0 = g1;
            }
            t0 = t1;
        }
    }

    /// One register tile: rows `(absolute row, row in c, count)`, columns `(first, count)`,
    /// depth `(first, end)`.
    #[inline(always)]
    fn tile(
        &self,
        c: &mut [f64],
        ldc: usize,
        (ra, ri, mr): (usize, usize, usize),
        (j0, nr): (usize, usize),
        (ts, te): (usize, usize),
    ) {
        if let Some(d) = self.c_lower {
            // Every element of this tile is above the diagonal.
            if j0 > ra + mr - 1 + d {
                return;
            }
        }
        let len = te - ts;
        let mut acc = [[0f64; NR]; MR];
        if mr == MR && nr == NR {
            let a: [&[f64]; MR] =
                std::array::from_fn(|r| &self.a[(ra + r) * self.lda + ts..][..len]);
            let b = &self.b[ts * self.ldb + j0..];
            // The last row of B read is `len - 1`; its 8 columns must be in `b`.
            let fits = len == 0 || (len - 1) * self.ldb + NR <= b.len();
            #[cfg(target_arch = "x86_64")]
            if fits && std::arch::is_x86_feature_detected!("avx") {
                // SAFETY: AVX is present; every A row has `len` entries and B rows `0..len`
                // have 8 columns from `b` (both checked above).
                unsafe { micro_avx(&mut acc, a, b, self.ldb, len) };
            } else {
                micro_portable(&mut acc, a, b, self.ldb, len);
            }
            #[cfg(not(target_arch = "x86_64"))]
            micro_portable(&mut acc, a, b, self.ldb, len);
        } else {
            // Edge tile: the same operations per element, in the same order.
            for (r, accr) in acc.iter_mut().enumerate().take(mr) {
                let ar = &self.a[(ra + r) * self.lda + ts..][..len];
                for (t, &av) in ar.iter().enumerate() {
                    let bt = &self.b[(ts + t) * self.ldb + j0..][..nr];
                    for (x, &bv) in accr.iter_mut().zip(bt) {
                        *x += av * bv;
                    }
                }
            }
        }
        for (r, accr) in acc.iter().enumerate().take(mr) {
            let row = &mut c[(ri + r) * ldc + j0..][..nr];
            let lim = match self.c_lower {
                Some(d) => (ra + r + d + 1).saturating_sub(j0).min(nr),
                None => nr,
            };
            for (x, &v) in row.iter_mut().zip(accr).take(lim) {
                *x += v;
            }
        }
    }
}

/// The 4 x 8 register tile: `acc[r][j] += sum_t a[r][t] * b[t * ldb + j]`, `t` ascending, each
/// product rounded, then added (no FMA: the same bits as [`micro_portable`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn micro_avx(acc: &mut [[f64; NR]; MR], a: [&[f64]; MR], b: &[f64], ldb: usize, len: usize) {
    use std::arch::x86_64::*;
    let mut c = [[_mm256_setzero_pd(); 2]; MR];
    let ap = a.map(|r| r.as_ptr());
    let mut bp = b.as_ptr();
    for t in 0..len {
        // SAFETY (caller): row t of B has 8 columns at bp, each A row has len entries.
        let (b0, b1) = unsafe { (_mm256_loadu_pd(bp), _mm256_loadu_pd(bp.add(4))) };
        for r in 0..MR {
            let av = unsafe { _mm256_broadcast_sd(&*ap[r].add(t)) };
            c[r][0] = _mm256_add_pd(c[r][0], _mm256_mul_pd(av, b0));
            c[r][1] = _mm256_add_pd(c[r][1], _mm256_mul_pd(av, b1));
        }
        bp = bp.wrapping_add(ldb);
    }
    for (dst, v) in acc.iter_mut().zip(c) {
        // SAFETY: each row of acc holds 8 f64.
        unsafe {
            _mm256_storeu_pd(dst.as_mut_ptr(), v[0]);
            _mm256_storeu_pd(dst.as_mut_ptr().add(4), v[1]);
        }
    }
}

/// [`micro_avx`] without SIMD intrinsics (the same operations, element by element).
fn micro_portable(acc: &mut [[f64; NR]; MR], a: [&[f64]; MR], b: &[f64], ldb: usize, len: usize) {
    for (r, accr) in acc.iter_mut().enumerate() {
        for (t, &av) in a[r].iter().enumerate().take(len) {
            for (x, &bv) in accr.iter_mut().zip(&b[t * ldb..t * ldb + NR]) {
                *x += av * bv;
            }
        }
    }
}

/// The number of threads to use: `0` means all available cores.
pub(crate) fn resolve_threads(threads: usize) -> usize {
    match threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
}

/// Row boundaries splitting `m` rows of a lower-triangular update (row `i` costs `i + 1`) into
/// `parts` ranges of about equal work, each a multiple of [`MR`] rows except the last.
fn lower_splits(m: usize, parts: usize) -> Vec<usize> {
    let mut b = vec![0];
    for t in 1..parts {
        let x = (m as f64 * (t as f64 / parts as f64).sqrt()) as usize / MR * MR;
        if x > *b.last().unwrap_or(&0) && x < m {
            b.push(x);
        }
    }
    b.push(m);
    b
}

/// `C[m, m]`'s lower triangle `+= A B` on `threads` threads, `c` row-major with leading
/// dimension `ldc`, rows split into contiguous ranges of equal work.
fn gemm_lower_threaded(g: &Gemm<'_>, c: &mut [f64], ldc: usize, m: usize, threads: usize) {
    let splits = lower_splits(m, threads.clamp(1, m.div_ceil(MR).max(1)));
    if splits.len() <= 2 {
        g.run(c, ldc, 0, m);
        return;
    }
    std::thread::scope(|s| {
        let mut rest = c;
        for w in splits.windows(2) {
            let (r0, r1) = (w[0], w[1]);
            let take = if r1 == m { rest.len() } else { (r1 - r0) * ldc };
            let (mine, tail) = std::mem::take(&mut rest).split_at_mut(take);
            rest = tail;
            s.spawn(move || g.run(mine, ldc, r0, r1 - r0));
        }
    });
}

/// In-place blocked Cholesky of the lower triangle of `a` (`[k, k]` row-major; the strict upper
/// triangle is neither read nor written): `a = L L^T`, `L` left in the lower triangle.
/// `Err(col)` where a pivot is not positive. Right-looking: factor a diagonal block, solve the
/// panel below it (rows in parallel), update the trailing lower triangle with one GEMM.
/// Scratch: two copies of one panel, `2 * k * NB` f64.
pub(crate) fn cholesky_lower(a: &mut [f64], k: usize, threads: usize) -> Result<(), usize> {
    let threads = resolve_threads(threads).max(1);
    let mut j0 = 0;
    while j0 < k {
        let j1 = (j0 + NB).min(k);
        let nb = j1 - j0;
        // The diagonal block, unblocked (earlier panels' updates are already applied).
        for i in j0..j1 {
            for j in j0..=i {
                let mut s = a[i * k + j];
                for t in j0..j {
                    s -= a[i * k + t] * a[j * k + t];
                }
                if i == j {
                    if !(s > 0.0 && s.is_finite()) {
                        return Err(i);
                    }
                    a[i * k + i] = s.sqrt();
                } else {
                    a[i * k + j] = s / a[j * k + j];
                }
            }
        }
        if j1 == k {
            break;
        }
        let m = k - j1;
        // The panel rows j1..k, columns j0..j1: L21 = A21 L11^-T, row by row.
        {
            let (top, below) = a.split_at_mut(j1 * k);
            let diag = &top[j0 * k..];
            let solve = |rows: &mut [f64]| {
                for row in rows.chunks_mut(k) {
                    for j in 0..nb {
                        let mut s = row[j0 + j];
                        let dj = &diag[j * k + j0..j * k + j0 + j];
                        for (x, y) in row[j0..j0 + j].iter().zip(dj) {
                            s -= x * y;
                        }
                        row[j0 + j] = s / diag[j * k + j0 + j];
                    }
                }
            };
            let per = m.div_ceil(threads).max(1);
            if threads == 1 {
                solve(below);
            } else {
                std::thread::scope(|s| {
                    for part in below.chunks_mut(per * k) {
                        s.spawn(|| solve(part));
                    }
                });
            }
        }
        // Trailing: A22 -= L21 L21^T, as C += L21 * (-L21^T) with copies (C aliases L21).
        let mut l21 = vec![0f64; m * nb]; // [m, nb]
        let mut neg_t = vec![0f64; nb * m]; // [nb, m]
        for i in 0..m {
            let src = &a[(j1 + i) * k + j0..(j1 + i) * k + j1];
            l21[i * nb..(i + 1) * nb].copy_from_slice(src);
            for (t, &v) in src.iter().enumerate() {
                neg_t[t * m + i] = -v;
            }
        }
        let g = Gemm {
            a: &l21,
            lda: nb,
            b: &neg_t,
            ldb: m,
            n: m,
            p: nb,
            b_lower: None,
            c_lower: Some(0),
        };
        gemm_lower_threaded(&g, &mut a[j1 * k + j1..], k, m, threads);
        j0 = j1;
    }
    Ok(())
}

/// In-place blocked inverse of the lower-triangular `l` (`[k, k]` row-major; the strict upper
/// triangle must be zero and stays zero): block row `I` of `X = L^-1` is
/// `X_II = L_II^-1` and `X_I,<I = -L_II^-1 (L_I,<I X_<I,<I)`, computed top down; the columns of
/// block row `I` are split across threads (each computes its columns' product with the rows
/// above, already inverted, then solves with `L_II`). Scratch: one block row, `NB * k` f64.
pub(crate) fn invert_lower(l: &mut [f64], k: usize, threads: usize) {
    let threads = resolve_threads(threads).max(1);
    let mut i0 = 0;
    while i0 < k {
        let i1 = (i0 + NB).min(k);
        let nb = i1 - i0;
        if i0 > 0 {
            let (done, cur) = l.split_at(i0 * k);
            // `done` rows 0..i0 hold X (inverted); `cur` rows i0..i1 still hold L.
            let parts = threads.clamp(1, i0.div_ceil(NR));
            let width = i0.div_ceil(parts).div_ceil(NR) * NR;
            let work = |c0: usize| -> Vec<f64> {
                let w = width.min(i0 - c0);
                // temp [nb, w] = L_I,<I X_<I,c0..c0+w.
                let mut temp = vec![0f64; nb * w];
                let g = Gemm {
                    a: cur,
                    lda: k,
                    b: &done[c0..],
                    ldb: k,
                    n: w,
                    p: i0,
                    b_lower: Some(c0),
                    c_lower: None,
                };
                g.run(&mut temp, w, 0, nb);
                // Y = -L_II^-1 temp by forward substitution down the rows.
                for r in 0..nb {
                    let lrow = &cur[r * k + i0..r * k + i0 + r + 1];
                    let (above, here) = temp.split_at_mut(r * w);
                    let y = &mut here[..w];
                    for (t, &lv) in lrow[..r].iter().enumerate() {
                        for (d, &s) in y.iter_mut().zip(&above[t * w..(t + 1) * w]) {
                            *d += lv * s;
                        }
                    }
                    let p = lrow[r];
                    for d in y.iter_mut() {
                        *d = -*d / p;
                    }
                }
                temp
            };
            let starts: Vec<usize> = (0..i0).step_by(width.max(1)).collect();
            let panels: Vec<Vec<f64>> = if starts.len() == 1 {
                vec![work(0)]
            } else {
                std::thread::scope(|s| {
                    let hs: Vec<_> = starts
                        .iter()
                        .map(|&c0| {
                            let work = &work;
                            s.spawn(move || work(c0))
                        })
                        .collect();
                    hs.into_iter()
                        .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                        .collect()
                })
            };
            for (&c0, temp) in starts.iter().zip(&panels) {
                let w = width.min(i0 - c0);
                for r in 0..nb {
                    l[(i0 + r) * k + c0..(i0 + r) * k + c0 + w]
                        .copy_from_slice(&temp[r * w..(r + 1) * w]);
                }
            }
        }
        // The diagonal block: X_II = L_II^-1, row by row in place (row r of X_II needs rows
        // < r of X_II, already inverted, and row r of L_II, which it overwrites last).
        let mut row = vec![0f64; nb];
        for r in 0..nb {
            row.iter_mut().for_each(|v| *v = 0.0);
            row[r] = 1.0;
            for t in 0..r {
                let c = l[(i0 + r) * k + i0 + t];
                for (d, &s) in row[..=t].iter_mut().zip(&l[(i0 + t) * k + i0..]) {
                    *d -= c * s;
                }
            }
            let p = l[(i0 + r) * k + i0 + r];
            for (dst, v) in l[(i0 + r) * k + i0..(i0 + r) * k + i0 + r + 1]
                .iter_mut()
                .zip(&row)
            {
                *dst = v / p;
            }
        }
        i0 = i1;
    }
}

/// `g[i, ..=i] += sum_t x_ti x_t[..=i]` for `x` `[rows, k]` (the lower triangle of `X^T X`;
/// `g` is `[k, k]` row-major, its strict upper triangle untouched), on `threads` threads (0 =
/// all cores). Blocked: one GEMM of `X^T` (a transposed copy, `[k, rows]`) with `X`. The result
/// does not depend on the thread count.
pub fn accumulate_lower_gram(g: &mut [f64], x: &[f64], rows: usize, k: usize, threads: usize) {
    if k == 0 || rows == 0 || g.len() < k * k || x.len() < rows * k {
        return;
    }
    let mut xt = vec![0f64; k * rows]; // [k, rows]
    for (t, row) in x.chunks_exact(k).take(rows).enumerate() {
        for (i, &v) in row.iter().enumerate() {
            xt[i * rows + t] = v;
        }
    }
    let gm = Gemm {
        a: &xt,
        lda: rows,
        b: x,
        ldb: k,
        n: k,
        p: rows,
        b_lower: None,
        c_lower: Some(0),
    };
    gemm_lower_threaded(&gm, &mut g[..k * k], k, k, resolve_threads(threads));
}

#[cfg(test)]
#[path = "gptq_linalg_tests.rs"]
pub(crate) mod tests;
