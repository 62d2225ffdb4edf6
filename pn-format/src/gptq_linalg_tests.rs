use super::*;

/// A deterministic generator in [-1, 1).
pub(crate) struct Rng(pub u64);

impl Rng {
    pub(crate) fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
    }
}

/// The unblocked one-thread Cholesky the blocked one replaced (the reference for the tests).
pub(crate) fn cholesky_unblocked(a: &mut [f64], k: usize) -> Result<(), usize> {
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

/// The unblocked triangular inverse the blocked one replaced: row `i` of `M^-1` is
/// `(e_i - sum_{t<i} m[i,t] row_t) / m[i,i]`.
pub(crate) fn invert_unblocked(m: &[f64], k: usize) -> Vec<f64> {
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

/// A random SPD matrix `[k, k]` (full, symmetric): `G G^T / k + 0.05 I` with uneven column
/// scales, lower triangle of the result copied with zeros above (as the factorization reads it).
fn spd_lower(k: usize, seed: u64) -> Vec<f64> {
    let mut r = Rng(seed);
    let n = k + 3;
    let g: Vec<f64> = (0..k * n)
        .map(|i| r.next() * (1.0 + (i / n % 7) as f64))
        .collect();
    let mut a = vec![0f64; k * k];
    for i in 0..k {
        for j in 0..=i {
            let s: f64 = (0..n).map(|t| g[i * n + t] * g[j * n + t]).sum();
            a[i * k + j] = s / n as f64 + if i == j { 0.05 } else { 0.0 };
        }
    }
    a
}

fn max_rel(a: &[f64], b: &[f64]) -> f64 {
    let scale = b.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-300);
    a.iter()
        .zip(b)
        .fold(0f64, |m, (x, y)| m.max((x - y).abs() / scale))
}

/// Odd sizes, sizes around the block (`NB` = 128) and several blocks: the blocked Cholesky and
/// inverse equal the unblocked ones within 1e-9 relative (of the largest entry), their strict
/// upper triangles stay zero, and the bits do not depend on the thread count.
#[test]
fn blocked_factor_and_inverse_match_unblocked() {
    for (n, &k) in [1usize, 7, 127, 128, 129, 300, 389].iter().enumerate() {
        let a = spd_lower(k, 11 + n as u64);
        let mut want = a.clone();
        cholesky_unblocked(&mut want, k).unwrap();
        let want_inv = invert_unblocked(&want, k);
        let mut first: Option<Vec<f64>> = None;
        for threads in [1, 2, 3, 5] {
            let mut got = a.clone();
            cholesky_lower(&mut got, k, threads).unwrap();
            let e = max_rel(&got, &want);
            assert!(
                e < 1e-9,
                "k {k} threads {threads}: Cholesky differs by {e:e}"
            );
            invert_lower(&mut got, k, threads);
            let e = max_rel(&got, &want_inv);
            assert!(
                e < 1e-9,
                "k {k} threads {threads}: inverse differs by {e:e}"
            );
            for i in 0..k {
                for j in i + 1..k {
                    assert_eq!(got[i * k + j], 0.0, "k {k}: upper ({i},{j}) written");
                }
            }
            match &first {
                None => first = Some(got),
                Some(f) => assert!(f == &got, "k {k}: {threads} threads changed the bits"),
            }
        }
    }
}

/// A matrix that is not positive definite is an error at the failing pivot, as unblocked.
#[test]
fn blocked_cholesky_reports_the_failing_column() {
    let k = 200;
    let mut a = spd_lower(k, 5);
    a[150 * k + 150] = -1.0;
    let mut want = a.clone();
    let col = cholesky_unblocked(&mut want, k).unwrap_err();
    for threads in [1, 4] {
        let mut got = a.clone();
        assert_eq!(cholesky_lower(&mut got, k, threads), Err(col));
    }
}

/// The GEMM kernel against a naive triple loop on odd shapes, with and without the triangle
/// options; depth over several `KC` blocks.
#[test]
fn gemm_matches_naive() {
    let mut r = Rng(3);
    for &(m, n, p) in &[
        (1usize, 1usize, 1usize),
        (5, 9, 3),
        (13, 17, 300),
        (64, 33, 600),
    ] {
        for (b_lower, c_lower) in [(None, None), (Some(0), None), (None, Some(0))] {
            let nn = if c_lower.is_some() { m } else { n };
            let a: Vec<f64> = (0..m * p).map(|_| r.next()).collect();
            let mut b: Vec<f64> = (0..p * nn).map(|_| r.next()).collect();
            if b_lower.is_some() {
                for t in 0..p {
                    for j in t + 1..nn {
                        b[t * nn + j] = 0.0;
                    }
                }
            }
            let c0: Vec<f64> = (0..m * nn).map(|_| r.next()).collect();
            let mut want = c0.clone();
            for i in 0..m {
                for j in 0..nn {
                    if c_lower.is_some() && j > i {
                        continue;
                    }
                    want[i * nn + j] += (0..p).map(|t| a[i * p + t] * b[t * nn + j]).sum::<f64>();
                }
            }
            let g = Gemm {
                a: &a,
                lda: p,
                b: &b,
                ldb: nn,
                n: nn,
                p,
                b_lower,
                c_lower,
            };
            let mut got = c0.clone();
            g.run(&mut got, nn, 0, m);
            assert!(max_rel(&got, &want) < 1e-13, "{m}x{nn}x{p}");
            // Any row grouping and threading gives the same bits.
            let mut split = c0.clone();
            let (top, bot) = split.split_at_mut(m / 2 * nn);
            g.run(top, nn, 0, m / 2);
            g.run(bot, nn, m / 2, m - m / 2);
            assert!(split == got, "{m}x{nn}x{p}: row split changed the bits");
            if c_lower.is_some() {
                let mut th = c0.clone();
                gemm_lower_threaded(&g, &mut th, nn, m, 3);
                assert!(th == got, "{m}x{nn}x{p}: threads changed the bits");
            }
        }
    }
}

/// The blocked Gram lower triangle equals the per-token sum within rounding, is independent of
/// the thread count, and leaves the upper triangle alone.
#[test]
fn gram_matches_naive() {
    let (rows, k) = (37, 45);
    let mut r = Rng(9);
    let x: Vec<f64> = (0..rows * k).map(|_| r.next()).collect();
    let mut want = vec![0f64; k * k];
    for row in x.chunks_exact(k) {
        for i in 0..k {
            for j in 0..=i {
                want[i * k + j] += row[i] * row[j];
            }
        }
    }
    let mut g1 = vec![0f64; k * k];
    accumulate_lower_gram(&mut g1, &x, rows, k, 1);
    assert!(max_rel(&g1, &want) < 1e-13);
    let mut g4 = vec![0f64; k * k];
    accumulate_lower_gram(&mut g4, &x, rows, k, 4);
    assert!(g1 == g4, "threads changed the bits");
}

/// Throughput of the GEMM kernel against a plain `ikj` loop in the same process (a loaded
/// machine only gives ratios). Prints: `cargo test --release -p pn-format --lib gemm_speed --
/// --ignored --nocapture`.
#[test]
#[ignore]
fn gemm_speed() {
    let n = 512;
    let mut r = Rng(1);
    let a: Vec<f64> = (0..n * n).map(|_| r.next()).collect();
    let b: Vec<f64> = (0..n * n).map(|_| r.next()).collect();
    for _ in 0..2 {
        let mut c = vec![0f64; n * n];
        let t = std::time::Instant::now();
        for i in 0..n {
            for t in 0..n {
                let av = a[i * n + t];
                for (x, &bv) in c[i * n..(i + 1) * n].iter_mut().zip(&b[t * n..(t + 1) * n]) {
                    *x += av * bv;
                }
            }
        }
        let naive = t.elapsed().as_secs_f64();
        let mut c2 = vec![0f64; n * n];
        let g = Gemm {
            a: &a,
            lda: n,
            b: &b,
            ldb: n,
            n,
            p: n,
            b_lower: None,
            c_lower: None,
        };
        let t = std::time::Instant::now();
        g.run(&mut c2, n, 0, n);
        let tiled = t.elapsed().as_secs_f64();
        let f = (n * n * n) as f64 / 1e9;
        eprintln!(
            "{n}^3: ikj {:.2} GFMA/s, kernel {:.2} GFMA/s ({:.1}x)",
            f / naive,
            f / tiled,
            naive / tiled
        );
    }
}

/// The AVX register tile gives the same bits as the portable one (no FMA either way), so files
/// do not depend on the CPU's instruction set.
#[test]
fn avx_tile_equals_portable_bits() {
    let mut r = Rng(12);
    let (len, ldb) = (300, 11);
    let rows: Vec<Vec<f64>> = (0..MR)
        .map(|_| (0..len).map(|_| r.next()).collect())
        .collect();
    let b: Vec<f64> = (0..len * ldb).map(|_| r.next() * 1e3).collect();
    let a: [&[f64]; MR] = std::array::from_fn(|i| &rows[i][..]);
    let mut want = [[0f64; NR]; MR];
    micro_portable(&mut want, a, &b, ldb, len);
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        let mut got = [[0f64; NR]; MR];
        // SAFETY: AVX checked; rows have len entries, B rows 8 columns (ldb 11 >= 8).
        unsafe { micro_avx(&mut got, a, &b, ldb, len) };
        assert_eq!(got, want);
    }
}
