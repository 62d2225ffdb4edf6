//! `pn eval-kl BASE.gguf QUANT.gguf --tokens FILE`: run both models on the same tokens and
//! print mean / p99 KL divergence, top-1 agreement and both perplexities.
//!
//! `pn eval-kl QUANT.gguf --kl-base BASE.kld`: the same against a compact KL base file written
//! by `pn perplexity -m BASE --kl-divergence-base BASE.kld` (the base model need not be here),
//! over that file's windows.

use crate::kl_file::KlBase;
use crate::perplexity::{base_windows, evaluate, report, Kl};
use pn_runtime::engine::{EngineOptions, KvCacheType};
use pn_runtime::quantize::eval::{compare_logits, model_logits, read_tokens};
use pn_runtime::Engine;
use std::path::PathBuf;

/// Arguments of `pn eval-kl`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// `BASE.gguf QUANT.gguf` (the reference, e.g. the F16 GGUF, then the quantized model), or
    /// only `QUANT.gguf` with --kl-base.
    #[arg(num_args = 1..=2, required = true, value_name = "MODEL")]
    pub models: Vec<PathBuf>,
    /// Token ids: `{"tokens": [...]}` JSON or whitespace/comma-separated integers.
    #[arg(long, required_unless_present = "kl_base")]
    pub tokens: Option<PathBuf>,
    /// A compact KL base file (`pn perplexity --kl-divergence-base`) instead of a base model.
    #[arg(long = "kl-base", conflicts_with = "tokens")]
    pub kl_base: Option<PathBuf>,
    /// CPU threads (default: all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

/// Runs `pn eval-kl`.
pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    match (&args.kl_base, args.models.as_slice(), &args.tokens) {
        (Some(path), [quant], _) => against_file(path, quant, args.threads),
        (None, [base, quant], Some(tokens)) => against_model(base, quant, tokens, args.threads),
        (Some(_), _, _) => {
            Err("with --kl-base give one model: pn eval-kl QUANT.gguf --kl-base BASE.kld".into())
        }
        _ => Err("give two models: pn eval-kl BASE.gguf QUANT.gguf --tokens FILE".into()),
    }
}

fn against_file(
    path: &std::path::Path,
    quant: &std::path::Path,
    threads: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let base = KlBase::read(path)?;
    let windows = base_windows(&base, path)?;
    let options = EngineOptions {
        context: windows.n_ctx,
        kv_type_k: KvCacheType::F32,
        kv_type_v: KvCacheType::F32,
        threads,
        ..EngineOptions::default()
    };
    let engine = Engine::load(quant, options).map_err(|e| format!("{}: {e}", quant.display()))?;
    if engine.config().vocab != base.n_vocab as usize {
        return Err(format!(
            "vocabularies differ: {} (file) vs {}",
            base.n_vocab,
            engine.config().vocab
        )
        .into());
    }
    let e = evaluate(&engine, &base.tokens, windows, Kl::Compact(&base))?;
    report(&e, windows);
    Ok(())
}

fn against_model(
    base_path: &std::path::Path,
    quant_path: &std::path::Path,
    tokens_path: &std::path::Path,
    threads: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let tokens = read_tokens(tokens_path)?;
    if tokens.len() < 2 {
        return Err(format!("{}: need at least 2 tokens", tokens_path.display()).into());
    }
    let (base, vb) = model_logits(base_path, &tokens, threads)
        .map_err(|e| format!("{}: {e}", base_path.display()))?;
    let (quant, vq) = model_logits(quant_path, &tokens, threads)
        .map_err(|e| format!("{}: {e}", quant_path.display()))?;
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
