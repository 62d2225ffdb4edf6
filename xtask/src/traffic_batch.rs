//! The small-batch half of `cargo xtask traffic`: the MTP verify pass (1 + draft rows) through
//! the small-batch PN GEMV (`pn*_gemv_h2p_b*`) and the small-batch Q4_K / Q8_0 GEMVs
//! (`q4_k_gemv_b*`, `q8_0_gemv_b*`: the LM head and the GDN alpha/beta), checked against the
//! emulator, with their DRAM bytes, the L2 traffic of their chunked x staging, and ALU bounds
//! (the kernels do T times the per-row arithmetic per weight byte, so from a few rows on they
//! stop being bandwidth-bound).

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
    /// Bytes of staged x read from L2 (once per `groups` row groups of a block).
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
        p.weight_bytes += bytes;
        p.x_l2_bytes += b.x_l2_bytes(n, k);
        let pairs = (n * k / (2 * wpb)) as f64;
        let alu = pairs * pair_ops(bits, t) / P100_LANE_OPS * (32 / b.xp) as f64;
        p.alu_seconds += alu;
        p.seconds += alu.max(bytes as f64 / (bw * 1e9));
        p.launches += 1;
    }
    p
}

/// Runs the batch kernel in the emulator at a 27B row length (ffn_down, K = 17408: x in
/// K-chunks) for the verify's rows, with 2 row groups per staged x (5 row groups: the last set
/// partial), and checks the formulas above: weight footprint = the tensor, x bytes = sets of
/// row groups x t x K x 2 ([`launch::BatchLaunch::x_l2_bytes`]). Returns the line to print.
pub fn check_batch_against_emulator(t: usize) -> Result<String, Box<dyn std::error::Error>> {
    let (n, k) = (40usize, 17408usize);
    let mut next = crate::traffic::uniform(7);
    let wf: Vec<f32> = (0..n * k).map(|_| next()).collect();
    let w = pn_format::quantize_rows(pn_format::PnType::Pn4t, &wf, k, 1)?;
    let x: Vec<f32> = (0..t * k).map(|_| next()).collect();
    let (xh, e) = emu::pn_prepare_rows(&x, t, k)?;
    let mut b = launch::pn_batch(4, t, n, k).ok_or("no batch launch for ffn_down")?;
    b.groups = 2;
    let mut y = vec![0f32; t * n];
    let s = emu::pn_gemv_batch(&b, &w, (&xh, &e), &mut y, n, k)?;
    let x_formula = b.x_l2_bytes(n, k);
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
        "  {:<18} {n:>3} x {k:<5} t {t}: weight footprint {} B = requested = formula (each pair once for {t} rows); x from L2 {} B = formula ({} row groups per staging); weight sectors {:.3}x min; smem conflict degree {:.2}; x chunk {} pairs",
        b.launch.kernel,
        w.len(),
        s.g_bytes[region::X],
        b.groups,
        s.sector_ratio(region::WEIGHT),
        s.smem_max_degree,
        b.xp
    ))
}

/// Per-lane ALU ops of one Q4_K super-block for `t` activation rows, counted from the kernel's
/// source (q4k_lane.cuh as `q4_k_gemv_b<t>` runs it), every op one issue slot: once per
/// super-block the 5 loads and their addresses (8), the two f16 scales (3), the branch-free
/// scale/min picks of two sub-blocks (28) and the exact float forms of them and of the 8 codes
/// (32), plus the loop (3); per activation row 2 shared float4 loads, 8 products, 6 sums of x,
/// the scale/min combination (6) and the accumulate. One row (`t` = 1) is the single-row
/// kernel.
pub fn q4k_sb_lane_ops(t: usize) -> f64 {
    74.0 + 23.0 * t as f64
}

/// Per-lane ALU ops of one Q8_0 block (34 bytes) for `t` rows (`q8_0_gemv_b<t>`): 32 code
/// loads and conversions, then per row 32 x loads and products, and the scale.
pub fn q8_0_block_lane_ops(t: usize) -> f64 {
    2.0 * 32.0 + t as f64 * (2.0 * 32.0 + 2.0)
}

/// The stock (non-PN) matrices of one verify pass of `t` rows.
#[derive(Default, Debug)]
pub struct StockPass {
    /// Bytes of the matrices the small-batch Q4_K / Q8_0 kernels take (read once).
    pub batched_bytes: u64,
    /// Those bytes that are the LM head (`output.weight`).
    pub head_bytes: u64,
    /// Bytes of staged x the Q4_K kernel reads from L2 (once per tile of weight rows).
    pub x_l2_bytes: u64,
    /// Seconds of the batched matrices: per matrix the larger of bandwidth and ALU bound.
    pub seconds: f64,
    /// Their ALU bound alone, seconds.
    pub alu_seconds: f64,
    /// The ALU bound of the same matrices run one single-row GEMV per activation row (the
    /// dispatch before the batch kernels), seconds.
    pub alu_seconds_per_row: f64,
}

