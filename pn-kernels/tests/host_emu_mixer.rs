//! The fused mixer kernels (kernels/mixer.cu, the L2-normalising delta rule) run on the host by
//! the SIMT emulator with the wrappers' geometry, each against (1) the unfused kernels it
//! replaces, run the same way (bit for bit where the fusion keeps their arithmetic) and (2) an
//! f64 reference with the GPU tests' bounds; at the 27B mixer shapes (heads of 256, 24 q / 4 kv
//! heads, q interleaved with its gate; GDN heads of 128) with few tokens, and at adversarial
//! ones (zero heads, grids smaller than the token count, rotation blocks below and above the
//! head size); and with no shared-memory bank conflict.
mod common;

use common::*;
use pn_kernels::emu::{self, Norm, Rotation};
use pn_kernels::emu_mixer;
use pn_kernels::emu_ops::{self, Elementwise, RopeCall};
use pn_kernels::QkNormRopeShape;
use pn_kernels::{DeltaRuleInputs, DeltaRuleShape, GateRotation, GatedNormRotation, QkL2};
use rand::Rng;

fn assert_rel(what: &str, got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let e = (*g as f64 - w).abs() / scale;
        assert!(
            e <= tol,
            "{what}: element {i}: got {g} want {w} (rel {e:.3e} > {tol:.1e})"
        );
    }
}

fn assert_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "{what}: element {i}: {g} vs {w}");
    }
}

fn silu(v: f64) -> f64 {
    v / (1.0 + (-v).exp())
}

/// H_R x / sqrt(R) per chunk, in f64 (Sylvester order).
fn hadamard_ref(x: &[f64], r: usize) -> Vec<f64> {
    let mut out = vec![0f64; x.len()];
    for (c, chunk) in x.chunks(r).enumerate() {
        for i in 0..r {
            let s: f64 = (0..r)
                .map(|j| {
                    let sign = if (i & j).count_ones() % 2 == 0 {
                        1.0
                    } else {
                        -1.0
                    };
                    sign * chunk[j]
                })
                .sum();
            out[c * r + i] = s / (r as f64).sqrt();
        }
    }
    out
}

/// The heads `(offset of each row)` of a `tokens x heads` layout.
fn rows(tokens: usize, heads: usize, ts: usize, hs: usize) -> Vec<usize> {
    (0..tokens)
        .flat_map(|t| (0..heads).map(move |h| t * ts + h * hs))
        .collect()
}

/// f64 reference: RMSNorm (weight w) then NeoX RoPE of the first n_rot dims at `pos`.
fn norm_rope_ref(row: &[f32], w: &[f32], eps: f64, n_rot: usize, pos: f64, base: f64) -> Vec<f64> {
    let n = row.len();
    let ss: f64 = row.iter().map(|v| (*v as f64).powi(2)).sum();
    let inv = 1.0 / (ss / n as f64 + eps).sqrt();
    let mut y: Vec<f64> = row
        .iter()
        .zip(w)
        .map(|(v, w)| *v as f64 * inv * *w as f64)
        .collect();
    let half = n_rot / 2;
    for i in 0..half {
        let th = pos * base.powf(-2.0 * i as f64 / n_rot as f64);
        let (a, b) = (y[i], y[i + half]);
        y[i] = a * th.cos() - b * th.sin();
        y[i + half] = a * th.sin() + b * th.cos();
    }
    y
}

/// The unfused sequence on the emulator: rms_norm_f32 (256 threads) of the gathered heads,
/// rope_neox_f32, scattered back.
fn norm_then_rope(x: &mut [f32], offs: &[usize], w: &[f32], s: &QkNormRopeShape, heads: usize) {
    let n = s.head_dim;
    let gathered: Vec<f32> = offs.iter().flat_map(|&o| x[o..o + n].to_vec()).collect();
    let mut y = vec![f32::NAN; gathered.len()];
    emu::norm(
        Norm::Rms {
            w: Some(w),
            eps: s.eps,
        },
        &gathered,
        &mut y,
        n,
        256,
    )
    .unwrap();
    let call = RopeCall {
        tokens: s.n_tokens,
        heads,
        tok_stride: heads * n,
        head_stride: n,
        pos: None,
        pos0: s.pos0 as i32,
        n_rot: s.n_rot,
        base: s.base,
        grid_y: s.n_tokens as u32,
    };
    emu_ops::rope(&call, &mut y).unwrap();
    for (r, &o) in offs.iter().enumerate() {
        x[o..o + n].copy_from_slice(&y[r * n..(r + 1) * n]);
    }
}

