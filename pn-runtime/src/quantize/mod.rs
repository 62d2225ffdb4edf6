//! `pn quantize`: turns an F32/F16/BF16/Q8_0 `qwen35` GGUF into a PN model.
//!
//! The pipeline, one module per step:
//! - [`mix`]: the role of each tensor and the type a named mix gives it (decisions doc section 7);
//! - [`plan`]: per-tensor plan (target type, K checks);
//! - [`fallback`]: a K-quant whose super-block does not tile K gets the smallest real type of
//!   similar measured quality (or, for the stock baselines, an F32 simulation);
//! - [`rotation`]: the Hadamard block size (section 6);
//! - promotion (here): rank the pn3t tensors by relative squared error after rotation, optionally
//!   weighted by an importance matrix ([`imatrix`]), and promote the worst N to pn4t; the
//!   ranking pass's bytes of the tensors that stay pn3t are spilled to a scratch file and reused;
//! - [`parallel`] + [`codec`]: decode each row, rotate it (`W H`), quantize it with exactly
//!   `pn_format::quantize_row_ref` (stock types: gguf-io's quantizers), several threads per tensor;
//! - [`output`]: everything goes to a temporary file that is renamed only when complete;
//! - [`eval`]: model-level quality (KL, top-1, perplexity) through qwen-model's forward pass.
//!
//! Memory stays bounded: the input is memory-mapped and one tensor's output is held at a time.

pub mod calib;
pub mod calibrated;
pub mod codec;
pub mod error;
pub mod eval;
pub mod fallback;
pub mod imatrix;
pub mod kmix;
pub mod mix;
pub mod output;
pub mod parallel;
pub mod plan;
pub mod rotation;
pub mod source;
mod spill;
pub mod stream;
pub mod summary;

pub use calibrated::Method;
pub use error::QuantizeError;
pub use fallback::{FallbackChoice, FallbackPolicy};
pub use mix::{Mix, MixKind, Role, Target};
pub use rotation::RotationChoice;
pub use summary::{QuantizeSummary, TensorResult};

use codec::ErrStats;
use gguf_io::{GgmlType, GgufError, GgufWriter, Value};
use parallel::{encode_tensor, EncodeJob, InputRows};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

/// Metadata key: rotation kind (`"hadamard"`); absent means no rotation.
pub const KEY_ROTATION_KIND: &str = "pn.rotation.kind";
/// Metadata key: rotation block size (u32).
pub const KEY_ROTATION_BLOCK: &str = "pn.rotation.block_size";
/// Metadata key: the mix name (string).
pub const KEY_MIX: &str = "pn.mix";
/// Metadata key: the promoted tensor names (string array).
pub const KEY_PROMOTED: &str = "pn.promoted";
/// Metadata key: tensors stored as F32 stand-ins of a stock type (string array; only present
/// when there are any, i.e. with [`FallbackPolicy::Simulate`]).
pub const KEY_SIMULATED: &str = "pn.simulated";
/// Metadata key: the PN encoder (`ref`, `imatrix`, `gptq`); absent for `ref`, whose output
/// stays byte-identical to a run without calibration.
pub const KEY_QUANTIZER_METHOD: &str = "pn.quantizer.method";
/// Metadata key: calibration tokens run (u64; only with calibration text).
pub const KEY_QUANTIZER_TOKENS: &str = "pn.quantizer.calib_tokens";
/// Metadata key: sha256 (hex) of the calibration text (only with calibration text).
pub const KEY_QUANTIZER_HASH: &str = "pn.quantizer.calib_sha256";
/// Metadata key: how the stock K-quant/Q8_0 tensors were encoded, `imatrix` when an importance
/// matrix weighted them (`gguf_io::quants::quantize_row_weighted`); absent when none was.
pub const KEY_QUANTIZER_KQUANT: &str = "pn.quantizer.kquant_method";
/// Metadata key: how many stock tensors the importance matrix weighted (u32; with
/// [`KEY_QUANTIZER_KQUANT`]).
pub const KEY_QUANTIZER_KQUANT_TENSORS: &str = "pn.quantizer.kquant_weighted";
/// Metadata key: K-quant tensors stored in a real fallback type, as `name=q3_K->pn4t` strings
/// (string array; only present when there are any).
pub const KEY_FALLBACK: &str = "pn.fallback";

