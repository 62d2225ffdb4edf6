//! The norms (kernels/norm.cu), the rotations (kernels/hadamard.cu), the KV stores and the
//! split-K decode attention (kernels/attention.cu) run on the host by the SIMT emulator, with
//! the wrappers' block sizes, against f64 CPU references (the KV blocks against gguf-io's
//! quantizers), at the 27B shapes (hidden 5120, heads of 256 with GQA 6, GDN heads of 128) with
//! few rows; and no shared-memory bank conflict in any of them.
mod common;

use common::*;
use half::f16;
use pn_kernels::emu::{self, AttnCall, KvGeom, Norm, Rotation};

fn assert_rel(what: &str, got: &[f32], want: &[f64], tol: f64) {
    let scale = want.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let e = (*g as f64 - w).abs() / scale;
        assert!(
            e <= tol,
            "{what}: element {i}: got {g} want {w} (rel {e:.3e} > {tol:.1e})"
        );
    }
}

fn rms(row: &[f32], eps: f64) -> f64 {
    let ss: f64 = row.iter().map(|v| (*v as f64).powi(2)).sum();
    1.0 / (ss / row.len() as f64 + eps).sqrt()
}

fn silu(v: f64) -> f64 {
    v / (1.0 + (-v).exp())
}

#[test]
fn norms_equal_the_cpu_without_bank_conflicts() {
    let mut r = rng(41);
    // (n, rows, threads): the hidden state (1024 threads, as rms_norm's wrapper at 5120 uses
    // blocks of 256: both), q/k heads of 256, GDN heads of 128.
    for (n, rows, threads) in [
        (5120, 2, 256),
        (5120, 1, 1024),
        (256, 6, 256),
        (128, 4, 128),
    ] {
        let x = random_vec(&mut r, n * rows, 3.0);
        let w = random_vec(&mut r, n, 1.0);
        let z = random_vec(&mut r, n * rows, 2.0);
        let eps = 1e-6f32;
        let mut want_rms = vec![0f64; n * rows];
        let mut want_l2 = vec![0f64; n * rows];
        let mut want_g = vec![0f64; n * rows];
        for t in 0..rows {
            let row = &x[t * n..(t + 1) * n];
            let inv = rms(row, eps as f64);
            let norm = row.iter().map(|v| (*v as f64).powi(2)).sum::<f64>().sqrt();
            for i in 0..n {
                want_rms[t * n + i] = row[i] as f64 * inv * w[i] as f64;
                want_l2[t * n + i] = row[i] as f64 * 0.5 / norm.max(eps as f64);
                want_g[t * n + i] = row[i] as f64 * inv * w[i] as f64 * silu(z[t * n + i] as f64);
            }
        }
        for (kind, want, name) in [
            (Norm::Rms { w: Some(&w), eps }, &want_rms, "rms_norm"),
            (Norm::L2 { eps, scale: 0.5 }, &want_l2, "l2_norm"),
            (Norm::Gated { z: &z, w: &w, eps }, &want_g, "gated_rms_norm"),
        ] {
            let mut y = vec![f32::NAN; n * rows];
            let s = emu::norm(kind, &x, &mut y, n, threads).unwrap();
            let what = format!("{name} {rows}x{n} ({threads} threads)");
            assert_rel(&what, &y, want, 1e-5);
            assert_eq!(s.smem_max_degree, 1.0, "{what}: bank conflict");
            assert!(
                s.smem_instr > 0,
                "{what}: the reduction's shared accesses were counted"
            );
        }
    }
}

/// H_R x / sqrt(R) per chunk, in f64 (Sylvester order: H[i][j] = (-1)^popcount(i & j)).
fn hadamard_ref(x: &[f64], r: usize) -> Vec<f64> {
    let mut out = vec![0f64; x.len()];
    for (c, chunk) in x.chunks(r).enumerate() {
        for i in 0..r {
            let s: f64 = (0..r)
                .map(|j| {
                    if (i & j).count_ones() % 2 == 0 {
                        chunk[j]
                    } else {
                        -chunk[j]
                    }
                })
                .sum();
            out[c * r + i] = s / (r as f64).sqrt();
        }
    }
    out
}

