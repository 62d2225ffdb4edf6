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

mod error;
mod memory;
mod weight;

pub use error::CudaError;
pub use memory::{MemoryPlan, ATTN_SCRATCH_FLOATS, RESERVE_BYTES};
pub use weight::{device_type, CudaWeight};

use crate::{
    AttnLayout, Backend, ConvShape, GateLayout, GdnArgs, GdnDims, KvCacheType, ModelError,
    Requirements, RopeLayout, Unsupported, WeightSource,
};
use half::f16;
use pn_kernels::cudarc::driver::{CudaSlice, CudaView, CudaViewMut, DeviceRepr, ValidAsZeroBits};
use pn_kernels::{Gpu, KvElem, KvLayout, PnPrecision, Q4KvByte, Q8KvByte, RowLayout, WeightType};
use std::sync::{Mutex, MutexGuard};

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
/// Longest K of the half2 PN kernels (the fp16 activation lives in 48 KB of shared memory).
const PN_H2_MAX_K: usize = 24576;
/// Positions per attention split for decode (split-K over long contexts).
const ATTN_CHUNK: usize = 256;

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

/// A KV cache buffer on the device (token-major rows of 256 values, as on the CPU); the `usize`
/// is the number of values it holds.
pub enum CudaKv {
    /// f32 elements.
    F32(CudaSlice<f32>, usize),
    /// f16 elements.
    F16(CudaSlice<f16>, usize),
    /// q8_0 blocks (34 bytes per 32 values), the CPU backend's q8_0 cache bit for bit.
    Q8_0(CudaSlice<Q8KvByte>, usize),
    /// q4_0 blocks (18 bytes per 32 values), the CPU backend's q4_0 cache bit for bit.
    Q4_0(CudaSlice<Q4KvByte>, usize),
}

impl CudaKv {
    fn len(&self) -> usize {
        match self {
            CudaKv::F32(_, n) | CudaKv::F16(_, n) | CudaKv::Q8_0(_, n) | CudaKv::Q4_0(_, n) => *n,
        }
    }

    /// Storage type.
    pub fn kv_type(&self) -> KvCacheType {
        match self {
            CudaKv::F32(..) => KvCacheType::F32,
            CudaKv::F16(..) => KvCacheType::F16,
            CudaKv::Q8_0(..) => KvCacheType::Q8_0,
            CudaKv::Q4_0(..) => KvCacheType::Q4_0,
        }
    }

    /// Device bytes the cache's values occupy.
    pub fn bytes(&self) -> usize {
        self.kv_type().bytes_for(self.len())
    }
}

/// The type-independent arguments of one attention call.
struct AttnCall<'a, 'q> {
    q: &'a CudaView<'q, f32>,
    l: &'a AttnLayout,
    cap: usize,
    pos0: usize,
    n_tokens: usize,
    chunk: usize,
}

/// Device scratch reused across calls; grows on demand (bounded, see [`MemoryPlan`]).
struct Scratch {
    f32s: Option<CudaSlice<f32>>,
    attn: Option<CudaSlice<f32>>,
    xh: Option<CudaSlice<f16>>,
    e: Option<CudaSlice<i32>>,
    ids: Option<CudaSlice<i32>>,
    kv16: Option<CudaSlice<f16>>,
    kvq8: Option<CudaSlice<Q8KvByte>>,
    kvq4: Option<CudaSlice<Q4KvByte>>,
}

