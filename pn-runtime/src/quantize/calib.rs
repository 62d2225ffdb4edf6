//! Calibration statistics: the model runs on the CPU over calibration tokens, and every matmul
//! input is accumulated once per distinct input (the weights that multiply the same activations,
//! e.g. `ffn_gate` and `ffn_up`, share one entry):
//! - the per-column sums of squares and the row count, in the basis the matmul saw (what a
//!   llama.cpp imatrix stores: run on an F16 model this is the original basis);
//! - optionally the same sums after the Hadamard rotation the PN weights are stored in, and the
//!   full Gram matrix `X^T X` in that basis (the GPTQ Hessian). Collecting after the rotation is
//!   exact: `(X H)^T (X H) = H (X^T X) H` with nothing approximated.
//!
//! [`collect`] runs the model as given (one pass, every input at once); `pn quantize` streams
//! layer by layer instead ([`super::stream`]), feeding each layer the output of the layers
//! before it as already quantized.

use super::error::QuantizeError;
use qwen_model::cpu::MatmulObserver;
use qwen_model::{CpuBackend, Model, Outputs};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// What to collect and how to run the model.
#[derive(Clone, Debug)]
pub struct CalibConfig {
    /// Tokens per chunk (each chunk is one sequence from an empty state).
    pub ctx: usize,
    /// At most this many chunks (`None`: every whole chunk of the tokens).
    pub max_chunks: Option<usize>,
    /// CPU threads for the model and the Gram accumulation (0: all cores).
    pub threads: usize,
    /// Hadamard block size of the rotated-basis statistics (`None`: none collected).
    pub rotation: Option<usize>,
    /// Also accumulate the full `X^T X` (in the rotated basis when `rotation` is set).
    pub gram: bool,
    /// With `gram`: only for the inputs of these weights (`None`: every input).
    pub gram_only: Option<Vec<String>>,
}

/// The statistics of one distinct matmul input `[count, k]`.
#[derive(Clone, Debug)]
pub struct InputStats {
    /// The weights that multiply this input, in the order the model passed them.
    pub names: Vec<String>,
    /// Input width (the weights' row length).
    pub k: usize,
    /// Rows (tokens) accumulated.
    pub count: u64,
    /// `sum_t x_tj^2` as the matmul saw it, `[k]`.
    pub sum2: Vec<f64>,
    /// `sum_t (H x_t)_j^2`, `[k]` (only with a rotation).
    pub rot_sum2: Option<Vec<f64>>,
    /// `sum_t x_t x_t^T`, `[k, k]` row-major, lower triangle filled until
    /// [`CalibStats::finish`] mirrors it (only with `gram`).
    pub gram: Option<Vec<f64>>,
}

/// Everything collected over the calibration tokens.
#[derive(Clone, Debug, Default)]
pub struct CalibStats {
    /// One entry per distinct input, in first-seen order.
    pub inputs: Vec<InputStats>,
    /// Weight name -> index in `inputs`.
    pub by_name: HashMap<String, usize>,
    /// Tokens run.
    pub tokens: usize,
    /// Chunks run.
    pub chunks: usize,
    /// Tokens per chunk.
    pub chunk_size: usize,
    /// The rotation block of `rot_sum2`/`gram` (`None`: unrotated).
    pub rotation: Option<usize>,
    /// Whether new entries get a Gram matrix.
    want_gram: bool,
    /// Restricts the Gram matrices to the inputs of these weights.
    gram_only: Option<Vec<String>>,
}

impl CalibStats {
    /// Empty statistics collecting what `cfg` asks for (its `ctx` is the chunk size).
    pub(super) fn empty(cfg: &CalibConfig) -> CalibStats {
        CalibStats {
            chunk_size: cfg.ctx.max(1),
            rotation: cfg.rotation,
            want_gram: cfg.gram,
            gram_only: cfg.gram_only.clone(),
            ..CalibStats::default()
        }
    }

