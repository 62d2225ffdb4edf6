//! An opened checkpoint: config, shards, and for every output tensor its GGUF name, type, dims
//! and how its bytes are made; plus the whole GGUF metadata. Tensor bytes are produced on demand,
//! one tensor (or a range of its rows) at a time, straight from the memory-mapped shards.

use super::config::Qwen35Config;
use super::error::ConvertError;
use super::names::{self, Mapping};
use super::shards::{self, Dtype, StTensor, Tensors};
use super::values::{convert_elements, OutType};
use super::{general, vocab};
use gguf_io::{GgmlType, MetadataEntry, TensorInfo, Value};
use std::borrow::Cow;
use std::path::{Path, PathBuf};

/// One tensor of the output.
#[derive(Clone, Debug)]
pub struct OutTensor {
    /// Name, type, GGUF dims (fastest first) and byte size; `offset` is 0 (not laid out yet).
    pub info: TensorInfo,
    /// The checkpoint tensor it comes from.
    pub source: StTensor,
    /// How.
    pub mapping: Mapping,
    /// Output elements per row (the last checkpoint dimension, after squeezing).
    pub row_len: u64,
    /// Rows (the product of the other dimensions).
    pub rows: u64,
    out_type: OutType,
}

/// What [`Checkpoint::open`] takes.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    /// Output type of the matrices (`None`: the checkpoint's own, lossless).
    pub outtype: Option<OutType>,
    /// `general.name` (default: the directory name, title-cased as llama.cpp does).
    pub model_name: Option<String>,
}

/// A checkpoint ready to be written as a `qwen35` GGUF.
#[derive(Debug)]
pub struct Checkpoint {
    /// The directory.
    pub dir: PathBuf,
    /// The hyper-parameters.
    pub config: Qwen35Config,
    /// The mapped shards.
    pub shards: Tensors,
    /// Output tensors, in the order llama.cpp's converter writes them.
    pub tensors: Vec<OutTensor>,
    /// Output tensor infos (the same tensors), for callers that want `TensorInfo`s.
    pub infos: Vec<TensorInfo>,
    /// All GGUF metadata, in the converter's order.
    pub metadata: Vec<MetadataEntry>,
    /// The matrix type chosen.
    pub outtype: OutType,
}

impl Checkpoint {
    /// Opens and checks the checkpoint in `dir`: config.json, every shard header, every tensor
    /// name and shape, and the tokenizer.
    pub fn open(dir: &Path, opts: &OpenOptions) -> Result<Checkpoint, ConvertError> {
        if !dir.is_dir() {
            return Err(ConvertError::NotADirectory(dir.to_path_buf()));
        }
        let config = Qwen35Config::load(dir)?;
        let shards = shards::open(dir)?;
        // `auto`: the dtype of the first matrix, as llama.cpp's heuristic (F32 stays F32).
        let outtype = opts.outtype.unwrap_or_else(|| {
            shards
                .tensors
                .iter()
                .find(|t| t.shape.len() >= 2)
                .map(|t| OutType::lossless_for(t.dtype))
                .unwrap_or(OutType::F16)
        });
        let mut tensors = Vec::with_capacity(shards.tensors.len());
        for t in &shards.tensors {
            let Some(norm) = names::normalise(&t.name) else {
                continue;
            };
            let Some(mapping) = names::map(&norm, &config) else {
                return Err(ConvertError::UnknownTensor {
                    path: shards.path(t).to_path_buf(),
                    tensor: t.name.clone(),
                });
            };
            if t.shape != mapping.expected_shape {
                return Err(ConvertError::ShapeMismatch {
                    path: shards.path(t).to_path_buf(),
                    tensor: t.name.clone(),
                    found: t.shape.clone(),
                    expected: mapping.expected_shape.clone(),
                });
            }
            let mut shape = t.shape.clone();
            if mapping.squeeze {
                shape.retain(|&d| d != 1);
            }
            let n_dims = shape.len();
            let out_type = if mapping.force_f32 || n_dims <= 1 {
                OutType::F32
            } else {
                outtype
            };
            let row_len = if n_dims <= 1 { 1 } else { shape[n_dims - 1] };
            let elems: u64 = shape.iter().product();
            let rows = elems / row_len.max(1);
            let dims: Vec<u64> = shape.iter().rev().copied().collect();
            let info = TensorInfo {
                name: mapping.gguf.clone(),
                ty: out_type.ggml(),
                dims,
                offset: 0,
                n_bytes: elems * out_type.size() as u64,
            };
            tensors.push(OutTensor {
                info,
                source: t.clone(),
                mapping,
                row_len,
                rows,
                out_type,
            });
        }
        check_complete(dir, &config, &tensors)?;
        let infos = tensors.iter().map(|t| t.info.clone()).collect();
        let mut ck = Checkpoint {
            dir: dir.to_path_buf(),
            config,
            shards,
            tensors,
            infos,
            metadata: Vec::new(),
            outtype,
        };
        ck.metadata = ck.build_metadata(opts)?;
        Ok(ck)
    }