/// qwen-model's `Backend` on one CUDA device.
pub struct CudaBackend {
    gpu: Gpu,
    ordinal: usize,
    scratch: Mutex<Scratch>,
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
                kv16: None,
                kvq8: None,
                kvq4: None,
            }),
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
    pub fn check_fits(&self, plan: &MemoryPlan) -> Result<(), CudaError> {
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

    fn alloc_zeros<T: DeviceRepr + ValidAsZeroBits>(
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
    fn grow<'a, T: DeviceRepr + ValidAsZeroBits>(
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

    fn try_upload(&self, src: &[f32], dst: &mut CudaBuf, offset: usize) -> Result<(), CudaError> {
        let mut v = view_mut("upload", dst, offset, src.len())?;
        self.gpu
            .stream()
            .memcpy_htod(src, &mut v)
            .map_err(|e| CudaError::driver("upload", e))
    }

    fn try_download(&self, src: &CudaBuf, offset: usize, dst: &mut [f32]) -> Result<(), CudaError> {
        let v = view("download", src, offset, dst.len())?;
        self.gpu
            .stream()
            .memcpy_dtoh(&v, dst)
            .map_err(|e| CudaError::driver("download", e))?;
        self.synchronize()
    }

    fn try_copy(
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

    fn try_kv_write(
        &self,
        src: &CudaBuf,
        dst: &mut CudaKv,
        dst_off: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        const OP: &str = "kv_write";
        if len == 0 {
            return Ok(());
        }
        let cap = dst.len();
        if dst_off.checked_add(len).is_none_or(|e| e > cap) {
            return Err(range_err(OP, dst_off, len, cap));
        }
        let s = view(OP, src, 0, len)?;
        match dst {
            CudaKv::F32(d, _) => {
                let mut d = d
                    .try_slice_mut(dst_off..dst_off + len)
                    .ok_or_else(|| range_err(OP, dst_off, len, cap))?;
                self.gpu
                    .stream()
                    .memcpy_dtod(&s, &mut d)
                    .map_err(|e| CudaError::driver(OP, e))
            }
            CudaKv::F16(d, _) => {
                let mut sc = lock(&self.scratch);
                self.kv_store_rows(&s, d, cap, &mut sc.kv16, dst_off, len, "f16")
            }
            CudaKv::Q8_0(d, _) => {
                let mut sc = lock(&self.scratch);
                self.kv_store_rows(&s, d, cap, &mut sc.kvq8, dst_off, len, "q8_0")
            }
            CudaKv::Q4_0(d, _) => {
                let mut sc = lock(&self.scratch);
                self.kv_store_rows(&s, d, cap, &mut sc.kvq4, dst_off, len, "q4_0")
            }
        }
    }

    /// Converts `len` values of `src` into `dst` (a cache of `cap` values) at value `dst_off`
    /// with the store kernel of `T`. The kernel writes rows of 256 values (one head at one
    /// position); a contiguous range of whole rows is `len / 256` one-head "positions". It
    /// stores K and V together: V goes to the scratch rows in `junk`, which nothing reads.
    #[allow(clippy::too_many_arguments)]
    fn kv_store_rows<T: KvElem + ValidAsZeroBits>(
        &self,
        src: &CudaView<'_, f32>,
        dst: &mut CudaSlice<T>,
        cap: usize,
        junk: &mut Option<CudaSlice<T>>,
        dst_off: usize,
        len: usize,
        name: &str,
    ) -> Result<(), CudaError> {
        const OP: &str = "kv_write";
        if !dst_off.is_multiple_of(HEAD_DIM) || !len.is_multiple_of(HEAD_DIM) {
            return Err(CudaError::Unsupported {
                op: OP,
                what: format!(
                    "{name} cache writes need whole rows of {HEAD_DIM} (offset {dst_off}, \
                     length {len})"
                ),
            });
        }
        let rows = len / HEAD_DIM;
        let (e0, n) = (dst_off / HEAD_DIM * T::ROW_ELEMS, rows * T::ROW_ELEMS);
        let mut d = dst
            .try_slice_mut(e0..e0 + n)
            .ok_or_else(|| range_err(OP, dst_off, len, cap))?;
        let junk = self.grow(junk, n, "KV store scratch")?;
        let mut junk = junk.slice_mut(0..n);
        let layout = KvLayout::token_major::<T>(1, rows);
        self.gpu
            .kv_store(src, src, HEAD_DIM, &mut d, &mut junk, layout, 0, rows)?;
        Ok(())
    }

    /// The stored bytes of a KV cache (little-endian f32/f16 elements, or the q8_0/q4_0 blocks,
    /// token-major as on the CPU), after every enqueued op; for tests and debugging.
    pub fn download_kv(&self, kv: &CudaKv) -> Result<Vec<u8>, CudaError> {
        const OP: &str = "download KV cache";
        let st = self.gpu.stream();
        let bytes = match kv {
            CudaKv::F32(d, _) => st
                .clone_dtoh(d)
                .map(|v| v.iter().flat_map(|x| x.to_le_bytes()).collect()),
            CudaKv::F16(d, _) => st
                .clone_dtoh(d)
                .map(|v| v.iter().flat_map(|x| x.to_le_bytes()).collect()),
            CudaKv::Q8_0(d, _) => st.clone_dtoh(d).map(|v| v.iter().map(|b| b.0).collect()),
            CudaKv::Q4_0(d, _) => st.clone_dtoh(d).map(|v| v.iter().map(|b| b.0).collect()),
        };
        let mut bytes: Vec<u8> = bytes.map_err(|e| CudaError::driver(OP, e))?;
        self.synchronize()?;
        // Allocations keep at least one element; report exactly the cache's bytes.
        bytes.truncate(kv.bytes());
        Ok(bytes)
    }

    fn try_embed(
        &self,
        table: &CudaWeight,
        tokens: &[u32],
        out: &mut CudaBuf,
    ) -> Result<(), CudaError> {
        const OP: &str = "embed";
        if tokens.is_empty() {
            return Ok(());
        }
        match table.ty {
            WeightType::F32 | WeightType::F16 | WeightType::Q8_0 | WeightType::Q3K => {}
            _ => return Err(table.missing("embedding gather")),
        }
        let d = table.cols;
        let ids: Vec<i32> = tokens
            .iter()
            .map(|&t| i32::try_from(t).unwrap_or(i32::MAX))
            .collect();
        let mut sc = lock(&self.scratch);
        let dev_ids = self.grow(&mut sc.ids, ids.len(), "token ids")?;
        let mut idv = dev_ids.slice_mut(0..ids.len());
        self.gpu
            .stream()
            .memcpy_htod(&ids, &mut idv)
            .map_err(|e| CudaError::driver("uploading token ids", e))?;
        let idv = dev_ids.slice(0..ids.len());
        let n = tokens.len() * d;
        let mut o = view_mut(OP, out, 0, n)?;
        self.gpu.get_rows(
            table.ty,
            &table.bytes.slice(..),
            &idv,
            &ids,
            &mut o,
            d,
            table.rows,
        )?;
        if let Some(r) = table.rotation_block {
            // Stored rows are W H; H is its own inverse.
            self.gpu.hadamard_inplace(&mut o, n, r)?;
        }
        Ok(())
    }

    fn try_matmul(
        &self,
        x: &CudaBuf,
        rows: usize,
        outs: &mut [(&CudaWeight, &mut CudaBuf)],
    ) -> Result<(), CudaError> {
        const OP: &str = "matmul";
        if rows == 0 || outs.is_empty() {
            return Ok(());
        }
        let k = outs[0].0.cols;
        if let Some((w, _)) = outs.iter().find(|(w, _)| w.cols != k) {
            return Err(CudaError::Unsupported {
                op: OP,
                what: format!("`{}` has K = {}, the other outputs K = {k}", w.name, w.cols),
            });
        }
        let xv = view(OP, x, 0, rows * k)?;
        let pn_h2 = |w: &CudaWeight| {
            matches!(w.ty, WeightType::Pn3t | WeightType::Pn4t) && w.cols <= PN_H2_MAX_K
        };
        // Decode: PN matrices share one fp16 conversion of x (same bits as converting per call).
        let mut guard = lock(&self.scratch);
        let sc = &mut *guard;
        let prepared = rows == 1 && outs.iter().any(|(w, _)| pn_h2(w));
        if prepared {
            let xh = self.grow(&mut sc.xh, PN_H2_MAX_K, "fp16 activations")?;
            let e = self.grow(&mut sc.e, 1, "activation exponent")?;
            let mut xhm = xh.slice_mut(0..k);
            let mut em = e.slice_mut(0..1);
            self.gpu.pn_prepare_x(&xv, k, &mut xhm, &mut em)?;
        }
        for (w, y) in outs.iter_mut() {
            let n = w.rows;
            let mut yv = view_mut(OP, y, 0, rows * n)?;
            let wv = w.bytes.slice(..);
            let r = if rows == 1 && w.ty != WeightType::Q3K {
                if prepared && pn_h2(w) {
                    let (Some(xh), Some(e)) = (sc.xh.as_ref(), sc.e.as_ref()) else {
                        return Err(CudaError::driver(OP, "fp16 scratch missing"));
                    };
                    self.gpu.pn_gemv_prepared(
                        w.ty,
                        &wv,
                        &xh.slice(0..k),
                        &e.slice(0..1),
                        &mut yv,
                        n,
                        k,
                    )
                } else if matches!(w.ty, WeightType::Pn3t | WeightType::Pn4t) {
                    self.gpu
                        .pn_gemv(w.ty, PnPrecision::F32, &wv, &xv, &mut yv, n, k)
                } else {
                    self.gpu.gemv(w.ty, &wv, &xv, &mut yv, n, k)
                }
            } else {
                self.gpu.matmul(w.ty, &wv, &xv, k, &mut yv, n, n, k, rows)
            };
            r.map_err(|e| CudaError::Driver {
                op: format!(
                    "matmul `{}` ({} x {k} {}, {rows} rows)",
                    w.name,
                    n,
                    w.ty.name()
                ),
                msg: e.to_string(),
            })?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn try_attention(
        &self,
        q: &CudaBuf,
        k_cache: &CudaKv,
        v_cache: &CudaKv,
        out: &mut CudaBuf,
        l: &AttnLayout,
        n_tokens: usize,
        pos0: usize,
    ) -> Result<(), CudaError> {
        const OP: &str = "attention";
        if l.head_dim != HEAD_DIM || l.n_kv_heads == 0 {
            return Err(CudaError::Unsupported {
                op: OP,
                what: format!(
                    "head_dim {} with {} kv heads (the kernel handles head_dim {HEAD_DIM})",
                    l.head_dim, l.n_kv_heads
                ),
            });
        }
        if n_tokens == 0 {
            return Ok(());
        }
        let row = l.n_kv_heads * HEAD_DIM;
        let cap = k_cache.len() / row;
        if attn_tiled(n_tokens) {
            return self.try_attention_tiled(q, k_cache, v_cache, out, l, n_tokens, pos0, cap);
        }
        let n_ctx = pos0 + n_tokens;
        // Bounded scratch: long prefill chunks use fewer, longer splits.
        let per_split = n_tokens * l.n_q_heads * (HEAD_DIM + 2);
        let max_split = (ATTN_SCRATCH_FLOATS / per_split.max(1)).max(1);
        let n_split = n_ctx.div_ceil(ATTN_CHUNK).clamp(1, max_split);
        let chunk = n_ctx.div_ceil(n_split);
        let n_split = n_ctx.div_ceil(chunk);
        let need = Gpu::attention_scratch_len(n_tokens, l.n_q_heads, n_split);
        let q_len =
            (n_tokens - 1) * l.q_token_stride + (l.n_q_heads - 1) * l.q_head_stride + HEAD_DIM;
        let qv = view(OP, q, 0, q_len)?;
        let o_stride = l.n_q_heads * HEAD_DIM;
        let mut ov = view_mut(OP, out, 0, n_tokens * o_stride)?;
        let mut sc = lock(&self.scratch);
        let scr = self.grow(&mut sc.attn, need, "attention scratch")?;
        let mut scr = scr.slice_mut(0..need);
        let a = AttnCall {
            q: &qv,
            l,
            cap,
            pos0,
            n_tokens,
            chunk,
        };
        match (k_cache, v_cache) {
            (CudaKv::F32(kc, _), CudaKv::F32(vc, _)) => self.attend(&a, kc, vc, &mut scr, &mut ov),
            (CudaKv::F16(kc, _), CudaKv::F16(vc, _)) => self.attend(&a, kc, vc, &mut scr, &mut ov),
            (CudaKv::Q8_0(kc, _), CudaKv::Q8_0(vc, _)) => {
                self.attend(&a, kc, vc, &mut scr, &mut ov)
            }
            (CudaKv::Q4_0(kc, _), CudaKv::Q4_0(vc, _)) => {
                self.attend(&a, kc, vc, &mut scr, &mut ov)
            }
            (k, v) => Err(CudaError::Unsupported {
                op: OP,
                what: format!(
                    "a {} k cache with a {} v cache (the attention kernels read one type for both)",
                    k.kv_type(),
                    v.kv_type()
                ),
            }),
        }
    }

    /// [`Self::try_attention`] by the tiled prefill kernel (no scratch).
    #[allow(clippy::too_many_arguments)]
    fn try_attention_tiled(
        &self,
        q: &CudaBuf,
        k_cache: &CudaKv,
        v_cache: &CudaKv,
        out: &mut CudaBuf,
        l: &AttnLayout,
        n_tokens: usize,
        pos0: usize,
        cap: usize,
    ) -> Result<(), CudaError> {
        const OP: &str = "attention";
        let q_len =
            (n_tokens - 1) * l.q_token_stride + (l.n_q_heads - 1) * l.q_head_stride + HEAD_DIM;
        let qv = view(OP, q, 0, q_len)?;
        let o_stride = l.n_q_heads * HEAD_DIM;
        let mut ov = view_mut(OP, out, 0, n_tokens * o_stride)?;
        let a = AttnCall {
            q: &qv,
            l,
            cap,
            pos0,
            n_tokens,
            chunk: 0,
        };
        match (k_cache, v_cache) {
            (CudaKv::F32(kc, _), CudaKv::F32(vc, _)) => self.attend_tiled(&a, kc, vc, &mut ov),
            (CudaKv::F16(kc, _), CudaKv::F16(vc, _)) => self.attend_tiled(&a, kc, vc, &mut ov),
            (CudaKv::Q8_0(kc, _), CudaKv::Q8_0(vc, _)) => self.attend_tiled(&a, kc, vc, &mut ov),
            (CudaKv::Q4_0(kc, _), CudaKv::Q4_0(vc, _)) => self.attend_tiled(&a, kc, vc, &mut ov),
            (k, v) => Err(CudaError::Unsupported {
                op: OP,
                what: format!(
                    "a {} k cache with a {} v cache (the attention kernels read one type for both)",
                    k.kv_type(),
                    v.kv_type()
                ),
            }),
        }
    }

    /// The tiled prefill attention kernel over caches of element type `T`.
    fn attend_tiled<T: KvElem>(
        &self,
        a: &AttnCall<'_, '_>,
        kc: &CudaSlice<T>,
        vc: &CudaSlice<T>,
        ov: &mut CudaViewMut<'_, f32>,
    ) -> Result<(), CudaError> {
        let l = a.l;
        let kl = KvLayout::token_major::<T>(l.n_kv_heads, a.cap);
        self.gpu.attention_prefill(
            a.q,
            l.q_token_stride,
            l.q_head_stride,
            &kc.slice(..),
            &vc.slice(..),
            kl,
            l.n_q_heads,
            a.pos0,
            a.n_tokens,
            l.scale,
            ov,
            l.n_q_heads * HEAD_DIM,
        )?;
        Ok(())
    }

    /// The split-K attention kernels over caches of element type `T`.
    fn attend<T: KvElem>(
        &self,
        a: &AttnCall<'_, '_>,
        kc: &CudaSlice<T>,
        vc: &CudaSlice<T>,
        scr: &mut CudaViewMut<'_, f32>,
        ov: &mut CudaViewMut<'_, f32>,
    ) -> Result<(), CudaError> {
        let l = a.l;
        let kl = KvLayout::token_major::<T>(l.n_kv_heads, a.cap);
        self.gpu.attention(
            a.q,
            l.q_token_stride,
            l.q_head_stride,
            &kc.slice(..),
            &vc.slice(..),
            kl,
            l.n_q_heads,
            a.pos0,
            a.n_tokens,
            l.scale,
            a.chunk,
            scr,
            ov,
            l.n_q_heads * HEAD_DIM,
        )?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn try_gdn(
        &self,
        y: &mut CudaBuf,
        b: &CudaBuf,
        alpha: &CudaBuf,
        a: &CudaBuf,
        dt_bias: &CudaBuf,
        state: &mut CudaBuf,
        out: &mut CudaBuf,
        d: &GdnDims,
        n_tokens: usize,
    ) -> Result<(), CudaError> {
        const OP: &str = "gated_delta_rule";
        if d.dk != GDN_HEAD_DIM || d.dv != GDN_HEAD_DIM {
            return Err(CudaError::Unsupported {
                op: OP,
                what: format!(
                    "key/value head dims {}/{} (the kernel handles {GDN_HEAD_DIM})",
                    d.dk, d.dv
                ),
            });
        }
        if n_tokens == 0 {
            return Ok(());
        }
        let (cd, kd, hv) = (d.conv_dim(), d.n_k_heads * d.dk, d.n_v_heads);
        {
            let mut yv = view_mut(OP, y, 0, n_tokens * cd)?;
            let ql = RowLayout {
                tokens: n_tokens,
                heads: d.n_k_heads,
                tok_stride: cd,
                head_stride: d.dk,
            };
            let q_scale = 1.0 / (d.dk as f32).sqrt();
            self.gpu.l2_norm_inplace(&mut yv, ql, d.dk, 1e-6, q_scale)?;
            let mut kv = view_mut(OP, y, kd, (n_tokens - 1) * cd + kd)?;
            self.gpu.l2_norm_inplace(&mut kv, ql, d.dk, 1e-6, 1.0)?;
        }
        let qv = view(OP, y, 0, (n_tokens - 1) * cd + kd)?;
        let kv = view(OP, y, kd, (n_tokens - 1) * cd + kd)?;
        let vv = view(OP, y, 2 * kd, (n_tokens - 1) * cd + d.value_dim())?;
        let bv = view(OP, b, 0, n_tokens * hv)?;
        let av = view(OP, alpha, 0, n_tokens * hv)?;
        let dtv = view(OP, dt_bias, 0, hv)?;
        let sav = view(OP, a, 0, hv)?;
        let mut sv = view_mut(OP, state, 0, d.state_len())?;
        let mut ov = view_mut(OP, out, 0, n_tokens * d.value_dim())?;
        let delta_rule = if gdn_chunked(n_tokens) {
            Gpu::delta_rule_chunked
        } else {
            Gpu::delta_rule
        };
        delta_rule(
            &self.gpu,
            &qv,
            &kv,
            cd,
            &vv,
            cd,
            &bv,
            &av,
            hv,
            &dtv,
            &sav,
            &mut sv,
            &mut ov,
            d.value_dim(),
            hv,
            d.n_k_heads,
            n_tokens,
        )?;
        Ok(())
    }
}

impl Backend for CudaBackend {
    type Buf = CudaBuf;
    type Weight = CudaWeight;
    type KvBuf = CudaKv;

    fn name(&self) -> String {
        let (maj, min) = self.gpu.compute_capability();
        format!(
            "cuda:{} (sm_{maj}{min}{})",
            self.ordinal,
            if self.gpu.uses_jit_ptx() {
                ", JIT from compute_60 PTX"
            } else {
                ""
            }
        )
    }

    fn supports(&self, req: &Requirements) -> Result<(), Unsupported> {
        let shape = |op, what, supported, found| {
            if found == supported {
                Ok(())
            } else {
                Err(Unsupported::Shape {
                    backend: self.name(),
                    op,
                    what,
                    supported,
                    found,
                })
            }
        };
        if let Some((k, v)) = req.kv {
            // Every type has a store kernel and an attention kernel; the attention kernels
            // read K and V with one element type.
            if k != v {
                return Err(Unsupported::MixedKvTypes {
                    backend: self.name(),
                    k,
                    v,
                });
            }
        }
        shape("attention", "head_dim", HEAD_DIM, req.attn_head_dim)?;
        shape("gated delta rule", "key head dim", GDN_HEAD_DIM, req.gdn.dk)?;
        shape(
            "gated delta rule",
            "value head dim",
            GDN_HEAD_DIM,
            req.gdn.dv,
        )?;
        shape("conv1d", "kernel length", CONV_KERNEL, req.gdn.conv_kernel)?;
        Ok(())
    }

    fn alloc(&self, len: usize) -> Result<CudaBuf, ModelError> {
        Ok(CudaBuf {
            data: self.alloc_zeros(len, "activation buffer")?,
            len,
        })
    }

    fn upload(&self, src: &[f32], dst: &mut CudaBuf, offset: usize) -> Result<(), ModelError> {
        self.try_upload(src, dst, offset).map_err(Into::into)
    }

    fn download(&self, src: &CudaBuf, offset: usize, dst: &mut [f32]) -> Result<(), ModelError> {
        self.try_download(src, offset, dst).map_err(Into::into)
    }

    fn copy(
        &self,
        src: &CudaBuf,
        src_off: usize,
        dst: &mut CudaBuf,
        dst_off: usize,
        len: usize,
    ) -> Result<(), ModelError> {
        self.try_copy(src, src_off, dst, dst_off, len)
            .map_err(Into::into)
    }

    fn zero(&self, buf: &mut CudaBuf, len: usize) -> Result<(), ModelError> {
        let r = view_mut("zero", buf, 0, len).and_then(|mut v| {
            self.gpu
                .stream()
                .memset_zeros(&mut v)
                .map_err(|e| CudaError::driver("zero", e))
        });
        r.map_err(Into::into)
    }

    fn alloc_kv(&self, len: usize, ty: KvCacheType) -> Result<CudaKv, ModelError> {
        if !len.is_multiple_of(ty.block_len()) {
            return Err(ModelError::BadArgument(format!(
                "{ty} KV cache of {len} values is not a whole number of {}-value blocks",
                ty.block_len()
            )));
        }
        let bytes = ty.bytes_for(len);
        Ok(match ty {
            KvCacheType::F32 => CudaKv::F32(self.alloc_zeros(len, "f32 KV cache")?, len),
            KvCacheType::F16 => CudaKv::F16(self.alloc_zeros(len, "f16 KV cache")?, len),
            KvCacheType::Q8_0 => CudaKv::Q8_0(self.alloc_zeros(bytes, "q8_0 KV cache")?, len),
            KvCacheType::Q4_0 => CudaKv::Q4_0(self.alloc_zeros(bytes, "q4_0 KV cache")?, len),
        })
    }

    fn kv_write(
        &self,
        src: &CudaBuf,
        dst: &mut CudaKv,
        dst_off: usize,
        len: usize,
    ) -> Result<(), ModelError> {
        self.try_kv_write(src, dst, dst_off, len)
            .map_err(Into::into)
    }

    fn load_weight(&self, src: &WeightSource<'_>) -> Result<CudaWeight, ModelError> {
        let ty = device_type(src.ty).ok_or_else(|| CudaError::MissingKernel {
            tensor: src.name.into(),
            op: "any matrix op",
            ty: src.ty.name().into(),
        })?;
        let row_bytes = ty
            .row_bytes(src.cols)
            .ok_or_else(|| ModelError::BadTensorData {
                name: src.name.into(),
                reason: format!(
                    "row length {} is not a whole number of {} blocks",
                    src.cols,
                    ty.name()
                ),
            })?;
        if src.bytes.len() != row_bytes * src.rows {
            return Err(ModelError::BadTensorData {
                name: src.name.into(),
                reason: format!(
                    "{} bytes, expected {}",
                    src.bytes.len(),
                    row_bytes * src.rows
                ),
            });
        }
        let bytes = self
            .gpu
            .stream()
            .clone_htod(src.bytes)
            .map_err(|e| CudaError::driver(format!("uploading `{}`", src.name), e))?;
        Ok(CudaWeight {
            bytes,
            ty,
            rows: src.rows,
            cols: src.cols,
            rotation_block: src.rotated.then_some(src.rotation_block),
            name: src.name.into(),
        })
    }

    fn embed(
        &self,
        table: &CudaWeight,
        tokens: &[u32],
        out: &mut CudaBuf,
    ) -> Result<(), ModelError> {
        Ok(self.try_embed(table, tokens, out)?)
    }

    fn matmul(
        &self,
        x: &CudaBuf,
        rows: usize,
        outs: &mut [(&CudaWeight, &mut CudaBuf)],
    ) -> Result<(), ModelError> {
        Ok(self.try_matmul(x, rows, outs)?)
    }

    fn hadamard(&self, x: &mut CudaBuf, len: usize, block: usize) -> Result<(), ModelError> {
        let r = view_mut("hadamard", x, 0, len)
            .and_then(|mut v| Ok(self.gpu.hadamard_inplace(&mut v, len, block)?));
        r.map_err(Into::into)
    }

    fn rms_norm(
        &self,
        x: &CudaBuf,
        w: &CudaBuf,
        out: &mut CudaBuf,
        rows: usize,
        n: usize,
        eps: f32,
    ) -> Result<(), ModelError> {
        const OP: &str = "rms_norm";
        let r: Result<(), CudaError> = (|| {
            let l = RowLayout::contiguous(rows, n);
            let xv = view(OP, x, 0, rows * n)?;
            let wv = view(OP, w, 0, n)?;
            let mut ov = view_mut(OP, out, 0, rows * n)?;
            Ok(self.gpu.rms_norm(&xv, l, &mut ov, l, Some(&wv), n, eps)?)
        })();
        r.map_err(Into::into)
    }

    fn rms_norm_strided(
        &self,
        x: &mut CudaBuf,
        w: &CudaBuf,
        n: usize,
        stride: usize,
        count: usize,
        eps: f32,
    ) -> Result<(), ModelError> {
        const OP: &str = "rms_norm_strided";
        let r: Result<(), CudaError> = (|| {
            if count == 0 {
                return Ok(());
            }
            let l = RowLayout {
                tokens: count,
                heads: 1,
                tok_stride: stride,
                head_stride: stride,
            };
            let wv = view(OP, w, 0, n)?;
            let mut xv = view_mut(OP, x, 0, l.min_len(n))?;
            Ok(self.gpu.rms_norm_inplace(&mut xv, l, Some(&wv), n, eps)?)
        })();
        r.map_err(Into::into)
    }

    fn gated_rms_norm(
        &self,
        x: &mut CudaBuf,
        z: &CudaBuf,
        w: &CudaBuf,
        len: usize,
        n: usize,
        eps: f32,
    ) -> Result<(), ModelError> {
        const OP: &str = "gated_rms_norm";
        let r: Result<(), CudaError> = (|| {
            if n == 0 || !len.is_multiple_of(n) {
                return Err(CudaError::Unsupported {
                    op: OP,
                    what: format!("len {len} is not a multiple of n = {n}"),
                });
            }
            let l = RowLayout::contiguous(len / n, n);
            let zv = view(OP, z, 0, len)?;
            let wv = view(OP, w, 0, n)?;
            let mut xv = view_mut(OP, x, 0, len)?;
            Ok(self
                .gpu
                .gated_rms_norm_inplace(&mut xv, l, &zv, l, &wv, n, eps)?)
        })();
        r.map_err(Into::into)
    }

    fn rope(
        &self,
        x: &mut CudaBuf,
        layout: &RopeLayout,
        n_tokens: usize,
        pos0: usize,
        theta: f32,
    ) -> Result<(), ModelError> {
        const OP: &str = "rope";
        let r: Result<(), CudaError> = (|| {
            if n_tokens == 0 {
                return Ok(());
            }
            let l = RowLayout {
                tokens: n_tokens,
                heads: layout.n_heads,
                tok_stride: layout.token_stride,
                head_stride: layout.head_stride,
            };
            let mut xv = view_mut(OP, x, 0, l.min_len(layout.n_rot))?;
            Ok(self
                .gpu
                .rope_neox(&mut xv, l, None, pos0, layout.n_rot, theta)?)
        })();
        r.map_err(Into::into)
    }

    fn attention(
        &self,
        q: &CudaBuf,
        k_cache: &CudaKv,
        v_cache: &CudaKv,
        out: &mut CudaBuf,
        layout: &AttnLayout,
        positions: std::ops::Range<usize>,
    ) -> Result<(), ModelError> {
        let (n_tokens, pos0) = (positions.len(), positions.start);
        self.try_attention(q, k_cache, v_cache, out, layout, n_tokens, pos0)
            .map_err(Into::into)
    }

    fn sigmoid_gate(
        &self,
        x: &mut CudaBuf,
        gate: &CudaBuf,
        g: &GateLayout,
        n_tokens: usize,
    ) -> Result<(), ModelError> {
        let GateLayout {
            n_heads,
            head_dim,
            offset: gate_offset,
            token_stride: gate_token_stride,
            head_stride: gate_head_stride,
        } = *g;
        const OP: &str = "sigmoid_gate";
        let r: Result<(), CudaError> = (|| {
            if n_tokens * n_heads * head_dim == 0 {
                return Ok(());
            }
            let gl = RowLayout {
                tokens: n_tokens,
                heads: n_heads,
                tok_stride: gate_token_stride,
                head_stride: gate_head_stride,
            };
            let gv = view(OP, gate, gate_offset, gl.min_len(head_dim))?;
            let mut xv = view_mut(OP, x, 0, n_tokens * n_heads * head_dim)?;
            Ok(self.gpu.sigmoid_gate(
                &mut xv,
                &gv,
                n_tokens,
                n_heads,
                head_dim,
                gate_token_stride,
                gate_head_stride,
            )?)
        })();
        r.map_err(Into::into)
    }

    fn conv1d_silu(
        &self,
        u: &CudaBuf,
        w: &CudaBuf,
        state: &mut CudaBuf,
        y: &mut CudaBuf,
        shape: ConvShape,
        n_tokens: usize,
    ) -> Result<(), ModelError> {
        let ConvShape { channels, kernel } = shape;
        const OP: &str = "conv1d_silu";
        let r: Result<(), CudaError> = (|| {
            if kernel != CONV_KERNEL {
                return Err(CudaError::Unsupported {
                    op: OP,
                    what: format!("conv kernel {kernel} (the kernel handles {CONV_KERNEL})"),
                });
            }
            if n_tokens == 0 {
                return Ok(());
            }
            let uv = view(OP, u, 0, n_tokens * channels)?;
            let wv = view(OP, w, 0, kernel * channels)?;
            let mut sv = view_mut(OP, state, 0, (kernel - 1) * channels)?;
            let mut yv = view_mut(OP, y, 0, n_tokens * channels)?;
            Ok(self.gpu.conv1d_silu(
                &uv, channels, &mut sv, &wv, &mut yv, channels, channels, n_tokens,
            )?)
        })();
        r.map_err(Into::into)
    }

    fn gated_delta_rule(&self, args: GdnArgs<'_, CudaBuf>) -> Result<(), ModelError> {
        let GdnArgs {
            dims,
            n_tokens,
            y,
            b,
            alpha,
            a,
            dt_bias,
            state,
            out,
        } = args;
        self.try_gdn(y, b, alpha, a, dt_bias, state, out, dims, n_tokens)
            .map_err(Into::into)
    }

    fn swiglu(&self, gate: &mut CudaBuf, up: &CudaBuf, len: usize) -> Result<(), ModelError> {
        const OP: &str = "swiglu";
        let r: Result<(), CudaError> = (|| {
            if len == 0 {
                return Ok(());
            }
            // The wrapper writes a separate output (a buffer cannot be both a view and a
            // mutable view): into scratch, then back.
            let mut sc = lock(&self.scratch);
            let tmp = self.grow(&mut sc.f32s, len, "swiglu scratch")?;
            {
                let gv = view(OP, gate, 0, len)?;
                let uv = view(OP, up, 0, len)?;
                let mut tv = tmp.slice_mut(0..len);
                self.gpu.swiglu(&gv, &uv, &mut tv, len)?;
            }
            let tv = tmp.slice(0..len);
            let mut gv = view_mut(OP, gate, 0, len)?;
            self.gpu
                .stream()
                .memcpy_dtod(&tv, &mut gv)
                .map_err(|e| CudaError::driver(OP, e))
        })();
        r.map_err(Into::into)
    }

    fn add(&self, x: &mut CudaBuf, y: &CudaBuf, len: usize) -> Result<(), ModelError> {
        const OP: &str = "add";
        let r: Result<(), CudaError> = (|| {
            if len == 0 {
                return Ok(());
            }
            let yv = view(OP, y, 0, len)?;
            let mut xv = view_mut(OP, x, 0, len)?;
            Ok(self.gpu.add_inplace(&mut xv, &yv, len)?)
        })();
        r.map_err(Into::into)
    }

    fn rms_norm_hadamard(
        &self,
        x: &CudaBuf,
        w: &CudaBuf,
        out: &mut CudaBuf,
        rows: usize,
        n: usize,
        eps: f32,
        block: usize,
    ) -> Result<(), ModelError> {
        const OP: &str = "rms_norm_hadamard";
        if rows == 0 {
            return Ok(());
        }
        if !Gpu::rotation_fits(n, block) || n > Gpu::RMS_NORM_HADAMARD_MAX_N {
            // A row longer than shared memory (or a block the kernels refuse): the two ops,
            // which report a refused block themselves.
            self.rms_norm(x, w, out, rows, n, eps)?;
            return self.hadamard(out, rows * n, block);
        }
        let r: Result<(), CudaError> = (|| {
            let xv = view(OP, x, 0, rows * n)?;
            let wv = view(OP, w, 0, n)?;
            let mut ov = view_mut(OP, out, 0, rows * n)?;
            Ok(self
                .gpu
                .rms_norm_hadamard(&xv, n, &mut ov, n, &wv, n, rows, eps, block)?)
        })();
        r.map_err(Into::into)
    }

    fn swiglu_hadamard(
        &self,
        gate: &CudaBuf,
        up: &CudaBuf,
        out: &mut CudaBuf,
        len: usize,
        block: usize,
    ) -> Result<(), ModelError> {
        const OP: &str = "swiglu_hadamard";
        if len == 0 {
            return Ok(());
        }
        if !Gpu::rotation_fits(len, block) {
            self.copy(gate, 0, out, 0, len)?;
            self.swiglu(out, up, len)?;
            return self.hadamard(out, len, block);
        }
        let r: Result<(), CudaError> = (|| {
            let gv = view(OP, gate, 0, len)?;
            let uv = view(OP, up, 0, len)?;
            let mut ov = view_mut(OP, out, 0, len)?;
            Ok(self.gpu.swiglu_hadamard(&gv, &uv, &mut ov, len, block)?)
        })();
        r.map_err(Into::into)
    }
}