    /// The statistics of the input of weight `name`.
    pub fn get(&self, name: &str) -> Option<&InputStats> {
        self.by_name.get(name).map(|&i| &self.inputs[i])
    }

    /// Mirrors every Gram matrix's lower triangle into the upper one.
    pub(super) fn finish(&mut self) {
        for s in &mut self.inputs {
            if let Some(g) = s.gram.as_mut() {
                let k = s.k;
                for i in 0..k {
                    for j in 0..i {
                        g[j * k + i] = g[i * k + j];
                    }
                }
            }
        }
    }

    pub(super) fn observe(
        &mut self,
        names: &[&str],
        x: &[f32],
        rows: usize,
        k: usize,
        threads: usize,
    ) {
        let Some(first) = names.first() else { return };
        let idx = match self.by_name.get(*first) {
            Some(&i) => i,
            None => {
                let i = self.inputs.len();
                self.inputs.push(InputStats {
                    names: names.iter().map(|s| s.to_string()).collect(),
                    k,
                    count: 0,
                    sum2: vec![0.0; k],
                    rot_sum2: self.rotation.map(|_| vec![0.0; k]),
                    gram: (self.want_gram
                        && self
                            .gram_only
                            .as_ref()
                            .is_none_or(|o| names.iter().any(|n| o.iter().any(|x| x == n))))
                    .then(|| vec![0.0; k * k]),
                });
                for n in names {
                    self.by_name.insert(n.to_string(), i);
                }
                i
            }
        };
        let rotation = self.rotation.filter(|r| k.is_multiple_of(*r));
        let s = &mut self.inputs[idx];
        if s.k != k {
            return;
        }
        s.count += rows as u64;
        for row in x.chunks_exact(k).take(rows) {
            for (a, &v) in s.sum2.iter_mut().zip(row) {
                *a += f64::from(v) * f64::from(v);
            }
        }
        // The rotated copy `[rows, k]` in f64 (or the input as is without a rotation).
        let mut xr: Vec<f32> = x[..rows * k].to_vec();
        if let Some(r) = rotation {
            // k is a multiple of r, so this cannot fail.
            let _ = pn_format::hadamard::fwht_blocks_inplace(&mut xr, r);
            if let Some(rs) = s.rot_sum2.as_mut() {
                for row in xr.chunks_exact(k) {
                    for (a, &v) in rs.iter_mut().zip(row) {
                        *a += f64::from(v) * f64::from(v);
                    }
                }
            }
        }
        if let Some(g) = s.gram.as_mut() {
            let xd: Vec<f64> = xr.iter().map(|&v| f64::from(v)).collect();
            // The lower triangle of X^T X, blocked (one GEMM); independent of the threads.
            pn_format::gptq_linalg::accumulate_lower_gram(g, &xd, rows, k, threads.clamp(1, 16));
        }
    }
}

/// Progress of a calibration run: tokens done of the total.
pub type CalibProgress<'a> = &'a (dyn Fn(usize, usize) + Sync);

/// The chunks `tokens` runs as: whole chunks of `cfg.ctx` (a text shorter than one chunk is one
/// short chunk), at most `cfg.max_chunks`; `None` when there is no token.
pub(super) fn split_chunks<'t>(tokens: &'t [u32], cfg: &CalibConfig) -> Option<Vec<&'t [u32]>> {
    let ctx = cfg.ctx.max(1);
    let mut chunks: Vec<&[u32]> = if tokens.len() < ctx {
        vec![tokens]
    } else {
        tokens.chunks_exact(ctx).collect()
    };
    if let Some(n) = cfg.max_chunks {
        chunks.truncate(n.max(1));
    }
    (!chunks.iter().all(|c| c.is_empty())).then_some(chunks)
}

