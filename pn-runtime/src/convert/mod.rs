//! `pn convert`: a Hugging Face Qwen3.5 checkpoint (a folder of `*.safetensors` shards,
//! `config.json`, `tokenizer.json`, `tokenizer_config.json`) to the `qwen35` GGUF that llama.cpp's
//! `convert_hf_to_gguf.py` writes for it: the same tensor names, order, shapes, types and data
//! (including the transforms it applies to this architecture), the same `qwen35.*` metadata and
//! the tokenizer as `tokenizer.ggml.*` keys plus `tokenizer.chat_template`.
//!
//! One module per step:
//! - [`shards`]: the index, the memory-mapped shards, header checks, the `safetensors` crate;
//! - [`config`]: config.json to the hyper-parameters and the `qwen35.*` keys;
//! - [`names`]: checkpoint names to GGUF names, transforms and expected shapes;
//! - [`values`]: dtype, working precision and output rounding;
//! - [`vocab`]: the tokenizer keys; [`general`]: name and size label;
//! - [`checkpoint`]: all of it put together, tensor bytes made on demand;
//! - here: the writer, streaming tensor by tensor (large tensors in row chunks) into a
//!   temporary file renamed only when complete (quantize's [`crate::quantize::output`]).
//!
//! Memory stays bounded by one chunk of rows: the shards are mapped, and the pages of each
//! tensor are released once it is written.

pub mod checkpoint;
pub mod config;
pub mod error;
pub mod general;
pub mod names;
pub mod shards;
pub mod values;
pub mod vocab;

pub use checkpoint::{Checkpoint, OpenOptions, OutTensor};
pub use error::ConvertError;
pub use values::OutType;

use crate::quantize::output::TempOutput;
use crate::quantize::{Progress, QuantizeError};
use gguf_io::{GgufError, GgufWriter};
use std::io::Read;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// Output bytes produced per step for a transformed tensor (bounds the working memory).
const CHUNK_BYTES: usize = 8 << 20;

/// Everything `pn convert` takes.
#[derive(Clone, Debug)]
pub struct ConvertOptions {
    /// The checkpoint directory.
    pub input: PathBuf,
    /// The output GGUF.
    pub output: PathBuf,
    /// Matrix type (`None`: the checkpoint's own dtype, as llama.cpp's `auto`).
    pub outtype: Option<OutType>,
    /// `general.name` (default: the directory name, title-cased).
    pub model_name: Option<String>,
    /// Overwrite an existing output.
    pub force: bool,
}

impl ConvertOptions {
    /// `input -> output` as F16 (llama.cpp's default `--outtype`).
    pub fn new(input: impl Into<PathBuf>, output: impl Into<PathBuf>) -> ConvertOptions {
        ConvertOptions {
            input: input.into(),
            output: output.into(),
            outtype: Some(OutType::F16),
            model_name: None,
            force: false,
        }
    }
}

/// What a conversion did.
#[derive(Clone, Debug)]
pub struct ConvertSummary {
    /// Tensors written.
    pub tensors: usize,
    /// Bytes of the output file.
    pub out_bytes: u64,
    /// Wall time.
    pub seconds: f64,
    /// The matrix type.
    pub outtype: OutType,
}

/// Parses `f16`, `bf16`, `f32` or `auto` (`None`).
pub fn parse_outtype(s: &str) -> Result<Option<OutType>, String> {
    match s.to_ascii_lowercase().as_str() {
        "f16" => Ok(Some(OutType::F16)),
        "bf16" => Ok(Some(OutType::Bf16)),
        "f32" => Ok(Some(OutType::F32)),
        "auto" => Ok(None),
        _ => Err(format!(
            "unknown output type `{s}` (expected f16, bf16, f32 or auto)"
        )),
    }
}

fn output_err(e: QuantizeError, path: &std::path::Path) -> ConvertError {
    match e {
        QuantizeError::OutputExists(p) => ConvertError::OutputExists(p),
        QuantizeError::DiskFull { path, needed } => ConvertError::DiskFull { path, needed },
        other => ConvertError::Write {
            path: path.to_path_buf(),
            msg: other.to_string(),
        },
    }
}

