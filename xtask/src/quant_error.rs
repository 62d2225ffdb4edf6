//! `cargo xtask quant-error FILE`: per-tensor relative squared error of the 3- and 4-bit
//! candidate types (pn3t/pn4t with and without the Hadamard rotation, Q3_K, Q4_K) on the
//! weights of any GGUF, so the format question of issue #5 can be asked of real trained
//! weights, not only of the demo model.
//!
//! The source tensors are decoded to f32 first; a source that is itself quantized (Q8_0, Q6_K)
//! carries its own small error, which the table's `src` column names so it is not forgotten.
//! Rows are sampled evenly (at most `--max-rows` per tensor). A type whose block does not
//! divide the row length is measured on runs of consecutive rows joined end to end, the
//! shortest run that is a whole number of blocks (marked `*`): every weight is still quantized
//! exactly once, only a block may straddle two rows.

use clap::Parser;
use gguf_io::{GgmlType, GgufFile};
use pn_format::PnType;
use std::path::PathBuf;

/// Options of `cargo xtask quant-error`.
#[derive(Parser)]
pub struct Args {
    /// The GGUF whose 2-D tensors are measured.
    file: PathBuf,
    /// Only tensors whose name contains one of these (all 2-D tensors when absent).
    #[arg(long = "tensor")]
    tensors: Vec<String>,
    /// At most this many rows per tensor, spread evenly over the tensor.
    #[arg(long, default_value_t = 2048)]
    max_rows: usize,
    /// Rotation block size for the rotated PN columns (default: the largest power of two up to
    /// 256 that divides the row length, as `pn quantize` picks it).
    #[arg(long)]
    rotation_block: Option<usize>,
}

/// One candidate encoding.
#[derive(Clone, Copy)]
enum Codec {
    Pn(PnType, bool),
    Ggml(GgmlType),
}

impl Codec {
    const ALL: [Codec; 6] = [
        Codec::Pn(PnType::Pn3t, true),
        Codec::Pn(PnType::Pn3t, false),
        Codec::Ggml(GgmlType::Q3K),
        Codec::Pn(PnType::Pn4t, true),
        Codec::Pn(PnType::Pn4t, false),
        Codec::Ggml(GgmlType::Q4K),
    ];

