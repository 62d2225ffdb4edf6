//! `pn perplexity`: perplexity of a model on a text or token file, optionally the KL divergence
//! from another model's saved logits.
//!
//! The tokens are cut into non-overlapping windows of `-c` tokens; each window is evaluated from
//! an empty state and every position but the last of a window predicts the next token.

use crate::engine_args::{self, ModelArgs};
use pn_runtime::sampling::argmax;
use std::path::{Path, PathBuf};

/// Measure perplexity (and KL against a base model's logits).
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text file to score (tokenized with the model's tokenizer).
    #[arg(
        short = 'f',
        long = "file",
        conflicts_with = "tokens",
        required_unless_present = "tokens"
    )]
    pub file: Option<PathBuf>,
    /// JSON token file: `{"tokens": [...]}` or a bare array of ids.
    #[arg(long = "tokens")]
    pub tokens: Option<PathBuf>,
    /// KL divergence against another model's logits for the same tokens: raw little-endian
    /// f32, `[n_tokens, vocab]`, row t = logits after token t (as `pn logits` writes), computed
    /// with the same windows (one window: the whole sequence from an empty state).
    #[arg(long = "kl-base")]
    pub kl_base: Option<PathBuf>,
}

fn read_tokens(path: &Path) -> Result<Vec<u32>, Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read token file {}: {e}", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{} is not JSON: {e}", path.display()))?;
    let arr = v.get("tokens").unwrap_or(&v);
    let arr = arr.as_array().ok_or_else(|| {
        format!(
            "{}: expected {{\"tokens\": [...]}} or an array",
            path.display()
        )
    })?;
    arr.iter()
        .enumerate()
        .map(|(i, x)| {
            x.as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .ok_or_else(|| {
                    format!("{}: token {i} is not a token id: {x}", path.display()).into()
                })
        })
        .collect()
}

fn read_logits(path: &Path, expected: usize) -> Result<Vec<f32>, Box<dyn std::error::Error>> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if bytes.len() != expected * 4 {
        return Err(format!(
            "{} holds {} bytes, expected {} (n_tokens x vocab f32)",
            path.display(),
            bytes.len(),
            expected * 4
        )
        .into());
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

/// log-softmax of one row, in f64.
fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = row
        .iter()
        .map(|&x| (x as f64 - max).exp())
        .sum::<f64>()
        .ln()
        + max;
    row.iter().map(|&x| x as f64 - lse).collect()
}

/// Runs the subcommand.
pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let tokens = match (&args.tokens, &args.file) {
        (Some(t), _) => Some(read_tokens(t)?),
        _ => None,
    };
    let mut model_args = args.model.clone();
    let window_hint = tokens.as_ref().map_or(512, |t| t.len().min(512));
    if model_args.ctx_size == 0 {
        model_args.ctx_size = window_hint.max(2);
    }
    let engine = engine_args::load_engine(&model_args, false)?;
    let tokens = match (tokens, &args.file) {
        (Some(t), _) => t,
        (None, Some(f)) => {
            let text = std::fs::read_to_string(f)
                .map_err(|e| format!("cannot read {}: {e}", f.display()))?;
            engine.tokenizer().encode(&text)?
        }
        (None, None) => return Err("give -f TEXT or --tokens FILE.json".into()),
    };
    if tokens.len() < 2 {
        return Err(format!("need at least 2 tokens to score, got {}", tokens.len()).into());
    }
    let window = engine.context().max(2);
    let vocab = engine.config().vocab;
    let base = match &args.kl_base {
        Some(p) => Some(read_logits(p, tokens.len() * vocab)?),
        None => None,
    };

    let mut session = engine.session()?;
    let (mut nll, mut scored, mut correct) = (0.0f64, 0usize, 0usize);
    let mut kls: Vec<f64> = Vec::new();
    let mut agree = 0usize;
    let n_windows = tokens.len().div_ceil(window);
    for (w, chunk) in tokens.chunks(window).enumerate() {
        if chunk.len() < 2 && base.is_none() {
            continue;
        }
        session.reset()?;
        let logits = session.feed_all_logits(chunk)?;
        for (i, row) in logits.chunks_exact(vocab).enumerate() {
            if let Some(&next) = chunk.get(i + 1) {
                let lp = log_softmax(row);
                nll -= lp[next as usize];
                scored += 1;
                correct += usize::from(argmax(row) == Some(next));
            }
            if let Some(base) = &base {
                let g = w * window + i;
                let brow = &base[g * vocab..(g + 1) * vocab];
                let (lp, lq) = (log_softmax(brow), log_softmax(row));
                let kl: f64 = lp.iter().zip(&lq).map(|(&p, &q)| p.exp() * (p - q)).sum();
                kls.push(kl.max(0.0));
                agree += usize::from(argmax(brow) == argmax(row));
            }
        }
        if engine_args::interactive() {
            eprint!(
                "\r[{}/{}] ppl so far {:.4}",
                w + 1,
                n_windows,
                (nll / scored.max(1) as f64).exp()
            );
        }
    }
    if engine_args::interactive() {
        eprintln!();
    }
    let ce = nll / scored.max(1) as f64;
    println!(
        "perplexity: {:.4} (cross-entropy {:.4} nats/token over {scored} predictions, {n_windows} window(s) of up to {window} tokens)",
        ce.exp(),
        ce
    );
    println!(
        "top-1 accuracy: {:.4}",
        correct as f64 / scored.max(1) as f64
    );
    if !kls.is_empty() {
        let mean = kls.iter().sum::<f64>() / kls.len() as f64;
        let mut sorted = kls.clone();
        sorted.sort_by(f64::total_cmp);
        let p99 = sorted[((sorted.len() as f64 * 0.99).ceil() as usize).clamp(1, sorted.len()) - 1];
        println!(
            "KL(base || model): mean {mean:.6}, p99 {p99:.6}, max {:.6} nats over {} rows; top-1 agreement {:.4}",
            sorted[sorted.len() - 1],
            kls.len(),
            agree as f64 / kls.len() as f64
        );
    }
    Ok(())
}
