//! `cargo xtask traffic`: the memory traffic model of one 27B decode token on the P100.
//!
//! Weight bytes come from the 27B tensor plan (`synth_model::planned_27b`: names, shapes and
//! P0k+19 types); KV and recurrent-state bytes from the shapes. The per-GEMV DRAM bytes use the
//! formula "weights once + x once + y once"; before printing, the formula is checked against the
//! SIMT emulator's launch footprint (distinct 32-byte sectors, `pn_kernels::emu`) running the
//! real decode kernels at 27B row lengths with reduced row counts, and the emulator's sector
//! ratio of the weight loads is printed with it.
//!
//! Launches per token are counted, not written down: the 27B model's header (a sparse file)
//! bound to `qwen_model::cuda::LaunchCounter` runs one decode token, one verify pass and one MTP
//! draft row through `qwen-model`'s real op sequence, each op counting the launches of the CUDA
//! backend's dispatch for it (`traffic_count`).

use crate::synth_model::planned_27b;
use gguf_io::GgmlType;
use pn_kernels::emu::{self, region, PnInput, StockType};
use pn_kernels::launch;

/// Arguments of `cargo xtask traffic`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Context length (positions in the KV cache) of the token.
    #[arg(long, default_value_t = 4096)]
    pub ctx: u64,
    /// Bytes per KV value: 2 (f16), 1.0625 (q8_0), 0.5625 (q4_0).
    #[arg(long, default_value_t = 2.0)]
    pub kv_bytes: f64,
    /// Peak DRAM bandwidth, GB/s (P100: 732).
    #[arg(long, default_value_t = 732.0)]
    pub bandwidth: f64,
    /// MTP draft tokens per step.
    #[arg(long, default_value_t = 2)]
    pub draft: u32,
    /// Probability that each draft token is accepted.
    #[arg(long, default_value_t = 0.75)]
    pub acceptance: f64,
}

// The 27B shapes (synth_model::Shape "27b").
const D: u64 = 5120;
const LAYERS: u64 = 64;
const HKV: u64 = 4;
const DH: u64 = 256;
const HV: u64 = 48;
const DK: u64 = 128;
const CONV_DIM: u64 = 2 * 16 * DK + HV * DK;

fn bytes_of(dims: &[u64], ty: GgmlType) -> u64 {
    let n: u64 = dims.iter().product();
    n / ty.block_size() as u64 * ty.type_size() as u64
}

fn full_attn(layer: u64) -> bool {
    (layer + 1).is_multiple_of(4) || layer == LAYERS
}

/// A seeded generator of values in [-0.5, 0.5) (an LCG: the model's test data needs no quality).
pub(crate) fn uniform(mut seed: u64) -> impl FnMut() -> f32 {
    move || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((seed >> 33) as f32 / (1u64 << 31) as f32) - 0.5
    }
}

/// Checks the GEMV byte formula against the emulator on 27B row lengths; returns the lines to
/// print.
fn check_against_emulator() -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let mut lines = Vec::new();
    let mut next = uniform(1);
    for (bits, n, k) in [(3u32, 32usize, 5120usize), (4, 16, 6144), (4, 8, 17408)] {
        let ty = if bits == 3 {
            pn_format::PnType::Pn3t
        } else {
            pn_format::PnType::Pn4t
        };
        let wf: Vec<f32> = (0..n * k).map(|_| next()).collect();
        let w = pn_format::quantize_rows(ty, &wf, k, 1)?;
        let x: Vec<f32> = (0..k).map(|_| next()).collect();
        let (xh, e) = emu::pn_prepare_x(&x)?;
        let l = launch::pn_h2(bits, n, k, true, None).ok_or("no launch for a 27B shape")?;
        let mut y = vec![0f32; n];
        let s = emu::pn_gemv(&l, &w, PnInput::Prepared(&xh, e), &mut y, n, k)?;
        let formula = w.len() as u64;
        let measured = s.unique_bytes(region::WEIGHT);
        // x is a host Vec (not sector-aligned): one straddled sector allowed.
        if measured != formula || s.unique_bytes(region::X).abs_diff(2 * k as u64) > 32 {
            return Err(format!(
                "{}: emulator footprint {measured} weight / {} x bytes, formula {formula} / {}",
                l.kernel,
                s.unique_bytes(region::X),
                2 * k
            )
            .into());
        }
        lines.push(format!(
            "  {:<18} {n:>3} x {k:<5}: weight footprint {measured} B = formula; x {} B; weight sectors {:.3}x min; smem conflict degree {:.2}",
            l.kernel,
            s.unique_bytes(region::X),
            s.sector_ratio(region::WEIGHT),
            s.smem_max_degree
        ));
    }
    let (n, k) = (32usize, 5120usize);
    let wf: Vec<f32> = (0..n * k).map(|_| next()).collect();
    let mut w = Vec::new();
    gguf_io::quants::quantize_row(GgmlType::Q4K, &wf, &mut w)?;
    let x: Vec<f32> = (0..k).map(|_| next()).collect();
    let l = launch::q4_k(n, k).ok_or("no q4_K launch")?;
    let mut y = vec![0f32; n];
    let s = emu::quant_gemv(StockType::Q4K, &l, &w, k / 256 * 144, &x, &mut y, n)?;
    if s.unique_bytes(region::WEIGHT) != w.len() as u64 {
        return Err(format!(
            "q4_K footprint {} vs {}",
            s.unique_bytes(region::WEIGHT),
            w.len()
        )
        .into());
    }
    lines.push(format!(
        "  {:<18} {n:>3} x {k:<5}: weight footprint {} B = formula; weight sectors {:.3}x min; smem conflict degree {:.2}",
        l.kernel,
        s.unique_bytes(region::WEIGHT),
        s.sector_ratio(region::WEIGHT),
        s.smem_max_degree
    ));
    Ok(lines)
}

