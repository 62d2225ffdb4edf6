//! The Qwen3.5/Qwen3.8 hybrid model: configuration from GGUF metadata, weight binding, the forward
//! graph written once against a `Backend` trait, and its two backends side by side.
//!
//! Module layout:
//! - [`config`]: [`ModelConfig`] from the GGUF metadata; [`weights`]: the bound [`Weights`].
//! - `model`: the forward graph: [`Model`] (binding, the trunk pass, the LM head), one decoder
//!   block (gated attention or Gated DeltaNet mixer, SwiGLU FFN), the MTP block, and the
//!   [`Workspace`] of scratch activations (every buffer named with its shape).
//! - [`state`]: what a sequence carries between calls ([`State`]: KV caches, GDN states) and
//!   the copies for rolling back ([`Snapshot`], [`StateTrace`]).
//! - [`backend`]: the [`Backend`] trait the graph is written against. Every op returns
//!   `Result<_, ModelError>` (a device backend reports a failed launch where it happens; the
//!   graph propagates it with `?`), multi-buffer ops take parameter structs ([`GdnArgs`],
//!   [`GateLayout`], [`ConvShape`]), and [`Backend::supports`] declares what a backend can run
//!   (head sizes, [`KvCacheType`]s), checked against the model's [`Requirements`] when a model
//!   is bound and when a state is made, so a limit is a load-time [`Unsupported`] error.
//! - The backends, side by side: [`cpu`] ([`CpuBackend`]: `Vec<f32>` buffers, weights read in
//!   place, a small thread pool; every KV cache type) and, behind the `cuda` feature, `cuda`
//!   (`CudaBackend` over `pn-kernels`, device-resident buffers; its kernels' head sizes and
//!   one K/V type declared in `supports`).
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
pub mod fused;
mod model;
pub mod state;
pub mod topk;
pub mod weights;

pub use backend::{
    AttnGateRot, AttnLayout, Backend, ConvIn, ConvShape, GateLayout, GatedNormShape, GdnArgs,
    GdnDims, GdnRowScratch, GdnTrace, KvCacheType, MixerOut, QkNormRope, Requirements, RopeLayout,
    RotatedOut, Unsupported, WeightSource,
};
pub use config::{LayerKind, ModelConfig, Rotation};
pub use cpu::CpuBackend;
pub use error::ModelError;
pub use fused::{NormDest, NormIn, NormRot, SwigluRot};
pub use model::{BatchSeq, Model, MtpSeq, Outputs, Workspace};
pub use state::{kv_bytes_per_token, GdnState, Snapshot, State, StateTrace};
pub use weights::Weights;
