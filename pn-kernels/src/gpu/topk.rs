//! Device argmax / top-k over a logits row (`kernels/topk.cu`), so that decoding downloads k
//! (id, logit) pairs instead of the row.

use super::{drv, Gpu};
use crate::error::{check, KernelError};
use crate::launch::{top_k_scratch_len, TOP_K_MAX, TOP_K_SLICE};
use cudarc::driver::{CudaView, CudaViewMut, PushKernelArg};

impl Gpu {
    /// The `k` best of `x[0..n)` in the CPU sampler's order (finite values only, higher first,
    /// equal values to the lower index) into `vals[0..k)` / `ids[0..k)`, best first; slots past
    /// the number of finite values get id -1 and -inf. `vals` and `ids` hold at least
    /// [`top_k_scratch_len`]`(n, k)` entries (the rest is the kernels' candidate scratch).
    /// `k` is 1 (argmax) to [`TOP_K_MAX`].
    pub fn top_k(
        &self,
        x: &CudaView<'_, f32>,
        n: usize,
        k: usize,
        vals: &mut CudaViewMut<'_, f32>,
        ids: &mut CudaViewMut<'_, i32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "top_k";
        check((1..=TOP_K_MAX).contains(&k), OP, || {
            format!("k = {k} (1 to {TOP_K_MAX})")
        })?;
        check(n > 0 && n <= i32::MAX as usize && x.len() >= n, OP, || {
            format!("{n} values of a {}-value row", x.len())
        })?;
        let need = top_k_scratch_len(n, k);
        check(vals.len() >= need && ids.len() >= need, OP, || {
            format!(
                "scratch {} / {} entries, needs {need}",
                vals.len(),
                ids.len()
            )
        })?;
        let blocks = n.div_ceil(TOP_K_SLICE);
        let (mut out_v, mut cand_v) = vals.split_at_mut(k);
        let (mut out_i, mut cand_i) = ids.split_at_mut(k);
        let (n_i, k_i, m_i) = (n as i32, k as i32, (blocks * k) as i32);
        let f = self.func("topk", "topk_partial_f32")?;
        let mut b = self.stream.launch_builder(f);
        b.arg(x)
            .arg(&n_i)
            .arg(&k_i)
            .arg(&mut cand_v)
            .arg(&mut cand_i);
        // SAFETY: (x, n, k, cand_v, cand_i) as declared; x holds n values, the candidates
        // blocks * k entries (checked above).
        unsafe { b.launch(Self::cfg((blocks as u32, 1, 1), 256, 0)) }
            .map_err(drv("topk_partial_f32"))?;
        let f = self.func("topk", "topk_merge_f32")?;
        let mut b = self.stream.launch_builder(f);
        b.arg(&mut cand_v)
            .arg(&mut cand_i)
            .arg(&m_i)
            .arg(&k_i)
            .arg(&mut out_v)
            .arg(&mut out_i);
        // SAFETY: reads the blocks * k candidates written above on the same stream, writes k.
        unsafe { b.launch(Self::cfg((1, 1, 1), 256, 0)) }.map_err(drv("topk_merge_f32"))?;
        Ok(())
    }
}
