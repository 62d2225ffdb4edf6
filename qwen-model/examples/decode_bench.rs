//! Decode speed on the CPU backend: `cargo run --release -p qwen-model --example decode_bench --
//! MODEL.gguf [N_DECODE] [THREADS] [N_PROMPT]`. Prefills N_PROMPT (16) tokens, then decodes
//! N_DECODE (128) tokens one at a time (greedy), and prints tokens/s with the bytes of weights
//! read per token. It also prints the process CPU time, because on a shared machine the wall
//! clock mostly measures the other tenants.

use pn_tests::argmax;
use qwen_model::{Backend, CpuBackend, Model, Outputs};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .ok_or("usage: decode_bench MODEL.gguf [N_DECODE] [THREADS]")?;
    let n: usize = args.get(2).map_or(Ok(128), |s| s.parse())?;
    let threads: usize = args.get(3).map_or(Ok(0), |s| s.parse())?;
    let n_prompt: usize = args.get(4).map_or(Ok(16), |s| s.parse())?;
    let mut backend = CpuBackend::new(threads);
    // PN_GDN_RECURRENT=1 runs prefill through the recurrent delta rule (to compare with chunked).
    backend.set_gdn_chunked(std::env::var_os("PN_GDN_RECURRENT").is_none());
    let model = Model::load(path, backend)?;
    let v = model.config.vocab;
    let prompt: Vec<u32> = (0..n_prompt as u32)
        .map(|i| (i * 37 + 11) % v as u32)
        .collect();
    let mut state = model.new_state(prompt.len() + n + 1)?;
    let mut ws = model.new_workspace(64)?;
    let mut logits = vec![0.0f32; v];
    let t0 = Instant::now();
    let c0 = cpu_seconds();
    model.forward(
        &mut state,
        &mut ws,
        &prompt,
        Outputs::last_logits(&mut logits),
    )?;
    let prefill = t0.elapsed().as_secs_f64();
    let prefill_cpu = cpu_seconds() - c0;
    let mut tok = argmax(&logits) as u32;
    let t1 = Instant::now();
    let c1 = cpu_seconds();
    for _ in 0..n {
        model.forward(
            &mut state,
            &mut ws,
            &[tok],
            Outputs::last_logits(&mut logits),
        )?;
        tok = argmax(&logits) as u32;
    }
    let dt = t1.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - c1;
    let bytes = model.weights.bytes_per_token();
    println!(
        "{path}: backend {}, prefill {} tokens in {:.1} ms; decode {n} tokens: {:.1} tokens/s \
         ({:.3} ms/token), weights read per token {:.2} MB -> {:.2} GB/s",
        model.backend.name(),
        prompt.len(),
        prefill * 1e3,
        n as f64 / dt,
        dt * 1e3 / n as f64,
        bytes as f64 / 1e6,
        bytes as f64 * n as f64 / dt / 1e9
    );
    println!(
        "  prefill CPU time {:.3} s ({:.2} CPU-ms/token)",
        prefill_cpu,
        prefill_cpu * 1e3 / prompt.len() as f64
    );
    println!(
        "  decode CPU time {:.3} s for {n} tokens ({:.3} CPU-ms/token; {:.2} CPUs busy on average)",
        cpu,
        cpu * 1e3 / n as f64,
        cpu / dt
    );
    Ok(())
}

/// User + system CPU time of this process (all threads), from `/proc/self/stat` (Linux; 0
/// elsewhere).
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let Some(rest) = stat.rsplit(')').next() else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|s| s.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}
