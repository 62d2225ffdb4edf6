//! `cargo xtask synth-model --shape 27b|tiny|demo --out FILE`: a valid PN model with the real
//! Qwen3.8-27B-PN3 tensor names, shapes and types (mix P0k+19, Hadamard rotation metadata, the
//! real Qwen3.5 tokenizer) and pseudo-random, well-scaled weights, for speed and memory
//! measurements at true size. The weights carry no knowledge; only the bytes are realistic.
//!
//! Why it is fast: running the reference quantizer over 27 billion weights would take hours, so
//! each (type, K) gets a pool of blocks quantized once from Gaussian groups (PN blocks with
//! `pn_format::quantize_row_ref`, stock blocks with gguf-io's quantizers), and every tensor is
//! filled with blocks drawn from its pool by a hash of (seed, tensor, block). Every block is
//! therefore a real quantizer output (valid, well-scaled), and the file is streamed in chunks.

use gguf_io::{Array, GgmlType, GgufFile, GgufWriter, Value};
use pn_runtime::quantize::mix::{classify, Mix, Role, Target};
use pn_runtime::quantize::rotation::{self, RotationChoice};
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Read};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Blocks per pool: enough variety that neighbouring blocks differ, small enough to build fast.
const POOL_BLOCKS: usize = 4096;
/// Bytes generated per write.
const CHUNK_BYTES: usize = 32 << 20;
/// The padded vocabulary of every Qwen3.5/3.8 model.
const VOCAB: u64 = 248320;

/// Arguments of `cargo xtask synth-model`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model shape: 27b (Qwen3.8-27B), tiny (the tiny-qwen35 test model's layers) or demo (the
    /// demo-code-model's layers). Every shape uses the real 248320-token vocabulary.
    #[arg(long, default_value = "27b")]
    pub shape: String,
    /// Output GGUF.
    #[arg(long)]
    pub out: PathBuf,
    /// GGUF whose `tokenizer.*` keys are copied (default: tests/data/qwen-tokenizer/vocab-qwen35.gguf).
    #[arg(long)]
    pub vocab: Option<PathBuf>,
    /// Seed of the pseudo-random weights.
    #[arg(long, default_value_t = 1234)]
    pub seed: u64,
    /// Overwrite OUT if it exists.
    #[arg(long)]
    pub force: bool,
    /// Worker threads (default: all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

/// The hyperparameters of one shape.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    name: &'static str,
    size_label: &'static str,
    d: u64,
    f: u64,
    layers: u64,
    hq: u64,
    hkv: u64,
    dh: u64,
    dk: u64,
    hk: u64,
    hv: u64,
    ctx: u64,
    rope_dims: u64,
}

impl Shape {
    fn parse(s: &str) -> Result<Shape, String> {
        let base = Shape {
            name: "27b",
            size_label: "27B",
            d: 5120,
            f: 17408,
            layers: 64,
            hq: 24,
            hkv: 4,
            dh: 256,
            dk: 128,
            hk: 16,
            hv: 48,
            ctx: 262144,
            rope_dims: 64,
        };
        match s.to_ascii_lowercase().as_str() {
            "27b" => Ok(base),
            "tiny" => Ok(Shape {
                name: "tiny",
                size_label: "tiny",
                d: 320,
                f: 704,
                layers: 8,
                hq: 6,
                hkv: 2,
                dh: 256,
                dk: 128,
                hk: 2,
                hv: 6,
                ctx: 4096,
                rope_dims: 64,
            }),
            "demo" => Ok(Shape {
                name: "demo",
                size_label: "demo",
                d: 320,
                f: 896,
                layers: 8,
                hq: 4,
                hkv: 2,
                dh: 128,
                dk: 64,
                hk: 2,
                hv: 4,
                ctx: 4096,
                rope_dims: 32,
            }),
            other => Err(format!("unknown shape {other:?} (27b, tiny, demo)")),
        }
    }

    fn full_attn(&self, layer: u64) -> bool {
        (layer + 1).is_multiple_of(4) || layer == self.layers
    }
}

