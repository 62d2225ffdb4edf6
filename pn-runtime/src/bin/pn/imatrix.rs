//! `pn imatrix -m MODEL -f TEXT [-o FILE]`: run the model (CPU) over a text and write, for
//! every matrix, the statistics of its input (sum of squares per column and the row count) as
//! a llama.cpp importance matrix: GGUF (default) or, for a `.dat` output, the legacy layout.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use pn_runtime::quantize::calib::{collect, tokenize_file, CalibConfig};
use pn_runtime::quantize::imatrix::ImatrixData;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Arguments of `pn imatrix`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The model (GGUF) to run.
    #[arg(short = 'm', long)]
    pub model: PathBuf,
    /// Calibration text (UTF-8).
    #[arg(short = 'f', long = "file")]
    pub text: PathBuf,
    /// Output file: GGUF imatrix, or the legacy layout when it ends in `.dat`.
    #[arg(short = 'o', long = "output", default_value = "imatrix.gguf")]
    pub output: PathBuf,
    /// Run at most this many chunks.
    #[arg(long)]
    pub chunks: Option<usize>,
    /// Tokens per chunk.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512)]
    pub ctx: usize,
    /// CPU threads (default: all cores).
    #[arg(short = 't', long, default_value_t = 0)]
    pub threads: usize,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// Runs `pn imatrix`.
pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let t0 = Instant::now();
    let (tokens, _hash) = tokenize_file(&args.model, &args.text, None)?;
    let rotated = gguf_io::GgufFile::open(&args.model)
        .map(|f| f.get_str("pn.rotation.kind").is_ok())
        .unwrap_or(false);
    if rotated {
        eprintln!(
            "note: {} stores Hadamard-rotated PN weights; their statistics are of the rotated inputs",
            args.model.display()
        );
    }
    let cancel = Arc::new(AtomicBool::new(false));
    {
        let c = Arc::clone(&cancel);
        let _ = ctrlc::set_handler(move || c.store(true, Ordering::SeqCst));
    }
    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr())
    };
    bar.set_style(
        ProgressStyle::with_template(
            "imatrix [{bar:30}] {pos}/{len} tokens {per_sec} ETA {eta} {wide_msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    let on_progress = |done: usize, total: usize| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    };
    let cfg = CalibConfig {
        ctx: args.ctx,
        max_chunks: args.chunks,
        threads: args.threads,
        rotation: None,
        gram: false,
        gram_only: None,
    };
    let stats = collect(&args.model, &tokens, &cfg, &on_progress, &cancel);
    bar.finish_and_clear();
    let stats = stats?;
    let dataset = args.text.file_name().map_or_else(
        || args.text.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let data = ImatrixData::from_stats(&stats, &dataset);
    data.write(&args.output)?;
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "{} entries from {} tokens ({} chunks of {}) in {secs:.1} s ({:.0} tokens/s); wrote {}",
        data.entries.len(),
        stats.tokens,
        stats.chunks,
        stats.chunk_size,
        stats.tokens as f64 / secs.max(1e-9),
        args.output.display()
    );
    Ok(())
}
