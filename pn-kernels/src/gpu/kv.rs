//! KV cache element types and layouts, and the K/V row store (`kernels/attention.cu`:
//! `kv_store_f16`, `kv_store_f32`, `kv_store_q8_0`, `kv_store_q4_0`; the row formats are in
//! `kernels/kv_blocks.cuh`).

use super::{drv, Gpu};
use crate::error::{check, KernelError};
use cudarc::driver::{CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

/// One byte of a Q8_0 KV cache: each row of 256 values is 8 ggml Q8_0 blocks (272 bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(transparent)]
pub struct Q8KvByte(pub u8);
// SAFETY: a plain byte, no padding, no invalid bit patterns, zero is a valid value.
unsafe impl cudarc::driver::DeviceRepr for Q8KvByte {}
// SAFETY: as above.
unsafe impl cudarc::driver::ValidAsZeroBits for Q8KvByte {}

/// One byte of a Q4_0 KV cache: each row of 256 values is 8 ggml Q4_0 blocks (144 bytes),
/// quantized bit for bit as the CPU backend's q4_0 KV cache (`kernels/kv_blocks.cuh`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(transparent)]
pub struct Q4KvByte(pub u8);
// SAFETY: a plain byte, no padding, no invalid bit patterns, zero is a valid value.
unsafe impl cudarc::driver::DeviceRepr for Q4KvByte {}
// SAFETY: as above.
unsafe impl cudarc::driver::ValidAsZeroBits for Q4KvByte {}

/// Element type of a KV cache: `half::f16` (half the memory of f32), `f32`, [`Q8KvByte`]
/// (q8_0 rows: about a quarter of f32) or [`Q4KvByte`] (q4_0 rows: about an eighth).
pub trait KvElem: cudarc::driver::DeviceRepr + private::Sealed {
    /// Kernel that appends K/V rows to a cache of this type.
    const STORE_KERNEL: &'static str;
    /// Split-K attention kernel over a cache of this type.
    const PARTIAL_KERNEL: &'static str;
    /// Tiled prefill attention kernel (`attention_prefill.cu`) over a cache of this type.
    const PREFILL_KERNEL: &'static str;
    /// Elements of one 256-value row.
    const ROW_ELEMS: usize;
    /// Alignment (in elements) every row start needs.
    const ALIGN_ELEMS: usize;
}
impl KvElem for half::f16 {
    const STORE_KERNEL: &'static str = "kv_store_f16";
    const PARTIAL_KERNEL: &'static str = "attn_partial_f16kv";
    const PREFILL_KERNEL: &'static str = "attn_prefill_f16kv";
    const ROW_ELEMS: usize = 256;
    const ALIGN_ELEMS: usize = 8;
}
impl KvElem for f32 {
    const STORE_KERNEL: &'static str = "kv_store_f32";
    const PARTIAL_KERNEL: &'static str = "attn_partial_f32kv";
    const PREFILL_KERNEL: &'static str = "attn_prefill_f32kv";
    const ROW_ELEMS: usize = 256;
    const ALIGN_ELEMS: usize = 4;
}
impl KvElem for Q8KvByte {
    const STORE_KERNEL: &'static str = "kv_store_q8_0";
    const PARTIAL_KERNEL: &'static str = "attn_partial_q8_0kv";
    const PREFILL_KERNEL: &'static str = "attn_prefill_q8_0kv";
    const ROW_ELEMS: usize = 272;
    const ALIGN_ELEMS: usize = 2;
}
impl KvElem for Q4KvByte {
    const STORE_KERNEL: &'static str = "kv_store_q4_0";
    const PARTIAL_KERNEL: &'static str = "attn_partial_q4_0kv";
    const PREFILL_KERNEL: &'static str = "attn_prefill_q4_0kv";
    const ROW_ELEMS: usize = 144;
    const ALIGN_ELEMS: usize = 2;
}
mod private {
    pub trait Sealed {}
    impl Sealed for super::Q4KvByte {}
    impl Sealed for half::f16 {}
    impl Sealed for f32 {}
    impl Sealed for super::Q8KvByte {}
}

/// Where a KV cache keeps kv head `g` at position `j`: its row (256 values, `row_elems` cache
/// elements) starts at element `j*pos_stride + g*head_stride`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    /// KV heads.
    pub n_kv: usize,
    /// Positions the cache holds.
    pub cap: usize,
    /// Elements between positions.
    pub pos_stride: usize,
    /// Elements between kv heads.
    pub head_stride: usize,
    /// Elements of one row ([`KvElem::ROW_ELEMS`] of the cache type).
    pub row_elems: usize,
}

impl KvLayout {
    /// `[n_kv][cap][row]`: each head's positions contiguous.
    pub fn head_major<T: KvElem>(n_kv: usize, cap: usize) -> KvLayout {
        let row = T::ROW_ELEMS;
        KvLayout {
            n_kv,
            cap,
            pos_stride: row,
            head_stride: cap * row,
            row_elems: row,
        }
    }
    /// `[cap][n_kv][row]`: one row per token (the CPU backend's cache layout).
    pub fn token_major<T: KvElem>(n_kv: usize, cap: usize) -> KvLayout {
        let row = T::ROW_ELEMS;
        KvLayout {
            n_kv,
            cap,
            pos_stride: n_kv * row,
            head_stride: row,
            row_elems: row,
        }
    }
    /// Elements each cache buffer needs.
    pub fn min_len(&self) -> usize {
        (self.cap.max(1) - 1) * self.pos_stride
            + (self.n_kv.max(1) - 1) * self.head_stride
            + self.row_elems
    }
}

