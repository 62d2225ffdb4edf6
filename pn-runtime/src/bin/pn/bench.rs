//! `pn bench`: prompt-processing and generation speed, llama-bench style.
//!
//! Each test runs `-r` times on a fresh sequence, after `-d` tokens of context (not timed):
//! `ppN` processes N prompt tokens in one call, `tgN` generates N tokens one at a time.
//! Output `-o md` (default) is a table, `-o csv` one row per test, and `-o json` an array with
//! one object per test:
//!
//! ```json
//! [{"model": "model.gguf", "model_size": 34756896, "model_n_params": 17160000,
//!   "backend": "CPU", "n_threads": 2, "n_ubatch": 512, "test": "pp512", "n_prompt": 512,
//!   "n_gen": 0, "n_depth": 0, "repetitions": 5, "avg_ts": 812.3, "stddev_ts": 4.1,
//!   "samples_ts": [810.0, ...], "samples_ns": [630000000, ...]}]
//! ```
//!
//! Prompts are processed in steps of `-ub` tokens, on the CPU 512 by default as in llama-bench
//! (capped by the run's longest prompt or depth, at least 64; `pn run` and `pn serve` use 64;
//! see [`BENCH_UBATCH`]); `n_ubatch` reports the step.
//! `avg_ts`/`stddev_ts` are the mean and sample standard deviation of the tokens-per-second of
//! the repetitions. `--parallel N` (`-np`, comma-separated) runs each tg test with N
//! sequences decoded together in one [`Batch`] (one forward pass per step of all of them; with
//! speculation, each sequence's drafts verified in that pass), named `tgN xP`: its `avg_ts` is
//! the aggregate decode throughput of the N streams, `n_parallel` says N, and each sequence's
//! first token (its prompt's passes) is not timed. With speculative decoding on (`--spec mtp`, the default for a model with an
//! MTP block) a tg test is a greedy generation with drafting, and its object also has `spec`
//! (`"mtp"`), `n_draft`, `spec_acceptance` (accepted / drafted) and `spec_tokens_per_pass`.

use crate::engine_args::{self, ModelArgs};
use pn_runtime::engine::batch::{Batch, BatchEvent, BatchOptions};
use pn_runtime::engine::{Prompt, StopConditions};
use pn_runtime::sampling::SamplingParams;
use pn_runtime::speculative::SpecStats;
use pn_runtime::{Engine, EngineOptions};
use serde::Serialize;
use std::time::Instant;

/// Measure prompt processing (ppN) and generation (tgN) speed, as llama-bench.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt lengths to test (comma-separated; 0 skips).
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_delimiter = ',',
        default_value = "512"
    )]
    pub n_prompt: Vec<usize>,
    /// Generation lengths to test (comma-separated; 0 skips).
    #[arg(
        short = 'n',
        long = "n-gen",
        value_delimiter = ',',
        default_value = "128"
    )]
    pub n_gen: Vec<usize>,
    /// Context depths: tokens already in the sequence before each test (comma-separated).
    #[arg(
        short = 'd',
        long = "n-depth",
        value_delimiter = ',',
        default_value = "0"
    )]
    pub n_depth: Vec<usize>,
    /// Repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub repetitions: usize,
    /// Output format: md, csv or json.
    #[arg(short = 'o', long = "output", default_value = "md", value_parser = ["md", "csv", "json"])]
    pub output: String,
    /// Sequences decoded together in the tg tests (comma-separated; each value its own test):
    /// one batched forward pass per step for all of them, aggregate tokens per second.
    #[arg(long = "parallel", alias = "np", value_delimiter = ',')]
    pub parallel: Vec<usize>,
}

/// One result row (the JSON object documented in the module docs). The model and speculation
/// columns are their own structs, flattened into the same JSON object.
#[derive(Debug, Serialize)]
pub struct BenchResult {
    /// What ran the test.
    #[serde(flatten)]
    pub setup: Setup,
    /// Test name, `pp512`, `tg128`, with `@ dN` when at depth.
    pub test: String,
    /// Prompt tokens (pp tests).
    pub n_prompt: usize,
    /// Generated tokens (tg tests).
    pub n_gen: usize,
    /// Context depth.
    pub n_depth: usize,
    /// Repetitions.
    pub repetitions: usize,
    /// Mean tokens per second.
    pub avg_ts: f64,
    /// Sample standard deviation of tokens per second.
    pub stddev_ts: f64,
    /// Tokens per second of each repetition.
    pub samples_ts: Vec<f64>,
    /// Nanoseconds of each repetition.
    pub samples_ns: Vec<u64>,
    /// tg tests with speculative decoding.
    #[serde(flatten)]
    pub spec: Option<SpecColumns>,
    /// Sequences decoded together (`--parallel` tg tests; `avg_ts` is their total).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub n_parallel: Option<usize>,
}

