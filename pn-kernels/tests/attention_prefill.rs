//! The tiled prefill attention kernel (`kernels/attention_prefill.cu`).
//!
//! Host tests: the kernel's own source run by the SIMT emulator (`host/simt_emu.h`: every block
//! and thread, its barriers and shuffles) on small shapes, against an f64 reference attention
//! over the values the cache holds (f32, f16, q8_0 and q4_0 caches; token- and head-major
//! layouts; prompts starting at position 0 and continuing a cache).
//!
//! GPU tests (`#[ignore]`d; `cargo test -p pn-kernels --test attention_prefill -- --ignored
//! --nocapture`; without a device they print why and pass): the kernel against the split-K
//! kernels and the f64 reference on 512 / 2048-token prompts, and a 4096-token bench line.

mod common;

use common::{random_vec, rng};
use half::f16;
use pn_kernels::host_shim::safe as shim;
use rand::rngs::StdRng;

const D: usize = 256;

/// Bound on max |got - want| (outputs are averages of values in [-1, 1]). fp32 dots of 256 terms
/// and the online softmax's rescaling measure up to about 3e-6 against f64 here (peaked softmax,
/// |q| 8); one dropped or doubled key of a 100-key prefix moves an output by about 1e-2 (an
/// off-by-one causal mask measures about 1).
const TOL: f64 = 2e-5;

/// Cache element type of a case.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kv {
    F32,
    F16,
    Q8,
    Q4,
}

/// Cache layout of a case.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Layout {
    /// `[cap][n_kv][row]` (the runtime's).
    TokenMajor,
    /// `[n_kv][cap][row]`.
    HeadMajor,
}

/// One attention problem: queries (head stride 512, as the gated q projection interleaves q
/// and gate), the cache as stored, and the f32 values it decodes to (`vals_*[pos][kv][d]`).
struct Case {
    n_head: usize,
    n_kv: usize,
    p0: usize,
    n: usize,
    cap: usize,
    q: Vec<f32>,
    vals_k: Vec<f32>,
    vals_v: Vec<f32>,
    k32: Vec<f32>,
    v32: Vec<f32>,
    k16: Vec<u16>,
    v16: Vec<u16>,
    kq: Vec<u8>,
    vq: Vec<u8>,
    kv: Kv,
    layout: Layout,
    scale: f32,
}

impl Case {
    fn q_tok_stride(&self) -> usize {
        self.n_head * 2 * D
    }
    fn row_elems(&self) -> usize {
        match self.kv {
            Kv::F32 | Kv::F16 => D,
            Kv::Q8 => 272,
            Kv::Q4 => 144,
        }
    }
    /// (pos_stride, head_stride) in cache elements.
    fn strides(&self) -> (usize, usize) {
        let row = self.row_elems();
        match self.layout {
            Layout::TokenMajor => (self.n_kv * row, row),
            Layout::HeadMajor => (row, self.cap * row),
        }
    }
}

/// A row of 256 values as q8_0 (d = amax / 127 stored as f16, q = round(x / d)) and the values
/// it decodes to.
fn q8_row(x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let mut b = Vec::with_capacity(272);
    let mut dec = Vec::with_capacity(D);
    for blk in x.chunks(32) {
        let amax = blk.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let d = f16::from_f32(amax / 127.0);
        let df = d.to_f32();
        b.extend_from_slice(&d.to_bits().to_le_bytes());
        for &v in blk {
            let q = if df == 0.0 {
                0
            } else {
                (v / df).round().clamp(-127.0, 127.0) as i8
            };
            b.push(q as u8);
            dec.push(df * q as f32);
        }
    }
    (b, dec)
}

/// A row of 256 values as the CPU's q4_0 KV blocks (the kernels' quantizer, via the shim) and
/// the values it decodes to (d * (nibble - 8); byte i holds values i and i + 16).
fn q4_row(x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let mut b = Vec::with_capacity(144);
    let mut dec = vec![0.0f32; D];
    for (j, blk) in x.chunks(32).enumerate() {
        let bytes = shim::q4_0_kv_quantize(blk.try_into().expect("32 values"));
        let d = f16::from_bits(u16::from_le_bytes([bytes[0], bytes[1]])).to_f32();
        for i in 0..16 {
            let by = bytes[2 + i];
            dec[32 * j + i] = d * ((by & 15) as f32 - 8.0);
            dec[32 * j + i + 16] = d * ((by >> 4) as f32 - 8.0);
        }
        b.extend_from_slice(&bytes);
    }
    (b, dec)
}

