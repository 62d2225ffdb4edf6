//! The calibrated PN encoders, chosen with `--method`:
//! - `imatrix`: the reference's 36-candidate scale search, each group's candidate chosen by the
//!   importance-weighted error (importances in the rotated basis, see [`rotated_importance`]);
//! - `gptq`: error feedback against the Hessian of the tensor's calibration inputs
//!   ([`pn_format::gptq`]).
//!
//! Both decode every row, rotate it as the reference path does, and encode row ranges on
//! several threads; rows are independent, so the bytes do not depend on the thread count.

use super::calib::CalibStats;
use super::codec::{decode_row, ErrStats, RowEncoder};
use super::error::QuantizeError;
use super::parallel::InputRows;
use super::stream::{layer_of, LayerStream, StreamProgress};
use pn_format::gptq::GptqFactor;
use pn_format::PnType;
use std::sync::atomic::{AtomicBool, Ordering};

/// How PN tensors are encoded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Method {
    /// The reference round-to-nearest quantizer (bit-exact, the default).
    #[default]
    Ref,
    /// Importance-weighted scale search.
    Imatrix,
    /// GPTQ error feedback.
    Gptq,
}

impl Method {
    /// Parses `ref`, `imatrix` or `gptq`.
    pub fn parse(s: &str) -> Option<Method> {
        match s {
            "ref" => Some(Method::Ref),
            "imatrix" => Some(Method::Imatrix),
            "gptq" => Some(Method::Gptq),
            _ => None,
        }
    }

    /// The name stored in `pn.quantizer.method`.
    pub fn name(self) -> &'static str {
        match self {
            Method::Ref => "ref",
            Method::Imatrix => "imatrix",
            Method::Gptq => "gptq",
        }
    }
}

/// What the encoder of one PN tensor uses.
pub enum Calibrated<'a> {
    /// Importance per rotated column `[k]`.
    Weights(&'a [f32]),
    /// GPTQ against the factored Hessian of the tensor's input (rotated basis), then
    /// `refine` rounds of [`pn_format::gptq_refine`] against the Hessian itself.
    Gptq {
        /// The factor of the damped Hessian.
        factor: &'a GptqFactor,
        /// The Hessian `[k, k]` (undamped; the factor's damping is added back).
        hessian: &'a [f64],
        /// Refinement rounds (0: plain GPTQ).
        refine: usize,
    },
}

/// The importance of each rotated column from an original-basis imatrix `imp` `[k]`: the
/// diagonal of `H D H` for the block Hadamard `H` of size `r` and `D = diag(imp)` is, in every
/// rotation block, the block's mean of `imp` (each `H_ij^2 = 1/r`). The off-diagonal of the
/// inputs' covariance is not in an imatrix, so within a block the weighting is flat; the
/// weighting still differs between blocks. Collected after the rotation (`--calib`), the
/// diagonal is exact instead.
pub fn rotated_importance(imp: &[f32], rotation: Option<usize>) -> Vec<f32> {
    let Some(r) = rotation.filter(|&r| r > 0 && imp.len().is_multiple_of(r)) else {
        return imp.to_vec();
    };
    let mut out = Vec::with_capacity(imp.len());
    for b in imp.chunks_exact(r) {
        let m = b.iter().map(|&v| f64::from(v)).sum::<f64>() / r as f64;
        out.extend(std::iter::repeat_n(m as f32, r));
    }
    out
}

/// Threads, cancel flag and progress of one encoding.
pub struct Workers<'a> {
    /// Worker threads.
    pub threads: usize,
    /// Set from outside to stop.
    pub cancel: &'a AtomicBool,
    /// Called with input bytes finished.
    pub advance: &'a (dyn Fn(u64) + Sync),
}

/// Rows per unit of work (cancel and progress granularity) for rows of up to
/// [`WIDE_ROW`] weights.
const ROWS_PER_TASK: usize = 16;

