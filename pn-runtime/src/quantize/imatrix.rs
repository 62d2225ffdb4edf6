//! Importance matrices (per input column mean of `x^2`) in llama.cpp's two file layouts, read
//! and written:
//! - GGUF (`general.type = "imatrix"`): per weight `W` a tensor `W.in_sum2` (f32, dims
//!   `[k, n_mat]`: per matrix the sums of squares of each input column) and `W.counts` (f32,
//!   dims `[1, n_mat]`: rows accumulated per matrix), plus `imatrix.datasets` (string array),
//!   `imatrix.chunk_count` and `imatrix.chunk_size` (u32);
//! - legacy `.dat`: `i32 n`, then per entry `i32 len, name, i32 ncall, i32 nval, f32
//!   values[nval]` with `values = mean(x^2) * ncall`, then optionally `i32 chunk_count, i32 len,
//!   dataset name`.
//!
//! (Layouts as llama.cpp's `tools/imatrix` writes them and `llama-quantize` reads them.)

use super::calib::CalibStats;
use super::error::QuantizeError;
use gguf_io::{GgmlType, MetadataEntry, Value};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// Column importances (mean `x^2` per input column) by tensor name.
pub type Importance = HashMap<String, Vec<f32>>;

/// One weight's statistics: `n_mat` matrices (1 for dense weights, the experts of a MoE).
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// Sums of squares `[n_mat, k]`.
    pub sums: Vec<f32>,
    /// Rows accumulated per matrix `[n_mat]`.
    pub counts: Vec<f32>,
}

impl Entry {
    /// Row length `k`.
    pub fn k(&self) -> usize {
        self.sums.len() / self.counts.len().max(1)
    }

    /// Mean `x^2` per column, averaged over the matrices.
    pub fn means(&self) -> Vec<f32> {
        let k = self.k();
        let n = self.counts.len().max(1);
        let mut imp = vec![0f32; k];
        for (m, c) in self.counts.iter().enumerate() {
            let c = if *c > 0.0 { *c } else { 1.0 };
            for (j, v) in imp.iter_mut().enumerate() {
                *v += self.sums[m * k + j] / c / n as f32;
            }
        }
        imp
    }
}

/// A whole importance-matrix file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ImatrixData {
    /// Entries by weight name (sorted, so files are written in a fixed order).
    pub entries: BTreeMap<String, Entry>,
    /// Calibration dataset names.
    pub datasets: Vec<String>,
    /// Chunks accumulated.
    pub chunk_count: u32,
    /// Tokens per chunk (0 when unknown, as in legacy files).
    pub chunk_size: u32,
}

impl ImatrixData {
    /// The imatrix of calibration statistics (sums in the basis the matmuls saw).
    pub fn from_stats(stats: &CalibStats, dataset: &str) -> ImatrixData {
        let mut entries = BTreeMap::new();
        for s in &stats.inputs {
            for name in &s.names {
                entries.insert(
                    name.clone(),
                    Entry {
                        sums: s.sum2.iter().map(|&v| v as f32).collect(),
                        counts: vec![s.count as f32],
                    },
                );
            }
        }
        ImatrixData {
            entries,
            datasets: vec![dataset.to_string()],
            chunk_count: stats.chunks as u32,
            chunk_size: stats.chunk_size as u32,
        }
    }

    /// Mean importances by name.
    pub fn importance(&self) -> Importance {
        self.entries
            .iter()
            .map(|(n, e)| (n.clone(), e.means()))
            .collect()
    }

    /// The GGUF layout, in memory.
    pub fn to_gguf(&self) -> Result<Vec<u8>, gguf_io::GgufError> {
        let meta = vec![
            MetadataEntry {
                key: "general.type".into(),
                value: Value::String("imatrix".into()),
            },
            MetadataEntry {
                key: "imatrix.datasets".into(),
                value: Value::Array(gguf_io::Array::String(self.datasets.clone())),
            },
            MetadataEntry {
                key: "imatrix.chunk_count".into(),
                value: Value::U32(self.chunk_count),
            },
            MetadataEntry {
                key: "imatrix.chunk_size".into(),
                value: Value::U32(self.chunk_size),
            },
        ];
        let mut names = Vec::new();
        let mut blobs = Vec::new();
        let mut dims = Vec::new();
        for (n, e) in &self.entries {
            names.push(format!("{n}.in_sum2"));
            blobs.push(f32_bytes(&e.sums));
            dims.push([e.k() as u64, e.counts.len() as u64]);
            names.push(format!("{n}.counts"));
            blobs.push(f32_bytes(&e.counts));
            dims.push([1, e.counts.len() as u64]);
        }
        let tensors: Vec<gguf_io::TensorSpec<'_>> = (0..names.len())
            .map(|i| {
                (
                    names[i].as_str(),
                    GgmlType::F32,
                    &dims[i][..],
                    blobs[i].as_slice(),
                )
            })
            .collect();
        gguf_io::write_gguf_to_vec(&meta, &tensors)
    }