/// A random case of `(n_head, n_kv, p0, n)`: `n` queries from position `p0`.
fn case(
    r: &mut StdRng,
    dims: (usize, usize, usize, usize),
    kv: Kv,
    layout: Layout,
    q_amp: f32,
) -> Case {
    let (n_head, n_kv, p0, n) = dims;
    let cap = p0 + n + 3;
    let mut c = Case {
        n_head,
        n_kv,
        p0,
        n,
        cap,
        q: random_vec(r, n * n_head * 2 * D, q_amp),
        vals_k: vec![0.0; cap * n_kv * D],
        vals_v: vec![0.0; cap * n_kv * D],
        k32: Vec::new(),
        v32: Vec::new(),
        k16: Vec::new(),
        v16: Vec::new(),
        kq: Vec::new(),
        vq: Vec::new(),
        kv,
        layout,
        scale: 1.0 / (D as f32).sqrt(),
    };
    let (ps, hs) = c.strides();
    let len = (cap - 1) * ps + (n_kv - 1) * hs + c.row_elems();
    match kv {
        Kv::F32 => (c.k32, c.v32) = (vec![0.0; len], vec![0.0; len]),
        Kv::F16 => (c.k16, c.v16) = (vec![0; len], vec![0; len]),
        Kv::Q8 | Kv::Q4 => (c.kq, c.vq) = (vec![0; len], vec![0; len]),
    }
    // Positions past p0 + n stay zero: the kernel must not read them into any output.
    for pos in 0..p0 + n {
        for g in 0..n_kv {
            let at = pos * ps + g * hs;
            let vi = (pos * n_kv + g) * D;
            for (is_v, x) in [
                (false, random_vec(r, D, 1.0)),
                (true, random_vec(r, D, 1.0)),
            ] {
                let dec: Vec<f32> = match kv {
                    Kv::F32 => {
                        let dst = if is_v { &mut c.v32 } else { &mut c.k32 };
                        dst[at..at + D].copy_from_slice(&x);
                        x.clone()
                    }
                    Kv::F16 => {
                        let dst = if is_v { &mut c.v16 } else { &mut c.k16 };
                        for (o, v) in dst[at..at + D].iter_mut().zip(&x) {
                            *o = f16::from_f32(*v).to_bits();
                        }
                        x.iter().map(|v| f16::from_f32(*v).to_f32()).collect()
                    }
                    Kv::Q8 | Kv::Q4 => {
                        let (bytes, dec) = if kv == Kv::Q8 { q8_row(&x) } else { q4_row(&x) };
                        let dst = if is_v { &mut c.vq } else { &mut c.kq };
                        dst[at..at + bytes.len()].copy_from_slice(&bytes);
                        dec
                    }
                };
                let vals = if is_v { &mut c.vals_v } else { &mut c.vals_k };
                vals[vi..vi + D].copy_from_slice(&dec);
            }
        }
    }
    c
}

/// Causal GQA attention in f64 over the decoded cache values: `out[t][h][d]`.
fn reference(c: &Case) -> Vec<f64> {
    let (nh, nk, group) = (c.n_head, c.n_kv, c.n_head / c.n_kv);
    let mut out = vec![0.0f64; c.n * nh * D];
    for t in 0..c.n {
        let n_ctx = c.p0 + t + 1;
        for h in 0..nh {
            let g = h / group;
            let q = &c.q[t * c.q_tok_stride() + h * 2 * D..][..D];
            let sc: Vec<f64> = (0..n_ctx)
                .map(|j| {
                    let k = &c.vals_k[(j * nk + g) * D..][..D];
                    q.iter()
                        .zip(k)
                        .map(|(a, b)| (*a as f64 * c.scale as f64) * *b as f64)
                        .sum()
                })
                .collect();
            let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = sc.iter().map(|s| (s - m).exp()).collect();
            let l: f64 = w.iter().sum();
            let o = &mut out[(t * nh + h) * D..][..D];
            for (j, wj) in w.iter().enumerate() {
                let v = &c.vals_v[(j * nk + g) * D..][..D];
                for (od, vd) in o.iter_mut().zip(v) {
                    *od += wj / l * *vd as f64;
                }
            }
        }
    }
    out
}

fn max_err(got: &[f32], want: &[f64]) -> f64 {
    got.iter()
        .zip(want)
        .map(|(g, w)| (*g as f64 - w).abs())
        .fold(0.0, f64::max)
}

