//! The small-batch half of `cargo xtask traffic`: the MTP verify pass (1 + draft rows) through
//! the small-batch PN GEMV (`pn*_gemv_h2p_b*`), checked against the emulator, with its DRAM
//! bytes, the L2 traffic of its K-chunked x staging, and an ALU bound (the kernel does T times
//! the fp16 work per weight byte, so from a few rows on it stops being bandwidth-bound).

use gguf_io::GgmlType;
use pn_kernels::emu::{self, region};
use pn_kernels::launch;

/// P100 PCIe: 56 SMs x 64 lanes at 1.303 GHz boost, one (f16x2 or int or f32) op per lane
/// per clock.
const P100_LANE_OPS: f64 = 56.0 * 64.0 * 1.303e9;

/// Per-lane ALU ops of one pair of blocks (two 34-byte blocks) for `t` rows, counted from the
/// kernel's inner loop (pn_block_dot_h2_batch): per block 8 words x (PAIRS code pairs x
/// (shift, and, or, hsub2) + t x (PAIRS hfma2 + one f16x2->f32 convert + 2 fadd)) + t scale
/// multiplies, plus the pair's 17 tile loads.
pub fn pair_ops(bits: u32, t: usize) -> f64 {
    let pairs = if bits == 3 { 5.0 } else { 4.0 };
    let t = t as f64;
    let block = 8.0 * (pairs * 4.0 + t * (pairs + 3.0)) + t;
    2.0 * block + 17.0 + 2.0 * t
}

/// One verify pass of `t` rows over the PN matrices of the plan.
#[derive(Default, Debug)]
pub struct BatchPass {
    /// PN weight bytes (read once from DRAM).
    pub weight_bytes: u64,
    /// Bytes of staged x read from L2 (each row group of each block restages x).
    pub x_l2_bytes: u64,
    /// Seconds if bandwidth-bound at the given GB/s, per matrix the larger of that and the ALU
    /// bound (scaled by the lanes a phase leaves idle).
    pub seconds: f64,
    /// The ALU-bound part alone, seconds.
    pub alu_seconds: f64,
    /// Launches (one prepare per group of matrices sharing x is counted by the caller).
    pub launches: u64,
}

/// The PN matrices of `plan` (name, dims [k, n], type) through the small-batch kernel for `t`
/// rows at `bw` GB/s; matrices the kernel refuses count as `t` single-row passes.
pub fn verify_pass(plan: &[(String, Vec<u64>, GgmlType)], t: usize, bw: f64) -> BatchPass {
    let mut p = BatchPass::default();
    for (_, dims, ty) in plan {
        if dims.len() != 2 || !ty.is_pn() {
            continue;
        }
        let (k, n) = (dims[0] as usize, dims[1] as usize);
        let bits = if *ty == GgmlType::Pn3t { 3 } else { 4 };
        let wpb = if bits == 3 { 80 } else { 64 };
        let bytes = (n * k / wpb * 34) as u64;
        let Some(b) = launch::pn_batch(bits, t, n, k) else {
            p.weight_bytes += bytes * t as u64;
            p.seconds += (bytes * t as u64) as f64 / (bw * 1e9);
            p.launches += t as u64;
            continue;
        };
        let warps = b.launch.threads as usize / 32;
        let groups = n.div_ceil(warps) as u64;
        p.weight_bytes += bytes;
        p.x_l2_bytes += groups * (t * k * 2) as u64;
        let pairs = (n * k / (2 * wpb)) as f64;
        let alu = pairs * pair_ops(bits, t) / P100_LANE_OPS * (32 / b.xp) as f64;
        p.alu_seconds += alu;
        p.seconds += alu.max(bytes as f64 / (bw * 1e9));
        p.launches += 1;
    }
    p
}

/// Runs the batch kernel in the emulator at a 27B row length (ffn_down, K = 17408: x in
/// K-chunks) for the verify's rows and checks the formulas above: weight footprint = the
/// tensor, x bytes = row groups x t x K x 2. Returns the line to print.
pub fn check_batch_against_emulator(t: usize) -> Result<String, Box<dyn std::error::Error>> {
    let (n, k) = (16usize, 17408usize);
    let mut next = crate::traffic::uniform(7);
    let wf: Vec<f32> = (0..n * k).map(|_| next()).collect();
    let w = pn_format::quantize_rows(pn_format::PnType::Pn4t, &wf, k, 1)?;
    let x: Vec<f32> = (0..t * k).map(|_| next()).collect();
    let (xh, e) = emu::pn_prepare_rows(&x, t, k)?;
    let b = launch::pn_batch(4, t, n, k).ok_or("no batch launch for ffn_down")?;
    let mut y = vec![0f32; t * n];
    let s = emu::pn_gemv_batch(&b, &w, (&xh, &e), &mut y, n, k)?;
    let groups = n.div_ceil(b.launch.threads as usize / 32) as u64;
    let x_formula = groups * (t * k * 2) as u64;
    if s.unique_bytes(region::WEIGHT) != w.len() as u64
        || s.g_bytes[region::WEIGHT] != w.len() as u64
    {
        return Err(format!(
            "{}: weight footprint {} / requested {}, tensor {}",
            b.launch.kernel,
            s.unique_bytes(region::WEIGHT),
            s.g_bytes[region::WEIGHT],
            w.len()
        )
        .into());
    }
    if s.g_bytes[region::X] != x_formula {
        return Err(format!(
            "{}: x bytes {} vs formula {x_formula}",
            b.launch.kernel,
            s.g_bytes[region::X]
        )
        .into());
    }
    Ok(format!(
        "  {:<18} {n:>3} x {k:<5} t {t}: weight footprint {} B = requested = formula (each pair once for {t} rows); x from L2 {} B = formula; weight sectors {:.3}x min; smem conflict degree {:.2}; x chunk {} pairs",
        b.launch.kernel,
        w.len(),
        s.g_bytes[region::X],
        s.sector_ratio(region::WEIGHT),
        s.smem_max_degree,
        b.xp
    ))
}
