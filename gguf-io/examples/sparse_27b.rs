//! Size check for the reader: write a sparse GGUF with the tensor table of Qwen3.8-27B-PN3
//! (about 12 GB of tensor data that takes no disk space), then time opening and listing it and
//! report resident memory.
//!
//! ```text
//! cargo run --release -p gguf-io --example sparse_27b -- write /tmp/big.gguf [vocab.gguf]
//! cargo run --release -p gguf-io --example sparse_27b -- open /tmp/big.gguf
//! ```
//! With a vocab GGUF, its `tokenizer.*` metadata (248,320 tokens, merges) is copied in, as a
//! real model file would carry it.

use std::time::Instant;

use gguf_io::{GgmlType, GgufFile, GgufWriter, Value};

const D: u64 = 5120;
const F: u64 = 17408;
const V: u64 = 248_320;

fn tensors() -> Vec<(String, GgmlType, Vec<u64>)> {
    use GgmlType::*;
    let mut t = vec![
        ("token_embd.weight".to_string(), Q3K, vec![D, V]),
        ("output_norm.weight".to_string(), F32, vec![D]),
        ("output.weight".to_string(), Q4K, vec![D, V]),
    ];
    for i in 0..65u64 {
        let p = |n: &str| format!("blk.{i}.{n}");
        t.push((p("attn_norm.weight"), F32, vec![D]));
        t.push((p("post_attention_norm.weight"), F32, vec![D]));
        if i == 64 || (i + 1) % 4 == 0 {
            t.push((p("attn_q.weight"), Pn3t, vec![D, 12288]));
            t.push((p("attn_k.weight"), Pn3t, vec![D, 1024]));
            t.push((p("attn_v.weight"), Pn3t, vec![D, 1024]));
            t.push((p("attn_q_norm.weight"), F32, vec![256]));
            t.push((p("attn_k_norm.weight"), F32, vec![256]));
            t.push((p("attn_output.weight"), Pn4t, vec![6144, D]));
        } else {
            t.push((p("attn_qkv.weight"), Pn3t, vec![D, 10240]));
            t.push((p("attn_gate.weight"), Pn3t, vec![D, 6144]));
            t.push((p("ssm_conv1d.weight"), F32, vec![4, 10240]));
            t.push((p("ssm_a"), F32, vec![48]));
            t.push((p("ssm_dt.bias"), F32, vec![48]));
            t.push((p("ssm_beta.weight"), Q8_0, vec![D, 48]));
            t.push((p("ssm_alpha.weight"), Q8_0, vec![D, 48]));
            t.push((p("ssm_norm.weight"), F32, vec![128]));
            t.push((p("ssm_out.weight"), Pn4t, vec![6144, D]));
        }
        t.push((p("ffn_gate.weight"), Pn3t, vec![D, F]));
        t.push((p("ffn_up.weight"), Pn3t, vec![D, F]));
        t.push((p("ffn_down.weight"), Pn4t, vec![F, D]));
        if i == 64 {
            t.push((p("nextn.eh_proj.weight"), Pn3t, vec![2 * D, D]));
            t.push((p("nextn.enorm.weight"), F32, vec![D]));
            t.push((p("nextn.hnorm.weight"), F32, vec![D]));
            t.push((p("nextn.shared_head_norm.weight"), F32, vec![D]));
        }
    }
    t
}

fn vm_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// CPU time of this thread in ns (first field of /proc/thread-self/schedstat): on a loaded machine
/// the wall time includes waiting for a core, this does not.
fn cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn write(path: &str, vocab: Option<&str>) -> Result<(), Box<dyn std::error::Error>> {
    let file = std::fs::File::create(path)?;
    let mut w = GgufWriter::new(std::io::BufWriter::new(file));
    w.add_metadata("general.architecture", Value::String("qwen35".into()))?;
    w.add_metadata(
        "general.name",
        Value::String("sparse 27B layout test".into()),
    )?;
    w.add_metadata("qwen35.block_count", Value::U32(65))?;
    w.add_metadata("qwen35.embedding_length", Value::U32(D as u32))?;
    w.add_metadata("general.quantization_version", Value::U32(2))?;
    if let Some(v) = vocab {
        let src = GgufFile::open(v)?;
        for e in src
            .metadata()
            .iter()
            .filter(|e| e.key.starts_with("tokenizer."))
        {
            w.add_metadata(e.key.clone(), e.value.clone())?;
        }
    }
    let list = tensors();
    for (name, ty, dims) in &list {
        w.add_tensor_info(name.clone(), *ty, dims)?;
    }
    w.write_header()?;
    for (name, ty, dims) in &list {
        if *ty == GgmlType::F32 {
            // Small tensors get real bytes (ones), the big ones are holes.
            let n: u64 = dims.iter().product();
            w.write_tensor_data(name, &1f32.to_le_bytes().repeat(n as usize))?;
        } else {
            w.skip_tensor_data(name)?;
        }
    }
    w.finish()?;
    Ok(())
}

fn open(path: &str) -> Result<(), Box<dyn std::error::Error>> {
    let rss0 = vm_rss_kib();
    let c0 = cpu_ns();
    let t0 = Instant::now();
    let f = GgufFile::open(path)?;
    let mut listed = 0u64;
    let mut total = 0u64;
    for t in f.tensor_infos() {
        listed += t.name.len() as u64 + t.dims.len() as u64;
        total += t.n_bytes;
    }
    let elapsed = t0.elapsed();
    let cpu = cpu_ns() - c0;
    let rss1 = vm_rss_kib();
    let out = f.tensor("output.weight")?;
    println!(
        "file {} bytes, {} tensors ({} tensor bytes, listing checksum {listed}), {} metadata keys",
        f.file_len(),
        f.tensor_infos().len(),
        total,
        f.metadata().len()
    );
    println!(
        "open + list: {:.2} ms wall, {:.2} ms on CPU",
        elapsed.as_secs_f64() * 1e3,
        cpu as f64 / 1e6
    );
    println!(
        "VmRSS before {rss0} KiB, after {rss1} KiB (+{} KiB); output.weight {} bytes mapped, not read",
        rss1.saturating_sub(rss0),
        out.bytes.len()
    );
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("write") if args.len() >= 3 => write(&args[2], args.get(3).map(String::as_str)),
        Some("open") if args.len() >= 3 => open(&args[2]),
        _ => Err("usage: sparse_27b write PATH [VOCAB.gguf] | open PATH".into()),
    }
}
