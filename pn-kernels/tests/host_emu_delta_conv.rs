//! The decode delta rule that runs its conv1d itself (`delta_rule_conv_f32` in
//! `kernels/delta_rule.cu`: conv1d + SiLU, the L2 norms of q and k, the recurrence; the key
//! heads' conv state shifted by the last block of each group, `kernels/rowsync.cuh`) run by the
//! SIMT emulator against the unfused launches it replaces (`conv1d_silu_f32` then
//! `delta_rule_l2_f32`), bit for bit: outputs, recurrent state, conv output and conv state.
//! At the 27B GDN shape (48 value heads over 16 key heads of 128, conv kernel 4) for one
//! decode token, and at 6 over 2 heads for 3 tokens (the verify), and with one value head per
//! key head.
mod common;

use common::*;
use pn_kernels::emu_mixer::{self, ConvRows};
use pn_kernels::emu_ops;
use pn_kernels::{DeltaRuleInputs, DeltaRuleShape, QkL2};
use rand::Rng;

fn assert_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "{what}: element {i}: {g} vs {w}");
    }
}

#[test]
fn fused_conv_delta_rule_equals_conv_then_delta_rule() {
    let mut r = rng(95);
    let d = 128usize;
    for (nv, nk, t) in [(48usize, 16usize, 1usize), (6, 2, 3), (2, 2, 2)] {
        let cd = 2 * nk * d + nv * d;
        let u = random_vec(&mut r, t * cd, 1.5);
        let w = random_vec(&mut r, 4 * cd, 0.6);
        let cs0 = random_vec(&mut r, 3 * cd, 1.5);
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
        let what = format!("{nv}/{nk} heads, {t} tokens");
        // Unfused: conv1d_silu_f32, then delta_rule_l2_f32 on its output.
        let (mut cs1, mut y1) = (cs0.clone(), vec![f32::NAN; t * cd]);
        emu_ops::conv1d(&u, &mut cs1, &w, &mut y1, cd).unwrap();
        let x1 = DeltaRuleInputs {
            q: &y1[..],
            k: &y1[nk * d..],
            v: &y1[2 * nk * d..],
            beta_raw: &b[..],
            alpha_raw: &al[..],
            dt_bias: &dtb[..],
            ssm_a: &a[..],
        };
        let (mut st1, mut out1) = (s0.clone(), vec![f32::NAN; t * nv * d]);
        emu_mixer::delta_rule_l2(&x1, &sh, l2, &mut st1, &mut out1).unwrap();
        // Fused: one launch from the raw conv input.
        let (mut cs2, mut y2) = (cs0.clone(), vec![f32::NAN; t * cd]);
        let (mut st2, mut out2) = (s0.clone(), vec![f32::NAN; t * nv * d]);
        // The gates only (q/k/v come from the conv): the unfused run's views stand in.
        let c = ConvRows {
            u: &u,
            w: &w,
            state: &mut cs2,
            y: &mut y2,
        };
        let st = emu_mixer::delta_rule_conv(c, &x1, &sh, l2, (&mut st2, &mut out2)).unwrap();
        assert_eq!(st.smem_max_degree, 1.0, "{what}: bank conflict");
        assert_bits(&format!("{what}: out"), &out2, &out1);
        assert_bits(&format!("{what}: state"), &st2, &st1);
        assert_bits(&format!("{what}: conv out"), &y2, &y1);
        assert_bits(&format!("{what}: conv state"), &cs2, &cs1);
    }
}

#[test]
fn fused_conv_delta_rule_refuses_uneven_groups_and_partial_rows() {
    let (nv, nk, d) = (6usize, 4usize, 128usize);
    let cd = 2 * nk * d + nv * d;
    let sh = DeltaRuleShape {
        qk_stride: cd,
        v_stride: cd,
        ab_stride: nv,
        out_stride: nv * d,
        n_v_heads: nv,
        n_k_heads: nk,
        t_len: 1,
    };
    assert!(
        pn_kernels::delta_rule_conv_refusal(&sh).is_some(),
        "6 over 4"
    );
    let even = DeltaRuleShape {
        n_k_heads: 2,
        qk_stride: 4 * d + nv * d,
        v_stride: 4 * d + nv * d,
        ..sh
    };
    assert!(pn_kernels::delta_rule_conv_refusal(&even).is_none());
    let strided = DeltaRuleShape {
        qk_stride: even.qk_stride + 4,
        ..even
    };
    assert!(pn_kernels::delta_rule_conv_refusal(&strided).is_some());
}

/// Review finding 8: norm.cu's kernels stride over the tokens on grid y, so a grid of fewer
/// blocks than tokens gives the bits of one block per token.
#[test]
fn norms_stride_over_tokens_on_a_small_grid() {
    use pn_kernels::emu::{self, Norm};
    let mut r = rng(96);
    let (rows, n) = (7usize, 128usize);
    let x = random_vec(&mut r, rows * n, 2.0);
    let z = random_vec(&mut r, rows * n, 3.0);
    let w = random_vec(&mut r, n, 1.5);
    let kinds = [
        (
            Norm::Rms {
                w: Some(&w),
                eps: 1e-6,
            },
            256u32,
        ),
        (
            Norm::L2 {
                eps: 1e-6,
                scale: 0.25,
            },
            128,
        ),
        (
            Norm::Gated {
                z: &z,
                w: &w,
                eps: 1e-6,
            },
            128,
        ),
    ];
    for (kind, threads) in kinds {
        let mut one = vec![f32::NAN; rows * n];
        emu::norm(kind, &x, &mut one, n, threads).unwrap();
        for grid_y in [1u32, 3] {
            let mut got = vec![f32::NAN; rows * n];
            let st = emu::norm_strided(kind, (&x, &mut got), n, threads, grid_y).unwrap();
            assert_eq!(st.smem_max_degree, 1.0);
            assert_bits(&format!("{kind:?} on {grid_y} blocks"), &got, &one);
        }
    }
}