/// Row length from which a task takes [`WIDE_ROWS_PER_TASK`] rows: every task streams the
/// whole factor `U` (`k * k / 2` f64, 1.2 GB at the 27B `ffn_down`'s k = 17408) through its
/// trailing updates once, so wide rows need more rows per pass; the task's f64 working copy is
/// `rows * k * 8` bytes (8.9 MB at 64 x 17408).
const WIDE_ROW: usize = 4096;

/// Rows per task for rows longer than [`WIDE_ROW`].
const WIDE_ROWS_PER_TASK: usize = 64;

/// Encodes every row of a PN tensor with `how`; returns the bytes and the error sums (rotated
/// basis, which has the original basis's norms). With `hessian` (`[k, k]`, rotated basis) the
/// weighted sums are the output error `e H e^T` and `w H w^T` per row (for `--report`).
pub fn encode_tensor(
    input: &InputRows<'_>,
    enc: &RowEncoder,
    how: &Calibrated<'_>,
    workers: &Workers<'_>,
    hessian: Option<&[f64]>,
) -> Result<(Vec<u8>, ErrStats), QuantizeError> {
    let Some(pn) = enc.target.pn() else {
        return Err(QuantizeError::Codec {
            tensor: enc.tensor.clone(),
            msg: "calibrated encoding is for PN targets only".into(),
        });
    };
    let (k, rows, orb) = (enc.k, input.rows, enc.out_row_bytes());
    let mut out = vec![0u8; rows * orb];
    // Rows are independent, so the task size changes no byte.
    let per_task = if k > WIDE_ROW {
        WIDE_ROWS_PER_TASK
    } else {
        ROWS_PER_TASK
    };
    let tasks: Vec<(usize, &mut [u8])> = out
        .chunks_mut(per_task * orb)
        .enumerate()
        .map(|(i, c)| (i * per_task, c))
        .collect();
    let threads = workers.threads.clamp(1, tasks.len().max(1));
    let mut per: Vec<Vec<(usize, &mut [u8])>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, t) in tasks.into_iter().enumerate() {
        per[i % threads].push(t);
    }
    let run = |mine: Vec<(usize, &mut [u8])>| -> Result<ErrStats, QuantizeError> {
        let mut stats = ErrStats::default();
        for (r0, dst) in mine {
            if workers.cancel.load(Ordering::Relaxed) {
                return Err(QuantizeError::Interrupted);
            }
            let n = dst.len() / orb;
            let mut w = vec![0f32; n * k];
            for (i, row) in w.chunks_exact_mut(k).enumerate() {
                let r = r0 + i;
                let src = &input.bytes[r * input.row_bytes..(r + 1) * input.row_bytes];
                decode_row(&enc.tensor, r as u64, input.ty, src, row)?;
                if let Some(rb) = enc.rotation {
                    pn_format::hadamard::fwht_blocks_inplace(row, rb)
                        .map_err(|e| codec_err(enc, r, e))?;
                }
            }
            encode_rows(pn, how, &w, dst).map_err(|e| codec_err(enc, r0, e))?;
            let (mut d, zero) = (vec![0f32; k], vec![0f32; k]);
            for (i, (row, q)) in w.chunks_exact(k).zip(dst.chunks_exact(orb)).enumerate() {
                pn_format::dequantize_row(pn, q, &mut d).map_err(|e| codec_err(enc, r0 + i, e))?;
                for (&a, &b) in row.iter().zip(&d) {
                    stats.w2 += f64::from(a) * f64::from(a);
                    stats.e2 += (f64::from(a) - f64::from(b)).powi(2);
                }
                if let Some(h) = hessian.filter(|h| h.len() == k * k) {
                    stats.e2_weighted += pn_format::gptq::hessian_error(h, k, row, &d);
                    stats.w2_weighted += pn_format::gptq::hessian_error(h, k, row, &zero);
                }
            }
            (workers.advance)((n * input.row_bytes) as u64);
        }
        Ok(stats)
    };
    let run = &run;
    let total = std::thread::scope(|s| {
        let handles: Vec<_> = per
            .into_iter()
            .map(|mine| s.spawn(move || run(mine)))
            .collect();
        super::parallel::join_stats(handles, &enc.tensor)
    })?;
    Ok((out, total))
}

