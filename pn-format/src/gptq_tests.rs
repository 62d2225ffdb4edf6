use super::*;
use crate::{dequantize_row, quantize_row_ref, validate_row};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
    }
}

/// `n` correlated input rows `[n, k]`: a few shared factors plus noise, column scales varying
/// (the structure real activations have and error feedback exploits).
fn inputs(n: usize, k: usize, seed: u64) -> Vec<f32> {
    // The loadings are the distribution (fixed); `seed` only draws the samples.
    let mut lr = Rng(99);
    let factors = 6;
    let load: Vec<f64> = (0..factors * k).map(|_| lr.next()).collect();
    let mut rng = Rng(seed);
    let mut x = Vec::with_capacity(n * k);
    for _ in 0..n {
        let f: Vec<f64> = (0..factors).map(|_| rng.next() * 2.0).collect();
        for j in 0..k {
            let mut v = 0.3 * rng.next();
            for (t, fv) in f.iter().enumerate() {
                v += fv * load[t * k + j];
            }
            x.push((v * (1.0 + (j % 5) as f64)) as f32);
        }
    }
    x
}

fn gram(x: &[f32], k: usize) -> Vec<f64> {
    let mut h = vec![0f64; k * k];
    for row in x.chunks_exact(k) {
        for i in 0..k {
            for j in 0..k {
                h[i * k + j] += f64::from(row[i]) * f64::from(row[j]);
            }
        }
    }
    h
}

fn decode(ty: PnType, q: &[u8], k: usize) -> Vec<f32> {
    let rb = k / ty.weights_per_block() * BLOCK_BYTES;
    let mut d = vec![0f32; q.len() / rb * k];
    for (src, dst) in q.chunks_exact(rb).zip(d.chunks_exact_mut(k)) {
        dst.copy_from_slice(&{
            let mut v = vec![0f32; k];
            dequantize_row(ty, src, &mut v).unwrap();
            v
        });
    }
    d
}

#[test]
fn factor_inverts_the_damped_hessian() {
    let k = 48;
    let h = gram(&inputs(200, k, 3), k);
    let f = GptqFactor::new(&h, k, DEFAULT_DAMP).unwrap();
    // U^T U (H + damp I) = I.
    let mut hinv = vec![0f64; k * k];
    for i in 0..k {
        for j in 0..k {
            hinv[i * k + j] = (0..k).map(|t| f.u[t * k + i] * f.u[t * k + j]).sum();
        }
    }
    for i in 0..k {
        for j in 0..k {
            let p: f64 = (0..k)
                .map(|t| hinv[i * k + t] * (h[t * k + j] + if t == j { f.damp() } else { 0.0 }))
                .sum();
            let want = if i == j { 1.0 } else { 0.0 };
            assert!((p - want).abs() < 1e-8, "({i},{j}) = {p}");
        }
        for j in 0..i {
            assert_eq!(f.u[i * k + j], 0.0, "U is upper triangular");
        }
    }
}

/// The shared setup of the held-out tests: 24 rows of 4 blocks, the Gram matrices of a
/// calibration (`h`) and a held-out (`hv`) input set, random weights and their GPTQ result.
struct Fixture {
    k: usize,
    rows: usize,
    h: Vec<f64>,
    hv: Vec<f64>,
    w: Vec<f32>,
    f: GptqFactor,
    rb: usize,
    q: Vec<u8>,
}

fn fixture(ty: PnType) -> Fixture {
    let k = ty.weights_per_block() * 4;
    let rows = 24;
    let h = gram(&inputs(400, k, 5), k);
    let hv = gram(&inputs(400, k, 77), k);
    let mut rng = Rng(8);
    let w: Vec<f32> = (0..rows * k).map(|_| (rng.next() * 0.1) as f32).collect();
    let f = GptqFactor::new(&h, k, DEFAULT_DAMP).unwrap();
    let rb = k / ty.weights_per_block() * BLOCK_BYTES;
    let mut q = vec![0u8; rows * rb];
    quantize_rows_gptq(ty, &f, &w, &mut q).unwrap();
    Fixture {
        k,
        rows,
        h,
        hv,
        w,
        f,
        rb,
        q,
    }
}

