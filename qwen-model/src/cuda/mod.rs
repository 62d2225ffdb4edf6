//! The CUDA backend: qwen-model's [`Backend`] on one device, over the `pn-kernels` launch
//! wrappers.
//!
//! Weights are uploaded once in their stored format; activations, KV caches and recurrent state
//! stay on the device; every op is enqueued on the device's one stream and nothing waits for the
//! device except [`Backend::download`]. Every op returns its own failure (a refused shape, a
//! launch or copy error) as a `Result`; the shapes and KV cache types the kernels take are
//! declared up front by [`Backend::supports`], so a model they cannot run fails at load.
//!
//! Entry point: [`CudaBackend::new`] (device ordinal), then [`CudaBackend::check_fits`] with a
//! [`MemoryPlan`] before `Model::from_file`.
//!
//! Layout: this module (the backend, its scratch, activation buffers and copies); `kv.rs` (the
//! KV cache types and their one element-type dispatch, cache writes); `weight.rs` (weights,
//! embedding, matrix products; `quant_group.rs`: Q8_0 matrices of one input in one launch);
//! `attention.rs`; `gdn.rs` (conv1d, delta rule, and both in one launch); `mixer_proj.rs` (the
//! mixers' output projections fed by their producers' fp16 copy); `norms.rs`
//! (norms, rotations, RoPE); `elementwise.rs`; `topk.rs` (the device top-k of a logits row); `caps.rs` (what the kernels can run);
//! `backend.rs` (the [`Backend`] impl, a thin adapter over the above); `memory.rs` (the plan).

mod attention;
mod backend;
mod caps;
mod elementwise;
mod error;
mod fused;
mod gdn;
mod kv;
mod launches;
mod memory;
mod mixer;
mod mixer_proj;
mod norms;
mod pinned;
mod quant_group;
mod topk;
mod weight;

pub use error::CudaError;
pub use kv::CudaKv;
pub use launches::{CountBuf, CountWeight, LaunchCounter};
pub use memory::{MemoryPlan, ATTN_SCRATCH_FLOATS, RESERVE_BYTES};
pub use weight::{device_type, CudaWeight};

use half::f16;
use pn_kernels::cudarc::driver::{CudaSlice, CudaView, CudaViewMut, DeviceRepr, ValidAsZeroBits};
use pn_kernels::Gpu;
use std::sync::{Mutex, MutexGuard};

#[cfg(doc)]
use crate::Backend;

/// The head dim the attention and KV kernels are written for.
const HEAD_DIM: usize = 256;
/// The GDN key/value head dim of the delta-rule kernel.
const GDN_HEAD_DIM: usize = 128;

/// Whether a GDN call of `n_tokens` takes the chunked delta-rule kernel: prefill-length inputs
/// (a full chunk or more) do, decode and short inputs keep the token-by-token kernel, and
/// `PN_GDN_CHUNKED=0` forces the token-by-token kernel everywhere (A/B runs).
fn gdn_chunked(n_tokens: usize) -> bool {
    n_tokens >= pn_kernels::DELTA_RULE_CHUNK
        && !matches!(std::env::var("PN_GDN_CHUNKED").as_deref(), Ok("0"))
}
/// Whether an attention call of `n_tokens` query tokens takes the tiled prefill kernel (K/V
/// read once per 16-token query tile instead of once per token): prefill-length inputs (a full
/// tile or more) do, decode and short inputs keep the split-K kernels, and
/// `PN_ATTN_PREFILL_TILED=0` forces the split-K kernels everywhere (A/B runs).
fn attn_tiled(n_tokens: usize) -> bool {
    n_tokens >= Gpu::ATTN_PREFILL_TILE
        && !matches!(std::env::var("PN_ATTN_PREFILL_TILED").as_deref(), Ok("0"))
}
/// The conv kernel length of the conv1d kernel.
const CONV_KERNEL: usize = 4;
/// The sync scratch: 2 words per output row of the mixer kernels that write their fp16 copy
/// (at most 8 rows: words 0..16), then one counter per key head of the fused conv + delta rule
/// (words [`CONV_SYNC0`]..).
const SYNC_WORDS: usize = 256;
/// First sync word of the conv + delta rule's key-head counters.
const CONV_SYNC0: usize = 64;
/// Longest K of the half2 PN kernels (the padded fp16 activation and a weight tile live in 48 KB
/// of shared memory): the kernels' own limit.
const PN_H2_MAX_K: usize = pn_kernels::launch::PN_H2_MAX_K;