fn emulate(c: &Case) -> Vec<f32> {
    let (ps, hs) = c.strides();
    let sh = shim::EmuAttnShape {
        q_tok_stride: c.q_tok_stride(),
        q_head_stride: 2 * D,
        pos_stride: ps,
        head_stride: hs,
        n_head: c.n_head,
        n_kv: c.n_kv,
        p0: c.p0,
        n_tokens: c.n,
        scale: c.scale,
        o_tok_stride: c.n_head * D,
    };
    let (k, v) = match c.kv {
        Kv::F32 => (shim::EmuKv::F32(&c.k32), shim::EmuKv::F32(&c.v32)),
        Kv::F16 => (shim::EmuKv::F16(&c.k16), shim::EmuKv::F16(&c.v16)),
        Kv::Q8 => (shim::EmuKv::Q8(&c.kq), shim::EmuKv::Q8(&c.vq)),
        Kv::Q4 => (shim::EmuKv::Q4(&c.kq), shim::EmuKv::Q4(&c.vq)),
    };
    // NaN-filled: every output the kernel owns must be written.
    let mut o = vec![f32::NAN; c.n * c.n_head * D];
    assert!(
        shim::emu_attn_prefill(&c.q, k, v, &sh, &mut o),
        "emulated kernel deadlocked"
    );
    o
}

fn check_emulated(kv: Kv, layout: Layout, shapes: &[(usize, usize, usize, usize)], seed: u64) {
    let mut r = rng(seed);
    for &(n_head, n_kv, p0, n) in shapes {
        for q_amp in [1.0f32, 8.0] {
            let c = case(&mut r, (n_head, n_kv, p0, n), kv, layout, q_amp);
            let got = emulate(&c);
            let want = reference(&c);
            let e = max_err(&got, &want);
            let what = format!("{kv:?} {layout:?} heads {n_head}/{n_kv} p0 {p0} n {n} |q| {q_amp}");
            eprintln!("{what}: max abs error {e:.2e}");
            assert!(e <= TOL, "{what}: max abs error {e:.3e} > {TOL:.1e}");
        }
    }
}

/// Token counts around the 16-token query tile and the 16-position key tile (1, 15, 16, 17, a
/// 70-token prompt with a ragged last tile), from position 0 and continuing a cache.
const SHAPES: [(usize, usize, usize, usize); 7] = [
    (2, 1, 0, 1),
    (3, 1, 0, 15),
    (4, 2, 0, 16),
    (4, 2, 5, 17),
    (6, 2, 0, 70),
    (6, 2, 37, 70),
    (3, 3, 100, 1),
];

#[test]
fn emulated_prefill_f32_cache_matches_reference() {
    check_emulated(Kv::F32, Layout::TokenMajor, &SHAPES, 71);
}

#[test]
fn emulated_prefill_f16_cache_matches_reference() {
    check_emulated(Kv::F16, Layout::TokenMajor, &SHAPES, 72);
}

#[test]
fn emulated_prefill_head_major_cache_matches_reference() {
    check_emulated(Kv::F16, Layout::HeadMajor, &SHAPES[2..5], 73);
    check_emulated(Kv::F32, Layout::HeadMajor, &SHAPES[3..4], 74);
}

#[test]
fn emulated_prefill_q8_0_and_q4_0_caches_match_reference() {
    check_emulated(Kv::Q8, Layout::TokenMajor, &SHAPES[3..6], 75);
    check_emulated(Kv::Q4, Layout::TokenMajor, &SHAPES[3..6], 76);
}

#[cfg(feature = "cuda")]
mod gpu {
    use super::*;
    use pn_kernels::cudarc::driver::{CudaSlice, CudaStream, DeviceRepr};
    use pn_kernels::{AttnShape, Gpu, KvElem, KvLayout, SplitK};
    use std::sync::Arc;
    use std::time::Instant;

    fn gpu() -> Option<Gpu> {
        match pn_kernels::gpu_or_reason(0) {
            Ok(g) => Some(g),
            Err(why) => {
                eprintln!("SKIPPED (no GPU): {why}");
                None
            }
        }
    }

    fn up<T: DeviceRepr>(s: &Arc<CudaStream>, v: &[T]) -> CudaSlice<T> {
        s.clone_htod(v).expect("upload")
    }

    /// Output of the tiled kernel (`split` None) or of the split-K kernels in `split`-position
    /// chunks over the case's cache.
    fn run<T: KvElem>(
        g: &Gpu,
        c: &Case,
        kc: &CudaSlice<T>,
        vc: &CudaSlice<T>,
        split: Option<usize>,
    ) -> Vec<f32> {
        let s = g.stream().clone();
        let q = up(&s, &c.q);
        let mut o = s.alloc_zeros::<f32>(c.n * c.n_head * D).expect("alloc");
        launch(g, c, &q, (kc, vc), &mut o, split);
        s.clone_dtoh(&o).expect("download")
    }