/// On held-out inputs of the same distribution, error feedback has less output error than the
/// reference's round to nearest, for both types; the blocks are valid and the result does not
/// depend on how rows are split.
#[test]
fn gptq_beats_reference_on_held_out_inputs() {
    for ty in PnType::ALL {
        let Fixture {
            k,
            rows,
            hv,
            w,
            f,
            rb,
            q,
            ..
        } = fixture(ty);
        for r in q.chunks_exact(rb) {
            validate_row(ty, r).unwrap();
        }
        let mut qr = Vec::new();
        for row in w.chunks_exact(k) {
            qr.extend(quantize_row_ref(ty, row).unwrap());
        }
        let eg = hessian_error(&hv, k, &w, &decode(ty, &q, k));
        let er = hessian_error(&hv, k, &w, &decode(ty, &qr, k));
        assert!(eg < 0.8 * er, "{ty}: gptq {eg} vs ref {er}");
        // Two halves quantized separately give the same bytes.
        let mut q2 = vec![0u8; rows * rb];
        let (a, b) = q2.split_at_mut(rows / 2 * rb);
        quantize_rows_gptq(ty, &f, &w[..rows / 2 * k], a).unwrap();
        quantize_rows_gptq(ty, &f, &w[rows / 2 * k..], b).unwrap();
        assert_eq!(q, q2, "{ty}: row split changed the bytes");
    }
}

#[test]
fn bad_inputs_are_errors() {
    let k = 80;
    let h = gram(&inputs(100, k, 1), k);
    let f = GptqFactor::new(&h, k, DEFAULT_DAMP).unwrap();
    let mut w = vec![0.01f32; 2 * k];
    w[k + 5] = f32::INFINITY;
    let mut out = vec![0u8; 2 * BLOCK_BYTES];
    let e = quantize_rows_gptq(PnType::Pn3t, &f, &w, &mut out).unwrap_err();
    assert!(e.to_string().contains("row 1"), "{e}");
    assert!(GptqFactor::new(&vec![0.0; k * k], k, DEFAULT_DAMP).is_err());
    assert!(GptqFactor::new(&h[1..], k, DEFAULT_DAMP).is_err());
    // pn4t blocks do not tile 80 columns.
    assert!(quantize_rows_gptq(PnType::Pn4t, &f, &w, &mut out).is_err());
}

/// Timing of the two costs of GPTQ at sizes from which the 27B shapes are extrapolated
/// (factoring is O(k^3), the error-feedback pass O(rows k^2)); prints, asserts only that the
/// output is valid. Slow: `cargo test --release -p pn-format --lib gptq_timing -- --ignored
/// --nocapture`.
#[test]
#[ignore]
fn gptq_timing_for_extrapolation() {
    for &(k, rows) in &[(640usize, 512usize), (1280, 512), (2560, 256)] {
        let x = inputs(2 * k, k, 7);
        let h = gram(&x, k);
        let t0 = std::time::Instant::now();
        let f = GptqFactor::new(&h, k, 0.1).unwrap();
        let tf = t0.elapsed().as_secs_f64();
        let mut r = Rng(3);
        let w: Vec<f32> = (0..rows * k).map(|_| r.next() as f32).collect();
        let mut out = vec![0u8; rows * k / 80 * BLOCK_BYTES];
        let t1 = std::time::Instant::now();
        quantize_rows_gptq(PnType::Pn3t, &f, &w, &mut out).unwrap();
        let tq = t1.elapsed().as_secs_f64();
        for row in out.chunks_exact(k / 80 * BLOCK_BYTES) {
            validate_row(PnType::Pn3t, row).unwrap();
        }
        eprintln!(
            "k {k}: factor {tf:.3} s ({:.3e} s/k^3), {rows} rows {tq:.3} s ({:.3e} s/(row k^2))",
            tf / (k as f64).powi(3),
            tq / (rows as f64 * (k as f64).powi(2))
        );
    }
}

/// The factor as the unblocked one-thread code built it (reversal, Cholesky, inverse).
fn unblocked_u(h: &[f64], k: usize, damp: f64) -> Vec<f64> {
    use crate::gptq_linalg::tests::{cholesky_unblocked, invert_unblocked};
    let mut b = vec![0f64; k * k];
    reversed_lower(h, k, damp, &mut b);
    cholesky_unblocked(&mut b, k).unwrap();
    let mut u = invert_unblocked(&b, k);
    u.reverse();
    u
}