/// How a tensor's data is made.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fill {
    /// Quantized matrix from a block pool.
    Matrix,
    /// Constant (norm weights: GGUF stores 1 + w).
    Const(f32),
    /// `ssm_a = -exp(A_log)`: uniform in [-1, -0.05].
    SsmA,
    /// `ssm_dt.bias`: uniform in [-1, 1].
    Dt,
    /// Conv kernel: N(0, 0.3).
    Conv,
}

struct Planned {
    name: String,
    dims: Vec<u64>,
    fill: Fill,
    ty: GgmlType,
    role: Role,
}

/// Tensor names and GGUF dims in the converter's order (MTP block last, as layer `layers`).
fn tensor_list(s: &Shape) -> Vec<(String, Vec<u64>, Fill)> {
    let (d, v) = (s.d, VOCAB);
    let key_dim = s.hk * s.dk;
    let inner = s.hv * s.dk;
    let conv_dim = 2 * key_dim + inner;
    let mut t = vec![
        ("output.weight".to_string(), vec![d, v], Fill::Matrix),
        ("token_embd.weight".to_string(), vec![d, v], Fill::Matrix),
    ];
    for i in 0..=s.layers {
        let p = format!("blk.{i}.");
        let mut push = |n: &str, dims: Vec<u64>, f: Fill| t.push((format!("{p}{n}"), dims, f));
        let mtp = i == s.layers;
        if mtp {
            push("nextn.eh_proj.weight", vec![2 * d, d], Fill::Matrix);
        }
        push("attn_norm.weight", vec![d], Fill::Const(1.0));
        if !s.full_attn(i) {
            push("ssm_a", vec![s.hv], Fill::SsmA);
            push("ssm_conv1d.weight", vec![4, conv_dim], Fill::Conv);
            push("ssm_dt.bias", vec![s.hv], Fill::Dt);
            push("ssm_alpha.weight", vec![d, s.hv], Fill::Matrix);
            push("ssm_beta.weight", vec![d, s.hv], Fill::Matrix);
            push("attn_qkv.weight", vec![d, conv_dim], Fill::Matrix);
            push("attn_gate.weight", vec![d, inner], Fill::Matrix);
            push("ssm_norm.weight", vec![s.dk], Fill::Const(1.0));
            push("ssm_out.weight", vec![inner, d], Fill::Matrix);
        }
        push("ffn_down.weight", vec![s.f, d], Fill::Matrix);
        push("ffn_gate.weight", vec![d, s.f], Fill::Matrix);
        push("ffn_up.weight", vec![d, s.f], Fill::Matrix);
        push("post_attention_norm.weight", vec![d], Fill::Const(1.0));
        if s.full_attn(i) {
            push("attn_k_norm.weight", vec![s.dh], Fill::Const(1.0));
            push("attn_k.weight", vec![d, s.hkv * s.dh], Fill::Matrix);
            push("attn_output.weight", vec![s.hq * s.dh, d], Fill::Matrix);
            push("attn_q_norm.weight", vec![s.dh], Fill::Const(1.0));
            push("attn_q.weight", vec![d, 2 * s.hq * s.dh], Fill::Matrix);
            push("attn_v.weight", vec![d, s.hkv * s.dh], Fill::Matrix);
        }
        if mtp {
            push("nextn.shared_head_norm.weight", vec![d], Fill::Const(1.0));
            push("nextn.enorm.weight", vec![d], Fill::Const(1.0));
            push("nextn.hnorm.weight", vec![d], Fill::Const(1.0));
        }
    }
    t.push(("output_norm.weight".to_string(), vec![d], Fill::Const(1.0)));
    t
}

