//! The device top-k of a logits row (`pn-kernels` `topk.cu`): decoding downloads `k` (id, logit)
//! pairs (one for greedy decoding) instead of the whole row (about 1 MB at the 27B vocabulary).

use super::{lock, view, CudaBackend, CudaBuf, CudaError};
use pn_kernels::launch::{top_k_scratch_len, TOP_K_MAX};

// Decoding sizes its candidate requests by the host-side constant.
const _: () = assert!(TOP_K_MAX == crate::topk::DEVICE_TOP_K_MAX);

impl CudaBackend {
    /// The `(n, k)` = `shape` best logits of `src[offset..offset + n]` into `out`, in the
    /// sampler's order (see [`crate::topk::top_k_row`]), best first; fewer than `k` when fewer
    /// are finite. `k` above [`TOP_K_MAX`] (or 0) takes the host path (the whole row).
    pub(super) fn try_top_k(
        &self,
        src: &CudaBuf,
        offset: usize,
        shape: (usize, usize),
        out: &mut Vec<(u32, f32)>,
    ) -> Result<(), CudaError> {
        let (n, k) = shape;
        out.clear();
        if k == 0 || n == 0 {
            return Ok(());
        }
        if k > TOP_K_MAX {
            let mut row = vec![0f32; n];
            self.try_download(src, offset, &mut row)?;
            *out = crate::topk::top_k_row(&row, k);
            return Ok(());
        }
        let x = view("top_k", src, offset, n)?;
        let need = top_k_scratch_len(n, k);
        let mut guard = lock(&self.scratch);
        let sc = &mut *guard;
        let vals = self.grow(&mut sc.topk_v, need, "top-k values")?;
        let ids = self.grow(&mut sc.topk_i, need, "top-k ids")?;
        self.gpu
            .top_k(&x, n, k, &mut vals.as_view_mut(), &mut ids.as_view_mut())?;
        // Only the k results come back (the candidates stay on the device).
        let (mut hv, mut hi) = (vec![0f32; k], vec![0i32; k]);
        let stream = self.gpu.stream();
        stream
            .memcpy_dtoh(&vals.slice(..k), &mut hv)
            .map_err(|e| CudaError::driver("top-k download", e))?;
        stream
            .memcpy_dtoh(&ids.slice(..k), &mut hi)
            .map_err(|e| CudaError::driver("top-k download", e))?;
        self.synchronize()?;
        out.extend(
            hi.iter()
                .zip(&hv)
                .take_while(|(i, _)| **i >= 0)
                .map(|(&i, &v)| (i as u32, v)),
        );
        Ok(())
    }
}