/// The model and backend columns, the same for every test of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Setup {
    /// Model file name.
    pub model: String,
    /// Model file size in bytes.
    pub model_size: u64,
    /// Number of weights.
    pub model_n_params: u64,
    /// Backend name.
    pub backend: String,
    /// CPU threads (0 on a CUDA device).
    pub n_threads: usize,
    /// Tokens per prefill step (`-ub`).
    pub n_ubatch: usize,
}

/// Tokens per prefill step of `pn bench` on the CPU when `-ub` is not given: llama-bench's
/// default `n_ubatch`, so that a pp test runs in the same steps as the peer's (CUDA keeps the
/// engine's default until it is measured on a GPU), or the longest prompt or depth of the run
/// where that is shorter (but never below the engine's 64). `pn run`, `pn chat` and
/// `pn serve` keep the engine's 64 (one step then stays short enough for a cancel or another
/// sequence's decode step). On the 27B shape, 2 threads, a 512-token prompt runs at 9.03
/// tokens/s in steps of 64, 10.09 in steps of 256 and 10.08 in steps of 512 (peak RSS +0.10
/// and +0.24 GB).
pub const BENCH_UBATCH: usize = 512;

/// The speculative decoding columns of a tg test.
#[derive(Debug, Clone, Serialize)]
pub struct SpecColumns {
    /// "mtp".
    pub spec: String,
    /// Most drafts per step.
    pub n_draft: usize,
    /// Accepted / drafted tokens over all repetitions.
    pub spec_acceptance: f64,
    /// Tokens per target (verification) pass over all repetitions.
    pub spec_tokens_per_pass: f64,
}

/// Deterministic, ordinary (non-special) token ids to feed.
fn bench_tokens(engine: &Engine, n: usize, salt: usize) -> Vec<u32> {
    let tok = engine.tokenizer();
    let usable: Vec<u32> = (0..tok.n_vocab().min(engine.config().vocab) as u32)
        .filter(|&id| engine.token_mask().allows(id) && !tok.is_eog(id))
        .collect();
    (0..n)
        .map(|i| usable[(i.wrapping_mul(7919) + salt * 104_729 + 17) % usable.len().max(1)])
        .collect()
}