/// splitmix64: a fast, well-mixed hash for block selection and weights.
fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn unit(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// A standard normal from two hashes (Box-Muller).
fn gauss(h: u64) -> f64 {
    let u1 = unit(mix64(h)).max(1e-300);
    let u2 = unit(mix64(h ^ 0x5555_5555_5555_5555));
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Pre-quantized blocks of one type at one scale.
struct Pool {
    block_bytes: usize,
    data: Vec<u8>,
}

fn build_pool(ty: GgmlType, sigma: f64, seed: u64) -> Result<Pool, String> {
    let bs = ty.block_size();
    let bb = ty.type_size();
    let mut data = Vec::with_capacity(POOL_BLOCKS * bb);
    let mut group = vec![0f32; bs];
    let mut buf = Vec::new();
    for b in 0..POOL_BLOCKS {
        for (j, g) in group.iter_mut().enumerate() {
            *g = (gauss(seed ^ ((b as u64) << 20) ^ j as u64) * sigma) as f32;
        }
        match ty {
            GgmlType::Pn3t | GgmlType::Pn4t => {
                let pn = if ty == GgmlType::Pn3t {
                    pn_format::PnType::Pn3t
                } else {
                    pn_format::PnType::Pn4t
                };
                let q = pn_format::quantize_row_ref(pn, &group).map_err(|e| e.to_string())?;
                data.extend_from_slice(&q);
            }
            _ => {
                buf.clear();
                gguf_io::quants::quantize_row(ty, &group, &mut buf).map_err(|e| e.to_string())?;
                data.extend_from_slice(&buf);
            }
        }
    }
    if data.len() != POOL_BLOCKS * bb {
        return Err(format!(
            "{} pool has {} bytes, expected {}",
            ty.name(),
            data.len(),
            POOL_BLOCKS * bb
        ));
    }
    Ok(Pool {
        block_bytes: bb,
        data,
    })
}

/// Fills `out` with blocks `first..` of tensor `tensor_id`, drawn from `pool`.
fn fill_blocks(pool: &Pool, seed: u64, tensor_id: u64, first: u64, out: &mut [u8], threads: usize) {
    let bb = pool.block_bytes;
    let n = out.len() / bb;
    let per = n.div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        for (c, part) in out.chunks_mut(per * bb).enumerate() {
            s.spawn(move || {
                let base = first + (c * per) as u64;
                for (i, blk) in part.chunks_exact_mut(bb).enumerate() {
                    let h = mix64(seed ^ (tensor_id << 40) ^ (base + i as u64));
                    let k = (h % POOL_BLOCKS as u64) as usize;
                    blk.copy_from_slice(&pool.data[k * bb..(k + 1) * bb]);
                }
            });
        }
    });
}

/// Generates a tensor's blocks chunk by chunk as the writer reads them, so a 700 MB tensor is
/// never held in memory.
struct BlockReader<'a> {
    pool: &'a Pool,
    seed: u64,
    tensor_id: u64,
    n_blocks: u64,
    next_block: u64,
    buf: Vec<u8>,
    pos: usize,
    threads: usize,
}