    fn build_metadata(&self, opts: &OpenOptions) -> Result<Vec<MetadataEntry>, ConvertError> {
        let mut m = vec![
            MetadataEntry::new("general.architecture", Value::String("qwen35".into())),
            MetadataEntry::new("general.type", Value::String("model".into())),
        ];
        m.extend(sampling_keys(&self.dir)?);
        let name = match &opts.model_name {
            Some(n) => n.clone(),
            None => general::id_to_title(
                &self
                    .dir
                    .canonicalize()
                    .unwrap_or_else(|_| self.dir.clone())
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "model".into()),
            ),
        };
        m.push(MetadataEntry::new("general.name", Value::String(name)));
        let params: u64 = self.tensors.iter().map(|t| t.info.n_elements()).sum();
        m.push(MetadataEntry::new(
            "general.size_label",
            Value::String(general::size_label(params)),
        ));
        m.extend(self.config.metadata(self.outtype.file_type())?);
        m.push(MetadataEntry::new(
            "general.quantization_version",
            Value::U32(2),
        ));
        m.extend(vocab::metadata(
            &self.dir,
            self.config.vocab_size,
            "qwen35",
        )?);
        Ok(m)
    }

    /// Bytes of the whole output data section (without alignment padding).
    pub fn data_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.info.n_bytes).sum()
    }

    /// The output bytes of tensor `i`: borrowed from the map when nothing changes, else made.
    pub fn tensor_bytes(&self, i: usize) -> Cow<'_, [u8]> {
        let t = &self.tensors[i];
        let src = self.shards.bytes(&t.source);
        if t.mapping.op == names::ValueOp::None
            && t.mapping.reorder.is_none()
            && OutType::lossless_for(t.source.dtype) == t.out_type
        {
            return Cow::Borrowed(src);
        }
        let mut out = Vec::with_capacity(t.info.n_bytes as usize);
        self.rows_into(i, 0..t.rows, &mut out);
        Cow::Owned(out)
    }

    /// Appends the output bytes of rows `rows` of tensor `i` to `out`.
    pub fn rows_into(&self, i: usize, rows: std::ops::Range<u64>, out: &mut Vec<u8>) {
        let t = &self.tensors[i];
        let src = self.shards.bytes(&t.source);
        let es = t.source.dtype.size();
        let row_bytes = t.row_len as usize * es;
        let op = t.mapping.op;
        let row_reorder = t.mapping.reorder.filter(|r| !r.columns);
        let col_reorder = t.mapping.reorder.filter(|r| r.columns);
        let mut scratch = Vec::new();
        for o in rows {
            let s = row_reorder.map_or(o, |r| r.source(o)) as usize;
            let row = &src[s * row_bytes..(s + 1) * row_bytes];
            match col_reorder {
                None => convert_elements(row, t.source.dtype, op, t.out_type, out),
                Some(r) => {
                    // Gather the permuted columns of this row, then convert.
                    scratch.clear();
                    for c in 0..t.row_len {
                        let sc = r.source(c) as usize;
                        scratch.extend_from_slice(&row[sc * es..(sc + 1) * es]);
                    }
                    convert_elements(&scratch, t.source.dtype, op, t.out_type, out);
                }
            }
        }
    }

    /// The ggml type of the output tensor `i`.
    pub fn tensor_type(&self, i: usize) -> GgmlType {
        self.tensors[i].info.ty
    }

    /// The checkpoint dtype of output tensor `i`'s source.
    pub fn source_dtype(&self, i: usize) -> Dtype {
        self.tensors[i].source.dtype
    }
}

/// Every tensor the config implies must be there (the LM head may be tied to the embedding).
fn check_complete(
    dir: &Path,
    cfg: &Qwen35Config,
    tensors: &[OutTensor],
) -> Result<(), ConvertError> {
    let have: std::collections::HashSet<&str> =
        tensors.iter().map(|t| t.info.name.as_str()).collect();
    let mut need = vec![
        "token_embd.weight".to_string(),
        "output_norm.weight".to_string(),
    ];
    if !cfg.tie_embeddings {
        need.push("output.weight".into());
    }
    for b in 0..cfg.block_count() {
        let recurrent = cfg.recurrent.get(b as usize).copied().unwrap_or(false);
        let mut names = vec![
            "attn_norm.weight",
            "post_attention_norm.weight",
            "ffn_gate.weight",
            "ffn_up.weight",
            "ffn_down.weight",
        ];
        if recurrent {
            names.extend([
                "attn_qkv.weight",
                "attn_gate.weight",
                "ssm_beta.weight",
                "ssm_alpha.weight",
                "ssm_a",
                "ssm_dt.bias",
                "ssm_conv1d.weight",
                "ssm_norm.weight",
                "ssm_out.weight",
            ]);
        } else {
            names.extend([
                "attn_q.weight",
                "attn_k.weight",
                "attn_v.weight",
                "attn_output.weight",
                "attn_q_norm.weight",
                "attn_k_norm.weight",
            ]);
        }
        if b == cfg.layers {
            names.extend([
                "nextn.eh_proj.weight",
                "nextn.enorm.weight",
                "nextn.hnorm.weight",
                "nextn.shared_head_norm.weight",
            ]);
        }
        need.extend(names.iter().map(|n| format!("blk.{b}.{n}")));
    }
    for n in need {
        if !have.contains(n.as_str()) {
            return Err(ConvertError::MissingTensor {
                dir: dir.to_path_buf(),
                tensor: n,
            });
        }
    }
    Ok(())
}

