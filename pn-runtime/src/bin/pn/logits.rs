//! `pn logits -m MODEL --tokens TOKENS.json --out LOGITS.f32 [--mtp-out MTP.f32]`
//!
//! Evaluates the sequence from an empty state and writes every position's logits as raw
//! little-endian f32, `[n_tokens, vocab]` (row t predicts token t+1). With `--mtp-out`, also runs
//! the MTP block in the vLLM/transformers convention: row p takes token x_{p+1} and the trunk's
//! final normed hidden state h_p (RoPE position p+1) and predicts x_{p+2}; `[n_tokens - 1, vocab]`.

use clap::Parser;
use qwen_model::{CpuBackend, Model, Outputs};
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

/// Arguments of `pn logits`.
#[derive(Parser, Debug)]
pub struct Args {
    /// The model (GGUF, architecture qwen35).
    #[arg(short = 'm', long = "model")]
    pub model: PathBuf,
    /// JSON file `{"tokens": [...]}`.
    #[arg(long)]
    pub tokens: PathBuf,
    /// Output file for the logits, raw little-endian f32 `[n_tokens, vocab]`.
    #[arg(long)]
    pub out: PathBuf,
    /// Also write the MTP block's logits, raw f32 `[n_tokens - 1, vocab]`.
    #[arg(long = "mtp-out")]
    pub mtp_out: Option<PathBuf>,
    /// Tokens per prefill step.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// CPU threads (0: all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

fn read_tokens(path: &PathBuf) -> Result<Vec<u32>, Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let arr = v.get("tokens").and_then(|t| t.as_array()).ok_or_else(|| {
        format!(
            "{}: expected an object with a \"tokens\" array",
            path.display()
        )
    })?;
    arr.iter()
        .enumerate()
        .map(|(i, t)| {
            t.as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .ok_or_else(|| format!("{}: tokens[{i}] is not a token id", path.display()).into())
        })
        .collect()
}

fn write_f32(path: &PathBuf, data: &[f32]) -> Result<(), Box<dyn std::error::Error>> {
    let mut bytes = Vec::with_capacity(data.len() * 4);
    for v in data {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    let mut f = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    f.write_all(&bytes)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(())
}

/// Runs `pn logits`.
pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let tokens = read_tokens(&args.tokens)?;
    if tokens.is_empty() {
        return Err(format!("{}: no tokens", args.tokens.display()).into());
    }
    let t0 = Instant::now();
    let model = Model::load(&args.model, CpuBackend::new(args.threads))?;
    let (vocab, d) = (model.config.vocab, model.config.hidden);
    let mut state = model.new_state(tokens.len())?;
    let mut ws = model.new_workspace(args.batch.max(1))?;
    let mut logits = vec![0.0f32; tokens.len() * vocab];
    let mut hidden = vec![0.0f32; tokens.len() * d];
    let t1 = Instant::now();
    model.forward(
        &mut state,
        &mut ws,
        &tokens,
        Outputs {
            logits: Some(&mut logits),
            hidden: Some(&mut hidden),
            all_rows: true,
            layer_residuals: None,
        },
    )?;
    let dt = t1.elapsed().as_secs_f64();
    write_f32(&args.out, &logits)?;
    eprintln!(
        "{} tokens, vocab {vocab}: load {:.2}s, forward {:.3}s ({:.1} tokens/s) -> {}",
        tokens.len(),
        (t1 - t0).as_secs_f64(),
        dt,
        tokens.len() as f64 / dt,
        args.out.display()
    );
    if let Some(path) = &args.mtp_out {
        let n = tokens.len() - 1;
        let mut mtp = vec![0.0f32; n * vocab];
        if n > 0 {
            model.mtp_forward(
                &mut state,
                &mut ws,
                &tokens[1..],
                &hidden[..n * d],
                1,
                Outputs::all_logits(&mut mtp),
            )?;
        }
        write_f32(path, &mtp)?;
        eprintln!("MTP: {n} rows -> {}", path.display());
    }
    Ok(())
}
