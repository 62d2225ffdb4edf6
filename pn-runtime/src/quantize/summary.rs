//! What a quantization run produced: sizes and bits per weight per tensor class, and per-tensor
//! relative errors for the quality report.

use super::codec::ErrStats;
use super::fallback::FallbackChoice;
use super::mix::Role;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The result for one tensor.
#[derive(Clone, Debug)]
pub struct TensorResult {
    /// Tensor name.
    pub name: String,
    /// Its role.
    pub role: Role,
    /// The intended type's name (`pn3t`, `q3_K`, ...).
    pub ty: &'static str,
    /// True if stored as an F32 stand-in of `ty` (the type's block does not divide K).
    pub simulated: bool,
    /// The measured real fallback, when the mix's K-quant could not tile K (`ty` is then the
    /// chosen type).
    pub fallback: Option<FallbackChoice>,
    /// True if promoted from pn3t to pn4t.
    pub promoted: bool,
    /// Weights.
    pub params: u64,
    /// Bytes written.
    pub bytes: u64,
    /// Bytes the intended type takes (differs from `bytes` only when simulated).
    pub nominal_bytes: u64,
    /// Error sums (rotated and, with `--report`, unrotated).
    pub stats: ErrStats,
}

/// The result of a whole run.
#[derive(Clone, Debug)]
pub struct QuantizeSummary {
    /// The mix name written to `pn.mix`.
    pub mix: String,
    /// The rotation block size (`None`: not rotated).
    pub rotation: Option<usize>,
    /// Promoted tensor names, worst first.
    pub promoted: Vec<String>,
    /// Per tensor, in file order.
    pub tensors: Vec<TensorResult>,
    /// Input file size in bytes.
    pub in_bytes: u64,
    /// Output file size in bytes.
    pub out_bytes: u64,
    /// Wall time of the whole run.
    pub seconds: f64,
    /// True if the per-tensor unrotated errors were measured.
    pub report: bool,
}

impl QuantizeSummary {
    /// Bits per weight over all tensors, using the intended types' sizes.
    pub fn bpw(&self) -> f64 {
        let (p, b) = self.tensors.iter().fold((0u64, 0u64), |(p, b), t| {
            (p + t.params, b + t.nominal_bytes)
        });
        if p == 0 {
            0.0
        } else {
            b as f64 * 8.0 / p as f64
        }
    }

    /// Input megabytes per second.
    pub fn throughput_mb_s(&self) -> f64 {
        if self.seconds > 0.0 {
            self.in_bytes as f64 / 1e6 / self.seconds
        } else {
            0.0
        }
    }

