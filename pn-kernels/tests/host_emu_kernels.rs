//! The kernels not covered by host_emu_gemv / host_emu_ops run on the host by the SIMT emulator
//! (`host/emu_ops.cpp`): the tiled prefill matmul over every weight type, RoPE, conv1d, the
//! token-by-token delta rule, the embedding gathers and the elementwise ops, against the CPU
//! decoders (pn-format, gguf-io) and f64 references with the bounds of the GPU tests
//! (tests/gpu.rs), at 27B row lengths with few rows and at adversarial shapes (partial tiles,
//! rows not a multiple of the block). Also: the grid-stride loops of review finding 8 (grids
//! smaller than the token count give the same bytes), and a scan that every `__global__` of
//! kernels/*.cu is run by a host file.
mod common;

use common::*;
use pn_kernels::emu::{self, AttnCall, KvGeom};
use pn_kernels::emu_ops::{self, Elementwise, RopeCall};
use pn_kernels::{DeltaRuleInputs, DeltaRuleShape, WeightType};
use rand::Rng;

/// Max |got - want| / scale per element <= tol (the GPU tests' assert_close).
fn assert_close(what: &str, got: &[f32], want: &[f64], scale: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for i in 0..got.len() {
        let e = (got[i] as f64 - want[i]).abs() / scale[i].max(1e-30);
        assert!(
            e <= tol,
            "{what}: element {i}: got {} want {} (rel {e:.3e} > {tol:.1e})",
            got[i],
            want[i]
        );
    }
}

fn silu(v: f64) -> f64 {
    v / (1.0 + (-v).exp())
}

#[test]
fn tiled_matmul_equals_the_cpu_for_every_weight_type() {
    let mut r = rng(61);
    // (type, n, k, t): the GPU test's shapes (partial 64-tiles on n and t, k not a multiple of
    // 16 for f16), plus 27B row lengths (5120 hidden, pn3t 80-blocks) with few rows.
    for (ty, n, k, t) in [
        (WeightType::Pn3t, 130, 320, 17),
        (WeightType::Pn4t, 70, 704, 65),
        (WeightType::Q4K, 33, 512, 3),
        (WeightType::Q8_0, 48, 256, 9),
        (WeightType::Q3K, 20, 256, 2),
        (WeightType::F16, 19, 100, 70),
        (WeightType::F32, 64, 64, 64),
        (WeightType::Pn3t, 3, 5120, 2),
        (WeightType::Pn4t, 5, 5120, 3),
        (WeightType::Q4K, 2, 5120, 2),
    ] {
        let w = random_weights(&mut r, ty, n, k);
        let wd = dequant(ty, &w, n, k);
        let x = random_vec(&mut r, t * k, 2.0);
        let (mut want, mut scale) = (vec![0f64; t * n], vec![0f64; t * n]);
        for ti in 0..t {
            for ni in 0..n {
                for c in 0..k {
                    let p = wd[ni * k + c] as f64 * x[ti * k + c] as f64;
                    want[ti * n + ni] += p;
                    scale[ti * n + ni] += p.abs();
                }
            }
        }
        let mut y = vec![f32::NAN; t * n];
        emu_ops::matmul(ty, &w, &x, &mut y, n, t).unwrap();
        let what = format!("{} matmul {t}x{n}x{k}", ty.name());
        assert_close(&what, &y, &want, &scale, 1e-5);
    }
}

/// NeoX RoPE in f64 over `tokens` x `heads` rows of `hd`, positions `pos`.
fn rope_ref(x: &[f32], pos: &[i32], heads: usize, hd: usize, n_rot: usize, base: f64) -> Vec<f64> {
    let mut want: Vec<f64> = x.iter().map(|v| *v as f64).collect();
    for (ti, &p) in pos.iter().enumerate() {
        for h in 0..heads {
            let b = (ti * heads + h) * hd;
            for i in 0..n_rot / 2 {
                let th = p as f64 * base.powf(-2.0 * i as f64 / n_rot as f64);
                let (a, c) = (x[b + i] as f64, x[b + i + n_rot / 2] as f64);
                want[b + i] = a * th.cos() - c * th.sin();
                want[b + i + n_rot / 2] = a * th.sin() + c * th.cos();
            }
        }
    }
    want
}

