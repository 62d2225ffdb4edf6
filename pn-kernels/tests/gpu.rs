//! GPU tests: every kernel against a CPU reference on random shapes. They need a CUDA device and
//! a build with kernels, so they are `#[ignore]`d; run them with
//! `cargo test -p pn-kernels --test gpu -- --ignored --nocapture`. Without a device each test
//! prints why it skipped and passes.
#![cfg(feature = "cuda")]
// The CPU references index several arrays with one loop variable, as the math is written.
#![allow(clippy::needless_range_loop)]

mod common;

use common::*;
use gguf_io::{quants, GgmlType};
use half::f16;
use pn_kernels::cudarc::driver::{CudaSlice, CudaStream, ValidAsZeroBits};
use pn_kernels::{
    AttnShape, DeltaRuleInputs, DeltaRuleShape, Gpu, KvElem, KvLayout, KvStoreRows, MatrixShape,
    NormShape, PnPrecision, Q4KvByte, Q8KvByte, RowLayout, RowStrides, SplitK, WeightType,
};
use rand::Rng;
use std::sync::Arc;

fn gpu() -> Option<Gpu> {
    match pn_kernels::gpu_or_reason(0) {
        Ok(g) => Some(g),
        Err(why) => {
            eprintln!("SKIPPED (no GPU): {why}");
            None
        }
    }
}

fn up<T: pn_kernels::cudarc::driver::DeviceRepr>(s: &Arc<CudaStream>, v: &[T]) -> CudaSlice<T> {
    s.clone_htod(v).expect("upload")
}
fn down<T: pn_kernels::cudarc::driver::DeviceRepr + Default + Clone>(
    s: &Arc<CudaStream>,
    v: &CudaSlice<T>,
) -> Vec<T> {
    s.clone_dtoh(v).expect("download")
}
fn zeros(s: &Arc<CudaStream>, n: usize) -> CudaSlice<f32> {
    s.alloc_zeros::<f32>(n).expect("alloc")
}

/// Max |got - want| / (scale), asserting it is <= tol; returns it for the log.
fn assert_close(what: &str, got: &[f32], want: &[f64], scale: &[f64], tol: f64) -> f64 {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let mut worst = 0f64;
    for i in 0..got.len() {
        let e = (got[i] as f64 - want[i]).abs() / scale[i].max(1e-30);
        assert!(
            e <= tol,
            "{what}: element {i}: got {} want {} (rel {e:.3e} > {tol:.1e})",
            got[i],
            want[i]
        );
        worst = worst.max(e);
    }
    eprintln!("{what}: max relative error {worst:.3e} (bound {tol:.1e})");
    worst
}

