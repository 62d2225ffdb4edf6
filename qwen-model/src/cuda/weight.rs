//! Weight matrices resident on the device in their stored format.

use super::error::CudaError;
use gguf_io::GgmlType;
use pn_kernels::cudarc::driver::CudaSlice;
use pn_kernels::WeightType;

/// The kernel family's name for a stored type, or `None` when no kernel reads it.
pub fn device_type(ty: GgmlType) -> Option<WeightType> {
    Some(match ty {
        GgmlType::F32 => WeightType::F32,
        GgmlType::F16 => WeightType::F16,
        GgmlType::Q8_0 => WeightType::Q8_0,
        GgmlType::Q4K => WeightType::Q4K,
        GgmlType::Q3K => WeightType::Q3K,
        GgmlType::Pn3t => WeightType::Pn3t,
        GgmlType::Pn4t => WeightType::Pn4t,
        _ => return None,
    })
}

/// A weight matrix on the device: the file's bytes, one allocation (256-byte aligned by the
/// driver, so every row-type alignment the kernels check holds).
pub struct CudaWeight {
    pub(crate) bytes: CudaSlice<u8>,
    pub(crate) ty: WeightType,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) rotation_block: Option<usize>,
    pub(crate) name: String,
}

impl CudaWeight {
    /// Tensor name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Storage type.
    pub fn weight_type(&self) -> WeightType {
        self.ty
    }
    /// Output rows.
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Reduction length K.
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// Bytes on the device.
    pub fn device_bytes(&self) -> usize {
        self.bytes.len()
    }

    pub(crate) fn missing(&self, op: &'static str) -> CudaError {
        CudaError::MissingKernel {
            tensor: self.name.clone(),
            op,
            ty: self.ty.name().into(),
        }
    }
}
