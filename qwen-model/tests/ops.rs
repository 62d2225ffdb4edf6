//! CPU backend ops against naive scalar implementations written here (f64 where it helps).
#![allow(clippy::needless_range_loop)] // the naive references index like the formulas

use qwen_model::backend::{
    AttnLayout, Backend, ConvShape, GateLayout, GdnArgs, GdnDims, RopeLayout,
};
use qwen_model::CpuBackend;
// `randn`, `max_diff`: the kit's helpers under this file's short names.
use pn_tests::model::naive_attention;
use pn_tests::{max_abs as max_diff, random_signed as randn};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

#[test]
fn rms_norm_matches_naive() {
    let be = CpuBackend::new(2);
    let mut rng = StdRng::seed_from_u64(1);
    let (rows, n) = (3, 320);
    let x = randn(&mut rng, rows * n, 2.0);
    let w = randn(&mut rng, n, 1.0);
    let mut out = vec![0.0; rows * n];
    be.rms_norm(&x, &w, &mut out, rows, n, 1e-6).unwrap();
    let mut want = vec![0.0f32; rows * n];
    for r in 0..rows {
        let row = &x[r * n..(r + 1) * n];
        let ms: f64 = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / n as f64;
        for i in 0..n {
            want[r * n + i] = (row[i] as f64 / (ms + 1e-6).sqrt() * w[i] as f64) as f32;
        }
    }
    assert!(max_diff(&out, &want) < 1e-5, "{}", max_diff(&out, &want));

    // Strided in-place form (per-head norm inside an interleaved [q | gate] buffer).
    let mut buf = x.clone();
    let dh = 64;
    be.rms_norm_strided(
        &mut buf,
        &w[..dh].to_vec(),
        dh,
        2 * dh,
        rows * n / (2 * dh),
        1e-6,
    )
    .unwrap();
    for h in 0..rows * n / (2 * dh) {
        let src = &x[h * 2 * dh..h * 2 * dh + dh];
        let ms: f64 = src.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / dh as f64;
        for i in 0..dh {
            let want = src[i] as f64 / (ms + 1e-6).sqrt() * w[i] as f64;
            assert!((buf[h * 2 * dh + i] as f64 - want).abs() < 1e-5);
            // The gate half is untouched.
            assert_eq!(buf[h * 2 * dh + dh + i], x[h * 2 * dh + dh + i]);
        }
    }
}

#[test]
fn gated_rms_norm_swiglu_sigmoid_gate_match_naive() {
    let be = CpuBackend::new(2);
    let mut rng = StdRng::seed_from_u64(2);
    let (n, heads) = (128, 6);
    let x = randn(&mut rng, n * heads, 1.5);
    let z = randn(&mut rng, n * heads, 3.0);
    let w = randn(&mut rng, n, 1.0);
    let mut got = x.clone();
    be.gated_rms_norm(&mut got, &z, &w, n * heads, n, 1e-6)
        .unwrap();
    for h in 0..heads {
        let row = &x[h * n..(h + 1) * n];
        let ms: f64 = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / n as f64;
        for i in 0..n {
            let zz = z[h * n + i] as f64;
            let want = row[i] as f64 / (ms + 1e-6).sqrt() * w[i] as f64 * zz * sigmoid(zz);
            assert!((got[h * n + i] as f64 - want).abs() < 1e-5);
        }
    }

    let mut g = z.clone();
    be.swiglu(&mut g, &x, x.len()).unwrap();
    for i in 0..x.len() {
        let want = z[i] as f64 * sigmoid(z[i] as f64) * x[i] as f64;
        assert!((g[i] as f64 - want).abs() < 1e-5);
    }

    // sigmoid_gate reads the gate from an interleaved [q | gate] layout.
    let (tokens, hq, dh) = (2, 3, 8);
    let qg = randn(&mut rng, tokens * hq * 2 * dh, 4.0);
    let o = randn(&mut rng, tokens * hq * dh, 1.0);
    let mut got = o.clone();
    let gate = GateLayout {
        n_heads: hq,
        head_dim: dh,
        offset: dh,
        token_stride: hq * 2 * dh,
        head_stride: 2 * dh,
    };
    be.sigmoid_gate(&mut got, &qg, &gate, tokens).unwrap();
    for t in 0..tokens {
        for h in 0..hq {
            for i in 0..dh {
                let gate = qg[t * hq * 2 * dh + h * 2 * dh + dh + i] as f64;
                let want = o[(t * hq + h) * dh + i] as f64 * sigmoid(gate);
                assert!((got[(t * hq + h) * dh + i] as f64 - want).abs() < 1e-6);
            }
        }
    }
}

