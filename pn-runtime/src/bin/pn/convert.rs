//! `pn convert CHECKPOINT_DIR OUT.gguf [--outtype f16|bf16|f32|auto]`: a Hugging Face Qwen3.5
//! checkpoint (safetensors shards, config.json, tokenizer files) to the `qwen35` GGUF that
//! llama.cpp's `convert_hf_to_gguf.py` writes for it.

use pn_runtime::convert::{convert_checkpoint, parse_outtype, ConvertOptions};
use pn_runtime::quantize::Progress;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

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
    let bar = crate::progress::bar(args.quiet);
    let on_progress = |p: Progress<'_>| crate::progress::update(&bar, p);
    let result = convert_checkpoint(&opts, &on_progress, &cancel);
    crate::progress::finish(&bar);
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