/// The blocked, threaded factor equals the unblocked one within 1e-9 relative (odd sizes, sizes
/// not a multiple of the block), bit-identical for any thread count.
#[test]
fn factor_matches_unblocked_for_any_thread_count() {
    for &k in &[1usize, 97, 200, 261] {
        let h = gram(&inputs(2 * k + 7, k, 4), k);
        let one = GptqFactor::new_threaded(&h, k, DEFAULT_DAMP, 1).unwrap();
        let want = unblocked_u(&h, k, one.damp());
        let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
        let e = one
            .u
            .iter()
            .zip(&want)
            .fold(0f64, |m, (a, b)| m.max((a - b).abs() / scale));
        assert!(e < 1e-9, "k {k}: factor differs by {e:e}");
        for threads in [2, 3, 7] {
            let f = GptqFactor::new_threaded(&h, k, DEFAULT_DAMP, threads).unwrap();
            assert!(f.u == one.u, "k {k}: {threads} threads changed the factor");
        }
    }
}

/// The feedback as the unblocked code ran it: the lazy run's errors applied column chunk by
/// column chunk, one row and one error at a time (the reference for the GEMM version).
fn quantize_unblocked(ty: PnType, f: &GptqFactor, w: &[f32]) -> Vec<u8> {
    let (k, g) = (f.k, ty.weights_per_block());
    let rows = w.len() / k;
    let row_bytes = k / g * BLOCK_BYTES;
    let mut out = vec![0u8; rows * row_bytes];
    let mut wk: Vec<f64> = w.iter().map(|&v| f64::from(v)).collect();
    let run = g * LAZY_GROUPS;
    let mut err = vec![0f64; rows * run];
    let z = f64::from(ty.zero_point());
    let u = &f.u;
    let mut c0 = 0;
    while c0 < k {
        let c1 = (c0 + run).min(k);
        for a in (c0..c1).step_by(g) {
            let grp = a / g;
            for r in 0..rows {
                let wr = &mut wk[r * k..(r + 1) * k];
                let s = weighted_scale(ty, &wr[a..a + g], &f.diag[a..a + g], grp).unwrap();
                let mut blockw = [0f64; 80];
                for j in a..a + g {
                    let v = wr[j];
                    blockw[j - a] = v;
                    let q = s.map_or(0.0, |s| s * (crate::quantize::code_of(v, s, z) - z));
                    let e = (v - q) / u[j * k + j];
                    err[r * run + (j - c0)] = e;
                    for (d, &uu) in wr[j + 1..c1].iter_mut().zip(&u[j * k + j + 1..j * k + c1]) {
                        *d -= e * uu;
                    }
                }
                out[r * row_bytes + grp * BLOCK_BYTES..][..BLOCK_BYTES]
                    .copy_from_slice(&pack_at_scale(ty, &blockw[..g], s));
            }
        }
        for r in 0..rows {
            for t in 0..c1 - c0 {
                let e = err[r * run + t];
                let urow = &u[(c0 + t) * k + c1..(c0 + t) * k + k];
                for (d, &uu) in wk[r * k + c1..r * k + k].iter_mut().zip(urow) {
                    *d -= e * uu;
                }
            }
        }
        c0 = c1;
    }
    out
}