/// Encodes rotated rows `w` `[n, k]` into `dst` (`n` rows of blocks).
fn encode_rows(
    pn: PnType,
    how: &Calibrated<'_>,
    w: &[f32],
    dst: &mut [u8],
) -> Result<(), pn_format::PnError> {
    match how {
        Calibrated::Gptq {
            factor,
            hessian,
            refine,
        } => {
            pn_format::gptq::quantize_rows_gptq(pn, factor, w, dst)?;
            if *refine > 0 {
                pn_format::gptq_refine::refine_rows(pn, hessian, factor.damp(), w, dst, *refine)?;
            }
            Ok(())
        }
        Calibrated::Weights(imp) => {
            let k = imp.len();
            let orb = dst.len() / (w.len() / k.max(1)).max(1);
            for (i, (row, out)) in w.chunks_exact(k).zip(dst.chunks_exact_mut(orb)).enumerate() {
                let q = pn_format::weighted::quantize_row_weighted(pn, row, imp)
                    .map_err(|e| e.in_row(i))?;
                out.copy_from_slice(&q);
            }
            Ok(())
        }
    }
}

fn codec_err(enc: &RowEncoder, row: usize, e: impl std::fmt::Display) -> QuantizeError {
    QuantizeError::Codec {
        tensor: enc.tensor.clone(),
        msg: format!("row {row}: {e}"),
    }
}

/// The calibration data of one `pn quantize` run and the encoder choice it makes per tensor.
pub struct CalibRun {
    /// The method in force (never [`Method::Ref`] here).
    pub method: Method,
    /// The calibration tokens streamed layer by layer, from `--calib` text, if given.
    pub stream: Option<LayerStream>,
    /// Original-basis importances from `--imatrix`, if given.
    pub imatrix: Option<super::imatrix::Importance>,
    /// The rotation of the PN tensors.
    pub rotation: Option<usize>,
    /// Relative GPTQ damping.
    pub damp: f64,
    /// Measure each GPTQ tensor's Hessian-weighted error (`--report`).
    pub report: bool,
    /// Refinement rounds after each GPTQ pass ([`pn_format::gptq_refine`]; `PN_GPTQ_REFINE`
    /// overrides the default [`pn_format::gptq_refine::DEFAULT_ROUNDS`], 0 turns it off).
    pub refine: usize,
    /// Factored Hessians of the current layer by input index, with how many tensors still use
    /// each.
    factors: std::collections::HashMap<usize, (std::sync::Arc<GptqFactor>, usize)>,
    /// The layer `factors` belong to.
    factors_layer: Option<usize>,
}

impl CalibRun {
    /// A run with the given data (`factors` start empty).
    pub fn new(
        method: Method,
        stream: Option<LayerStream>,
        imatrix: Option<super::imatrix::Importance>,
        rotation: Option<usize>,
        damp: f64,
    ) -> CalibRun {
        CalibRun {
            method,
            stream,
            imatrix,
            rotation,
            damp,
            report: false,
            refine: std::env::var("PN_GPTQ_REFINE")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(pn_format::gptq_refine::DEFAULT_ROUNDS),
            factors: Default::default(),
            factors_layer: None,
        }
    }

