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
    /// The model (GGUF, architecture qwen35). Without it: the demo model built into `pn`.
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// Token file: `{"tokens": [...]}`, a JSON array (as `pn tokenize` prints) or integers.
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
    let tokens = crate::inputs::read_tokens(&args.tokens)?;
    if tokens.is_empty() {
        return Err(format!("{}: no tokens", args.tokens.display()).into());
    }
    let t0 = Instant::now();
    let (file, _) = crate::demo::open_model(args.model.as_deref())?;
    let model = Model::from_file(std::sync::Arc::new(file), CpuBackend::new(args.threads))?;
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
