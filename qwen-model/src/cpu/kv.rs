//! The CPU KV cache: f32, f16 or q8_0/q4_0 blocks, allocated zeroed on demand.

use super::kvquant::{self, BlockQ4_0, BlockQ8_0};
use crate::backend::KvCacheType;
use crate::error::ModelError;

/// A KV cache on the CPU.
pub enum CpuKv {
    /// f32 elements.
    F32(Vec<f32>),
    /// f16 elements.
    F16(Vec<half::f16>),
    /// q8_0 blocks of 32 values.
    Q8_0(Vec<BlockQ8_0>),
    /// q4_0 blocks of 32 values.
    Q4_0(Vec<BlockQ4_0>),
}

impl CpuKv {
    /// A zero-filled cache of `len` values of type `ty` (`len` a whole number of its blocks).
    pub(super) fn zeroed(len: usize, ty: KvCacheType) -> Result<CpuKv, ModelError> {
        let blocks = |t: KvCacheType| {
            if !len.is_multiple_of(t.block_len()) {
                Err(ModelError::BadArgument(format!(
                    "{t} KV cache of {len} values is not a whole number of {}-value blocks",
                    t.block_len()
                )))
            } else {
                Ok(len / t.block_len())
            }
        };
        Ok(match ty {
            KvCacheType::F32 => CpuKv::F32(zeroed_vec(len)?),
            KvCacheType::F16 => CpuKv::F16(zeroed_vec(len)?),
            KvCacheType::Q8_0 => CpuKv::Q8_0(zeroed_vec(blocks(ty)?)?),
            KvCacheType::Q4_0 => CpuKv::Q4_0(zeroed_vec(blocks(ty)?)?),
        })
    }

    /// Writes `src` into the cache at value `dst_off` (converting or quantizing).
    pub(super) fn write(&mut self, src: &[f32], dst_off: usize) {
        use half::slice::HalfFloatSliceExt;
        const QK: usize = kvquant::QK;
        let len = src.len();
        match self {
            CpuKv::F32(d) => d[dst_off..dst_off + len].copy_from_slice(src),
            CpuKv::F16(d) => d[dst_off..dst_off + len].convert_from_f32_slice(src),
            // The graph writes whole rows of `kv_dim` values, a multiple of the head dim, which
            // `State::with_kv_types` checked is whole blocks.
            CpuKv::Q8_0(d) => {
                kvquant::quantize_into(src, &mut d[dst_off / QK..(dst_off + len) / QK])
            }
            CpuKv::Q4_0(d) => {
                kvquant::quantize_into(src, &mut d[dst_off / QK..(dst_off + len) / QK])
            }
        }
    }

    /// Storage type.
    pub fn kv_type(&self) -> KvCacheType {
        match self {
            CpuKv::F32(_) => KvCacheType::F32,
            CpuKv::F16(_) => KvCacheType::F16,
            CpuKv::Q8_0(_) => KvCacheType::Q8_0,
            CpuKv::Q4_0(_) => KvCacheType::Q4_0,
        }
    }

    /// Bytes the cache occupies.
    pub fn bytes(&self) -> usize {
        match self {
            CpuKv::F32(v) => std::mem::size_of_val(v.as_slice()),
            CpuKv::F16(v) => std::mem::size_of_val(v.as_slice()),
            CpuKv::Q8_0(v) => std::mem::size_of_val(v.as_slice()),
            CpuKv::Q4_0(v) => std::mem::size_of_val(v.as_slice()),
        }
    }
}

/// `len` zeroed elements straight from the allocator (calloc): a large KV cache costs no memory
/// until positions are written, and a failed allocation is an error, not an abort.
pub(super) fn zeroed_vec<T: bytemuck::Zeroable>(len: usize) -> Result<Vec<T>, ModelError> {
    if len == 0 || std::mem::size_of::<T>() == 0 {
        return Ok(Vec::new());
    }
    let layout = std::alloc::Layout::array::<T>(len)
        .map_err(|e| ModelError::Backend(format!("allocating {len} elements: {e}")))?;
    // SAFETY: the layout has non-zero size; on success the block holds `len` zeroed `T`s (valid
    // by `Zeroable`) allocated by the global allocator with exactly this layout, as
    // `Vec::from_raw_parts` requires.
    unsafe {
        let p = std::alloc::alloc_zeroed(layout) as *mut T;
        if p.is_null() {
            return Err(ModelError::Backend(format!(
                "out of memory allocating {len} elements"
            )));
        }
        Ok(Vec::from_raw_parts(p, len, len))
    }
}