    /// Encodes PN tensor `enc` with the run's method, or `None` when there is no calibration
    /// data for it (e.g. `token_embd`, which is no matmul input, or the MTP block, which the
    /// trunk's calibration pass does not run): the caller uses the reference. With streamed
    /// calibration, tensors must come in layer order; `on_layer` reports the layer passes.
    pub fn encode(
        &mut self,
        input: &InputRows<'_>,
        enc: &RowEncoder,
        workers: &Workers<'_>,
        on_layer: StreamProgress<'_>,
    ) -> Result<Option<(Vec<u8>, ErrStats)>, QuantizeError> {
        let name = enc.tensor.as_str();
        if self.method == Method::Ref {
            return Ok(None);
        }
        let layer =
            layer_of(name).filter(|&l| self.stream.as_ref().is_some_and(|s| l < s.n_layers()));
        let done = {
            let stats: Option<&CalibStats> = match (self.stream.as_mut(), layer) {
                (Some(s), Some(l)) => {
                    if self.factors_layer != Some(l) {
                        self.factors.clear();
                        self.factors_layer = Some(l);
                    }
                    Some(s.stats_for(l, on_layer, workers.cancel)?)
                }
                _ => None,
            };
            match self.method {
                Method::Ref => None,
                Method::Imatrix => {
                    let imp = match (stats, &self.imatrix) {
                        (Some(s), _) => s.get(name).and_then(|i| {
                            let c = i.count.max(1) as f64;
                            i.rot_sum2
                                .as_ref()
                                .or(self.rotation.is_none().then_some(&i.sum2))
                                .map(|v| v.iter().map(|&x| (x / c) as f32).collect::<Vec<f32>>())
                        }),
                        (None, Some(m)) => {
                            m.get(name).map(|v| rotated_importance(v, self.rotation))
                        }
                        (None, None) => None,
                    };
                    match imp.filter(|v| v.len() == enc.k) {
                        Some(imp) => Some(encode_tensor(
                            input,
                            enc,
                            &Calibrated::Weights(&imp),
                            workers,
                            None,
                        )?),
                        None => None,
                    }
                }
                Method::Gptq => match stats {
                    Some(stats) => {
                        let job = GptqJob {
                            damp: self.damp,
                            refine: self.refine,
                            report: self.report,
                            input,
                            enc,
                            workers,
                        };
                        gptq_encode(stats, &mut self.factors, &job)?
                    }
                    None => None,
                },
            }
        };
        if let (Some(s), Some(_), Some((bytes, _))) = (self.stream.as_mut(), layer, done.as_ref()) {
            s.record(name, enc.target.ggml(), bytes.clone());
        }
        Ok(done)
    }
}

/// One tensor's GPTQ encoding: damping, whether to measure the Hessian-weighted error, the
/// input rows, the encoder and the workers.
struct GptqJob<'a> {
    damp: f64,
    refine: usize,
    report: bool,
    input: &'a InputRows<'a>,
    enc: &'a RowEncoder,
    workers: &'a Workers<'a>,
}

/// GPTQ of `enc` against the Hessian of its input in `stats` (`None` when there is none),
/// factoring it once for every weight that shares the input (`factors`, by input index).
fn gptq_encode(
    stats: &CalibStats,
    factors: &mut std::collections::HashMap<usize, (std::sync::Arc<GptqFactor>, usize)>,
    job: &GptqJob<'_>,
) -> Result<Option<(Vec<u8>, ErrStats)>, QuantizeError> {
    let GptqJob {
        damp,
        refine: _,
        report,
        input,
        enc,
        workers,
    } = *job;
    let name = enc.tensor.as_str();
    let Some(&idx) = stats.by_name.get(name) else {
        return Ok(None);
    };
    let st = &stats.inputs[idx];
    let Some(h) = st.gram.as_ref().filter(|_| st.k == enc.k) else {
        return Ok(None);
    };
    let entry = match factors.remove(&idx) {
        Some(e) => e,
        None => {
            let f = GptqFactor::new_threaded(h, st.k, damp, workers.threads).map_err(|e| {
                QuantizeError::Codec {
                    tensor: name.to_string(),
                    msg: format!("GPTQ Hessian of its input: {e}"),
                }
            })?;
            (std::sync::Arc::new(f), st.names.len())
        }
    };
    let hessian = report.then_some(h.as_slice());
    let how = Calibrated::Gptq {
        factor: &entry.0,
        hessian: h,
        refine: job.refine,
    };
    let r = encode_tensor(input, enc, &how, workers, hessian)?;
    // Keep the factor until every weight sharing the input is done.
    if entry.1 > 1 {
        factors.insert(idx, (entry.0, entry.1 - 1));
    }
    Ok(Some(r))
}