#[test]
fn rotations_equal_the_cpu_without_bank_conflicts() {
    let mut r = rng(43);
    let (n, eps) = (5120, 1e-6f32);
    let x = random_vec(&mut r, 2 * n, 3.0);
    let w = random_vec(&mut r, n, 1.0);
    for rr in [64, 256] {
        // rms_norm_hadamard_f32: 256 threads per row (the wrapper's block).
        let mut y = vec![f32::NAN; 2 * n];
        let s = emu::hadamard(Rotation::RmsNorm { w: &w, n, eps }, &x, &mut y, rr, 256).unwrap();
        let mut normed = Vec::new();
        for row in x.chunks(n) {
            let inv = rms(row, eps as f64);
            normed.extend(row.iter().zip(&w).map(|(v, w)| *v as f64 * inv * *w as f64));
        }
        let what = format!("rms_norm_hadamard R={rr}");
        assert_rel(&what, &y, &hadamard_ref(&normed, rr), 1e-5);
        assert_eq!(
            s.smem_max_degree, 1.0,
            "{what}: bank conflict ({} of {})",
            s.smem_bad_instr, s.smem_instr
        );
        // swiglu_hadamard_f32 and hadamard_f32: R/2 threads (at least 32) per chunk.
        let gate = random_vec(&mut r, 4 * rr, 2.0);
        let up = random_vec(&mut r, 4 * rr, 2.0);
        let threads = (rr as u32 / 2).clamp(32, 512);
        let mut y = vec![f32::NAN; 4 * rr];
        let s = emu::hadamard(Rotation::Swiglu { up: &up }, &gate, &mut y, rr, threads).unwrap();
        let h: Vec<f64> = gate
            .iter()
            .zip(&up)
            .map(|(g, u)| silu(*g as f64) * *u as f64)
            .collect();
        assert_rel(
            &format!("swiglu_hadamard R={rr}"),
            &y,
            &hadamard_ref(&h, rr),
            1e-5,
        );
        assert_eq!(
            s.smem_max_degree, 1.0,
            "swiglu_hadamard R={rr}: bank conflict"
        );
        let mut y = vec![f32::NAN; 4 * rr];
        let s = emu::hadamard(Rotation::Plain, &gate, &mut y, rr, threads).unwrap();
        let g64: Vec<f64> = gate.iter().map(|v| *v as f64).collect();
        assert_rel(
            &format!("hadamard R={rr}"),
            &y,
            &hadamard_ref(&g64, rr),
            1e-5,
        );
        assert_eq!(s.smem_max_degree, 1.0, "hadamard R={rr}: bank conflict");
    }
}