/// An f32 activation buffer on the device.
pub struct CudaBuf {
    data: CudaSlice<f32>,
    len: usize,
}

impl CudaBuf {
    /// Floats in the buffer.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the buffer holds no floats.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Device scratch reused across calls; grows on demand (bounded, see [`MemoryPlan`]).
struct Scratch {
    f32s: Option<CudaSlice<f32>>,
    attn: Option<CudaSlice<f32>>,
    xh: Option<CudaSlice<f16>>,
    e: Option<CudaSlice<i32>>,
    ids: Option<CudaSlice<i32>>,
    /// The device top-k's results and candidates (`launch::top_k_scratch_len` each).
    topk_v: Option<CudaSlice<f32>>,
    topk_i: Option<CudaSlice<i32>>,
    /// Zeroed words the kernels that hand work between blocks count on (`rowsync.cuh`; left
    /// zeroed by every launch), [`SYNC_WORDS`].
    sync: Option<CudaSlice<u32>>,
}

/// qwen-model's `Backend` on one CUDA device.
pub struct CudaBackend {
    gpu: Gpu,
    ordinal: usize,
    scratch: Mutex<Scratch>,
    /// Page-locked staging of large downloads (`pinned.rs`), its own lock (a download may
    /// come while the scratch is held elsewhere).
    pinned: Mutex<pinned::Pinned>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn range_err(op: &'static str, start: usize, len: usize, buf: usize) -> CudaError {
    CudaError::OutOfRange {
        op,
        start,
        end: start.saturating_add(len),
        len: buf,
    }
}

/// `b[off..off + len]` as a view, or an error naming the op.
fn view<'a>(
    op: &'static str,
    b: &'a CudaBuf,
    off: usize,
    len: usize,
) -> Result<CudaView<'a, f32>, CudaError> {
    if off.checked_add(len).is_none_or(|e| e > b.len) {
        return Err(range_err(op, off, len, b.len));
    }
    b.data
        .try_slice(off..off + len)
        .ok_or_else(|| range_err(op, off, len, b.len))
}

fn view_mut<'a>(
    op: &'static str,
    b: &'a mut CudaBuf,
    off: usize,
    len: usize,
) -> Result<CudaViewMut<'a, f32>, CudaError> {
    let n = b.len;
    if off.checked_add(len).is_none_or(|e| e > n) {
        return Err(range_err(op, off, len, n));
    }
    b.data
        .try_slice_mut(off..off + len)
        .ok_or_else(|| range_err(op, off, len, n))
}

impl CudaBackend {
    /// Opens device `ordinal` and loads the embedded kernels.
    ///
    /// Errors, each with a message saying what to do: [`CudaError::NoKernels`] (a build without
    /// a CUDA compiler), [`CudaError::NoDriver`], [`CudaError::NoDevice`], or a driver error while
    /// loading the kernels (e.g. a driver too old to JIT the PTX on a non-sm_6x GPU).
    pub fn new(ordinal: usize) -> Result<CudaBackend, CudaError> {
        if !pn_kernels::kernels_available() {
            return Err(CudaError::NoKernels {
                info: pn_kernels::build_info(),
            });
        }
        let gpu = Gpu::new(ordinal).map_err(CudaError::from_kernel_open)?;
        Ok(CudaBackend {
            gpu,
            ordinal,
            scratch: Mutex::new(Scratch {
                f32s: None,
                attn: None,
                xh: None,
                e: None,
                ids: None,
                topk_v: None,
                topk_i: None,
                sync: None,
            }),
            pinned: Mutex::new(None),
        })
    }

    /// Whether a CUDA backend can be opened here, or why not (for tests and `pn --version`).
    pub fn availability(ordinal: usize) -> Result<(), CudaError> {
        if !pn_kernels::kernels_available() {
            return Err(CudaError::NoKernels {
                info: pn_kernels::build_info(),
            });
        }
        if !pn_kernels::driver_present() {
            return Err(CudaError::NoDriver);
        }
        let _ = ordinal;
        Ok(())
    }