/// Converts `opts.input` into `opts.output`. `cancel` stops the run (the temporary output is
/// removed and [`ConvertError::Interrupted`] returned).
pub fn convert_checkpoint(
    opts: &ConvertOptions,
    progress: &(dyn Fn(Progress<'_>) + Sync),
    cancel: &AtomicBool,
) -> Result<ConvertSummary, ConvertError> {
    let t0 = Instant::now();
    let ck = Checkpoint::open(
        &opts.input,
        &OpenOptions {
            outtype: opts.outtype,
            model_name: opts.model_name.clone(),
        },
    )?;
    let (guard, mut out) = TempOutput::create(&opts.output, &opts.input, opts.force)
        .map_err(|e| output_err(e, &opts.output))?;
    let needed = ck.data_bytes();
    let write_err = |e: GgufError| match e {
        GgufError::Io(io) => output_err(guard.write_err(io, needed), &opts.output),
        other => ConvertError::Write {
            path: opts.output.clone(),
            msg: other.to_string(),
        },
    };
    let mut w = GgufWriter::new(&mut out);
    for m in &ck.metadata {
        w.add_metadata(m.key.clone(), m.value.clone())
            .map_err(write_err)?;
    }
    for t in &ck.tensors {
        w.add_tensor_info(t.info.name.clone(), t.info.ty, &t.info.dims)
            .map_err(write_err)?;
    }
    w.write_header().map_err(write_err)?;
    progress(Progress::Phase {
        label: "converting",
        total_bytes: needed,
    });
    for i in 0..ck.tensors.len() {
        if cancel.load(Ordering::Relaxed) {
            return Err(ConvertError::Interrupted);
        }
        let t = &ck.tensors[i];
        progress(Progress::Tensor { name: &t.info.name });
        let mut reader = TensorReader {
            ck: &ck,
            i,
            next_row: 0,
            buf: Vec::new(),
            pos: 0,
            cancel,
            progress,
        };
        w.write_tensor_from_reader(&t.info.name, &mut reader)
            .map_err(|e| {
                if cancel.load(Ordering::Relaxed) {
                    ConvertError::Interrupted
                } else {
                    write_err(e)
                }
            })?;
        ck.release(i);
    }
    w.finish().map_err(write_err)?;
    let file = out
        .into_inner()
        .map_err(|e| output_err(guard.write_err(e.into_error(), needed), &opts.output))?;
    let out_bytes = file
        .metadata()
        .map(|m| m.len())
        .map_err(|e| output_err(guard.write_err(e, needed), &opts.output))?;
    guard
        .commit(file)
        .map_err(|e| output_err(e, &opts.output))?;
    Ok(ConvertSummary {
        tensors: ck.tensors.len(),
        out_bytes,
        seconds: t0.elapsed().as_secs_f64(),
        outtype: ck.outtype,
    })
}

/// The output bytes of one tensor as a `Read`: whole rows are converted a chunk at a time.
struct TensorReader<'a> {
    ck: &'a Checkpoint,
    i: usize,
    next_row: u64,
    /// The current chunk of converted rows.
    buf: Vec<u8>,
    /// How much of `buf` was handed out.
    pos: usize,
    cancel: &'a AtomicBool,
    progress: &'a (dyn Fn(Progress<'_>) + Sync),
}

impl Read for TensorReader<'_> {
    fn read(&mut self, dst: &mut [u8]) -> std::io::Result<usize> {
        if self.pos == self.buf.len() {
            let t = &self.ck.tensors[self.i];
            if self.next_row == t.rows {
                return Ok(0);
            }
            if self.cancel.load(Ordering::Relaxed) {
                return Err(std::io::Error::other("interrupted"));
            }
            let row_out = (t.row_len as usize * t.info.ty.type_size()).max(1);
            let n = (CHUNK_BYTES / row_out).max(1) as u64;
            let end = (self.next_row + n).min(t.rows);
            self.buf.clear();
            self.pos = 0;
            self.ck.rows_into(self.i, self.next_row..end, &mut self.buf);
            // The source rows are copied: drop their pages so a 2.5 GB embedding never sits
            // in the resident set whole.
            self.ck.release_rows(self.i, self.next_row..end);
            self.next_row = end;
            (self.progress)(Progress::Advance(self.buf.len() as u64));
        }
        let n = dst.len().min(self.buf.len() - self.pos);
        dst[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outtype_names_parse() {
        assert_eq!(parse_outtype("F16"), Ok(Some(OutType::F16)));
        assert_eq!(parse_outtype("bf16"), Ok(Some(OutType::Bf16)));
        assert_eq!(parse_outtype("auto"), Ok(None));
        assert!(parse_outtype("q8_0").is_err());
    }
}