    /// The tiled kernel (`split` None) or split-K in `split`-position chunks, into `o`.
    fn launch<T: KvElem>(
        g: &Gpu,
        c: &Case,
        q: &CudaSlice<f32>,
        (kc, vc): (&CudaSlice<T>, &CudaSlice<T>),
        o: &mut CudaSlice<f32>,
        split: Option<usize>,
    ) {
        let kl = KvLayout::token_major::<T>(c.n_kv, c.cap);
        let (qv, kv, vv) = (q.as_view(), kc.as_view(), vc.as_view());
        let mut ov = o.as_view_mut();
        let sh = AttnShape {
            kv: kl,
            n_head: c.n_head,
            p0: c.p0,
            t_len: c.n,
            scale: c.scale,
            q_tok_stride: c.q_tok_stride(),
            q_head_stride: 2 * D,
            o_tok_stride: c.n_head * D,
        };
        match split {
            None => g
                .attention_prefill(&sh, &qv, &kv, &vv, &mut ov)
                .expect("tiled launch"),
            Some(chunk) => {
                let n_split = (c.p0 + c.n).div_ceil(chunk);
                let need = Gpu::attention_scratch_len(c.n, c.n_head, n_split);
                let mut scr = g.stream().alloc_zeros::<f32>(need).expect("alloc");
                let split = SplitK {
                    chunk,
                    scratch: &mut scr.as_view_mut(),
                };
                g.attention(&sh, &qv, &kv, &vv, &mut ov, split)
                    .expect("split-K launch");
            }
        }
    }

    fn f16s(bits: &[u16]) -> Vec<f16> {
        bits.iter().map(|b| f16::from_bits(*b)).collect()
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn tiled_kernel_matches_split_k_and_reference() {
        let Some(g) = gpu() else { return };
        let s = g.stream().clone();
        let mut r = rng(81);
        for (kv, p0, n) in [(Kv::F16, 0, 512), (Kv::F32, 300, 512), (Kv::F16, 77, 2048)] {
            // 24 query heads over 4 kv heads (the 27B model's grouping).
            let c = case(&mut r, (24, 4, p0, n), kv, Layout::TokenMajor, 4.0);
            let (tiled, split) = if kv == Kv::F16 {
                let (kc, vc) = (up(&s, &f16s(&c.k16)), up(&s, &f16s(&c.v16)));
                (
                    run(&g, &c, &kc, &vc, None),
                    run(&g, &c, &kc, &vc, Some(256)),
                )
            } else {
                let (kc, vc) = (up(&s, &c.k32), up(&s, &c.v32));
                (
                    run(&g, &c, &kc, &vc, None),
                    run(&g, &c, &kc, &vc, Some(256)),
                )
            };
            let want = reference(&c);
            let split64: Vec<f64> = split.iter().map(|v| *v as f64).collect();
            let (et, es, ets) = (
                max_err(&tiled, &want),
                max_err(&split, &want),
                max_err(&tiled, &split64),
            );
            let what = format!("{kv:?} p0 {p0} n {n}");
            eprintln!("{what}: tiled/ref {et:.2e} split-K/ref {es:.2e} tiled/split-K {ets:.2e}");
            // Device FMA contraction and longer sums than the host cases: 1e-4.
            assert!(et <= 1e-4 && es <= 1e-4 && ets <= 1e-4, "{what}");
        }
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn tiled_kernel_prefill_bench() {
        let Some(g) = gpu() else { return };
        let s = g.stream().clone();
        let mut r = rng(82);
        // One full-attention layer of the 27B model: 24 query heads, 4 kv heads, f16 cache,
        // a 4096-token prompt.
        let n = 4096;
        let c = case(&mut r, (24, 4, 0, n), Kv::F16, Layout::TokenMajor, 1.0);
        let (kc, vc) = (up(&s, &f16s(&c.k16)), up(&s, &f16s(&c.v16)));
        let q = up(&s, &c.q);
        let mut o = s.alloc_zeros::<f32>(n * c.n_head * D).expect("alloc");
        let mut outs = Vec::new();
        // Split-K with one split per query (the runtime's choice once its scratch bound caps
        // the splits of a long prefill chunk) and with its 256-position splits.
        for split in [None, Some(n), Some(256)] {
            launch(&g, &c, &q, (&kc, &vc), &mut o, split);
            s.synchronize().expect("sync");
            let reps = 3;
            let t0 = Instant::now();
            for _ in 0..reps {
                launch(&g, &c, &q, (&kc, &vc), &mut o, split);
            }
            s.synchronize().expect("sync");
            let ms = t0.elapsed().as_secs_f64() * 1e3 / reps as f64;
            let name = match split {
                None => "tiled".to_string(),
                Some(chunk) => format!("split-K chunk {chunk}"),
            };
            eprintln!("attention prefill {name}: {n} tokens x 24 heads in {ms:.2} ms");
            outs.push(s.clone_dtoh(&o).expect("download"));
        }
        let split64: Vec<f64> = outs[1].iter().map(|v| *v as f64).collect();
        let e = max_err(&outs[0], &split64);
        eprintln!("bench: tiled vs split-K max abs {e:.2e}");
        assert!(e <= 1e-4);
    }
}