impl Read for BlockReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.pos == self.buf.len() {
            if self.next_block == self.n_blocks {
                return Ok(0);
            }
            let bb = self.pool.block_bytes as u64;
            let n = (CHUNK_BYTES as u64 / bb)
                .max(1)
                .min(self.n_blocks - self.next_block);
            self.buf.resize((n * bb) as usize, 0);
            fill_blocks(
                self.pool,
                self.seed,
                self.tensor_id,
                self.next_block,
                &mut self.buf,
                self.threads,
            );
            self.next_block += n;
            self.pos = 0;
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

fn f32_data(fill: Fill, n: usize, seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * 4);
    for i in 0..n as u64 {
        let h = mix64(seed ^ i);
        let v = match fill {
            Fill::Const(c) => c,
            Fill::SsmA => -(0.05 + 0.95 * unit(h)) as f32,
            Fill::Dt => (2.0 * unit(h) - 1.0) as f32,
            Fill::Conv => (0.3 * gauss(h)) as f32,
            Fill::Matrix => 0.0,
        };
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

fn default_vocab() -> PathBuf {
    pn_tests::data("qwen-tokenizer", "vocab-qwen35.gguf")
}

/// The `tokenizer.*` keys of the vocab file, with the token list padded to the full vocabulary.
fn tokenizer_metadata(path: &Path) -> Result<Vec<(String, Value)>, Box<dyn std::error::Error>> {
    let f = GgufFile::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = Vec::new();
    for m in f.metadata() {
        if !m.key.starts_with("tokenizer.") {
            continue;
        }
        let v = match (&*m.key, &m.value) {
            ("tokenizer.ggml.tokens", Value::Array(Array::String(t))) => {
                let mut t = t.clone();
                for i in t.len() as u64..VOCAB {
                    t.push(format!("[PAD{i}]"));
                }
                Value::Array(Array::String(t))
            }
            ("tokenizer.ggml.token_type", Value::Array(Array::I32(t))) => {
                let mut t = t.clone();
                // 5 = unused, as the converter marks padding slots.
                t.resize(VOCAB as usize, 5);
                Value::Array(Array::I32(t))
            }
            _ => m.value.clone(),
        };
        out.push((m.key.clone(), v));
    }
    if out.is_empty() {
        return Err(format!("{}: no tokenizer.* keys", path.display()).into());
    }
    Ok(out)
}

/// The planned tensors, the promoted names and the rotation block size.
type Assigned = (Vec<Planned>, Vec<String>, Option<usize>);

/// Chooses each tensor's type by the P0k+19 rules; 19 pn3t tensors (picked by the seed, since
/// random weights have no errors worth ranking) are promoted.
fn assign_types(shape: &Shape, seed: u64) -> Result<Assigned, Box<dyn std::error::Error>> {
    let mix = Mix::p0k19();
    let mut planned = Vec::new();
    for (name, dims, fill) in tensor_list(shape) {
        let role = classify(&name, &dims, shape.d)?;
        let mut ty = mix.target(role).ggml();
        if let Target::Stock(t) = mix.target(role) {
            // Small shapes: a K that a 256-weight superblock does not divide falls back to Q8_0.
            if !dims[0].is_multiple_of(t.block_size() as u64) {
                ty = GgmlType::Q8_0;
            }
        }
        planned.push(Planned {
            name,
            dims,
            fill,
            ty,
            role,
        });
    }
    let mut cands: Vec<(u64, usize)> = planned
        .iter()
        .enumerate()
        .filter(|(_, p)| p.ty == GgmlType::Pn3t)
        .map(|(i, p)| (mix64(seed ^ 0xC0FFEE ^ fxhash(&p.name)), i))
        .collect();
    cands.sort();
    let mut promoted = Vec::new();
    for &(_, i) in cands.iter().take(mix.promote) {
        planned[i].ty = GgmlType::Pn4t;
        promoted.push(planned[i].name.clone());
    }
    let rotated: Vec<(&str, u64)> = planned
        .iter()
        .filter(|p| p.ty.is_pn())
        .map(|p| (p.name.as_str(), p.dims[0]))
        .collect();
    let r = rotation::resolve(RotationChoice::Default, &rotated)?;
    Ok((planned, promoted, r))
}

/// One planned tensor: name, dims (GGUF order), type.
pub type PlannedTensor = (String, Vec<u64>, GgmlType);

/// The 27B model's tensors as synth-model writes them, typed by the P0k+19 rules (the traffic
/// model's weight bytes).
pub fn planned_27b() -> Result<Vec<PlannedTensor>, Box<dyn std::error::Error>> {
    let shape = Shape::parse("27b")?;
    let (planned, _, _) = assign_types(&shape, 1234)?;
    Ok(planned
        .into_iter()
        .map(|p| (p.name, p.dims, p.ty))
        .collect())
}

fn fxhash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// Standard deviation of a matrix's weights: outputs of about 0.5 RMS for unit-RMS inputs keep
/// 64 residual layers finite and logits in a sane range.
fn sigma_for(role: Role, k: u64) -> f64 {
    match role {
        Role::TokenEmbd => 0.02,
        _ => 0.5 / (k as f64).sqrt(),
    }
}

/// Runs `cargo xtask synth-model`.
pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let t0 = Instant::now();
    let shape = Shape::parse(&args.shape)?;
    if args.out.exists() && !args.force {
        return Err(format!("{} exists (pass --force to overwrite)", args.out.display()).into());
    }
    let threads = if args.threads == 0 {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    } else {
        args.threads
    };
    let vocab = args.vocab.clone().unwrap_or_else(default_vocab);
    let (meta, planned, promoted, rot) = plan_with_metadata(&shape, &vocab, args.seed)?;
    let tmp = args.out.with_file_name(format!(
        ".{}.partial-{}",
        args.out
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        std::process::id()
    ));
    let result = write_model(&tmp, &meta, &planned, args.seed, threads);
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, &args.out)?;
    let size = std::fs::metadata(&args.out)?.len();
    let secs = t0.elapsed().as_secs_f64();
    let mut by_ty: HashMap<&str, u64> = HashMap::new();
    for p in &planned {
        let n = p.ty.row_bytes(p.dims[0]).unwrap_or(0) * p.dims[1..].iter().product::<u64>();
        *by_ty.entry(p.ty.name()).or_default() += n;
    }
    let mut by_ty: Vec<_> = by_ty.into_iter().collect();
    by_ty.sort();
    for (t, n) in by_ty {
        println!("  {t:6} {n:>15} B");
    }
    println!(
        "wrote {}: {} tensors, {size} bytes ({:.3} GB) in {secs:.1} s ({:.0} MB/s); rotation {:?}; {} promoted",
        args.out.display(),
        planned.len(),
        size as f64 / 1e9,
        size as f64 / 1e6 / secs,
        rot,
        promoted.len()
    );
    Ok(())
}