#[test]
fn qk_norm_rope_equals_norms_and_rope_without_bank_conflicts() {
    let mut r = rng(71);
    // (tokens, q heads, k heads, head dim, n_rot, grid_y, pos0): the 27B layer (24/4 heads of
    // 256, rope on 64 dims, q heads interleaved with their gates); full rotation; a grid
    // smaller than the token count; a head dim that is not a multiple of the block.
    for (t, hq, hk, n, n_rot, grid_y, pos0) in [
        (2usize, 24usize, 4usize, 256usize, 64usize, 2u32, 4093usize),
        (3, 4, 2, 256, 256, 1, 0),
        (5, 2, 1, 128, 32, 2, 100_000),
        (2, 3, 1, 320, 64, 2, 7),
    ] {
        let s = QkNormRopeShape {
            n_tokens: t,
            n_q_heads: hq,
            q_tok_stride: hq * 2 * n,
            q_head_stride: 2 * n,
            n_k_heads: hk,
            k_tok_stride: hk * n,
            k_head_stride: n,
            head_dim: n,
            eps: 1e-6,
            pos0,
            n_rot,
            base: 10_000_000.0,
        };
        let mut q = random_vec(&mut r, s.q_len(), 4.0);
        let mut k = random_vec(&mut r, s.k_len(), 4.0);
        // Adversarial: an all-zero k head (the norm's eps alone) and a large q head.
        k[..n].iter_mut().for_each(|v| *v = 0.0);
        q[..n].iter_mut().for_each(|v| *v *= 1e4);
        let wq = random_vec(&mut r, n, 1.5);
        let wk = random_vec(&mut r, n, 1.5);
        let (mut q2, mut k2) = (q.clone(), k.clone());
        let st = emu_mixer::qk_norm_rope(&s, (&mut q2, &mut k2), (&wq, &wk), grid_y).unwrap();
        let what = format!("qk_norm_rope {t} tokens, {hq}/{hk} heads of {n}, rot {n_rot}");
        assert_eq!(st.smem_max_degree, 1.0, "{what}: bank conflict");
        assert!(st.smem_instr > 0, "{what}: shared accesses counted");
        // (1) The four unfused launches, bit for bit; the gate halves untouched.
        let qo = rows(t, hq, s.q_tok_stride, s.q_head_stride);
        let ko = rows(t, hk, s.k_tok_stride, s.k_head_stride);
        let (mut q3, mut k3) = (q.clone(), k.clone());
        norm_then_rope(&mut q3, &qo, &wq, &s, hq);
        norm_then_rope(&mut k3, &ko, &wk, &s, hk);
        assert_bits(&format!("{what}: q"), &q2, &q3);
        assert_bits(&format!("{what}: k"), &k2, &k3);
        // (2) The f64 reference, per head.
        for (x, got, offs, w) in [(&q, &q2, &qo, &wq), (&k, &k2, &ko, &wk)] {
            for (i, &o) in offs.iter().enumerate() {
                let pos = (pos0 + i / (offs.len() / t)) as f64;
                let want = norm_rope_ref(&x[o..o + n], w, 1e-6, n_rot, pos, 10_000_000.0);
                assert_rel(
                    &format!("{what}: head row {i}"),
                    &got[o..o + n],
                    &want,
                    2e-5,
                );
            }
        }
    }
}

#[test]
fn qk_norm_rope_refuses_bad_shapes() {
    let s = QkNormRopeShape {
        n_tokens: 1,
        n_q_heads: 1,
        q_tok_stride: 256,
        q_head_stride: 256,
        n_k_heads: 1,
        k_tok_stride: 256,
        k_head_stride: 256,
        head_dim: 256,
        eps: 1e-6,
        pos0: 0,
        n_rot: 63,
        base: 1e4,
    };
    assert!(s.refusal().unwrap().contains("n_rot 63"));
    let (mut q, mut k, w) = (vec![0f32; 256], vec![0f32; 255], vec![1f32; 256]);
    let ok = QkNormRopeShape { n_rot: 64, ..s };
    let e = emu_mixer::qk_norm_rope(&ok, (&mut q, &mut k), (&w, &w), 1).unwrap_err();
    assert!(e.to_string().contains("short"), "{e}");
}

