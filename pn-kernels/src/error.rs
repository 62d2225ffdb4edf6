//! Errors of the launch wrappers.

/// Why a kernel could not be launched.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// The build embedded no kernels (no CUDA compiler at build time).
    #[error("this build has no CUDA kernels: {0}")]
    NoKernels(&'static str),
    /// libcuda (the driver library) could not be loaded.
    #[error("the CUDA driver library (libcuda) is not present on this machine")]
    NoDriver,
    /// The requested device ordinal does not exist.
    #[error("no CUDA device with ordinal {ordinal} ({count} present)")]
    NoDevice {
        /// Requested ordinal.
        ordinal: usize,
        /// Devices present.
        count: i32,
    },
    /// The crate was built without the `cuda` feature.
    #[error("pn-kernels was built without the `cuda` feature")]
    FeatureDisabled,
    /// An embedded module lacks a kernel the wrappers expect (a build inconsistency).
    #[error("kernel `{kernel}` is not in the embedded module `{module}`")]
    MissingKernel {
        /// Module (file stem).
        module: &'static str,
        /// Entry point.
        kernel: &'static str,
    },
    /// Arguments that do not fit the operation (lengths, block multiples, limits).
    #[error("{op}: {what}")]
    Shape {
        /// Operation, e.g. `pn_gemv`.
        op: &'static str,
        /// What is wrong, with the numbers.
        what: String,
    },
    /// A CUDA driver call failed.
    #[error("CUDA driver error in {op}: {msg}")]
    Driver {
        /// Operation or driver call.
        op: &'static str,
        /// The driver's message.
        msg: String,
    },
}

/// `Err(KernelError::Shape)` unless `cond`.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn check(
    cond: bool,
    op: &'static str,
    what: impl FnOnce() -> String,
) -> Result<(), KernelError> {
    if cond {
        Ok(())
    } else {
        Err(KernelError::Shape { op, what: what() })
    }
}