#[test]
fn rope_matches_complex_rotation() {
    let be = CpuBackend::new(1);
    let mut rng = StdRng::seed_from_u64(3);
    let (tokens, heads, dh, n_rot, theta, pos0) = (5, 3, 256, 64, 1e7f32, 1000);
    let stride = 2 * dh; // q heads inside the [q | gate] layout
    let x = randn(&mut rng, tokens * heads * stride, 1.0);
    let mut got = x.clone();
    let layout = RopeLayout {
        n_heads: heads,
        head_stride: stride,
        token_stride: heads * stride,
        n_rot,
    };
    be.rope(&mut got, &layout, tokens, pos0, theta).unwrap();
    let half = n_rot / 2;
    for t in 0..tokens {
        for h in 0..heads {
            let base = t * heads * stride + h * stride;
            for i in 0..half {
                // (x_i + i x_{i+half}) * e^{i pos theta^(-2i/n_rot)}
                let ang = (pos0 + t) as f64 * (theta as f64).powf(-((2 * i) as f64) / n_rot as f64);
                let (re, im) = (x[base + i] as f64, x[base + i + half] as f64);
                let (c, s) = (ang.cos(), ang.sin());
                assert!((got[base + i] as f64 - (re * c - im * s)).abs() < 1e-5);
                assert!((got[base + i + half] as f64 - (re * s + im * c)).abs() < 1e-5);
            }
            // Everything past the rotary dims passes through, including the gate half.
            for i in n_rot..stride {
                assert_eq!(got[base + i], x[base + i]);
            }
        }
    }
}

#[test]
fn attention_matches_naive_softmax() {
    let be = CpuBackend::new(2);
    let mut rng = StdRng::seed_from_u64(4);
    let (hq, hkv, dh) = (6, 2, 64);
    let layout = AttnLayout {
        n_q_heads: hq,
        n_kv_heads: hkv,
        head_dim: dh,
        q_token_stride: hq * 2 * dh,
        q_head_stride: 2 * dh,
        scale: 1.0 / (dh as f32).sqrt(),
    };
    let (pos0, n_tokens) = (9, 4);
    let ctx = pos0 + n_tokens;
    let k = randn(&mut rng, ctx * hkv * dh, 3.0);
    let v = randn(&mut rng, ctx * hkv * dh, 1.0);
    let q = randn(&mut rng, n_tokens * hq * 2 * dh, 3.0);
    let mut out = vec![0.0; n_tokens * hq * dh];
    let (kc, vc) = (
        qwen_model::cpu::CpuKv::F32(k.clone()),
        qwen_model::cpu::CpuKv::F32(v.clone()),
    );
    be.attention(&q, &kc, &vc, &mut out, &layout, pos0..pos0 + n_tokens)
        .unwrap();
    let want = naive_attention(&q, &k, &v, &layout, n_tokens, pos0);
    let d = max_diff(&out, &want);
    assert!(d < 1e-5, "attention max diff {d}");
}

/// Causal depthwise conv over the whole sequence with zero padding, then SiLU.
fn naive_conv(u: &[f32], w: &[f32], n_tokens: usize, c: usize, k: usize) -> Vec<f32> {
    let mut y = vec![0.0; n_tokens * c];
    for t in 0..n_tokens {
        for ch in 0..c {
            let mut acc = 0.0f64;
            for tap in 0..k {
                // Tap k-1 multiplies the current token, tap 0 the one k-1 steps back.
                let src = t as isize - (k - 1 - tap) as isize;
                if src >= 0 {
                    acc += w[ch * k + tap] as f64 * u[src as usize * c + ch] as f64;
                }
            }
            y[t * c + ch] = (acc * sigmoid(acc)) as f32;
        }
    }
    y
}

#[test]
fn conv1d_in_pieces_matches_whole_sequence() {
    let be = CpuBackend::new(2);
    let mut rng = StdRng::seed_from_u64(5);
    let (n, c, k) = (11, 600, 4);
    let u = randn(&mut rng, n * c, 1.0);
    let w = randn(&mut rng, c * k, 0.5);
    let want = naive_conv(&u, &w, n, c, k);
    for pieces in [vec![11], vec![1; 11], vec![2, 5, 1, 3]] {
        let mut state = vec![0.0; (k - 1) * c];
        let mut got = Vec::new();
        let mut t0 = 0;
        for p in pieces {
            let mut y = vec![0.0; p * c];
            be.conv1d_silu(
                &u[t0 * c..(t0 + p) * c].to_vec(),
                &w,
                &mut state,
                &mut y,
                ConvShape {
                    channels: c,
                    kernel: k,
                },
                p,
            )
            .unwrap();
            got.extend_from_slice(&y);
            t0 += p;
        }
        let d = max_diff(&got, &want);
        assert!(d < 1e-5, "conv max diff {d}");
    }
}

