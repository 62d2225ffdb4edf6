//! The Qwen3.5/Qwen3.8 hybrid model: configuration from GGUF metadata, weight binding, the forward
//! graph written once against a `Backend` trait, and its two backends side by side: the CPU
//! backend ([`cpu`]) and, behind the `cuda` feature, the CUDA backend ([`cuda`], over
//! `pn-kernels`).
//!
//! ```no_run
//! use qwen_model::{CpuBackend, Model, Outputs};
//! let model = Model::load("model.gguf", CpuBackend::new(0))?;
//! let mut state = model.new_state(4096)?;
//! let mut ws = model.new_workspace(64)?;
//! let mut logits = vec![0.0; model.config.vocab];
//! model.forward(&mut state, &mut ws, &[1, 2, 3], Outputs::last_logits(&mut logits))?;
//! # Ok::<(), qwen_model::ModelError>(())
//! ```
#![warn(missing_docs)]

pub mod backend;
pub mod config;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
mod error;
mod model;
pub mod state;
pub mod weights;

pub use backend::{
    AttnLayout, Backend, ConvShape, GateLayout, GdnArgs, GdnDims, GdnRowScratch, GdnTrace,
    KvCacheType, Requirements, RopeLayout, Unsupported, WeightSource,
};
pub use config::{LayerKind, ModelConfig, Rotation};
pub use cpu::CpuBackend;
pub use error::ModelError;
pub use model::{Model, Outputs, Workspace};
pub use state::{kv_bytes_per_token, GdnState, Snapshot, State, StateTrace};
pub use weights::Weights;
