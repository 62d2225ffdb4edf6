//! The CUDA backend against the CPU backend (every op, random and adversarial shapes), the tiny
//! oracle model end to end, and a PN3 model's GPU logits against its CPU logits.
//!
//! Needs a GPU: `cargo test -p pn-tests --test cuda_backend -- --ignored`. Without kernels,
//! driver or device each test prints why and returns.

use gguf_io::GgmlType;
use qwen_model::cpu::CpuKv;
use qwen_model::cuda::{CudaBackend, MemoryPlan};
use qwen_model::{
    AttnLayout, Backend, ConvShape, CpuBackend, GateLayout, GdnArgs, GdnDims, KvCacheType, Model,
    ModelConfig, Outputs, RopeLayout, WeightSource,
};
use rand::{Rng, SeedableRng};
// `rnd(seed, n, scale)`, `bytemuck_f32(v)`: the kit's helpers under this file's short names.
use pn_tests::{
    f32_le_bytes as bytemuck_f32, max_abs, read_f32, read_tokens, seeded_vec as rnd, tiny,
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

/// `f(backend, args..)` on the CPU (want) and the GPU (got).
macro_rules! on_both {
    ($g:expr, $f:ident ( $($arg:expr),* )) => {{
        let cpu = CpuBackend::new(2);
        let want = $f(&cpu, $($arg),*);
        let got = $f($g, $($arg),*);
        (got, want)
    }};
}

fn check(name: &str, got: &[f32], want: &[f32], tol: f32) {
    let d = max_abs(got, want);
    eprintln!("{name}: max abs diff {d:.3e}");
    assert!(d <= tol, "{name}: max abs diff {d} > {tol}");
}

fn elementwise<B: Backend>(be: &B, n: usize) -> Vec<f32> {
    let (x, y) = (rnd(1, n, 4.0), rnd(2, n, 4.0));
    let (mut a, b) = (buf(be, &x), buf(be, &y));
    be.add(&mut a, &b, n).unwrap();
    let mut g = buf(be, &x);
    be.swiglu(&mut g, &b, n).unwrap();
    let mut out = get(be, &a, n);
    out.extend(get(be, &g, n));
    out
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn elementwise_ops_match_cpu() {
    let Some(g) = gpu() else { return };
    for n in [1, 3, 256, 1000, 70001] {
        let (got, want) = on_both!(&g, elementwise(n));
        check(&format!("add+swiglu n={n}"), &got, &want, 1e-5);
    }
}

fn norms<B: Backend>(be: &B, rows: usize, n: usize) -> Vec<f32> {
    let (x, w, z) = (rnd(3, rows * n, 3.0), rnd(4, n, 1.5), rnd(5, rows * n, 3.0));
    let (xb, wb, zb) = (buf(be, &x), buf(be, &w), buf(be, &z));
    let mut o = be.alloc(rows * n).unwrap();
    be.rms_norm(&xb, &wb, &mut o, rows, n, 1e-6).unwrap();
    let mut out = get(be, &o, rows * n);
    let mut s = buf(be, &x);
    be.rms_norm_strided(&mut s, &wb, n / 2, n, rows, 1e-6)
        .unwrap();
    out.extend(get(be, &s, rows * n));
    let mut gx = buf(be, &x);
    be.gated_rms_norm(&mut gx, &zb, &wb, rows * n, n, 1e-6)
        .unwrap();
    out.extend(get(be, &gx, rows * n));
    out
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn norms_match_cpu() {
    let Some(g) = gpu() else { return };
    for (rows, n) in [(1, 2), (1, 320), (7, 256), (3, 5120), (2, 12288)] {
        let (got, want) = on_both!(&g, norms(rows, n));
        check(&format!("norms {rows}x{n}"), &got, &want, 1e-4);
    }
}

fn rope_hadamard<B: Backend>(be: &B, tokens: usize, pos0: usize, block: usize) -> Vec<f32> {
    let l = RopeLayout {
        n_heads: 6,
        head_stride: 512,
        token_stride: 3072,
        n_rot: 64,
    };
    let x = rnd(6, tokens * 3072, 2.0);
    let mut b = buf(be, &x);
    be.rope(&mut b, &l, tokens, pos0, 1e7).unwrap();
    let mut out = get(be, &b, tokens * 3072);
    let mut h = buf(be, &x);
    be.hadamard(&mut h, tokens * 3072, block).unwrap();
    out.extend(get(be, &h, tokens * 3072));
    out
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn rope_and_hadamard_match_cpu() {
    let Some(g) = gpu() else { return };
    for (t, p0, blk) in [(1, 0, 64), (5, 1000, 128), (3, 262000, 1024), (17, 7, 2)] {
        let (got, want) = on_both!(&g, rope_hadamard(t, p0, blk));
        check(
            &format!("rope/hadamard t={t} p0={p0} blk={blk}"),
            &got,
            &want,
            2e-4,
        );
    }
}

fn attention<B: Backend>(be: &B, kv: KvCacheType, n_tokens: usize, pos0: usize) -> Vec<f32> {
    let (hq, hkv, dh) = (6, 2, 256);
    let l = AttnLayout {
        n_q_heads: hq,
        n_kv_heads: hkv,
        head_dim: dh,
        q_token_stride: 2 * hq * dh,
        q_head_stride: 2 * dh,
        scale: 1.0 / 16.0,
    };
    let cap = pos0 + n_tokens + 3;
    let mut kc = be.alloc_kv(cap * hkv * dh, kv).unwrap();
    let mut vc = be.alloc_kv(cap * hkv * dh, kv).unwrap();
    let total = pos0 + n_tokens;
    let k = buf(be, &rnd(7, total * hkv * dh, 2.0));
    let v = buf(be, &rnd(8, total * hkv * dh, 2.0));
    be.kv_write(&k, &mut kc, 0, total * hkv * dh).unwrap();
    be.kv_write(&v, &mut vc, 0, total * hkv * dh).unwrap();
    let q = buf(be, &rnd(9, n_tokens * 2 * hq * dh, 2.0));
    let mut o = be.alloc(n_tokens * hq * dh).unwrap();
    be.attention(&q, &kc, &vc, &mut o, &l, pos0..pos0 + n_tokens)
        .unwrap();
    let gate = buf(be, &rnd(10, n_tokens * 2 * hq * dh, 3.0));
    let gl = GateLayout {
        n_heads: hq,
        head_dim: dh,
        offset: dh,
        token_stride: 2 * hq * dh,
        head_stride: 2 * dh,
    };
    be.sigmoid_gate(&mut o, &gate, &gl, n_tokens).unwrap();
    get(be, &o, n_tokens * hq * dh)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_matches_cpu() {
    let Some(g) = gpu() else { return };
    for kv in [KvCacheType::F32, KvCacheType::F16] {
        for (t, p0) in [
            (1, 0),
            (1, 1),
            (1, 300),
            (1, 5000),
            (16, 0),
            (9, 700),
            (64, 2000),
        ] {
            let (got, want) = on_both!(&g, attention(kv, t, p0));
            check(
                &format!("attention {kv:?} t={t} p0={p0}"),
                &got,
                &want,
                2e-4,
            );
        }
    }
}

/// Attention over block-quantized (or float) caches of `kt`, `hq` query heads on `hkv` kv heads.
fn attention_kv<B: Backend>(
    be: &B,
    kt: KvCacheType,
    (hq, hkv): (usize, usize),
    n_tokens: usize,
    pos0: usize,
    seed: u64,
) -> Vec<f32> {
    let dh = 256;
    let l = AttnLayout {
        n_q_heads: hq,
        n_kv_heads: hkv,
        head_dim: dh,
        q_token_stride: 2 * hq * dh,
        q_head_stride: 2 * dh,
        scale: 1.0 / 16.0,
    };
    let cap = pos0 + n_tokens + 5;
    let mut kc = be.alloc_kv(cap * hkv * dh, kt).unwrap();
    let mut vc = be.alloc_kv(cap * hkv * dh, kt).unwrap();
    let total = pos0 + n_tokens;
    let k = buf(be, &rnd(seed, total * hkv * dh, 2.0));
    let v = buf(be, &rnd(seed + 1, total * hkv * dh, 2.0));
    // The context as the graph writes it: earlier positions, then this step's rows.
    let row = hkv * dh;
    let split = pos0 * row;
    let mut k_step = be.alloc(n_tokens * row).unwrap();
    let mut v_step = be.alloc(n_tokens * row).unwrap();
    be.copy(&k, split, &mut k_step, 0, n_tokens * row).unwrap();
    be.copy(&v, split, &mut v_step, 0, n_tokens * row).unwrap();
    be.kv_write(&k, &mut kc, 0, split).unwrap();
    be.kv_write(&v, &mut vc, 0, split).unwrap();
    be.kv_write(&k_step, &mut kc, split, n_tokens * row)
        .unwrap();
    be.kv_write(&v_step, &mut vc, split, n_tokens * row)
        .unwrap();
    let q = buf(be, &rnd(seed + 2, n_tokens * 2 * hq * dh, 2.0));
    let mut o = be.alloc(n_tokens * hq * dh).unwrap();
    be.attention(&q, &kc, &vc, &mut o, &l, pos0..pos0 + n_tokens)
        .unwrap();
    get(be, &o, n_tokens * hq * dh)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn quantized_kv_attention_matches_cpu() {
    let Some(g) = gpu() else { return };
    let mut r = rand::rngs::StdRng::seed_from_u64(31);
    for kt in [KvCacheType::Q8_0, KvCacheType::Q4_0] {
        // Fixed cases (decode at split-K boundaries, GQA 6 as in the model, long contexts,
        // prefill chunks), then random shapes.
        let mut cases = vec![
            ((6, 1), 1, 0),
            ((24, 4), 1, 255),
            ((24, 4), 1, 256),
            ((12, 2), 1, 4999),
            ((6, 2), 1, 20000),
            ((24, 4), 16, 0),
            ((6, 1), 64, 2000),
            ((8, 8), 33, 777),
        ];
        for _ in 0..6 {
            let hkv = r.random_range(1..=4usize);
            let group = [1usize, 2, 3, 6][r.random_range(0..4)];
            let t = [1usize, 1, 3, 40][r.random_range(0..4)];
            cases.push(((hkv * group, hkv), t, r.random_range(0..9000usize)));
        }
        for (i, &(heads, t, p0)) in cases.iter().enumerate() {
            let seed = 100 + i as u64;
            let (got, want) = on_both!(&g, attention_kv(kt, heads, t, p0, seed));
            // Both sides attend over the same quantized values: only the f32 summation order
            // differs, as for the float caches.
            check(
                &format!("attention {kt} KV heads {heads:?} t={t} p0={p0}"),
                &got,
                &want,
                2e-4,
            );
        }
    }
}

/// Long prefill chunks take the tiled prefill kernel (16 tokens or more, unless
/// `PN_ATTN_PREFILL_TILED=0`): the 27B model's 24/4 head grouping over every cache type, from
/// position 0 and continuing a cache, with ragged last query tiles.
#[test]
#[ignore = "needs a CUDA GPU"]
fn tiled_prefill_attention_matches_cpu() {
    let Some(g) = gpu() else { return };
    let cases = [
        (KvCacheType::F16, 512, 0),
        (KvCacheType::F32, 517, 300),
        (KvCacheType::Q8_0, 512, 64),
        (KvCacheType::Q4_0, 100, 7),
        (KvCacheType::F16, 2048, 100),
    ];
    for (i, &(kt, t, p0)) in cases.iter().enumerate() {
        let (got, want) = on_both!(&g, attention_kv(kt, (24, 4), t, p0, 500 + i as u64));
        check(
            &format!("tiled prefill attention {kt} t={t} p0={p0}"),
            &got,
            &want,
            2e-4,
        );
    }
}

/// The CPU cache's stored bytes (little-endian f16 scale, then the quants, per block).
fn cpu_kv_bytes(kv: &CpuKv) -> Vec<u8> {
    match kv {
        CpuKv::Q8_0(b) => b
            .iter()
            .flat_map(|b| {
                let mut v = b.d.to_bits().to_le_bytes().to_vec();
                v.extend(b.qs.iter().map(|q| *q as u8));
                v
            })
            .collect(),
        CpuKv::Q4_0(b) => b
            .iter()
            .flat_map(|b| {
                let mut v = b.d.to_bits().to_le_bytes().to_vec();
                v.extend(b.qs);
                v
            })
            .collect(),
        CpuKv::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        CpuKv::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn quantized_kv_write_equals_cpu_bytes() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(2);
    let rows = 40;
    let mut x = rnd(41, rows * 256, 3.0);
    // Adversarial rows: zeros, one huge value, a negative maximum, magnitude ties of both
    // signs, exact rounding halfway points (m = -8: d = 1), tiny and subnormal values.
    x[..256].fill(0.0);
    x[256 + 7] = 1e30;
    x[512 + 40] = -50.0;
    for (i, v) in x[768..1024].iter_mut().enumerate() {
        *v = if i % 2 == 0 { -2.0 } else { 2.0 };
    }
    for blk in 0..8 {
        let b = &mut x[1024 + 32 * blk..1024 + 32 * blk + 32];
        b[0] = -8.0;
        for (i, v) in b.iter_mut().enumerate().skip(1) {
            *v = -7.5 + 0.5 * (i - 1) as f32;
        }
    }
    for (i, v) in x[1280..1536].iter_mut().enumerate() {
        *v = (i as f32 - 128.0) * 1e-40;
    }
    for kt in [KvCacheType::Q8_0, KvCacheType::Q4_0] {
        let (mut kg, mut kc) = (
            g.alloc_kv((rows + 3) * 256, kt).unwrap(),
            cpu.alloc_kv((rows + 3) * 256, kt).unwrap(),
        );
        // Two writes at different offsets (whole 256-value rows, as the graph writes them).
        for (off, len) in [(0, 7 * 256), (7 * 256, (rows - 7) * 256)] {
            let (mut sg, mut sc) = (g.alloc(len).unwrap(), cpu.alloc(len).unwrap());
            g.upload(&x[off..off + len], &mut sg, 0).unwrap();
            cpu.upload(&x[off..off + len], &mut sc, 0).unwrap();
            g.kv_write(&sg, &mut kg, off + 256, len).unwrap();
            cpu.kv_write(&sc, &mut kc, off + 256, len).unwrap();
        }
        let got = g.download_kv(&kg).unwrap();
        let want = cpu_kv_bytes(&kc);
        assert_eq!(got.len(), want.len(), "{kt} cache bytes");
        let per_row = kt.bytes_for(256);
        for (i, (a, b)) in got.chunks(per_row).zip(want.chunks(per_row)).enumerate() {
            assert_eq!(a, b, "{kt} cache row {i}");
        }
        eprintln!("{kt}: {} cache bytes equal the CPU's", got.len());
    }
}

#[test]
fn memory_plan_counts_quantized_kv_blocks() {
    let file = gguf_io::GgufFile::open(tiny("model-f16.gguf")).unwrap();
    let cfg = ModelConfig::from_gguf(&file).unwrap();
    let plan = |k, v| MemoryPlan::with_kv_types(&file, &cfg, 1024, 16, k, v);
    let f32_kv = plan(KvCacheType::F32, KvCacheType::F32).kv_cache;
    let per_value = |t: KvCacheType| t.block_bytes() as f64 / t.block_len() as f64;
    for k in KvCacheType::ALL {
        for v in KvCacheType::ALL {
            let got = plan(k, v).kv_cache as f64;
            let want = f32_kv as f64 * (per_value(k) + per_value(v)) / 8.0;
            assert_eq!(got, want, "K {k} V {v}");
        }
    }
    assert_eq!(
        MemoryPlan::new(&file, &cfg, 1024, 16, KvCacheType::F16).kv_cache,
        plan(KvCacheType::F16, KvCacheType::F16).kv_cache
    );
    assert!(
        plan(KvCacheType::Q4_0, KvCacheType::Q4_0).total()
            < plan(KvCacheType::F16, KvCacheType::F16).total()
    );
}

fn gdn<B: Backend>(be: &B, n_tokens: usize) -> Vec<f32> {
    let d = GdnDims {
        n_k_heads: 2,
        n_v_heads: 6,
        dk: 128,
        dv: 128,
        conv_kernel: 4,
    };
    let cd = d.conv_dim();
    let u = buf(be, &rnd(11, n_tokens * cd, 1.0));
    let w = buf(be, &rnd(12, 4 * cd, 0.5));
    let mut cs = buf(be, &rnd(13, 3 * cd, 1.0));
    let mut y = be.alloc(n_tokens * cd).unwrap();
    let shape = ConvShape {
        channels: cd,
        kernel: 4,
    };
    be.conv1d_silu(&u, &w, &mut cs, &mut y, shape, n_tokens)
        .unwrap();
    let mut b = buf(be, &rnd(14, n_tokens * 6, 3.0));
    let mut al = buf(be, &rnd(15, n_tokens * 6, 3.0));
    let a: Vec<f32> = rnd(16, 6, 1.0)
        .iter()
        .map(|v| -(v.abs() * 3.0).exp())
        .collect();
    let a = buf(be, &a);
    let dt = buf(be, &rnd(17, 6, 2.0));
    let mut st = buf(be, &rnd(18, d.state_len(), 0.1));
    let mut o = be.alloc(n_tokens * d.value_dim()).unwrap();
    be.gated_delta_rule(GdnArgs {
        dims: &d,
        n_tokens,
        y: &mut y,
        b: &mut b,
        alpha: &mut al,
        a: &a,
        dt_bias: &dt,
        state: &mut st,
        out: &mut o,
    })
    .unwrap();
    let mut out = get(be, &o, n_tokens * d.value_dim());
    out.extend(get(be, &st, d.state_len()));
    out.extend(get(be, &cs, 3 * cd));
    out
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn conv_and_delta_rule_match_cpu() {
    let Some(g) = gpu() else { return };
    // 16 and 40 tokens take the CPU's chunked form.
    for t in [1, 2, 5, 16, 40] {
        let (got, want) = on_both!(&g, gdn(t));
        check(&format!("conv1d+delta rule t={t}"), &got, &want, 1e-4);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn chunked_delta_rule_prefill_matches_cpu() {
    let Some(g) = gpu() else { return };
    // From a full chunk of the device kernel (pn_kernels::DELTA_RULE_CHUNK) on, try_gdn takes the
    // chunked kernel (unless PN_GDN_CHUNKED=0): one below, at and above the chunk, the CPU's 64
    // either side, and several chunks with a tail.
    let c = pn_kernels::DELTA_RULE_CHUNK;
    for t in [c - 1, c, c + 1, 63, 65, 5 * c + 7] {
        let (got, want) = on_both!(&g, gdn(t));
        check(&format!("conv1d+delta rule t={t}"), &got, &want, 1e-4);
    }
}

/// A weight of `ty` with random values (quantized through gguf-io / pn-format on the host).
fn weight_bytes(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let vals = rnd(seed, rows * cols, 1.0);
    match ty {
        GgmlType::F32 => bytemuck_f32(&vals),
        GgmlType::F16 => vals
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect(),
        GgmlType::Q8_0 => {
            let mut out = Vec::new();
            for blk in vals.chunks(32) {
                let amax = blk.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                out.extend(half::f16::from_f32(d).to_le_bytes());
                for v in blk {
                    let q = if d == 0.0 { 0.0 } else { (v / d).round() };
                    out.push(q as i8 as u8);
                }
            }
            out
        }
        GgmlType::Pn3t | GgmlType::Pn4t => {
            let pt = if ty == GgmlType::Pn3t {
                pn_format::PnType::Pn3t
            } else {
                pn_format::PnType::Pn4t
            };
            pn_format::quantize_rows(pt, &vals, cols, 1).expect("quantize PN rows")
        }
        other => panic!("no test encoder for {}", other.name()),
    }
}

fn matmul_case<B: Backend>(be: &B, ty: GgmlType, n: usize, k: usize, rows: usize) -> Vec<f32> {
    let bytes = weight_bytes(ty, n, k, 21);
    let src = WeightSource {
        name: "test.weight",
        ty,
        rows: n,
        cols: k,
        bytes: &bytes,
        rotated: false,
        rotation_block: 0,
        file: None,
    };
    let w = be.load_weight(&src).unwrap();
    let w2 = be.load_weight(&src).unwrap();
    let x = buf(be, &rnd(22, rows * k, 1.0));
    let mut y = be.alloc(rows * n).unwrap();
    let mut y2 = be.alloc(rows * n).unwrap();
    be.matmul(&x, rows, &mut [(&w, &mut y), (&w2, &mut y2)])
        .unwrap();
    let mut out = get(be, &y, rows * n);
    out.extend(get(be, &y2, rows * n));
    if matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::Q8_0) {
        let ids: Vec<u32> = [0, n - 1, n / 2, 0].into_iter().map(|i| i as u32).collect();
        let mut e = be.alloc(ids.len() * k).unwrap();
        be.embed(&w, &ids, &mut e).unwrap();
        out.extend(get(be, &e, ids.len() * k));
    }
    out
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn matmul_and_embed_match_cpu() {
    let Some(g) = gpu() else { return };
    let cases = [
        (GgmlType::F32, &[(1, 64), (37, 320), (300, 1024)][..]),
        (GgmlType::F16, &[(1, 64), (37, 320), (300, 1024)][..]),
        (GgmlType::Q8_0, &[(6, 320), (37, 704), (300, 1024)][..]),
        (
            GgmlType::Pn3t,
            &[(1, 80), (37, 320), (300, 5120), (8, 160)][..],
        ),
        (
            GgmlType::Pn4t,
            &[(1, 64), (37, 704), (300, 1536), (5, 128)][..],
        ),
    ];
    for (ty, shapes) in cases {
        for &(n, k) in shapes {
            for rows in [1, 2, 16, 65] {
                let (got, want) = on_both!(&g, matmul_case(ty, n, k, rows));
                // PN decode uses fp16 activations (the CPU int16): bound relative to sqrt(K).
                let tol = match ty {
                    GgmlType::Pn3t | GgmlType::Pn4t => 2e-3 * (k as f32).sqrt(),
                    _ => 1e-4 * (k as f32).sqrt(),
                };
                check(
                    &format!("matmul {} {n}x{k} rows={rows}", ty.name()),
                    &got,
                    &want,
                    tol,
                );
            }
        }
    }
}

fn all_logits<B: Backend>(
    m: &Model<B>,
    tokens: &[u32],
    pieces: &[usize],
    kv: KvCacheType,
) -> Vec<f32> {
    let v = m.config.vocab;
    let mut state = m.new_state_with_kv(tokens.len(), kv).unwrap();
    let mut ws = m.new_workspace(64).unwrap();
    let mut logits = vec![0.0; tokens.len() * v];
    let mut t0 = 0;
    for &p in pieces {
        m.forward(
            &mut state,
            &mut ws,
            &tokens[t0..t0 + p],
            Outputs::all_logits(&mut logits[t0 * v..(t0 + p) * v]),
        )
        .unwrap();
        t0 += p;
    }
    logits
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn tiny_model_matches_oracle_logits() {
    let Some(g) = gpu() else { return };
    let m = Model::load(tiny("model-f16.gguf"), g).expect("load tiny model on the GPU");
    let tokens = read_tokens(&tiny("tokens_a.json"));
    let want = read_f32(&tiny("logits_a.f32"));
    // Whole prefill, then token-by-token decode, then a mix.
    let ones = vec![1; tokens.len()];
    for pieces in [&[tokens.len()][..], &ones[..], &[5, 1, 10][..]] {
        let got = all_logits(&m, &tokens, pieces, KvCacheType::F32);
        check(
            &format!("tiny oracle logits, pieces {pieces:?}"),
            &got,
            &want,
            1e-4,
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn pn3_model_gpu_matches_cpu() {
    let Some(g) = gpu() else { return };
    let dir = std::env::temp_dir().join(format!("pn-cuda-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("tiny-pn3.gguf");
    let mut o = pn_runtime::quantize::QuantizeOptions::new(tiny("model-f16.gguf"), &out);
    o.threads = 2;
    pn_runtime::quantize::quantize_model(
        &o,
        &pn_runtime::quantize::no_progress,
        &std::sync::atomic::AtomicBool::new(false),
    )
    .expect("quantize the tiny model");
    let cpu = Model::load(&out, CpuBackend::new(2)).unwrap();
    let gpu = Model::load(&out, g).unwrap();
    let tokens = read_tokens(&tiny("tokens_a.json"));
    let ones = vec![1; tokens.len()];
    for pieces in [&[tokens.len()][..], &ones[..]] {
        let want = all_logits(&cpu, &tokens, pieces, KvCacheType::F32);
        let got = all_logits(&gpu, &tokens, pieces, KvCacheType::F32);
        let (lo, hi) = want
            .iter()
            .fold((f32::MAX, f32::MIN), |(l, h), &v| (l.min(v), h.max(v)));
        check(
            &format!("PN3 GPU vs CPU, pieces {pieces:?}"),
            &got,
            &want,
            1e-3 * (hi - lo),
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn backend_open_fails_with_a_reason_or_succeeds() {
    // Runs everywhere: on a machine without kernels/driver/device the error says what to do.
    match CudaBackend::new(0) {
        Ok(b) => eprintln!("CUDA backend: {}", b.name()),
        Err(e) => {
            let msg = e.to_string();
            eprintln!("no CUDA backend: {msg}");
            assert!(
                msg.contains("CPU") || msg.contains("driver") || msg.contains("CUDA"),
                "unhelpful message: {msg}"
            );
        }
    }
}

/// RMSNorm + rotation and SwiGLU + rotation of `rows` rows of `n` with blocks of `block`: the
/// fused trait ops, or the separate ops they replace. Row 0 is zeros (the norm's `eps` path),
/// row 1 has an outlier, outputs start as NaN (every element must be written), and the gate is
/// read back to show the fused op leaves it unchanged.
fn rotations<B: Backend>(be: &B, rows: usize, n: usize, block: usize, fused: bool) -> Vec<f32> {
    let len = rows * n;
    let mut x = rnd(21, len, 3.0);
    x[..n].fill(0.0);
    if rows > 1 {
        x[n + n / 3] = 1e4;
    }
    let w = rnd(22, n, 1.5);
    let (xb, wb) = (buf(be, &x), buf(be, &w));
    let mut o = buf(be, &vec![f32::NAN; len]);
    let (g, u) = (rnd(23, len, 8.0), rnd(24, len, 3.0));
    let (gb, ub) = (buf(be, &g), buf(be, &u));
    let mut s = buf(be, &vec![f32::NAN; len]);
    if fused {
        be.rms_norm_hadamard(&xb, &wb, &mut o, rows, n, 1e-6, block)
            .unwrap();
        be.swiglu_hadamard(&gb, &ub, &mut s, len, block).unwrap();
    } else {
        be.rms_norm(&xb, &wb, &mut o, rows, n, 1e-6).unwrap();
        be.hadamard(&mut o, len, block).unwrap();
        be.copy(&gb, 0, &mut s, 0, len).unwrap();
        be.swiglu(&mut s, &ub, len).unwrap();
        be.hadamard(&mut s, len, block).unwrap();
    }
    let mut out = get(be, &o, len);
    out.extend(get(be, &s, len));
    out.extend(get(be, &gb, len));
    out
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_rotations_match_cpu_separate_ops() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(2);
    // K = R, K a multiple of R, every R kind (2, 32, 64 .. 1024), the longest row the fused norm
    // takes (12256), and rows beyond it (12288, 16384: the CUDA backend's fallback).
    for (rows, n, block) in [
        (1, 64, 64),
        (3, 256, 2),
        (7, 96, 32),
        (4, 2048, 128),
        (2, 5120, 256),
        (5, 1024, 1024),
        (2, 12256, 32),
        (2, 12288, 1024),
        (1, 16384, 256),
    ] {
        let want = rotations(&cpu, rows, n, block, false);
        let got = rotations(&g, rows, n, block, true);
        let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
        check(
            &format!("fused rotations {rows}x{n} R={block}"),
            &got,
            &want,
            1e-5 * scale,
        );
    }
}
