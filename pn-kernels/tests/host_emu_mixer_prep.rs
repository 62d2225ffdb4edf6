//! The mixer kernels that write their projection's prepared fp16 input themselves
//! (`kernels/mixer.cu` with `xh`: the attention merge + gate + rotation, the GDN gated norm +
//! rotation; the rows' maximum gathered across blocks by `kernels/rowsync.cuh`), run by the
//! SIMT emulator: the f32 output equals the kernel without the copy bit for bit, the fp16 copy
//! and exponents equal `pn_prepare_x_h2` on those rows bit for bit, the sync words are zero
//! again afterwards, and no shared access has a bank conflict. At the 27B mixer shapes (24
//! heads of 256; 48 value heads of 128) with 1..3 tokens, and rows whose maximum sits in the
//! last, the first or a middle block.
mod common;

use common::*;
use pn_kernels::emu;
use pn_kernels::emu_mixer::{self, AttnPartials};
use pn_kernels::{GateRotation, GatedNormRotation};
use rand::Rng;

fn assert_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "{what}: element {i}: {g} vs {w}");
    }
}

/// Scales one block-sized stretch of each row so that the row's largest value sits there.
fn plant_max(x: &mut [f32], row_len: usize, at: usize, len: usize) {
    for row in x.chunks_mut(row_len) {
        row[at..at + len].iter_mut().for_each(|v| *v *= 50.0);
    }
}

#[test]
fn gated_norm_rotation_writes_the_prepared_copy_of_its_rows() {
    let mut r = rng(91);
    // (tokens, value heads, n, R, where the big head is): the 27B GDN output at R 256 (24
    // blocks per token), R 64 (one head per block) and R 1024 (8 heads per block).
    for (t, hv, n, rr, big) in [
        (1usize, 48usize, 128usize, 256usize, 47usize),
        (3, 48, 128, 256, 0),
        (2, 48, 128, 64, 20),
        (2, 16, 128, 1024, 9),
    ] {
        let (row, len) = (hv * n, t * hv * n);
        let mut o = random_vec(&mut r, len, 2.0);
        plant_max(&mut o, row, big * n, n);
        let z = random_vec(&mut r, len, 4.0);
        let w = random_vec(&mut r, n, 1.5);
        let s = GatedNormRotation {
            len,
            n,
            eps: 1e-6,
            block: rr,
        };
        let what = format!("gated norm t={t} R={rr}");
        let mut plain = vec![f32::NAN; len];
        emu_mixer::gated_rms_norm_hadamard(&s, (&o, &z, &w), &mut plain).unwrap();
        let mut out = vec![f32::NAN; len];
        let (st, p) =
            emu_mixer::gated_rms_norm_hadamard_prep(&s, (&o, &z, &w), &mut out, row).unwrap();
        assert_eq!(st.smem_max_degree, 1.0, "{what}: bank conflict");
        assert_bits(&what, &out, &plain);
        let (xh, e) = emu::pn_prepare_rows(&out, t, row).unwrap();
        assert_eq!(p.e, e, "{what}: exponents");
        assert!(p.xh == xh, "{what}: fp16 copy differs from pn_prepare_x_h2");
    }
    // Rows that are not whole spans are refused.
    let s = GatedNormRotation {
        len: 2048,
        n: 128,
        eps: 1e-6,
        block: 256,
    };
    let (o, mut out) = (vec![1.0f32; 2048], vec![0f32; 2048]);
    let e = emu_mixer::gated_rms_norm_hadamard_prep(&s, (&o, &o, &o), &mut out, 384).unwrap_err();
    assert!(e.to_string().contains("whole spans"), "{e}");
}

#[test]
fn attention_merge_writes_the_prepared_copy_of_its_rows() {
    let mut r = rng(92);
    // (tokens, heads, splits, R, big head): the 27B decode attention (24 heads of 256) at R 256
    // (a block per head), R 1024 (4 heads per block); 1 to 3 tokens.
    for (t, nh, ns, rr, big) in [
        (1usize, 24usize, 4usize, 256usize, 23usize),
        (3, 24, 2, 256, 0),
        (2, 24, 3, 1024, 13),
    ] {
        let rows = t * nh;
        let mut part_o = random_vec(&mut r, rows * ns * 256, 3.0);
        for tok in 0..t {
            let h = tok * nh + big;
            part_o[h * ns * 256..(h + 1) * ns * 256]
                .iter_mut()
                .for_each(|v| *v *= 50.0);
        }
        let mut part_ml = Vec::with_capacity(rows * ns * 2);
        for _ in 0..rows * ns {
            part_ml.push(r.random_range(-4.0f32..4.0));
            part_ml.push(r.random_range(0.5f32..20.0));
        }
        let p = AttnPartials {
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
        let what = format!("attention merge t={t} R={rr}");
        let mut plain = vec![f32::NAN; s.len];
        emu_mixer::attn_combine_gate_hadamard(&p, &s, g, &mut plain).unwrap();
        let mut out = vec![f32::NAN; s.len];
        let (st, pr) = emu_mixer::attn_combine_gate_hadamard_prep(&p, &s, g, &mut out).unwrap();
        assert_eq!(st.smem_max_degree, 1.0, "{what}: bank conflict");
        assert_bits(&what, &out, &plain);
        let (xh, e) = emu::pn_prepare_rows(&out, t, nh * 256).unwrap();
        assert_eq!(pr.e, e, "{what}: exponents");
        assert!(
            pr.xh == xh,
            "{what}: fp16 copy differs from pn_prepare_x_h2"
        );
    }
}