#[test]
fn rope_equals_the_cpu_and_strides_over_tokens() {
    let mut r = rng(62);
    // 27B attention heads: 256 dims, 64 rotated; positions up to 2^18.
    let (t, heads, hd, n_rot) = (5usize, 4usize, 256usize, 64usize);
    let x = random_vec(&mut r, t * heads * hd, 2.0);
    let pos = [0, 1, 77, 4095, 262_143];
    let call = |p: Option<&'static [i32]>, pos0, grid_y| RopeCall {
        tokens: t,
        heads,
        tok_stride: heads * hd,
        head_stride: hd,
        pos: p,
        pos0,
        n_rot,
        base: 1e7,
        grid_y,
    };
    const POS: [i32; 5] = [0, 1, 77, 4095, 262_143];
    let want = rope_ref(&x, &pos, heads, hd, n_rot, 1e7);
    // One block per token, then 2 blocks striding over the 5 tokens: the same bytes.
    let mut full = x.clone();
    emu_ops::rope(&call(Some(&POS), 0, t as u32), &mut full).unwrap();
    assert_close("rope", &full, &want, &vec![4.0; want.len()], 1e-6);
    let mut strided = x.clone();
    emu_ops::rope(&call(Some(&POS), 0, 2), &mut strided).unwrap();
    assert_eq!(full, strided, "rope with grid y 2 < 5 tokens");
    // Without positions: pos0 + t.
    const CONSEC: [i32; 5] = [4000, 4001, 4002, 4003, 4004];
    let (mut a, mut b) = (x.clone(), x.clone());
    emu_ops::rope(&call(None, 4000, 3), &mut a).unwrap();
    emu_ops::rope(&call(Some(&CONSEC), 0, 5), &mut b).unwrap();
    assert_eq!(a, b, "pos0 + t equals explicit positions");
    // GDN-free 27B K heads: a head stride larger than the head (q+gate interleave).
    let mut wide = random_vec(&mut r, 2 * 2 * 512, 1.0);
    let orig = wide.clone();
    let c = RopeCall {
        tokens: 2,
        heads: 2,
        tok_stride: 1024,
        head_stride: 512,
        pos: None,
        pos0: 9,
        n_rot,
        base: 1e7,
        grid_y: 1,
    };
    emu_ops::rope(&c, &mut wide).unwrap();
    for (i, (a, b)) in wide.iter().zip(&orig).enumerate() {
        if i % 512 >= n_rot {
            assert_eq!(a, b, "dim {} past n_rot (or the gap) is untouched", i % 512);
        }
    }
}

#[test]
fn conv1d_equals_the_cpu() {
    let mut r = rng(63);
    // 27B conv channels are 10240; 1000 leaves a partial block of 256.
    for (c, t) in [(1000usize, 3usize), (10240, 1)] {
        let u = random_vec(&mut r, t * c, 2.0);
        let st = random_vec(&mut r, 3 * c, 2.0);
        let w = random_vec(&mut r, 4 * c, 1.0);
        let mut want = vec![0f64; t * c];
        let mut hist_end = vec![0f32; 3 * c];
        for ch in 0..c {
            let mut hist = vec![st[ch], st[c + ch], st[2 * c + ch]];
            for ti in 0..t {
                let ut = u[ti * c + ch];
                let a = (0..3)
                    .map(|k| w[4 * ch + k] as f64 * hist[k] as f64)
                    .sum::<f64>()
                    + w[4 * ch + 3] as f64 * ut as f64;
                want[ti * c + ch] = silu(a);
                hist.remove(0);
                hist.push(ut);
            }
            for k in 0..3 {
                hist_end[k * c + ch] = hist[k];
            }
        }
        let mut state = st.clone();
        let mut y = vec![f32::NAN; t * c];
        emu_ops::conv1d(&u, &mut state, &w, &mut y, c).unwrap();
        assert_close("conv1d", &y, &want, &vec![1.0; want.len()], 1e-5);
        assert_eq!(state, hist_end, "state holds the last 3 pre-conv inputs");
    }
}

