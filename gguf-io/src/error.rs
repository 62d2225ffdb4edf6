//! The error type of GGUF reading, metadata access and writing.

use std::path::PathBuf;

/// Everything that can go wrong while reading, querying or writing a GGUF file.
///
/// Parse errors carry the absolute byte offset in the file where the problem was found, and the
/// key or tensor name involved when there is one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The file could not be opened, measured or mapped.
    #[error("cannot read {path}: {source}")]
    Open {
        /// The file that failed.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// An I/O error while writing.
    #[error("write failed: {0}")]
    Io(#[from] std::io::Error),
    /// The first four bytes are not `GGUF`.
    #[error("bad magic {found:02x?}: not a GGUF file")]
    BadMagic {
        /// The bytes found (fewer than four if the file is that short).
        found: Vec<u8>,
    },
    /// The version field reads as a big-endian number: a big-endian GGUF.
    #[error("big-endian GGUF not supported (version field reads {raw:#010x})")]
    BigEndian {
        /// The version field as read little-endian.
        raw: u32,
    },
    /// A version other than 2 or 3.
    #[error("unsupported GGUF version {version} (only 2 and 3 are supported)")]
    UnsupportedVersion {
        /// The version in the file.
        version: u32,
    },
    /// The file ends before a field that must be there.
    #[error(
        "file truncated: {what} needs {needed} bytes at offset {offset}, file is {file_len} bytes"
    )]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// Absolute offset of the field.
        offset: u64,
        /// Bytes the field needs.
        needed: u64,
        /// Size of the whole file.
        file_len: u64,
    },
    /// A count (tensors, metadata pairs, array elements) cannot fit in the rest of the file.
    #[error("{what} count {count} at offset {offset} cannot fit in the {remaining} bytes left in the file")]
    CountTooLarge {
        /// Which count.
        what: &'static str,
        /// The count as stored.
        count: u64,
        /// Absolute offset of the count field.
        offset: u64,
        /// Bytes left after the count field.
        remaining: u64,
    },
    /// A string's bytes are not valid UTF-8.
    #[error("invalid UTF-8 in {what} at offset {offset}")]
    InvalidUtf8 {
        /// What the string is (key, string value, tensor name).
        what: &'static str,
        /// Absolute offset of the first string byte.
        offset: u64,
    },
    /// An empty metadata key.
    #[error("empty metadata key at offset {offset}")]
    EmptyKey {
        /// Absolute offset of the key.
        offset: u64,
    },
    /// The same metadata key twice.
    #[error("duplicate metadata key {key:?}")]
    DuplicateKey {
        /// The repeated key.
        key: String,
    },
    /// A metadata value type id outside 0..=12.
    #[error("metadata key {key:?}: unknown value type {type_id} at offset {offset}")]
    UnknownValueType {
        /// The key whose value it is.
        key: String,
        /// The type id found.
        type_id: u32,
        /// Absolute offset of the type field.
        offset: u64,
    },
    /// A bool byte other than 0 or 1.
    #[error("metadata key {key:?}: invalid bool byte {byte} at offset {offset}")]
    InvalidBool {
        /// The key whose value it is.
        key: String,
        /// The byte found.
        byte: u8,
        /// Absolute offset of the byte.
        offset: u64,
    },
    /// Arrays nested deeper than the reader allows.
    #[error("metadata key {key:?}: arrays nested deeper than {max} levels at offset {offset}")]
    NestingTooDeep {
        /// The key whose value it is.
        key: String,
        /// The nesting limit.
        max: usize,
        /// Absolute offset of the innermost array header.
        offset: u64,
    },
    /// `general.alignment` is not a non-zero power of two stored as UINT32.
    #[error("invalid general.alignment {value}: must be a UINT32 power of two")]
    InvalidAlignment {
        /// The value (or its type) found.
        value: String,
    },
    /// A tensor with more than four dimensions.
    #[error("tensor {tensor:?}: {n_dims} dimensions (at most 4 are allowed)")]
    TooManyDims {
        /// The tensor.
        tensor: String,
        /// The dimension count found.
        n_dims: u32,
    },
    /// A tensor type id that is neither a stock ggml type nor a PN type.
    #[error("tensor {tensor:?}: unknown ggml type id {id}")]
    UnknownType {
        /// The tensor.
        tensor: String,
        /// The type id found.
        id: u32,
    },
    /// The row length is not a whole number of blocks.
    #[error(
        "tensor {tensor:?}: ne0 = {ne0} is not a multiple of the {ty} block size {block_size}"
    )]
    NotBlockMultiple {
        /// The tensor.
        tensor: String,
        /// Its type name.
        ty: &'static str,
        /// The row length.
        ne0: u64,
        /// The type's block size.
        block_size: usize,
    },
    /// The element count or byte size overflows 64 bits.
    #[error("tensor {tensor:?}: size of dims {dims:?} overflows")]
    SizeOverflow {
        /// The tensor.
        tensor: String,
        /// Its dimensions.
        dims: Vec<u64>,
    },
    /// The same tensor name twice.
    #[error("duplicate tensor name {name:?}")]
    DuplicateTensor {
        /// The repeated name.
        name: String,
    },
    /// A tensor data offset that is not a multiple of the alignment.
    #[error(
        "tensor {tensor:?}: data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    MisalignedOffset {
        /// The tensor.
        tensor: String,
        /// Its offset relative to the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// A tensor whose bytes extend past the end of the file.
    #[error("tensor {tensor:?}: bytes {offset}..+{n_bytes} (data-relative) exceed the {data_len}-byte data section")]
    TensorOutOfBounds {
        /// The tensor.
        tensor: String,
        /// Its offset relative to the data section.
        offset: u64,
        /// Its size in bytes.
        n_bytes: u64,
        /// Bytes in the data section.
        data_len: u64,
    },
    /// Two tensors whose byte ranges overlap.
    #[error("tensor {tensor:?} overlaps tensor {other:?} in the data section")]
    TensorOverlap {
        /// The later tensor (by offset).
        tensor: String,
        /// The tensor it overlaps.
        other: String,
    },
    /// No tensor of that name.
    #[error("tensor {name:?} not found")]
    TensorNotFound {
        /// The requested name.
        name: String,
    },
    /// No metadata key of that name.
    #[error("metadata key {key:?} missing")]
    MissingKey {
        /// The requested key.
        key: String,
    },
    /// The metadata value has another type than the getter expects.
    #[error("metadata key {key:?}: expected {expected}, found {found}")]
    WrongType {
        /// The key.
        key: String,
        /// The type the getter wanted.
        expected: &'static str,
        /// The type in the file.
        found: &'static str,
    },
    /// An integer value that does not fit the requested type.
    #[error("metadata key {key:?}: value {value} does not fit in {expected}")]
    OutOfRange {
        /// The key.
        key: String,
        /// The requested type.
        expected: &'static str,
        /// The value found.
        value: String,
    },
    /// The writer was used out of order or given inconsistent data.
    #[error("writer: {0}")]
    Writer(String),
}
