//! The chunked gated delta rule (`pn-kernels/kernels/delta_rule_chunked.cu` / `.cuh`) against
//! qwen-model's CPU delta rule: a cross-crate test.
//!
//! Host tests: the header's gate math, triangular solve and whole-chunk algorithm (compiled as
//! host C++ into the test shim) against qwen-model's CPU delta rule: the sequential recurrence
//! (the oracle) and the CPU's chunked form.
//!
//! GPU tests (`#[ignore]`d; `cargo test -p pn-tests --test delta_rule_chunked -- --ignored
//! --nocapture`; without a device they print why and pass): the kernel against the sequential
//! kernel and the CPU recurrence on random and adversarial inputs, and a prefill bench line.

use pn_kernels::host_shim::safe as shim;
use pn_kernels::{DeltaRuleInputs, DeltaRuleShape};
use pn_tests::{random_vec, rng};
use qwen_model::cpu::kernels::{
    gdn_chunk_scratch_len, gdn_chunked_heads, gdn_gates, gdn_recurrent_heads, sigmoid, softplus,
    GdnRows,
};
use qwen_model::GdnDims;
use rand::rngs::StdRng;
use rand::Rng;

const D: usize = 128;

/// Bound on max |got - want| / max |want|, outputs and final state. The CPU's own chunked vs
/// recurrent test allows 1e-4 absolute on unit-scale data; here the bound is relative to each
/// array's magnitude, so small outputs (q carries 1/sqrt(128)) and grown states (large keys) are
/// held to the same standard.
const TOL: f32 = 1e-4;

/// The host run of the header's algorithm (no FMA contraction, serial sums) measures about 1e-6
/// against the CPU recurrence on every case here; 2e-5 keeps margin while still catching a
/// single dropped term of a chunk.
const TOL_HOST: f32 = 2e-5;

/// Input regime of a case.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Regime {
    /// Gates and values spread over their usual ranges, L2-normalised keys.
    Random,
    /// Decay ~ e^-50 every token (the state is forgotten at once), beta random.
    DecayNearZero,
    /// Decay ~ 1 - 1e-9 and beta ~ 1: nothing is forgotten, every write is full strength.
    DecayNearOne,
    /// Keys of norm 4 (not normalised) with beta ~ 0.02, so beta * |k|^2 stays below 2 (stable).
    LargeKeys,
}

const REGIMES: [Regime; 4] = [
    Regime::Random,
    Regime::DecayNearZero,
    Regime::DecayNearOne,
    Regime::LargeKeys,
];

/// One delta-rule problem in the CPU backend's layout: `y` rows of q | k | v per token, raw
/// `b` / `alpha` per token and value head, `a = ssm_a`, `dt_bias`, the starting state.
struct Case {
    dims: GdnDims,
    n: usize,
    y: Vec<f32>,
    b: Vec<f32>,
    alpha: Vec<f32>,
    a: Vec<f32>,
    dt_bias: Vec<f32>,
    s0: Vec<f32>,
}

fn normalise(v: &mut [f32], norm: f32) {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-20);
    v.iter_mut().for_each(|x| *x *= norm / n);
}

