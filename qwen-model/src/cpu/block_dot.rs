//! Register-blocked f32 dot products for the decode-once prefill path (quantized rows decoded
//! to f32 once per call, on CPUs without AMX or for stock types): 4 weight rows x 3 input rows
//! per pass, so each activation load feeds four rows instead of one.
//!
//! [`super::kernels::dot4`] loads every activation row once per weight row; over a prompt
//! chunk of 64 rows of 5120 floats that streams 1.3 MB from L2 for each weight row. Here each
//! load of 8 activations is used by 4 rows (12 AVX2 accumulators, 4 weight registers). Every
//! (row, input) pair keeps its own 8-lane accumulator with the same FMA order, horizontal sum
//! and scalar tail as `dot4`, so the results are bit-identical to it (the tests assert that).

/// Weight rows per block.
pub const ROWS: usize = 4;
/// Input rows per block.
pub const INPUTS: usize = 3;

/// `out[r][n] = w[r] . x[n]` for `w.len() <= ROWS` rows and `x.len() <= INPUTS` inputs, with
/// exactly [`super::kernels::dot4`]'s arithmetic per pair. Every `x[n]` is at least as long as
/// every `w[r]`, and all `w[r]` have the same length (checked; otherwise the pairs fall back to
/// `dot4` one by one, still the same numerics).
pub fn dot_block(w: &[&[f32]], x: &[&[f32]], out: &mut [[f32; INPUTS]; ROWS]) {
    let k = w.first().map_or(0, |r| r.len());
    let fits = w.len() <= ROWS
        && x.len() <= INPUTS
        && w.iter().all(|r| r.len() == k)
        && x.iter().all(|xi| xi.len() >= k);
    #[cfg(target_arch = "x86_64")]
    if fits && super::kernels::has_avx2_fma() && w.len() == ROWS && x.len() == INPUTS {
        let w4: [&[f32]; ROWS] = std::array::from_fn(|r| w[r]);
        let x3: [&[f32]; INPUTS] = std::array::from_fn(|n| x[n]);
        // SAFETY: AVX2 and FMA are available; every `x[n]` is at least `k` long (checked).
        *out = unsafe { block_avx2(w4, x3) };
        return;
    }
    let _ = fits;
    for (r, wr) in w.iter().enumerate().take(ROWS) {
        for (n, xn) in x.iter().enumerate().take(INPUTS) {
            // `dot4` with the same input four times: its lane order, one pair.
            out[r][n] = super::kernels::dot4(wr, [xn, xn, xn, xn])[0];
        }
    }
}

/// 4 x 3 pairs, one 8-lane accumulator each (as `dot4_avx2`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn block_avx2(w: [&[f32]; ROWS], x: [&[f32]; INPUTS]) -> [[f32; INPUTS]; ROWS] {
    use std::arch::x86_64::*;
    let n = w[0].len();
    let pw = w.map(|r| r.as_ptr());
    let px = x.map(|r| r.as_ptr());
    let mut acc = [[_mm256_setzero_ps(); INPUTS]; ROWS];
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: `i + 8 <= n`, and every row and input holds at least `n` floats.
        unsafe {
            let vw = pw.map(|p| _mm256_loadu_ps(p.add(i)));
            for (j, &p) in px.iter().enumerate() {
                let vx = _mm256_loadu_ps(p.add(i));
                for (r, a) in acc.iter_mut().enumerate() {
                    a[j] = _mm256_fmadd_ps(vw[r], vx, a[j]);
                }
            }
        }
        i += 8;
    }
    let mut out = [[0.0f32; INPUTS]; ROWS];
    for r in 0..ROWS {
        for j in 0..INPUTS {
            let s = acc[r][j];
            let h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
            let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
            let h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
            out[r][j] = _mm_cvtss_f32(h);
            for t in i..n {
                out[r][j] += w[r][t] * x[j][t];
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::kernels::dot4;

    /// A deterministic xorshift stream of floats in about -4..4, with a few huge and zero.
    fn values(seed: u64, n: usize) -> Vec<f32> {
        let mut s = seed | 1;
        (0..n)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                match i % 97 {
                    3 => 3e30,
                    5 => 0.0,
                    _ => ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0,
                }
            })
            .collect()
    }

    #[test]
    fn block_equals_dot4_bit_for_bit() {
        // Lengths around the 8-lane step, odd tails; buffers offset by one float (unaligned).
        for (case, k) in [1usize, 7, 8, 9, 31, 64, 100, 257].into_iter().enumerate() {
            let wb = values(case as u64 + 1, ROWS * k + 1);
            let xb = values(case as u64 + 99, INPUTS * (k + 3) + 1);
            let w: Vec<&[f32]> = (0..ROWS).map(|r| &wb[1 + r * k..1 + (r + 1) * k]).collect();
            // Inputs longer than the rows: only the first `k` count.
            let x: Vec<&[f32]> = (0..INPUTS)
                .map(|n| &xb[1 + n * (k + 3)..1 + (n + 1) * (k + 3)])
                .collect();
            let mut out = [[f32::NAN; INPUTS]; ROWS];
            dot_block(&w, &x, &mut out);
            for r in 0..ROWS {
                let want = dot4(w[r], [x[0], x[1], x[2], x[2]]);
                for n in 0..INPUTS {
                    assert_eq!(
                        out[r][n].to_bits(),
                        want[n].to_bits(),
                        "k {k} row {r} in {n}"
                    );
                }
            }
            // Partial blocks (fewer rows or inputs) take the fallback with the same numerics.
            let mut part = [[f32::NAN; INPUTS]; ROWS];
            dot_block(&w[..3], &x[..2], &mut part);
            for r in 0..3 {
                for n in 0..2 {
                    assert_eq!(part[r][n].to_bits(), out[r][n].to_bits(), "k {k} partial");
                }
            }
        }
    }
}
