//! Transcripts of the trained demo model through pn-runtime's Engine: greedy (64 tokens, the
//! prompts of `greedy_samples.json`, compared with transformers' greedy as info) and one sampled
//! transcript with a fixed seed. Exact token ids: a reordered sum can only change a token at a
//! near tie, which the snapshot would then show as the first differing token.

use super::super::case::{ids_text, CaseError, Ctx, Output, Run};
use super::super::snapshot::Field;
use pn_runtime::{Device, Engine, EngineOptions, SamplingParams, StopConditions};
use pn_tests::{try_ids, try_read_json};

const THREADS: usize = 2;
const N_TOKENS: usize = 64;

fn engine(ctx: &Ctx, device: Device) -> Result<Engine, pn_runtime::EngineError> {
    let opts = EngineOptions {
        device,
        threads: THREADS,
        context: 512,
        ..EngineOptions::default()
    };
    Engine::load(ctx.file("demo-code-model", "model-f16.gguf"), opts)
}

fn transcript(e: &Engine, prompt: &[u32], params: SamplingParams) -> Result<Vec<u32>, CaseError> {
    let mut s = e.session()?;
    let mut ids = Vec::new();
    for ev in s.generate(prompt, params, StopConditions::max_tokens(N_TOKENS))? {
        if let Some(t) = ev?.token {
            ids.push(t);
        }
    }
    Ok(ids)
}

/// Loads the demo model on `device`; a CUDA device that cannot be used is a skip, not a failure.
fn load_or_skip(ctx: &Ctx, device: Device) -> Result<Result<Engine, String>, CaseError> {
    match engine(ctx, device) {
        Ok(e) => Ok(Ok(e)),
        Err(e) if device != Device::Cpu => Ok(Err(e.to_string())),
        Err(e) => Err(e.into()),
    }
}

/// Greedy transcripts and the seeded sampled one.
pub fn demo(ctx: &Ctx, device: Device) -> Result<Run, CaseError> {
    let e = match load_or_skip(ctx, device)? {
        Ok(e) => e,
        Err(reason) => return Ok(Run::Skipped(reason)),
    };
    let samples = try_read_json(&ctx.file("demo-code-model", "greedy_samples.json"))?;
    let samples = samples
        .as_array()
        .ok_or("greedy_samples.json: not an array")?;
    let mut out = Output::default();
    for (i, s) in samples.iter().enumerate() {
        let prompt = try_ids(&s["prompt_tokens"])?;
        let got = transcript(&e, &prompt, SamplingParams::greedy())?;
        let want = try_ids(&s["greedy_tokens"])?;
        let same = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
        out.fields
            .push(Field::exact(format!("greedy{i}"), ids_text(&got)));
        out.fields.push(Field::info(
            format!("greedy{i}.vs_transformers"),
            if got == want {
                "identical".to_string()
            } else {
                format!("first {same} tokens agree")
            },
        ));
    }
    let prompt = try_ids(&samples[0]["prompt_tokens"])?;
    let params = SamplingParams {
        seed: 20261129,
        ..SamplingParams::default()
    };
    let got = transcript(&e, &prompt, params)?;
    out.fields
        .push(Field::exact("sampled.seed20261129", ids_text(&got)));
    Ok(Run::Done(out))
}
