//! CUDA C kernels for sm_60 (the Tesla P100), compiled at build time, and thin launch wrappers.
//!
//! - `kernels/*.cu`: one file per op family (`pn_gemv`, `quant_gemv`, `get_rows`, `matmul`,
//!   `hadamard`, `norm`, `rope`, `attention`, `attention_prefill`, `conv1d`, `delta_rule`,
//!   `delta_rule_chunked`, `elementwise`, `q8_group`: the grouped Q8_0 GEMV, [`q8_group`]);
//!   `kernels/*.cuh`: the block layouts and index math as `__host__ __device__` functions, also
//!   compiled as host C++ ([`host_shim`]) so the CPU tests check them bit for bit.
//! - [`modules`], [`build_info`], [`ptxas_report`]: what build.rs embedded (sm_60 cubin plus
//!   compute_60 PTX per module), or nothing when no CUDA compiler was found at build time.
//! - [`Gpu`] (feature `cuda`, on by default): loads the modules on a device (libcuda is loaded at
//!   run time, so the crate builds and runs without CUDA) and launches the kernels; every method
//!   checks shapes on the host and returns [`KernelError`] instead of launching out of bounds.
//!   The wrappers live in one module per `.cu` family: `src/gpu/mod.rs` (device, context,
//!   module loading, stream, the shared row geometry [`RowLayout`] / [`RowStrides`] /
//!   [`MatrixShape`]), then `src/gpu/{pn_gemv, quant_gemv, get_rows, matmul, hadamard, norm,
//!   rope, kv, attention, attention_prefill, conv1d, delta_rule, elementwise}.rs`, each
//!   launching the kernels of the `.cu` of its name (`kv.rs`: the store kernels of
//!   `attention.cu` and the cache element types; `delta_rule.rs`: both delta-rule files).
//!   Calls with many strides take parameter structs ([`AttnShape`], [`DeltaRuleShape`] with
//!   [`DeltaRuleInputs`], [`KvStoreRows`], [`NormShape`]).
//!
//! Build with kernels: `eval "$(scripts/cuda-toolchain.sh)" && cargo build -p pn-kernels`.
#![warn(missing_docs)]

mod embedded;
#[doc(hidden)]
pub mod emu;
#[doc(hidden)]
pub mod emu_mixer;
#[doc(hidden)]
pub mod emu_ops;
mod error;
#[cfg(feature = "cuda")]
mod gpu;
#[doc(hidden)]
pub mod host_shim;
pub mod launch;
mod mixer_types;
pub mod q8_group;
mod types;

pub use embedded::{build_info, kernels_available, module, modules, ptxas_report, EmbeddedModule};
pub use error::KernelError;
#[cfg(feature = "cuda")]
pub use gpu::{
    cudarc, driver_present, AttnShape, ConvViews, DeltaGates, DeltaRuleViews, FusedRows, Gpu,
    GroupMat, KvElem, KvLayout, KvStoreRows, MatrixShape, NormOutputs, NormShape, NormX,
    PreparedOut, Q4KvByte, Q8KvByte, RowLayout, RowPrepOut, RowStrides, SplitK, MAX_GRID_Y,
};
pub use mixer_types::{
    delta_rule_conv_refusal, rotation_scale, GateRotation, GatedNormRotation, QkL2,
    QkNormRopeShape, QK_NORM_ROPE_MAX_HEAD,
};
pub use types::{DeltaRuleInputs, DeltaRuleShape, PnPrecision, WeightType};

/// Tokens per chunk of the chunked delta-rule kernel (`PN_GDN_C` in
/// `kernels/delta_rule_chunked.cuh`): inputs shorter than this gain nothing from it.
pub const DELTA_RULE_CHUNK: usize = 32;

/// Opens a device for the tests and benchmarks, or says why not (no kernels, no driver, no device).
#[cfg(feature = "cuda")]
pub fn gpu_or_reason(ordinal: usize) -> Result<Gpu, String> {
    Gpu::new(ordinal).map_err(|e| e.to_string())
}

/// Without the `cuda` feature no device can be opened.
#[cfg(not(feature = "cuda"))]
pub fn gpu_or_reason(_ordinal: usize) -> Result<(), String> {
    Err(KernelError::FeatureDisabled.to_string())
}