/// Everything `pn quantize` takes.
#[derive(Clone, Debug)]
pub struct QuantizeOptions {
    /// Input GGUF.
    pub input: PathBuf,
    /// Output GGUF (must not exist unless `force`).
    pub output: PathBuf,
    /// The mix (default `P0k+19`).
    pub mix: Mix,
    /// Overrides the mix's promotion count.
    pub promote: Option<usize>,
    /// Rotation block choice.
    pub rotation: RotationChoice,
    /// Importance matrix used to rank promotions.
    pub imatrix: Option<PathBuf>,
    /// Worker threads (0 = all cores).
    pub threads: usize,
    /// Overwrite an existing output.
    pub force: bool,
    /// Measure the unrotated error of every PN tensor too.
    pub report: bool,
    /// What to do with K-quants that cannot tile K (`None`: the mix's default, see
    /// [`FallbackPolicy::default_for`]).
    pub fallback: Option<FallbackPolicy>,
    /// The PN encoder (`None`: `gptq` with calibration text, else `ref`).
    pub method: Option<Method>,
    /// Calibration text for the `imatrix` and `gptq` methods.
    pub calib: Option<CalibInput>,
    /// Per-tensor type overrides (`--tensor-type NAME=TYPE`), fixed before any promotion
    /// ([`plan::apply_overrides`]).
    pub tensor_types: Vec<(String, GgmlType)>,
}

/// Calibration text and how much of it to run.
#[derive(Clone, Debug)]
pub struct CalibInput {
    /// A UTF-8 text file, tokenized with the input model's tokenizer.
    pub text: PathBuf,
    /// Use at most this many tokens.
    pub max_tokens: Option<usize>,
    /// Tokens per chunk (one sequence each).
    pub ctx: usize,
    /// Relative GPTQ damping (`lambda = damp * mean diag H`).
    pub damp: f64,
}

impl QuantizeOptions {
    /// Defaults for `input -> output`: P0k+19, default rotation, all cores.
    pub fn new(input: impl Into<PathBuf>, output: impl Into<PathBuf>) -> QuantizeOptions {
        QuantizeOptions {
            input: input.into(),
            output: output.into(),
            mix: Mix::p0k19(),
            promote: None,
            rotation: RotationChoice::Default,
            imatrix: None,
            threads: 0,
            force: false,
            report: false,
            fallback: None,
            method: None,
            calib: None,
            tensor_types: Vec::new(),
        }
    }
}

/// Progress events, sent from the calling thread and from worker threads.
#[derive(Clone, Copy, Debug)]
pub enum Progress<'a> {
    /// A new phase starts (`"ranking"` or `"quantizing"`) over this many input bytes.
    Phase {
        /// Phase name.
        label: &'a str,
        /// Input bytes the phase will read.
        total_bytes: u64,
    },
    /// Calibration: this many tokens of `total` have run through the model.
    Calib {
        /// Tokens done.
        done: usize,
        /// Tokens in all.
        total: usize,
    },
    /// Work on a tensor starts.
    Tensor {
        /// Tensor name.
        name: &'a str,
    },
    /// This many more input bytes are done.
    Advance(u64),
}