struct GdnCase {
    dims: GdnDims,
    y: Vec<f32>,
    b: Vec<f32>,
    alpha: Vec<f32>,
    a: Vec<f32>,
    dt_bias: Vec<f32>,
    n: usize,
}

fn gdn_case(seed: u64, n: usize) -> GdnCase {
    let mut rng = StdRng::seed_from_u64(seed);
    let dims = GdnDims {
        n_k_heads: 2,
        n_v_heads: 6,
        dk: 32,
        dv: 24,
        conv_kernel: 4,
    };
    GdnCase {
        y: randn(&mut rng, n * dims.conv_dim(), 1.0),
        b: randn(&mut rng, n * dims.n_v_heads, 3.0),
        alpha: randn(&mut rng, n * dims.n_v_heads, 3.0),
        a: (0..dims.n_v_heads)
            .map(|_| -rng.random_range(0.01f32..16.0))
            .collect(),
        dt_bias: randn(&mut rng, dims.n_v_heads, 2.0),
        dims,
        n,
    }
}

/// The delta rule as the architecture reference states it, HF state layout S[i][j] (key i,
/// value j), f64, value head p paired with key head p mod Hk.
fn naive_gdn(c: &GdnCase) -> Vec<f32> {
    let d = &c.dims;
    let key_dim = d.n_k_heads * d.dk;
    let mut s = vec![vec![vec![0.0f64; d.dv]; d.dk]; d.n_v_heads];
    let mut out = vec![0.0f32; c.n * d.value_dim()];
    for t in 0..c.n {
        let row = &c.y[t * d.conv_dim()..(t + 1) * d.conv_dim()];
        for p in 0..d.n_v_heads {
            let kh = p % d.n_k_heads;
            let l2 = |v: &[f32]| {
                let ss: f64 = v.iter().map(|&x| (x as f64).powi(2)).sum();
                v.iter()
                    .map(|&x| x as f64 / (ss + 1e-6).sqrt())
                    .collect::<Vec<f64>>()
            };
            let q: Vec<f64> = l2(&row[kh * d.dk..(kh + 1) * d.dk])
                .iter()
                .map(|x| x / (d.dk as f64).sqrt())
                .collect();
            let k = l2(&row[key_dim + kh * d.dk..key_dim + (kh + 1) * d.dk]);
            let v = &row[2 * key_dim + p * d.dv..2 * key_dim + (p + 1) * d.dv];
            let beta = sigmoid(c.b[t * d.n_v_heads + p] as f64);
            let x = c.alpha[t * d.n_v_heads + p] as f64 + c.dt_bias[p] as f64;
            let sp = if x > 20.0 { x } else { x.exp().ln_1p() };
            let decay = (sp * c.a[p] as f64).exp();
            let sp_ = &mut s[p];
            for row in sp_.iter_mut() {
                for e in row.iter_mut() {
                    *e *= decay;
                }
            }
            for j in 0..d.dv {
                let pred: f64 = (0..d.dk).map(|i| sp_[i][j] * k[i]).sum();
                let dj = beta * (v[j] as f64 - pred);
                for i in 0..d.dk {
                    sp_[i][j] += k[i] * dj;
                }
            }
            for j in 0..d.dv {
                out[t * d.value_dim() + p * d.dv + j] =
                    (0..d.dk).map(|i| sp_[i][j] * q[i]).sum::<f64>() as f32;
            }
        }
    }
    out
}