fn case(r: &mut StdRng, n_k: usize, n_v: usize, n: usize, regime: Regime) -> Case {
    let dims = GdnDims {
        n_k_heads: n_k,
        n_v_heads: n_v,
        dk: D,
        dv: D,
        conv_kernel: 4,
    };
    let cd = dims.conv_dim();
    let kd = n_k * D;
    let mut y = random_vec(r, n * cd, 1.0);
    let k_norm = if regime == Regime::LargeKeys {
        4.0
    } else {
        1.0
    };
    for row in y.chunks_exact_mut(cd) {
        for (h, head) in row[..2 * kd].chunks_exact_mut(D).enumerate() {
            // q carries the 1/sqrt(dk) scale, as the backend leaves it.
            normalise(
                head,
                if h < n_k {
                    1.0 / (D as f32).sqrt()
                } else {
                    k_norm
                },
            );
        }
    }
    let nb = n * n_v;
    let (b, alpha) = match regime {
        Regime::Random => (random_vec(r, nb, 3.0), random_vec(r, nb, 3.0)),
        Regime::DecayNearZero => (
            random_vec(r, nb, 3.0),
            (0..nb).map(|_| r.random_range(24.0..26.0)).collect(),
        ),
        Regime::DecayNearOne => (
            (0..nb).map(|_| r.random_range(9.0..11.0)).collect(),
            (0..nb).map(|_| r.random_range(-21.0..-19.0)).collect(),
        ),
        Regime::LargeKeys => (
            (0..nb).map(|_| r.random_range(-4.5..-3.5)).collect(),
            random_vec(r, nb, 3.0),
        ),
    };
    let a = (0..n_v)
        .map(|_| match regime {
            Regime::DecayNearZero => -2.0,
            _ => -r.random_range(0.1f32..2.0),
        })
        .collect();
    let dt_bias = random_vec(r, n_v, 1.0);
    let s0 = random_vec(r, dims.state_len(), 0.5);
    Case {
        dims,
        n,
        y,
        b,
        alpha,
        a,
        dt_bias,
        s0,
    }
}

/// (outputs, final state) of the CPU backend's delta rule, recurrent or chunked form.
fn cpu(c: &Case, chunked: bool) -> (Vec<f32>, Vec<f32>) {
    let d = &c.dims;
    let (mut beta, mut g) = (c.b.clone(), c.alpha.clone());
    gdn_gates(&mut beta, &mut g, &c.a, &c.dt_bias, d.n_v_heads);
    let mut state = c.s0.clone();
    let mut out = vec![0f32; c.n * d.value_dim()];
    let rows = GdnRows {
        y: &c.y,
        beta: &beta,
        g: &g,
        dims: d,
        n_tokens: c.n,
    };
    // SAFETY: state and out have the sizes the functions require; one thread owns every head.
    unsafe {
        if chunked {
            let mut scratch = vec![0f32; gdn_chunk_scratch_len(d)];
            gdn_chunked_heads(
                &rows,
                state.as_mut_ptr(),
                out.as_mut_ptr(),
                0..d.n_v_heads,
                &mut scratch,
            );
        } else {
            gdn_recurrent_heads(&rows, state.as_mut_ptr(), out.as_mut_ptr(), 0..d.n_v_heads);
        }
    }
    (out, state)
}

/// The kernels' strides and sizes for a case: q, k and v inside one conv-output row per token,
/// one raw beta/alpha per value head per token, value-dim output rows.
fn shape(c: &Case) -> DeltaRuleShape {
    let d = &c.dims;
    DeltaRuleShape {
        qk_stride: d.conv_dim(),
        v_stride: d.conv_dim(),
        ab_stride: d.n_v_heads,
        out_stride: d.value_dim(),
        n_v_heads: d.n_v_heads,
        n_k_heads: d.n_k_heads,
        t_len: c.n,
    }
}

/// (outputs, final state) of the header's chunked algorithm run on the host, head by head.
fn host_chunked(c: &Case) -> (Vec<f32>, Vec<f32>) {
    let d = &c.dims;
    let (kd, nv) = (d.n_k_heads * D, d.n_v_heads);
    let mut state = c.s0.clone();
    let mut out = vec![0f32; c.n * d.value_dim()];
    for p in 0..nv {
        let kh = p % d.n_k_heads;
        let x = DeltaRuleInputs {
            q: &c.y[kh * D..],
            k: &c.y[kd + kh * D..],
            v: &c.y[2 * kd + p * D..],
            beta_raw: &c.b[p..],
            alpha_raw: &c.alpha[p..],
            dt_bias: &c.dt_bias[p..=p],
            ssm_a: &c.a[p..=p],
        };
        let sh = DeltaRuleShape {
            n_v_heads: 1,
            n_k_heads: 1,
            ..shape(c)
        };
        shim::gdn_chunked_head(
            &x,
            &sh,
            &mut state[p * D * D..(p + 1) * D * D],
            &mut out[p * D..],
        );
    }
    (out, state)
}

