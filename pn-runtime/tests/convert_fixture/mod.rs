//! The tiny model as a Hugging Face checkpoint, rebuilt in a temporary folder from files in
//! the repository (tests/data/tiny-qwen35/hf/README.md): the 90 tensors llama.cpp's converter
//! copies or only permutes come from `model-f16.gguf` (its values are exactly the F16
//! checkpoint's, see tiny-qwen35/README.md), un-permuted here; the 34 whose values it
//! transforms (`1 + w`, `-exp(A_log)`) are stored as they are in the checkpoint, in
//! `hf/value-transformed.safetensors`. The names and the permutation are written out here
//! independently of `pn_runtime::convert`, so a mistake there is not repeated.

#![allow(dead_code)]

use gguf_io::{GgmlType, GgufFile};
use safetensors::tensor::{Dtype, TensorView};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The tiny model: 8 layers (3 and 7 full attention), MTP block 8, 2 k heads, 6 v heads of 128.
const LAYERS: u64 = 8;
const NK: u64 = 2;
const R: u64 = 3;
const DV: u64 = 128;
const QK: u64 = 2 * NK * 128;

/// `tests/data/tiny-qwen35/hf/<file>`.
pub fn hf_data(file: &str) -> PathBuf {
    pn_tests::paths::tiny("hf").join(file)
}

/// GGUF name -> checkpoint name, for the tensors taken from model-f16.gguf.
fn hf_name(gguf: &str) -> String {
    match gguf {
        "token_embd.weight" => return "model.embed_tokens.weight".into(),
        "output.weight" => return "lm_head.weight".into(),
        _ => {}
    }
    let rest = gguf.strip_prefix("blk.").expect("a block tensor");
    let (b, t) = rest.split_once('.').expect("blk.N.name");
    let b: u64 = b.parse().expect("block number");
    if t == "nextn.eh_proj.weight" {
        return "mtp.fc.weight".into();
    }
    let tail = match t {
        "ffn_gate.weight" => "mlp.gate_proj.weight",
        "ffn_up.weight" => "mlp.up_proj.weight",
        "ffn_down.weight" => "mlp.down_proj.weight",
        "attn_q.weight" => "self_attn.q_proj.weight",
        "attn_k.weight" => "self_attn.k_proj.weight",
        "attn_v.weight" => "self_attn.v_proj.weight",
        "attn_output.weight" => "self_attn.o_proj.weight",
        "attn_qkv.weight" => "linear_attn.in_proj_qkv.weight",
        "attn_gate.weight" => "linear_attn.in_proj_z.weight",
        "ssm_beta.weight" => "linear_attn.in_proj_b.weight",
        "ssm_alpha.weight" => "linear_attn.in_proj_a.weight",
        "ssm_dt.bias" => "linear_attn.dt_bias",
        "ssm_conv1d.weight" => "linear_attn.conv1d.weight",
        "ssm_norm.weight" => "linear_attn.norm.weight",
        "ssm_out.weight" => "linear_attn.out_proj.weight",
        other => panic!("no checkpoint name for {other}"),
    };
    if b >= LAYERS {
        format!("mtp.layers.{}.{tail}", b - LAYERS)
    } else {
        format!("model.layers.{b}.{tail}")
    }
}

/// Index in the checkpoint (grouped heads) of GGUF (tiled) index `o` in blocks of `d`.
fn grouped(o: u64, d: u64, start: u64) -> u64 {
    if o < start {
        return o;
    }
    let (head, e) = ((o - start) / d, (o - start) % d);
    let (s, g) = (head / NK, head % NK);
    start + (g * R + s) * d + e
}