    /// The launch wrappers (for callers that run their own kernels on the same stream, e.g.
    /// on-device sampling).
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// `(free, total)` device memory in bytes.
    pub fn memory_info(&self) -> Result<(u64, u64), CudaError> {
        let (f, t) = self
            .gpu
            .context()
            .mem_get_info()
            .map_err(|e| CudaError::driver("cuMemGetInfo", e))?;
        Ok((f as u64, t as u64))
    }

    /// Checks `plan` against the free device memory; the error names every term.
    /// Also checks the plan's sizes against the kernels' launch limits
    /// ([`MemoryPlan::check_limits`]).
    pub fn check_fits(&self, plan: &MemoryPlan) -> Result<(), CudaError> {
        plan.check_limits()?;
        let (free, total) = self.memory_info()?;
        if plan.total() > free {
            let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
            return Err(CudaError::OutOfMemory(format!(
                "the model does not fit on CUDA device {}: needs {} but {:.1} MiB of {:.1} MiB \
                 are free; lower the context (KV cache), the prefill chunk (workspace), use an \
                 f16, q8_0 or q4_0 KV cache, or a smaller quantization",
                self.ordinal,
                plan.describe(),
                mib(free),
                mib(total)
            )));
        }
        Ok(())
    }

    /// Waits for every enqueued op.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.gpu
            .stream()
            .synchronize()
            .map_err(|e| CudaError::driver("cuStreamSynchronize", e))
    }

    pub(super) fn alloc_zeros<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        len: usize,
        what: &str,
    ) -> Result<CudaSlice<T>, CudaError> {
        // A zero-length allocation is not a valid driver request: keep one element.
        self.gpu
            .stream()
            .alloc_zeros::<T>(len.max(1))
            .map_err(|e| CudaError::driver(format!("allocating {what} ({len} elements)"), e))
    }

    /// Makes `slot` hold at least `len` elements.
    pub(super) fn grow<'a, T: DeviceRepr + ValidAsZeroBits>(
        &self,
        slot: &'a mut Option<CudaSlice<T>>,
        len: usize,
        what: &str,
    ) -> Result<&'a mut CudaSlice<T>, CudaError> {
        if slot.as_ref().is_none_or(|s| s.len() < len) {
            *slot = None;
            *slot = Some(self.alloc_zeros(len, what)?);
        }
        slot.as_mut()
            .ok_or_else(|| CudaError::driver(what.to_string(), "no buffer"))
    }

    pub(super) fn try_upload(
        &self,
        src: &[f32],
        dst: &mut CudaBuf,
        offset: usize,
    ) -> Result<(), CudaError> {
        let mut v = view_mut("upload", dst, offset, src.len())?;
        self.gpu
            .stream()
            .memcpy_htod(src, &mut v)
            .map_err(|e| CudaError::driver("upload", e))
    }

    pub(super) fn try_download(
        &self,
        src: &CudaBuf,
        offset: usize,
        dst: &mut [f32],
    ) -> Result<(), CudaError> {
        if dst.len() >= pinned::PINNED_MIN_FLOATS {
            return self.try_download_pinned(src, offset, dst);
        }
        let v = view("download", src, offset, dst.len())?;
        self.gpu
            .stream()
            .memcpy_dtoh(&v, dst)
            .map_err(|e| CudaError::driver("download", e))?;
        self.synchronize()
    }

    pub(super) fn try_copy(
        &self,
        src: &CudaBuf,
        src_off: usize,
        dst: &mut CudaBuf,
        dst_off: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        if len == 0 {
            return Ok(());
        }
        let s = view("copy", src, src_off, len)?;
        let mut d = view_mut("copy", dst, dst_off, len)?;
        self.gpu
            .stream()
            .memcpy_dtod(&s, &mut d)
            .map_err(|e| CudaError::driver("copy", e))
    }
}

/// The error of an op called with a shape its kernels do not take. [`crate::Backend::supports`]
/// refuses such a model at bind; this covers a direct call that bypasses the model.
fn shape_error(op: &'static str, what: String) -> CudaError {
    CudaError::Kernel(pn_kernels::KernelError::Shape { op, what })
}