/// Runs the model and prints it.
pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let checks = check_against_emulator()?;
    let plan = planned_27b()?;
    let mtp_prefix = format!("blk.{LAYERS}.");
    let (mut w_main, mut w_mtp, mut head, mut gemvs) = (0u64, 0u64, 0u64, 0u64);
    let mut act = 0u64;
    for (name, dims, ty) in &plan {
        if name == "token_embd.weight" {
            continue; // one row per token
        }
        let b = bytes_of(dims, *ty);
        if dims.len() == 2 {
            gemvs += 1;
            // x once (f32, or fp16 for PN) + y once.
            act += dims[0] * if ty.is_pn() { 2 } else { 4 } + 4 * dims[1];
        }
        if name == "output.weight" {
            head = b;
        } else if name.starts_with(&mtp_prefix) {
            w_mtp += b;
        } else {
            w_main += b;
        }
    }
    let n_attn = (0..LAYERS).filter(|&l| full_attn(l)).count() as u64;
    let n_gdn = LAYERS - n_attn;
    let kv = (n_attn as f64 * args.ctx as f64 * (HKV * DH * 2) as f64 * args.kv_bytes) as u64;
    let state = n_gdn * (HV * DK * DK * 4 + 3 * CONV_DIM * 4);
    let rows = 1 + args.draft as usize;
    let counted = crate::traffic_count::count_27b(rows)?;
    let l_now = counted.decode;
    // Other activations: each non-GEMV launch reads and writes about one hidden vector.
    let act_other = l_now.saturating_sub(gemvs) * 2 * 4 * D;
    let ideal = w_main + head + kv + state;
    let dram = ideal + state + act + act_other; // the state is written back too
    let gb = |b: u64| b as f64 / 1e9;
    let ms = |b: u64| b as f64 / (args.bandwidth * 1e9) * 1e3;
    println!("Traffic model of one Qwen3.8-27B-PN3 decode token (P0k+19 mix), context {} positions, KV {} B/value", args.ctx, args.kv_bytes);
    println!(
        "GEMV byte formula checked against the SIMT emulator (real kernels, 27B row lengths):"
    );
    for l in &checks {
        println!("{l}");
    }
    println!("Per token:");
    println!("  weights (64 layers)          {:>8.3} GB", gb(w_main));
    println!("  LM head (Q4_K)               {:>8.3} GB", gb(head));
    println!("  KV cache read ({n_attn} layers)    {:>8.3} GB", gb(kv));
    println!(
        "  recurrent state ({n_gdn} layers) {:>8.3} GB read, same written",
        gb(state)
    );
    println!(
        "  activations                  {:>8.3} GB",
        gb(act + act_other)
    );
    println!("  DRAM total                   {:>8.3} GB   ideal (weights + KV + state once) {:.3} GB   ratio {:.3}", gb(dram), gb(ideal), dram as f64 / ideal as f64);
    println!(
        "  launches                     {l_now} (counted from the model's op sequence; goal < 700)"
    );
    let ops: Vec<String> = counted
        .decode_ops
        .iter()
        .map(|(op, n)| format!("{op} {n}"))
        .collect();
    println!("    by op: {}", ops.join(", "));
    let t = ms(dram);
    println!("  predicted P100 time          {t:.1} ms at {} GB/s = {:.1} tok/s (at 85% of peak: {:.1} tok/s)", args.bandwidth, 1e3 / t, 0.85e3 / t);
    // MTP: one verify pass over 1 + draft rows, then `draft` passes of the MTP layer (one row)
    // with the shared head; tokens per step 1 + a + a^2 + ... The verify's PN matrices go
    // through the small-batch PN GEMV, the Q4_K head and the q8_0 alpha/beta through the
    // small-batch stock GEMVs (weights once, each bounded by bandwidth or its ALU work,
    // traffic_batch); the other non-PN matrices (small f32) run one GEMV per row, so their
    // bytes count `rows` times.
    let main_plan: Vec<_> = plan
        .iter()
        .filter(|(name, _, _)| !name.starts_with(&mtp_prefix) && name != "output.weight")
        .cloned()
        .collect();
    let vp = crate::traffic_batch::verify_pass(&main_plan, rows, args.bandwidth);
    let verify_stock: Vec<_> = plan
        .iter()
        .filter(|(name, _, _)| !name.starts_with(&mtp_prefix) && name != "token_embd.weight")
        .cloned()
        .collect();
    let sp = crate::traffic_batch::stock_pass(&verify_stock, rows, args.bandwidth);
    let pn_main: u64 = main_plan
        .iter()
        .filter(|(_, d, ty)| d.len() == 2 && ty.is_pn())
        .map(|(_, d, ty)| bytes_of(d, *ty))
        .sum();
    let r = rows as u64;
    // Main-trunk stock bytes the batch kernels do not take (one GEMV per row; norms etc.).
    let per_row = w_main - pn_main - (sp.batched_bytes - sp.head_bytes);
    let other = r * per_row + kv + 2 * state + r * (act + act_other);
    let verify_bytes = vp.weight_bytes + sp.batched_bytes + other;
    let verify_s = vp.seconds + sp.seconds + other as f64 / (args.bandwidth * 1e9);
    let draft_pass = w_mtp + head + (act + act_other) / LAYERS;
    let step_bytes = verify_bytes + args.draft as u64 * draft_pass;
    let step_s = verify_s + args.draft as f64 * draft_pass as f64 / (args.bandwidth * 1e9);
    let tokens: f64 = (0..=args.draft)
        .map(|i| args.acceptance.powi(i as i32))
        .sum();
    // Launches: the verify pass and the draft rows, counted like the decode token.
    let (verify_launches, draft_launches) = (counted.verify, counted.draft);
    let step_launches = verify_launches + args.draft as u64 * draft_launches;
    println!(
        "With MTP (draft {}, acceptance {}), verify of {rows} rows through the small-batch GEMVs (PN; Q4_K head and q8_0):",
        args.draft, args.acceptance
    );
    println!(
        "{}",
        crate::traffic_batch::check_batch_against_emulator(rows)?
    );
    println!(
        "{}",
        crate::traffic_batch::check_head_against_emulator(rows)?
    );
    println!(
        "  verify DRAM {:.3} GB (PN weights once {:.3}; Q4_K head + q8_0 once {:.3}; other non-PN weights x{rows} {:.3}); x staged from L2 {:.3} GB (PN) + {:.3} GB (head)",
        gb(verify_bytes),
        gb(vp.weight_bytes),
        gb(sp.batched_bytes),
        gb(r * per_row),
        gb(vp.x_l2_bytes),
        gb(sp.x_l2_bytes)
    );
    println!(
        "  verify time {:.1} ms (PN GEMVs {:.1} ms, of which ALU-bound {:.1} ms if no overlap with memory; head + q8_0 {:.1} ms, ALU bound {:.1} ms, {:.1} ms as one GEMV per row)",
        verify_s * 1e3,
        vp.seconds * 1e3,
        vp.alu_seconds * 1e3,
        sp.seconds * 1e3,
        sp.alu_seconds * 1e3,
        sp.alu_seconds_per_row * 1e3
    );
    println!(
        "  step {:.3} GB (verify {:.3} + {} x draft {:.3}), {tokens:.4} tokens per step, {} launches per step = {:.0} per token",
        gb(step_bytes),
        gb(verify_bytes),
        args.draft,
        gb(draft_pass),
        step_launches,
        step_launches as f64 / tokens
    );
    let tm = step_s * 1e3 / tokens;
    println!(
        "  predicted P100 time          {tm:.1} ms per token = {:.1} tok/s (at 85% of peak: {:.1} tok/s); without MTP {t:.1} ms = {:.1} tok/s",
        1e3 / tm,
        0.85e3 / tm,
        1e3 / t
    );
    Ok(())
}
