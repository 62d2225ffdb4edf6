//! `pn eval-kl BASE.gguf QUANT.gguf --tokens FILE`: run both models on the same tokens and
//! print mean / p99 KL divergence, top-1 agreement and both perplexities.

use pn_runtime::quantize::eval::{compare_logits, model_logits, read_tokens};
use std::path::PathBuf;

/// Arguments of `pn eval-kl`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The reference model (e.g. the F16 GGUF).
    pub base: PathBuf,
    /// The quantized model.
    pub quant: PathBuf,
    /// Token ids: `{"tokens": [...]}` JSON or whitespace/comma-separated integers.
    #[arg(long)]
    pub tokens: PathBuf,
    /// CPU threads (default: all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

/// Runs `pn eval-kl`.
pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let tokens = read_tokens(&args.tokens)?;
    if tokens.len() < 2 {
        return Err(format!("{}: need at least 2 tokens", args.tokens.display()).into());
    }
    let (base, vb) = model_logits(&args.base, &tokens, args.threads)
        .map_err(|e| format!("{}: {e}", args.base.display()))?;
    let (quant, vq) = model_logits(&args.quant, &tokens, args.threads)
        .map_err(|e| format!("{}: {e}", args.quant.display()))?;
    if vb != vq {
        return Err(format!("vocabularies differ: {vb} vs {vq}").into());
    }
    let s = compare_logits(&base, &quant, vb, Some(&tokens));
    println!("positions        {}", s.n);
    println!("mean KL          {:.6} nats", s.mean_kl);
    println!("p99 KL           {:.6} nats", s.p99_kl);
    println!("max KL           {:.6} nats", s.max_kl);
    println!("top-1 agreement  {:.4}", s.top1);
    println!("perplexity base  {:.4}", s.ppl_base);
    println!("perplexity quant {:.4}", s.ppl_quant);
    Ok(())
}