/// The GEMM-shaped feedback over several lazy runs (k not a multiple of the run) has the same
/// Hessian-weighted error as the unblocked one within 0.5% (only rounding-order ties differ),
/// and is deterministic.
#[test]
fn blocked_feedback_matches_unblocked_error() {
    for ty in PnType::ALL {
        let k = ty.weights_per_block() * 9;
        let rows = 12;
        let h = gram(&inputs(3 * k, k, 21), k);
        let mut rng = Rng(17);
        let w: Vec<f32> = (0..rows * k).map(|_| (rng.next() * 0.1) as f32).collect();
        let f = GptqFactor::new_threaded(&h, k, DEFAULT_DAMP, 2).unwrap();
        let rb = k / ty.weights_per_block() * BLOCK_BYTES;
        let mut q = vec![0u8; rows * rb];
        quantize_rows_gptq(ty, &f, &w, &mut q).unwrap();
        let mut again = vec![0u8; rows * rb];
        quantize_rows_gptq(ty, &f, &w, &mut again).unwrap();
        assert_eq!(q, again, "{ty}: not deterministic");
        let old = quantize_unblocked(ty, &f, &w);
        let en = hessian_error(&h, k, &w, &decode(ty, &q, k));
        let eo = hessian_error(&h, k, &w, &decode(ty, &old, k));
        assert!(en <= eo * 1.005, "{ty}: blocked {en} vs unblocked {eo}");
        let same = q
            .chunks_exact(BLOCK_BYTES)
            .zip(old.chunks_exact(BLOCK_BYTES))
            .filter(|(a, b)| a == b)
            .count();
        assert!(
            same * 10 >= 9 * q.len() / BLOCK_BYTES,
            "{ty}: only {same} blocks equal"
        );
    }
}

/// Process CPU seconds so far (all threads): on a shared machine the wall time is mostly
/// waiting, CPU time is what the work costs.
fn cpu_now() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

thread_local! {
    /// CPU seconds of the last [`secs`] call.
    static LAST_CPU: std::cell::Cell<f64> = const { std::cell::Cell::new(0.0) };
}

/// Wall seconds of `f` (its process CPU seconds go to [`LAST_CPU`]).
fn secs(f: impl FnOnce()) -> f64 {
    let (t, c) = (std::time::Instant::now(), cpu_now());
    f();
    LAST_CPU.with(|l| l.set(cpu_now() - c));
    t.elapsed().as_secs_f64()
}

fn last_cpu() -> f64 {
    LAST_CPU.with(|l| l.get())
}

/// The PN type a 27B matrix of row length `k` gets: pn3t where 80 divides k, else pn4t (the
/// K = 6144 and 17408 readers).
fn type_for(k: usize) -> PnType {
    if k.is_multiple_of(80) {
        PnType::Pn3t
    } else {
        PnType::Pn4t
    }
}

/// GPTQ of `w` (`[rows, k]`) as `pn quantize` runs it: tasks of 64 rows dealt to `threads`.
fn quantize_tasks(f: &GptqFactor, w: &[f32], threads: usize) -> Vec<u8> {
    let k = f.k;
    let ty = type_for(k);
    let rb = k / ty.weights_per_block() * BLOCK_BYTES;
    let mut out = vec![0u8; w.len() / k * rb];
    let tasks: Vec<(&[f32], &mut [u8])> = w.chunks(64 * k).zip(out.chunks_mut(64 * rb)).collect();
    let mut per: Vec<Vec<(&[f32], &mut [u8])>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, t) in tasks.into_iter().enumerate() {
        per[i % threads].push(t);
    }
    std::thread::scope(|s| {
        for mine in per {
            s.spawn(move || {
                for (src, dst) in mine {
                    quantize_rows_gptq(ty, f, src, dst).unwrap();
                }
            });
        }
    });
    out
}