fn mean_std(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = if xs.len() > 1 {
        xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

/// Times one test: `n_prompt` tokens in one call, or `n_gen` single-token calls, after `depth`.
/// With speculative decoding on, a tg test is a greedy generation of `n_gen` tokens instead
/// (drafted and verified), and the summed speculation counters come back too.
fn run_test(
    engine: &Engine,
    depth: usize,
    n_prompt: usize,
    n_gen: usize,
    reps: usize,
) -> Result<(Vec<u64>, Option<SpecStats>), Box<dyn std::error::Error>> {
    let mut session = engine.session()?;
    if n_gen > 0 && n_prompt == 0 && session.speculation_mut().is_some() {
        return run_spec_tg(engine, depth, n_gen, reps);
    }
    let mut samples = Vec::with_capacity(reps);
    let ctx_tokens = bench_tokens(engine, depth, 1);
    let prompt = bench_tokens(engine, n_prompt, 2);
    let gen = bench_tokens(engine, n_gen, 3);
    // One untimed warm-up run (page in the weights, grow scratch buffers).
    for rep in 0..=reps {
        session.reset()?;
        if depth > 0 {
            session.feed(&ctx_tokens)?;
        }
        let t0 = Instant::now();
        if n_prompt > 0 {
            session.feed(&prompt)?;
        }
        for &t in &gen {
            session.feed(&[t])?;
        }
        let ns = t0.elapsed().as_nanos() as u64;
        if rep > 0 {
            samples.push(ns.max(1));
        }
    }
    Ok((samples, None))
}

/// A tg test with speculative decoding: greedy generation (end tokens ignored) after `depth`
/// context tokens plus one start token (not timed).
fn run_spec_tg(
    engine: &Engine,
    depth: usize,
    n_gen: usize,
    reps: usize,
) -> Result<(Vec<u64>, Option<SpecStats>), Box<dyn std::error::Error>> {
    let mut session = engine.session()?;
    let mut samples = Vec::with_capacity(reps);
    let mut total = SpecStats::default();
    let start = [bench_tokens(engine, depth, 1), bench_tokens(engine, 1, 3)].concat();
    for rep in 0..=reps {
        session.reset()?;
        session.feed(&start)?;
        let stop = StopConditions {
            max_tokens: Some(n_gen),
            ignore_eog: true,
            ..StopConditions::default()
        };
        let t0 = Instant::now();
        let mut g = session.generate(Vec::new(), SamplingParams::greedy(), stop)?;
        for e in g.by_ref() {
            e?;
        }
        let ns = t0.elapsed().as_nanos() as u64;
        if rep > 0 {
            samples.push(ns.max(1));
            if let Some(s) = g.spec_stats() {
                total += s;
            }
        }
    }
    Ok((samples, Some(total)))
}

/// A tg test of `np` sequences decoded together in one [`Batch`]: each gets `depth` context
/// tokens and a start token of its own (its prompt, not timed: the steps until every sequence
/// has its first token), then the steps until each has `n_gen` tokens are timed. Returns the
/// nanoseconds of each repetition, the tokens each timed, and with speculation the counters
/// summed over the sequences and repetitions.
fn run_batch_tg(
    engine: &Engine,
    depth: usize,
    n_gen: usize,
    reps: usize,
    np: usize,
) -> Result<BatchTg, Box<dyn std::error::Error>> {
    let options = BatchOptions {
        slots: np,
        prefill_chunk: (np * (depth + 1)).max(engine.options().batch),
    };
    let mut samples = Vec::with_capacity(reps);
    let prompts: Vec<Vec<u32>> = (0..np)
        .map(|i| {
            [
                bench_tokens(engine, depth, 1),
                bench_tokens(engine, 1, 3 + i),
            ]
            .concat()
        })
        .collect();
    let (mut timed, mut spec) = (0, None::<SpecStats>);
    for rep in 0..=reps {
        // A fresh batch each time, so no repetition reuses the last one's prompts.
        let mut batch = Batch::new(engine, options)?;
        for (slot, p) in prompts.iter().enumerate() {
            let stop = StopConditions {
                max_tokens: Some(n_gen),
                ignore_eog: true,
                ..StopConditions::default()
            };
            batch.add_to_slot(
                slot,
                Prompt::Tokens(p.clone()),
                SamplingParams::greedy(),
                stop,
            )?;
        }
        // The prompts and the first tokens (the prefill chunk holds every prompt: one step,
        // or two when the MTP cache follows the prompt and its last token runs alone).
        // (A speculative step there may give a sequence more tokens; they are not timed.)
        let mut first = std::collections::HashSet::new();
        while first.len() < np && batch.active() > 0 {
            for ev in batch.step()? {
                if let BatchEvent::Token { id, .. } = ev {
                    first.insert(id);
                }
            }
        }
        let t0 = Instant::now();
        let mut got = 0;
        let mut stats = None::<SpecStats>;
        while batch.active() > 0 {
            for ev in batch.step()? {
                if let BatchEvent::Token { event, spec: s, .. } = ev {
                    got += usize::from(event.token.is_some());
                    if let (Some(s), true) = (s, event.finish.is_some()) {
                        *stats.get_or_insert_with(SpecStats::default) += s;
                    }
                }
            }
        }
        let ns = t0.elapsed().as_nanos() as u64;
        if rep > 0 {
            samples.push(ns.max(1));
            timed = got;
            if let Some(s) = stats {
                *spec.get_or_insert_with(SpecStats::default) += s;
            }
        }
    }
    Ok(BatchTg {
        samples,
        timed,
        spec,
    })
}

/// What [`run_batch_tg`] measured.
struct BatchTg {
    /// Nanoseconds of each repetition.
    samples: Vec<u64>,
    /// Tokens one repetition timed.
    timed: usize,
    /// Speculative counters summed over sequences and repetitions (`None`: speculation off).
    spec: Option<SpecStats>,
}

/// Runs the subcommand.
pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let mut model_args = args.model.clone();
    let max_depth = args.n_depth.iter().copied().max().unwrap_or(0);
    let max_prompt = args.n_prompt.iter().copied().max().unwrap_or(0);
    let max_len = args
        .n_gen
        .iter()
        .copied()
        .max()
        .unwrap_or(0)
        .max(max_prompt);
    if matches!(model_args.device.parse(), Ok(pn_runtime::Device::Cpu)) {
        // No larger than the longest prompt or depth needs (the workspace grows with the step:
        // a tg-only run keeps the engine's 64).
        let longest = max_prompt
            .max(max_depth)
            .max(EngineOptions::default().batch);
        model_args
            .ubatch_size
            .get_or_insert(BENCH_UBATCH.min(longest));
    }
    if model_args.ctx_size == 0 {
        // + room for the start token and the drafts of a speculative tg test.
        model_args.ctx_size = max_depth + max_len + 8;
    }
    let engine = engine_args::load_engine(&model_args, true)?;
    // Where the load's time went (stderr: the tables on stdout stay llama-bench's).
    eprintln!("pn: {}", engine.load_report());
    let reps = args.repetitions.max(1);
    let model_name = engine.path().file_name().map_or_else(
        || engine.path().display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    // A CUDA run has no CPU thread pool doing the math: it reports 0 threads.
    let threads = engine.cpu_model().map_or(0, |m| m.backend.n_threads());
    let backend = match engine.device() {
        pn_runtime::Device::Cpu => "CPU",
        pn_runtime::Device::Cuda(_) => "CUDA",
    };

    let mut tests = Vec::new();
    for &d in &args.n_depth {
        for &p in args.n_prompt.iter().filter(|&&p| p > 0) {
            tests.push((d, p, 0, None));
        }
        for &n in args.n_gen.iter().filter(|&&n| n > 0) {
            if args.parallel.is_empty() {
                tests.push((d, 0, n, None));
            }
            for &np in &args.parallel {
                tests.push((d, 0, n, Some(np.max(1))));
            }
        }
    }
    let setup = Setup {
        model: model_name,
        model_size: engine.file_size(),
        model_n_params: engine.n_params(),
        backend: backend.into(),
        n_threads: threads,
        n_ubatch: engine.options().batch,
    };
    let mut results = Vec::new();
    for (d, p, n, np) in tests {
        let (samples_ns, spec, tokens) = match np {
            Some(np) => {
                let r = run_batch_tg(&engine, d, n, reps, np)?;
                (r.samples, r.spec, r.timed as f64)
            }
            None => {
                let (ns, spec) = run_test(&engine, d, p, n, reps)?;
                (ns, spec, (p + n) as f64)
            }
        };
        let samples_ts: Vec<f64> = samples_ns
            .iter()
            .map(|&ns| tokens * 1e9 / ns as f64)
            .collect();
        let (avg_ts, stddev_ts) = mean_std(&samples_ts);
        let name = match (p > 0, np) {
            (true, _) => format!("pp{p}"),
            (false, Some(np)) => format!("tg{n} x{np}"),
            (false, None) => format!("tg{n}"),
        };
        let test = if d > 0 {
            format!("{name} @ d{d}")
        } else {
            name
        };
        let r = BenchResult {
            setup: setup.clone(),
            test,
            n_prompt: p,
            n_gen: n,
            n_depth: d,
            repetitions: reps,
            avg_ts,
            stddev_ts,
            samples_ts,
            samples_ns,
            spec: spec.map(|s| SpecColumns {
                spec: "mtp".to_string(),
                n_draft: model_args.draft,
                spec_acceptance: s.acceptance_rate(),
                spec_tokens_per_pass: s.tokens_per_pass(),
            }),
            n_parallel: np,
        };
        if args.output == "md" {
            if results.is_empty() {
                println!("| model | size | params | backend | threads | test | t/s |");
                println!("| --- | ---: | ---: | --- | ---: | ---: | ---: |");
            }
            let spec_note = match &r.spec {
                Some(s) => format!(
                    " (mtp N={}: acceptance {:.1}%, {:.2} tokens/pass)",
                    s.n_draft,
                    100.0 * s.spec_acceptance,
                    s.spec_tokens_per_pass
                ),
                None => String::new(),
            };
            println!(
                "| {} | {:.2} MiB | {:.2} M | {} | {} | {} | {:.2} ± {:.2}{spec_note} |",
                r.setup.model,
                r.setup.model_size as f64 / (1u64 << 20) as f64,
                r.setup.model_n_params as f64 / 1e6,
                r.setup.backend,
                r.setup.n_threads,
                r.test,
                r.avg_ts,
                r.stddev_ts
            );
        }
        results.push(r);
    }
    match args.output.as_str() {
        "json" => println!("{}", serde_json::to_string_pretty(&results)?),
        "csv" => {
            println!("model,model_size,model_n_params,backend,n_threads,test,n_prompt,n_gen,n_depth,repetitions,avg_ts,stddev_ts");
            for r in &results {
                println!(
                    "\"{}\",{},{},{},{},\"{}\",{},{},{},{},{:.4},{:.4}",
                    r.setup.model.replace('"', "\"\""),
                    r.setup.model_size,
                    r.setup.model_n_params,
                    r.setup.backend,
                    r.setup.n_threads,
                    r.test,
                    r.n_prompt,
                    r.n_gen,
                    r.n_depth,
                    r.repetitions,
                    r.avg_ts,
                    r.stddev_ts
                );
            }
        }
        _ => {}
    }
    Ok(())
}
