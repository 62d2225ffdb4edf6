//! The fused mixer ops of the CUDA backend (`qk_norm_rope`, `kv_write_pair`,
//! `sigmoid_gate_hadamard`, `gated_rms_norm_hadamard`; the residual add fused into `norm_matmul`;
//! issue #23) against the CPU backend's
//! defaults (the separate ops), at the 27B mixer shapes and adversarial ones. The L2-normalising
//! delta rule is covered by `cuda_backend::conv_and_delta_rule_match_cpu`.
//!
//! Needs a GPU: `cargo test -p pn-tests --test cuda_mixer -- --ignored`. Without kernels,
//! driver or device each test prints why and returns.

use pn_tests::{max_abs, seeded_vec as rnd};
use qwen_model::cuda::CudaBackend;
use qwen_model::{
    Backend, CpuBackend, GateLayout, GatedNormShape, KvCacheType, NormDest, NormIn, NormRot,
    QkNormRope, RopeLayout, RotatedOut,
};

fn gpu() -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(b) => Some(b),
        Err(e) => {
            eprintln!("skipped: no CUDA backend here: {e}");
            None
        }
    }
}

fn buf<B: Backend>(be: &B, v: &[f32]) -> B::Buf {
    let mut b = be.alloc(v.len()).unwrap();
    be.upload(v, &mut b, 0).unwrap();
    b
}

fn get<B: Backend>(be: &B, b: &B::Buf, n: usize) -> Vec<f32> {
    let mut v = vec![0.0; n];
    be.download(b, 0, &mut v).unwrap();
    v
}

fn check(name: &str, got: &[f32], want: &[f32], tol: f32) {
    let d = max_abs(got, want);
    eprintln!("{name}: max abs diff {d:.3e}");
    assert!(d <= tol, "{name}: max abs diff {d} > {tol}");
}

/// q (24 heads of 256 interleaved with their gates) and k (4 heads) of `tokens` tokens after
/// `qk_norm_rope` at `pos0`.
fn qk<B: Backend>(be: &B, tokens: usize, pos0: usize, n_rot: usize) -> Vec<f32> {
    let (hq, hk, dh) = (24, 4, 256);
    let ql = RopeLayout {
        n_heads: hq,
        head_stride: 2 * dh,
        token_stride: hq * 2 * dh,
        n_rot,
    };
    let kl = RopeLayout {
        n_heads: hk,
        head_stride: dh,
        token_stride: hk * dh,
        n_rot,
    };
    let mut qv = rnd(21, tokens * ql.token_stride, 4.0);
    qv[..dh].fill(0.0); // a zero head: the norm's eps alone
    let (mut q, mut k) = (
        buf(be, &qv),
        buf(be, &rnd(22, tokens * kl.token_stride, 4.0)),
    );
    let (wq, wk) = (buf(be, &rnd(23, dh, 1.5)), buf(be, &rnd(24, dh, 1.5)));
    be.qk_norm_rope(QkNormRope {
        q: &mut q,
        k: &mut k,
        q_norm: &wq,
        k_norm: &wk,
        q_layout: ql,
        k_layout: kl,
        head_dim: dh,
        eps: 1e-6,
        n_tokens: tokens,
        pos0,
        theta: 1e7,
    })
    .unwrap();
    let mut out = get(be, &q, tokens * ql.token_stride);
    out.extend(get(be, &k, tokens * kl.token_stride));
    out
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn qk_norm_rope_matches_cpu() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(2);
    for (tokens, pos0, n_rot) in [(1, 0, 64), (1, 4095, 64), (3, 70_000, 256), (70, 9, 64)] {
        let (got, want) = (qk(&g, tokens, pos0, n_rot), qk(&cpu, tokens, pos0, n_rot));
        check(
            &format!("qk_norm_rope t={tokens} pos0={pos0}"),
            &got,
            &want,
            1e-4,
        );
    }
}

/// The cache bytes after `kv_write_pair` and after two `kv_write`s are the same.
#[test]
#[ignore = "needs a CUDA GPU"]
fn kv_write_pair_equals_two_writes() {
    let Some(g) = gpu() else { return };
    let (row, cap) = (4 * 256, 16);
    for ty in [
        KvCacheType::F32,
        KvCacheType::F16,
        KvCacheType::Q8_0,
        KvCacheType::Q4_0,
    ] {
        for (pos, rows) in [(0, 1), (5, 3), (15, 1)] {
            let (k, v) = (
                buf(&g, &rnd(31, rows * row, 3.0)),
                buf(&g, &rnd(32, rows * row, 3.0)),
            );
            let mut pair = (
                g.alloc_kv(cap * row, ty).unwrap(),
                g.alloc_kv(cap * row, ty).unwrap(),
            );
            g.kv_write_pair((&k, &v), (&mut pair.0, &mut pair.1), pos * row, rows * row)
                .unwrap();
            let mut sep = (
                g.alloc_kv(cap * row, ty).unwrap(),
                g.alloc_kv(cap * row, ty).unwrap(),
            );
            g.kv_write(&k, &mut sep.0, pos * row, rows * row).unwrap();
            g.kv_write(&v, &mut sep.1, pos * row, rows * row).unwrap();
            for (a, b, what) in [(&pair.0, &sep.0, "k"), (&pair.1, &sep.1, "v")] {
                assert_eq!(
                    g.download_kv(a).unwrap(),
                    g.download_kv(b).unwrap(),
                    "{ty} {what} cache, rows {pos}..+{rows}"
                );
            }
        }
    }
}