/// A progress sink that ignores everything.
pub fn no_progress(_: Progress<'_>) {}

/// Quantizes `opts.input` into `opts.output`. `cancel` stops the run (the temporary output is
/// removed and [`QuantizeError::Interrupted`] returned).
pub fn quantize_model(
    opts: &QuantizeOptions,
    progress: &(dyn Fn(Progress<'_>) + Sync),
    cancel: &AtomicBool,
) -> Result<QuantizeSummary, QuantizeError> {
    let t0 = Instant::now();
    // A GGUF, or a checkpoint folder converted on the fly.
    let file = source::InputModel::open(&opts.input)?;
    let mut mix = opts.mix.clone();
    if let Some(n) = opts.promote {
        mix.promote = n;
    }
    let policy = opts
        .fallback
        .unwrap_or_else(|| FallbackPolicy::default_for(mix.kind));
    let mut plan = plan::make_plan(&file, &opts.input, &mix, opts.rotation, policy)?;
    plan::apply_overrides(&mut plan, &opts.tensor_types, policy)?;
    // Refuse an existing output before the long ranking pass, not after it.
    if opts.output.exists() && !opts.force {
        return Err(QuantizeError::OutputExists(opts.output.clone()));
    }
    let importance = match &opts.imatrix {
        Some(p) => {
            let imp = imatrix::load(p)?;
            imatrix::check_model(p, &imp, |n| {
                plan.tensors
                    .iter()
                    .find(|t| t.name() == n)
                    .map(|t| t.encoder.k)
            })?;
            // The stock K-quant/Q8_0 tensors it covers are encoded importance-weighted.
            plan::set_stock_weights(&mut plan, &imp);
            Some(imp)
        }
        None => None,
    };
    let threads = if opts.threads == 0 {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    } else {
        opts.threads
    };
    let mut calib_run =
        prepare_calibration(opts, &plan, importance.as_ref(), threads, progress, cancel)?;
    if calib_run.as_ref().is_some_and(|r| r.0.stream.is_some()) {
        stream::order_by_layer(&mut plan.tensors, |t| t.name());
    }

    let pass = Pass {
        file: &file,
        threads,
        progress,
        cancel,
    };
    resolve_fallbacks(&pass, &mut plan)?;
    let climbed = climb_ladder(&pass, &mut plan, (&mix, policy), importance.as_ref())?;
    let ranking = Ranking {
        output: &opts.output,
        n: mix.effective_promote(),
        importance: importance.as_ref(),
        report: opts.report,
    };
    let ranked = promote(&pass, &mut plan, &ranking)?;
    let mut promoted = ranked.promoted.clone();
    promoted.extend(climbed.iter().flatten().map(|s| s.name.clone()));
    let mix_name = if let Some(steps) = climbed.as_ref().filter(|_| kmix::is_q3km(mix.kind)) {
        format!("q3k-m+{}", steps.len())
    } else if mix.kind == MixKind::P0k {
        Mix {
            kind: MixKind::P0k,
            promote: promoted.len(),
        }
        .to_string()
    } else {
        mix.to_string()
    };

    let (guard, mut out) = output::TempOutput::create(&opts.output, &opts.input, opts.force)?;
    let needed: u64 = plan.tensors.iter().map(|t| t.out_bytes()).sum();
    let write_err = |e: GgufError| match e {
        GgufError::Io(io) => guard.write_err(io, needed),
        other => QuantizeError::GgufWrite {
            path: opts.output.clone(),
            source: other,
        },
    };

    let mut w = GgufWriter::new(&mut out);
    for m in file.metadata() {
        // Stale PN keys of an earlier run must not survive; everything else is copied as is.
        if !m.key.starts_with("pn.") {
            w.add_metadata(m.key.clone(), m.value.clone())
                .map_err(write_err)?;
        }
    }
    if let Some(r) = plan.rotation {
        w.add_metadata(KEY_ROTATION_KIND, Value::String("hadamard".into()))
            .map_err(write_err)?;
        w.add_metadata(KEY_ROTATION_BLOCK, Value::U32(r as u32))
            .map_err(write_err)?;
    }
    w.add_metadata(KEY_MIX, Value::String(mix_name.clone()))
        .map_err(write_err)?;
    if let Some((run, tokens, hash)) = &calib_run {
        w.add_metadata(
            KEY_QUANTIZER_METHOD,
            Value::String(run.method.name().into()),
        )
        .map_err(write_err)?;
        if let Some(hash) = hash {
            w.add_metadata(KEY_QUANTIZER_TOKENS, Value::U64(*tokens as u64))
                .map_err(write_err)?;
            w.add_metadata(KEY_QUANTIZER_HASH, Value::String(hash.clone()))
                .map_err(write_err)?;
        }
    }
    let kquant_weighted = plan
        .tensors
        .iter()
        .filter(|t| t.encoder.weighted_stock())
        .count();
    if kquant_weighted > 0 {
        w.add_metadata(KEY_QUANTIZER_KQUANT, Value::String("imatrix".into()))
            .map_err(write_err)?;
        w.add_metadata(
            KEY_QUANTIZER_KQUANT_TENSORS,
            Value::U32(kquant_weighted as u32),
        )
        .map_err(write_err)?;
    }
    w.add_metadata(
        KEY_PROMOTED,
        Value::Array(gguf_io::Array::String(promoted.clone())),
    )
    .map_err(write_err)?;
    let simulated: Vec<String> = plan
        .tensors
        .iter()
        .filter(|t| t.encoder.simulated)
        .map(|t| t.name().to_string())
        .collect();
    if !simulated.is_empty() {
        w.add_metadata(
            KEY_SIMULATED,
            Value::Array(gguf_io::Array::String(simulated)),
        )
        .map_err(write_err)?;
    }
    let fallbacks: Vec<String> = plan
        .tensors
        .iter()
        .filter_map(|t| {
            t.fallback
                .as_ref()
                .map(|f| format!("{}={}", t.name(), f.label()))
        })
        .collect();
    if !fallbacks.is_empty() {
        w.add_metadata(
            KEY_FALLBACK,
            Value::Array(gguf_io::Array::String(fallbacks)),
        )
        .map_err(write_err)?;
    }
    for t in &plan.tensors {
        w.add_tensor_info(t.name(), t.encoder.out_type(), &t.dims)
            .map_err(write_err)?;
    }
    w.write_header().map_err(write_err)?;

    let total_in: u64 = plan.tensors.iter().map(|t| t.in_bytes).sum();
    progress(Progress::Phase {
        label: "quantizing",
        total_bytes: total_in,
    });
    let mut results = Vec::with_capacity(plan.tensors.len());
    let mut ranked = ranked;
    for (i, t) in plan.tensors.iter().enumerate() {
        progress(Progress::Tensor { name: t.name() });
        let calibrated = match calib_run.as_mut() {
            Some((run, _, _)) if t.encoder.target.is_pn() => {
                let bytes = tensor_bytes(&file, t)?;
                let input = input_rows(&bytes, t)?;
                let advance = |n: u64| progress(Progress::Advance(n));
                let workers = calibrated::Workers {
                    threads,
                    cancel,
                    advance: &advance,
                };
                // Layer passes show in the tensor slot of the bar (its ETA counts bytes).
                let on_layer = |done: usize, total: usize| {
                    let what = if done % 2 == 1 { "float" } else { "quantized" };
                    let name = format!(
                        "layer {}/{}: {what} calibration pass done",
                        done.div_ceil(2),
                        total / 2
                    );
                    progress(Progress::Tensor { name: &name })
                };
                run.encode(&input, &t.encoder, &workers, &on_layer)?
            }
            _ => None,
        };
        let (bytes, stats) = match calibrated {
            Some(done) => done,
            None => match ranked.take(i)? {
                // Encoded by the ranking pass and not promoted: the same bytes, read back.
                Some(done) => {
                    progress(Progress::Advance(t.in_bytes));
                    done
                }
                None => encode_one(&pass, t, true, opts.report, None)?,
            },
        };
        w.write_tensor_data(t.name(), &bytes).map_err(write_err)?;
        results.push(TensorResult {
            name: t.name().to_string(),
            role: t.role,
            ty: t.encoder.target.ggml().name(),
            simulated: t.encoder.simulated,
            fallback: t.fallback.clone(),
            promoted: t.promoted,
            params: t.params(),
            bytes: t.out_bytes(),
            nominal_bytes: t.nominal_bytes(),
            stats,
        });
    }
    w.finish().map_err(write_err)?;
    let file_out = out
        .into_inner()
        .map_err(|e| guard.write_err(e.into_error(), needed))?;
    let out_bytes = file_out
        .metadata()
        .map(|m| m.len())
        .map_err(|e| guard.write_err(e, needed))?;
    guard.commit(file_out)?;
    Ok(QuantizeSummary {
        mix: mix_name,
        rotation: plan.rotation,
        promoted,
        tensors: results,
        in_bytes: total_in,
        out_bytes,
        seconds: t0.elapsed().as_secs_f64(),
        report: opts.report,
    })
}

/// What every encoding pass over the input file shares: the file, the worker threads, the
/// progress callback and the cancel flag.
struct Pass<'a> {
    file: &'a source::InputModel,
    threads: usize,
    progress: &'a (dyn Fn(Progress<'_>) + Sync),
    cancel: &'a AtomicBool,
}