    /// The legacy `.dat` layout (one matrix per entry: the matrices of a MoE entry are
    /// averaged, as that layout has no room for them).
    pub fn to_legacy(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&(self.entries.len() as i32).to_le_bytes());
        let ncall = self.chunk_count.max(1) as f32;
        for (n, e) in &self.entries {
            b.extend_from_slice(&(n.len() as i32).to_le_bytes());
            b.extend_from_slice(n.as_bytes());
            b.extend_from_slice(&(ncall as i32).to_le_bytes());
            let m = e.means();
            b.extend_from_slice(&(m.len() as i32).to_le_bytes());
            for v in m {
                b.extend_from_slice(&(v * ncall).to_le_bytes());
            }
        }
        b.extend_from_slice(&(self.chunk_count as i32).to_le_bytes());
        let ds = self.datasets.first().map_or("", String::as_str);
        b.extend_from_slice(&(ds.len() as i32).to_le_bytes());
        b.extend_from_slice(ds.as_bytes());
        b
    }

    /// Writes the file, in the legacy layout when `path` ends in `.dat`, else as GGUF.
    pub fn write(&self, path: &Path) -> Result<(), QuantizeError> {
        let werr = |e: std::io::Error| QuantizeError::Write {
            path: path.to_path_buf(),
            source: e,
        };
        let bytes = if path.extension().is_some_and(|e| e == "dat") {
            self.to_legacy()
        } else {
            self.to_gguf().map_err(|e| QuantizeError::GgufWrite {
                path: path.to_path_buf(),
                source: e,
            })?
        };
        std::fs::write(path, bytes).map_err(werr)
    }

    /// Reads a file in either layout.
    pub fn read(path: &Path) -> Result<ImatrixData, QuantizeError> {
        let err = |why: String| QuantizeError::Imatrix {
            path: path.to_path_buf(),
            why,
        };
        let bytes = std::fs::read(path).map_err(|e| err(e.to_string()))?;
        if bytes.starts_with(b"GGUF") {
            let f = gguf_io::GgufFile::from_bytes(bytes).map_err(|e| QuantizeError::Gguf {
                path: path.to_path_buf(),
                source: e,
            })?;
            parse_gguf(&f).map_err(err)
        } else {
            parse_legacy_file(&bytes).map_err(err)
        }
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Reads an importance matrix file in either layout: mean `x^2` per column by name.
pub fn load(path: &Path) -> Result<Importance, QuantizeError> {
    Ok(ImatrixData::read(path)?.importance())
}

fn parse_gguf(f: &gguf_io::GgufFile) -> Result<ImatrixData, String> {
    let mut out = ImatrixData {
        datasets: f
            .get_str_array("imatrix.datasets")
            .map(|v| v.into_iter().map(str::to_string).collect())
            .unwrap_or_default(),
        chunk_count: f.get_u32("imatrix.chunk_count").unwrap_or(0),
        chunk_size: f.get_u32("imatrix.chunk_size").unwrap_or(0),
        ..ImatrixData::default()
    };
    for info in f.tensor_infos() {
        let Some(name) = info.name.strip_suffix(".in_sum2") else {
            continue;
        };
        let sums = f32_tensor(f, &info.name)?;
        let counts = f32_tensor(f, &format!("{name}.counts"))?;
        let k = info.dims.first().copied().unwrap_or(0) as usize;
        if k == 0 || !sums.len().is_multiple_of(k) || sums.len() / k != counts.len() {
            return Err(format!(
                "tensor {}: {} sums do not match {} counts of K = {k}",
                info.name,
                sums.len(),
                counts.len()
            ));
        }
        if let Some(j) = sums.iter().position(|v| !v.is_finite() || *v < 0.0) {
            return Err(format!(
                "tensor {}: value {j} is {} (must be finite, >= 0)",
                info.name, sums[j]
            ));
        }
        if let Some(m) = counts.iter().position(|c| !c.is_finite() || *c < 0.0) {
            return Err(format!(
                "tensor {name}.counts: count {m} is {} (must be finite, >= 0)",
                counts[m]
            ));
        }
        let entry = Entry { sums, counts };
        // A count that is tiny but not zero (a subnormal, say) makes sum / count overflow:
        // the quantizer would then weight that column infinitely.
        if let Some((j, v)) = entry
            .means()
            .iter()
            .enumerate()
            .find(|(_, v)| !v.is_finite())
        {
            return Err(format!(
                "tensor {}: the mean of column {j} is {v} (sums over counts overflow)",
                info.name
            ));
        }
        out.entries.insert(name.to_string(), entry);
    }
    Ok(out)
}

fn f32_tensor(f: &gguf_io::GgufFile, name: &str) -> Result<Vec<f32>, String> {
    let t = f.tensor(name).map_err(|e| format!("tensor {name}: {e}"))?;
    if t.ty != GgmlType::F32 {
        return Err(format!(
            "tensor {name}: type {} (expected f32)",
            t.ty.name()
        ));
    }
    Ok(t.bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// Parses the legacy layout: mean `x^2` per column by name (`values / ncall`).
pub fn parse_legacy(bytes: &[u8]) -> Result<Importance, String> {
    Ok(parse_legacy_file(bytes)?.importance())
}

fn parse_legacy_file(bytes: &[u8]) -> Result<ImatrixData, String> {
    let mut pos = 0usize;
    let mut take = |n: usize, what: &str| -> Result<&[u8], String> {
        let end = pos
            .checked_add(n)
            .filter(|&e| e <= bytes.len())
            .ok_or_else(|| format!("truncated: {what} needs {n} bytes at offset {pos}"))?;
        let s = &bytes[pos..end];
        pos = end;
        Ok(s)
    };
    let read_i32 = |s: &[u8]| i32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    let n = read_i32(take(4, "entry count")?);
    if n < 0 {
        return Err(format!("negative entry count {n}"));
    }
    let mut out = ImatrixData::default();
    for i in 0..n {
        let len = read_i32(take(4, "name length")?);
        if !(0..=4096).contains(&len) {
            return Err(format!("entry {i}: bad name length {len}"));
        }
        let name = String::from_utf8(take(len as usize, "name")?.to_vec())
            .map_err(|_| format!("entry {i}: name is not UTF-8"))?;
        let ncall = read_i32(take(4, &format!("tensor {name}: ncall"))?);
        let nval = read_i32(take(4, &format!("tensor {name}: value count"))?);
        if nval < 0 {
            return Err(format!("tensor {name}: negative value count {nval}"));
        }
        let raw = take(nval as usize * 4, &format!("tensor {name}: values"))?;
        let sums: Vec<f32> = raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        if let Some(j) = sums.iter().position(|v| !v.is_finite() || *v < 0.0) {
            return Err(format!(
                "tensor {name}: value {j} is {} (must be finite, >= 0)",
                sums[j]
            ));
        }
        let counts = vec![if ncall > 0 { ncall as f32 } else { 1.0 }];
        out.entries.insert(name, Entry { sums, counts });
    }
    // Optional trailer: chunk count and the dataset name.
    if let Ok(c) = take(4, "chunk count") {
        out.chunk_count = read_i32(c).max(0) as u32;
        if let Ok(l) = take(4, "dataset name length") {
            let l = read_i32(l).clamp(0, 1 << 20) as usize;
            if let Ok(s) = take(l, "dataset name") {
                out.datasets.push(String::from_utf8_lossy(s).into_owned());
            }
        }
    }
    Ok(out)
}

/// Checks that every entry of `imp` names a tensor of the model with that row length
/// (`k_of(name)`: `None` if the model has no such matrix).
pub fn check_model(
    path: &Path,
    imp: &Importance,
    k_of: impl Fn(&str) -> Option<usize>,
) -> Result<(), QuantizeError> {
    let mut names: Vec<&String> = imp.keys().collect();
    names.sort();
    for n in names {
        let why = match k_of(n) {
            None => "no such matrix in the model".to_string(),
            Some(k) if k != imp[n].len() => {
                format!("{} columns, the model's matrix has K = {k}", imp[n].len())
            }
            Some(_) => continue,
        };
        return Err(QuantizeError::ImatrixMismatch {
            path: path.to_path_buf(),
            tensor: n.clone(),
            why,
        });
    }
    Ok(())
}

#[cfg(test)]
#[path = "imatrix_tests.rs"]
mod tests;
