//! `pn convert CHECKPOINT_DIR OUT.gguf [--outtype f16|bf16|f32|auto]`: a Hugging Face Qwen3.5
//! checkpoint (safetensors shards, config.json, tokenizer files) to the `qwen35` GGUF that
//! llama.cpp's `convert_hf_to_gguf.py` writes for it.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use pn_runtime::convert::{convert_checkpoint, parse_outtype, ConvertOptions};
use pn_runtime::quantize::Progress;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Arguments of `pn convert`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The checkpoint folder (model*.safetensors or model.safetensors.index.json, config.json,
    /// tokenizer.json, tokenizer_config.json).
    pub input: PathBuf,
    /// Output GGUF (refused if it exists, unless --force).
    pub output: PathBuf,
    /// Type of the matrices: f16 (default, as llama.cpp), bf16, f32, or auto (the checkpoint's
    /// own). Norms, the conv kernel and other 1-D tensors are always f32.
    #[arg(long, default_value = "f16")]
    pub outtype: String,
    /// general.name (default: the folder's name, title-cased as llama.cpp does).
    #[arg(long)]
    pub model_name: Option<String>,
    /// Overwrite OUT if it exists.
    #[arg(long)]
    pub force: bool,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// Runs `pn convert`.
pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let mut opts = ConvertOptions::new(&args.input, &args.output);
    opts.outtype = parse_outtype(&args.outtype)?;
    opts.model_name = args.model_name;
    opts.force = args.force;
    let cancel = Arc::new(AtomicBool::new(false));
    {
        let c = Arc::clone(&cancel);
        // Failing to install the handler only loses the clean-up on ^C.
        let _ = ctrlc::set_handler(move || c.store(true, Ordering::SeqCst));
    }
    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr())
    };
    // The same bar as `pn quantize`.
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix:>10} [{bar:30}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} ETA {eta} {wide_msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    let bar = Mutex::new(bar);
    let on_progress = |p: Progress<'_>| {
        let Ok(b) = bar.lock() else { return };
        match p {
            Progress::Phase { label, total_bytes } => {
                b.set_prefix(label.to_string());
                b.set_length(total_bytes);
                b.set_position(0);
                b.reset_eta();
            }
            Progress::Tensor { name } => b.set_message(name.to_string()),
            Progress::Advance(n) => b.inc(n),
        }
    };
    let result = convert_checkpoint(&opts, &on_progress, &cancel);
    if let Ok(b) = bar.lock() {
        b.finish_and_clear();
    }
    let s = result?;
    println!(
        "wrote {} ({} tensors, {:?}, {:.1} MiB) in {:.2} s",
        args.output.display(),
        s.tensors,
        s.outtype,
        s.out_bytes as f64 / (1 << 20) as f64,
        s.seconds
    );
    Ok(())
}
