//! The PN weight format (PNX-FORMAT-v0): pn3t and pn4t blocks.
//!
//! This crate owns the block layout ([`block`]), bit-exact decoding and validation
//! ([`dequantize_row`], [`validate_row`]), the reference quantizer ([`quantize_row_ref`], and
//! the multi-threaded [`quantize_rows`]), CPU dot products and the matrix-vector product
//! ([`dot`]: scalar reference plus AVX2/AVX-512 paths chosen at run time) and the Hadamard
//! transform ([`hadamard`]). It knows nothing of GGUF, models or CUDA.
//!
//! A matrix-vector product the way a CPU backend does it: rotate and prepare the activations
//! once, then run rows (split row ranges across threads for parallelism):
//!
//! ```
//! use pn_format::{fwht_blocks_inplace, matvec, quantize_rows, rotate_rows, PnType, PreparedI16};
//!
//! let (rows, k, r) = (4, 160, 32);
//! let mut w: Vec<f32> = (0..rows * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0).collect();
//! rotate_rows(&mut w, k, r)?; // the quantizer stores W H
//! let weights = quantize_rows(PnType::Pn3t, &w, k, 0)?;
//!
//! let mut x: Vec<f32> = (0..k).map(|i| (i as f32).sin()).collect();
//! fwht_blocks_inplace(&mut x, r)?; // the runtime feeds H x
//! let acts = PreparedI16::new(PnType::Pn3t, &x)?;
//! let mut out = vec![0.0f32; rows];
//! matvec(PnType::Pn3t, &weights, rows, &acts, &mut out)?;
//! # Ok::<(), pn_format::PnError>(())
//! ```
//!
//! Normative sources: the PN format spec and the project's decisions page
//! (`docs/pn-format-decisions.md`), which wins where the spec is silent.
#![warn(missing_docs)]

pub mod block;
#[cfg(target_arch = "x86_64")]
mod block_x86;
mod decode;
pub mod dot;
mod error;
pub mod gptq;
pub mod gptq_linalg;
pub mod gptq_refine;
pub mod hadamard;
mod isa;
mod parallel;
mod quantize;
mod types;
pub mod weighted;

pub use block::{blocks, pack_block, BlockRef};
pub use decode::{dequantize_row, dequantize_row_with, validate_row};
pub use dot::{dot_f32, dot_prepared, dot_ref_f64, matvec, PreparedActs, PreparedF32, PreparedI16};
pub use error::PnError;
pub use hadamard::{fwht_blocks_inplace, rotate_rows};
pub use isa::{Isa, ISA_ENV};
pub use parallel::quantize_rows;
pub use quantize::{
    candidate_multiplier, candidate_scale, quantize_group_ref, quantize_row_into, quantize_row_ref,
    CANDIDATES,
};
pub use types::{PnType, BLOCK_BYTES, WORDS_PER_BLOCK};
