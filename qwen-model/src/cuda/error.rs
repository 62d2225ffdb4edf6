//! Errors of the CUDA backend.

use pn_kernels::KernelError;

/// Why the CUDA backend could not start, plan its memory or run an op.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// The binary was built without CUDA kernels (no CUDA compiler at build time).
    #[error(
        "{info}; rebuild with the CUDA toolchain (`eval \"$(bash scripts/cuda-toolchain.sh)\"` \
         then `cargo build --release`) or run on the CPU"
    )]
    NoKernels {
        /// `pn_kernels::build_info()`.
        info: &'static str,
    },
    /// libcuda could not be loaded.
    #[error(
        "the NVIDIA driver library (libcuda.so.1) is not present: install the NVIDIA driver \
         (R525 or newer for the sm_60 cubin) or run on the CPU"
    )]
    NoDriver,
    /// No device with that ordinal.
    #[error("no CUDA device with ordinal {ordinal} ({count} present); pick another device or run on the CPU")]
    NoDevice {
        /// Requested ordinal.
        ordinal: usize,
        /// Devices present.
        count: i32,
    },
    /// A launch wrapper or driver call failed.
    #[error("CUDA backend: {0}")]
    Kernel(#[from] KernelError),
    /// A device allocation or copy failed.
    #[error("CUDA {op}: {msg}")]
    Driver {
        /// What was being done.
        op: String,
        /// The driver's message.
        msg: String,
    },
    /// A weight type with no device kernel for the op it is used in.
    #[error("tensor `{tensor}`: no CUDA kernel for {op} on type {ty}")]
    MissingKernel {
        /// Tensor name.
        tensor: String,
        /// The op (`matrix-vector`, `embedding gather`, ...).
        op: &'static str,
        /// The storage type.
        ty: String,
    },
    /// A shape the kernels do not support (head dim, conv kernel, delta-rule head dims...).
    #[error("CUDA {op}: unsupported shape: {what}")]
    Unsupported {
        /// The op.
        op: &'static str,
        /// What is not supported, with the numbers.
        what: String,
    },
    /// A buffer offset or length outside the buffer.
    #[error("CUDA {op}: range {start}..{end} outside a buffer of {len} elements")]
    OutOfRange {
        /// The op.
        op: &'static str,
        /// Range start.
        start: usize,
        /// Range end.
        end: usize,
        /// Buffer length.
        len: usize,
    },
    /// The planned memory does not fit the device.
    #[error("{0}")]
    OutOfMemory(String),
}

impl From<CudaError> for crate::ModelError {
    fn from(e: CudaError) -> Self {
        crate::ModelError::Backend(e.to_string())
    }
}

impl CudaError {
    pub(crate) fn from_kernel_open(e: KernelError) -> CudaError {
        match e {
            KernelError::NoKernels(_) => CudaError::NoKernels {
                info: pn_kernels::build_info(),
            },
            KernelError::NoDriver => CudaError::NoDriver,
            KernelError::NoDevice { ordinal, count } => CudaError::NoDevice { ordinal, count },
            other => CudaError::Kernel(other),
        }
    }

    pub(crate) fn driver(op: impl Into<String>, e: impl std::fmt::Display) -> CudaError {
        CudaError::Driver {
            op: op.into(),
            msg: e.to_string(),
        }
    }
}
