//! `pn perplexity`: perplexity of a model on a text or token file as llama-perplexity measures
//! it, optionally the KL divergence from a base model.
//!
//! Windows (llama.cpp's `perplexity()`): the tokens are cut into `n_chunk = n_tokens / n_ctx`
//! non-overlapping windows of exactly `n_ctx` (`-c`) tokens, the remainder dropped; each window
//! is evaluated from an empty state, its first token replaced by BOS when the tokenizer adds one;
//! only the second half is scored: logit row `j` for `j` in `n_ctx/2 .. n_ctx-1` predicts token
//! `start + j + 1`. `PPL = exp(mean NLL) +/- PPL * sqrt(var(NLL) / (count - 1))`.
//! `--all-positions` scores every row instead (`j` from 0: what transformers' perplexity does).
//!
//! KL: `--kl-divergence-base FILE` writes the base model's compact top-k file (see
//! `kl_file`), `--kl-divergence-base FILE --kl-divergence` reads it and compares, the windows
//! coming from the file; `--kl-base RAW.f32` compares with full raw logits (`pn logits`).

use crate::engine_args::{self, ModelArgs};
use crate::inputs;
use crate::kl_file::{KlBase, KlRow, DEFAULT_TOP_K};
use pn_runtime::sampling::argmax;
use pn_runtime::Engine;
use std::path::{Path, PathBuf};

/// Measure perplexity (and KL against a base model).
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text file to score, tokenized with the model's tokenizer (`-` for stdin).
    #[arg(
        short = 'f',
        long = "file",
        conflicts_with = "tokens",
        required_unless_present_any = ["tokens", "kl_divergence"]
    )]
    pub file: Option<PathBuf>,
    /// Token file: `{"tokens": [...]}`, a JSON array (`pn tokenize`) or integers.
    #[arg(long = "tokens")]
    pub tokens: Option<PathBuf>,
    /// Score at most N windows.
    #[arg(long = "chunks")]
    pub chunks: Option<usize>,
    /// Score every row of a window, not only the second half (pn's own; not llama.cpp's).
    #[arg(long = "all-positions")]
    pub all_positions: bool,
    /// The compact KL base file: written from this model's log-probs, or with --kl-divergence
    /// read and compared with.
    #[arg(long = "kl-divergence-base")]
    pub kl_divergence_base: Option<PathBuf>,
    /// Compare with the --kl-divergence-base file (its tokens and windows) instead of writing it.
    #[arg(long = "kl-divergence", requires = "kl_divergence_base")]
    pub kl_divergence: bool,
    /// Log-probs per position kept in a --kl-divergence-base file written.
    #[arg(long = "kl-top-k", default_value_t = DEFAULT_TOP_K)]
    pub kl_top_k: usize,
    /// KL against full raw logits: little-endian f32 `[n_tokens, vocab]`, row t = the logits
    /// after token t (as `pn logits` writes).
    #[arg(long = "kl-base", conflicts_with = "kl_divergence_base")]
    pub kl_base: Option<PathBuf>,
}

/// The windows of llama-perplexity over `n_tokens` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Windows {
    /// Tokens per window (`-c`).
    pub n_ctx: usize,
    /// First scored logit row of a window (`n_ctx / 2`; 0 with --all-positions).
    pub first: usize,
    /// Windows scored.
    pub n_chunks: usize,
}

impl Windows {
    /// `n_tokens / n_ctx` whole windows (at most `chunks`).
    pub fn new(
        n_tokens: usize,
        n_ctx: usize,
        chunks: Option<usize>,
        all_positions: bool,
    ) -> Result<Windows, String> {
        if n_ctx < 2 {
            return Err(format!("-c {n_ctx}: a window needs at least 2 tokens"));
        }
        let n_chunks = (n_tokens / n_ctx).min(chunks.unwrap_or(usize::MAX));
        if n_chunks == 0 {
            return Err(format!(
                "{n_tokens} tokens are less than one window of -c {n_ctx}: pass a smaller -c or more text"
            ));
        }
        let first = if all_positions { 0 } else { n_ctx / 2 };
        Ok(Windows {
            n_ctx,
            first,
            n_chunks,
        })
    }

    /// Scored rows per window.
    pub fn rows_per_chunk(&self) -> usize {
        self.n_ctx - 1 - self.first
    }

    /// `(window, logit row in it, index of the predicted token)` of every scored position.
    pub fn scored(&self) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        (0..self.n_chunks).flat_map(move |c| {
            (self.first..self.n_ctx - 1).map(move |j| (c, j, c * self.n_ctx + j + 1))
        })
    }
}

/// Sums over the scored positions.
#[derive(Debug, Default)]
pub struct Eval {
    /// Sum of the negative log-likelihoods.
    pub nll: f64,
    /// Sum of their squares.
    pub nll2: f64,
    /// Positions scored.
    pub count: usize,
    /// Positions whose most likely token came next.
    pub correct: usize,
    /// KL(base || model) of each position compared.
    pub kls: Vec<f64>,
    /// Positions where base and model agree on the most likely token.
    pub agree: usize,
    /// The base file's NLL sum (compact base files: their target log-probs).
    pub base_nll: f64,
}

