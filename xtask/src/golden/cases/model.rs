//! The tiny-qwen35 model (F16, and quantized to PN3) through qwen-model's CPU forward pass:
//! logits against the transformers oracle (a fixed bound) and against our snapshot (bounded:
//! the CPU backend picks AVX-512 or AVX2 at run time and threads split sums differently). The
//! F16 model's logits on a CUDA device go through pn-runtime's engine.

use super::super::case::{f32_digest, ids_text, sha256_hex, CaseError, Ctx, Output, Run};
use super::super::snapshot::Field;
use pn_runtime::engine::Speculation;
use pn_runtime::{Device, Engine, EngineOptions};
use pn_tests::{argmax, max_abs, try_ids, try_read_f32, try_read_json};
use qwen_model::{CpuBackend, KvCacheType, Model, Outputs};
use std::path::Path;

/// Distance to the transformers oracle allowed for the F16 model (the oracle tests' bound).
pub const ORACLE_TOL: f32 = 1e-4;
/// Values of each logits sequence stored in the snapshot (a fixed stride over all rows).
const SAMPLES: usize = 256;
/// Threads of the CPU backend: fixed, so a run does not depend on the machine's core count.
const THREADS: usize = 2;

/// Loads a model on the CPU backend.
pub fn load(path: &Path) -> Result<Model<CpuBackend>, CaseError> {
    Model::load(path, CpuBackend::new(THREADS))
        .map_err(|e| format!("{}: {e}", path.display()).into())
}

/// Logits of every position, the tokens fed in pieces of `piece` tokens.
pub fn all_logits(
    m: &Model<CpuBackend>,
    tokens: &[u32],
    piece: usize,
) -> Result<Vec<f32>, CaseError> {
    let v = m.config.vocab;
    let mut state = m.new_state(tokens.len())?;
    let mut ws = m.new_workspace(piece.max(1))?;
    let mut logits = vec![0.0; tokens.len() * v];
    for (i, chunk) in tokens.chunks(piece.max(1)).enumerate() {
        let t0 = i * piece;
        let out = Outputs::all_logits(&mut logits[t0 * v..(t0 + chunk.len()) * v]);
        m.forward(&mut state, &mut ws, chunk, out)?;
    }
    Ok(logits)
}

/// Greedy continuation of `prompt` (`n` tokens), KV cache of type `kv`.
///
/// The prompt's rows all ask for their logits (only the last row's are used), so they take the
/// full-precision products on every CPU: where the PN tiles are AVX-512 VNNI, rows nobody
/// reads would take int8 activations (`Backend::set_state_rows`) and elsewhere int16, and the
/// tiny PN3 model's transcript has a near tie at token 6 (top-2 margin 2.3e-3) that this
/// difference flips. The int8 prompt rows are covered by `demo/transcripts` (the engine's
/// real path, a trained model) and by `qwen-model/tests/prompt_precision.rs`.
pub fn greedy(
    m: &Model<CpuBackend>,
    prompt: &[u32],
    n: usize,
    kv: KvCacheType,
) -> Result<Vec<u32>, CaseError> {
    let v = m.config.vocab;
    let mut state = m.new_state_with_kv(prompt.len() + n, kv)?;
    let mut ws = m.new_workspace(prompt.len().max(1))?;
    let mut prompt_logits = vec![0.0; prompt.len() * v];
    m.forward(
        &mut state,
        &mut ws,
        prompt,
        Outputs::all_logits(&mut prompt_logits),
    )?;
    let mut logits = prompt_logits.split_off(prompt.len().saturating_sub(1) * v);
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let next = argmax(&logits) as u32;
        out.push(next);
        m.forward(
            &mut state,
            &mut ws,
            &[next],
            Outputs::last_logits(&mut logits),
        )?;
    }
    Ok(out)
}

fn argmaxes(logits: &[f32], v: usize) -> Vec<u32> {
    logits.chunks_exact(v).map(|r| argmax(r) as u32).collect()
}

/// A fixed-stride sample of `logits` (`SAMPLES` values).
fn sample(logits: &[f32]) -> Vec<f32> {
    let stride = (logits.len() / SAMPLES).max(1);
    logits
        .iter()
        .step_by(stride)
        .take(SAMPLES)
        .copied()
        .collect()
}

/// Fields of one logits sequence: argmax per position (exact), a sample (bounded), the digest
/// of all values (info: it moves with the ISA).
fn logits_fields(out: &mut Output, seq: &str, logits: &[f32], v: usize) {
    out.fields.push(Field::exact(
        format!("{seq}.argmax"),
        ids_text(&argmaxes(logits, v)),
    ));
    out.fields.push(Field::bounded(
        format!("{seq}.logits_sample"),
        &sample(logits),
    ));
    out.fields
        .push(Field::info(format!("{seq}.digest"), f32_digest(logits)));
}

fn tokens(ctx: &Ctx, seq: &str) -> Result<Vec<u32>, CaseError> {
    Ok(try_ids(
        &try_read_json(&ctx.file("tiny-qwen35", &format!("tokens_{seq}.json")))?["tokens"],
    )?)
}

