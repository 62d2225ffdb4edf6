//! The CUDA backend's mixer ops that fuse launches of the decode token (issue #23) against the
//! CPU backend's defaults: `conv_gated_delta_rule` (the conv1d inside the decode delta rule's
//! launch), `mixer_out_matmul` for the GDN gated norm (the norm writes ssm_out's prepared fp16
//! input) and the grouped Q8_0 GEMV of two matrices of one input (ssm_alpha / ssm_beta). At the
//! 27B GDN shape (48 value heads over 16 key heads of 128).
//!
//! Needs a GPU: `cargo test -p pn-tests --test cuda_mixer_proj -- --ignored`. Without kernels,
//! driver or device each test prints why and returns. (The kernels themselves run on the host
//! emulator in pn-kernels' `host_emu_mixer_prep`, `host_emu_delta_conv`, `host_emu_q8_group`.)

use gguf_io::GgmlType;
use pn_tests::{max_abs, seeded_vec as rnd};
use qwen_model::cuda::CudaBackend;
use qwen_model::{
    Backend, ConvIn, ConvShape, CpuBackend, GatedNormShape, GdnArgs, GdnDims, MixerOut, RotatedOut,
    WeightSource,
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

const GDN_27B: GdnDims = GdnDims {
    n_k_heads: 16,
    n_v_heads: 48,
    dk: 128,
    dv: 128,
    conv_kernel: 4,
};

/// Output, recurrent state, conv state and conv output of one `conv_gated_delta_rule` call
/// (twice in a row: the second reads the states the first left).
fn conv_gdn<B: Backend>(be: &B, n_tokens: usize) -> Vec<f32> {
    let d = GDN_27B;
    let (cd, hv) = (d.conv_dim(), d.n_v_heads);
    let w = buf(be, &rnd(32, 4 * cd, 0.5));
    let mut cs = buf(be, &rnd(33, 3 * cd, 1.0));
    let a: Vec<f32> = rnd(36, hv, 1.0)
        .iter()
        .map(|v| -(v.abs() * 3.0).exp())
        .collect();
    let (a, dt) = (buf(be, &a), buf(be, &rnd(37, hv, 2.0)));
    let mut st = buf(be, &rnd(38, d.state_len(), 0.1));
    let mut y = be.alloc(n_tokens * cd).unwrap();
    let mut o = be.alloc(n_tokens * d.value_dim()).unwrap();
    for call in 0..2u64 {
        let u = buf(be, &rnd(31 + 10 * call, n_tokens * cd, 1.0));
        let mut b = buf(be, &rnd(34 + 10 * call, n_tokens * hv, 3.0));
        let mut al = buf(be, &rnd(35 + 10 * call, n_tokens * hv, 3.0));
        let c = ConvIn {
            u: &u,
            w: &w,
            state: &mut cs,
            shape: ConvShape {
                channels: cd,
                kernel: 4,
            },
        };
        let args = GdnArgs {
            dims: &d,
            n_tokens,
            y: &mut y,
            b: &mut b,
            alpha: &mut al,
            a: &a,
            dt_bias: &dt,
            state: &mut st,
            out: &mut o,
        };
        be.conv_gated_delta_rule(c, args).unwrap();
    }
    let mut out = get(be, &o, n_tokens * d.value_dim());
    out.extend(get(be, &st, d.state_len()));
    out.extend(get(be, &cs, 3 * cd));
    // The q/k part of y is normalised in place on the CPU's path: compare the v part.
    let yv = get(be, &y, n_tokens * cd);
    for t in 0..n_tokens {
        out.extend(&yv[t * cd + 2 * d.n_k_heads * d.dk..(t + 1) * cd]);
    }
    out
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn conv_gated_delta_rule_matches_cpu() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(2);
    // Decode, the 3-row verify, and a prefill length past the fused kernel's (the chunked path).
    for t in [1, 3, 40] {
        check(
            &format!("conv + delta rule t={t}"),
            &conv_gdn(&g, t),
            &conv_gdn(&cpu, t),
            1e-4,
        );
    }
}

/// A PN weight `[n, k]` with random values, rotated in blocks of `block`.
fn pn_weight<B: Backend>(be: &B, n: usize, k: usize, block: usize) -> B::Weight {
    let vals = rnd(41, n * k, 1.0);
    let bytes = pn_format::quantize_rows(pn_format::PnType::Pn3t, &vals, k, 1).unwrap();
    be.load_weight(&WeightSource {
        name: "blk.0.ssm_out.weight",
        ty: GgmlType::Pn3t,
        rows: n,
        cols: k,
        bytes: &bytes,
        rotated: true,
        rotation_block: block,
        file: None,
    })
    .unwrap()
}

/// ssm_out of the gated norm of `rows` rows of the 27B GDN output (48 heads of 128) through
/// `mixer_out_matmul`: the projection and the rotated input.
fn gated_out<B: Backend>(be: &B, rows: usize, block: usize) -> Vec<f32> {
    let (vd, n, dout) = (48 * 128, 128, 320);
    let mut x = buf(be, &rnd(42, rows * vd, 2.0));
    let z = buf(be, &rnd(43, rows * vd, 3.0));
    let w = buf(be, &rnd(44, n, 1.5));
    let wt = pn_weight(be, dout, vd, block);
    let mut rot = be.alloc(rows * vd).unwrap();
    let mut y = be.alloc(rows * dout).unwrap();
    let src = MixerOut::GatedNorm {
        x: &mut x,
        z: &z,
        w: &w,
        shape: GatedNormShape {
            len: rows * vd,
            n,
            eps: 1e-6,
            block,
        },
    };
    let o = RotatedOut {
        out: &mut rot,
        block,
    };
    be.mixer_out_matmul(src, o, rows, &mut [(&wt, &mut y)])
        .unwrap();
    let mut out = get(be, &y, rows * dout);
    out.extend(get(be, &rot, rows * vd));
    out
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gated_norm_projection_matches_cpu() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(2);
    // Decode and the verify (the fp16 copy at 1 and 3 rows), and 9 rows (no copy: the default).
    for (rows, block) in [(1, 256), (3, 256), (9, 256), (1, 64)] {
        check(
            &format!("gated norm + ssm_out rows={rows} R={block}"),
            &gated_out(&g, rows, block),
            &gated_out(&cpu, rows, block),
            2e-3,
        );
    }
}

/// Two Q8_0 matrices `[48, 5120]` of one input row (ssm_alpha, ssm_beta) in one matmul call.
fn q8_pair<B: Backend>(be: &B, k: usize) -> Vec<f32> {
    let n = 48;
    let load = |seed: u64, name: &'static str| {
        let mut bytes = Vec::new();
        gguf_io::quants::quantize_row(GgmlType::Q8_0, &rnd(seed, n * k, 1.0), &mut bytes).unwrap();
        be.load_weight(&WeightSource {
            name,
            ty: GgmlType::Q8_0,
            rows: n,
            cols: k,
            bytes: &bytes,
            rotated: false,
            rotation_block: 0,
            file: None,
        })
        .unwrap()
    };
    let (wa, wb) = (
        load(51, "blk.0.ssm_alpha.weight"),
        load(52, "blk.0.ssm_beta.weight"),
    );
    let x = buf(be, &rnd(53, k, 2.0));
    let (mut ya, mut yb) = (be.alloc(n).unwrap(), be.alloc(n).unwrap());
    be.matmul(&x, 1, &mut [(&wa, &mut ya), (&wb, &mut yb)])
        .unwrap();
    let mut out = get(be, &ya, n);
    out.extend(get(be, &yb, n));
    out
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn grouped_q8_0_pair_matches_cpu() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(2);
    // 5120: the 27B hidden size (grouped); 5120 + 32: an odd block count (two launches).
    for k in [5120, 5152] {
        check(
            &format!("q8_0 pair k={k}"),
            &q8_pair(&g, k),
            &q8_pair(&cpu, k),
            2e-3,
        );
    }
}