#[test]
fn sigmoid_gate_hadamard_equals_gate_then_rotation_without_bank_conflicts() {
    let mut r = rng(72);
    // (tokens, heads, head dim, R): the 27B o-projection input (24 heads of 256, gate the
    // second half of each 512-float q slice) at R 64 and 256; R above the head size (1024).
    for (t, nh, hd, rr) in [
        (2usize, 24usize, 256usize, 256usize),
        (1, 24, 256, 64),
        (3, 4, 256, 1024),
    ] {
        let len = t * nh * hd;
        let (gts, ghs) = (nh * 2 * hd, 2 * hd);
        let x = random_vec(&mut r, len, 3.0);
        // The gate view starts at the head's second half (the backend's offset).
        let qg = random_vec(&mut r, t * gts, 6.0);
        let g = &qg[hd..];
        let s = GateRotation {
            len,
            n_heads: nh,
            head_dim: hd,
            gate_tok_stride: gts,
            gate_head_stride: ghs,
            block: rr,
        };
        let mut out = vec![f32::NAN; len];
        let st = emu_mixer::sigmoid_gate_hadamard(&s, &x, g, &mut out).unwrap();
        let what = format!("sigmoid_gate_hadamard {t}x{nh}x{hd} R={rr}");
        assert_eq!(st.smem_max_degree, 1.0, "{what}: bank conflict");
        // (1) sigmoid_gate_f32 then hadamard_f32 (the copy between them moves bits only).
        let mut gated = x.clone();
        let op = Elementwise::SigmoidGate {
            x: &mut gated,
            g,
            hd,
            n_heads: nh,
            g_ts: gts,
            g_hs: ghs,
        };
        emu_ops::elementwise(op, 4).unwrap();
        let mut want_bits = vec![f32::NAN; len];
        let threads = (rr as u32 / 2).clamp(32, 512);
        emu::hadamard(Rotation::Plain, &gated, &mut want_bits, rr, threads).unwrap();
        assert_bits(&what, &out, &want_bits);
        // (2) f64.
        let mut want = vec![0f64; len];
        for (e, w) in want.iter_mut().enumerate() {
            let (row, i) = (e / hd, e % hd);
            let gv = g[(row / nh) * gts + (row % nh) * ghs + i] as f64;
            *w = x[e] as f64 / (1.0 + (-gv).exp());
        }
        assert_rel(&what, &out, &hadamard_ref(&want, rr), 1e-5);
    }
}

#[test]
fn gated_rms_norm_hadamard_equals_norm_then_rotation_without_bank_conflicts() {
    let mut r = rng(73);
    // (rows, n, R): the 27B GDN output (48 value heads of 128 per token) at R 64 (two chunks
    // per row), 128, 256 and 1024 (several rows per chunk).
    for (rows_n, n, rr) in [
        (48usize, 128usize, 256usize),
        (6, 128, 64),
        (8, 128, 128),
        (16, 128, 1024),
    ] {
        let len = rows_n * n;
        let mut o = random_vec(&mut r, len, 2.0);
        o[..n].iter_mut().for_each(|v| *v = 0.0); // a zero row: eps alone
        let z = random_vec(&mut r, len, 4.0);
        let w = random_vec(&mut r, n, 1.5);
        let s = GatedNormRotation {
            len,
            n,
            eps: 1e-6,
            block: rr,
        };
        let mut out = vec![f32::NAN; len];
        let st = emu_mixer::gated_rms_norm_hadamard(&s, (&o, &z, &w), &mut out).unwrap();
        let what = format!("gated_rms_norm_hadamard {rows_n}x{n} R={rr}");
        assert_eq!(st.smem_max_degree, 1.0, "{what}: bank conflict");
        // (1) gated_rms_norm_f32 (128 threads, the wrapper's) then hadamard_f32.
        let mut normed = vec![f32::NAN; len];
        emu::norm(
            Norm::Gated {
                z: &z,
                w: &w,
                eps: 1e-6,
            },
            &o,
            &mut normed,
            n,
            128,
        )
        .unwrap();
        let mut want_bits = vec![f32::NAN; len];
        let threads = (rr as u32 / 2).clamp(32, 512);
        emu::hadamard(Rotation::Plain, &normed, &mut want_bits, rr, threads).unwrap();
        assert_bits(&what, &out, &want_bits);
        // (2) f64.
        let mut want = vec![0f64; len];
        for (row, orow) in o.chunks(n).enumerate() {
            let ss: f64 = orow.iter().map(|v| (*v as f64).powi(2)).sum();
            let inv = 1.0 / (ss / n as f64 + 1e-6).sqrt();
            for (i, wi) in w.iter().enumerate() {
                let e = row * n + i;
                want[e] = o[e] as f64 * inv * *wi as f64 * silu(z[e] as f64);
            }
        }
        assert_rel(&what, &out, &hadamard_ref(&want, rr), 1e-5);
    }
    let bad = GatedNormRotation {
        len: 384,
        n: 128,
        eps: 1e-6,
        block: 256,
    };
    assert!(bad.refusal().unwrap().contains("whole spans"));
}

