//! Thin launch wrappers over cudarc. [`Gpu::new`] loads every embedded module (the sm_60 cubin on
//! a compute capability 6.x device, the compute_60 PTX elsewhere, JIT-compiled by the driver);
//! each method checks shapes and lengths on the host, then enqueues one or two kernels on the
//! context's default stream. Nothing synchronises: read results with cudarc's copies.
//!
//! Buffers are cudarc views; `CudaSlice::as_view()` / `slice(..)` produce them. The kernels use
//! vector loads, so the wrappers check device addresses (PN weights 4 bytes, Q4_K 16,
//! activations 8 or 16, KV rows per cache type) and return `KernelError::Shape` for a misaligned
//! view (cudarc allocations are 256-byte aligned; keep sub-views at aligned offsets).

use crate::error::{check, KernelError};
use crate::types::{PnPrecision, WeightType};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaStream, CudaView, CudaViewMut, DevicePtr, DriverError,
    LaunchConfig, PushKernelArg,
};
use std::collections::HashMap;
use std::sync::Arc;

pub use cudarc;

/// Value columns per block of the chunked delta-rule kernel (`PN_GDN_JB`).
const DELTA_RULE_COLUMNS: usize = 32;

fn drv(op: &'static str) -> impl FnOnce(DriverError) -> KernelError {
    move |e| KernelError::Driver {
        op,
        msg: e.to_string(),
    }
}

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

/// Rows addressed as (token, head): row (t, h) starts at `t*tok_stride + h*head_stride`
/// (elements). One head per token with `tok_stride` = row length is a plain matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowLayout {
    /// Tokens (grid y).
    pub tokens: usize,
    /// Heads per token (grid x).
    pub heads: usize,
    /// Elements between tokens.
    pub tok_stride: usize,
    /// Elements between heads of one token.
    pub head_stride: usize,
}

impl RowLayout {
    /// `rows` contiguous rows of `n` elements.
    pub fn contiguous(rows: usize, n: usize) -> RowLayout {
        RowLayout {
            tokens: rows,
            heads: 1,
            tok_stride: n,
            head_stride: n,
        }
    }
    /// Elements a buffer needs for rows of `n`.
    pub fn min_len(&self, n: usize) -> usize {
        (self.tokens.max(1) - 1) * self.tok_stride + (self.heads.max(1) - 1) * self.head_stride + n
    }
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

/// A CUDA device with every embedded kernel loaded.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    funcs: HashMap<&'static str, CudaFunction>,
    compute_capability: (i32, i32),
    jit: bool,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("compute_capability", &self.compute_capability)
            .field("jit_ptx", &self.jit)
            .field("kernels", &self.funcs.len())
            .finish()
    }
}

/// Whether the CUDA driver library can be loaded (checked before cudarc would panic on its absence).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen libcuda; no other precondition.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