/// max |got - want| / max |want| (the error relative to the array's magnitude); asserts it is
/// <= `tol` (NaN fails).
fn check(what: &str, got: &[f32], want: &[f32], tol: f32) -> f32 {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(f32::MIN_POSITIVE, |m, x| m.max(x.abs()));
    let mut worst = 0f32;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let e = (g - w).abs() / scale;
        assert!(
            e <= tol,
            "{what}: element {i}: got {g} want {w} (scaled error {e:.3e} > {tol:.1e})"
        );
        worst = worst.max(e);
    }
    worst
}

/// Token counts around the kernel's chunk (C) and the CPU's (64): single token, both sides of
/// each boundary, and several chunks with a tail.
fn lengths() -> Vec<usize> {
    let c = pn_kernels::DELTA_RULE_CHUNK;
    vec![1, c - 1, c, c + 1, 63, 65, 5 * c + 7]
}

#[test]
fn chunk_size_agrees_with_header() {
    assert_eq!(shim::gdn_chunk(), pn_kernels::DELTA_RULE_CHUNK);
}

#[test]
fn triangle_index_is_exact() {
    // Every pair (t, s <= t) of a chunk and far beyond (the float root's guess must be fixed up).
    let mut idx = 0;
    for t in 0..2000 {
        for s in 0..=t {
            assert_eq!(shim::gdn_tri_row(idx), t, "entry {idx} = ({t}, {s})");
            idx += 1;
        }
    }
}

#[test]
fn gate_matches_cpu_bit_for_bit() {
    let mut r = rng(61);
    let mut pts: Vec<(f32, f32, f32, f32)> = (0..2000)
        .map(|_| {
            (
                r.random_range(-30.0..30.0),
                r.random_range(-40.0..40.0),
                r.random_range(-2.0..2.0),
                -r.random_range(0.01f32..8.0),
            )
        })
        .collect();
    // The softplus branch point (al + dt_bias = 20 exactly and just either side) and zeros.
    pts.extend([
        (0.0, 20.0, 0.0, -1.0),
        (0.0, 19.999998, 0.0, -1.0),
        (0.0, 20.000002, 0.0, -1.0),
        (0.0, 0.0, 0.0, -1.0),
        (-100.0, -100.0, 0.0, -0.5),
    ]);
    for (b, al, dtb, a) in pts {
        let (beta, g) = shim::gdn_gate(b, al, dtb, a);
        let (mut wb, mut wg) = ([b], [al]);
        gdn_gates(&mut wb, &mut wg, &[a], &[dtb], 1);
        assert_eq!(beta.to_bits(), wb[0].to_bits(), "beta of b={b}");
        assert_eq!(beta.to_bits(), sigmoid(b).to_bits());
        assert_eq!(g.to_bits(), wg[0].to_bits(), "g of al={al} dt={dtb} a={a}");
        assert_eq!(g.to_bits(), (softplus(al + dtb) * a).to_bits());
        assert!(g <= 0.0, "a < 0 gives a decay <= 1");
    }
}