/// The metadata, the typed tensors, the promoted names and the rotation block of a synthetic
/// model of `shape` (tokenizer keys from `vocab`).
type ModelPlan = (
    Vec<(String, Value)>,
    Vec<Planned>,
    Vec<String>,
    Option<usize>,
);

fn plan_with_metadata(
    shape: &Shape,
    vocab: &Path,
    seed: u64,
) -> Result<ModelPlan, Box<dyn std::error::Error>> {
    let tok = tokenizer_metadata(vocab)?;
    let (planned, promoted, rot) = assign_types(shape, seed)?;

    let mut meta: Vec<(String, Value)> = Vec::new();
    let a = "qwen35";
    let mut kv = |k: &str, v: Value| meta.push((k.to_string(), v));
    kv("general.architecture", Value::String(a.into()));
    kv("general.type", Value::String("model".into()));
    kv(
        "general.name",
        Value::String(format!("synthetic-qwen35-{}-pn3", shape.name)),
    );
    kv("general.size_label", Value::String(shape.size_label.into()));
    kv(
        "general.description",
        Value::String("synthetic weights (pseudo-random, valid blocks) for speed and memory tests; not a language model".into()),
    );
    kv(
        &format!("{a}.block_count"),
        Value::U32((shape.layers + 1) as u32),
    );
    kv(&format!("{a}.context_length"), Value::U32(shape.ctx as u32));
    kv(&format!("{a}.embedding_length"), Value::U32(shape.d as u32));
    kv(
        &format!("{a}.feed_forward_length"),
        Value::U32(shape.f as u32),
    );
    kv(
        &format!("{a}.attention.head_count"),
        Value::U32(shape.hq as u32),
    );
    kv(
        &format!("{a}.attention.head_count_kv"),
        Value::U32(shape.hkv as u32),
    );
    kv(
        &format!("{a}.rope.dimension_sections"),
        Value::Array(Array::I32(vec![11, 11, 10, 0])),
    );
    kv(&format!("{a}.rope.freq_base"), Value::F32(1e7));
    kv(
        &format!("{a}.attention.layer_norm_rms_epsilon"),
        Value::F32(1e-6),
    );
    kv(
        &format!("{a}.attention.key_length"),
        Value::U32(shape.dh as u32),
    );
    kv(
        &format!("{a}.attention.value_length"),
        Value::U32(shape.dh as u32),
    );
    kv(&format!("{a}.nextn_predict_layers"), Value::U32(1));
    kv(&format!("{a}.ssm.conv_kernel"), Value::U32(4));
    kv(&format!("{a}.ssm.state_size"), Value::U32(shape.dk as u32));
    kv(&format!("{a}.ssm.group_count"), Value::U32(shape.hk as u32));
    kv(
        &format!("{a}.ssm.time_step_rank"),
        Value::U32(shape.hv as u32),
    );
    kv(
        &format!("{a}.ssm.inner_size"),
        Value::U32((shape.hv * shape.dk) as u32),
    );
    kv(
        &format!("{a}.attention.recurrent_layers"),
        Value::Array(Array::Bool(
            (0..=shape.layers).map(|i| !shape.full_attn(i)).collect(),
        )),
    );
    kv(&format!("{a}.full_attention_interval"), Value::U32(4));
    kv(
        &format!("{a}.rope.dimension_count"),
        Value::U32(shape.rope_dims as u32),
    );
    kv("general.quantization_version", Value::U32(2));
    for (k, v) in tok {
        kv(&k, v);
    }
    if let Some(r) = rot {
        kv("pn.rotation.kind", Value::String("hadamard".into()));
        kv("pn.rotation.block_size", Value::U32(r as u32));
    }
    kv("pn.mix", Value::String(Mix::p0k19().to_string()));
    kv("pn.promoted", Value::Array(Array::String(promoted.clone())));

    Ok((meta, planned, promoted, rot))
}

