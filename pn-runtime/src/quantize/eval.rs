//! Model-level quality: run two models on the same tokens and compare their next-token
//! distributions (mean / p99 KL divergence, top-1 agreement), plus each one's perplexity on the
//! tokens themselves, like llama-perplexity's KL mode.

use crate::sampling::argmax;
use qwen_model::{CpuBackend, Model, Outputs};
use std::path::Path;

/// Logits of every position of `tokens` (one forward pass from an empty state), `[n, vocab]`.
pub fn model_logits(
    path: &Path,
    tokens: &[u32],
    threads: usize,
) -> Result<(Vec<f32>, usize), qwen_model::ModelError> {
    let model = Model::load(path, CpuBackend::new(threads))?;
    let vocab = model.config.vocab;
    let mut state = model.new_state(tokens.len())?;
    let mut ws = model.new_workspace(tokens.len().clamp(1, 64))?;
    let mut logits = vec![0f32; tokens.len() * vocab];
    model.forward(
        &mut state,
        &mut ws,
        tokens,
        Outputs::all_logits(&mut logits),
    )?;
    Ok((logits, vocab))
}

/// The comparison of two logit sets over the same positions.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KlStats {
    /// Positions compared.
    pub n: usize,
    /// Mean `KL(base || quant)` in nats.
    pub mean_kl: f64,
    /// 99th percentile of the per-position KL.
    pub p99_kl: f64,
    /// Largest per-position KL.
    pub max_kl: f64,
    /// Fraction of positions where both argmaxes agree.
    pub top1: f64,
    /// Perplexity of the base model on the next tokens (NaN without tokens).
    pub ppl_base: f64,
    /// Perplexity of the quantized model on the next tokens.
    pub ppl_quant: f64,
}

/// log-softmax of one row in f64.
fn log_softmax(row: &[f32]) -> Vec<f64> {
    let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let lse = row.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln() + m;
    row.iter().map(|&v| v as f64 - lse).collect()
}

/// Compares `[n, vocab]` logits. With `tokens` (the sequence the logits were computed on),
/// also the perplexity of each model on `tokens[1..]` (row t predicts token t+1).
pub fn compare_logits(
    base: &[f32],
    quant: &[f32],
    vocab: usize,
    tokens: Option<&[u32]>,
) -> KlStats {
    let n = base.len().min(quant.len()) / vocab.max(1);
    let mut kls = Vec::with_capacity(n);
    let mut agree = 0usize;
    let (mut nll_b, mut nll_q, mut scored) = (0f64, 0f64, 0usize);
    for t in 0..n {
        let b = &base[t * vocab..(t + 1) * vocab];
        let q = &quant[t * vocab..(t + 1) * vocab];
        let lb = log_softmax(b);
        let lq = log_softmax(q);
        let kl: f64 = lb.iter().zip(&lq).map(|(&x, &y)| x.exp() * (x - y)).sum();
        kls.push(kl.max(0.0));
        // Greedy choices agree (rows of finite logits always have one).
        agree += usize::from(argmax(b) == argmax(q));
        if let Some(next) = tokens.and_then(|tk| tk.get(t + 1)) {
            let i = *next as usize;
            if i < vocab {
                nll_b -= lb[i];
                nll_q -= lq[i];
                scored += 1;
            }
        }
    }
    let mean = kls.iter().sum::<f64>() / n.max(1) as f64;
    let mut sorted = kls.clone();
    sorted.sort_by(f64::total_cmp);
    let p99 = if sorted.is_empty() {
        0.0
    } else {
        sorted[((sorted.len() as f64 * 0.99).ceil() as usize).clamp(1, sorted.len()) - 1]
    };
    let ppl = |nll: f64| {
        if scored == 0 {
            f64::NAN
        } else {
            (nll / scored as f64).exp()
        }
    };
    KlStats {
        n,
        mean_kl: mean,
        p99_kl: p99,
        max_kl: sorted.last().copied().unwrap_or(0.0),
        top1: agree as f64 / n.max(1) as f64,
        ppl_base: ppl(nll_b),
        ppl_quant: ppl(nll_q),
    }
}

/// Reads token ids from `{"tokens": [...]}` JSON or from whitespace/comma-separated integers.
pub fn read_tokens(path: &Path) -> Result<Vec<u32>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if text.trim_start().starts_with('{') {
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let arr = v
            .get("tokens")
            .and_then(|t| t.as_array())
            .ok_or_else(|| format!("{}: no \"tokens\" array", path.display()))?;
        arr.iter()
            .enumerate()
            .map(|(i, x)| {
                x.as_u64()
                    .and_then(|u| u32::try_from(u).ok())
                    .ok_or_else(|| format!("{}: token {i} is not a u32: {x}", path.display()))
            })
            .collect()
    } else {
        text.split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == ']')
            .filter(|s| !s.is_empty())
            .enumerate()
            .map(|(i, s)| {
                s.parse::<u32>()
                    .map_err(|_| format!("{}: token {i} {s:?} is not a u32", path.display()))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_logits_have_zero_kl_and_full_agreement() {
        let l: Vec<f32> = (0..40).map(|i| ((i * 7) % 11) as f32 * 0.3).collect();
        let s = compare_logits(&l, &l, 10, Some(&[0, 1, 2, 3]));
        assert_eq!(s.n, 4);
        assert!(s.mean_kl.abs() < 1e-12 && s.p99_kl.abs() < 1e-12);
        assert_eq!(s.top1, 1.0);
        assert!((s.ppl_base - s.ppl_quant).abs() < 1e-12);
    }

    #[test]
    fn kl_matches_a_hand_computed_case() {
        // p = softmax([0, ln 3]) = [1/4, 3/4]; q = [1/2, 1/2].
        let base = [0.0f32, 3f32.ln()];
        let quant = [0.0f32, 0.0];
        let s = compare_logits(&base, &quant, 2, None);
        let expect = 0.25 * (0.25f64 / 0.5).ln() + 0.75 * (0.75f64 / 0.5).ln();
        assert!((s.mean_kl - expect).abs() < 1e-6, "{} {expect}", s.mean_kl);
        assert_eq!(s.top1, 0.0); // argmax 1 vs 0 (first of a tie)
        assert!(s.ppl_base.is_nan());
    }
}
