//! The device argmax / top-k (kernels/topk.cu) run on the host by the SIMT emulator against the
//! CPU sampler's order (pn-runtime `sampling::argmax` and `by_logit_desc`: finite values only,
//! higher first, equal values to the lower id), on random rows, heavy ties across the per-block
//! slices, NaN / +-inf, rows with fewer finite values than k, and the 27B vocabulary (248,320).
mod common;

use common::*;
use pn_kernels::emu_ops;
use rand::Rng;

/// The k best (index, value) of `x` in the sampler's order, padded with (-1, -inf).
fn cpu_top_k(x: &[f32], k: usize) -> Vec<(i32, f32)> {
    let mut c: Vec<(i32, f32)> = x
        .iter()
        .enumerate()
        .filter(|(_, v)| v.is_finite())
        .map(|(i, &v)| (i as i32, v))
        .collect();
    c.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    c.truncate(k);
    c.resize(k, (-1, f32::NEG_INFINITY));
    c
}

fn check(what: &str, x: &[f32], k: usize) {
    let (got, s) = emu_ops::top_k(x, k).unwrap();
    let want = cpu_top_k(x, k);
    for (r, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            g.0 == w.0 && g.1.to_bits() == w.1.to_bits(),
            "{what} (n {}, k {k}): rank {r}: got {g:?} want {w:?}",
            x.len()
        );
    }
    assert_eq!(s.smem_max_degree, 1.0, "{what}: bank conflict");
    // Every logit is read once (coalesced): the launch's footprint is the row.
    let row_bytes = 4 * x.len() as u64;
    assert!(
        s.unique_bytes(pn_kernels::emu::region::X) >= row_bytes
            && s.unique_bytes(pn_kernels::emu::region::X) < row_bytes + 64,
        "{what}: read {} bytes of a {row_bytes}-byte row",
        s.unique_bytes(pn_kernels::emu::region::X)
    );
    assert!(
        s.sector_ratio(pn_kernels::emu::region::X) <= 1.0 + 1e-9,
        "{what}: uncoalesced"
    );
}

#[test]
fn top_k_equals_the_cpu_order_on_random_and_tied_rows() {
    let mut r = rng(71);
    let slice = emu_ops::top_k_slice();
    // The kernel's constants are the ones the CUDA wrapper sizes its grid and scratch by.
    assert_eq!(slice, pn_kernels::launch::TOP_K_SLICE);
    assert_eq!(emu_ops::top_k_max(), pn_kernels::launch::TOP_K_MAX);
    // (The emulator runs each of the k rounds as block-wide barriers: small k on long rows.)
    for (n, k) in [(1000, 1), (1000, 7), (3 * slice + 5, 12), (37, 64)] {
        let x = random_vec(&mut r, n, 4.0);
        check("random", &x, k);
        // Heavy ties: values from {0, 1, 2}, equal maxima in every slice; the lowest ids win.
        let tied: Vec<f32> = (0..n).map(|_| r.random_range(0..3) as f32).collect();
        check("ties", &tied, k);
    }
    // The maximum in a later slice first, then an equal one at a lower index in an earlier one.
    let mut x = vec![0.5f32; 3 * slice];
    x[2 * slice + 9] = 3.0;
    x[slice + 1] = 3.0;
    x[300] = 3.0;
    check("tie across slices", &x, 1);
    assert_eq!(emu_ops::top_k(&x, 1).unwrap().0[0], (300, 3.0));
}

#[test]
fn top_k_skips_nan_and_infinities_like_the_sampler() {
    let mut r = rng(72);
    let n = 2 * emu_ops::top_k_slice() + 77;
    let mut x = random_vec(&mut r, n, 2.0);
    for i in (0..n).step_by(5) {
        x[i] = match i % 3 {
            0 => f32::NAN,
            1 => f32::INFINITY,
            _ => f32::NEG_INFINITY,
        };
    }
    x[11] = -f32::NAN; // a negative NaN too
    check("non-finite", &x, 1);
    check("non-finite", &x, 9);
    // No finite value at all: every slot is empty (the sampler then falls back to the lowest
    // allowed id on the host).
    let bad: Vec<f32> = (0..300)
        .map(|i| [f32::NAN, f32::INFINITY, f32::NEG_INFINITY][i % 3])
        .collect();
    let (got, _) = emu_ops::top_k(&bad, 5).unwrap();
    assert!(got.iter().all(|c| c.0 == -1), "{got:?}");
    // Fewer finite values than k: they come first, then empty slots.
    let mut few = vec![f32::NAN; 500];
    few[499] = -1.0;
    few[3] = 2.0;
    check("few finite", &few, 10);
    // Bad k is refused, not launched.
    assert!(emu_ops::top_k(&x, 0).is_err());
    assert!(emu_ops::top_k(&x, emu_ops::top_k_max() + 1).is_err());
}

#[test]
fn top_k_at_the_27b_vocabulary() {
    let mut r = rng(73);
    let x = random_vec(&mut r, 248_320, 10.0);
    check("27B vocab", &x, 1);
    check("27B vocab", &x, 4);
}
