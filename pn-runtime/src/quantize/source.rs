//! Where `pn quantize` reads its input from: a GGUF file, or a Hugging Face checkpoint folder
//! converted on the fly ([`crate::convert`]: each tensor is made from the mapped shards when the
//! quantizer asks for it, so no intermediate GGUF is written). Both look the same to the
//! pipeline: metadata, tensor infos, and one tensor's bytes at a time.

use super::error::QuantizeError;
use crate::convert::{Checkpoint, OpenOptions};
use gguf_io::{GgufError, GgufFile, MetadataEntry, TensorInfo, Value};
use std::borrow::Cow;
use std::path::Path;

/// The quantizer's input.
#[derive(Debug)]
pub enum InputModel {
    /// A GGUF file.
    Gguf(Box<GgufFile>),
    /// A checkpoint folder, converted with its own dtype (lossless), tensor by tensor.
    Checkpoint(Box<Checkpoint>),
}

impl InputModel {
    /// Opens `path`: a directory is a checkpoint, anything else a GGUF.
    pub fn open(path: &Path) -> Result<InputModel, QuantizeError> {
        if path.is_dir() {
            let opts = OpenOptions {
                outtype: None,
                model_name: None,
            };
            return Checkpoint::open(path, &opts)
                .map(|c| InputModel::Checkpoint(Box::new(c)))
                .map_err(|source| QuantizeError::Checkpoint { source });
        }
        GgufFile::open(path)
            .map(|f| InputModel::Gguf(Box::new(f)))
            .map_err(|source| QuantizeError::Gguf {
                path: path.to_path_buf(),
                source,
            })
    }

    /// All metadata pairs in file order.
    pub fn metadata(&self) -> &[MetadataEntry] {
        match self {
            InputModel::Gguf(f) => f.metadata(),
            InputModel::Checkpoint(c) => &c.metadata,
        }
    }

    /// All tensor infos in file order.
    pub fn tensor_infos(&self) -> &[TensorInfo] {
        match self {
            InputModel::Gguf(f) => f.tensor_infos(),
            InputModel::Checkpoint(c) => &c.infos,
        }
    }

    fn require(&self, key: &str) -> Result<&Value, GgufError> {
        let v = match self {
            InputModel::Gguf(f) => f.get(key),
            InputModel::Checkpoint(c) => c.metadata.iter().find(|m| m.key == key).map(|m| &m.value),
        };
        v.ok_or_else(|| GgufError::MissingKey {
            key: key.to_string(),
        })
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        match self {
            InputModel::Gguf(f) => f.get_str(key),
            InputModel::Checkpoint(_) => match self.require(key)? {
                Value::String(s) => Ok(s),
                v => Err(GgufError::WrongType {
                    key: key.to_string(),
                    expected: "STRING",
                    found: v.type_description(),
                }),
            },
        }
    }

    /// An unsigned integer value.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        match self {
            InputModel::Gguf(f) => f.get_u64(key),
            InputModel::Checkpoint(_) => {
                let v = self.require(key)?;
                v.as_integer()
                    .and_then(|i| u64::try_from(i).ok())
                    .ok_or_else(|| GgufError::WrongType {
                        key: key.to_string(),
                        expected: "an integer fitting u64",
                        found: v.type_description(),
                    })
            }
        }
    }

    /// The bytes of tensor `name` (borrowed from the map where nothing changes).
    pub fn tensor_bytes(&self, name: &str) -> Result<Cow<'_, [u8]>, GgufError> {
        match self {
            InputModel::Gguf(f) => f.tensor(name).map(|v| Cow::Borrowed(v.bytes)),
            InputModel::Checkpoint(c) => {
                let i = c
                    .tensors
                    .iter()
                    .position(|t| t.info.name == name)
                    .ok_or_else(|| GgufError::TensorNotFound {
                        name: name.to_string(),
                    })?;
                Ok(c.tensor_bytes(i))
            }
        }
    }
}