/// Runs the backend's delta rule over `pieces` consecutive calls (state carried).
fn run_gdn(be: &CpuBackend, c: &GdnCase, pieces: &[usize]) -> Vec<f32> {
    let d = &c.dims;
    let mut state = vec![0.0; d.state_len()];
    let mut got = Vec::new();
    let mut t0 = 0;
    for &p in pieces {
        let mut y = c.y[t0 * d.conv_dim()..(t0 + p) * d.conv_dim()].to_vec();
        let mut b = c.b[t0 * d.n_v_heads..(t0 + p) * d.n_v_heads].to_vec();
        let mut al = c.alpha[t0 * d.n_v_heads..(t0 + p) * d.n_v_heads].to_vec();
        let mut out = vec![0.0; p * d.value_dim()];
        be.gated_delta_rule(GdnArgs {
            dims: d,
            n_tokens: p,
            y: &mut y,
            b: &mut b,
            alpha: &mut al,
            a: &c.a,
            dt_bias: &c.dt_bias,
            state: &mut state,
            out: &mut out,
        })
        .unwrap();
        got.extend_from_slice(&out);
        t0 += p;
    }
    assert_eq!(t0, c.n);
    got
}

#[test]
fn delta_rule_recurrent_matches_naive() {
    let c = gdn_case(6, 40);
    let mut be = CpuBackend::new(2);
    be.set_gdn_chunked(false);
    let want = naive_gdn(&c);
    let got = run_gdn(&be, &c, &[40]);
    let d = max_diff(&got, &want);
    assert!(d < 1e-4, "recurrent vs naive {d}");
    let got = run_gdn(&be, &c, &[1; 40]);
    assert!(max_diff(&got, &want) < 1e-4);
}

#[test]
fn delta_rule_chunked_matches_recurrent() {
    // 150 tokens: two full chunks of 64 and a tail, in one call and in uneven pieces.
    let c = gdn_case(7, 150);
    let mut rec = CpuBackend::new(2);
    rec.set_gdn_chunked(false);
    let want = run_gdn(&rec, &c, &[150]);
    let naive = naive_gdn(&c);
    assert!(max_diff(&want, &naive) < 1e-4);
    let chunked = CpuBackend::new(2);
    for pieces in [vec![150], vec![70, 3, 77], vec![20, 1, 129]] {
        let got = run_gdn(&chunked, &c, &pieces);
        let d = max_diff(&got, &want);
        assert!(d < 1e-4, "chunked {pieces:?} vs recurrent {d}");
    }
}

#[test]
fn add_and_copy_ops() {
    let be = CpuBackend::new(1);
    let mut x = vec![1.0, 2.0, 3.0];
    be.add(&mut x, &vec![0.5, 0.5, 0.5], 2).unwrap();
    assert_eq!(x, vec![1.5, 2.5, 3.0]);
    let mut y = vec![0.0; 4];
    be.copy(&x, 1, &mut y, 2, 2).unwrap();
    assert_eq!(y, vec![0.0, 0.0, 2.5, 3.0]);
}

#[test]
fn simd_dot_dot4_and_axpy_match_scalar() {
    use qwen_model::cpu::kernels::{axpy, axpy_scalar, dot, dot_scalar};
    // dot4's scalar fallback is dot_scalar per row; its AVX2 path is compared to f64 below.
    let mut rng = StdRng::seed_from_u64(8);
    // Lengths around the 8- and 32-lane boundaries, plus odd tails.
    for n in [0usize, 1, 7, 8, 9, 31, 32, 33, 64, 100, 257, 1280] {
        let a = randn(&mut rng, n, 2.0);
        let b = randn(&mut rng, n, 2.0);
        let exact: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
        let mag: f64 = a
            .iter()
            .zip(&b)
            .map(|(&x, &y)| (x as f64 * y as f64).abs())
            .sum();
        for got in [dot(&a, &b), dot_scalar(&a, &b)] {
            assert!(
                (got as f64 - exact).abs() <= 1e-6 * (1.0 + mag),
                "n={n}: {got} vs {exact}"
            );
        }
        let c = randn(&mut rng, n, 1.0);
        let four = qwen_model::cpu::kernels::dot4(&a, [&b, &c, &a, &b]);
        for (got, x) in four.iter().zip([&b, &c, &a, &b]) {
            let exact: f64 = a
                .iter()
                .zip(x.iter())
                .map(|(&p, &q)| p as f64 * q as f64)
                .sum();
            let mag: f64 = a
                .iter()
                .zip(x.iter())
                .map(|(&p, &q)| (p as f64 * q as f64).abs())
                .sum();
            assert!(
                (*got as f64 - exact).abs() <= 1e-6 * (1.0 + mag),
                "dot4 n={n}"
            );
        }
        let mut y1 = b.clone();
        let mut y2 = b.clone();
        axpy(&mut y1, 0.37, &a);
        axpy_scalar(&mut y2, 0.37, &a);
        // FMA rounds once, mul+add twice: equal to within one ulp-ish.
        assert!(max_diff(&y1, &y2) <= 1e-6, "axpy n={n}");
    }
}

