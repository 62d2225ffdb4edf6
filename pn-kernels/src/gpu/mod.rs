//! Thin launch wrappers over cudarc, one submodule per `kernels/*.cu` op family.
//! [`Gpu::new`] loads every embedded module (the sm_60 cubin on a compute capability 6.x device,
//! the compute_60 PTX elsewhere, JIT-compiled by the driver); each method checks shapes and
//! lengths on the host, then enqueues one or two kernels on the context's default stream.
//! Nothing synchronises: read results with cudarc's copies.
//!
//! Buffers are cudarc views; `CudaSlice::as_view()` / `slice(..)` produce them. The kernels use
//! vector loads, so the wrappers check device addresses (PN weights 4 bytes, Q4_K 16,
//! activations 8 or 16, KV rows per cache type) and return `KernelError::Shape` for a misaligned
//! view (cudarc allocations are 256-byte aligned; keep sub-views at aligned offsets).
//!
//! This module: the device, its context and stream, module loading, and the row geometry
//! ([`RowLayout`], [`RowStrides`], [`MatrixShape`]) the op families share.

mod attention;
mod attention_prefill;
mod conv1d;
mod delta_conv;
mod delta_rule;
mod elementwise;
mod fuse;
mod get_rows;
mod hadamard;
mod kv;
mod matmul;
mod mixer;
mod norm;
mod pn_gemv;
mod pn_group;
mod q8_group;
mod quant_batch;
mod quant_gemv;
mod rope;
mod topk;

pub use attention::{AttnShape, SplitK};
pub use delta_conv::{ConvViews, DeltaGates};
pub use delta_rule::DeltaRuleViews;
pub use fuse::{FusedRows, NormOutputs, NormX, PreparedOut};
pub use kv::{KvElem, KvLayout, KvStoreRows, Q4KvByte, Q8KvByte};
pub use mixer::RowPrepOut;
pub use norm::NormShape;
pub use pn_group::GroupMat;

use crate::error::{check, KernelError};
use crate::types::WeightType;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaStream, CudaView, DevicePtr, DriverError, LaunchConfig,
};
use std::collections::HashMap;
use std::sync::Arc;

pub use cudarc;

/// Most blocks a launch grid has along y (and z): kernels that put tokens on grid y take at
/// most this many per launch.
pub const MAX_GRID_Y: usize = 65535;

fn drv(op: &'static str) -> impl FnOnce(DriverError) -> KernelError {
    move |e| KernelError::Driver {
        op,
        msg: e.to_string(),
    }
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

/// A weight matrix of `n` rows by `k` columns stored as `ty` (the operand of the matrix-vector,
/// matrix-matrix and gather kernels).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatrixShape {
    /// Stored type of the weight.
    pub ty: WeightType,
    /// Rows (output features; the vocabulary for an embedding gather).
    pub n: usize,
    /// Columns (input features), a whole number of `ty`'s blocks.
    pub k: usize,
}

/// `rows` rows read from an input at `x_stride` and written to an output at `y_stride`
/// (elements between consecutive rows of each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowStrides {
    /// Rows (tokens).
    pub rows: usize,
    /// Elements between input rows.
    pub x_stride: usize,
    /// Elements between output rows.
    pub y_stride: usize,
}

impl RowStrides {
    /// `rows` rows of `n` packed back to back in both the input and the output.
    pub fn contiguous(rows: usize, n: usize) -> RowStrides {
        RowStrides {
            rows,
            x_stride: n,
            y_stride: n,
        }
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

    /// Fails unless `len` elements hold every row of `l` (rows of `n`).
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

    /// Fails when `what` (a count a kernel puts on grid y or z) exceeds [`MAX_GRID_Y`].
    fn check_grid_y(op: &'static str, what: &str, count: usize) -> Result<(), KernelError> {
        check(count <= MAX_GRID_Y, op, || {
            format!("{count} {what} exceed {MAX_GRID_Y} per launch (grid y)")
        })
    }

    fn same_rows(op: &'static str, a: &RowLayout, b: &RowLayout) -> Result<(), KernelError> {
        check(a.tokens == b.tokens && a.heads == b.heads, op, || {
            format!("layouts disagree on rows: {a:?} vs {b:?}")
        })
    }

    /// Fails unless an input of `x_len` and an output of `y_len` elements hold `s.rows` rows
    /// of `n` at their strides.
    fn check_rows(
        op: &'static str,
        x_len: usize,
        y_len: usize,
        s: &RowStrides,
        n: usize,
    ) -> Result<(), KernelError> {
        let rows = |tok_stride| RowLayout {
            tokens: s.rows,
            heads: 1,
            tok_stride,
            head_stride: 0,
        };
        Self::check_layout(op, "input", x_len, &rows(s.x_stride), n)?;
        Self::check_layout(op, "output", y_len, &rows(s.y_stride), n)
    }
}