/// The costs of GPTQ at the 27B row lengths, through the code `pn quantize --calib` runs: the
/// blocked Gram accumulation per calibration token, the blocked threaded factor per distinct
/// input, and the feedback per row, each at k = 5120 (attention/GDN and FFN inputs), 6144
/// (`ssm_out`/`attn_output`) and 17408 (`ffn_down`); then a 27B layer and 64 layers from them.
/// Before that, the unblocked one-thread code against the blocked one at k = 1280 in the same
/// process (the ratio is what a loaded machine can measure). Prints; asserts only valid output.
/// Slow (minutes, 4.9 GB at k = 17408): `PN_GPTQ_THREADS=2 PN_GPTQ_KS=5120,6144,17408 cargo test
/// --release -p pn-format --lib gptq_27b -- --ignored --nocapture`.
#[test]
#[ignore]
fn gptq_27b_layer_timing() {
    use crate::gptq_linalg::accumulate_lower_gram;
    use crate::gptq_linalg::tests::{cholesky_unblocked, invert_unblocked};
    let threads: usize = std::env::var("PN_GPTQ_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let ks: Vec<usize> = std::env::var("PN_GPTQ_KS")
        .unwrap_or_else(|_| "5120,6144".into())
        .split(',')
        .filter_map(|v| v.trim().parse().ok())
        .collect();
    let mut rng = Rng(5);
    {
        let k = 1280;
        let x: Vec<f64> = (0..2 * k * k).map(|_| rng.next()).collect();
        let mut h = vec![0f64; k * k];
        accumulate_lower_gram(&mut h, &x, 2 * k, k, threads);
        let w: Vec<f32> = (0..256 * k).map(|_| rng.next() as f32).collect();
        let mut b = vec![0f64; k * k];
        let told = secs(|| {
            reversed_lower(&h, k, 0.01, &mut b);
            cholesky_unblocked(&mut b, k).unwrap();
            std::hint::black_box(invert_unblocked(&b, k));
        });
        let mut f = None;
        let tnew = secs(|| f = Some(GptqFactor::new_threaded(&h, k, 0.01, threads).unwrap()));
        let f1 = secs(|| drop(GptqFactor::new_threaded(&h, k, 0.01, 1).unwrap()));
        let f1cpu = last_cpu();
        let f = f.unwrap();
        let _ = secs(|| {});
        let told_cpu = {
            let mut b = vec![0f64; k * k];
            secs(|| {
                reversed_lower(&h, k, 0.01, &mut b);
                cholesky_unblocked(&mut b, k).unwrap();
                std::hint::black_box(invert_unblocked(&b, k));
            });
            last_cpu()
        };
        let qold = secs(|| drop(quantize_unblocked(PnType::Pn3t, &f, &w)));
        let qold_cpu = last_cpu();
        let qnew1 = secs(|| drop(quantize_tasks(&f, &w, 1)));
        let qnew1_cpu = last_cpu();
        let qnew = secs(|| drop(quantize_tasks(&f, &w, threads)));
        eprintln!(
            "k 1280 A/B: factor unblocked 1 thread {told:.3} s, blocked 1 thread {f1:.3} s \
             ({:.1}x), {threads} threads {tnew:.3} s ({:.1}x); feedback 256 rows unblocked \
             {qold:.3} s, blocked 1 thread {qnew1:.3} s ({:.1}x), {threads} threads {qnew:.3} s; \
             CPU-s ratios (1 thread): factor {:.1}x, feedback {:.1}x",
            told / f1,
            told / tnew,
            qold / qnew1,
            told_cpu / f1cpu,
            qold_cpu / qnew1_cpu
        );
    }
    let mut cost = std::collections::HashMap::new();
    for &k in &ks {
        let tokens = 256;
        let x: Vec<f64> = (0..tokens * k).map(|_| rng.next()).collect();
        let mut h = vec![0f64; k * k];
        let tg = secs(|| accumulate_lower_gram(&mut h, &x, tokens, k, threads));
        let cg = last_cpu();
        drop(x);
        let mut f = None;
        let tf = secs(|| f = Some(GptqFactor::new_threaded(&h, k, 0.01, threads).unwrap()));
        let cf = last_cpu();
        drop(h);
        let f = f.unwrap();
        let rows = 128;
        let w: Vec<f32> = (0..rows * k).map(|_| rng.next() as f32).collect();
        let mut out = Vec::new();
        let tq = secs(|| out = quantize_tasks(&f, &w, threads));
        let cq = last_cpu();
        let ty = type_for(k);
        for row in out.chunks_exact(k / ty.weights_per_block() * BLOCK_BYTES) {
            validate_row(ty, row).unwrap();
        }
        let (pt, pr) = (tg / tokens as f64, tq / rows as f64);
        eprintln!(
            "k {k}, {threads} threads, wall (CPU): Gram {:.2} ({:.2}) ms/token, factor {tf:.1} \
             ({cf:.1}) s = {:.2} GFMA per CPU-s as k^3/2, feedback {:.1} ({:.1}) ms/row = {:.2} \
             GFMA per CPU-s as k^2/2",
            pt * 1e3,
            cg / tokens as f64 * 1e3,
            (k as f64).powi(3) / 2.0 / cf / 1e9,
            pr * 1e3,
            cq / rows as f64 * 1e3,
            (k as f64).powi(2) / 2.0 / (cq / rows as f64) / 1e9
        );
        cost.insert(k, (cg / tokens as f64, cf, cq / rows as f64));
    }
    let (Some(&a), Some(&o)) = (cost.get(&5120), cost.get(&6144)) else {
        return;
    };
    // ffn_down's k = 17408 measured, or scaled from k = 5120 (Gram and feedback k^2, factor k^3).
    let s = 17408.0 / 5120.0;
    let d = cost
        .get(&17408)
        .copied()
        .unwrap_or((a.0 * s * s, a.1 * s * s * s, a.2 * s * s));
    // One 27B layer (GDN and attention alike): distinct inputs 5120 (mixer), 6144 (its output
    // projection), 5120 (FFN), 17408 (ffn_down); PN rows 16384 (GDN qkv+gate; attention q+k+v
    // 14336) and 34816 (gate+up) at 5120, 5120 at 6144 and at 17408.
    let gram = 2.0 * a.0 + o.0 + d.0;
    let factor = 2.0 * a.1 + o.1 + d.1;
    let feedback = (16384.0 + 34816.0) * a.2 + 5120.0 * o.2 + 5120.0 * d.2;
    let total = 64.0 * (gram * 16384.0 + factor + feedback);
    eprintln!(
        "27B layer in CPU-seconds (17408 {}): Gram {:.1} ms/token ({:.0} s per 16384 tokens), \
         factors {factor:.0} s, feedback {feedback:.0} s; 64 layers with 16384 tokens: {:.1} \
         CPU-hours = {:.1} h on 2 cores, {:.1} h on 16",
        if cost.contains_key(&17408) {
            "measured"
        } else {
            "scaled from 5120"
        },
        gram * 1e3,
        gram * 16384.0,
        total / 3600.0,
        total / 3600.0 / 2.0,
        total / 3600.0 / 16.0
    );
}

/// The refinement after GPTQ lowers the (damped) calibration error it descends on, exactly as
/// it reports, keeps the blocks valid, does not depend on the row split, and does not lose on
/// held-out inputs of the same distribution.
#[test]
fn refinement_lowers_the_output_error_gptq_left() {
    use crate::gptq_refine::refine_rows;
    for ty in PnType::ALL {
        let Fixture {
            k,
            rows,
            h,
            hv,
            w,
            f,
            rb,
            mut q,
        } = fixture(ty);
        let g0 = q.clone();
        let st = refine_rows(ty, &h, f.damp(), &w, &mut q, 2).unwrap();
        for r in q.chunks_exact(rb) {
            validate_row(ty, r).unwrap();
        }
        let mut hd = h.clone();
        for i in 0..k {
            hd[i * k + i] += f.damp();
        }
        let (e0, e1) = (
            hessian_error(&hd, k, &w, &decode(ty, &g0, k)),
            hessian_error(&hd, k, &w, &decode(ty, &q, k)),
        );
        assert!((st.before - e0).abs() <= 1e-9 * e0, "{ty}: {st:?} vs {e0}");
        assert!((st.after - e1).abs() <= 1e-6 * e0, "{ty}: {st:?} vs {e1}");
        assert!(e1 < 0.97 * e0, "{ty}: refined {e1} vs gptq {e0}");
        assert!(st.scales > 0 && st.codes > 0, "{ty}: {st:?}");
        let (v0, v1) = (
            hessian_error(&hv, k, &w, &decode(ty, &g0, k)),
            hessian_error(&hv, k, &w, &decode(ty, &q, k)),
        );
        eprintln!("{ty}: calib {e0:.4e} -> {e1:.4e}, held-out {v0:.4e} -> {v1:.4e}, {st:?}");
        assert!(v1 < v0, "{ty}: held-out refined {v1} vs gptq {v0}");
        let mut q2 = g0.clone();
        let (a, b) = q2.split_at_mut(rows / 2 * rb);
        refine_rows(ty, &h, f.damp(), &w[..rows / 2 * k], a, 2).unwrap();
        refine_rows(ty, &h, f.damp(), &w[rows / 2 * k..], b, 2).unwrap();
        assert_eq!(q, q2, "{ty}: row split changed the bytes");
    }
}