/// A layout with the query heads packed `head_dim` apart, and random keys and values for `ctx`
/// positions and queries for `n_tokens` rows (drawn in that order: k, v, q).
fn packed_attention_case(
    rng: &mut StdRng,
    (hq, hkv, dh): (usize, usize, usize),
    ctx: usize,
    n_tokens: usize,
) -> (AttnLayout, Vec<f32>, Vec<f32>, Vec<f32>) {
    let layout = AttnLayout {
        n_q_heads: hq,
        n_kv_heads: hkv,
        head_dim: dh,
        q_token_stride: hq * dh,
        q_head_stride: dh,
        scale: 1.0 / (dh as f32).sqrt(),
    };
    let k = randn(rng, ctx * hkv * dh, 3.0);
    let v = randn(rng, ctx * hkv * dh, 1.0);
    let q = randn(rng, n_tokens * hq * dh, 3.0);
    (layout, k, v, q)
}

#[test]
fn attention_over_f16_cache_matches_naive_on_rounded_values() {
    let be = CpuBackend::new(2);
    let mut rng = StdRng::seed_from_u64(9);
    let (hq, hkv, dh) = (4, 2, 128);
    let (pos0, n_tokens) = (20, 3);
    let ctx = pos0 + n_tokens;
    let (layout, k, v, q) = packed_attention_case(&mut rng, (hq, hkv, dh), ctx, n_tokens);
    let mut kc = be
        .alloc_kv(ctx * hkv * dh, qwen_model::KvCacheType::F16)
        .unwrap();
    let mut vc = be
        .alloc_kv(ctx * hkv * dh, qwen_model::KvCacheType::F16)
        .unwrap();
    be.kv_write(&k, &mut kc, 0, k.len()).unwrap();
    be.kv_write(&v, &mut vc, 0, v.len()).unwrap();
    let mut out = vec![0.0; n_tokens * hq * dh];
    be.attention(&q, &kc, &vc, &mut out, &layout, pos0..pos0 + n_tokens)
        .unwrap();
    let round = |x: &[f32]| {
        x.iter()
            .map(|&a| half::f16::from_f32(a).to_f32())
            .collect::<Vec<_>>()
    };
    let want = naive_attention(&q, &round(&k), &round(&v), &layout, n_tokens, pos0);
    let d = max_diff(&out, &want);
    assert!(d < 1e-5, "f16 cache attention max diff {d}");
}

/// Resident memory of this process in KiB (`VmRSS` of `/proc/self/status`).
#[cfg(target_os = "linux")]
fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = s.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// `alloc_dense` (the recurrent state) is zeroed like `alloc` and resident at once; `alloc`
/// (workspaces, and the KV cache's `alloc_kv`) stays lazy, so an unused capacity costs no
/// memory.
#[cfg(target_os = "linux")]
#[test]
fn dense_buffers_are_zero_and_resident_lazy_ones_are_not() {
    let be = CpuBackend::new(1);
    for len in [0usize, 1, 1023, 1025, 5000] {
        let v = be.alloc_dense(len).unwrap();
        assert_eq!(v.len(), len);
        assert!(v.iter().all(|&x| x == 0.0), "len {len}");
    }
    let len = 64 << 20; // floats: 256 MiB
    let before = rss_kib();
    let lazy = be.alloc(len).unwrap();
    let after_lazy = rss_kib();
    let dense = be.alloc_dense(len).unwrap();
    let after_dense = rss_kib();
    assert!(
        after_lazy < before + (32 << 10),
        "alloc committed {} KiB",
        after_lazy - before
    );
    assert!(
        after_dense > after_lazy + (200 << 10),
        "alloc_dense committed only {} KiB",
        after_dense.saturating_sub(after_lazy)
    );
    assert!(dense[len - 1] == 0.0 && lazy[len - 1] == 0.0);
}

