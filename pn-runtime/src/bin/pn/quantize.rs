//! `pn quantize IN.gguf OUT.gguf`: make a PN model (mix P0k+19, Hadamard-rotated) from an
//! F32/F16/BF16/Q8_0 `qwen35` GGUF.

use pn_runtime::quantize::{
    quantize_model, CalibInput, FallbackPolicy, Method, Mix, Progress, QuantizeError,
    QuantizeOptions, RotationChoice,
};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Arguments of `pn quantize`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Input GGUF (F32/F16/BF16/Q8_0 weights, architecture qwen35).
    pub input: PathBuf,
    /// Output GGUF (refused if it exists, unless --force).
    pub output: PathBuf,
    /// Type mix: P0k+N (default P0k+19), P0k (no promotion), P0k@B (steps up pn3t -> pn4t ->
    /// q8_0 up to B bytes per 2-D weight), P0kK@B (the same with the rungs pn4t -> q5_K ->
    /// q6_K -> q8_0), pn4t, q3k-like, q3k-m+N
    /// (llama.cpp's Q3_K_M recipe + N measured K-quant steps), q3k-m@B (steps up to B bytes
    /// per 2-D weight), all-q3_K, all-q4_K, all-q8_0.
    #[arg(long, default_value = "P0k+19")]
    pub mix: String,
    /// Number of pn3t tensors promoted to pn4t (overrides the mix's N; 0 = none).
    #[arg(long)]
    pub promote: Option<usize>,
    /// Hadamard block size R (power of two dividing every rotated K).
    #[arg(long, conflicts_with = "no_rotation")]
    pub rotation_block: Option<usize>,
    /// Do not rotate PN weights.
    #[arg(long)]
    pub no_rotation: bool,
    /// Importance matrix (llama.cpp imatrix, GGUF or legacy .dat) to weight the promotion ranking.
    #[arg(long)]
    pub imatrix: Option<PathBuf>,
    /// For a K-quant (Q3_K/Q4_K) whose 256-weight super-block does not divide a tensor's row
    /// length: `real` stores the smallest of pn3t, pn4t, Q8_0, F16 whose measured error is at
    /// most 1.25x the K-quant's; `simulate` stores F32 values of the zero-padded K-quant (a
    /// quality stand-in counted at the K-quant's size). Default: real for the PN mixes,
    /// simulate for the stock baselines (q3k-like, all-*).
    #[arg(long, value_parser = parse_fallback)]
    pub kquant_fallback: Option<FallbackPolicy>,
    /// Fix one tensor's type, NAME=TYPE (repeatable; a ggml type name: q6_K, q4_K, q8_0, pn4t,
    /// ...): no promotion or climb moves it. A K-quant whose block does not divide K follows
    /// --kquant-fallback. Gives two mixes the same embedding and head in a same-size comparison.
    #[arg(long = "tensor-type", value_parser = parse_tensor_type)]
    pub tensor_types: Vec<(String, gguf_io::GgmlType)>,
    /// Worker threads (default: all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Overwrite OUT if it exists.
    #[arg(long)]
    pub force: bool,
    /// Print each tensor's relative squared error with and without rotation.
    #[arg(long)]
    pub report: bool,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// PN encoder: ref (the reference round to nearest, bit-exact), imatrix (importance-weighted
    /// scale search; needs --calib or --imatrix), gptq (error feedback; needs --calib).
    /// Default: gptq with --calib, else ref.
    #[arg(long, value_parser = parse_method)]
    pub method: Option<Method>,
    /// Calibration text (UTF-8; tokenized with the input model's tokenizer) run through the
    /// input model to collect each matrix's input statistics.
    #[arg(long)]
    pub calib: Option<PathBuf>,
    /// Use at most this many calibration tokens.
    #[arg(long, default_value_t = 16384)]
    pub calib_tokens: usize,
    /// Tokens per calibration chunk.
    #[arg(long, default_value_t = 512)]
    pub calib_ctx: usize,
    /// GPTQ damping, relative to the mean of the Hessian's diagonal (0.1: GPTQ's usual 0.01
    /// overfits a calibration set of a few thousand tokens).
    #[arg(long, default_value_t = 0.1)]
    pub damp: f64,
}

fn parse_method(s: &str) -> Result<Method, String> {
    Method::parse(s).ok_or_else(|| format!("unknown method `{s}` (expected ref, imatrix or gptq)"))
}

fn parse_tensor_type(s: &str) -> Result<(String, gguf_io::GgmlType), String> {
    pn_runtime::quantize::plan::parse_tensor_type(s).map_err(|e| e.to_string())
}

fn parse_fallback(s: &str) -> Result<FallbackPolicy, String> {
    FallbackPolicy::parse(s)
        .ok_or_else(|| format!("unknown fallback `{s}` (expected real or simulate)"))
}

/// Runs `pn quantize`.
pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let mut opts = QuantizeOptions::new(&args.input, &args.output);
    opts.mix = Mix::parse(&args.mix)?;
    opts.promote = args.promote;
    opts.rotation = match (args.no_rotation, args.rotation_block) {
        (true, _) => RotationChoice::None,
        (false, Some(r)) => RotationChoice::Block(r),
        (false, None) => RotationChoice::Default,
    };
    opts.imatrix = args.imatrix;
    opts.threads = args.threads;
    opts.force = args.force;
    opts.report = args.report;
    opts.fallback = args.kquant_fallback;
    opts.method = args.method;
    opts.tensor_types = args.tensor_types;
    opts.calib = args.calib.map(|text| CalibInput {
        text,
        max_tokens: Some(args.calib_tokens),
        ctx: args.calib_ctx,
        damp: args.damp,
    });

    // Ctrl-C only raises a flag: the workers stop, the temporary file is removed, and the
    // error says so. A second Ctrl-C while unwinding is not needed: the flag is checked per row.
    let cancel = Arc::new(AtomicBool::new(false));
    {
        let c = Arc::clone(&cancel);
        // Failing to install the handler (e.g. one already set) only loses the clean-up on ^C.
        let _ = ctrlc::set_handler(move || c.store(true, Ordering::SeqCst));
    }

    let bar = crate::progress::bar(args.quiet);
    let on_progress = |p: Progress<'_>| crate::progress::update(&bar, p);
    let result = quantize_model(&opts, &on_progress, &cancel);
    crate::progress::finish(&bar);
    let summary = match result {
        Ok(s) => s,
        Err(QuantizeError::Interrupted) => return Err(Box::new(QuantizeError::Interrupted)),
        Err(e) => return Err(Box::new(e)),
    };
    if args.report {
        println!("{}", summary.report_table());
    }
    if !summary.promoted.is_empty() {
        // q3k-m mixes promote up the K-quant ladder, P0k@B up pn3t -> pn4t -> q8_0 (a name per
        // step), the other PN mixes from pn3t to pn4t.
        let to = if summary.mix.starts_with("q3k-m") {
            "one K-quant step up"
        } else if summary.mix.starts_with("P0kK@") {
            "one step up pn3t -> pn4t -> q5_K -> q6_K -> q8_0"
        } else if summary.mix.contains('@') {
            "one step up pn3t -> pn4t -> q8_0"
        } else {
            "to pn4t"
        };
        println!("promoted {to}: {}", summary.promoted.join(", "));
    }
    print!("{}", summary.fallback_table());
    print!("{}", summary.size_table());
    println!("wrote {}", args.output.display());
    Ok(())
}