#[test]
fn solve_matches_f64_forward_substitution() {
    let c_max = shim::gdn_chunk();
    let ld = c_max + 1;
    let mut r = rng(62);
    for c in [1usize, 2, 7, c_max - 1, c_max] {
        // kk coefficients as the kernel builds them: decays e^{G_t - G_s} times k_t . k_s.
        let mut gcum = vec![0f32; c];
        let mut acc = 0f32;
        for gc in gcum.iter_mut() {
            acc -= r.random_range(0.0f32..0.3);
            *gc = acc;
        }
        let mut mc = vec![f32::NAN; c_max * ld];
        for t in 0..c {
            for s in 0..t {
                mc[t * ld + s] = (gcum[t] - gcum[s]).exp() * r.random_range(-1.0f32..1.0);
            }
        }
        let beta: Vec<f32> = (0..c).map(|_| r.random_range(0.0f32..1.0)).collect();
        let rhs = random_vec(&mut r, c, 2.0);
        let mut want = vec![0f64; c];
        for t in 0..c {
            let sum: f64 = (0..t).map(|s| mc[t * ld + s] as f64 * want[s]).sum();
            want[t] = beta[t] as f64 * (rhs[t] as f64 - sum);
        }
        let mut u = rhs.clone();
        shim::gdn_solve(&mc, &beta, &mut u);
        for t in 0..c {
            let e = (u[t] as f64 - want[t]).abs();
            assert!(
                e <= 1e-5 * want[t].abs().max(1.0),
                "c={c} row {t}: got {} want {}",
                u[t],
                want[t]
            );
        }
    }
}

#[test]
fn host_chunked_matches_cpu_sequential_and_chunked() {
    let mut r = rng(63);
    for regime in REGIMES {
        for n in lengths() {
            let c = case(&mut r, 2, 4, n, regime);
            let (want_o, want_s) = cpu(&c, false);
            let (cpu_o, cpu_s) = cpu(&c, true);
            let (got_o, got_s) = host_chunked(&c);
            let what = format!("{regime:?} n={n}");
            let e = [
                check(
                    &format!("{what}: host chunked out"),
                    &got_o,
                    &want_o,
                    TOL_HOST,
                ),
                check(
                    &format!("{what}: host chunked state"),
                    &got_s,
                    &want_s,
                    TOL_HOST,
                ),
                check(&format!("{what}: cpu chunked out"), &cpu_o, &want_o, TOL),
                check(&format!("{what}: cpu chunked state"), &cpu_s, &want_s, TOL),
            ];
            eprintln!("{what}: host out/state, cpu chunked out/state errors {e:?}");
            assert!(
                got_s != c.s0,
                "{what}: the state must change (a test that cannot fail otherwise)"
            );
        }
    }
}

#[test]
fn host_chunked_carries_state_across_calls() {
    // Two calls (split mid-chunk) equal one call: the state is the only carried quantity.
    let mut r = rng(64);
    let c = case(&mut r, 1, 2, 90, Regime::Random);
    let (want_o, want_s) = cpu(&c, false);
    let d = &c.dims;
    let split = 45;
    let first = Case {
        dims: *d,
        n: split,
        y: c.y[..split * d.conv_dim()].to_vec(),
        b: c.b[..split * d.n_v_heads].to_vec(),
        alpha: c.alpha[..split * d.n_v_heads].to_vec(),
        a: c.a.clone(),
        dt_bias: c.dt_bias.clone(),
        s0: c.s0.clone(),
    };
    let (o1, s1) = host_chunked(&first);
    let second = Case {
        dims: *d,
        n: c.n - split,
        y: c.y[split * d.conv_dim()..].to_vec(),
        b: c.b[split * d.n_v_heads..].to_vec(),
        alpha: c.alpha[split * d.n_v_heads..].to_vec(),
        a: c.a.clone(),
        dt_bias: c.dt_bias.clone(),
        s0: s1,
    };
    let (o2, s2) = host_chunked(&second);
    let got_o: Vec<f32> = o1.into_iter().chain(o2).collect();
    check("split out", &got_o, &want_o, TOL_HOST);
    check("split state", &s2, &want_s, TOL_HOST);
}

