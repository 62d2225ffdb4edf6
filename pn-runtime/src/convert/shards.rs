//! The checkpoint's safetensors shards: found through `model.safetensors.index.json` (or as
//! `model*.safetensors` files), each memory-mapped and read through the `safetensors` crate.
//!
//! Before the crate sees a shard, its header is checked here so that each kind of damage gets
//! its own [`ConvertError`] naming the file and tensor: a header length past the end of the file,
//! an unknown dtype, a byte length that disagrees with dtype x shape, overlapping (or gapped)
//! data offsets, and data past the end of the file (a truncated download).

use super::error::ConvertError;
use memmap2::Mmap;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The element types a tensor can have in the checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    /// IEEE half.
    F16,
    /// bfloat16.
    Bf16,
    /// IEEE single.
    F32,
}

impl Dtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::F32 => 4,
        }
    }

    /// The safetensors spelling.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F16 => "F16",
            Dtype::Bf16 => "BF16",
            Dtype::F32 => "F32",
        }
    }
}

/// The dtype strings the safetensors format defines, with their size in bits (the format's own
/// table, <https://github.com/huggingface/safetensors>, `Dtype`). Anything else is an unknown
/// dtype; a known one other than F16/BF16/F32 is unsupported.
const FORMAT_DTYPES: &[(&str, u64)] = &[
    ("BOOL", 8),
    ("U8", 8),
    ("I8", 8),
    ("F8_E5M2", 8),
    ("F8_E4M3", 8),
    ("F8_E8M0", 8),
    ("F4", 4),
    ("F6_E2M3", 6),
    ("F6_E3M2", 6),
    ("I16", 16),
    ("U16", 16),
    ("F16", 16),
    ("BF16", 16),
    ("I32", 32),
    ("U32", 32),
    ("F32", 32),
    ("C64", 64),
    ("F64", 64),
    ("I64", 64),
    ("U64", 64),
];

/// One tensor of a shard.
#[derive(Clone, Debug)]
pub struct StTensor {
    /// The checkpoint's name.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Row-major shape (slowest first), as safetensors stores it.
    pub shape: Vec<u64>,
    /// Byte range in the mapped file.
    pub range: std::ops::Range<usize>,
    /// Index of the shard in [`Checkpoint::shards`].
    pub shard: usize,
}

/// One mapped shard.
#[derive(Debug)]
pub struct Shard {
    /// The file.
    pub path: PathBuf,
    /// Its bytes.
    pub map: Arc<Mmap>,
}

/// All shards of a checkpoint and their tensors, in the order llama.cpp's converter visits them:
/// shards sorted by file name, tensors of a shard sorted by name.
#[derive(Debug)]
pub struct Tensors {
    /// The mapped shards.
    pub shards: Vec<Shard>,
    /// Every tensor, in visiting order.
    pub tensors: Vec<StTensor>,
}

impl Tensors {
    /// The bytes of `t`.
    pub fn bytes(&self, t: &StTensor) -> &[u8] {
        &self.shards[t.shard].map[t.range.clone()]
    }

    /// The shard file holding `t`.
    pub fn path(&self, t: &StTensor) -> &Path {
        &self.shards[t.shard].path
    }
}

const INDEX: &str = "model.safetensors.index.json";