fn matvec_ref(wd: &[f32], x: &[f32], n: usize, k: usize) -> (Vec<f64>, Vec<f64>) {
    let mut y = vec![0f64; n];
    let mut s = vec![0f64; n];
    for r in 0..n {
        for c in 0..k {
            let p = wd[r * k + c] as f64 * x[c] as f64;
            y[r] += p;
            s[r] += p.abs();
        }
    }
    (y, s)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn pn_gemv_matches_f64_reference() {
    let Some(g) = gpu() else { return };
    let s = g.stream().clone();
    let mut r = rng(10);
    // (type, n, k): the 27B shapes' K plus odd block counts and tails.
    let shapes = [
        (WeightType::Pn3t, 512, 5120),
        (WeightType::Pn3t, 4100, 5120),
        (WeightType::Pn3t, 37, 320),
        (WeightType::Pn3t, 33, 400), // 5 blocks per row: odd
        (WeightType::Pn4t, 300, 6144),
        (WeightType::Pn4t, 4097, 1024),
        (WeightType::Pn4t, 64, 17408),
        (WeightType::Pn4t, 45, 704), // 11 blocks per row: odd
    ];
    for (ty, n, k) in shapes {
        let w = random_weights(&mut r, ty, n, k);
        let mut x = random_vec(&mut r, k, 3.0);
        x[r.random_range(0..k)] = 900.0; // an outlier: the fp16 path must not overflow
        let (want, scale) = matvec_ref(&dequant(ty, &w, n, k), &x, n, k);
        let (dw, dx) = (up(&s, &w), up(&s, &x));
        for (prec, tol) in [(PnPrecision::F32, 1e-5), (PnPrecision::Half2, 2e-3)] {
            let mut dy = zeros(&s, n);
            let m = MatrixShape { ty, n, k };
            g.pn_gemv(m, prec, &dw.as_view(), &dx.as_view(), &mut dy.as_view_mut())
                .unwrap();
            let got = down(&s, &dy);
            assert_close(
                &format!("{} {prec:?} {n}x{k}", ty.name()),
                &got,
                &want,
                &scale,
                tol,
            );
            if prec == PnPrecision::Half2 {
                // The prepared path (x converted once) gives the same bits.
                let mut xh = s.alloc_zeros::<f16>(k).unwrap();
                let mut de = s.alloc_zeros::<i32>(1).unwrap();
                g.pn_prepare_x(
                    &dx.as_view(),
                    k,
                    &mut xh.as_view_mut(),
                    &mut de.as_view_mut(),
                )
                .unwrap();
                let mut dy2 = zeros(&s, n);
                g.pn_gemv_prepared(
                    m,
                    &dw.as_view(),
                    &xh.as_view(),
                    &de.as_view(),
                    &mut dy2.as_view_mut(),
                )
                .unwrap();
                assert_eq!(down(&s, &dy2), got, "prepared vs self-staged");
            }
            // Bit for bit against the host emulation of the kernel (tests/common).
            let bits = if ty == WeightType::Pn3t { 3 } else { 4 };
            let kernel = if prec == PnPrecision::F32 {
                PnKernel::F32
            } else {
                h2_kernel_for(bits, k)
            };
            let emu = emulate_pn_gemv(bits, kernel, &w, &x, n, k);
            for (i, (a, b)) in got.iter().zip(&emu).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{} {prec:?} {n}x{k} row {i}: device {a} vs emulation {b}",
                    ty.name()
                );
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn stock_gemv_matches_f64_reference() {
    let Some(g) = gpu() else { return };
    let s = g.stream().clone();
    let mut r = rng(11);
    for (ty, n, k) in [
        (WeightType::Q4K, 1000, 5120),
        (WeightType::Q8_0, 48, 5120),
        (WeightType::F16, 77, 512),
        (WeightType::F32, 65, 256),
    ] {
        let w = random_weights(&mut r, ty, n, k);
        let x = random_vec(&mut r, k, 2.0);
        let (want, scale) = matvec_ref(&dequant(ty, &w, n, k), &x, n, k);
        let (dw, dx) = (up(&s, &w), up(&s, &x));
        let mut dy = zeros(&s, n);
        let m = MatrixShape { ty, n, k };
        g.gemv(m, &dw.as_view(), &dx.as_view(), &mut dy.as_view_mut())
            .unwrap();
        assert_close(
            &format!("{} gemv {n}x{k}", ty.name()),
            &down(&s, &dy),
            &want,
            &scale,
            1e-5,
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn get_rows_is_bit_exact() {
    let Some(g) = gpu() else { return };
    let s = g.stream().clone();
    let mut r = rng(12);
    for ty in [
        WeightType::Q3K,
        WeightType::Q8_0,
        WeightType::F16,
        WeightType::F32,
    ] {
        let (n_rows, k) = (300, 512);
        let w = random_weights(&mut r, ty, n_rows, k);
        let dense = dequant(ty, &w, n_rows, k);
        let ids: Vec<i32> = (0..7).map(|_| r.random_range(0..n_rows as i32)).collect();
        let (dw, di) = (up(&s, &w), up(&s, &ids));
        let mut out = zeros(&s, ids.len() * k);
        let m = MatrixShape { ty, n: n_rows, k };
        g.get_rows(
            m,
            &dw.as_view(),
            &di.as_view(),
            &ids,
            &mut out.as_view_mut(),
        )
        .unwrap();
        let got = down(&s, &out);
        for (t, &id) in ids.iter().enumerate() {
            for e in 0..k {
                assert_eq!(
                    got[t * k + e].to_bits(),
                    dense[id as usize * k + e].to_bits(),
                    "{} token {t} elem {e}",
                    ty.name()
                );
            }
        }
        let bad = [n_rows as i32];
        let dbad = up(&s, &bad);
        assert!(g
            .get_rows(
                m,
                &dw.as_view(),
                &dbad.as_view(),
                &bad,
                &mut out.as_view_mut()
            )
            .is_err());
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn matmul_matches_f64_reference() {
    let Some(g) = gpu() else { return };
    let s = g.stream().clone();
    let mut r = rng(13);
    for (ty, n, k, t) in [
        (WeightType::Pn3t, 130, 320, 17),
        (WeightType::Pn4t, 70, 704, 65),
        (WeightType::Q4K, 33, 512, 3),
        (WeightType::Q8_0, 48, 256, 9),
        (WeightType::Q3K, 20, 256, 2),
        (WeightType::F16, 19, 96, 70),
        (WeightType::F32, 64, 64, 64),
    ] {
        let w = random_weights(&mut r, ty, n, k);
        let wd = dequant(ty, &w, n, k);
        let x = random_vec(&mut r, t * k, 2.0);
        let mut want = vec![0f64; t * n];
        let mut scale = vec![0f64; t * n];
        for ti in 0..t {
            let (y, sc) = matvec_ref(&wd, &x[ti * k..(ti + 1) * k], n, k);
            want[ti * n..(ti + 1) * n].copy_from_slice(&y);
            scale[ti * n..(ti + 1) * n].copy_from_slice(&sc);
        }
        let (dw, dx) = (up(&s, &w), up(&s, &x));
        let mut dy = zeros(&s, t * n);
        let rows = RowStrides {
            rows: t,
            x_stride: k,
            y_stride: n,
        };
        let m = MatrixShape { ty, n, k };
        g.matmul(m, &dw.as_view(), &dx.as_view(), &mut dy.as_view_mut(), rows)
            .unwrap();
        assert_close(
            &format!("{} matmul {t}x{n}x{k}", ty.name()),
            &down(&s, &dy),
            &want,
            &scale,
            1e-5,
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn hadamard_matches_pn_format() {
    let Some(g) = gpu() else { return };
    let s = g.stream().clone();
    let mut r = rng(14);
    for (len, rb) in [(5120, 256), (704, 64), (2048, 1024), (8, 2)] {
        let x = random_vec(&mut r, len, 2.0);
        let mut want = x.clone();
        pn_format::fwht_blocks_inplace(&mut want, rb).unwrap();
        let mut dy = up(&s, &x);
        g.hadamard_inplace(&mut dy.as_view_mut(), len, rb).unwrap();
        let norm = (x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / len as f64).sqrt();
        let want64: Vec<f64> = want.iter().map(|v| *v as f64).collect();
        assert_close(
            &format!("hadamard {len}/{rb}"),
            &down(&s, &dy),
            &want64,
            &vec![norm; len],
            1e-5,
        );
    }
}

fn rms_ref(x: &[f32], eps: f64) -> f64 {
    1.0 / ((x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / x.len() as f64) + eps).sqrt()
}
fn silu(v: f64) -> f64 {
    v / (1.0 + (-v).exp())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn norms_match_reference() {
    let Some(g) = gpu() else { return };
    let s = g.stream().clone();
    let mut r = rng(15);
    // 24 q heads of 256 inside a 512-stride buffer (q interleaved with its gate).
    let (rows, n, stride) = (24usize, 256usize, 512usize);
    let x = random_vec(&mut r, rows * stride, 3.0);
    let w = random_vec(&mut r, n, 2.0);
    let z = random_vec(&mut r, rows * n, 4.0);
    let (dx, dw, dz) = (up(&s, &x), up(&s, &w), up(&s, &z));
    let mut want = vec![0f64; rows * n];
    let mut want_g = vec![0f64; rows * n];
    let mut want_l2 = vec![0f64; rows * n];
    for h in 0..rows {
        let row = &x[h * stride..h * stride + n];
        let inv = rms_ref(row, 1e-6);
        let l2 = row
            .iter()
            .map(|v| (*v as f64).powi(2))
            .sum::<f64>()
            .sqrt()
            .max(1e-6);
        for i in 0..n {
            want[h * n + i] = row[i] as f64 * inv * w[i] as f64;
            want_g[h * n + i] = want[h * n + i] * silu(z[h * n + i] as f64);
            want_l2[h * n + i] = row[i] as f64 * 0.125 / l2;
        }
    }
    let mut dy = zeros(&s, rows * n);
    // 2 tokens x 12 heads, heads every 512 floats (as q inside q+gate); y and z contiguous.
    let xl = RowLayout {
        tokens: 2,
        heads: 12,
        tok_stride: 12 * stride,
        head_stride: stride,
    };
    let yl = RowLayout {
        tokens: 2,
        heads: 12,
        tok_stride: 12 * n,
        head_stride: n,
    };
    let norm = NormShape { n, eps: 1e-6 };
    g.rms_norm(
        &dx.as_view(),
        xl,
        &mut dy.as_view_mut(),
        yl,
        Some(&dw.as_view()),
        norm,
    )
    .unwrap();
    let rms_out = down(&s, &dy);
    let scale: Vec<f64> = want.iter().map(|v| v.abs().max(1e-3)).collect();
    assert_close("rms_norm", &rms_out, &want, &scale, 1e-5);
    // The in-place kernels write their rows where `xl` puts them; gathered into `yl`'s
    // contiguous order they compare with the references (and the out-of-place rms_norm).
    let gather = |xi: &[f32]| -> Vec<f32> {
        let mut out = vec![0f32; rows * n];
        for t in 0..2 {
            for h in 0..12 {
                let (a, b) = (t * 12 * stride + h * stride, (t * 12 + h) * n);
                out[b..b + n].copy_from_slice(&xi[a..a + n]);
            }
        }
        out
    };
    let mut dxi = up(&s, &x);
    g.gated_rms_norm_inplace(
        &mut dxi.as_view_mut(),
        xl,
        &dz.as_view(),
        yl,
        &dw.as_view(),
        norm,
    )
    .unwrap();
    let scale: Vec<f64> = want_g.iter().map(|v| v.abs().max(1e-3)).collect();
    assert_close(
        "gated_rms_norm_inplace",
        &gather(&down(&s, &dxi)),
        &want_g,
        &scale,
        1e-5,
    );
    let mut dxi = up(&s, &x);
    g.l2_norm_inplace(&mut dxi.as_view_mut(), xl, norm, 0.125)
        .unwrap();
    let scale: Vec<f64> = want_l2.iter().map(|v| v.abs().max(1e-4)).collect();
    assert_close(
        "l2_norm_inplace",
        &gather(&down(&s, &dxi)),
        &want_l2,
        &scale,
        1e-5,
    );
    // In place gives the same bits as out of place.
    let mut dxi = up(&s, &x);
    g.rms_norm_inplace(&mut dxi.as_view_mut(), xl, Some(&dw.as_view()), norm)
        .unwrap();
    assert_eq!(gather(&down(&s, &dxi)), rms_out, "rms_norm_inplace");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn rope_matches_reference() {
    let Some(g) = gpu() else { return };
    let s = g.stream().clone();
    let mut r = rng(16);
    let (t, heads, hd, n_rot) = (5usize, 4usize, 256usize, 64usize);
    let x = random_vec(&mut r, t * heads * hd, 2.0);
    let pos: Vec<i32> = vec![0, 1, 77, 4095, 262143];
    let mut want: Vec<f64> = x.iter().map(|v| *v as f64).collect();
    for ti in 0..t {
        for h in 0..heads {
            let b = (ti * heads + h) * hd;
            for i in 0..n_rot / 2 {
                let th = pos[ti] as f64 * 1e7f64.powf(-2.0 * i as f64 / n_rot as f64);
                let (a, c) = (x[b + i] as f64, x[b + i + n_rot / 2] as f64);
                want[b + i] = a * th.cos() - c * th.sin();
                want[b + i + n_rot / 2] = a * th.sin() + c * th.cos();
            }
        }
    }
    let mut dx = up(&s, &x);
    let dp = up(&s, &pos);
    let xl = RowLayout {
        tokens: t,
        heads,
        tok_stride: heads * hd,
        head_stride: hd,
    };
    g.rope_neox(
        &mut dx.as_view_mut(),
        xl,
        Some(&dp.as_view()),
        0,
        n_rot,
        1e7,
    )
    .unwrap();
    let got = down(&s, &dx);
    // Consecutive positions without a position buffer: pos0 + t.
    let mut dx2 = up(&s, &x);
    let consecutive: Vec<i32> = (0..t as i32).map(|i| 4000 + i).collect();
    let dp2 = up(&s, &consecutive);
    let mut dx3 = up(&s, &x);
    g.rope_neox(&mut dx2.as_view_mut(), xl, None, 4000, n_rot, 1e7)
        .unwrap();
    g.rope_neox(
        &mut dx3.as_view_mut(),
        xl,
        Some(&dp2.as_view()),
        0,
        n_rot,
        1e7,
    )
    .unwrap();
    assert_eq!(down(&s, &dx2), down(&s, &dx3));
    assert_close("rope", &got, &want, &vec![4.0; want.len()], 1e-6);
}

/// CPU attention of shape `sh` (its `kv.n_kv`, `n_head`, `p0`, `t_len`, `scale`) over K/V
/// `[pos][n_kv][256]`, f64 softmax.
fn attention_ref(q: &[f32], k: &[f32], v: &[f32], sh: &AttnShape) -> Vec<f64> {
    let (n_head, n_kv, p0, t) = (sh.n_head, sh.kv.n_kv, sh.p0, sh.t_len);
    let scale = sh.scale as f64;
    let d = 256;
    let group = n_head / n_kv;
    let mut out = vec![0f64; t * n_head * d];
    for ti in 0..t {
        let n_ctx = p0 + ti + 1;
        for h in 0..n_head {
            let gk = h / group;
            let qh = &q[(ti * n_head + h) * d..][..d];
            let sc: Vec<f64> = (0..n_ctx)
                .map(|j| {
                    (0..d)
                        .map(|i| qh[i] as f64 * k[(j * n_kv + gk) * d + i] as f64)
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = sc.iter().map(|s| (s - m).exp()).collect();
            let l: f64 = e.iter().sum();
            for i in 0..d {
                out[(ti * n_head + h) * d + i] = (0..n_ctx)
                    .map(|j| e[j] * v[(j * n_kv + gk) * d + i] as f64)
                    .sum::<f64>()
                    / l;
            }
        }
    }
    out
}

/// Fresh caches laid out as `kv` holding `n_ctx` tokens of K/V (f32 `[pos][n_kv][256]`).
fn store_kv<T: KvElem + ValidAsZeroBits>(
    g: &Gpu,
    kv: KvLayout,
    dk: &CudaSlice<f32>,
    dv: &CudaSlice<f32>,
    n_ctx: usize,
) -> (CudaSlice<T>, CudaSlice<T>) {
    let s = g.stream();
    let mut kc = s.alloc_zeros::<T>(kv.min_len()).unwrap();
    let mut vc = s.alloc_zeros::<T>(kv.min_len()).unwrap();
    let rows = KvStoreRows {
        tok_stride: kv.n_kv * 256,
        p0: 0,
        t_len: n_ctx,
    };
    g.kv_store(
        &dk.as_view(),
        &dv.as_view(),
        &mut kc.as_view_mut(),
        &mut vc.as_view_mut(),
        kv,
        rows,
    )
    .unwrap();
    (kc, vc)
}

/// Split-K attention of shape `sh` in chunks of `chunk` over the caches; the output on the host.
fn attend<T: KvElem>(
    g: &Gpu,
    sh: &AttnShape,
    dq: &CudaSlice<f32>,
    (kc, vc): (&CudaSlice<T>, &CudaSlice<T>),
    chunk: usize,
) -> Vec<f32> {
    let s = g.stream();
    let n_split = (sh.p0 + sh.t_len).div_ceil(chunk);
    let mut scratch = zeros(s, Gpu::attention_scratch_len(sh.t_len, sh.n_head, n_split));
    let mut o = zeros(s, sh.t_len * sh.n_head * 256);
    let split = SplitK {
        chunk,
        scratch: &mut scratch.as_view_mut(),
    };
    g.attention(
        sh,
        &dq.as_view(),
        &kc.as_view(),
        &vc.as_view(),
        &mut o.as_view_mut(),
        split,
    )
    .unwrap();
    down(s, &o)
}

/// Decode-style geometry: q and o `[t][n_head][256]` contiguous, score scale 1/16.
fn contiguous_attn(kv: KvLayout, n_head: usize, p0: usize, t_len: usize) -> AttnShape {
    AttnShape {
        kv,
        n_head,
        p0,
        t_len,
        scale: 1.0 / 16.0,
        q_tok_stride: n_head * 256,
        q_head_stride: 256,
        o_tok_stride: n_head * 256,
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_decode_and_prefill_match_reference() {
    let Some(g) = gpu() else { return };
    let s = g.stream().clone();
    let mut r = rng(17);
    let (n_head, n_kv, d, cap) = (24usize, 4usize, 256usize, 2048usize);
    for (p0, t, chunk) in [
        (0usize, 1usize, 256usize),
        (1500, 1, 256),
        (999, 1, 64),
        (0, 33, 16),
        (100, 20, 128),
    ] {
        let n_ctx = p0 + t;
        // K/V per position [pos][kv][256], rounded to f16 as the cache stores them.
        let kf: Vec<f32> = random_vec(&mut r, n_ctx * n_kv * d, 1.0)
            .iter()
            .map(|v| f16::from_f32(*v).to_f32())
            .collect();
        let vf: Vec<f32> = random_vec(&mut r, n_ctx * n_kv * d, 1.0)
            .iter()
            .map(|v| f16::from_f32(*v).to_f32())
            .collect();
        let q = random_vec(&mut r, t * n_head * d, 2.0);
        let kv16 = KvLayout::head_major::<f16>(n_kv, cap);
        let sh = contiguous_attn(kv16, n_head, p0, t);
        let want = attention_ref(&q, &kf, &vf, &sh);
        let (dk, dv, dq) = (up(&s, &kf), up(&s, &vf), up(&s, &q));
        let (kc, vc) = store_kv::<f16>(&g, kv16, &dk, &dv, n_ctx);
        assert_close(
            &format!("attention f16 KV p0 {p0} t {t} chunk {chunk}"),
            &attend(&g, &sh, &dq, (&kc, &vc), chunk),
            &want,
            &vec![1.0; want.len()],
            2e-5,
        );
        // The same through token-major f32 caches (the CPU backend's layout; values f16-exact).
        let kv32 = KvLayout::token_major::<f32>(n_kv, cap);
        let (kc32, vc32) = store_kv::<f32>(&g, kv32, &dk, &dv, n_ctx);
        let sh32 = AttnShape { kv: kv32, ..sh };
        assert_close(
            &format!("attention f32 KV p0 {p0} t {t} chunk {chunk}"),
            &attend(&g, &sh32, &dq, (&kc32, &vc32), chunk),
            &want,
            &vec![1.0; want.len()],
            2e-5,
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn conv1d_and_delta_rule_match_reference() {
    let Some(g) = gpu() else { return };
    let s = g.stream().clone();
    let mut r = rng(18);
    // conv1d over 3 tokens, from a non-zero state.
    let (c, t) = (1000usize, 3usize);
    let u = random_vec(&mut r, t * c, 2.0);
    let st = random_vec(&mut r, 3 * c, 2.0);
    let w = random_vec(&mut r, 4 * c, 1.0);
    let mut want = vec![0f64; t * c];
    for ch in 0..c {
        let mut hist = vec![st[ch] as f64, st[c + ch] as f64, st[2 * c + ch] as f64];
        for ti in 0..t {
            let ut = u[ti * c + ch] as f64;
            let a = (0..3).map(|k| w[4 * ch + k] as f64 * hist[k]).sum::<f64>()
                + w[4 * ch + 3] as f64 * ut;
            want[ti * c + ch] = silu(a);
            hist.remove(0);
            hist.push(ut);
        }
    }
    let (du, dw) = (up(&s, &u), up(&s, &w));
    let mut dst = up(&s, &st);
    let mut dy = zeros(&s, t * c);
    g.conv1d_silu(
        &du.as_view(),
        &mut dst.as_view_mut(),
        &dw.as_view(),
        &mut dy.as_view_mut(),
        RowStrides::contiguous(t, c),
        c,
    )
    .unwrap();
    assert_close(
        "conv1d",
        &down(&s, &dy),
        &want,
        &vec![1.0; want.len()],
        1e-5,
    );
    let st_after = down(&s, &dst);
    assert_eq!(
        &st_after[..],
        &u[..],
        "state holds the last 3 pre-conv inputs"
    );

    // Delta rule: 6 value heads over 2 key heads, 4 tokens, from a random state.
    let (nv, nk, t, d) = (6usize, 2usize, 4usize, 128usize);
    let mut qk = |scale: f32| -> Vec<f32> {
        let mut v = random_vec(&mut r, t * nk * d, 1.0);
        for h in v.chunks_mut(d) {
            let n = h.iter().map(|x| x * x).sum::<f32>().sqrt();
            h.iter_mut().for_each(|x| *x *= scale / n);
        }
        v
    };
    let q = qk(1.0 / (128f32).sqrt());
    let k = qk(1.0);
    let v = random_vec(&mut r, t * nv * d, 1.0);
    let b = random_vec(&mut r, t * nv, 3.0);
    let al = random_vec(&mut r, t * nv, 3.0);
    let dtb = random_vec(&mut r, nv, 1.0);
    let a: Vec<f32> = (0..nv).map(|_| -r.random_range(0.1f32..2.0)).collect();
    let s0 = random_vec(&mut r, nv * d * d, 0.5);
    let mut state: Vec<f64> = s0.iter().map(|x| *x as f64).collect();
    let mut want = vec![0f64; t * nv * d];
    for ti in 0..t {
        for p in 0..nv {
            let kh = p % nk;
            let beta = 1.0 / (1.0 + (-(b[ti * nv + p] as f64)).exp());
            let u = al[ti * nv + p] as f64 + dtb[p] as f64;
            let sp = if u > 20.0 { u } else { u.exp().ln_1p() };
            let decay = (sp * a[p] as f64).exp();
            let kv = &k[(ti * nk + kh) * d..][..d];
            let qv = &q[(ti * nk + kh) * d..][..d];
            let sm = &mut state[p * d * d..(p + 1) * d * d];
            for j in 0..d {
                let col = &mut sm[j * d..(j + 1) * d];
                col.iter_mut().for_each(|x| *x *= decay);
                let pred: f64 = (0..d).map(|i| col[i] * kv[i] as f64).sum();
                let dj = beta * (v[(ti * nv + p) * d + j] as f64 - pred);
                (0..d).for_each(|i| col[i] += kv[i] as f64 * dj);
                want[(ti * nv + p) * d + j] = (0..d).map(|i| col[i] * qv[i] as f64).sum();
            }
        }
    }
    let (dq, dk, dv, db, dal, ddt, da) = (
        up(&s, &q),
        up(&s, &k),
        up(&s, &v),
        up(&s, &b),
        up(&s, &al),
        up(&s, &dtb),
        up(&s, &a),
    );
    let mut dstate = up(&s, &s0);
    let mut dout = zeros(&s, t * nv * d);
    let (dq, dk, dv, db, dal, ddt, da) = (
        dq.as_view(),
        dk.as_view(),
        dv.as_view(),
        db.as_view(),
        dal.as_view(),
        ddt.as_view(),
        da.as_view(),
    );
    let x = DeltaRuleInputs {
        q: &dq,
        k: &dk,
        v: &dv,
        beta_raw: &db,
        alpha_raw: &dal,
        dt_bias: &ddt,
        ssm_a: &da,
    };
    let sh = DeltaRuleShape {
        qk_stride: nk * d,
        v_stride: nv * d,
        ab_stride: nv,
        out_stride: nv * d,
        n_v_heads: nv,
        n_k_heads: nk,
        t_len: t,
    };
    g.delta_rule(&x, &sh, &mut dstate.as_view_mut(), &mut dout.as_view_mut())
        .unwrap();
    assert_close(
        "delta_rule out",
        &down(&s, &dout),
        &want,
        &vec![1.0; want.len()],
        1e-4,
    );
    assert_close(
        "delta_rule state",
        &down(&s, &dstate),
        &state,
        &vec![1.0; state.len()],
        1e-4,
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn elementwise_ops_match_reference() {
    let Some(g) = gpu() else { return };
    let s = g.stream().clone();
    let mut r = rng(19);
    let n = 17408;
    let a = random_vec(&mut r, n, 8.0);
    let b = random_vec(&mut r, n, 8.0);
    let (da, db) = (up(&s, &a), up(&s, &b));
    let mut out = zeros(&s, n);
    g.swiglu(&da.as_view(), &db.as_view(), &mut out.as_view_mut(), n)
        .unwrap();
    let want: Vec<f64> = (0..n).map(|i| silu(a[i] as f64) * b[i] as f64).collect();
    let sc: Vec<f64> = want.iter().map(|v| v.abs().max(1e-3)).collect();
    assert_close("swiglu", &down(&s, &out), &want, &sc, 1e-5);

    // sigmoid gate: 24 heads of 256, gate every 512.
    let x = random_vec(&mut r, 24 * 256, 2.0);
    let gate = random_vec(&mut r, 24 * 512, 6.0);
    let mut dx = up(&s, &x);
    let dg = up(&s, &gate);
    // 2 tokens x 12 heads; the gate of head h sits at t*6144 + h*512 (after q in q+gate).
    let gl = RowLayout {
        tokens: 2,
        heads: 12,
        tok_stride: 12 * 512,
        head_stride: 512,
    };
    g.sigmoid_gate(&mut dx.as_view_mut(), &dg.as_view(), gl, 256)
        .unwrap();
    let want: Vec<f64> = (0..24 * 256)
        .map(|i| x[i] as f64 / (1.0 + (-(gate[(i / 256) * 512 + i % 256] as f64)).exp()))
        .collect();
    let sc: Vec<f64> = want.iter().map(|v| v.abs().max(1e-3)).collect();
    assert_close("sigmoid_gate", &down(&s, &dx), &want, &sc, 1e-5);

    let mut dacc = up(&s, &a);
    g.add_inplace(&mut dacc.as_view_mut(), &db.as_view(), n)
        .unwrap();
    let got = down(&s, &dacc);
    (0..n).for_each(|i| assert_eq!(got[i], a[i] + b[i]));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn wrappers_reject_bad_shapes() {
    let Some(g) = gpu() else { return };
    let s = g.stream().clone();
    let w = s.alloc_zeros::<u8>(34 * 4).unwrap();
    let x = zeros(&s, 320);
    let mut y = zeros(&s, 4);
    // k not a multiple of 80, weight too short, wrong type.
    assert!(g
        .pn_gemv(
            MatrixShape {
                ty: WeightType::Pn3t,
                n: 1,
                k: 100,
            },
            PnPrecision::Half2,
            &w.as_view(),
            &x.as_view(),
            &mut y.as_view_mut(),
        )
        .is_err());
    assert!(g
        .pn_gemv(
            MatrixShape {
                ty: WeightType::Pn3t,
                n: 2,
                k: 320,
            },
            PnPrecision::Half2,
            &w.as_view(),
            &x.as_view(),
            &mut y.as_view_mut(),
        )
        .is_err());
    assert!(g
        .pn_gemv(
            MatrixShape {
                ty: WeightType::Q4K,
                n: 1,
                k: 256,
            },
            PnPrecision::Half2,
            &w.as_view(),
            &x.as_view(),
            &mut y.as_view_mut(),
        )
        .is_err());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_hadamard_producers_match_their_composition() {
    let Some(g) = gpu() else { return };
    let s = g.stream().clone();
    let mut r = rng(20);
    // RMSNorm + rotation of 3 rows of 5120 (R = 256) vs rms_norm then hadamard: bit for bit.
    let (rows, n, rb) = (3usize, 5120usize, 256usize);
    let x = random_vec(&mut r, rows * n, 4.0);
    let w = random_vec(&mut r, n, 2.0);
    let (dx, dw) = (up(&s, &x), up(&s, &w));
    let mut fused = zeros(&s, rows * n);
    let norm = NormShape { n, eps: 1e-6 };
    g.rms_norm_hadamard(
        &dx.as_view(),
        &mut fused.as_view_mut(),
        &dw.as_view(),
        RowStrides::contiguous(rows, n),
        norm,
        rb,
    )
    .unwrap();
    let mut normed = zeros(&s, rows * n);
    let l = RowLayout::contiguous(rows, n);
    g.rms_norm(
        &dx.as_view(),
        l,
        &mut normed.as_view_mut(),
        l,
        Some(&dw.as_view()),
        norm,
    )
    .unwrap();
    g.hadamard_inplace(&mut normed.as_view_mut(), rows * n, rb)
        .unwrap();
    assert_eq!(down(&s, &fused), down(&s, &normed));
    // And the rotation itself against pn-format.
    let cpu = down(&s, &normed);
    let mut normed_host: Vec<f32> = Vec::new();
    for row in 0..rows {
        let xr = &x[row * n..(row + 1) * n];
        let inv = rms_ref(xr, 1e-6) as f32;
        normed_host.extend(xr.iter().zip(&w).map(|(a, b)| a * inv * b));
    }
    pn_format::fwht_blocks_inplace(&mut normed_host, rb).unwrap();
    let want: Vec<f64> = normed_host.iter().map(|v| *v as f64).collect();
    assert_close(
        "rms_norm_hadamard vs CPU",
        &cpu,
        &want,
        &vec![1.0; want.len()],
        1e-4,
    );

    // SwiGLU + rotation over the FFN width (17408 = 68 x 256) vs swiglu then hadamard.
    let m = 17408;
    let (ga, up_v) = (random_vec(&mut r, m, 6.0), random_vec(&mut r, m, 3.0));
    let (dg, du) = (up(&s, &ga), up(&s, &up_v));
    let mut f2 = zeros(&s, m);
    g.swiglu_hadamard(&dg.as_view(), &du.as_view(), &mut f2.as_view_mut(), m, rb)
        .unwrap();
    let mut c2 = zeros(&s, m);
    g.swiglu(&dg.as_view(), &du.as_view(), &mut c2.as_view_mut(), m)
        .unwrap();
    g.hadamard_inplace(&mut c2.as_view_mut(), m, rb).unwrap();
    assert_eq!(down(&s, &f2), down(&s, &c2));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn q8_0_kv_cache_matches_gguf_io_and_reference_attention() {
    let Some(g) = gpu() else { return };
    let s = g.stream().clone();
    let mut r = rng(23);
    let (n_head, n_kv, d, cap, p0, t) = (24usize, 4usize, 256usize, 600usize, 400usize, 3usize);
    let n_ctx = p0 + t;
    let kf = random_vec(&mut r, n_ctx * n_kv * d, 1.5);
    let vf = random_vec(&mut r, n_ctx * n_kv * d, 1.5);
    let q = random_vec(&mut r, t * n_head * d, 2.0);
    let kv = KvLayout::token_major::<Q8KvByte>(n_kv, cap);
    let (dk, dv, dq) = (up(&s, &kf), up(&s, &vf), up(&s, &q));
    let (kc, vc) = store_kv::<Q8KvByte>(&g, kv, &dk, &dv, n_ctx);
    // The stored rows are exactly gguf-io's Q8_0 quantization of each 256-value row.
    let kbytes: Vec<u8> = down(&s, &kc).iter().map(|b| b.0).collect();
    let mut want_k = Vec::new();
    quants::quantize_row(GgmlType::Q8_0, &kf, &mut want_k).unwrap();
    assert_eq!(&kbytes[..want_k.len()], &want_k[..], "q8_0 K rows");
    // Attention against the dequantized cache.
    let deq = |x: &[f32]| {
        let mut b = Vec::new();
        quants::quantize_row(GgmlType::Q8_0, x, &mut b).unwrap();
        let mut out = vec![0f32; x.len()];
        quants::dequantize_row(GgmlType::Q8_0, &b, &mut out).unwrap();
        out
    };
    let sh = contiguous_attn(kv, n_head, p0, t);
    let want = attention_ref(&q, &deq(&kf), &deq(&vf), &sh);
    let o = attend(&g, &sh, &dq, (&kc, &vc), 128);
    assert_close("attention q8_0 KV", &o, &want, &vec![1.0; want.len()], 2e-5);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn q4_0_kv_cache_matches_host_shim_and_reference_attention() {
    let Some(g) = gpu() else { return };
    let s = g.stream().clone();
    let mut r = rng(25);
    let (n_head, n_kv, d, cap, p0, t) = (24usize, 4usize, 256usize, 900usize, 700usize, 5usize);
    let n_ctx = p0 + t;
    let mut kf = random_vec(&mut r, n_ctx * n_kv * d, 1.5);
    let vf = random_vec(&mut r, n_ctx * n_kv * d, 1.5);
    // Adversarial blocks: all zero, magnitude ties of both signs, exact rounding halfway points.
    kf[..32].fill(0.0);
    for (i, v) in kf[32..64].iter_mut().enumerate() {
        *v = if i % 2 == 0 { -1.0 } else { 1.0 };
    }
    kf[64] = -8.0;
    for (i, v) in kf[65..96].iter_mut().enumerate() {
        *v = -7.5 + 0.5 * i as f32;
    }
    let q = random_vec(&mut r, t * n_head * d, 2.0);
    let kv = KvLayout::token_major::<Q4KvByte>(n_kv, cap);
    let (dk, dv, dq) = (up(&s, &kf), up(&s, &vf), up(&s, &q));
    let (kc, vc) = store_kv::<Q4KvByte>(&g, kv, &dk, &dv, n_ctx);
    // The stored blocks are the host build of the same header's quantizer, bit for bit (the
    // host tests bind that to the CPU KV cache's quantizer).
    let host_blocks = |x: &[f32]| -> Vec<u8> {
        x.chunks_exact(32)
            .flat_map(|b| shim_q4(b.try_into().unwrap()))
            .collect()
    };
    let kbytes: Vec<u8> = down(&s, &kc).iter().map(|b| b.0).collect();
    let vbytes: Vec<u8> = down(&s, &vc).iter().map(|b| b.0).collect();
    let (want_k, want_v) = (host_blocks(&kf), host_blocks(&vf));
    assert_eq!(&kbytes[..want_k.len()], &want_k[..], "q4_0 K rows");
    assert_eq!(&vbytes[..want_v.len()], &want_v[..], "q4_0 V rows");
    // Attention against the dequantized cache (gguf-io's Q4_0 decode of the same blocks).
    let deq = |b: &[u8]| {
        let mut out = vec![0f32; b.len() / 18 * 32];
        quants::dequantize_row(GgmlType::Q4_0, b, &mut out).unwrap();
        out
    };
    let sh = contiguous_attn(kv, n_head, p0, t);
    let want = attention_ref(&q, &deq(&want_k), &deq(&want_v), &sh);
    for chunk in [64, 256, 4096] {
        assert_close(
            &format!("attention q4_0 KV chunk {chunk}"),
            &attend(&g, &sh, &dq, (&kc, &vc), chunk),
            &want,
            &vec![1.0; want.len()],
            2e-5,
        );
    }
}

fn shim_q4(x: &[f32; 32]) -> [u8; 18] {
    pn_kernels::host_shim::safe::q4_0_kv_quantize(x)
}