/// The Q4_K and Q8_0 matrices of `plan` (name, dims [k, n], type) through the small-batch
/// kernels for `t` rows at `bw` GB/s. Other stock matrices are left to the caller (one GEMV per
/// row: their bytes count `t` times).
pub fn stock_pass(plan: &[(String, Vec<u64>, GgmlType)], t: usize, bw: f64) -> StockPass {
    let mut p = StockPass::default();
    for (name, dims, ty) in plan {
        if dims.len() != 2 {
            continue;
        }
        let (k, n) = (dims[0] as usize, dims[1] as usize);
        let (bytes, alu, alu1, x_l2) = match ty {
            GgmlType::Q4K if launch::q4_k_batch(t, n, k).is_some() => {
                let sbs = (n * k / 256) as f64;
                (
                    n * k / 256 * 144,
                    sbs * 32.0 * q4k_sb_lane_ops(t),
                    t as f64 * sbs * 32.0 * q4k_sb_lane_ops(1),
                    launch::q4_k_batch_x_bytes(t, n, k),
                )
            }
            GgmlType::Q8_0 if launch::q8_0_batch(t, n, k).is_some() => {
                let blocks = (n * k / 32) as f64;
                (
                    n * k / 32 * 34,
                    blocks * q8_0_block_lane_ops(t),
                    t as f64 * blocks * q8_0_block_lane_ops(1),
                    0,
                )
            }
            _ => continue,
        };
        let bytes = bytes as u64;
        p.batched_bytes += bytes;
        if name == "output.weight" {
            p.head_bytes += bytes;
        }
        p.x_l2_bytes += x_l2;
        let alu = alu / P100_LANE_OPS;
        p.alu_seconds += alu;
        p.alu_seconds_per_row += alu1 / P100_LANE_OPS;
        p.seconds += alu.max(bytes as f64 / (bw * 1e9));
    }
    p
}

/// Runs `q4_k_gemv_b<t>` in the emulator at the LM head's row length (K = 5120) with reduced
/// rows (two tiles on one block) and checks the formulas above: weight footprint = the tensor,
/// requests those of one single-row pass (each byte once for all `t` rows), x from L2 = tiles
/// x t x K x 4. Returns the line to print.
pub fn check_head_against_emulator(t: usize) -> Result<String, Box<dyn std::error::Error>> {
    let k = 5120usize;
    let n = 2 * 8 * launch::q4_k_batch_rows(t) + 3;
    let mut next = crate::traffic::uniform(11);
    let wf: Vec<f32> = (0..n * k).map(|_| next()).collect();
    let mut w = Vec::new();
    gguf_io::quants::quantize_row(GgmlType::Q4K, &wf, &mut w)?;
    let x: Vec<f32> = (0..t * k).map(|_| next()).collect();
    let mut b = launch::q4_k_batch(t, n, k).ok_or("no q4_K batch launch for the head")?;
    b.launch.grid = 1;
    let mut y = vec![0f32; t * n];
    let s = emu::quant_gemv_batch(emu::StockType::Q4K, &b, &w, &x, &mut y, (n, k))?;
    let x_formula = launch::q4_k_batch_x_bytes(t, n, k);
    let wlen = w.len() as u64;
    // One single-row pass's requests: per super-block 32 lanes x 5 words (4 of them broadcasts).
    let one_pass = (n * k / 256 * 32 * 20) as u64;
    if s.unique_bytes(region::WEIGHT) != wlen
        || s.g_bytes[region::WEIGHT] != one_pass
        || s.g_bytes[region::X] != x_formula
    {
        return Err(format!(
            "{}: weight footprint {} / requested {} (one pass {one_pass}), tensor {wlen}; x {} vs formula {x_formula}",
            b.launch.kernel,
            s.unique_bytes(region::WEIGHT),
            s.g_bytes[region::WEIGHT],
            s.g_bytes[region::X]
        )
        .into());
    }
    Ok(format!(
        "  {:<18} {n:>3} x {k:<5} t {t}: weight footprint {wlen} B = formula, requested as one single-row pass (each byte once for {t} rows); x from L2 {} B = formula (once per {} rows); weight sectors {:.3}x min; smem conflict degree {:.2}",
        b.launch.kernel,
        s.g_bytes[region::X],
        8 * launch::q4_k_batch_rows(t),
        s.sector_ratio(region::WEIGHT),
        s.smem_max_degree
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The verify's stock matrices at the 27B plan: the Q4_K head and the 96 q8_0 alpha/beta
    /// matrices read once for the 3 rows, the head's x from L2 once per 80 rows, and fewer ALU
    /// ops than three single-row GEMVs; the emulator agrees with the formulas.
    #[test]
    fn the_traffic_model_reads_the_verify_head_once() {
        let plan = crate::synth_model::planned_27b().unwrap();
        let sp = stock_pass(&plan, 3, 732.0);
        let head = 248_320u64 * 5120 / 256 * 144;
        assert_eq!(sp.head_bytes, head);
        assert!(sp.batched_bytes > head, "{sp:?}");
        assert_eq!(sp.x_l2_bytes, 248_320u64.div_ceil(80) * 3 * 5120 * 4);
        assert!(sp.alu_seconds < 0.6 * sp.alu_seconds_per_row, "{sp:?}");
        assert!(sp.seconds >= sp.alu_seconds, "{sp:?}");
        let line = check_head_against_emulator(3).unwrap();
        assert!(line.contains("q4_k_gemv_b3"), "{line}");
    }
}