/// Finds, maps and checks every shard of the checkpoint in `dir`.
pub fn open(dir: &Path) -> Result<Tensors, ConvertError> {
    let index_path = dir.join(INDEX);
    let (names, weight_map) = if index_path.is_file() {
        let text =
            std::fs::read_to_string(&index_path).map_err(|e| ConvertError::io(&index_path, e))?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| ConvertError::Json {
            path: index_path.clone(),
            msg: e.to_string(),
        })?;
        let Some(map) = v.get("weight_map").and_then(|m| m.as_object()) else {
            return Err(ConvertError::Json {
                path: index_path.clone(),
                msg: "no `weight_map` object".into(),
            });
        };
        let mut weight_map = HashMap::new();
        for (tensor, file) in map {
            let Some(file) = file.as_str() else {
                return Err(ConvertError::Json {
                    path: index_path.clone(),
                    msg: format!("weight_map[{tensor:?}] is not a file name"),
                });
            };
            weight_map.insert(tensor.clone(), file.to_string());
        }
        let mut names: Vec<String> = weight_map.values().cloned().collect();
        names.sort();
        names.dedup();
        for n in &names {
            // A shard name is a plain file name in the checkpoint directory.
            if Path::new(n).components().count() != 1 {
                return Err(ConvertError::Json {
                    path: index_path.clone(),
                    msg: format!("shard name {n:?} is not a file name in the directory"),
                });
            }
            if !dir.join(n).is_file() {
                return Err(ConvertError::MissingShard {
                    shard: dir.join(n),
                    index: index_path.clone(),
                });
            }
        }
        (names, Some(weight_map))
    } else {
        let mut names = Vec::new();
        let rd = std::fs::read_dir(dir).map_err(|e| ConvertError::io(dir, e))?;
        for entry in rd {
            let entry = entry.map_err(|e| ConvertError::io(dir, e))?;
            let n = entry.file_name().to_string_lossy().into_owned();
            if n.starts_with("model") && n.ends_with(".safetensors") {
                names.push(n);
            }
        }
        names.sort();
        (names, None)
    };
    if names.is_empty() {
        return Err(ConvertError::NoShards(dir.to_path_buf()));
    }

    let mut shards = Vec::with_capacity(names.len());
    let mut tensors = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (si, n) in names.iter().enumerate() {
        let path = dir.join(n);
        let file = std::fs::File::open(&path).map_err(|e| ConvertError::io(&path, e))?;
        // SAFETY: the map is read-only; a checkpoint changed by another process while we read
        // it gives wrong values, never unsoundness in safe code we rely on (bytes are only copied).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| ConvertError::io(&path, e))?;
        let mut list = read_header(&path, &map, si)?;
        list.sort_by(|a, b| a.name.cmp(&b.name));
        for t in &list {
            if let Some(&first) = seen.get(&t.name) {
                return Err(ConvertError::DuplicateTensor {
                    tensor: t.name.clone(),
                    first: shards_path(&shards, first, &path),
                    second: path.clone(),
                });
            }
            seen.insert(t.name.clone(), si);
            if let Some(wm) = &weight_map {
                match wm.get(&t.name) {
                    Some(f) if f == n => {}
                    Some(f) => {
                        return Err(ConvertError::IndexMismatch {
                            index: index_path.clone(),
                            tensor: t.name.clone(),
                            msg: format!("the index places it in {f}, but it is in {n}"),
                        })
                    }
                    None => {
                        return Err(ConvertError::IndexMismatch {
                            index: index_path.clone(),
                            tensor: t.name.clone(),
                            msg: format!("in {n} but not in the index"),
                        })
                    }
                }
            }
        }
        tensors.extend(list);
        shards.push(Shard {
            path,
            map: Arc::new(map),
        });
    }
    if let Some(wm) = &weight_map {
        let mut missing: Vec<(&String, &String)> =
            wm.iter().filter(|(t, _)| !seen.contains_key(*t)).collect();
        missing.sort();
        if let Some((t, f)) = missing.first() {
            return Err(ConvertError::IndexMismatch {
                index: index_path.clone(),
                tensor: t.to_string(),
                msg: format!("the index places it in {f}, which does not hold it"),
            });
        }
    }
    Ok(Tensors { shards, tensors })
}

fn shards_path(shards: &[Shard], i: usize, fallback: &Path) -> PathBuf {
    shards
        .get(i)
        .map(|s| s.path.clone())
        .unwrap_or_else(|| fallback.to_path_buf())
}