/// Runs the model at `model` over `tokens` in chunks of `cfg.ctx` and returns the statistics.
/// Only whole chunks run (a text shorter than one chunk runs as one short chunk). `cancel`
/// stops between chunks with [`QuantizeError::Interrupted`].
pub fn collect(
    model: &Path,
    tokens: &[u32],
    cfg: &CalibConfig,
    progress: CalibProgress<'_>,
    cancel: &AtomicBool,
) -> Result<CalibStats, QuantizeError> {
    let err = |why: String| QuantizeError::Calibration {
        path: model.to_path_buf(),
        why,
    };
    let ctx = cfg.ctx.max(1);
    let chunks = split_chunks(tokens, cfg).ok_or_else(|| err("no calibration tokens".into()))?;
    let threads = if cfg.threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        cfg.threads
    };
    let stats = Arc::new(Mutex::new(CalibStats::empty(cfg)));
    let sink = Arc::clone(&stats);
    let observer: MatmulObserver =
        Arc::new(move |names: &[&str], x: &[f32], rows: usize, k: usize| {
            let mut s = sink.lock().unwrap_or_else(|e| e.into_inner());
            s.observe(names, x, rows, k, threads);
        });
    let mut backend = CpuBackend::new(threads);
    backend.set_matmul_observer(Some(observer));
    let m = Model::load(model, backend).map_err(|e| err(e.to_string()))?;
    let vocab = m.config.vocab;
    let total: usize = chunks.iter().map(|c| c.len()).sum();
    let mut done = 0;
    let mut logits = vec![0f32; ctx.min(tokens.len().max(1)) * vocab];
    progress(0, total);
    for chunk in &chunks {
        if cancel.load(Ordering::Relaxed) {
            return Err(QuantizeError::Interrupted);
        }
        let mut state = m.new_state(chunk.len()).map_err(|e| err(e.to_string()))?;
        let mut ws = m
            .new_workspace(chunk.len().clamp(1, 64))
            .map_err(|e| err(e.to_string()))?;
        // Every row's logits, so the LM head (`output.weight`) sees every token too.
        m.forward(
            &mut state,
            &mut ws,
            chunk,
            Outputs::all_logits(&mut logits[..chunk.len() * vocab]),
        )
        .map_err(|e| err(e.to_string()))?;
        done += chunk.len();
        progress(done, total);
    }
    drop(m);
    let mut out = Arc::try_unwrap(stats)
        .map_err(|_| err("statistics still shared after the run".into()))?
        .into_inner()
        .unwrap_or_else(|e| e.into_inner());
    out.tokens = total;
    out.chunks = chunks.len();
    out.finish();
    Ok(out)
}

/// Reads a calibration text file and tokenizes it with the tokenizer of the GGUF at `model`
/// (control-token text such as `<|endoftext|>` is that token, as in a training stream). Returns the
/// tokens and the text's sha256 (hex).
pub fn tokenize_file(
    model: &Path,
    text: &Path,
    max_tokens: Option<usize>,
) -> Result<(Vec<u32>, String), QuantizeError> {
    let terr = |why: String| QuantizeError::Calibration {
        path: PathBuf::from(text),
        why,
    };
    let bytes = std::fs::read(text).map_err(|e| terr(e.to_string()))?;
    let s = String::from_utf8(bytes).map_err(|e| terr(format!("not UTF-8: {e}")))?;
    let file = gguf_io::GgufFile::open(model).map_err(|e| QuantizeError::Gguf {
        path: model.to_path_buf(),
        source: e,
    })?;
    let tok = crate::tokenizer::Tokenizer::from_gguf(&file).map_err(|e| terr(e.to_string()))?;
    let mut ids = tok.encode(&s).map_err(|e| terr(e.to_string()))?;
    if let Some(n) = max_tokens {
        ids.truncate(n);
    }
    Ok((ids, sha256_hex(s.as_bytes())))
}

/// The sha256 of `bytes` in lower-case hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(bytes);
    d.iter().map(|b| format!("{b:02x}")).collect()
}