fn gate_rot<B: Backend>(be: &B, tokens: usize, block: usize) -> Vec<f32> {
    let (nh, hd) = (24, 256);
    let g = GateLayout {
        n_heads: nh,
        head_dim: hd,
        offset: hd,
        token_stride: nh * 2 * hd,
        head_stride: 2 * hd,
    };
    let len = tokens * nh * hd;
    let mut x = buf(be, &rnd(41, len, 3.0));
    let gate = buf(be, &rnd(42, tokens * g.token_stride, 6.0));
    let mut out = be.alloc(len).unwrap();
    let o = RotatedOut {
        out: &mut out,
        block,
    };
    be.sigmoid_gate_hadamard((&mut x, &gate, &g), tokens, o)
        .unwrap();
    get(be, &out, len)
}

fn gated_norm_rot<B: Backend>(be: &B, rows: usize, block: usize) -> Vec<f32> {
    let (n, len) = (128, rows * 128);
    let mut xv = rnd(51, len, 2.0);
    xv[..n].fill(0.0);
    let (mut x, z, w) = (
        buf(be, &xv),
        buf(be, &rnd(52, len, 4.0)),
        buf(be, &rnd(53, n, 1.5)),
    );
    let mut out = be.alloc(len).unwrap();
    let s = GatedNormShape {
        len,
        n,
        eps: 1e-6,
        block,
    };
    be.gated_rms_norm_hadamard((&mut x, &z, &w), &mut out, s)
        .unwrap();
    get(be, &out, len)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_output_rotations_match_cpu() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(2);
    for (tokens, block) in [(1, 256), (1, 64), (3, 1024)] {
        let (got, want) = (gate_rot(&g, tokens, block), gate_rot(&cpu, tokens, block));
        check(
            &format!("sigmoid_gate_hadamard t={tokens} R={block}"),
            &got,
            &want,
            1e-4,
        );
    }
    // 48 value heads of 128 per token (27B).
    for (rows, block) in [(48, 256), (48, 64), (96, 128), (16, 1024)] {
        let (got, want) = (
            gated_norm_rot(&g, rows, block),
            gated_norm_rot(&cpu, rows, block),
        );
        check(
            &format!("gated_rms_norm_hadamard rows={rows} R={block}"),
            &got,
            &want,
            1e-4,
        );
    }
}

/// `norm_matmul` of the residual `x + add` into its unrotated rows alone (the final norm before
/// an unrotated head: one fused launch on the device) and, with a rotated destination and no
/// matrices, the default's separate ops; `x` keeps the sum.
fn add_norm<B: Backend>(be: &B, rows: usize, n: usize, block: usize) -> Vec<f32> {
    let mut xv = rnd(61, rows * n, 3.0);
    xv[..n].fill(0.0);
    let (mut x, w) = (buf(be, &xv), buf(be, &rnd(62, n, 1.5)));
    let add = buf(be, &rnd(63, rows * n, 1.0));
    let (mut rot, mut plain) = (be.alloc(rows * n).unwrap(), be.alloc(rows * n).unwrap());
    let nr = NormRot {
        w: &w,
        rows,
        n,
        eps: 1e-6,
        block,
    };
    let x_in = NormIn::AddFirst {
        x: &mut x,
        add: &add,
    };
    let plain_dest = NormDest::<_, B::Weight> {
        buf: &mut plain,
        outs: &mut [],
    };
    be.norm_matmul(x_in, &nr, None, Some(plain_dest)).unwrap();
    let rot_dest = NormDest::<_, B::Weight> {
        buf: &mut rot,
        outs: &mut [],
    };
    be.norm_matmul(NormIn::Plain(&x), &nr, Some(rot_dest), None)
        .unwrap();
    let mut out = get(be, &plain, rows * n);
    out.extend(get(be, &rot, rows * n));
    out.extend(get(be, &x, rows * n));
    out
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn add_and_norm_matches_cpu() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(2);
    // The 27B hidden size (decode, verify); a row longer than the fused kernel's shared memory
    // (the separate ops).
    for (rows, n, block) in [(1, 5120, 256), (3, 5120, 64), (2, 16384, 1024)] {
        let (got, want) = (add_norm(&g, rows, n, block), add_norm(&cpu, rows, n, block));
        check(
            &format!("add + rms_norm {rows}x{n} R={block}"),
            &got,
            &want,
            1e-4,
        );
    }
}