/// (outputs, final state) of the kernel's own source run on the host by the SIMT emulator.
fn emulated_kernel(c: &Case) -> (Vec<f32>, Vec<f32>) {
    let d = &c.dims;
    let kd = d.n_k_heads * D;
    let mut state = c.s0.clone();
    let mut out = vec![0f32; c.n * d.value_dim()];
    let x = DeltaRuleInputs {
        q: &c.y[..],
        k: &c.y[kd..],
        v: &c.y[2 * kd..],
        beta_raw: &c.b[..],
        alpha_raw: &c.alpha[..],
        dt_bias: &c.dt_bias[..],
        ssm_a: &c.a[..],
    };
    let ok = shim::emu_delta_rule_chunked(&x, &shape(c), &mut state, &mut out);
    assert!(
        ok,
        "the emulated kernel's threads deadlocked on their barriers"
    );
    (out, state)
}

#[test]
fn kernel_source_emulated_on_host_matches_cpu() {
    // Every block and thread of delta_rule_chunked_f32, switched at its barriers and shuffles:
    // the thread mapping, the column split over blocks, the key-head sharing and the tail chunk.
    // The emulator is slow (fibers), so the lengths are few: one token, a chunk and a tail.
    let mut r = rng(67);
    let c_len = pn_kernels::DELTA_RULE_CHUNK;
    for (regime, n) in [
        (Regime::Random, 1),
        (Regime::Random, 2 * c_len + 5),
        (Regime::DecayNearOne, c_len),
        (Regime::LargeKeys, c_len + 1),
    ] {
        let c = case(&mut r, 2, 4, n, regime);
        let (want_o, want_s) = cpu(&c, false);
        let (got_o, got_s) = emulated_kernel(&c);
        let what = format!("{regime:?} n={n}");
        let e = [
            check(&format!("{what}: emulated out"), &got_o, &want_o, TOL_HOST),
            check(
                &format!("{what}: emulated state"),
                &got_s,
                &want_s,
                TOL_HOST,
            ),
        ];
        eprintln!("{what}: emulated kernel out/state errors {e:?}");
    }
}

// pn-kernels is a dev-dependency of this crate with its default `cuda` feature (the launch
// wrappers), so the GPU tests always build here.
mod gpu {
    use super::*;
    use pn_kernels::cudarc::driver::{CudaSlice, CudaStream};
    use pn_kernels::Gpu;
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

    fn up(s: &Arc<CudaStream>, v: &[f32]) -> CudaSlice<f32> {
        s.clone_htod(v).expect("upload")
    }

    /// The case's inputs on the device.
    struct Dev {
        y: CudaSlice<f32>,
        b: CudaSlice<f32>,
        al: CudaSlice<f32>,
        dtb: CudaSlice<f32>,
        a: CudaSlice<f32>,
    }

    fn upload(s: &Arc<CudaStream>, c: &Case) -> Dev {
        Dev {
            y: up(s, &c.y),
            b: up(s, &c.b),
            al: up(s, &c.alpha),
            dtb: up(s, &c.dt_bias),
            a: up(s, &c.a),
        }
    }

    /// Runs one kernel over the case on the given state and output buffers.
    fn launch(
        g: &Gpu,
        c: &Case,
        dv: &Dev,
        chunked: bool,
        state: &mut CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
    ) {
        let d = &c.dims;
        let (cd, kd, n) = (d.conv_dim(), d.n_k_heads * D, c.n);
        let qv = dv.y.slice(0..(n - 1) * cd + kd);
        let kv = dv.y.slice(kd..kd + (n - 1) * cd + kd);
        let vv = dv.y.slice(2 * kd..2 * kd + (n - 1) * cd + d.value_dim());
        let (bv, av, dtv, sav) = (
            dv.b.as_view(),
            dv.al.as_view(),
            dv.dtb.as_view(),
            dv.a.as_view(),
        );
        let (mut sv, mut ov) = (state.as_view_mut(), out.as_view_mut());
        let x = DeltaRuleInputs {
            q: &qv,
            k: &kv,
            v: &vv,
            beta_raw: &bv,
            alpha_raw: &av,
            dt_bias: &dtv,
            ssm_a: &sav,
        };
        let sh = shape(c);
        if chunked {
            g.delta_rule_chunked(&x, &sh, &mut sv, &mut ov)
        } else {
            g.delta_rule(&x, &sh, &mut sv, &mut ov)
        }
        .expect("launch");
    }

