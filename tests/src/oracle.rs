//! Readers of the oracle files in `tests/data`: raw little-endian f32 arrays (logits, hidden
//! states), `{"tokens": [...]}` files, JSON and JSONL reference cases.
//!
//! Each reader has a `try_` form with a typed [`DataError`] naming the file, for tools that
//! report rather than panic (the xtask's golden cases), and a plain form for tests that panics
//! with that error.

use std::path::{Path, PathBuf};

/// A test-data file that cannot be read as expected.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The file cannot be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// An f32 file whose length is not a multiple of 4 bytes.
    #[error("{}: length {len} is not a multiple of 4", path.display())]
    F32Length {
        /// The file.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
    },
    /// Not valid JSON (`line` is 1-based, for JSONL files).
    #[error("{}{}: {source}", path.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
    Json {
        /// The file.
        path: PathBuf,
        /// The line of a JSONL file.
        line: Option<usize>,
        /// Why.
        source: serde_json::Error,
    },
    /// A JSON value that should be an array of token ids is not.
    #[error("expected an array of token ids")]
    NotIds,
    /// An element of a token-id array that is not a `u32`.
    #[error("not a token id: {0}")]
    NotId(serde_json::Value),
    /// A tokens file without a `tokens` array.
    #[error("{}: no \"tokens\" array", path.display())]
    NoTokens {
        /// The file.
        path: PathBuf,
    },
}

fn read(path: &Path) -> Result<Vec<u8>, DataError> {
    std::fs::read(path).map_err(|source| DataError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads a raw little-endian f32 file.
pub fn try_read_f32(path: &Path) -> Result<Vec<f32>, DataError> {
    let b = read(path)?;
    if b.len() % 4 != 0 {
        return Err(DataError::F32Length {
            path: path.to_path_buf(),
            len: b.len(),
        });
    }
    Ok(b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// The little-endian bytes of `v` (what [`read_f32`] reads back; a GGUF's F32 tensor data).
pub fn f32_le_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// [`try_read_f32`], panicking with the error.
pub fn read_f32(path: &Path) -> Vec<f32> {
    try_read_f32(path).unwrap_or_else(|e| panic!("{e}"))
}

/// Reads a JSON file.
pub fn try_read_json(path: &Path) -> Result<serde_json::Value, DataError> {
    serde_json::from_slice(&read(path)?).map_err(|source| DataError::Json {
        path: path.to_path_buf(),
        line: None,
        source,
    })
}

/// [`try_read_json`], panicking with the error.
pub fn read_json(path: &Path) -> serde_json::Value {
    try_read_json(path).unwrap_or_else(|e| panic!("{e}"))
}

/// A JSON array of token ids as `u32`s.
pub fn try_ids(v: &serde_json::Value) -> Result<Vec<u32>, DataError> {
    v.as_array()
        .ok_or(DataError::NotIds)?
        .iter()
        .map(|x| {
            x.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| DataError::NotId(x.clone()))
        })
        .collect()
}

/// [`try_ids`], panicking with the error.
pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    try_ids(v).unwrap_or_else(|e| panic!("{e}"))
}

/// Reads a `{"tokens": [...]}` file (the oracle's token sequences).
pub fn read_tokens(path: &Path) -> Vec<u32> {
    let v = read_json(path);
    let Some(tokens) = v.get("tokens") else {
        panic!(
            "{}",
            DataError::NoTokens {
                path: path.to_path_buf()
            }
        )
    };
    ids(tokens)
}

/// The non-blank lines of a JSONL file as JSON values; panics naming the file and line.
pub fn jsonl(path: impl AsRef<Path>) -> Vec<serde_json::Value> {
    let path = path.as_ref();
    let text = String::from_utf8(read(path).unwrap_or_else(|e| panic!("{e}")))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).unwrap_or_else(|source| {
                let e = DataError::Json {
                    path: path.to_path_buf(),
                    line: Some(i + 1),
                    source,
                };
                panic!("{e}")
            })
        })
        .collect()
}
