//! The crate's error type. Errors name the block, group or row involved; callers add the tensor.

use crate::types::PnType;
use thiserror::Error;

/// Everything that can go wrong in this crate. Never a panic on bad data: one of these instead.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum PnError {
    /// A byte buffer that should hold whole blocks has a ragged length.
    #[error("{ty} data of {len} bytes is not a whole number of 34-byte blocks")]
    RaggedBytes {
        /// The block type.
        ty: PnType,
        /// Length of the buffer in bytes.
        len: usize,
    },
    /// A weight or activation count that is not a whole number of blocks.
    #[error("{ty}: {len} values is not a multiple of the block size {block}")]
    RaggedWeights {
        /// The block type.
        ty: PnType,
        /// Number of values given.
        len: usize,
        /// Weights per block of `ty`.
        block: usize,
    },
    /// Two buffers that must agree in length do not.
    #[error("{what}: expected {expected} values, got {got}")]
    LengthMismatch {
        /// Which buffer is wrong.
        what: &'static str,
        /// The length the other arguments imply.
        expected: usize,
        /// The length given.
        got: usize,
    },
    /// Prepared activations were made for the other PN type.
    #[error("activations were prepared for {prepared}, the weights are {weights}")]
    TypeMismatch {
        /// The type the activations were prepared for.
        prepared: PnType,
        /// The type of the weights.
        weights: PnType,
    },
    /// A block's fp16 scale is NaN or infinite.
    #[error("block {block}: scale d is not finite (fp16 bits {bits:#06x})")]
    NonFiniteScale {
        /// Block index within the row.
        block: usize,
        /// The raw fp16 bits.
        bits: u16,
    },
    /// A pn3t word has reserved bit 15 or 31 set.
    #[error("block {block}: word {word} = {value:#010x} has reserved bits 15/31 set")]
    ReservedBits {
        /// Block index within the row.
        block: usize,
        /// Word index within the block (0..8).
        word: usize,
        /// The word's value.
        value: u32,
    },
    /// The quantizer was given a NaN or infinite weight.
    #[error("group {group}: weight {index} is not finite ({value})")]
    NonFiniteWeight {
        /// Group (block) index within the row.
        group: usize,
        /// Index of the weight within the group.
        index: usize,
        /// The offending value.
        value: f32,
    },
    /// A group's magnitude is too large for every candidate fp16 scale.
    #[error("group {group}: amax {amax:e} is too large for an fp16 scale")]
    ScaleOverflow {
        /// Group (block) index within the row.
        group: usize,
        /// The group's largest magnitude.
        amax: f64,
    },
    /// A Hadamard block size that is not a power of two of at least 2.
    #[error("Hadamard block size {r} is not a power of two >= 2")]
    HadamardSize {
        /// The block size given.
        r: usize,
    },
    /// A vector or row whose length is not a multiple of the Hadamard block size.
    #[error("length {len} is not a multiple of the Hadamard block size {r}")]
    HadamardLength {
        /// The length given.
        len: usize,
        /// The block size.
        r: usize,
    },
    /// A calibration Hessian that stays not positive definite even after damping.
    #[error("Hessian is not positive definite at column {column} (damping {damp:e})")]
    NotPositiveDefinite {
        /// The column where the Cholesky factorisation failed.
        column: usize,
        /// The largest damping tried (added to the diagonal).
        damp: f64,
    },
    /// An error inside one row of a multi-row operation.
    #[error("row {row}: {source}")]
    InRow {
        /// Row index.
        row: usize,
        /// What went wrong in that row.
        #[source]
        source: Box<PnError>,
    },
}

impl PnError {
    /// Wraps `self` with the row it happened in.
    pub fn in_row(self, row: usize) -> PnError {
        PnError::InRow {
            row,
            source: Box::new(self),
        }
    }
}