#[test]
fn delta_rule_equals_the_cpu() {
    let mut r = rng(64);
    // 27B: 48 value heads over 16 key heads of 128; here 6 over 2, 4 tokens.
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
    let x = DeltaRuleInputs {
        q: &q[..],
        k: &k[..],
        v: &v[..],
        beta_raw: &b[..],
        alpha_raw: &al[..],
        dt_bias: &dtb[..],
        ssm_a: &a[..],
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
    let mut st = s0.clone();
    let mut out = vec![f32::NAN; t * nv * d];
    emu_ops::delta_rule(&x, &sh, &mut st, &mut out).unwrap();
    assert_close("delta_rule out", &out, &want, &vec![1.0; want.len()], 1e-4);
    assert_close(
        "delta_rule state",
        &st,
        &state,
        &vec![1.0; state.len()],
        1e-4,
    );
}

#[test]
fn get_rows_is_bit_exact_and_skips_bad_ids() {
    let mut r = rng(65);
    for ty in [
        WeightType::Q3K,
        WeightType::Q8_0,
        WeightType::F16,
        WeightType::F32,
    ] {
        // 27B token_embd rows are 5120 (Q3_K); 40 rows of them, 7 tokens (one out of range).
        let (n_rows, k) = (40, 5120);
        let w = random_weights(&mut r, ty, n_rows, k);
        let dense = dequant(ty, &w, n_rows, k);
        let mut ids: Vec<i32> = (0..7).map(|_| r.random_range(0..n_rows as i32)).collect();
        ids[3] = n_rows as i32;
        let mut out = vec![-7.0f32; ids.len() * k];
        emu_ops::get_rows(ty, &w, &ids, &mut out, k, n_rows).unwrap();
        for (t, &id) in ids.iter().enumerate() {
            let row = &out[t * k..(t + 1) * k];
            if id as usize >= n_rows {
                assert!(
                    row.iter().all(|v| *v == -7.0),
                    "{}: bad id wrote",
                    ty.name()
                );
                continue;
            }
            let want = &dense[id as usize * k..(id as usize + 1) * k];
            for e in 0..k {
                assert_eq!(
                    row[e].to_bits(),
                    want[e].to_bits(),
                    "{} token {t} elem {e}",
                    ty.name()
                );
            }
        }
    }
}

#[test]
fn elementwise_ops_equal_the_cpu_with_grid_strides() {
    let mut r = rng(66);
    // The 27B FFN width; 8 blocks of 256 stride over 17408 values (the wrapper would use 68).
    let n = 17408;
    let a = random_vec(&mut r, n, 8.0);
    let b = random_vec(&mut r, n, 8.0);
    for grid in [68u32, 8] {
        let mut out = vec![f32::NAN; n];
        emu_ops::elementwise(
            Elementwise::Swiglu {
                gate: &a,
                up: &b,
                out: &mut out,
            },
            grid,
        )
        .unwrap();
        let want: Vec<f64> = (0..n).map(|i| silu(a[i] as f64) * b[i] as f64).collect();
        let sc: Vec<f64> = want.iter().map(|v| v.abs().max(1e-3)).collect();
        assert_close("swiglu", &out, &want, &sc, 1e-5);
        let mut acc = a.clone();
        emu_ops::elementwise(Elementwise::Add { a: &mut acc, b: &b }, grid).unwrap();
        (0..n).for_each(|i| assert_eq!(acc[i], a[i] + b[i], "add {i}"));
    }
    // The attention output gate: 2 tokens x 12 heads of 256, the gate of head h at
    // t*6144 + h*512 (after q in the q+gate projection).
    let x = random_vec(&mut r, 24 * 256, 2.0);
    let gate = random_vec(&mut r, 24 * 512, 6.0);
    let mut gx = x.clone();
    let op = Elementwise::SigmoidGate {
        x: &mut gx,
        g: &gate,
        hd: 256,
        n_heads: 12,
        g_ts: 12 * 512,
        g_hs: 512,
    };
    emu_ops::elementwise(op, 5).unwrap();
    let want: Vec<f64> = (0..24 * 256)
        .map(|i| x[i] as f64 / (1.0 + (-(gate[(i / 256) * 512 + i % 256] as f64)).exp()))
        .collect();
    let sc: Vec<f64> = want.iter().map(|v| v.abs().max(1e-3)).collect();
    assert_close("sigmoid_gate", &gx, &want, &sc, 1e-5);
}

#[test]
fn kv_store_and_attention_stride_over_tokens() {
    // Review finding 8: the token dimension of kv_store (grid y), the split-K partials (z) and
    // the combine (y) is grid-strided; a grid of 2 over 5 tokens gives the bytes of 5 blocks.
    let mut r = rng(67);
    let (n_head, n_kv, t) = (12usize, 2usize, 5usize);
    for kv_type in [1, 3] {
        let row = if kv_type == 1 { 256 } else { 144 };
        let geom = KvGeom {
            kv_type,
            pos_stride: n_kv * row,
            head_stride: row,
            n_kv,
        };
        let bytes = geom.bytes(t);
        let k = random_vec(&mut r, t * n_kv * 256, 1.5);
        let v = random_vec(&mut r, t * n_kv * 256, 1.5);
        let (mut kc1, mut vc1) = (vec![0u8; bytes], vec![0u8; bytes]);
        let (mut kc2, mut vc2) = (vec![0u8; bytes], vec![0u8; bytes]);
        emu::kv_store(&geom, &k, &v, &mut kc1, &mut vc1, 0).unwrap();
        emu_ops::kv_store_grid(&geom, &k, &v, &mut kc2, &mut vc2, 0, 2).unwrap();
        assert!(
            kc1 == kc2 && vc1 == vc2,
            "kv_store type {kv_type}: grid 2 over {t} tokens"
        );
        let q = random_vec(&mut r, t * n_head * 256, 1.0);
        let call = AttnCall {
            n_head,
            group: n_head / n_kv,
            p0: 0,
            t,
            n_split: 2,
            chunk: 4,
            scale: 1.0 / 16.0,
            kv: geom,
        };
        let mut o1 = vec![f32::NAN; t * n_head * 256];
        let mut o2 = vec![f32::NAN; t * n_head * 256];
        emu::attention(&call, &q, &kc1, &vc1, &mut o1).unwrap();
        let s = emu_ops::attention_grid(&call, &q, &kc1, &vc1, &mut o2, 2).unwrap();
        assert_eq!(o1, o2, "attention type {kv_type}: grid 2 over {t} tokens");
        assert_eq!(s.smem_max_degree, 1.0, "attention strided: bank conflict");
    }
    // The wrappers' grid: one block per token up to the limit, then the stride; a 16,384-token
    // chunk of 4 KV heads (finding 8's case) or 70,000 tokens launch.
    assert_eq!(pn_kernels::launch::grid_y_blocks(16_384), 16_384);
    assert_eq!(pn_kernels::launch::grid_y_blocks(70_000), 65_535);
    assert_eq!(pn_kernels::launch::grid_y_blocks(0), 1);
}

/// The name of every `__global__` function in `src` (the kernels' entry points).
fn global_names(src: &str) -> Vec<String> {
    // Drop the `__launch_bounds__(n)` between `__global__ void` and the name.
    let mut s = src.to_string();
    while let Some(at) = s.find("__launch_bounds__(") {
        let close = s[at..].find(')').map_or(s.len(), |c| at + c + 1);
        s.replace_range(at..close, "");
    }
    s.match_indices("__global__")
        .filter_map(|(at, _)| {
            let rest = &s[at..];
            let head = &rest[..rest.find('(')?];
            let name = head.split_whitespace().last()?;
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
                .then(|| name.to_string())
        })
        .collect()
}

#[test]
fn every_global_kernel_is_run_by_the_host_emulator() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut host = String::new();
    for e in std::fs::read_dir(root.join("host")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "cpp") {
            host.push_str(&common::expand_pasting_macros(
                &std::fs::read_to_string(&p).unwrap(),
            ));
        }
    }
    // Kernels defined through a macro (ATT_ARGS / AP_ARGS / MM_ARGS / PN_ARGS) are still named
    // at their __global__.
    let mut names = Vec::new();
    for e in std::fs::read_dir(root.join("kernels")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "cu") {
            let src = common::expand_pasting_macros(&std::fs::read_to_string(&p).unwrap());
            for n in global_names(&src) {
                names.push((p.file_name().unwrap().to_string_lossy().to_string(), n));
            }
        }
    }
    // The scan finds what the compiler built (when the build had a CUDA compiler: CI's does).
    if pn_kernels::kernels_available() {
        let mut built: Vec<&str> = pn_kernels::modules()
            .iter()
            .flat_map(|m| m.kernels.iter().copied())
            .collect();
        let mut scanned: Vec<&str> = names.iter().map(|(_, n)| n.as_str()).collect();
        built.sort_unstable();
        scanned.sort_unstable();
        assert_eq!(
            scanned, built,
            "the scan of kernels/*.cu vs the compiled modules"
        );
    }
    assert!(
        names.len() >= 58,
        "found only {} kernels: {names:?}",
        names.len()
    );
    let missing: Vec<_> = names
        .iter()
        .filter(|(_, n)| !host.contains(&format!("{n}(")))
        .collect();
    assert!(
        missing.is_empty(),
        "kernels no host/emu_*.cpp (or host/shim.cpp) launches, so no host test runs them: \
         {missing:?}"
    );
}