    /// The size table: per role, then per type, then the total.
    pub fn size_table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<48} {:>5} {:>14} {:>14} {:>7}  types",
            "class", "n", "weights", "bytes", "bpw"
        );
        for role in Role::ALL {
            let ts: Vec<&TensorResult> = self.tensors.iter().filter(|t| t.role == role).collect();
            if ts.is_empty() {
                continue;
            }
            let p: u64 = ts.iter().map(|t| t.params).sum();
            let b: u64 = ts.iter().map(|t| t.nominal_bytes).sum();
            let mut types: BTreeMap<String, usize> = BTreeMap::new();
            for t in &ts {
                let label = if t.simulated {
                    format!("{} (simulated as f32)", t.ty)
                } else if let Some(f) = &t.fallback {
                    format!("{} (for {})", t.ty, f.intended.name())
                } else {
                    t.ty.to_string()
                };
                *types.entry(label).or_default() += 1;
            }
            let types: Vec<String> = types.iter().map(|(k, v)| format!("{v}x {k}")).collect();
            let _ = writeln!(
                s,
                "{:<48} {:>5} {:>14} {:>14} {:>7.3}  {}",
                role.label(),
                ts.len(),
                p,
                b,
                b as f64 * 8.0 / p.max(1) as f64,
                types.join(", ")
            );
        }
        let p: u64 = self.tensors.iter().map(|t| t.params).sum();
        let b: u64 = self.tensors.iter().map(|t| t.nominal_bytes).sum();
        let _ = writeln!(
            s,
            "{:<48} {:>5} {:>14} {:>14} {:>7.3}",
            "total (tensor data)",
            self.tensors.len(),
            p,
            b,
            self.bpw()
        );
        let _ = writeln!(
            s,
            "file: {} bytes ({:.3} GB); mix {}; rotation {}; {} promoted; {:.1} s, {:.1} MB/s of input",
            self.out_bytes,
            self.out_bytes as f64 / 1e9,
            self.mix,
            self.rotation
                .map(|r| format!("hadamard R={r}"))
                .unwrap_or_else(|| "none".into()),
            self.promoted.len(),
            self.seconds,
            self.throughput_mb_s()
        );
        if self.tensors.iter().any(|t| t.simulated) {
            let _ = writeln!(
                s,
                "note: 'simulated' tensors have a K that the stock type's 256-weight block does not divide;\n      they are stored as F32 values of the zero-padded quantization (quality stand-in), and\n      sizes above count the intended type."
            );
        }
        s
    }

    /// One line per fallback decision: the K-quant asked for and its error on the padded rows,
    /// every candidate tried with its error, and the type written. Empty when there were none.
    pub fn fallback_table(&self) -> String {
        let mut s = String::new();
        for t in &self.tensors {
            let Some(f) = &t.fallback else { continue };
            let tried: Vec<String> = f
                .tried
                .iter()
                .map(|(ty, rel)| format!("{} {:.4e}", ty.name(), rel))
                .collect();
            let _ = writeln!(
                s,
                "fallback {}: {} cannot tile K (rel_err {:.4e} on padded rows); tried {}; wrote {}",
                t.name,
                f.intended.name(),
                f.intended_rel,
                tried.join(", "),
                f.chosen.ggml().name()
            );
        }
        s
    }

    /// The per-tensor error table of `--report`.
    pub fn report_table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<40} {:>6} {:>12} {:>12} {:>7} {:>12}",
            "tensor", "type", "rel_err", "rel_err_norot", "gain", "weighted"
        );
        for t in &self.tensors {
            if t.role == Role::Vector {
                continue;
            }
            let rot = t.stats.rel();
            let norot = t.stats.rel_unrotated();
            let gain = if rot > 0.0 { norot / rot } else { 0.0 };
            let weighted = if t.stats.w2_weighted > 0.0 {
                format!("{:.4e}", t.stats.rel_weighted())
            } else {
                "-".into()
            };
            let _ = writeln!(
                s,
                "{:<40} {:>6} {:>12.4e} {:>12.4e} {:>7.3} {:>12}{}",
                t.name,
                t.ty,
                rot,
                norot,
                gain,
                weighted,
                if t.promoted { "  promoted" } else { "" }
            );
        }
        let ranking = self.weighted_ranking();
        if !ranking.is_empty() {
            let _ = writeln!(
                s,
                "\nranking by Hessian-weighted error tr(E H E^T) / tr(W H W^T) on the calibration inputs, worst first:"
            );
            for (i, (name, ty, rel)) in ranking.iter().enumerate() {
                let _ = writeln!(s, "{:>4} {:<40} {:>6} {:.4e}", i + 1, name, ty, rel);
            }
        }
        s
    }

    /// The tensors with a Hessian-weighted error (GPTQ with `--report`), worst first: (name,
    /// type, `tr(E H E^T) / tr(W H W^T)`). Ties go to the name.
    pub fn weighted_ranking(&self) -> Vec<(String, &'static str, f64)> {
        let mut v: Vec<(String, &'static str, f64)> = self
            .tensors
            .iter()
            .filter(|t| t.stats.w2_weighted > 0.0)
            .map(|t| (t.name.clone(), t.ty, t.stats.rel_weighted()))
            .collect();
        v.sort_by(|a, b| b.2.total_cmp(&a.2).then_with(|| a.0.cmp(&b.0)));
        v
    }
}
