//! The error type of `pn convert`: every variant names the file, and the tensor or field where
//! there is one.

use std::path::PathBuf;

/// Why a checkpoint could not be converted.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// The input is not a directory.
    #[error("{0}: not a checkpoint directory (expected config.json and *.safetensors)")]
    NotADirectory(PathBuf),
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A JSON file (config.json, tokenizer.json, the index...) is malformed.
    #[error("{path}: invalid JSON: {msg}")]
    Json {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        msg: String,
    },
    /// A config.json field is missing or has the wrong type.
    #[error("{path}: field `{field}`: {msg}")]
    Config {
        /// config.json (or tokenizer_config.json).
        path: PathBuf,
        /// The field.
        field: String,
        /// What is wrong.
        msg: String,
    },
    /// The checkpoint is of another architecture.
    #[error("{path}: architecture {found} is not supported (pn converts Qwen3_5ForCausalLM / Qwen3_5ForConditionalGeneration, model_type qwen3_5_text)")]
    WrongArchitecture {
        /// config.json.
        path: PathBuf,
        /// The `architectures` / `model_type` found.
        found: String,
    },
    /// The directory holds no `model*.safetensors` and no index.
    #[error("{0}: no model*.safetensors files and no model.safetensors.index.json")]
    NoShards(PathBuf),
    /// A shard named by the index does not exist.
    #[error("shard {shard} named by {index} is missing")]
    MissingShard {
        /// The missing file.
        shard: PathBuf,
        /// The index that names it.
        index: PathBuf,
    },
    /// The index names a tensor that its shard does not hold, or a shard holds a tensor the
    /// index does not name.
    #[error("{index}: tensor {tensor}: {msg}")]
    IndexMismatch {
        /// The index file.
        index: PathBuf,
        /// The tensor.
        tensor: String,
        /// What disagrees.
        msg: String,
    },
    /// A tensor appears in two shards.
    #[error("tensor {tensor} is in both {first} and {second}")]
    DuplicateTensor {
        /// The tensor.
        tensor: String,
        /// The first shard holding it.
        first: PathBuf,
        /// The second.
        second: PathBuf,
    },
    /// The 8-byte header length of a shard points past the end of the file.
    #[error("{path}: header length {header_len} + 8 is past the end of the {file_len}-byte file")]
    HeaderPastEnd {
        /// The shard.
        path: PathBuf,
        /// The declared JSON header length.
        header_len: u64,
        /// The file's length.
        file_len: u64,
    },
    /// A shard's JSON header is malformed.
    #[error("{path}: invalid safetensors header: {msg}")]
    BadHeader {
        /// The shard.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// A tensor's data lies past the end of its shard (a truncated download).
    #[error("{path}: tensor {tensor} needs bytes up to {needed} but the data section has {available}: the file is truncated")]
    Truncated {
        /// The shard.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// End of its data, relative to the data section.
        needed: u64,
        /// Size of the data section.
        available: u64,
    },
    /// Two tensors' data ranges overlap (or a range is not where the previous one ended).
    #[error("{path}: tensor {tensor}: data offsets [{begin}, {end}) overlap or leave a gap after the previous tensor (which ended at {prev_end})")]
    BadOffsets {
        /// The shard.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its begin offset.
        begin: u64,
        /// Its end offset.
        end: u64,
        /// Where the previous tensor (in offset order) ended.
        prev_end: u64,
    },
    /// A tensor's byte length disagrees with its dtype and shape.
    #[error("{path}: tensor {tensor}: {bytes} bytes of data, but dtype {dtype} and shape {shape:?} need {needed}")]
    SizeMismatch {
        /// The shard.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its bytes.
        bytes: u64,
        /// The dtype.
        dtype: String,
        /// The shape.
        shape: Vec<u64>,
        /// Bytes dtype x shape need.
        needed: u64,
    },
    /// A dtype string safetensors does not define.
    #[error("{path}: tensor {tensor}: unknown dtype {dtype:?}")]
    UnknownDtype {
        /// The shard.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The dtype string.
        dtype: String,
    },
    /// A valid safetensors dtype this converter does not read (only F16, BF16, F32).
    #[error("{path}: tensor {tensor}: dtype {dtype} is not supported (F16, BF16 and F32 are)")]
    UnsupportedDtype {
        /// The shard.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The dtype.
        dtype: String,
    },
    /// A tensor's shape disagrees with what config.json implies.
    #[error("{path}: tensor {tensor} has shape {found:?} but config.json implies {expected:?}")]
    ShapeMismatch {
        /// The shard.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its shape.
        found: Vec<u64>,
        /// The shape config.json implies.
        expected: Vec<u64>,
    },
    /// A tensor name this architecture does not have.
    #[error("{path}: tensor {tensor} is not part of a qwen35 checkpoint")]
    UnknownTensor {
        /// The shard.
        path: PathBuf,
        /// The tensor.
        tensor: String,
    },
    /// A tensor the architecture needs is missing from every shard.
    #[error("{dir}: tensor {tensor} is missing from the checkpoint")]
    MissingTensor {
        /// The checkpoint directory.
        dir: PathBuf,
        /// The tensor.
        tensor: String,
    },
    /// tokenizer.json is missing or unusable.
    #[error("{path}: {msg}")]
    Tokenizer {
        /// tokenizer.json or tokenizer_config.json.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// The output exists and `force` is off.
    #[error("output {0} exists (use --force to overwrite)")]
    OutputExists(PathBuf),
    /// Writing the output failed.
    #[error("writing {path}: {msg}")]
    Write {
        /// The output file.
        path: PathBuf,
        /// What failed.
        msg: String,
    },
    /// The disk filled up.
    #[error("writing {path}: no space left on the device (the output needs {needed} bytes)")]
    DiskFull {
        /// The output file.
        path: PathBuf,
        /// Bytes the whole output needs.
        needed: u64,
    },
    /// Stopped by the cancel flag (Ctrl-C); the temporary output was removed.
    #[error("interrupted; the partial output was removed")]
    Interrupted,
}

impl ConvertError {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> ConvertError {
        ConvertError::Io {
            path: path.into(),
            source,
        }
    }
}