#[test]
fn delta_rule_l2_equals_norms_then_the_delta_rule() {
    let mut r = rng(74);
    // 27B: 48 value heads over 16 key heads of 128; here 6 over 2, 3 tokens; q, k and v in one
    // conv-output row per token as the backend passes them.
    let (nv, nk, t, d) = (6usize, 2usize, 3usize, 128usize);
    let cd = 2 * nk * d + nv * d;
    let mut y = random_vec(&mut r, t * cd, 2.0);
    y[d..2 * d].iter_mut().for_each(|v| *v = 0.0); // a zero q head: eps alone
    let b = random_vec(&mut r, t * nv, 3.0);
    let al = random_vec(&mut r, t * nv, 3.0);
    let dtb = random_vec(&mut r, nv, 1.0);
    let a: Vec<f32> = (0..nv).map(|_| -r.random_range(0.1f32..2.0)).collect();
    let s0 = random_vec(&mut r, nv * d * d, 0.5);
    let sh = DeltaRuleShape {
        qk_stride: cd,
        v_stride: cd,
        ab_stride: nv,
        out_stride: nv * d,
        n_v_heads: nv,
        n_k_heads: nk,
        t_len: t,
    };
    let l2 = QkL2 {
        q_scale: 1.0 / (d as f32).sqrt(),
        eps: 1e-6,
    };
    let inputs = |y: &[f32]| -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        (y.to_vec(), y[nk * d..].to_vec(), y[2 * nk * d..].to_vec())
    };
    // Fused: raw q and k.
    let (q, k, v) = inputs(&y);
    let x = DeltaRuleInputs {
        q: &q[..],
        k: &k[..],
        v: &v[..],
        beta_raw: &b[..],
        alpha_raw: &al[..],
        dt_bias: &dtb[..],
        ssm_a: &a[..],
    };
    let (mut st1, mut out1) = (s0.clone(), vec![f32::NAN; t * nv * d]);
    // delta_rule.cu's shared arrays are plain `__shared__` ones, which the emulator does not
    // count (its loads are consecutive words, the partial sums broadcasts).
    emu_mixer::delta_rule_l2(&x, &sh, l2, &mut st1, &mut out1).unwrap();
    // Unfused: l2_norm_f32 on the q and k heads, then delta_rule_f32.
    let mut yn = y.clone();
    for ti in 0..t {
        for h in 0..2 * nk {
            let o = ti * cd + h * d;
            let scale = if h < nk { l2.q_scale } else { 1.0 };
            let mut row = vec![0f32; d];
            let kind = Norm::L2 { eps: l2.eps, scale };
            emu::norm(kind, &y[o..o + d], &mut row, d, 128).unwrap();
            yn[o..o + d].copy_from_slice(&row);
        }
    }
    let (q, k, v) = inputs(&yn);
    let x2 = DeltaRuleInputs {
        q: &q[..],
        k: &k[..],
        v: &v[..],
        ..x
    };
    let (mut st2, mut out2) = (s0.clone(), vec![f32::NAN; t * nv * d]);
    emu_ops::delta_rule(&x2, &sh, &mut st2, &mut out2).unwrap();
    // The sums of squares reduce in another order: equal up to f32 rounding.
    let o64: Vec<f64> = out2.iter().map(|v| *v as f64).collect();
    assert_rel("delta_rule_l2 out", &out1, &o64, 1e-5);
    let s64: Vec<f64> = st2.iter().map(|v| *v as f64).collect();
    assert_rel("delta_rule_l2 state", &st1, &s64, 1e-5);
    assert!(out1.iter().all(|v| v.is_finite()));
}