/// Which tokens [`Gpu::kv_store`] writes: `t_len` tokens read from K/V rows `tok_stride`
/// floats apart, stored at cache positions `p0..p0 + t_len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvStoreRows {
    /// Floats between tokens of the f32 K and V inputs (each token holds `n_kv` rows of 256).
    pub tok_stride: usize,
    /// Cache position of the first token.
    pub p0: usize,
    /// Tokens to store (at least 1).
    pub t_len: usize,
}

impl Gpu {
    /// Fails unless both caches hold every row of `kv` and start aligned for `T`'s rows.
    pub(super) fn check_cache<T: KvElem>(
        &self,
        op: &'static str,
        kc: &CudaView<'_, T>,
        vc: &CudaView<'_, T>,
        kv: &KvLayout,
    ) -> Result<(), KernelError> {
        let align = T::ALIGN_ELEMS;
        check(
            kv.n_kv > 0
                && kv.cap > 0
                && kv.row_elems == T::ROW_ELEMS
                && kv.pos_stride.is_multiple_of(align)
                && kv.head_stride.is_multiple_of(align),
            op,
            || {
                format!(
                    "cache layout {kv:?}: rows of {} elements, strides multiples of {align}",
                    T::ROW_ELEMS
                )
            },
        )?;
        check(
            kc.len() >= kv.min_len() && vc.len() >= kv.min_len(),
            op,
            || {
                format!(
                    "caches have {}/{} elements, layout {kv:?} needs {}",
                    kc.len(),
                    vc.len(),
                    kv.min_len()
                )
            },
        )?;
        let bytes = (align * std::mem::size_of::<T>()) as u64;
        self.check_align(op, "k cache", kc, bytes)?;
        self.check_align(op, "v cache", vc, bytes)
    }

    /// Stores `rows.t_len` tokens of K and V (f32, `kv.n_kv` heads of 256 per token at
    /// `rows.tok_stride`) into the caches `kc`/`vc` (laid out as `kv`) at positions
    /// `rows.p0..rows.p0 + rows.t_len`.
    pub fn kv_store<T: KvElem>(
        &self,
        k: &CudaView<'_, f32>,
        v: &CudaView<'_, f32>,
        kc: &mut CudaViewMut<'_, T>,
        vc: &mut CudaViewMut<'_, T>,
        kv: KvLayout,
        rows: KvStoreRows,
    ) -> Result<(), KernelError> {
        self.check_cache("kv_store", &kc.as_view(), &vc.as_view(), &kv)?;
        self.kv_store_launch(k, kc, Some((v, vc)), kv, rows)
    }

    /// [`Gpu::kv_store`] into one cache: the rows of `x` into `cache` (the same kernel with no
    /// V, so nothing else is written).
    pub fn kv_store_one<T: KvElem>(
        &self,
        x: &CudaView<'_, f32>,
        cache: &mut CudaViewMut<'_, T>,
        kv: KvLayout,
        rows: KvStoreRows,
    ) -> Result<(), KernelError> {
        let c = cache.as_view();
        self.check_cache("kv_store", &c, &c, &kv)?;
        self.kv_store_launch(x, cache, None, kv, rows)
    }

    /// The store kernel over checked caches: K into `kc`, V into `vc` when given.
    fn kv_store_launch<T: KvElem>(
        &self,
        k: &CudaView<'_, f32>,
        kc: &mut CudaViewMut<'_, T>,
        v: Option<(&CudaView<'_, f32>, &mut CudaViewMut<'_, T>)>,
        kv: KvLayout,
        rows: KvStoreRows,
    ) -> Result<(), KernelError> {
        const OP: &str = "kv_store";
        let KvStoreRows {
            tok_stride,
            p0,
            t_len,
        } = rows;
        check(p0 + t_len <= kv.cap && t_len > 0, OP, || {
            format!(
                "positions {p0}..{} exceed the cache capacity {}",
                p0 + t_len,
                kv.cap
            )
        })?;
        check(p0 + t_len <= i32::MAX as usize, OP, || {
            format!("position {} past the kernels' 32-bit positions", p0 + t_len)
        })?;
        let need = (t_len - 1) * tok_stride + kv.n_kv * 256;
        let v_len = v.as_ref().map_or(need, |(v, _)| v.len());
        check(k.len() >= need && v_len >= need, OP, || {
            format!("k/v have {}/{v_len} elements, need {need}", k.len())
        })?;
        let f = self.func("attention", T::STORE_KERNEL)?;
        let (ts, ps, hs, p0_i) = (
            tok_stride as i64,
            kv.pos_stride as i64,
            kv.head_stride as i64,
            p0 as i32,
        );
        let null: u64 = 0;
        let mut b = self.stream.launch_builder(f);
        b.arg(k);
        match &v {
            Some((v, _)) => b.arg(*v),
            None => b.arg(&null),
        };
        b.arg(&ts).arg(kc);
        match v {
            Some((_, vc)) => b.arg(vc),
            None => b.arg(&null),
        };
        let nt = t_len as i32;
        b.arg(&ps).arg(&hs).arg(&p0_i).arg(&nt);
        let cfg = LaunchConfig {
            // Grid y strides over the tokens (any count; 65535 blocks at most).
            grid_dim: (kv.n_kv as u32, crate::launch::grid_y_blocks(t_len), 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: arguments as declared (v, vc both null or both checked views); lengths
        // checked by the callers (caches) and above (inputs).
        unsafe { b.launch(cfg) }.map_err(drv(T::STORE_KERNEL))?;
        Ok(())
    }
}