impl Gpu {
    /// Opens device `ordinal` and loads every embedded module.
    ///
    /// Errors: [`KernelError::NoKernels`] (build without kernels), [`KernelError::NoDriver`],
    /// [`KernelError::NoDevice`], or a driver error while loading (e.g. PTX too new for the driver).
    pub fn new(ordinal: usize) -> Result<Gpu, KernelError> {
        if !crate::kernels_available() {
            return Err(KernelError::NoKernels(crate::embedded::no_kernels_reason()));
        }
        if !driver_present() {
            return Err(KernelError::NoDriver);
        }
        let count = CudaContext::device_count().map_err(drv("cuDeviceGetCount"))?;
        if ordinal >= count.max(0) as usize {
            return Err(KernelError::NoDevice { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal).map_err(drv("cuCtxCreate"))?;
        let cc = ctx
            .compute_capability()
            .map_err(drv("compute capability"))?;
        // sm_60 SASS runs on every 6.x device; anything else JITs the compute_60 PTX.
        let jit = cc.0 != 6;
        let mut funcs = HashMap::new();
        for m in crate::modules() {
            let image = if jit {
                cudarc::nvrtc::Ptx::from_src(m.ptx)
            } else {
                cudarc::nvrtc::Ptx::from_binary(m.cubin.to_vec())
            };
            let module = ctx.load_module(image).map_err(drv(if jit {
                "cuModuleLoadData (JIT of PTX ISA 8.8 needs driver R575 or newer)"
            } else {
                "cuModuleLoadData (sm_60 cubin)"
            }))?;
            for &k in m.kernels {
                funcs.insert(
                    k,
                    module
                        .load_function(k)
                        .map_err(drv("cuModuleGetFunction"))?,
                );
            }
        }
        let stream = ctx.default_stream();
        Ok(Gpu {
            ctx,
            stream,
            funcs,
            compute_capability: cc,
            jit,
        })
    }

    /// The cudarc context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
    /// The stream every wrapper enqueues on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
    /// Compute capability (major, minor).
    pub fn compute_capability(&self) -> (i32, i32) {
        self.compute_capability
    }
    /// Whether the kernels were JIT-compiled from PTX (not the sm_60 cubin).
    pub fn uses_jit_ptx(&self) -> bool {
        self.jit
    }

    fn func(&self, module: &'static str, name: &'static str) -> Result<&CudaFunction, KernelError> {
        self.funcs.get(name).ok_or(KernelError::MissingKernel {
            module,
            kernel: name,
        })
    }

    /// Fails unless the view's device address is a multiple of `align` bytes (the kernels use
    /// vector loads: float2/float4 on activations, u32 on PN pairs and Q4_K fields).
    fn check_align<T>(
        &self,
        op: &'static str,
        what: &str,
        v: &CudaView<'_, T>,
        align: u64,
    ) -> Result<(), KernelError> {
        let (addr, _sync) = v.device_ptr(&self.stream);
        check(addr % align == 0, op, || {
            format!("{what} at device address {addr:#x} is not {align}-byte aligned")
        })
    }

    fn cfg(grid: (u32, u32, u32), block: u32, smem: u32) -> LaunchConfig {
        LaunchConfig {
            grid_dim: grid,
            block_dim: (block, 1, 1),
            shared_mem_bytes: smem,
        }
    }

    /// Checks a PN matrix-vector call; returns the code width (3/4) and blocks per row.
    fn pn_check(
        &self,
        op: &'static str,
        ty: WeightType,
        w: &CudaView<'_, u8>,
        y_len: usize,
        n: usize,
        k: usize,
    ) -> Result<(u32, usize), KernelError> {
        let bits = match ty {
            WeightType::Pn3t => 3,
            WeightType::Pn4t => 4,
            other => {
                return Err(KernelError::Shape {
                    op,
                    what: format!("{} is not a PN type", other.name()),
                })
            }
        };
        let row_bytes = ty.row_bytes(k).ok_or_else(|| KernelError::Shape {
            op,
            what: format!("k = {k} is not a multiple of {}", ty.block_elems()),
        })?;
        check(
            n > 0 && k > 0 && n <= i32::MAX as usize && k <= i32::MAX as usize,
            op,
            || format!("bad shape n = {n}, k = {k}"),
        )?;
        check(w.len() >= n * row_bytes, op, || {
            format!(
                "weight has {} bytes, {n} x {k} {} needs {}",
                w.len(),
                ty.name(),
                n * row_bytes
            )
        })?;
        check(y_len >= n, op, || {
            format!("y has {y_len} elements, n = {n}")
        })?;
        self.check_align(op, "weight", w, 4)?;
        Ok((bits, k / ty.block_elems()))
    }

    /// The half2 kernel for a shape, its rows per warp: two rows per warp once there are
    /// enough rows to keep 56 SMs busy; the `any` kernel for odd block counts.
    fn pn_h2_kernel(bits: u32, nb: usize, n: usize, prepared: bool) -> (&'static str, usize) {
        let r2 = nb.is_multiple_of(2) && n >= 4096;
        let name = match (bits, nb.is_multiple_of(2), r2, prepared) {
            (3, true, true, false) => "pn3t_gemv_h2_r2",
            (3, true, false, false) => "pn3t_gemv_h2_r1",
            (3, false, _, false) => "pn3t_gemv_h2_any",
            (_, true, true, false) => "pn4t_gemv_h2_r2",
            (_, true, false, false) => "pn4t_gemv_h2_r1",
            (_, false, _, false) => "pn4t_gemv_h2_any",
            (3, true, true, true) => "pn3t_gemv_h2p_r2",
            (3, true, false, true) => "pn3t_gemv_h2p_r1",
            (3, false, _, true) => "pn3t_gemv_h2p_any",
            (_, true, true, true) => "pn4t_gemv_h2p_r2",
            (_, true, false, true) => "pn4t_gemv_h2p_r1",
            (_, false, _, true) => "pn4t_gemv_h2p_any",
        };
        (name, if r2 { 2 } else { 1 })
    }

    /// `y[0..n) = W x` for a PN weight of `n` rows by `k` columns (`w` = the tensor's bytes).
    /// `k` must be a multiple of 80 (pn3t) or 64 (pn4t); with `Half2`, `k <= 24576` (the fp16
    /// copy of x lives in 48 KB of shared memory). Each thread block stages x itself; when
    /// several matrices read the same x, [`Gpu::pn_prepare_x`] + [`Gpu::pn_gemv_prepared`]
    /// convert it once (same results, bit for bit).
    #[allow(clippy::too_many_arguments)]
    pub fn pn_gemv(
        &self,
        ty: WeightType,
        precision: PnPrecision,
        w: &CudaView<'_, u8>,
        x: &CudaView<'_, f32>,
        y: &mut CudaViewMut<'_, f32>,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "pn_gemv";
        let (bits, nb) = self.pn_check(OP, ty, w, y.len(), n, k)?;
        check(x.len() >= k, OP, || {
            format!("x has {} elements, k = {k}", x.len())
        })?;
        self.check_align(OP, "x", x, 8)?;
        let (name, rows_per_warp, smem) = match precision {
            PnPrecision::F32 => (
                if bits == 3 {
                    "pn3t_gemv_f32"
                } else {
                    "pn4t_gemv_f32"
                },
                1,
                0,
            ),
            PnPrecision::Half2 => {
                check(k <= 24576, OP, || {
                    format!("k = {k} exceeds 24576, the shared-memory limit of the half2 kernel")
                })?;
                let (name, r) = Self::pn_h2_kernel(bits, nb, n, false);
                (name, r, (k * 2) as u32)
            }
        };
        let grid = n.div_ceil(8 * rows_per_warp) as u32;
        let f = self.func("pn_gemv", name)?;
        let (n_i, k_i) = (n as i32, k as i32);
        let mut b = self.stream.launch_builder(f);
        b.arg(w).arg(x).arg(y).arg(&n_i).arg(&k_i);
        // SAFETY: argument list matches the kernel signature (w, x, y, N, K); buffer lengths
        // were checked above; the grid covers n rows with 8 warps per block.
        unsafe { b.launch(Self::cfg((grid, 1, 1), 256, smem)) }.map_err(drv(name))?;
        Ok(())
    }

    /// Converts the activation `x[0..k)` once for every PN matrix that reads it: `xh` gets
    /// `k` fp16 values (x scaled by a power of two), `e[0]` the exponent. `k` a multiple of 16
    /// (every PN row length is).
    pub fn pn_prepare_x(
        &self,
        x: &CudaView<'_, f32>,
        k: usize,
        xh: &mut CudaViewMut<'_, half::f16>,
        e: &mut CudaViewMut<'_, i32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "pn_prepare_x";
        check(k > 0 && k.is_multiple_of(16) && k <= 24576, OP, || {
            format!("k = {k} must be a multiple of 16 up to 24576")
        })?;
        check(x.len() >= k && xh.len() >= k && !e.is_empty(), OP, || {
            format!(
                "x has {}, xh {} (k = {k}), e {}",
                x.len(),
                xh.len(),
                e.len()
            )
        })?;
        self.check_align(OP, "x", x, 8)?;
        let f = self.func("pn_gemv", "pn_prepare_x_h2")?;
        let k_i = k as i32;
        let mut b = self.stream.launch_builder(f);
        b.arg(x).arg(&k_i).arg(xh).arg(e);
        // SAFETY: (x, K, xh, e_out); lengths checked; one block.
        unsafe { b.launch(Self::cfg((1, 1, 1), 1024, 0)) }.map_err(drv("pn_prepare_x_h2"))?;
        Ok(())
    }

    /// [`Gpu::pn_gemv`] with `Half2` from an activation converted by [`Gpu::pn_prepare_x`].
    #[allow(clippy::too_many_arguments)]
    pub fn pn_gemv_prepared(
        &self,
        ty: WeightType,
        w: &CudaView<'_, u8>,
        xh: &CudaView<'_, half::f16>,
        e: &CudaView<'_, i32>,
        y: &mut CudaViewMut<'_, f32>,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "pn_gemv_prepared";
        let (bits, nb) = self.pn_check(OP, ty, w, y.len(), n, k)?;
        check(k <= 24576 && xh.len() >= k && !e.is_empty(), OP, || {
            format!(
                "k = {k} (max 24576), xh has {}, e has {}",
                xh.len(),
                e.len()
            )
        })?;
        self.check_align(OP, "xh", xh, 16)?;
        let (name, rows_per_warp) = Self::pn_h2_kernel(bits, nb, n, true);
        let grid = n.div_ceil(8 * rows_per_warp) as u32;
        let f = self.func("pn_gemv", name)?;
        let (n_i, k_i) = (n as i32, k as i32);
        let mut b = self.stream.launch_builder(f);
        b.arg(w).arg(xh).arg(e).arg(y).arg(&n_i).arg(&k_i);
        // SAFETY: (w, xh, e, y, N, K) as declared; lengths checked; shared memory K halves.
        unsafe { b.launch(Self::cfg((grid, 1, 1), 256, (k * 2) as u32)) }.map_err(drv(name))?;
        Ok(())
    }

    /// `y[0..n) = W x` for stock types (F32, F16, Q8_0, Q4_K); dispatches PN types to [`Gpu::pn_gemv`]
    /// with `Half2`.
    pub fn gemv(
        &self,
        ty: WeightType,
        w: &CudaView<'_, u8>,
        x: &CudaView<'_, f32>,
        y: &mut CudaViewMut<'_, f32>,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "gemv";
        let name = match ty {
            WeightType::Pn3t | WeightType::Pn4t => {
                return self.pn_gemv(ty, PnPrecision::Half2, w, x, y, n, k)
            }
            WeightType::F32 => "f32_gemv_f32",
            WeightType::F16 => "f16_gemv_f32",
            WeightType::Q8_0 => "q8_0_gemv_f32",
            WeightType::Q4K => "q4_k_gemv_f32",
            WeightType::Q3K => {
                return Err(KernelError::Shape {
                    op: OP,
                    what: "no q3_K matrix-vector kernel (q3_K is only the embedding)".into(),
                })
            }
        };
        let row_bytes = ty.row_bytes(k).ok_or_else(|| KernelError::Shape {
            op: OP,
            what: format!("k = {k} is not a multiple of {}", ty.block_elems()),
        })?;
        check(
            k.is_multiple_of(4) && n > 0 && n <= i32::MAX as usize,
            OP,
            || format!("k = {k} must be a multiple of 4, n = {n} positive"),
        )?;
        check(w.len() >= n * row_bytes, OP, || {
            format!("weight has {} bytes, needs {}", w.len(), n * row_bytes)
        })?;
        check(x.len() >= k && y.len() >= n, OP, || {
            format!("x has {} (k = {k}), y has {} (n = {n})", x.len(), y.len())
        })?;
        self.check_align(OP, "weight", w, if ty == WeightType::Q4K { 16 } else { 4 })?;
        self.check_align(OP, "x", x, 16)?;
        let f = self.func("quant_gemv", name)?;
        let (n_i, k_i) = (n as i32, k as i32);
        let mut b = self.stream.launch_builder(f);
        b.arg(w).arg(x).arg(y).arg(&n_i).arg(&k_i);
        // SAFETY: (w, x, y, N, K) as declared; lengths checked.
        unsafe { b.launch(Self::cfg((n.div_ceil(8) as u32, 1, 1), 256, 0)) }.map_err(drv(name))?;
        Ok(())
    }

    /// Embedding gather: `out[t*k ..][..k] = W[ids[t]]` for `t < ids.len()` (Q3_K, Q8_0, F16, F32).
    /// Every id is checked against `n_rows` here (`ids_host` is the host copy of `ids`).
    #[allow(clippy::too_many_arguments)]
    pub fn get_rows(
        &self,
        ty: WeightType,
        w: &CudaView<'_, u8>,
        ids: &CudaView<'_, i32>,
        ids_host: &[i32],
        out: &mut CudaViewMut<'_, f32>,
        k: usize,
        n_rows: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "get_rows";
        let name = match ty {
            WeightType::Q3K => "q3_k_get_rows",
            WeightType::Q8_0 => "q8_0_get_rows",
            WeightType::F16 => "f16_get_rows",
            WeightType::F32 => "f32_get_rows",
            other => {
                return Err(KernelError::Shape {
                    op: OP,
                    what: format!("no gather kernel for {}", other.name()),
                })
            }
        };
        let row_bytes = ty.row_bytes(k).ok_or_else(|| KernelError::Shape {
            op: OP,
            what: format!("k = {k} not a block multiple"),
        })?;
        check(
            ids.len() == ids_host.len() && !ids_host.is_empty(),
            OP,
            || "ids and ids_host differ or are empty".into(),
        )?;
        if let Some((t, id)) = ids_host
            .iter()
            .enumerate()
            .find(|(_, &id)| id < 0 || id as usize >= n_rows)
        {
            return Err(KernelError::Shape {
                op: OP,
                what: format!("token {t}: id {id} outside 0..{n_rows}"),
            });
        }
        check(w.len() >= n_rows * row_bytes, OP, || {
            format!("weight has {} bytes, needs {}", w.len(), n_rows * row_bytes)
        })?;
        check(out.len() >= ids.len() * k, OP, || {
            format!("out has {}, needs {}", out.len(), ids.len() * k)
        })?;
        let f = self.func("get_rows", name)?;
        let (k_i, n_i) = (k as i32, n_rows as i32);
        let mut b = self.stream.launch_builder(f);
        b.arg(w).arg(ids).arg(out).arg(&k_i).arg(&n_i);
        // SAFETY: (w, ids, out, K, n_rows) as declared; lengths and ids checked.
        unsafe { b.launch(Self::cfg((ids.len() as u32, 1, 1), 256, 0)) }.map_err(drv(name))?;
        Ok(())
    }

    /// Prefill product `Y[t][n] = sum_k X[t][k] W[n][k]` for `t < t_len` (row strides in elements).
    #[allow(clippy::too_many_arguments)]
    pub fn matmul(
        &self,
        ty: WeightType,
        w: &CudaView<'_, u8>,
        x: &CudaView<'_, f32>,
        x_stride: usize,
        y: &mut CudaViewMut<'_, f32>,
        y_stride: usize,
        n: usize,
        k: usize,
        t_len: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "matmul";
        let name = match ty {
            WeightType::F32 => "matmul_f32w",
            WeightType::F16 => "matmul_f16w",
            WeightType::Q8_0 => "matmul_q8_0w",
            WeightType::Q4K => "matmul_q4_kw",
            WeightType::Q3K => "matmul_q3_kw",
            WeightType::Pn3t => "matmul_pn3tw",
            WeightType::Pn4t => "matmul_pn4tw",
        };
        let row_bytes = ty.row_bytes(k).ok_or_else(|| KernelError::Shape {
            op: OP,
            what: format!("k = {k} not a block multiple"),
        })?;
        check(
            n > 0 && t_len > 0 && x_stride >= k && y_stride >= n,
            OP,
            || format!("bad shape n {n} k {k} t {t_len} strides {x_stride} {y_stride}"),
        )?;
        check(w.len() >= n * row_bytes, OP, || {
            format!("weight has {} bytes, needs {}", w.len(), n * row_bytes)
        })?;
        check(x.len() >= (t_len - 1) * x_stride + k, OP, || {
            format!("x has {} elements", x.len())
        })?;
        check(y.len() >= (t_len - 1) * y_stride + n, OP, || {
            format!("y has {} elements", y.len())
        })?;
        let f = self.func("matmul", name)?;
        let (rb, xs, ys) = (row_bytes as i64, x_stride as i64, y_stride as i64);
        let (n_i, k_i, t_i) = (n as i32, k as i32, t_len as i32);
        let mut b = self.stream.launch_builder(f);
        b.arg(w)
            .arg(&rb)
            .arg(x)
            .arg(&xs)
            .arg(y)
            .arg(&ys)
            .arg(&n_i)
            .arg(&k_i)
            .arg(&t_i);
        let grid = (n.div_ceil(64) as u32, t_len.div_ceil(64) as u32, 1);
        // SAFETY: arguments as declared in matmul.cu; lengths checked.
        unsafe { b.launch(Self::cfg(grid, 256, 0)) }.map_err(drv(name))?;
        Ok(())
    }

    fn hadamard_params(op: &'static str, len: usize, r: usize) -> Result<(i32, f32), KernelError> {
        check(r.is_power_of_two() && (2..=1024).contains(&r), op, || {
            format!("block size {r} is not a power of two in 2..=1024")
        })?;
        check(len > 0 && len.is_multiple_of(r), op, || {
            format!("len {len} is not a positive multiple of {r}")
        })?;
        // 1/sqrt(R) rounded once from f64, as pn-format scales.
        Ok((r as i32, (1.0f64 / (r as f64).sqrt()) as f32))
    }

    /// Block-diagonal Hadamard rotation of `len` values in chunks of `r` (power of two,
    /// 2..=1024), scaled by 1/sqrt(r), from `x` into `y`.
    pub fn hadamard(
        &self,
        x: &CudaView<'_, f32>,
        y: &mut CudaViewMut<'_, f32>,
        len: usize,
        r: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "hadamard";
        let (r_i, scale) = Self::hadamard_params(OP, len, r)?;
        check(x.len() >= len && y.len() >= len, OP, || {
            format!("buffers shorter than {len}")
        })?;
        let f = self.func("hadamard", "hadamard_f32")?;
        let mut b = self.stream.launch_builder(f);
        b.arg(x).arg(y).arg(&r_i).arg(&scale);
        // SAFETY: (x, y, R, scale); shared memory R floats.
        unsafe {
            b.launch(Self::cfg(
                ((len / r) as u32, 1, 1),
                (r / 2).min(512) as u32,
                (r * 4) as u32,
            ))
        }
        .map_err(drv("hadamard_f32"))?;
        Ok(())
    }

    /// [`Gpu::hadamard`] in place.
    pub fn hadamard_inplace(
        &self,
        x: &mut CudaViewMut<'_, f32>,
        len: usize,
        r: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "hadamard";
        let (r_i, scale) = Self::hadamard_params(OP, len, r)?;
        check(x.len() >= len, OP, || format!("buffer shorter than {len}"))?;
        let f = self.func("hadamard", "hadamard_f32")?;
        let null: u64 = 0;
        let mut b = self.stream.launch_builder(f);
        b.arg(x).arg(&null).arg(&r_i).arg(&scale);
        // SAFETY: (x, y = null: in place, R, scale); shared memory R floats.
        unsafe {
            b.launch(Self::cfg(
                ((len / r) as u32, 1, 1),
                (r / 2).min(512) as u32,
                (r * 4) as u32,
            ))
        }
        .map_err(drv("hadamard_f32"))?;
        Ok(())
    }

    /// Longest row [`Gpu::rms_norm_hadamard`] takes: the row is staged in shared memory, which
    /// holds 48 KB per block without an opt-in, 128 bytes of which are the kernel's static
    /// reduction scratch (12256 floats).
    pub const RMS_NORM_HADAMARD_MAX_N: usize = (48 * 1024 - 128) / 4;

    /// Whether the fused rotation kernels take a rotation block of `r` over rows or runs of `n`
    /// values ([`Gpu::swiglu_hadamard`]; [`Gpu::rms_norm_hadamard`] also needs
    /// `n <= RMS_NORM_HADAMARD_MAX_N`): `r` a power of two in 2..=1024 dividing `n`, and one
    /// thread block per chunk within the grid limit.
    pub fn rotation_fits(n: usize, r: usize) -> bool {
        r.is_power_of_two()
            && (2..=1024).contains(&r)
            && n > 0
            && n.is_multiple_of(r)
            && n / r <= i32::MAX as usize
    }

    /// Fused RMSNorm and rotation of `rows` rows of `n` (n <= [`Gpu::RMS_NORM_HADAMARD_MAX_N`]):
    /// `y = H_r(rms(x) * w)`, one kernel instead of two on the decode path.
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm_hadamard(
        &self,
        x: &CudaView<'_, f32>,
        x_stride: usize,
        y: &mut CudaViewMut<'_, f32>,
        y_stride: usize,
        w: &CudaView<'_, f32>,
        n: usize,
        rows: usize,
        eps: f32,
        r: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "rms_norm_hadamard";
        let (r_i, scale) = Self::hadamard_params(OP, n, r)?;
        check(n <= Self::RMS_NORM_HADAMARD_MAX_N, OP, || {
            format!(
                "n = {n} exceeds {} (48 KB of shared memory)",
                Self::RMS_NORM_HADAMARD_MAX_N
            )
        })?;
        Self::check_rows(OP, x.len(), x_stride, y.len(), y_stride, n, rows)?;
        check(w.len() >= n, OP, || {
            format!("weight has {} elements, n = {n}", w.len())
        })?;
        let f = self.func("hadamard", "rms_norm_hadamard_f32")?;
        let (xs, ys, n_i) = (x_stride as i64, y_stride as i64, n as i32);
        let mut b = self.stream.launch_builder(f);
        b.arg(x)
            .arg(&xs)
            .arg(y)
            .arg(&ys)
            .arg(w)
            .arg(&n_i)
            .arg(&eps)
            .arg(&r_i)
            .arg(&scale);
        // SAFETY: arguments as declared; lengths checked; shared memory n floats. 256 threads as
        // in rms_norm, so both reduce the sum of squares in the same order (same bits).
        unsafe { b.launch(Self::cfg((rows as u32, 1, 1), 256, (n * 4) as u32)) }
            .map_err(drv("rms_norm_hadamard_f32"))?;
        Ok(())
    }

    /// Fused SwiGLU and rotation: `out = H_r(silu(gate) * up)` over `n` values.
    pub fn swiglu_hadamard(
        &self,
        gate: &CudaView<'_, f32>,
        up: &CudaView<'_, f32>,
        out: &mut CudaViewMut<'_, f32>,
        n: usize,
        r: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "swiglu_hadamard";
        let (r_i, scale) = Self::hadamard_params(OP, n, r)?;
        check(
            gate.len() >= n && up.len() >= n && out.len() >= n,
            OP,
            || format!("buffers shorter than {n}"),
        )?;
        let f = self.func("hadamard", "swiglu_hadamard_f32")?;
        let mut b = self.stream.launch_builder(f);
        b.arg(gate).arg(up).arg(out).arg(&r_i).arg(&scale);
        // SAFETY: arguments as declared; lengths checked; shared memory R floats.
        unsafe {
            b.launch(Self::cfg(
                ((n / r) as u32, 1, 1),
                (r / 2).clamp(32, 512) as u32,
                (r * 4) as u32,
            ))
        }
        .map_err(drv("swiglu_hadamard_f32"))?;
        Ok(())
    }

    fn check_layout(
        op: &'static str,
        what: &str,
        len: usize,
        l: &RowLayout,
        n: usize,
    ) -> Result<(), KernelError> {
        check(
            l.tokens > 0 && l.heads > 0 && n > 0 && n <= i32::MAX as usize,
            op,
            || format!("{what}: empty layout {l:?} or n = {n}"),
        )?;
        check(len >= l.min_len(n), op, || {
            format!(
                "{what} has {len} elements, layout {l:?} with rows of {n} needs {}",
                l.min_len(n)
            )
        })
    }

    fn same_rows(op: &'static str, a: &RowLayout, b: &RowLayout) -> Result<(), KernelError> {
        check(a.tokens == b.tokens && a.heads == b.heads, op, || {
            format!("layouts disagree on rows: {a:?} vs {b:?}")
        })
    }

    /// RMSNorm of every row of `xl` (rows of `n` values) into the same row of `yl`:
    /// `y = x / sqrt(mean(x^2) + eps) * w` (`w` optional). `x` and `y` must not overlap.
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm(
        &self,
        x: &CudaView<'_, f32>,
        xl: RowLayout,
        y: &mut CudaViewMut<'_, f32>,
        yl: RowLayout,
        w: Option<&CudaView<'_, f32>>,
        n: usize,
        eps: f32,
    ) -> Result<(), KernelError> {
        const OP: &str = "rms_norm";
        Self::same_rows(OP, &xl, &yl)?;
        Self::check_layout(OP, "x", x.len(), &xl, n)?;
        Self::check_layout(OP, "y", y.len(), &yl, n)?;
        if let Some(w) = w {
            check(w.len() >= n, OP, || {
                format!("weight has {} elements, n = {n}", w.len())
            })?;
        }
        let f = self.func("norm", "rms_norm_f32")?;
        let (xts, xhs, yts, yhs) = (
            xl.tok_stride as i64,
            xl.head_stride as i64,
            yl.tok_stride as i64,
            yl.head_stride as i64,
        );
        let n_i = n as i32;
        let null: u64 = 0;
        let mut b = self.stream.launch_builder(f);
        b.arg(x).arg(&xts).arg(&xhs).arg(y).arg(&yts).arg(&yhs);
        match w {
            Some(w) => b.arg(w),
            None => b.arg(&null),
        };
        b.arg(&n_i).arg(&eps);
        // SAFETY: (x, x_ts, x_hs, y, y_ts, y_hs, w or null, n, eps); lengths checked.
        unsafe { b.launch(Self::cfg((xl.heads as u32, xl.tokens as u32, 1), 256, 0)) }
            .map_err(drv("rms_norm_f32"))?;
        Ok(())
    }

    /// Gated RMSNorm of every row: `y = rms(o) * w * silu(z)` (the GDN output norm).
    #[allow(clippy::too_many_arguments)]
    pub fn gated_rms_norm(
        &self,
        o: &CudaView<'_, f32>,
        ol: RowLayout,
        z: &CudaView<'_, f32>,
        zl: RowLayout,
        y: &mut CudaViewMut<'_, f32>,
        yl: RowLayout,
        w: &CudaView<'_, f32>,
        n: usize,
        eps: f32,
    ) -> Result<(), KernelError> {
        const OP: &str = "gated_rms_norm";
        Self::same_rows(OP, &ol, &yl)?;
        Self::same_rows(OP, &ol, &zl)?;
        Self::check_layout(OP, "o", o.len(), &ol, n)?;
        Self::check_layout(OP, "z", z.len(), &zl, n)?;
        Self::check_layout(OP, "y", y.len(), &yl, n)?;
        check(w.len() >= n, OP, || {
            format!("weight has {} elements, n = {n}", w.len())
        })?;
        let f = self.func("norm", "gated_rms_norm_f32")?;
        let s = |l: &RowLayout| (l.tok_stride as i64, l.head_stride as i64);
        let ((ots, ohs), (zts, zhs), (yts, yhs)) = (s(&ol), s(&zl), s(&yl));
        let n_i = n as i32;
        let mut b = self.stream.launch_builder(f);
        b.arg(o)
            .arg(&ots)
            .arg(&ohs)
            .arg(z)
            .arg(&zts)
            .arg(&zhs)
            .arg(y)
            .arg(&yts)
            .arg(&yhs);
        b.arg(w).arg(&n_i).arg(&eps);
        // SAFETY: arguments as declared; lengths checked.
        unsafe { b.launch(Self::cfg((ol.heads as u32, ol.tokens as u32, 1), 128, 0)) }
            .map_err(drv("gated_rms_norm_f32"))?;
        Ok(())
    }

    /// L2 normalisation with scale of every row: `y = x * scale / max(||x||, eps)` (GDN q, k).
    #[allow(clippy::too_many_arguments)]
    pub fn l2_norm(
        &self,
        x: &CudaView<'_, f32>,
        xl: RowLayout,
        y: &mut CudaViewMut<'_, f32>,
        yl: RowLayout,
        n: usize,
        eps: f32,
        scale: f32,
    ) -> Result<(), KernelError> {
        const OP: &str = "l2_norm";
        Self::same_rows(OP, &xl, &yl)?;
        Self::check_layout(OP, "x", x.len(), &xl, n)?;
        Self::check_layout(OP, "y", y.len(), &yl, n)?;
        let f = self.func("norm", "l2_norm_f32")?;
        let (xts, xhs, yts, yhs) = (
            xl.tok_stride as i64,
            xl.head_stride as i64,
            yl.tok_stride as i64,
            yl.head_stride as i64,
        );
        let n_i = n as i32;
        let mut b = self.stream.launch_builder(f);
        b.arg(x)
            .arg(&xts)
            .arg(&xhs)
            .arg(y)
            .arg(&yts)
            .arg(&yhs)
            .arg(&n_i)
            .arg(&eps)
            .arg(&scale);
        // SAFETY: arguments as declared; lengths checked.
        unsafe { b.launch(Self::cfg((xl.heads as u32, xl.tokens as u32, 1), 128, 0)) }
            .map_err(drv("l2_norm_f32"))?;
        Ok(())
    }

    /// [`Gpu::rms_norm`] in place (the per-head q/k norms of the attention mixer).
    pub fn rms_norm_inplace(
        &self,
        x: &mut CudaViewMut<'_, f32>,
        xl: RowLayout,
        w: Option<&CudaView<'_, f32>>,
        n: usize,
        eps: f32,
    ) -> Result<(), KernelError> {
        const OP: &str = "rms_norm_inplace";
        Self::check_layout(OP, "x", x.len(), &xl, n)?;
        if let Some(w) = w {
            check(w.len() >= n, OP, || {
                format!("weight has {} elements, n = {n}", w.len())
            })?;
        }
        let f = self.func("norm", "rms_norm_f32")?;
        let (xts, xhs, n_i) = (xl.tok_stride as i64, xl.head_stride as i64, n as i32);
        let (null, zero): (u64, i64) = (0, 0);
        let mut b = self.stream.launch_builder(f);
        b.arg(x)
            .arg(&xts)
            .arg(&xhs)
            .arg(&null)
            .arg(&zero)
            .arg(&zero);
        match w {
            Some(w) => b.arg(w),
            None => b.arg(&null),
        };
        b.arg(&n_i).arg(&eps);
        // SAFETY: (x, x_ts, x_hs, y = null: in place, 0, 0, w or null, n, eps); lengths checked.
        unsafe { b.launch(Self::cfg((xl.heads as u32, xl.tokens as u32, 1), 256, 0)) }
            .map_err(drv("rms_norm_f32"))?;
        Ok(())
    }

    /// [`Gpu::gated_rms_norm`] in place on `x` (the trait's `gated_rms_norm`).
    #[allow(clippy::too_many_arguments)]
    pub fn gated_rms_norm_inplace(
        &self,
        x: &mut CudaViewMut<'_, f32>,
        xl: RowLayout,
        z: &CudaView<'_, f32>,
        zl: RowLayout,
        w: &CudaView<'_, f32>,
        n: usize,
        eps: f32,
    ) -> Result<(), KernelError> {
        const OP: &str = "gated_rms_norm_inplace";
        Self::same_rows(OP, &xl, &zl)?;
        Self::check_layout(OP, "x", x.len(), &xl, n)?;
        Self::check_layout(OP, "z", z.len(), &zl, n)?;
        check(w.len() >= n, OP, || {
            format!("weight has {} elements, n = {n}", w.len())
        })?;
        let f = self.func("norm", "gated_rms_norm_f32")?;
        let (xts, xhs, zts, zhs) = (
            xl.tok_stride as i64,
            xl.head_stride as i64,
            zl.tok_stride as i64,
            zl.head_stride as i64,
        );
        let n_i = n as i32;
        let (null, zero): (u64, i64) = (0, 0);
        let mut b = self.stream.launch_builder(f);
        b.arg(x)
            .arg(&xts)
            .arg(&xhs)
            .arg(z)
            .arg(&zts)
            .arg(&zhs)
            .arg(&null)
            .arg(&zero)
            .arg(&zero);
        b.arg(w).arg(&n_i).arg(&eps);
        // SAFETY: arguments as declared, output null: in place; lengths checked.
        unsafe { b.launch(Self::cfg((xl.heads as u32, xl.tokens as u32, 1), 128, 0)) }
            .map_err(drv("gated_rms_norm_f32"))?;
        Ok(())
    }

    /// [`Gpu::l2_norm`] in place (GDN q/k heads inside the conv output).
    pub fn l2_norm_inplace(
        &self,
        x: &mut CudaViewMut<'_, f32>,
        xl: RowLayout,
        n: usize,
        eps: f32,
        scale: f32,
    ) -> Result<(), KernelError> {
        const OP: &str = "l2_norm_inplace";
        Self::check_layout(OP, "x", x.len(), &xl, n)?;
        let f = self.func("norm", "l2_norm_f32")?;
        let (xts, xhs, n_i) = (xl.tok_stride as i64, xl.head_stride as i64, n as i32);
        let (null, zero): (u64, i64) = (0, 0);
        let mut b = self.stream.launch_builder(f);
        b.arg(x)
            .arg(&xts)
            .arg(&xhs)
            .arg(&null)
            .arg(&zero)
            .arg(&zero)
            .arg(&n_i)
            .arg(&eps)
            .arg(&scale);
        // SAFETY: arguments as declared, y null: in place; lengths checked.
        unsafe { b.launch(Self::cfg((xl.heads as u32, xl.tokens as u32, 1), 128, 0)) }
            .map_err(drv("l2_norm_f32"))?;
        Ok(())
    }

    fn check_rows(
        op: &'static str,
        xl: usize,
        xs: usize,
        yl: usize,
        ys: usize,
        n: usize,
        rows: usize,
    ) -> Result<(), KernelError> {
        Self::check_layout(
            op,
            "input",
            xl,
            &RowLayout {
                tokens: rows,
                heads: 1,
                tok_stride: xs,
                head_stride: 0,
            },
            n,
        )?;
        Self::check_layout(
            op,
            "output",
            yl,
            &RowLayout {
                tokens: rows,
                heads: 1,
                tok_stride: ys,
                head_stride: 0,
            },
            n,
        )
    }

    /// Partial NeoX RoPE in place on the heads of `xl` (rows = heads of tokens), rotating the
    /// first `n_rot` dims by `theta = pos * base^(-2i/n_rot)`. Positions: `pos[t]` when given,
    /// else `pos0 + t`.
    #[allow(clippy::too_many_arguments)]
    pub fn rope_neox(
        &self,
        x: &mut CudaViewMut<'_, f32>,
        xl: RowLayout,
        pos: Option<&CudaView<'_, i32>>,
        pos0: usize,
        n_rot: usize,
        base: f32,
    ) -> Result<(), KernelError> {
        const OP: &str = "rope_neox";
        check(
            n_rot.is_multiple_of(2) && n_rot > 0 && n_rot <= 2048,
            OP,
            || format!("n_rot = {n_rot}"),
        )?;
        Self::check_layout(OP, "x", x.len(), &xl, n_rot)?;
        if let Some(p) = pos {
            check(p.len() >= xl.tokens, OP, || {
                format!("{} positions for {} tokens", p.len(), xl.tokens)
            })?;
        }
        check(pos0 + xl.tokens <= i32::MAX as usize, OP, || {
            format!("position {pos0} too large")
        })?;
        let f = self.func("rope", "rope_neox_f32")?;
        let (ts, hs, p0, nr) = (
            xl.tok_stride as i64,
            xl.head_stride as i64,
            pos0 as i32,
            n_rot as i32,
        );
        let null: u64 = 0;
        let mut b = self.stream.launch_builder(f);
        b.arg(x).arg(&ts).arg(&hs);
        match pos {
            Some(p) => b.arg(p),
            None => b.arg(&null),
        };
        b.arg(&p0).arg(&nr).arg(&base);
        let cfg = LaunchConfig {
            grid_dim: (xl.heads as u32, xl.tokens as u32, 1),
            block_dim: ((n_rot / 2) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: arguments as declared; lengths checked.
        unsafe { b.launch(cfg) }.map_err(drv("rope_neox_f32"))?;
        Ok(())
    }

    fn check_cache<T: KvElem>(
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

    /// Stores `t_len` tokens of K and V (f32, `kv.n_kv` heads of 256 per token at `tok_stride`)
    /// into the caches at positions `p0..p0+t_len`.
    #[allow(clippy::too_many_arguments)]
    pub fn kv_store<T: KvElem>(
        &self,
        k: &CudaView<'_, f32>,
        v: &CudaView<'_, f32>,
        tok_stride: usize,
        kc: &mut CudaViewMut<'_, T>,
        vc: &mut CudaViewMut<'_, T>,
        kv: KvLayout,
        p0: usize,
        t_len: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "kv_store";
        check(p0 + t_len <= kv.cap && t_len > 0, OP, || {
            format!(
                "positions {p0}..{} exceed the cache capacity {}",
                p0 + t_len,
                kv.cap
            )
        })?;
        self.check_cache(OP, &kc.as_view(), &vc.as_view(), &kv)?;
        let need = (t_len - 1) * tok_stride + kv.n_kv * 256;
        check(k.len() >= need && v.len() >= need, OP, || {
            format!("k/v have {}/{} elements, need {need}", k.len(), v.len())
        })?;
        let f = self.func("attention", T::STORE_KERNEL)?;
        let (ts, ps, hs, p0_i) = (
            tok_stride as i64,
            kv.pos_stride as i64,
            kv.head_stride as i64,
            p0 as i32,
        );
        let mut b = self.stream.launch_builder(f);
        b.arg(k)
            .arg(v)
            .arg(&ts)
            .arg(kc)
            .arg(vc)
            .arg(&ps)
            .arg(&hs)
            .arg(&p0_i);
        let cfg = LaunchConfig {
            grid_dim: (kv.n_kv as u32, t_len as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: arguments as declared; lengths checked.
        unsafe { b.launch(cfg) }.map_err(drv(T::STORE_KERNEL))?;
        Ok(())
    }

    /// Scratch floats [`Gpu::attention`] needs for `t_len` queries, `n_head` heads, `n_split` splits.
    pub fn attention_scratch_len(t_len: usize, n_head: usize, n_split: usize) -> usize {
        t_len * n_head * n_split * (256 + 2)
    }

    /// Causal GQA attention, head_dim 256, over f16, f32, q8_0 or q4_0 caches laid out as `kv`
    /// says, for `t_len` queries at positions `p0..p0+t_len` (decode: `t_len = 1`; the caches
    /// already hold positions `0..p0+t_len`). Query `t` head `h` is at
    /// `q[t*q_tok_stride + h*q_head_stride ..][..256]`; output `o[t*o_tok_stride + h*256 ..]`.
    /// Splits the context in chunks of `chunk` positions (split-K), merged by a second kernel;
    /// `scratch` holds [`Gpu::attention_scratch_len`] floats.
    #[allow(clippy::too_many_arguments)]
    pub fn attention<T: KvElem>(
        &self,
        q: &CudaView<'_, f32>,
        q_tok_stride: usize,
        q_head_stride: usize,
        kc: &CudaView<'_, T>,
        vc: &CudaView<'_, T>,
        kv: KvLayout,
        n_head: usize,
        p0: usize,
        t_len: usize,
        scale: f32,
        chunk: usize,
        scratch: &mut CudaViewMut<'_, f32>,
        o: &mut CudaViewMut<'_, f32>,
        o_tok_stride: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "attention";
        check(
            n_head.is_multiple_of(kv.n_kv.max(1)) && n_head > 0 && t_len > 0 && chunk > 0,
            OP,
            || {
                format!(
                    "n_head {n_head}, n_kv {}, t {t_len}, chunk {chunk}",
                    kv.n_kv
                )
            },
        )?;
        let n_ctx = p0 + t_len;
        check(n_ctx <= kv.cap, OP, || {
            format!("context {n_ctx} exceeds the cache capacity {}", kv.cap)
        })?;
        self.check_cache(OP, kc, vc, &kv)?;
        check(
            q.len() >= (t_len - 1) * q_tok_stride + (n_head - 1) * q_head_stride + 256,
            OP,
            || format!("q has {} elements", q.len()),
        )?;
        check(
            o.len() >= (t_len - 1) * o_tok_stride + n_head * 256,
            OP,
            || format!("o has {} elements", o.len()),
        )?;
        let n_split = n_ctx.div_ceil(chunk);
        let need = Self::attention_scratch_len(t_len, n_head, n_split);
        check(scratch.len() >= need, OP, || {
            format!("scratch has {} floats, needs {need}", scratch.len())
        })?;
        let n_part = t_len * n_head * n_split * 256;
        let (mut part_o, mut part_ml) = scratch.split_at_mut(n_part);
        let fp = self.func("attention", T::PARTIAL_KERNEL)?;
        let (qts, qhs) = (q_tok_stride as i64, q_head_stride as i64);
        let (ps, hs) = (kv.pos_stride as i64, kv.head_stride as i64);
        let (group, p0_i, chunk_i) = ((n_head / kv.n_kv) as i32, p0 as i32, chunk as i32);
        let mut b = self.stream.launch_builder(fp);
        b.arg(q)
            .arg(&qts)
            .arg(&qhs)
            .arg(kc)
            .arg(vc)
            .arg(&ps)
            .arg(&hs);
        b.arg(&group)
            .arg(&p0_i)
            .arg(&chunk_i)
            .arg(&scale)
            .arg(&mut part_o)
            .arg(&mut part_ml);
        let cfg = LaunchConfig {
            grid_dim: (n_head as u32, n_split as u32, t_len as u32),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: arguments as declared in attention.cu; lengths checked; splits beyond a
        // query's causal end write (max = -inf, sum = 0) and are skipped by the combine.
        unsafe { b.launch(cfg) }.map_err(drv(T::PARTIAL_KERNEL))?;
        let fc = self.func("attention", "attn_combine")?;
        let (ns, ots) = (n_split as i32, o_tok_stride as i64);
        let mut b = self.stream.launch_builder(fc);
        b.arg(&mut part_o)
            .arg(&mut part_ml)
            .arg(&ns)
            .arg(o)
            .arg(&ots);
        let cfg = LaunchConfig {
            grid_dim: (n_head as u32, t_len as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: arguments as declared; reads the partials written above on the same stream.
        unsafe { b.launch(cfg) }.map_err(drv("attn_combine"))?;
        Ok(())
    }

    /// Query tokens per block of [`Gpu::attention_prefill`] (`AP_BQ` in attention_prefill.cu).
    pub const ATTN_PREFILL_TILE: usize = 16;

    /// [`Gpu::attention`]'s result (same arguments less the split-K `chunk` and scratch) by the
    /// tiled prefill kernel: one block per 16 query tokens and query head walks the causal
    /// prefix in K/V tiles staged in shared memory, so the cache is read once per 16 tokens
    /// instead of once per token. Meant for prefill chunks (`t_len` of 16 or more); any
    /// `t_len >= 1` is correct.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_prefill<T: KvElem>(
        &self,
        q: &CudaView<'_, f32>,
        q_tok_stride: usize,
        q_head_stride: usize,
        kc: &CudaView<'_, T>,
        vc: &CudaView<'_, T>,
        kv: KvLayout,
        n_head: usize,
        p0: usize,
        t_len: usize,
        scale: f32,
        o: &mut CudaViewMut<'_, f32>,
        o_tok_stride: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "attention_prefill";
        check(
            n_head.is_multiple_of(kv.n_kv.max(1)) && n_head > 0 && t_len > 0,
            OP,
            || format!("n_head {n_head}, n_kv {}, t {t_len}", kv.n_kv),
        )?;
        let n_ctx = p0 + t_len;
        check(n_ctx <= kv.cap && n_ctx <= i32::MAX as usize, OP, || {
            format!("context {n_ctx} exceeds the cache capacity {}", kv.cap)
        })?;
        self.check_cache(OP, kc, vc, &kv)?;
        check(
            q.len() >= (t_len - 1) * q_tok_stride + (n_head - 1) * q_head_stride + 256,
            OP,
            || format!("q has {} elements", q.len()),
        )?;
        check(
            o.len() >= (t_len - 1) * o_tok_stride + n_head * 256,
            OP,
            || format!("o has {} elements", o.len()),
        )?;
        let f = self.func("attention_prefill", T::PREFILL_KERNEL)?;
        let (qts, qhs, ots) = (
            q_tok_stride as i64,
            q_head_stride as i64,
            o_tok_stride as i64,
        );
        let (ps, hs) = (kv.pos_stride as i64, kv.head_stride as i64);
        let (group, p0_i, t_i) = ((n_head / kv.n_kv) as i32, p0 as i32, t_len as i32);
        let mut b = self.stream.launch_builder(f);
        b.arg(q)
            .arg(&qts)
            .arg(&qhs)
            .arg(kc)
            .arg(vc)
            .arg(&ps)
            .arg(&hs);
        b.arg(&group)
            .arg(&p0_i)
            .arg(&t_i)
            .arg(&scale)
            .arg(o)
            .arg(&ots);
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

    /// Causal conv1d (kernel 4) + SiLU over `t_len` tokens of `c` channels, updating the rolling
    /// state `[3][c]` of pre-conv inputs; weights `[c][4]`.
    #[allow(clippy::too_many_arguments)]
    pub fn conv1d_silu(
        &self,
        u: &CudaView<'_, f32>,
        u_stride: usize,
        state: &mut CudaViewMut<'_, f32>,
        w: &CudaView<'_, f32>,
        y: &mut CudaViewMut<'_, f32>,
        y_stride: usize,
        c: usize,
        t_len: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "conv1d_silu";
        Self::check_rows(OP, u.len(), u_stride, y.len(), y_stride, c, t_len)?;
        check(state.len() >= 3 * c && w.len() >= 4 * c, OP, || {
            format!(
                "state {} (needs {}), w {} (needs {})",
                state.len(),
                3 * c,
                w.len(),
                4 * c
            )
        })?;
        let f = self.func("conv1d", "conv1d_silu_f32")?;
        let (us, ys, c_i, t_i) = (u_stride as i64, y_stride as i64, c as i32, t_len as i32);
        let mut b = self.stream.launch_builder(f);
        b.arg(u)
            .arg(&us)
            .arg(state)
            .arg(w)
            .arg(y)
            .arg(&ys)
            .arg(&c_i)
            .arg(&t_i);
        // SAFETY: arguments as declared; lengths checked.
        unsafe { b.launch(Self::cfg((c.div_ceil(256) as u32, 1, 1), 256, 0)) }
            .map_err(drv("conv1d_silu_f32"))?;
        Ok(())
    }

    /// Gated delta rule over `t_len` tokens for `n_v_heads` value heads of 128 (key heads of
    /// 128, head `p % n_k_heads`), fp32 state `[n_v_heads][128 (j)][128 (i)]` updated in place.
    /// Walks the tokens one by one (exact recurrence): decode and short inputs.
    #[allow(clippy::too_many_arguments)]
    pub fn delta_rule(
        &self,
        q: &CudaView<'_, f32>,
        k: &CudaView<'_, f32>,
        qk_stride: usize,
        v: &CudaView<'_, f32>,
        v_stride: usize,
        beta_raw: &CudaView<'_, f32>,
        alpha_raw: &CudaView<'_, f32>,
        ab_stride: usize,
        dt_bias: &CudaView<'_, f32>,
        ssm_a: &CudaView<'_, f32>,
        state: &mut CudaViewMut<'_, f32>,
        out: &mut CudaViewMut<'_, f32>,
        out_stride: usize,
        n_v_heads: usize,
        n_k_heads: usize,
        t_len: usize,
    ) -> Result<(), KernelError> {
        self.delta_rule_launch(
            false, q, k, qk_stride, v, v_stride, beta_raw, alpha_raw, ab_stride, dt_bias, ssm_a,
            state, out, out_stride, n_v_heads, n_k_heads, t_len,
        )
    }

    /// [`Gpu::delta_rule`] in the chunked form (chunks of [`crate::DELTA_RULE_CHUNK`] tokens, the tail
    /// chunk shorter): same arguments, outputs and final state up to fp32 rounding, for prefill.
    #[allow(clippy::too_many_arguments)]
    pub fn delta_rule_chunked(
        &self,
        q: &CudaView<'_, f32>,
        k: &CudaView<'_, f32>,
        qk_stride: usize,
        v: &CudaView<'_, f32>,
        v_stride: usize,
        beta_raw: &CudaView<'_, f32>,
        alpha_raw: &CudaView<'_, f32>,
        ab_stride: usize,
        dt_bias: &CudaView<'_, f32>,
        ssm_a: &CudaView<'_, f32>,
        state: &mut CudaViewMut<'_, f32>,
        out: &mut CudaViewMut<'_, f32>,
        out_stride: usize,
        n_v_heads: usize,
        n_k_heads: usize,
        t_len: usize,
    ) -> Result<(), KernelError> {
        self.delta_rule_launch(
            true, q, k, qk_stride, v, v_stride, beta_raw, alpha_raw, ab_stride, dt_bias, ssm_a,
            state, out, out_stride, n_v_heads, n_k_heads, t_len,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn delta_rule_launch(
        &self,
        chunked: bool,
        q: &CudaView<'_, f32>,
        k: &CudaView<'_, f32>,
        qk_stride: usize,
        v: &CudaView<'_, f32>,
        v_stride: usize,
        beta_raw: &CudaView<'_, f32>,
        alpha_raw: &CudaView<'_, f32>,
        ab_stride: usize,
        dt_bias: &CudaView<'_, f32>,
        ssm_a: &CudaView<'_, f32>,
        state: &mut CudaViewMut<'_, f32>,
        out: &mut CudaViewMut<'_, f32>,
        out_stride: usize,
        n_v_heads: usize,
        n_k_heads: usize,
        t_len: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "delta_rule";
        check(n_k_heads > 0 && n_v_heads > 0 && t_len > 0, OP, || {
            format!("heads {n_v_heads}/{n_k_heads}, t {t_len}")
        })?;
        let t1 = t_len - 1;
        check(
            q.len() >= t1 * qk_stride + n_k_heads * 128
                && k.len() >= t1 * qk_stride + n_k_heads * 128,
            OP,
            || "q/k too short".into(),
        )?;
        check(v.len() >= t1 * v_stride + n_v_heads * 128, OP, || {
            "v too short".into()
        })?;
        check(
            beta_raw.len() >= t1 * ab_stride + n_v_heads
                && alpha_raw.len() >= t1 * ab_stride + n_v_heads,
            OP,
            || "beta/alpha too short".into(),
        )?;
        check(
            dt_bias.len() >= n_v_heads && ssm_a.len() >= n_v_heads,
            OP,
            || "dt_bias/ssm_a too short".into(),
        )?;
        check(state.len() >= n_v_heads * 128 * 128, OP, || {
            format!(
                "state has {} floats, needs {}",
                state.len(),
                n_v_heads * 128 * 128
            )
        })?;
        check(out.len() >= t1 * out_stride + n_v_heads * 128, OP, || {
            "out too short".into()
        })?;
        let (module, kernel, grid) = if chunked {
            let slices = (128 / DELTA_RULE_COLUMNS) as u32;
            (
                "delta_rule_chunked",
                "delta_rule_chunked_f32",
                (n_v_heads as u32, slices, 1),
            )
        } else {
            ("delta_rule", "delta_rule_f32", (n_v_heads as u32, 1, 1))
        };
        let f = self.func(module, kernel)?;
        let (qks, vs, abs, os) = (
            qk_stride as i64,
            v_stride as i64,
            ab_stride as i64,
            out_stride as i64,
        );
        let (nk, t_i) = (n_k_heads as i32, t_len as i32);
        let mut b = self.stream.launch_builder(f);
        b.arg(q)
            .arg(k)
            .arg(&qks)
            .arg(v)
            .arg(&vs)
            .arg(beta_raw)
            .arg(alpha_raw)
            .arg(&abs)
            .arg(dt_bias)
            .arg(ssm_a)
            .arg(state)
            .arg(out)
            .arg(&os)
            .arg(&nk)
            .arg(&t_i);
        // SAFETY: arguments as declared; lengths checked.
        unsafe { b.launch(Self::cfg(grid, 256, 0)) }.map_err(drv(kernel))?;
        Ok(())
    }

    fn elementwise_cfg(n: usize) -> LaunchConfig {
        Self::cfg((n.div_ceil(256).clamp(1, 65535) as u32, 1, 1), 256, 0)
    }

    /// `out = silu(gate) * up` over `n` values.
    pub fn swiglu(
        &self,
        gate: &CudaView<'_, f32>,
        up: &CudaView<'_, f32>,
        out: &mut CudaViewMut<'_, f32>,
        n: usize,
    ) -> Result<(), KernelError> {
        check(
            gate.len() >= n && up.len() >= n && out.len() >= n && n > 0,
            "swiglu",
            || format!("n = {n} exceeds a buffer"),
        )?;
        let f = self.func("elementwise", "swiglu_f32")?;
        let n_l = n as i64;
        let mut b = self.stream.launch_builder(f);
        b.arg(gate).arg(up).arg(out).arg(&n_l);
        // SAFETY: (gate, up, out, n); lengths checked.
        unsafe { b.launch(Self::elementwise_cfg(n)) }.map_err(drv("swiglu_f32"))?;
        Ok(())
    }

    /// The attention output gate: `x[t][h][i] *= sigmoid(g[t*g_tok_stride + h*g_head_stride + i])`
    /// for `tokens` tokens of `n_heads` heads of `hd` (x contiguous).
    #[allow(clippy::too_many_arguments)]
    pub fn sigmoid_gate(
        &self,
        x: &mut CudaViewMut<'_, f32>,
        g: &CudaView<'_, f32>,
        tokens: usize,
        n_heads: usize,
        hd: usize,
        g_tok_stride: usize,
        g_head_stride: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "sigmoid_gate";
        let n = tokens * n_heads * hd;
        check(n > 0 && x.len() >= n, OP, || {
            format!(
                "{tokens} tokens x {n_heads} heads x {hd}: x has {}",
                x.len()
            )
        })?;
        let gl = RowLayout {
            tokens,
            heads: n_heads,
            tok_stride: g_tok_stride,
            head_stride: g_head_stride,
        };
        Self::check_layout(OP, "gate", g.len(), &gl, hd)?;
        let f = self.func("elementwise", "sigmoid_gate_f32")?;
        let (n_l, hd_i, nh, gts, ghs) = (
            n as i64,
            hd as i32,
            n_heads as i32,
            g_tok_stride as i64,
            g_head_stride as i64,
        );
        let mut b = self.stream.launch_builder(f);
        b.arg(x)
            .arg(g)
            .arg(&n_l)
            .arg(&hd_i)
            .arg(&nh)
            .arg(&gts)
            .arg(&ghs);
        // SAFETY: arguments as declared; lengths checked.
        unsafe { b.launch(Self::elementwise_cfg(n)) }.map_err(drv("sigmoid_gate_f32"))?;
        Ok(())
    }

    /// `acc += b` over `n` values (residual add).
    pub fn add_inplace(
        &self,
        acc: &mut CudaViewMut<'_, f32>,
        b_in: &CudaView<'_, f32>,
        n: usize,
    ) -> Result<(), KernelError> {
        check(acc.len() >= n && b_in.len() >= n && n > 0, "add", || {
            format!("n = {n} exceeds a buffer")
        })?;
        let f = self.func("elementwise", "add_inplace_f32")?;
        let n_l = n as i64;
        let mut b = self.stream.launch_builder(f);
        b.arg(acc).arg(b_in).arg(&n_l);
        // SAFETY: (a, b, n); lengths checked.
        unsafe { b.launch(Self::elementwise_cfg(n)) }.map_err(drv("add_inplace_f32"))?;
        Ok(())
    }

    /// Index of the largest of `x[0..n)` written to `out[0]` (ties to the lower index).
    pub fn argmax(
        &self,
        x: &CudaView<'_, f32>,
        n: usize,
        out: &mut CudaViewMut<'_, i32>,
    ) -> Result<(), KernelError> {
        check(
            x.len() >= n && n > 0 && n <= i32::MAX as usize && !out.is_empty(),
            "argmax",
            || format!("n = {n}"),
        )?;
        let f = self.func("argmax", "argmax_f32")?;
        let n_i = n as i32;
        let mut b = self.stream.launch_builder(f);
        b.arg(x).arg(&n_i).arg(out);
        // SAFETY: (x, n, out); lengths checked; one block.
        unsafe { b.launch(Self::cfg((1, 1, 1), 1024, 0)) }.map_err(drv("argmax_f32"))?;
        Ok(())
    }

    /// Values per stage-1 block of [`Gpu::top_k`].
    pub const TOP_K_CHUNK: usize = 4096;

    /// Scratch elements [`Gpu::top_k`] needs (for each of the value and index buffers).
    pub fn top_k_scratch_len(n: usize, k: usize) -> usize {
        n.div_ceil(Self::TOP_K_CHUNK) * k
    }

    /// The `k` (1..=256) largest of `x[0..n)` in order (value descending, then index
    /// ascending; NaN skipped) into `out_v[0..k)` / `out_i[0..k)`. Index `i32::MAX` marks a
    /// missing entry when fewer than `k` values qualify. Two kernels: per-chunk top k, then a
    /// merge of the candidates.
    #[allow(clippy::too_many_arguments)]
    pub fn top_k(
        &self,
        x: &CudaView<'_, f32>,
        n: usize,
        k: usize,
        scratch_v: &mut CudaViewMut<'_, f32>,
        scratch_i: &mut CudaViewMut<'_, i32>,
        out_v: &mut CudaViewMut<'_, f32>,
        out_i: &mut CudaViewMut<'_, i32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "top_k";
        check(
            n > 0 && n <= i32::MAX as usize - Self::TOP_K_CHUNK && (1..=256).contains(&k),
            OP,
            || format!("n = {n}, k = {k} (1..=256)"),
        )?;
        let m = Self::top_k_scratch_len(n, k);
        check(
            x.len() >= n && scratch_v.len() >= m && scratch_i.len() >= m,
            OP,
            || {
                format!(
                    "x has {} (n = {n}); scratch {}/{} (needs {m})",
                    x.len(),
                    scratch_v.len(),
                    scratch_i.len()
                )
            },
        )?;
        check(out_v.len() >= k && out_i.len() >= k, OP, || {
            format!("outputs shorter than k = {k}")
        })?;
        let blocks = n.div_ceil(Self::TOP_K_CHUNK);
        let (n_i, k_i, c_i, m_i) = (n as i32, k as i32, Self::TOP_K_CHUNK as i32, m as i32);
        let f1 = self.func("argmax", "topk_stage1_f32")?;
        let mut b = self.stream.launch_builder(f1);
        b.arg(x)
            .arg(&n_i)
            .arg(&k_i)
            .arg(&c_i)
            .arg(&mut *scratch_v)
            .arg(&mut *scratch_i);
        // SAFETY: (x, n, k, chunk, cand_v, cand_i); every block writes k candidates at b*k.
        unsafe { b.launch(Self::cfg((blocks as u32, 1, 1), 256, 0)) }
            .map_err(drv("topk_stage1_f32"))?;
        let f2 = self.func("argmax", "topk_stage2_f32")?;
        let mut b = self.stream.launch_builder(f2);
        b.arg(&mut *scratch_v)
            .arg(&mut *scratch_i)
            .arg(&m_i)
            .arg(&k_i)
            .arg(out_v)
            .arg(out_i);
        // SAFETY: (cand_v, cand_i, m, k, out_v, out_i); lengths checked; one block.
        unsafe { b.launch(Self::cfg((1, 1, 1), 1024, 0)) }.map_err(drv("topk_stage2_f32"))?;
        Ok(())
    }

    /// `y = softmax(x / temperature)` over `n` values (one block; for sampling).
    pub fn softmax(
        &self,
        x: &CudaView<'_, f32>,
        y: &mut CudaViewMut<'_, f32>,
        n: usize,
        temperature: f32,
    ) -> Result<(), KernelError> {
        check(
            x.len() >= n && y.len() >= n && n > 0 && temperature > 0.0,
            "softmax",
            || format!("n = {n}, temperature = {temperature}"),
        )?;
        let f = self.func("argmax", "softmax_f32")?;
        let (n_i, inv) = (n as i32, 1.0f32 / temperature);
        let mut b = self.stream.launch_builder(f);
        b.arg(x).arg(y).arg(&n_i).arg(&inv);
        // SAFETY: (x, y, n, inv_temp); lengths checked.
        unsafe { b.launch(Self::cfg((1, 1, 1), 1024, 0)) }.map_err(drv("softmax_f32"))?;
        Ok(())
    }
}