/// Writes the 27B synthetic model's header (metadata and tensor table, as `synth-model --shape
/// 27b` writes them) with every tensor's data left unwritten: a sparse file of the full length
/// whose data reads back as zeros, for passes that need the shapes and types only (the launch
/// count of `cargo xtask traffic`).
pub fn write_sparse_27b(path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let shape = Shape::parse("27b")?;
    let (meta, planned, _, _) = plan_with_metadata(&shape, &default_vocab(), 1234)?;
    let mut w = GgufWriter::new(File::create(path)?);
    for (k, v) in meta {
        w.add_metadata(&k, v)?;
    }
    for p in &planned {
        w.add_tensor_info(&p.name, p.ty, &p.dims)?;
    }
    w.write_header()?;
    for p in &planned {
        w.skip_tensor_data(&p.name)?;
    }
    w.finish()?;
    Ok(())
}

fn write_model(
    path: &Path,
    meta: &[(String, Value)],
    planned: &[Planned],
    seed: u64,
    threads: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let file = File::create(path)?;
    let mut out = BufWriter::with_capacity(8 << 20, file);
    let mut w = GgufWriter::new(&mut out);
    for (k, v) in meta {
        w.add_metadata(k, v.clone())?;
    }
    for p in planned {
        w.add_tensor_info(&p.name, p.ty, &p.dims)?;
    }
    w.write_header()?;
    let mut pools: HashMap<(GgmlType, u64), Pool> = HashMap::new();
    let total = planned.len();
    for (idx, p) in planned.iter().enumerate() {
        let k = p.dims[0];
        let rows: u64 = p.dims[1..].iter().product();
        if p.fill != Fill::Matrix {
            let data = f32_data(p.fill, (k * rows) as usize, seed ^ mix64(idx as u64));
            w.write_tensor_data(&p.name, &data)?;
            continue;
        }
        let key = (p.ty, k);
        if let std::collections::hash_map::Entry::Vacant(slot) = pools.entry(key) {
            slot.insert(build_pool(
                p.ty,
                sigma_for(p.role, k),
                seed ^ mix64(k) ^ p.ty.id() as u64,
            )?);
        }
        let pool = &pools[&key];
        let n_blocks = k / p.ty.block_size() as u64 * rows;
        let mut reader = BlockReader {
            pool,
            seed,
            tensor_id: idx as u64,
            n_blocks,
            next_block: 0,
            buf: Vec::new(),
            pos: 0,
            threads,
        };
        w.write_tensor_from_reader(&p.name, &mut reader)?;
        if idx.is_multiple_of(64) || idx + 1 == total {
            eprintln!("[{:4}/{total}] {}", idx + 1, p.name);
        }
    }
    w.finish()?;
    let file = out.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_have_the_27b_tensor_count_and_types() {
        let s = Shape::parse("27b").unwrap();
        let (planned, promoted, r) = assign_types(&s, 1).unwrap();
        // 2 + 48 GDN x 14 + 16 attention x 11 + MTP (11 + 4) + output_norm (the tiny model's
        // 124 = 2 + 6 x 14 + 2 x 11 + 15 + 1 by the same rule).
        assert_eq!(planned.len(), 2 + 48 * 14 + 16 * 11 + 15 + 1);
        assert_eq!(promoted.len(), 19);
        assert_eq!(r, Some(256));
        let ty = |n: &str| planned.iter().find(|p| p.name == n).unwrap().ty;
        assert_eq!(ty("token_embd.weight"), GgmlType::Q3K);
        assert_eq!(ty("output.weight"), GgmlType::Q4K);
        assert_eq!(ty("blk.0.ssm_alpha.weight"), GgmlType::Q8_0);
        assert_eq!(ty("blk.3.attn_k.weight"), GgmlType::Pn4t);
        assert_eq!(ty("blk.64.nextn.eh_proj.weight"), GgmlType::Pn4t);
        assert_eq!(ty("blk.0.ffn_down.weight"), GgmlType::Pn4t);
        let pn3 = planned.iter().filter(|p| p.ty == GgmlType::Pn3t).count();
        // 48 x 4 (qkv, gate, ffn_gate, ffn_up) + 17 x 3 (q, ffn_gate, ffn_up) - 19 promoted.
        assert_eq!(pn3, 48 * 4 + 17 * 3 - 19);
    }
}