#[test]
fn attn_combine_gate_hadamard_equals_combine_gate_and_rotation() {
    let mut r = rng(76);
    // The 27B decode attention output (24 heads of 256), 5 splits, the last ones past a query's
    // causal end (sum 0) as the partial kernel writes them; R 256, 64 and 1024.
    for (t, nh, ns, rr) in [
        (1usize, 24usize, 5usize, 256usize),
        (2, 24, 5, 64),
        (3, 4, 3, 1024),
    ] {
        let rows = t * nh;
        let part_o = random_vec(&mut r, rows * ns * 256, 3.0);
        let mut part_ml = Vec::with_capacity(rows * ns * 2);
        for row in 0..rows {
            for sp in 0..ns {
                let live = sp + 1 < ns || row % 2 == 0;
                part_ml.push(if live {
                    r.random_range(-8.0f32..8.0)
                } else {
                    f32::NEG_INFINITY
                });
                part_ml.push(if live {
                    r.random_range(0.5f32..40.0)
                } else {
                    0.0
                });
            }
        }
        let p = emu_mixer::AttnPartials {
            part_o: &part_o,
            part_ml: &part_ml,
            n_split: ns,
        };
        let (gts, ghs) = (nh * 512, 512);
        let qg = random_vec(&mut r, t * gts, 6.0);
        let g = &qg[256..];
        let s = GateRotation {
            len: rows * 256,
            n_heads: nh,
            head_dim: 256,
            gate_tok_stride: gts,
            gate_head_stride: ghs,
            block: rr,
        };
        let mut out = vec![f32::NAN; s.len];
        let st = emu_mixer::attn_combine_gate_hadamard(&p, &s, g, &mut out).unwrap();
        let what = format!("attn_combine_gate_hadamard t={t} heads={nh} splits={ns} R={rr}");
        assert_eq!(st.smem_max_degree, 1.0, "{what}: bank conflict");
        // attn_combine, sigmoid_gate_f32, hadamard_f32: bit for bit.
        let mut o = vec![f32::NAN; s.len];
        emu_mixer::attn_combine(&p, (t, nh), &mut o).unwrap();
        let mut gated = o.clone();
        let op = Elementwise::SigmoidGate {
            x: &mut gated,
            g,
            hd: 256,
            n_heads: nh,
            g_ts: gts,
            g_hs: ghs,
        };
        emu_ops::elementwise(op, 4).unwrap();
        let mut want_bits = vec![f32::NAN; s.len];
        let threads = (rr as u32 / 2).clamp(32, 512);
        emu::hadamard(Rotation::Plain, &gated, &mut want_bits, rr, threads).unwrap();
        assert_bits(&what, &out, &want_bits);
        // f64: the softmax merge of the live splits.
        let mut want = vec![0f64; s.len];
        for row in 0..rows {
            let ml = |sp: usize| {
                (
                    part_ml[2 * (row * ns + sp)] as f64,
                    part_ml[2 * (row * ns + sp) + 1] as f64,
                )
            };
            let m = (0..ns)
                .filter(|&sp| ml(sp).1 > 0.0)
                .map(|sp| ml(sp).0)
                .fold(f64::MIN, f64::max);
            let l: f64 = (0..ns)
                .map(&ml)
                .filter(|x| x.1 > 0.0)
                .map(|(ms, ls)| ls * (ms - m).exp())
                .sum();
            for d in 0..256 {
                let a: f64 = (0..ns)
                    .filter(|&sp| ml(sp).1 > 0.0)
                    .map(|sp| part_o[(row * ns + sp) * 256 + d] as f64 * (ml(sp).0 - m).exp())
                    .sum();
                let gv = g[(row / nh) * gts + (row % nh) * ghs + d] as f64;
                want[row * 256 + d] = a / l / (1.0 + (-gv).exp());
            }
        }
        assert_rel(&what, &out, &hadamard_ref(&want, rr), 1e-5);
    }
}