    /// (outputs, final state) of one kernel over the case from `c.s0`.
    fn run(g: &Gpu, c: &Case, dv: &Dev, chunked: bool) -> (Vec<f32>, Vec<f32>) {
        let s = g.stream();
        let mut state = up(s, &c.s0);
        let mut out = s
            .alloc_zeros::<f32>(c.n * c.dims.value_dim())
            .expect("alloc");
        launch(g, c, dv, chunked, &mut state, &mut out);
        (
            s.clone_dtoh(&out).expect("download"),
            s.clone_dtoh(&state).expect("download"),
        )
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn chunked_kernel_matches_sequential_kernel_and_cpu() {
        let Some(g) = gpu() else { return };
        let s = g.stream().clone();
        let mut r = rng(65);
        for regime in REGIMES {
            for n in lengths() {
                let c = case(&mut r, 2, 6, n, regime);
                let dv = upload(&s, &c);
                let (co, cs) = run(&g, &c, &dv, true);
                let (so, ss) = run(&g, &c, &dv, false);
                let (want_o, want_s) = cpu(&c, false);
                let what = format!("{regime:?} n={n}");
                let e = [
                    check(&format!("{what}: chunked vs cpu out"), &co, &want_o, TOL),
                    check(&format!("{what}: chunked vs cpu state"), &cs, &want_s, TOL),
                    check(&format!("{what}: sequential vs cpu out"), &so, &want_o, TOL),
                    check(
                        &format!("{what}: sequential vs cpu state"),
                        &ss,
                        &want_s,
                        TOL,
                    ),
                    check(&format!("{what}: chunked vs sequential out"), &co, &so, TOL),
                    check(
                        &format!("{what}: chunked vs sequential state"),
                        &cs,
                        &ss,
                        TOL,
                    ),
                ];
                let e: Vec<String> = e.iter().map(|x| format!("{x:.2e}")).collect();
                eprintln!("{what}: scaled errors {}", e.join(" "));
            }
        }
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn chunked_kernel_prefill_bench() {
        let Some(g) = gpu() else { return };
        let s = g.stream().clone();
        let mut r = rng(66);
        // A Qwen3.5-sized GDN layer: 16 key heads, 32 value heads, 4096 prompt tokens.
        let n = 4096;
        let c = case(&mut r, 16, 32, n, Regime::Random);
        let dv = upload(&s, &c);
        let mut state = up(&s, &c.s0);
        let mut out = s.alloc_zeros::<f32>(n * c.dims.value_dim()).expect("alloc");
        for chunked in [false, true] {
            // Warm-up (module load, clocks); the state carries over, which does not change the
            // work.
            launch(&g, &c, &dv, chunked, &mut state, &mut out);
            s.synchronize().expect("sync");
            let reps = 3;
            let t0 = Instant::now();
            for _ in 0..reps {
                launch(&g, &c, &dv, chunked, &mut state, &mut out);
            }
            s.synchronize().expect("sync");
            let secs = t0.elapsed().as_secs_f64() / reps as f64;
            let name = if chunked { "chunked" } else { "sequential" };
            eprintln!(
                "delta rule {name}: {n} tokens x 32 value heads in {:.3} ms = {:.0} tokens/s",
                secs * 1e3,
                n as f64 / secs
            );
        }
        let outs = [run(&g, &c, &dv, false), run(&g, &c, &dv, true)];
        check(
            "bench: chunked vs sequential out",
            &outs[1].0,
            &outs[0].0,
            1e-3,
        );
        check(
            "bench: chunked vs sequential state",
            &outs[1].1,
            &outs[0].1,
            1e-3,
        );
    }
}