impl Eval {
    /// `(PPL, its standard error)` as llama-perplexity prints them.
    pub fn ppl(&self) -> (f64, f64) {
        let n = self.count.max(1) as f64;
        let mean = self.nll / n;
        let ppl = mean.exp();
        let var = self.nll2 / n - mean * mean;
        let err = if var > 0.0 && self.count > 1 {
            (var / (n - 1.0)).sqrt() * ppl
        } else {
            0.0
        };
        (ppl, err)
    }
}

/// What the scored positions are compared with or written to.
pub enum Kl<'a> {
    /// Nothing.
    None,
    /// Full raw logits `[n_tokens, vocab]`.
    Raw(&'a [f32]),
    /// A compact base file (its rows in [`Windows::scored`] order).
    Compact(&'a KlBase),
    /// Collect rows of this many log-probs for a compact file.
    Write(usize, &'a mut Vec<KlRow>),
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

/// Evaluates the windows, printing llama-perplexity's `[i]ppl,` progress on stderr.
pub fn evaluate(
    engine: &Engine,
    tokens: &[u32],
    windows: Windows,
    mut kl: Kl<'_>,
) -> Result<Eval, Box<dyn std::error::Error>> {
    let vocab = engine.config().vocab;
    let bos = engine
        .tokenizer()
        .specials()
        .bos
        .filter(|_| engine.tokenizer().adds_bos());
    let mut session = engine.session()?;
    let mut e = Eval::default();
    // `[n_ctx, vocab]`: the logits of the window being scored.
    let mut logits = Vec::new();
    let mut current = None;
    for (row_index, (c, j, target_at)) in windows.scored().enumerate() {
        let start = c * windows.n_ctx;
        if current != Some(c) {
            if current.is_some() {
                eprint!("[{}]{:.4},", c, e.ppl().0);
            }
            let mut input = tokens[start..start + windows.n_ctx].to_vec();
            if let Some(bos) = bos {
                input[0] = bos;
            }
            session.reset()?;
            logits = session.feed_all_logits(&input)?;
            current = Some(c);
        }
        let row = &logits[j * vocab..(j + 1) * vocab];
        let target = tokens[target_at];
        let lq = log_softmax(row);
        let nll = -lq
            .get(target as usize)
            .copied()
            .unwrap_or(f64::NEG_INFINITY);
        e.nll += nll;
        e.nll2 += nll * nll;
        e.count += 1;
        e.correct += usize::from(argmax(row) == Some(target));
        match &mut kl {
            Kl::None => {}
            Kl::Raw(base) => {
                let g = start + j;
                let brow = &base[g * vocab..(g + 1) * vocab];
                let lp = log_softmax(brow);
                let d: f64 = lp.iter().zip(&lq).map(|(&p, &q)| p.exp() * (p - q)).sum();
                e.kls.push(d.max(0.0));
                e.agree += usize::from(argmax(brow) == argmax(row));
                e.base_nll -= lp.get(target as usize).copied().unwrap_or(0.0);
            }
            Kl::Compact(base) => {
                let r = &base.rows[row_index];
                e.kls.push(r.kl(&lq));
                e.agree += usize::from(r.top1() == argmax(row));
                e.base_nll -= r.target_logprob as f64;
            }
            Kl::Write(k, rows) => rows.push(KlRow::from_logprobs(&lq, target, *k)),
        }
    }
    eprint!("[{}]{:.4},", windows.n_chunks, e.ppl().0);
    eprintln!();
    Ok(e)
}

/// Prints the results: llama-perplexity's final line, then pn's summary lines.
pub fn report(e: &Eval, windows: Windows) {
    let (ppl, err) = e.ppl();
    let ce = e.nll / e.count.max(1) as f64;
    println!("Final estimate: PPL = {ppl:.4} +/- {err:.5}");
    println!(
        "perplexity: {ppl:.4} (cross-entropy {ce:.4} nats/token over {} predictions, {} window(s) of {} tokens, rows {}..{} scored)",
        e.count,
        windows.n_chunks,
        windows.n_ctx,
        windows.first,
        windows.n_ctx - 1
    );
    println!(
        "top-1 accuracy: {:.4}",
        e.correct as f64 / e.count.max(1) as f64
    );
    if !e.kls.is_empty() {
        let n = e.kls.len() as f64;
        let mean = e.kls.iter().sum::<f64>() / n;
        let var = e.kls.iter().map(|k| (k - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
        let mut sorted = e.kls.clone();
        sorted.sort_by(f64::total_cmp);
        let p99 = sorted[((n * 0.99).ceil() as usize).clamp(1, sorted.len()) - 1];
        println!(
            "KL(base || model): mean {mean:.6}, p99 {p99:.6}, max {:.6} nats over {} rows; top-1 agreement {:.4}",
            sorted[sorted.len() - 1],
            e.kls.len(),
            e.agree as f64 / n
        );
        println!("Mean KLD: {mean:.6} ± {:.6}", (var / n).sqrt());
        println!(
            "perplexity base: {:.4}",
            (e.base_nll / e.count.max(1) as f64).exp()
        );
    }
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

/// The windows of a compact base file, checked against it.
pub fn base_windows(base: &KlBase, path: &Path) -> Result<Windows, Box<dyn std::error::Error>> {
    let n_ctx = base.n_ctx as usize;
    let first = base.first as usize;
    let mut w = Windows {
        n_ctx,
        first,
        n_chunks: 0,
    };
    if n_ctx < 2 || first + 1 >= n_ctx {
        return Err(format!(
            "{}: window {n_ctx} with first scored row {first}",
            path.display()
        )
        .into());
    }
    let per = w.rows_per_chunk();
    w.n_chunks = base.rows.len() / per;
    if w.n_chunks * per != base.rows.len() || w.n_chunks * n_ctx > base.tokens.len() {
        return Err(format!(
            "{}: its windows do not match its tokens and rows",
            path.display()
        )
        .into());
    }
    Ok(w)
}

/// Runs the subcommand.
pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let compare = match (&args.kl_divergence_base, args.kl_divergence) {
        (Some(p), true) => Some(KlBase::read(p)?),
        _ => None,
    };
    let given = match (&args.tokens, &compare) {
        (Some(t), _) => Some(inputs::read_tokens(t)?),
        (None, Some(base)) => Some(base.tokens.clone()),
        _ => None,
    };
    let mut model_args = args.model.clone();
    let requested_ctx = match &compare {
        Some(base) if model_args.ctx_size == 0 || model_args.ctx_size == base.n_ctx as usize => {
            base.n_ctx as usize
        }
        Some(base) => {
            return Err(format!(
                "-c {} differs from the -c {} the KL base file was written with",
                model_args.ctx_size, base.n_ctx
            )
            .into())
        }
        None => model_args.ctx_size,
    };
    if requested_ctx == 0 {
        // llama-perplexity's usual window, or one window of a shorter token file.
        model_args.ctx_size = given.as_ref().map_or(512, |t| t.len().min(512)).max(2);
    } else {
        model_args.ctx_size = requested_ctx;
    }
    let engine = engine_args::load_engine(&model_args, true)?;
    let tokens = match (given, &args.file) {
        (Some(t), _) => t,
        (None, Some(f)) => engine.tokenizer().encode(&inputs::read_text(f)?)?,
        (None, None) => return Err("give -f TEXT or --tokens FILE.json".into()),
    };
    let n_ctx = if requested_ctx == 0 {
        engine.context().min(tokens.len())
    } else {
        requested_ctx
    };
    let windows = match &compare {
        Some(base) => base_windows(
            base,
            args.kl_divergence_base.as_deref().unwrap_or(Path::new("")),
        )?,
        None => Windows::new(tokens.len(), n_ctx, args.chunks, args.all_positions)?,
    };
    let vocab = engine.config().vocab;
    if let Some(base) = &compare {
        if base.n_vocab as usize != vocab {
            return Err(format!(
                "the KL base file's vocabulary is {}, the model's {vocab}",
                base.n_vocab
            )
            .into());
        }
    }
    eprintln!(
        "pn perplexity: {} tokens, {} window(s) of {} tokens, rows {}..{} of each scored",
        tokens.len(),
        windows.n_chunks,
        windows.n_ctx,
        windows.first,
        windows.n_ctx - 1
    );
    let raw = match &args.kl_base {
        Some(p) => Some(read_logits(p, tokens.len() * vocab)?),
        None => None,
    };
    let mut written = Vec::new();
    let kl = match (&raw, &compare, &args.kl_divergence_base) {
        (Some(raw), _, _) => Kl::Raw(raw),
        (_, Some(base), _) => Kl::Compact(base),
        (_, None, Some(_)) => Kl::Write(args.kl_top_k.max(1), &mut written),
        _ => Kl::None,
    };
    let e = evaluate(&engine, &tokens, windows, kl)?;
    report(&e, windows);
    if let (Some(path), None) = (&args.kl_divergence_base, &compare) {
        let base = KlBase {
            n_vocab: vocab as u32,
            n_ctx: windows.n_ctx as u32,
            first: windows.first as u32,
            top_k: args.kl_top_k.max(1) as u32,
            tokens,
            rows: written,
        };
        base.write(path)?;
        eprintln!(
            "pn: wrote the KL base ({} rows, top-{} log-probs) to {}",
            base.rows.len(),
            base.top_k,
            path.display()
        );
    }
    Ok(())
}

#[cfg(test)]
#[path = "perplexity_tests.rs"]
mod tests;