/// `general.sampling.*` from generation_config.json (the recommended sampler settings).
fn sampling_keys(dir: &Path) -> Result<Vec<MetadataEntry>, ConvertError> {
    let path = dir.join("generation_config.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(Vec::new());
    };
    // Like llama.cpp, an unreadable generation config is ignored rather than fatal.
    let Ok(serde_json::Value::Object(g)) = serde_json::from_str::<serde_json::Value>(&text) else {
        return Ok(Vec::new());
    };
    let mut m = Vec::new();
    let int = |k: &str| {
        g.get(k)
            .and_then(|v| v.as_i64())
            .and_then(|v| i32::try_from(v).ok())
    };
    let float = |k: &str| g.get(k).and_then(|v| v.as_f64()).map(|v| v as f32);
    if let Some(s) = g.get("sequence").and_then(|v| v.as_str()) {
        m.push(MetadataEntry::new(
            "general.sampling.sequence",
            Value::String(s.into()),
        ));
    }
    if let Some(v) = int("top_k") {
        m.push(MetadataEntry::new("general.sampling.top_k", Value::I32(v)));
    }
    for (key, field) in [
        ("general.sampling.top_p", "top_p"),
        ("general.sampling.min_p", "min_p"),
        ("general.sampling.xtc_probability", "xtc_probability"),
        ("general.sampling.xtc_threshold", "xtc_threshold"),
        ("general.sampling.temp", "temperature"),
    ] {
        if let Some(v) = float(field) {
            m.push(MetadataEntry::new(key, Value::F32(v)));
        }
    }
    if let Some(v) = int("penalty_last_n") {
        m.push(MetadataEntry::new(
            "general.sampling.penalty_last_n",
            Value::I32(v),
        ));
    }
    if let Some(v) = float("penalty_repeat").or_else(|| float("repetition_penalty")) {
        m.push(MetadataEntry::new(
            "general.sampling.penalty_repeat",
            Value::F32(v),
        ));
    }
    if let Some(v) = int("mirostat") {
        m.push(MetadataEntry::new(
            "general.sampling.mirostat",
            Value::I32(v),
        ));
    }
    for (key, field) in [
        ("general.sampling.mirostat_tau", "mirostat_tau"),
        ("general.sampling.mirostat_eta", "mirostat_eta"),
    ] {
        if let Some(v) = float(field) {
            m.push(MetadataEntry::new(key, Value::F32(v)));
        }
    }
    Ok(m)
}

impl Checkpoint {
    /// Releases the mapped pages of output tensor `i`'s source once it is written, so that the
    /// resident set stays at one tensor however large the checkpoint is.
    pub fn release(&self, i: usize) {
        self.release_rows(i, 0..self.tensors[i].rows);
    }

    /// Releases the mapped pages of rows `rows` of output tensor `i`'s source, when those rows
    /// are read in order (no row permutation; a permuted tensor is released whole).
    pub fn release_rows(&self, i: usize, rows: std::ops::Range<u64>) {
        let ot = &self.tensors[i];
        if ot.mapping.reorder.is_some_and(|r| !r.columns) && rows != (0..ot.rows) {
            return;
        }
        let t = &ot.source;
        let row_bytes = ot.row_len as usize * t.dtype.size();
        let map = &self.shards.shards[t.shard].map;
        let page = 4096;
        let (a, b) = (
            t.range.start + rows.start as usize * row_bytes,
            t.range.start + rows.end as usize * row_bytes,
        );
        // Whole pages inside the range only: a page shared with a neighbour stays.
        let start = a.div_ceil(page) * page;
        let end = b / page * page;
        if end > start {
            // SAFETY: the map is a read-only file mapping; dropping its pages only makes the next
            // access read them from the file again, so no data the program sees changes.
            let _ = unsafe {
                map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start)
            };
        }
    }
}