/// Encodes tensor `t` of the input (`keep_output`: return the bytes; `unrotated`: also measure
/// the unrotated PN error; `importance`: weight the error by it).
fn encode_one(
    pass: &Pass<'_>,
    t: &plan::TensorPlan,
    keep_output: bool,
    unrotated: bool,
    importance: Option<&[f32]>,
) -> Result<(Vec<u8>, ErrStats), QuantizeError> {
    let Pass {
        file,
        threads,
        progress,
        cancel,
    } = *pass;
    let bytes = tensor_bytes(file, t)?;
    let input = input_rows(&bytes, t)?;
    let advance = |n: u64| progress(Progress::Advance(n));
    let job = EncodeJob {
        keep_output,
        unrotated: unrotated && t.encoder.target.is_pn(),
        importance,
        threads,
        cancel,
        advance: &advance,
    };
    encode_tensor(&input, &t.encoder, &job)
}

/// The raw bytes of tensor `t` of the input: borrowed from a GGUF's map, or converted from a
/// checkpoint's tensor.
fn tensor_bytes<'f>(
    file: &'f source::InputModel,
    t: &plan::TensorPlan,
) -> Result<std::borrow::Cow<'f, [u8]>, QuantizeError> {
    file.tensor_bytes(t.name())
        .map_err(|e| QuantizeError::Codec {
            tensor: t.name().to_string(),
            msg: e.to_string(),
        })
}