    fn header(self) -> &'static str {
        match self {
            Codec::Pn(PnType::Pn3t, true) => "pn3t rot",
            Codec::Pn(PnType::Pn3t, false) => "pn3t",
            Codec::Pn(PnType::Pn4t, true) => "pn4t rot",
            Codec::Pn(PnType::Pn4t, false) => "pn4t",
            Codec::Ggml(t) => t.gguf_py_name(),
        }
    }

    fn block(self) -> usize {
        match self {
            Codec::Pn(PnType::Pn3t, _) => 80,
            Codec::Pn(PnType::Pn4t, _) => 64,
            Codec::Ggml(t) => t.block_size(),
        }
    }

    /// Quantizes and decodes `x` (a whole number of blocks) into `out`.
    fn round_trip(self, x: &[f32], out: &mut [f32]) -> Result<(), Box<dyn std::error::Error>> {
        match self {
            Codec::Pn(ty, _) => {
                let q = pn_format::quantize_row_ref(ty, x)?;
                pn_format::dequantize_row(ty, &q, out)?;
            }
            Codec::Ggml(ty) => {
                let mut q = Vec::new();
                gguf_io::quants::quantize_row(ty, x, &mut q)?;
                gguf_io::quants::dequantize_row(ty, &q, out)?;
            }
        }
        Ok(())
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The default rotation block of `pn quantize` for a row length `k`.
fn default_rotation(k: usize) -> usize {
    let mut r = 1;
    while r < 256 && k.is_multiple_of(r * 2) {
        r *= 2;
    }
    r
}

/// Relative squared error `||w - Q(w)||^2 / ||w||^2` of `codec` over `rows` (each `k` long).
fn rel_error(
    codec: Codec,
    rows: &[f32],
    k: usize,
    r: usize,
) -> Result<(f64, bool), Box<dyn std::error::Error>> {
    let mut w = rows.to_vec();
    if let Codec::Pn(_, true) = codec {
        // Orthonormal, so the error is the same measured before or after the rotation.
        pn_format::hadamard::rotate_rows(&mut w, k, r)?;
    }
    let b = codec.block();
    // The shortest run of rows that is a whole number of blocks.
    let run_rows = b / gcd(k, b);
    let run = run_rows * k;
    let usable = w.len() / run * run;
    if usable == 0 {
        return Err(format!("fewer than {run_rows} rows sampled").into());
    }
    let mut out = vec![0f32; run];
    let (mut e2, mut w2) = (0f64, 0f64);
    for chunk in w[..usable].chunks_exact(run) {
        codec.round_trip(chunk, &mut out)?;
        for (a, q) in chunk.iter().zip(&out) {
            e2 += f64::from(a - q).powi(2);
            w2 += f64::from(*a).powi(2);
        }
    }
    Ok((e2 / w2.max(f64::MIN_POSITIVE), run_rows > 1))
}

/// Runs the measurement and prints the table.
pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let file = GgufFile::open(&args.file)?;
    print!(
        "{:<28} {:>6} {:>7} {:>6} {:>4}",
        "tensor", "src", "K", "rows", "R"
    );
    for c in Codec::ALL {
        print!(" {:>10}", c.header());
    }
    println!();
    let mut sums = [0f64; 6];
    let mut count = 0usize;
    for t in file.tensors() {
        if t.dims.len() != 2 || t.ty.is_pn() {
            continue;
        }
        if !args.tensors.is_empty() && !args.tensors.iter().any(|s| t.name.contains(s)) {
            continue;
        }
        let k = t.row_len() as usize;
        let n = t.n_rows() as usize;
        let take = n.min(args.max_rows.max(1));
        let mut rows = vec![0f32; take * k];
        for (j, dst) in rows.chunks_exact_mut(k).enumerate() {
            let i = j * n / take;
            let src = t
                .row(i)
                .ok_or_else(|| format!("{}: row {i} missing", t.name))?;
            gguf_io::quants::dequantize_row(t.ty, src, dst)
                .map_err(|e| format!("{}: cannot decode {}: {e}", t.name, t.ty.name()))?;
        }
        let r = args.rotation_block.unwrap_or_else(|| default_rotation(k));
        if !k.is_multiple_of(r) {
            return Err(format!("{}: K = {k} is not a multiple of R = {r}", t.name).into());
        }
        print!(
            "{:<28} {:>6} {:>7} {:>6} {:>4}",
            t.name,
            t.ty.name(),
            k,
            take,
            r
        );
        for (c, sum) in Codec::ALL.into_iter().zip(sums.iter_mut()) {
            let (e, joined) = rel_error(c, &rows, k, r)?;
            *sum += e;
            print!(" {:>9.5}{}", e, if joined { '*' } else { ' ' });
        }
        println!();
        count += 1;
    }
    if count == 0 {
        return Err("no 2-D tensor matched".into());
    }
    print!("{:<28} {:>6} {:>7} {:>6} {:>4}", "mean", "", "", "", "");
    for s in sums {
        print!(" {:>9.5} ", s / count as f64);
    }
    println!();
    println!("relative squared error ||W - Q(W)||^2 / ||W||^2; * = rows joined end to end (block does not divide K)");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic, roughly Gaussian rows (sum of uniforms) with a few outlier columns, the
    /// shape of trained weights the rotation is meant for.
    fn rows(n: usize, k: usize) -> Vec<f32> {
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut u = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f32 / (1u64 << 53) as f32 - 0.5
        };
        (0..n * k)
            .map(|i| {
                let g = (0..4).map(|_| u()).sum::<f32>();
                if i % k == 7 {
                    g * 20.0
                } else {
                    g
                }
            })
            .collect()
    }

    #[test]
    fn more_bits_less_error_and_rotation_spreads_outliers() {
        let (n, k) = (64, 640);
        let w = rows(n, k);
        let r = default_rotation(k);
        assert_eq!(r, 128);
        let e = |c| rel_error(c, &w, k, r).unwrap();
        let (pn3r, j3) = e(Codec::Pn(PnType::Pn3t, true));
        let (pn3, _) = e(Codec::Pn(PnType::Pn3t, false));
        let (pn4r, j4) = e(Codec::Pn(PnType::Pn4t, true));
        let (q3k, jq3) = e(Codec::Ggml(GgmlType::Q3K));
        let (q4k, _) = e(Codec::Ggml(GgmlType::Q4K));
        // 640 = 8 x 80 = 10 x 64 but 2.5 x 256: only the K-quants need joined rows.
        assert!(!j3 && !j4 && jq3);
        assert!(pn4r < pn3r / 2.0, "{pn4r} {pn3r}");
        assert!(q4k < q3k / 2.0, "{q4k} {q3k}");
        // One scale per 80 weights cannot follow an outlier column; the rotation spreads it.
        assert!(pn3r < pn3, "rotated {pn3r} unrotated {pn3}");
        for x in [pn3r, pn3, pn4r, q3k, q4k] {
            assert!(x > 0.0 && x < 0.1, "{x}");
        }
    }

    #[test]
    fn too_few_rows_for_a_joined_run_is_an_error() {
        // K = 100 needs 64 rows (6400 = 25 x 256) joined for Q3_K.
        let w = rows(4, 100);
        assert!(rel_error(Codec::Ggml(GgmlType::Q3K), &w, 100, 4).is_err());
        assert!(rel_error(Codec::Pn(PnType::Pn3t, false), &w, 100, 4).is_ok());
    }
}
