//! The error type of `pn quantize`: every variant names the file, tensor, row or key involved.

use std::path::PathBuf;

/// Everything that can stop a quantization run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QuantizeError {
    /// Reading the input (or the importance matrix) failed.
    #[error("{path}: {source}")]
    Gguf {
        /// The file being read.
        path: PathBuf,
        /// What gguf-io reported.
        source: gguf_io::GgufError,
    },
    /// The input checkpoint folder cannot be converted.
    #[error("{source}")]
    Checkpoint {
        /// What the converter reported (it names the file and tensor).
        source: crate::convert::ConvertError,
    },
    /// The input's `general.architecture` is not `qwen35`.
    #[error("{path}: architecture is {found:?}, expected \"qwen35\" (Qwen3.5/3.6/3.8 hybrid)")]
    NotQwen35 {
        /// The input file.
        path: PathBuf,
        /// The architecture found (or a description of why it is missing).
        found: String,
    },
    /// A tensor's input type cannot be quantized from (only F32, F16, BF16 and Q8_0 can).
    #[error(
        "tensor {tensor}: unsupported input type {ty} (the quantizer reads F32, F16, BF16 or Q8_0)"
    )]
    UnsupportedInputType {
        /// Tensor name.
        tensor: String,
        /// Its type name.
        ty: &'static str,
    },
    /// A tensor matches no rule of the mix (unknown matrix, or a K the target type cannot hold).
    #[error("tensor {tensor} (K = {k}): {why}")]
    NoRule {
        /// Tensor name.
        tensor: String,
        /// Its reduction length (first GGUF dimension).
        k: u64,
        /// Which rule failed.
        why: String,
    },
    /// A rotated tensor's K is not a multiple of the Hadamard block size.
    #[error("tensor {tensor}: K = {k} is not divisible by the rotation block size {r}")]
    RotationBlock {
        /// Tensor name.
        tensor: String,
        /// Its K.
        k: u64,
        /// The rotation block size.
        r: usize,
    },
    /// The requested rotation block size is not a power of two (or is zero).
    #[error("rotation block size {0} must be a power of two >= 2")]
    BadRotationBlock(usize),
    /// A weight is NaN or infinite.
    #[error("tensor {tensor}: non-finite weight {value} at row {row}, column {col}")]
    NonFinite {
        /// Tensor name.
        tensor: String,
        /// Row index (0-based).
        row: u64,
        /// Column index within the row.
        col: u64,
        /// The value found.
        value: f32,
    },
    /// The output path exists and `--force` was not given.
    #[error("{0} exists (set QuantizeOptions::force to overwrite it)")]
    OutputExists(PathBuf),
    /// Input and output name the same file.
    #[error("output {0} is the input file")]
    OutputIsInput(PathBuf),
    /// The disk filled up while writing.
    #[error(
        "disk full while writing {path} (needs about {needed} bytes); nothing was left behind"
    )]
    DiskFull {
        /// The final output path.
        path: PathBuf,
        /// The expected output size.
        needed: u64,
    },
    /// Another I/O error while writing the output.
    #[error("writing {path}: {source}")]
    Write {
        /// The final output path.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The GGUF writer rejected the output (metadata or tensor data).
    #[error("writing {path}: {source}")]
    GgufWrite {
        /// The final output path.
        path: PathBuf,
        /// What gguf-io reported.
        source: gguf_io::GgufError,
    },
    /// A stock-type quantize or decode call failed.
    #[error("tensor {tensor}: {msg}")]
    Codec {
        /// Tensor name.
        tensor: String,
        /// The codec's message.
        msg: String,
    },
    /// An unknown mix name.
    #[error("unknown mix {0:?} (known: P0k+N, e.g. P0k+19; P0k; P0k@B, e.g. P0k@0.609; pn4t; q3k-like; q3k-m+N; q3k-m@B; all-q3_K; all-q4_K; all-q8_0)")]
    UnknownMix(String),
    /// A `--tensor-type NAME=TYPE` override that cannot be applied.
    #[error("--tensor-type {tensor}={ty}: {why}")]
    TensorType {
        /// The tensor named.
        tensor: String,
        /// The type asked for.
        ty: String,
        /// Why it cannot be applied.
        why: String,
    },
    /// The importance matrix file is malformed.
    #[error("imatrix {path}: {why}")]
    Imatrix {
        /// The imatrix file.
        path: PathBuf,
        /// What is wrong, with the byte offset or entry name.
        why: String,
    },
    /// The importance matrix does not belong to this model (a tensor it names is missing or
    /// has another row length).
    #[error("imatrix {path}: tensor {tensor}: {why} (an imatrix of another model?)")]
    ImatrixMismatch {
        /// The imatrix file.
        path: PathBuf,
        /// The entry that does not fit.
        tensor: String,
        /// What does not fit.
        why: String,
    },
    /// Collecting calibration statistics failed (reading or tokenizing the text, running the
    /// model, or a Hessian that cannot be factored).
    #[error("calibration with {path}: {why}")]
    Calibration {
        /// The calibration text (or model) involved.
        path: PathBuf,
        /// What went wrong.
        why: String,
    },
    /// The run was cancelled (Ctrl-C); the temporary output was removed.
    #[error("interrupted; no output written")]
    Interrupted,
}