/// The rows of tensor `t` in its raw `bytes`.
fn input_rows<'b>(bytes: &'b [u8], t: &plan::TensorPlan) -> Result<InputRows<'b>, QuantizeError> {
    let row_bytes = t
        .in_ty
        .row_bytes(t.encoder.k as u64)
        .ok_or_else(|| QuantizeError::NoRule {
            tensor: t.name().to_string(),
            k: t.encoder.k as u64,
            why: format!("not a whole number of {} blocks", t.in_ty.name()),
        })? as usize;
    Ok(InputRows {
        bytes,
        ty: t.in_ty,
        row_bytes,
        rows: t.rows as usize,
    })
}

/// The calibrated method in force (`None` for `ref`), with the calibration token count and
/// text hash when calibration text was run. Errors if the method needs data it was not given.
fn prepare_calibration(
    opts: &QuantizeOptions,
    plan: &plan::ModelPlan,
    importance: Option<&imatrix::Importance>,
    threads: usize,
    progress: &(dyn Fn(Progress<'_>) + Sync),
    cancel: &AtomicBool,
) -> Result<Option<(calibrated::CalibRun, usize, Option<String>)>, QuantizeError> {
    let method = opts.method.unwrap_or(if opts.calib.is_some() {
        Method::Gptq
    } else {
        Method::Ref
    });
    let need = |why: &str| QuantizeError::Calibration {
        path: opts.input.clone(),
        why: format!("--method {} {why}", method.name()),
    };
    match (method, &opts.calib, importance) {
        (Method::Ref, _, _) => return Ok(None),
        (Method::Gptq, None, _) => return Err(need("needs calibration text (--calib)")),
        (Method::Imatrix, None, None) => return Err(need("needs --calib TEXT or --imatrix FILE")),
        _ => {}
    }
    let Some(c) = &opts.calib else {
        let run = calibrated::CalibRun::new(method, None, importance.cloned(), plan.rotation, 0.0);
        return Ok(Some((run, 0, None)));
    };
    let (tokens, hash) = calib::tokenize_file(&opts.input, &c.text, c.max_tokens)?;
    let cfg = calib::CalibConfig {
        ctx: c.ctx,
        max_chunks: None,
        threads,
        rotation: plan.rotation,
        gram: method == Method::Gptq,
        gram_only: None,
    };
    let _ = (progress, cancel);
    let stream = stream::LayerStream::open(&opts.input, &tokens, &cfg, plan.rotation)?;
    let n = stream.tokens();
    let mut run = calibrated::CalibRun::new(method, Some(stream), None, plan.rotation, c.damp);
    run.report = opts.report;
    Ok(Some((run, n, Some(hash))))
}

/// Measures and fixes the type of every tensor whose K-quant cannot tile K
/// ([`fallback::choose`]); PN choices take the file's rotation.
fn resolve_fallbacks(pass: &Pass<'_>, plan: &mut plan::ModelPlan) -> Result<(), QuantizeError> {
    let progress = pass.progress;
    let pending: Vec<usize> = (0..plan.tensors.len())
        .filter(|&i| plan.tensors[i].fallback_from.is_some())
        .collect();
    if pending.is_empty() {
        return Ok(());
    }
    // An upper bound: the intended type plus at most four candidates per tensor.
    progress(Progress::Phase {
        label: "fallback",
        total_bytes: pending.iter().map(|&i| plan.tensors[i].in_bytes * 5).sum(),
    });
    for i in pending {
        let t = &plan.tensors[i];
        let Some(intended) = t.fallback_from else {
            continue;
        };
        progress(Progress::Tensor { name: t.name() });
        let choice = fallback::choose(t.name(), t.encoder.k, intended, plan.rotation, |enc| {
            let mut probe = t.clone();
            probe.encoder = enc.clone();
            // The importance weighting of a stock type carries to its stock candidates.
            probe.encoder.weights = t.encoder.weights.clone();
            encode_one(pass, &probe, false, false, None).map(|r| r.1)
        })?;
        let t = &mut plan.tensors[i];
        let weights = t.encoder.weights.take();
        t.encoder = fallback::encoder_for(t.name(), t.encoder.k, choice.chosen, plan.rotation);
        t.encoder.weights = weights.filter(|_| !choice.chosen.is_pn());
        t.fallback = Some(choice);
    }
    Ok(())
}

/// For the `q3k-m` mixes, climbs the K-quant ladder, for `P0k@B` the PN ladder
/// ([`kmix::climb`]), by each tensor's measured (importance-weighted, with an imatrix) relative
/// error; `None` for the other mixes.
fn climb_ladder(
    pass: &Pass<'_>,
    plan: &mut plan::ModelPlan,
    (mix, policy): (&Mix, FallbackPolicy),
    importance: Option<&imatrix::Importance>,
) -> Result<Option<Vec<kmix::Step>>, QuantizeError> {
    let (limit, ladder) = match mix.kind {
        MixKind::Q3kM => (kmix::Climb::Steps(mix.promote), kmix::Ladder::KQuant),
        MixKind::Q3kMBudget(b) => (
            kmix::Climb::Budget(f64::from(b) / 1e6),
            kmix::Ladder::KQuant,
        ),
        MixKind::P0kBudget(b) => (kmix::Climb::Budget(f64::from(b) / 1e6), kmix::Ladder::Pn),
        MixKind::P0kKBudget(b) => (
            kmix::Climb::Budget(f64::from(b) / 1e6),
            kmix::Ladder::PnK {
                simulate: policy == FallbackPolicy::Simulate,
            },
        ),
        _ => return Ok(None),
    };
    (pass.progress)(Progress::Phase {
        label: "ranking",
        total_bytes: plan.tensors.iter().map(|t| t.in_bytes).sum(),
    });
    let steps = kmix::climb(plan, limit, ladder, |t| {
        (pass.progress)(Progress::Tensor { name: t.name() });
        let imp = importance
            .and_then(|m| m.get(t.name()))
            .filter(|v| v.len() == t.encoder.k)
            .map(|v| v.as_slice());
        encode_one(pass, t, false, false, imp).map(|r| r.1)
    })?;
    // A PN tensor stepped up to Q8_0 is a stock tensor now: weighted like the others.
    if let Some(imp) = importance {
        plan::set_stock_weights(plan, imp);
    }
    Ok(Some(steps))
}

/// What the ranking pass leaves behind: the promoted names, and the encoded bytes of every
/// pn3t tensor that stays pn3t, spilled to a hidden temporary file beside the output (so the
/// main pass does not quantize them twice, and memory stays bounded).
struct Ranked {
    promoted: Vec<String>,
    spill: Option<spill::Spill>,
    /// Tensor index -> (offset, length, error sums) in the spill file.
    entries: std::collections::HashMap<usize, (u64, u64, ErrStats)>,
}

impl Ranked {
    /// The spilled bytes and stats of tensor `i`, if the ranking pass kept them.
    fn take(&mut self, i: usize) -> Result<Option<(Vec<u8>, ErrStats)>, QuantizeError> {
        let (Some(spill), Some(&(off, len, stats))) = (self.spill.as_mut(), self.entries.get(&i))
        else {
            return Ok(None);
        };
        Ok(Some((spill.read(off, len)?, stats)))
    }
}

/// Ranks the pn3t tensors by relative squared error after rotation (importance-weighted when
/// an importance vector exists for the tensor) and turns the worst `n` into pn4t. Ties go to
/// the name, so the result does not depend on timing.
/// What [`promote`] ranks for.
struct Ranking<'a> {
    /// The output file (the spill file goes beside it).
    output: &'a std::path::Path,
    /// How many pn3t tensors become pn4t.
    n: usize,
    /// Importance vectors weighting each tensor's error, when an imatrix was given.
    importance: Option<&'a imatrix::Importance>,
    /// Also measure the unrotated error (for the report).
    report: bool,
}

fn promote(
    pass: &Pass<'_>,
    plan: &mut plan::ModelPlan,
    ranking: &Ranking<'_>,
) -> Result<Ranked, QuantizeError> {
    let Ranking {
        output,
        n,
        importance,
        report,
    } = *ranking;
    let progress = pass.progress;
    let mut ranked = Ranked {
        promoted: Vec::new(),
        spill: None,
        entries: Default::default(),
    };
    let candidates: Vec<usize> = (0..plan.tensors.len())
        .filter(|&i| plan.tensors[i].encoder.target == Target::Pn3t)
        // A fallback type is chosen for quality parity, an override by the user: neither is
        // ranked for promotion.
        .filter(|&i| plan.tensors[i].fallback.is_none() && !plan.tensors[i].fixed)
        // A promoted tensor must also hold whole pn4t blocks.
        .filter(|&i| plan.tensors[i].encoder.k.is_multiple_of(64))
        .collect();
    if n == 0 || candidates.is_empty() {
        return Ok(ranked);
    }
    let mut spill = spill::Spill::create(output)?;
    progress(Progress::Phase {
        label: "ranking",
        total_bytes: candidates.iter().map(|&i| plan.tensors[i].in_bytes).sum(),
    });
    let mut scored = Vec::with_capacity(candidates.len());
    for &i in &candidates {
        let t = &plan.tensors[i];
        progress(Progress::Tensor { name: t.name() });
        let imp = importance
            .and_then(|m| m.get(t.name()))
            .filter(|v| v.len() == t.encoder.k)
            .map(|v| v.as_slice());
        let (bytes, stats) = encode_one(pass, t, true, report, imp)?;
        let off = spill.append(&bytes)?;
        // The stats kept for the summary are the plain (unweighted) ones.
        let mut plain = stats;
        plain.w2_weighted = 0.0;
        plain.e2_weighted = 0.0;
        ranked.entries.insert(i, (off, bytes.len() as u64, plain));
        scored.push((stats.rel_weighted(), i));
    }
    scored.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then_with(|| plan.tensors[a.1].name().cmp(plan.tensors[b.1].name()))
    });
    for &(_, i) in scored.iter().take(n) {
        let t = &mut plan.tensors[i];
        t.encoder.target = Target::Pn4t;
        t.promoted = true;
        ranked.promoted.push(t.name().to_string());
        ranked.entries.remove(&i);
    }
    ranked.spill = Some(spill);
    Ok(ranked)
}

/// True for the types `pn quantize` reads.
pub fn is_supported_input(ty: GgmlType) -> bool {
    codec::input_supported(ty)
}