#[cfg(test)]
mod model_tests {
    use super::*;

    /// The tiny shape (real vocabulary) is written, every PN tensor validates, and the model
    /// loads and runs a forward pass with finite logits.
    #[test]
    fn tiny_synthetic_model_loads_and_runs() {
        let dir = std::env::temp_dir().join(format!("pn-synth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("tiny.gguf");
        run(Args {
            shape: "tiny".into(),
            out: out.clone(),
            vocab: None,
            seed: 7,
            force: false,
            threads: 2,
        })
        .unwrap();
        let f = GgufFile::open(&out).unwrap();
        assert_eq!(f.get_str("pn.mix").unwrap(), "P0k+19");
        assert_eq!(f.get_u32("pn.rotation.block_size").unwrap(), 64);
        assert_eq!(f.get_u32("qwen35.block_count").unwrap(), 9);
        assert_eq!(
            f.get_str_array("tokenizer.ggml.tokens").unwrap().len(),
            VOCAB as usize
        );
        for t in f.tensor_infos().iter().filter(|t| t.ty.is_pn()) {
            let pn = if t.ty == GgmlType::Pn3t {
                pn_format::PnType::Pn3t
            } else {
                pn_format::PnType::Pn4t
            };
            let v = f.tensor(&t.name).unwrap();
            pn_format::validate_row(pn, v.bytes).unwrap_or_else(|e| panic!("{}: {e}", t.name));
        }
        drop(f);
        let model = qwen_model::Model::load(&out, qwen_model::CpuBackend::new(2)).unwrap();
        let tokens = [9419u32, 11, 1879, 0];
        let mut state = model.new_state(8).unwrap();
        let mut ws = model.new_workspace(4).unwrap();
        let mut logits = vec![0f32; tokens.len() * model.config.vocab];
        model
            .forward(
                &mut state,
                &mut ws,
                &tokens,
                qwen_model::Outputs::all_logits(&mut logits),
            )
            .unwrap();
        assert!(logits.iter().all(|v| v.is_finite()));
        let spread = logits.iter().fold(0f32, |a, v| a.max(v.abs()));
        assert!(spread > 1e-3 && spread < 100.0, "{spread}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
