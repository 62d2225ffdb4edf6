//! Downloads of logits rows and other large results through one page-locked host buffer:
//! a device-to-host copy into pageable memory goes through the driver's own staging in
//! pieces, into page-locked memory it is one DMA at the bus rate. The buffer is allocated
//! once per backend, at the size of the largest download so far (a logits row, or a
//! verification's rows), and reused by every later call.

use super::{lock, view, CudaBackend, CudaBuf, CudaError};
use pn_kernels::cudarc::driver::PinnedHostSlice;

/// Downloads of fewer floats than this go straight into the caller's memory (a pinned
/// round trip would only add a host copy to a transfer that is all latency).
pub(super) const PINNED_MIN_FLOATS: usize = 16 * 1024;

/// The page-locked staging buffer: `[len]` floats, grown on demand, never shrunk.
pub(super) type Pinned = Option<PinnedHostSlice<f32>>;

impl CudaBackend {
    /// `dst.len()` floats of `src[offset..]` through the pinned buffer (after every enqueued
    /// op), then copied into `dst`.
    pub(super) fn try_download_pinned(
        &self,
        src: &CudaBuf,
        offset: usize,
        dst: &mut [f32],
    ) -> Result<(), CudaError> {
        let n = dst.len();
        let v = view("download", src, offset, n)?;
        let mut guard = lock(&self.pinned);
        if guard.as_ref().is_none_or(|p| p.len() < n) {
            *guard = None;
            // SAFETY: the memory is uninitialised until the copy below writes `..n` of it,
            // and only `..n` is read after that copy. Flags 0: cached page-locked memory
            // (the default write-combined memory is slow for the host to read).
            let p = unsafe { self.gpu.context().alloc_pinned_with_flags::<f32>(n, 0) }
                .map_err(|e| CudaError::driver("pinned logits buffer", e))?;
            *guard = Some(p);
        }
        let pinned = guard
            .as_mut()
            .ok_or_else(|| CudaError::driver("pinned logits buffer", "no buffer"))?;
        self.gpu
            .stream()
            .memcpy_dtoh(&v, pinned)
            .map_err(|e| CudaError::driver("download", e))?;
        self.synchronize()?;
        let host = pinned
            .as_slice()
            .map_err(|e| CudaError::driver("download", e))?;
        dst.copy_from_slice(&host[..n]);
        Ok(())
    }
}