/// Checks the header of the shard `map` (see the module docs) and lists its tensors.
fn read_header(path: &Path, map: &[u8], shard: usize) -> Result<Vec<StTensor>, ConvertError> {
    let bad = |msg: String| ConvertError::BadHeader {
        path: path.to_path_buf(),
        msg,
    };
    let file_len = map.len() as u64;
    if file_len < 8 {
        return Err(bad(format!(
            "{file_len} bytes: too short for the 8-byte header length"
        )));
    }
    let mut len8 = [0u8; 8];
    len8.copy_from_slice(&map[..8]);
    let header_len = u64::from_le_bytes(len8);
    if header_len.checked_add(8).is_none_or(|end| end > file_len) {
        return Err(ConvertError::HeaderPastEnd {
            path: path.to_path_buf(),
            header_len,
            file_len,
        });
    }
    let data_start = 8 + header_len as usize;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&map[8..data_start]).map_err(|e| bad(e.to_string()))?;
    let available = file_len - data_start as u64;

    // (name, dtype, shape, begin, end), checked entry by entry.
    let mut entries = Vec::with_capacity(header.len());
    for (name, info) in &header {
        if name == "__metadata__" {
            continue;
        }
        let dtype_str = info
            .get("dtype")
            .and_then(|d| d.as_str())
            .ok_or_else(|| bad(format!("tensor {name}: no dtype string")))?;
        let Some(&(_, bits)) = FORMAT_DTYPES.iter().find(|(n, _)| *n == dtype_str) else {
            return Err(ConvertError::UnknownDtype {
                path: path.to_path_buf(),
                tensor: name.clone(),
                dtype: dtype_str.to_string(),
            });
        };
        let shape: Vec<u64> = info
            .get("shape")
            .and_then(|s| s.as_array())
            .and_then(|a| a.iter().map(|d| d.as_u64()).collect::<Option<Vec<u64>>>())
            .ok_or_else(|| bad(format!("tensor {name}: shape is not a list of integers")))?;
        let offsets: Vec<u64> = info
            .get("data_offsets")
            .and_then(|s| s.as_array())
            .and_then(|a| a.iter().map(|d| d.as_u64()).collect::<Option<Vec<u64>>>())
            .filter(|o| o.len() == 2)
            .ok_or_else(|| bad(format!("tensor {name}: data_offsets is not [begin, end]")))?;
        let (begin, end) = (offsets[0], offsets[1]);
        if end < begin {
            return Err(ConvertError::BadOffsets {
                path: path.to_path_buf(),
                tensor: name.clone(),
                begin,
                end,
                prev_end: begin,
            });
        }
        let needed = shape
            .iter()
            .try_fold(bits, |a, &d| a.checked_mul(d))
            .map(|b| b.div_ceil(8))
            .ok_or_else(|| bad(format!("tensor {name}: shape {shape:?} overflows")))?;
        if needed != end - begin {
            return Err(ConvertError::SizeMismatch {
                path: path.to_path_buf(),
                tensor: name.clone(),
                bytes: end - begin,
                dtype: dtype_str.to_string(),
                shape,
                needed,
            });
        }
        entries.push((name.clone(), dtype_str, shape, begin, end));
    }
    // The data section must be tiled exactly, in offset order, as the format requires.
    entries.sort_by_key(|e| (e.3, e.4));
    let mut prev_end = 0u64;
    for (name, _, _, begin, end) in &entries {
        if *begin != prev_end {
            return Err(ConvertError::BadOffsets {
                path: path.to_path_buf(),
                tensor: name.clone(),
                begin: *begin,
                end: *end,
                prev_end,
            });
        }
        if *end > available {
            return Err(ConvertError::Truncated {
                path: path.to_path_buf(),
                tensor: name.clone(),
                needed: *end,
                available,
            });
        }
        prev_end = *end;
    }

    // The crate is the reader of record: it validates the same header again and gives the
    // tensor views whose bytes are used.
    let st = safetensors::SafeTensors::deserialize(map).map_err(|e| bad(e.to_string()))?;
    let mut out = Vec::with_capacity(entries.len());
    for (name, dtype_str, shape, _, _) in entries {
        let dtype = match dtype_str {
            "F16" => Dtype::F16,
            "BF16" => Dtype::Bf16,
            "F32" => Dtype::F32,
            other => {
                return Err(ConvertError::UnsupportedDtype {
                    path: path.to_path_buf(),
                    tensor: name,
                    dtype: other.to_string(),
                })
            }
        };
        let view = st
            .tensor(&name)
            .map_err(|e| bad(format!("tensor {name}: {e}")))?;
        let data = view.data();
        let begin = data.as_ptr() as usize - map.as_ptr() as usize;
        let got_shape: Vec<u64> = view.shape().iter().map(|&d| d as u64).collect();
        if got_shape != shape {
            return Err(bad(format!(
                "tensor {name}: the safetensors reader sees shape {got_shape:?}, the header says {shape:?}"
            )));
        }
        out.push(StTensor {
            name,
            dtype,
            shape,
            range: begin..begin + data.len(),
            shard,
        });
    }
    Ok(out)
}
