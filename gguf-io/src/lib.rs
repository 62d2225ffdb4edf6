//! GGUF v2/v3 reading (memory-mapped, zero-copy, bounds-checked) and writing, the ggml type
//! table, CPU decoding and dot products of the stock ggml types a model uses, and the q8_0/q4_0
//! blocks a quantized KV cache stores ([`kv_blocks`]: every block format has its one home here
//! or in `pn-format`).
//!
//! ```no_run
//! let f = gguf_io::GgufFile::open("model.gguf")?;
//! let arch = f.get_str("general.architecture")?;
//! let t = f.tensor("output.weight")?;
//! println!("{arch}: {} {:?} {} bytes", t.ty, t.dims, t.bytes.len());
//! # Ok::<(), gguf_io::GgufError>(())
//! ```
#![warn(missing_docs)]

mod cursor;
mod error;
pub mod kv_blocks;
pub mod mapwatch;
mod metadata;
pub mod quants;
mod reader;
mod types;
mod value;
mod writer;

pub use error::GgufError;
pub use mapwatch::{install_sigbus_report, MapWatch, EXIT_FILE_CHANGED};
pub use reader::{
    GgufFile, TensorInfo, TensorView, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC,
    MAX_ARRAY_DEPTH, MAX_DIMS,
};
pub use types::GgmlType;
pub use value::{Array, MetadataEntry, Value, ValueType};
pub use writer::{
    write_gguf, write_gguf_to, write_gguf_to_vec, GgufWriter, TensorSpec, WRITE_VERSION,
};

#[cfg(test)]
mod tests {
    /// Models are shared between threads (CPU matmul workers): the file must be Send + Sync.
    #[test]
    fn gguf_file_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<crate::GgufFile>();
        check::<crate::TensorView<'static>>();
    }
}
