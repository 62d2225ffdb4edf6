//! Tiled prefill attention (`kernels/attention_prefill.cu`: `attn_prefill_*kv` per cache type).

use super::attention::AttnArgs;
use super::{drv, AttnShape, Gpu, KvElem};
use crate::error::KernelError;
use cudarc::driver::{CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

impl Gpu {
    /// Query tokens per block of [`Gpu::attention_prefill`] (`AP_BQ` in attention_prefill.cu).
    pub const ATTN_PREFILL_TILE: usize = 16;

    /// [`Gpu::attention`]'s result (without the split-K) by the tiled prefill kernel: one
    /// block per 16 query tokens and query head walks the causal prefix in K/V tiles staged in
    /// shared memory, so the cache is read once per 16 tokens instead of once per token. Meant
    /// for prefill chunks (`t_len` of 16 or more); any `t_len >= 1` is correct.
    pub fn attention_prefill<T: KvElem>(
        &self,
        s: &AttnShape,
        q: &CudaView<'_, f32>,
        kc: &CudaView<'_, T>,
        vc: &CudaView<'_, T>,
        o: &mut CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "attention_prefill";
        self.check_attention(OP, s, q.len(), kc, vc, o.len())?;
        let (n_head, t_len) = (s.n_head, s.t_len);
        let f = self.func("attention_prefill", T::PREFILL_KERNEL)?;
        let a = AttnArgs::new(s);
        let (t_i, ots) = (t_len as i32, s.o_tok_stride as i64);
        let mut b = self.stream.launch_builder(f);
        a.push(&mut b, q, kc, vc);
        b.arg(&t_i).arg(&s.scale).arg(o).arg(&ots);
        let cfg = LaunchConfig {
            grid_dim: (
                t_len.div_ceil(Self::ATTN_PREFILL_TILE) as u32,
                n_head as u32,
                1,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: arguments as declared in attention_prefill.cu (the f16 kernel takes the cache
        // as u16 bits, the same pointer); lengths and alignment checked above.
        unsafe { b.launch(cfg) }.map_err(drv(T::PREFILL_KERNEL))?;
        Ok(())
    }
}