/// The F16 tiny model on sequences a (one prefill), b (one prefill) and c (token by token).
pub fn tiny_f16(ctx: &Ctx) -> Result<Run, CaseError> {
    let m = load(&ctx.tiny_model())?;
    tiny_f16_logits(ctx, m.config.vocab, |toks, piece| {
        all_logits(&m, toks, piece)
    })
}

/// [`tiny_f16`] on `device` through the engine (`Session::feed_all_logits`, prefill step
/// `piece`: one engine per piece size, since the step is an engine option).
pub fn tiny_f16_engine(ctx: &Ctx, device: Device) -> Result<Run, CaseError> {
    let path = ctx.tiny_model();
    let vocab = qwen_model::ModelConfig::from_gguf(&gguf_io::GgufFile::open(&path)?)?.vocab;
    tiny_f16_logits(ctx, vocab, |toks, piece| {
        let opts = EngineOptions {
            device,
            threads: THREADS,
            context: toks.len(),
            batch: piece,
            speculation: Speculation::None,
            prompt_cache_checkpoints: 0,
            ..EngineOptions::default()
        };
        let e = Engine::load(&path, opts)?;
        let logits = e.session()?.feed_all_logits(toks)?;
        Ok(logits)
    })
}

/// Logits of sequences a (one prefill), b (one prefill) and c (token by token) from
/// `logits(tokens, piece)`, against the transformers oracle and into the snapshot.
fn tiny_f16_logits(
    ctx: &Ctx,
    v: usize,
    mut logits: impl FnMut(&[u32], usize) -> Result<Vec<f32>, CaseError>,
) -> Result<Run, CaseError> {
    let mut out = Output::default();
    for (seq, piece) in [("a", 64), ("b", 256), ("c", 1)] {
        let toks = tokens(ctx, seq)?;
        let got = logits(&toks, piece)?;
        let want = try_read_f32(&ctx.file("tiny-qwen35", &format!("logits_{seq}.f32")))?;
        if want.len() != got.len() {
            return Err(format!(
                "logits_{seq}.f32: {} values, expected {}",
                want.len(),
                got.len()
            )
            .into());
        }
        let d = max_abs(&got, &want);
        out.check(d <= ORACLE_TOL, || {
            format!("{seq}: max abs diff to transformers {d:.3e} > {ORACLE_TOL:.0e}")
        });
        let (ga, wa) = (argmaxes(&got, v), argmaxes(&want, v));
        out.check(ga == wa, || {
            format!("{seq}: argmax differs from transformers")
        });
        logits_fields(&mut out, seq, &got, v);
        out.fields.push(Field::info(
            format!("{seq}.oracle_max_abs_diff"),
            format!("{d:.3e}"),
        ));
    }
    Ok(Run::Done(out))
}

/// Quantizes the tiny model with the default mix (P0k+19) into the scratch folder.
fn quantize_tiny(ctx: &Ctx) -> Result<std::path::PathBuf, CaseError> {
    use pn_runtime::quantize::{no_progress, quantize_model, QuantizeOptions};
    std::fs::create_dir_all(&ctx.scratch)?;
    let path = ctx.scratch.join("tiny-pn3.gguf");
    let mut o = QuantizeOptions::new(ctx.tiny_model(), &path);
    o.threads = THREADS;
    o.force = true;
    quantize_model(&o, &no_progress, &std::sync::atomic::AtomicBool::new(false))?;
    Ok(path)
}

/// The tiny model quantized to PN3: the file (exact), logits of sequence a (bounded, plus the
/// distance to the F16 oracle), greedy transcripts with an f32 and an f16 KV cache (exact).
pub fn tiny_pn3(ctx: &Ctx) -> Result<Run, CaseError> {
    let path = quantize_tiny(ctx)?;
    let bytes = std::fs::read(&path)?;
    let mut out = Output::default();
    out.fields
        .push(Field::exact("file.sha256", sha256_hex(&bytes)));
    out.fields
        .push(Field::info("file.bytes", bytes.len().to_string()));
    drop(bytes);
    let m = load(&path)?;
    let v = m.config.vocab;
    let toks = tokens(ctx, "a")?;
    let got = all_logits(&m, &toks, 64)?;
    let want = try_read_f32(&ctx.file("tiny-qwen35", "logits_a.f32"))?;
    logits_fields(&mut out, "a", &got, v);
    let agree = argmaxes(&got, v)
        .iter()
        .zip(argmaxes(&want, v))
        .filter(|(a, b)| **a == *b)
        .count();
    out.fields.push(Field::info(
        "a.vs_f16_oracle",
        format!(
            "max abs diff {:.3e}, top-1 agreement {agree}/{}",
            max_abs(&got, &want),
            toks.len()
        ),
    ));
    for (name, kv) in [("f32", KvCacheType::F32), ("f16", KvCacheType::F16)] {
        let g = greedy(&m, &toks, 64, kv)?;
        out.fields
            .push(Field::exact(format!("greedy64.kv_{name}"), ids_text(&g)));
    }
    Ok(Run::Done(out))
}