/// The cache row (256 values) of kv head `g` at position `j` as f32, decoded by the CPU.
fn cache_row(geom: &KvGeom, c: &[u8], j: usize, g: usize) -> Vec<f32> {
    let elem = match geom.kv_type {
        0 => 4,
        1 => 2,
        _ => 1,
    };
    let off = elem * (j * geom.pos_stride + g * geom.head_stride);
    match geom.kv_type {
        0 => c[off..off + 1024]
            .chunks(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect(),
        1 => c[off..off + 512]
            .chunks(2)
            .map(|b| f16::from_le_bytes(b.try_into().unwrap()).to_f32())
            .collect(),
        2 => {
            let mut out = vec![0f32; 256];
            gguf_io::quants::dequantize_row(gguf_io::GgmlType::Q8_0, &c[off..off + 272], &mut out)
                .unwrap();
            out
        }
        _ => {
            let mut out = Vec::new();
            for b in c[off..off + 144].chunks(18) {
                let blk = gguf_io::kv_blocks::BlockQ4_0 {
                    d: f16::from_bits(u16::from_le_bytes([b[0], b[1]])),
                    qs: b[2..].try_into().unwrap(),
                };
                let mut v = [0f32; 32];
                blk.dequantize(&mut v);
                out.extend(v);
            }
            out
        }
    }
}

/// What the CPU writes for one 256-value row.
fn cpu_store(kv_type: i32, row: &[f32]) -> Vec<u8> {
    match kv_type {
        0 => row.iter().flat_map(|v| v.to_le_bytes()).collect(),
        1 => row
            .iter()
            .flat_map(|v| f16::from_f32(*v).to_le_bytes())
            .collect(),
        2 => {
            let mut out = Vec::new();
            gguf_io::quants::quantize_row(gguf_io::GgmlType::Q8_0, row, &mut out).unwrap();
            out
        }
        _ => row
            .chunks(32)
            .flat_map(|c| {
                let b = gguf_io::kv_blocks::BlockQ4_0::quantize(c);
                let mut o = b.d.to_bits().to_le_bytes().to_vec();
                o.extend(b.qs);
                o
            })
            .collect(),
    }
}

#[test]
fn kv_store_and_split_k_attention_equal_the_cpu_without_bank_conflicts() {
    let mut r = rng(47);
    // 27B attention: 24 q heads of 256 over 4 kv heads (GQA 6); here 12 over 2, 37 positions.
    let (n_head, n_kv, ctx) = (12, 2, 37);
    let group = n_head / n_kv;
    for kv_type in 0..4 {
        let row_elems = match kv_type {
            0 | 1 => 256,
            2 => 272,
            _ => 144,
        };
        // Token-major [pos][kv head][row] (the CPU backend's layout).
        let geom = KvGeom {
            kv_type,
            pos_stride: n_kv * row_elems,
            head_stride: row_elems,
            n_kv,
        };
        let bytes = geom.bytes(ctx);
        let (mut kc, mut vc) = (vec![0u8; bytes], vec![0u8; bytes]);
        let k = random_vec(&mut r, ctx * n_kv * 256, 1.5);
        let v = random_vec(&mut r, ctx * n_kv * 256, 1.5);
        // All positions but the last in one prefill-like store, then the decode token's row.
        let split = (ctx - 1) * n_kv * 256;
        emu::kv_store(&geom, &k[..split], &v[..split], &mut kc, &mut vc, 0).unwrap();
        emu::kv_store(&geom, &k[split..], &v[split..], &mut kc, &mut vc, ctx - 1).unwrap();
        let elem = if kv_type == 0 {
            4
        } else if kv_type == 1 {
            2
        } else {
            1
        };
        for j in 0..ctx {
            for g in 0..n_kv {
                let src = (j * n_kv + g) * 256;
                let off = elem * (j * geom.pos_stride + g * geom.head_stride);
                let len = cpu_store(kv_type, &k[src..src + 256]).len();
                assert_eq!(
                    &kc[off..off + len],
                    &cpu_store(kv_type, &k[src..src + 256])[..],
                    "kv_store type {kv_type} K pos {j} head {g}"
                );
                assert_eq!(
                    &vc[off..off + len],
                    &cpu_store(kv_type, &v[src..src + 256])[..],
                    "kv_store type {kv_type} V pos {j} head {g}"
                );
            }
        }
        // Decode: one query token at position ctx - 1, 3 splits of 16 positions.
        let q = random_vec(&mut r, n_head * 256, 1.0);
        let scale = 1.0 / 16.0;
        let call = AttnCall {
            n_head,
            group,
            p0: ctx - 1,
            t: 1,
            n_split: 3,
            chunk: 16,
            scale,
            kv: geom,
        };
        let mut o = vec![f32::NAN; n_head * 256];
        let s = emu::attention(&call, &q, &kc, &vc, &mut o).unwrap();
        let mut want = vec![0f64; n_head * 256];
        for h in 0..n_head {
            let g = h / group;
            let qh = &q[h * 256..(h + 1) * 256];
            let scores: Vec<f64> = (0..ctx)
                .map(|j| {
                    cache_row(&geom, &kc, j, g)
                        .iter()
                        .zip(qh)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>()
                        * scale as f64
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::MIN, f64::max);
            let p: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let l: f64 = p.iter().sum();
            for (j, pj) in p.iter().enumerate() {
                for (d, vd) in cache_row(&geom, &vc, j, g).iter().enumerate() {
                    want[h * 256 + d] += pj / l * *vd as f64;
                }
            }
        }
        assert_rel(&format!("attention kv type {kv_type}"), &o, &want, 1e-5);
        assert_eq!(
            s.smem_max_degree, 1.0,
            "attention kv type {kv_type}: bank conflict ({} of {})",
            s.smem_bad_instr, s.smem_instr
        );
    }
}