/// The checkpoint bytes (F16) and shape of GGUF tensor `name` of model-f16.gguf.
fn hf_tensor(f: &GgufFile, name: &str) -> (Vec<u8>, Vec<usize>) {
    let v = f.tensor(name).expect("tensor");
    // GGUF dims are fastest first; the checkpoint is row-major.
    let mut shape: Vec<usize> = v.dims.iter().rev().map(|&d| d as usize).collect();
    let elems: Vec<[u8; 2]> = match v.ty {
        GgmlType::F16 => v.bytes.chunks_exact(2).map(|c| [c[0], c[1]]).collect(),
        GgmlType::F32 => v
            .bytes
            .chunks_exact(4)
            .map(|c| {
                let x = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                let h = half::f16::from_f32(x);
                assert_eq!(h.to_f32(), x, "{name}: not an f16 value");
                h.to_le_bytes()
            })
            .collect(),
        other => panic!("{name}: unexpected {other:?}"),
    };
    let cols = if shape.len() == 2 { shape[1] } else { 1 };
    let rows = elems.len() / cols;
    // Row permutation (start, block) or column permutation for ssm_out.
    let rowp = match name
        .rsplit_once('.')
        .map(|(a, b)| (a.rsplit('.').next().unwrap_or(""), b))
    {
        Some(("attn_qkv", _)) | Some(("ssm_conv1d", _)) => Some((DV, QK)),
        Some(("attn_gate", _)) => Some((DV, 0)),
        Some(("ssm_beta", _)) | Some(("ssm_alpha", _)) | Some(("ssm_dt", _)) => Some((1, 0)),
        _ => None,
    };
    let colp = name.ends_with("ssm_out.weight");
    // out[grouped(o)] = in[o]: the checkpoint row grouped(o) is GGUF row o.
    let mut out = vec![[0u8; 2]; elems.len()];
    for o in 0..rows {
        let dst_row = rowp.map_or(o as u64, |(d, st)| grouped(o as u64, d, st)) as usize;
        for c in 0..cols {
            let dst_col = if colp {
                grouped(c as u64, DV, 0) as usize
            } else {
                c
            };
            out[dst_row * cols + dst_col] = elems[o * cols + c];
        }
    }
    if name.ends_with("ssm_conv1d.weight") {
        shape = vec![shape[0], 1, shape[1]];
    }
    (out.concat(), shape)
}

/// Writes the tiny checkpoint (F16, one `model.safetensors`) into `dir` with the config and
/// tokenizer files, and returns every tensor as (name -> (dtype, shape, bytes)).
pub fn write_tiny_checkpoint(dir: &Path) -> BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)> {
    let tensors = tiny_tensors();
    write_safetensors(&dir.join("model.safetensors"), &tensors);
    copy_side_files(dir);
    tensors
}

/// Copies config.json, generation_config.json and the tokenizer files into `dir`.
pub fn copy_side_files(dir: &Path) {
    for f in [
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        std::fs::copy(hf_data(f), dir.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
    }
}

/// Every checkpoint tensor of the tiny model: name -> (dtype, shape, bytes).
pub fn tiny_tensors() -> BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)> {
    let f = GgufFile::open(pn_tests::paths::tiny("model-f16.gguf")).expect("model-f16.gguf");
    let small = std::fs::read(hf_data("value-transformed.safetensors")).expect("small file");
    let st = safetensors::SafeTensors::deserialize(&small).expect("value-transformed");
    let mut out = BTreeMap::new();
    for (name, v) in st.tensors() {
        out.insert(name, (v.dtype(), v.shape().to_vec(), v.data().to_vec()));
    }
    for info in f.tensor_infos() {
        let n = &info.name;
        let transformed = n.ends_with("_norm.weight") && !n.ends_with("ssm_norm.weight")
            || n.ends_with("ssm_a")
            || n.ends_with("nextn.enorm.weight")
            || n.ends_with("nextn.hnorm.weight");
        if transformed {
            continue;
        }
        let (bytes, shape) = hf_tensor(&f, n);
        out.insert(hf_name(n), (Dtype::F16, shape, bytes));
    }
    assert_eq!(out.len(), 124, "the tiny checkpoint has 124 tensors");
    out
}

/// Writes `tensors` as one safetensors file.
pub fn write_safetensors(path: &Path, tensors: &BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)>) {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, (dt, shape, bytes))| {
            (
                n.clone(),
                TensorView::new(*dt, shape.clone(), bytes).expect("view"),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).expect("write safetensors");
}

/// The same tensors as F32 (every F16 value widened exactly).
pub fn to_f32(
    tensors: &BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)>,
) -> BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)> {
    tensors
        .iter()
        .map(|(n, (dt, shape, bytes))| {
            assert_eq!(*dt, Dtype::F16);
            let wide: Vec<u8> = bytes
                .chunks_exact(2)
                .flat_map(|c| {
                    half::f16::from_le_bytes([c[0], c[1]])
                        .to_f32()
                        .to_le_bytes()
                })
                .collect();
            (n.clone(), (Dtype::F32, shape.clone(), wide))
        })
        .collect()
}

/// sha256 of `bytes` as lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