/// The blocked attention (`kernels::attention_rows`: a GQA group's rows walk the keys together
/// in blocks of 16) against one row and key at a time (`attention_rows_each`) and the naive
/// definition, on a context of several key blocks with a ragged last one, 8 query heads per kv
/// head, head dim 256, and f32, f16 and q8_0 caches; and bit-identical whatever the split of the
/// rows across calls (threads), including splits inside a group.
#[test]
fn blocked_attention_matches_row_by_row_and_any_row_split() {
    use half::f16;
    use qwen_model::cpu::kernels::{attention_rows, attention_rows_each, KvElem};
    use qwen_model::cpu::kvquant::{dequantize_into, quantize_into, BlockQ8_0, QuantBlock, QK};

    fn run<K: KvElem, V: KvElem>(
        q: &[f32],
        k: &[K],
        v: &[V],
        l: &AttnLayout,
        (pos0, n_tokens): (usize, usize),
        splits: &[usize],
        each: bool,
    ) -> Vec<f32> {
        let rows = n_tokens * l.n_q_heads;
        let mut out = vec![f32::NAN; rows * l.head_dim];
        let mut bounds = vec![0];
        bounds.extend(splits.iter().copied().filter(|&s| s < rows));
        bounds.push(rows);
        for w in bounds.windows(2) {
            // SAFETY: `out` holds every row; the ranges are disjoint.
            unsafe {
                if each {
                    attention_rows_each(q, k, v, out.as_mut_ptr(), l, pos0, w[0]..w[1]);
                } else {
                    attention_rows(q, k, v, out.as_mut_ptr(), l, pos0, w[0]..w[1]);
                }
            }
        }
        out
    }

    let mut rng = StdRng::seed_from_u64(31);
    let (hq, hkv, dh) = (16, 2, 256);
    let (pos0, n_tokens) = (70, 5);
    let ctx = pos0 + n_tokens;
    let (layout, k, v, q) = packed_attention_case(&mut rng, (hq, hkv, dh), ctx, n_tokens);
    let splits: [&[usize]; 3] = [&[], &[3, 11, 37, 40], &[1, 2, 8, 9, 17, 63]];
    let l = &layout;

    // f32 cache.
    let want = naive_attention(&q, &k, &v, l, n_tokens, pos0);
    let each = run(&q, &k, &v, l, (pos0, n_tokens), &[], true);
    let blocked = run(&q, &k, &v, l, (pos0, n_tokens), splits[0], false);
    assert!(
        max_diff(&blocked, &want) < 2e-5,
        "{}",
        max_diff(&blocked, &want)
    );
    assert!(
        max_diff(&blocked, &each) < 2e-5,
        "{}",
        max_diff(&blocked, &each)
    );
    for s in &splits[1..] {
        let split = run(&q, &k, &v, l, (pos0, n_tokens), s, false);
        let same = split
            .iter()
            .zip(&blocked)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "f32 cache, split {s:?}");
    }

    // f16 cache: against the naive attention of the rounded values.
    let (k16, v16): (Vec<f16>, Vec<f16>) = (
        k.iter().map(|&x| f16::from_f32(x)).collect(),
        v.iter().map(|&x| f16::from_f32(x)).collect(),
    );
    let widen = |x: &[f16]| x.iter().map(|a| a.to_f32()).collect::<Vec<f32>>();
    let want = naive_attention(&q, &widen(&k16), &widen(&v16), l, n_tokens, pos0);
    let blocked = run(&q, &k16, &v16, l, (pos0, n_tokens), splits[0], false);
    assert!(
        max_diff(&blocked, &want) < 2e-5,
        "{}",
        max_diff(&blocked, &want)
    );
    for s in &splits[1..] {
        let split = run(&q, &k16, &v16, l, (pos0, n_tokens), s, false);
        let same = split
            .iter()
            .zip(&blocked)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "f16 cache, split {s:?}");
    }

    // q8_0 cache: against the naive attention of the dequantized values.
    let zero = BlockQ8_0::quantize_block(&[0.0; QK]);
    let (mut k8, mut v8) = (vec![zero; k.len() / QK], vec![zero; v.len() / QK]);
    quantize_into(&k, &mut k8);
    quantize_into(&v, &mut v8);
    let (mut kd, mut vd) = (vec![0f32; k.len()], vec![0f32; v.len()]);
    dequantize_into(&k8, &mut kd);
    dequantize_into(&v8, &mut vd);
    let want = naive_attention(&q, &kd, &vd, l, n_tokens, pos0);
    let each = run(&q, &k8, &v8, l, (pos0, n_tokens), &[], true);
    let blocked = run(&q, &k8, &v8, l, (pos0, n_tokens), splits[2], false);
    assert!(
        max_diff(&blocked, &want) < 2e-5,
        "{}",
        max_diff(&blocked, &want)
    );
    assert!(
        max_diff(&blocked, &each) < 2e-5,
        "{}",
        max_diff(&blocked, &each)
    );
}
