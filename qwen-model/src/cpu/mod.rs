//! The CPU backend: f32 activations in `Vec<f32>`, weights read in place from the GGUF mapping,
//! data-parallel ops on a small persistent thread pool.

pub mod kernels;
pub mod kvquant;
mod pool;
mod weight;

pub use pool::split_range;
pub use weight::CpuWeight;

use crate::backend::{
    AttnLayout, Backend, ConvShape, GateLayout, GdnArgs, GdnTrace, KvCacheType, RopeLayout,
    WeightSource,
};
use crate::error::ModelError;
use kvquant::{BlockQ4_0, BlockQ8_0};
use pn_format::dot::PreparedI16;
use pn_format::PnType;
use pool::Pool;
use std::sync::Mutex;
use weight::RowKind;

/// Input rows at or above which a quantized matrix row is decoded to f32 once and reused for
/// every input row. Below it, the fused multi-vector dot products (`pn_format::dot::matvec_multi`,
/// `gguf_io::quants::vec_dot_f32_multi`) unpack each weight block once for all input rows, so a
/// pass for a few tokens (MTP verification of 2..5 rows, small batches) streams the weights once.
const DECODE_ROWS_MIN: usize = 9;

/// Input rows one fused multi-vector call takes (the kernels' register budget).
const MULTI_ROWS: usize = 8;

/// Tokens at or above which the GDN layer uses the chunked delta-rule form.
pub const GDN_CHUNKED_MIN_TOKENS: usize = 16;

/// The CPU backend.
pub struct CpuBackend {
    pool: Pool,
    /// Per-thread scratch (decoded weight rows, chunked delta-rule work space); grows, never
    /// shrinks, so steady-state decode allocates nothing.
    scratch: Vec<Mutex<Vec<f32>>>,
    /// Whether long GDN inputs use the chunked form (on by default).
    gdn_chunked: bool,
    /// Activations prepared for PN rows (int16 per block), per PN type and input row; reused
    /// across calls so the buffers are allocated once.
    pn_acts: Mutex<[Vec<PreparedI16>; 2]>,
    /// Input rows at or above which quantized rows are decoded once (see [`DECODE_ROWS_MIN`]).
    decode_rows_min: usize,
}

fn pn_index(ty: PnType) -> usize {
    match ty {
        PnType::Pn3t => 0,
        PnType::Pn4t => 1,
    }
}

/// A raw pointer that may be shared with the pool's threads (each writes a disjoint part).
#[derive(Clone, Copy)]
struct SyncPtr(*mut f32);
// SAFETY: used only to hand disjoint output regions to worker threads inside `Pool::run`.
unsafe impl Send for SyncPtr {}
unsafe impl Sync for SyncPtr {}

impl SyncPtr {
    #[inline]
    fn get(self) -> *mut f32 {
        self.0
    }
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new(0)
    }
}

impl CpuBackend {
    /// A backend on `n_threads` threads (0: all available cores).
    pub fn new(n_threads: usize) -> CpuBackend {
        let n = if n_threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            n_threads
        };
        CpuBackend {
            pool: Pool::new(n),
            scratch: (0..n).map(|_| Mutex::new(Vec::new())).collect(),
            gdn_chunked: true,
            pn_acts: Mutex::new([Vec::new(), Vec::new()]),
            decode_rows_min: DECODE_ROWS_MIN,
        }
    }

    /// Sets the input-row count from which quantized matrix rows are decoded to f32 once and
    /// reused (below it: fused multi-vector dot products). For benchmarks and tests that compare
    /// the two paths; the default is tuned for decode and speculative verification.
    pub fn set_decode_rows_min(&mut self, rows: usize) {
        self.decode_rows_min = rows.max(1);
    }

    /// Enables or disables the chunked delta-rule form for long inputs (for testing both).
    pub fn set_gdn_chunked(&mut self, on: bool) {
        self.gdn_chunked = on;
    }

    /// Threads the ops run on.
    pub fn n_threads(&self) -> usize {
        self.pool.n_threads()
    }

    fn with_scratch<R>(&self, i: usize, len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
        let mut s = self.scratch[i].lock().unwrap_or_else(|e| e.into_inner());
        if s.len() < len {
            s.resize(len, 0.0);
        }
        f(&mut s[..len])
    }

    /// Runs `f(participant, range)` over `0..n` split into chunks across the pool (serially
    /// when `n` is below `2 * min_per_chunk`).
    fn par_ranges(
        &self,
        n: usize,
        min_per_chunk: usize,
        f: &(dyn Fn(usize, std::ops::Range<usize>) + Sync),
    ) {
        let t = self.pool.n_threads();
        let n_chunks = (n / min_per_chunk.max(1)).min(4 * t);
        if t == 1 || n_chunks < 2 {
            f(0, 0..n);
            return;
        }
        self.pool.run(n_chunks, &|p, c| {
            let r = split_range(n, c, n_chunks);
            if !r.is_empty() {
                f(p, r);
            }
        });
    }
}

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

/// Runs `$body` with `$k`/`$v` bound to the typed slices of two caches (every type pair).
macro_rules! with_kv_slices {
    ($kc:expr, $vc:expr, |$k:ident, $v:ident| $body:expr) => {
        match $kc {
            CpuKv::F32($k) => with_kv_slices!(@v $vc, $k, $v, $body),
            CpuKv::F16($k) => with_kv_slices!(@v $vc, $k, $v, $body),
            CpuKv::Q8_0($k) => with_kv_slices!(@v $vc, $k, $v, $body),
            CpuKv::Q4_0($k) => with_kv_slices!(@v $vc, $k, $v, $body),
        }
    };
    (@v $vc:expr, $k:ident, $v:ident, $body:expr) => {
        match $vc {
            CpuKv::F32($v) => $body,
            CpuKv::F16($v) => $body,
            CpuKv::Q8_0($v) => $body,
            CpuKv::Q4_0($v) => $body,
        }
    };
}

/// `len` zeroed elements straight from the allocator (calloc): a large KV cache costs no memory
/// until positions are written, and a failed allocation is an error, not an abort.
fn zeroed_vec<T: bytemuck::Zeroable>(len: usize) -> Result<Vec<T>, ModelError> {
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

fn first_error(slot: &Mutex<Option<ModelError>>, e: ModelError) {
    let mut s = slot.lock().unwrap_or_else(|e| e.into_inner());
    if s.is_none() {
        *s = Some(e);
    }
}

impl Backend for CpuBackend {
    type Buf = Vec<f32>;
    type Weight = CpuWeight;
    type KvBuf = CpuKv;

    fn name(&self) -> String {
        format!("cpu ({} threads)", self.pool.n_threads())
    }

    fn alloc(&self, len: usize) -> Result<Vec<f32>, ModelError> {
        zeroed_vec(len)
    }

    fn alloc_kv(&self, len: usize, ty: KvCacheType) -> Result<CpuKv, ModelError> {
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

    fn kv_write(
        &self,
        src: &Vec<f32>,
        dst: &mut CpuKv,
        dst_off: usize,
        len: usize,
    ) -> Result<(), ModelError> {
        use half::slice::HalfFloatSliceExt;
        const QK: usize = kvquant::QK;
        match dst {
            CpuKv::F32(d) => d[dst_off..dst_off + len].copy_from_slice(&src[..len]),
            CpuKv::F16(d) => d[dst_off..dst_off + len].convert_from_f32_slice(&src[..len]),
            // The graph writes whole rows of `kv_dim` values, a multiple of the head dim, which
            // `State::with_kv_types` checked is whole blocks.
            CpuKv::Q8_0(d) => {
                kvquant::quantize_into(&src[..len], &mut d[dst_off / QK..(dst_off + len) / QK])
            }
            CpuKv::Q4_0(d) => {
                kvquant::quantize_into(&src[..len], &mut d[dst_off / QK..(dst_off + len) / QK])
            }
        };
        Ok(())
    }

    fn upload(&self, src: &[f32], dst: &mut Vec<f32>, offset: usize) -> Result<(), ModelError> {
        dst[offset..offset + src.len()].copy_from_slice(src);
        Ok(())
    }

    fn download(&self, src: &Vec<f32>, offset: usize, dst: &mut [f32]) -> Result<(), ModelError> {
        dst.copy_from_slice(&src[offset..offset + dst.len()]);
        Ok(())
    }

    fn copy(
        &self,
        src: &Vec<f32>,
        src_off: usize,
        dst: &mut Vec<f32>,
        dst_off: usize,
        len: usize,
    ) -> Result<(), ModelError> {
        dst[dst_off..dst_off + len].copy_from_slice(&src[src_off..src_off + len]);
        Ok(())
    }

    fn zero(&self, buf: &mut Vec<f32>, len: usize) -> Result<(), ModelError> {
        buf[..len].fill(0.0);
        Ok(())
    }

    fn load_weight(&self, src: &WeightSource<'_>) -> Result<CpuWeight, ModelError> {
        CpuWeight::new(src, src.file)
    }

    fn embed(
        &self,
        table: &CpuWeight,
        tokens: &[u32],
        out: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        let d = table.cols;
        for (i, &tok) in tokens.iter().enumerate() {
            let dst = &mut out[i * d..(i + 1) * d];
            table.decode_row(tok as usize, dst)?;
            if let Some(r) = table.rotation_block {
                // Stored rows are W H; H is its own inverse, so H (W H)^T row = the original row.
                pn_format::hadamard::fwht_blocks_inplace(dst, r).map_err(|e| {
                    ModelError::BadTensorData {
                        name: table.name().into(),
                        reason: e.to_string(),
                    }
                })?;
            }
        }
        Ok(())
    }

    fn matmul(
        &self,
        x: &Vec<f32>,
        rows: usize,
        outs: &mut [(&CpuWeight, &mut Vec<f32>)],
    ) -> Result<(), ModelError> {
        for (w, y) in outs.iter() {
            if x.len() < rows * w.cols || y.len() < rows * w.rows {
                return Err(ModelError::BadArgument(format!(
                    "matmul `{}`: buffers too small for {rows} rows",
                    w.name()
                )));
            }
        }
        let err = Mutex::new(None);
        let n_threads = self.pool.n_threads();
        // Outputs as raw pointers: each thread writes a disjoint range of every output's rows.
        let mut targets = [(None::<&CpuWeight>, SyncPtr(std::ptr::null_mut())); 8];
        if outs.len() > targets.len() {
            for (w, y) in outs.iter_mut() {
                self.matmul(x, rows, &mut [(*w, &mut **y)])?;
            }
            return Ok(());
        }
        for (slot, (w, y)) in targets.iter_mut().zip(outs.iter_mut()) {
            *slot = (Some(*w), SyncPtr(y.as_mut_ptr()));
        }
        let targets = &targets[..outs.len()];
        let direct = rows < self.decode_rows_min;
        // PN rows multiply activations prepared once per input row (shared by all outputs).
        let mut pn_guard = None;
        if direct && outs.iter().any(|(w, _)| matches!(w.kind, RowKind::Pn(_))) {
            let mut g = self.pn_acts.lock().unwrap_or_else(|e| e.into_inner());
            for ty in PnType::ALL {
                let Some((w, _)) = outs.iter().find(|(w, _)| w.kind == RowKind::Pn(ty)) else {
                    continue;
                };
                let k = w.cols;
                let set = &mut g[pn_index(ty)];
                for t in 0..rows {
                    let xt = &x[t * k..(t + 1) * k];
                    let r = if t < set.len() {
                        set[t].update(xt)
                    } else {
                        PreparedI16::new(ty, xt).map(|p| set.push(p))
                    };
                    r.map_err(|e| {
                        ModelError::BadArgument(format!("preparing PN activations: {e}"))
                    })?;
                }
            }
            pn_guard = Some(g);
        }
        let pn_acts = pn_guard.as_deref();
        let total_rows: usize = targets.iter().map(|(w, _)| w.map_or(0, |w| w.rows)).sum();
        // Chunks per output: small enough that the caller can absorb a late worker's share.
        let single = n_threads == 1 || total_rows * rows < 64;
        let mut first_chunk = [0usize; 9];
        let mut n_chunks_of = [1usize; 8];
        for (i, (w, _)) in targets.iter().enumerate() {
            let r = w.map_or(0, |w| w.rows);
            let chunk_rows = (r / (4 * n_threads)).max(16);
            n_chunks_of[i] = if single {
                1
            } else {
                r.div_ceil(chunk_rows).max(1)
            };
            first_chunk[i + 1] = first_chunk[i] + n_chunks_of[i];
        }
        let n_chunks = first_chunk[targets.len()];
        let work = |p: usize, c: usize| {
            let o = (0..targets.len())
                .rfind(|&o| first_chunk[o] <= c)
                .unwrap_or(0);
            let (w, y) = &targets[o];
            let Some(w) = *w else { return };
            let range = split_range(w.rows, c - first_chunk[o], n_chunks_of[o]);
            if range.is_empty() {
                return;
            }
            let r = match (direct, w.kind, pn_acts) {
                (true, RowKind::Pn(ty), Some(acts)) => {
                    matmul_pn(w, ty, &acts[pn_index(ty)][..rows], *y, range)
                }
                (false, kind, _) if kind != RowKind::Stock(gguf_io::GgmlType::F32) => {
                    self.with_scratch(p, w.cols, |buf| matmul_decoded(w, x, rows, *y, range, buf))
                }
                _ => matmul_direct(w, x, rows, *y, range),
            };
            if let Err(e) = r {
                first_error(&err, e);
            }
        };
        if single {
            for c in 0..n_chunks {
                work(0, c);
            }
        } else {
            self.pool.run(n_chunks, &work);
        }
        match err.into_inner().unwrap_or_else(|e| e.into_inner()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn hadamard(&self, x: &mut Vec<f32>, len: usize, block: usize) -> Result<(), ModelError> {
        // Block sizes and lengths were checked at load (K is a multiple of the block size).
        pn_format::hadamard::fwht_blocks_inplace(&mut x[..len], block)
            .map_err(|e| ModelError::BadArgument(format!("hadamard of {len} floats: {e}")))
    }

    fn rms_norm(
        &self,
        x: &Vec<f32>,
        w: &Vec<f32>,
        out: &mut Vec<f32>,
        rows: usize,
        n: usize,
        eps: f32,
    ) -> Result<(), ModelError> {
        kernels::rms_norm(&x[..rows * n], w, &mut out[..rows * n], n, eps);
        Ok(())
    }

    fn rms_norm_strided(
        &self,
        x: &mut Vec<f32>,
        w: &Vec<f32>,
        n: usize,
        stride: usize,
        count: usize,
        eps: f32,
    ) -> Result<(), ModelError> {
        kernels::rms_norm_strided(x, w, n, stride, count, eps);
        Ok(())
    }

    fn gated_rms_norm(
        &self,
        x: &mut Vec<f32>,
        z: &Vec<f32>,
        w: &Vec<f32>,
        len: usize,
        n: usize,
        eps: f32,
    ) -> Result<(), ModelError> {
        kernels::gated_rms_norm(&mut x[..len], &z[..len], w, n, eps);
        Ok(())
    }

    fn rope(
        &self,
        x: &mut Vec<f32>,
        layout: &RopeLayout,
        n_tokens: usize,
        pos0: usize,
        theta: f32,
    ) -> Result<(), ModelError> {
        // A few dozen frequencies: recomputing them per call is cheaper than caching per theta.
        let mut inv = [0.0f64; 256];
        let half = (layout.n_rot / 2).min(inv.len());
        for (i, f) in inv.iter_mut().enumerate().take(half) {
            *f = (theta as f64).powf(-(2.0 * i as f64) / layout.n_rot as f64);
        }
        kernels::rope_neox(x, layout, n_tokens, pos0, &inv[..half]);
        Ok(())
    }

    fn attention(
        &self,
        q: &Vec<f32>,
        k_cache: &CpuKv,
        v_cache: &CpuKv,
        out: &mut Vec<f32>,
        layout: &AttnLayout,
        positions: std::ops::Range<usize>,
    ) -> Result<(), ModelError> {
        let (n_tokens, pos0) = (positions.len(), positions.start);
        let n_rows = n_tokens * layout.n_q_heads;
        assert!(
            out.len() >= n_rows * layout.head_dim,
            "attention output buffer too small"
        );
        let o = SyncPtr(out.as_mut_ptr());
        self.par_ranges(n_rows, 1, &|_, r| {
            // SAFETY: disjoint row ranges per thread; size asserted above.
            unsafe {
                with_kv_slices!(k_cache, v_cache, |k, v| kernels::attention_rows(
                    q,
                    k,
                    v,
                    o.get(),
                    layout,
                    pos0,
                    r.clone()
                ))
            }
        });
        Ok(())
    }

    fn sigmoid_gate(
        &self,
        x: &mut Vec<f32>,
        gate: &Vec<f32>,
        g: &GateLayout,
        n_tokens: usize,
    ) -> Result<(), ModelError> {
        kernels::sigmoid_gate(
            &mut x[..n_tokens * g.n_heads * g.head_dim],
            &gate[g.offset..],
            g.n_heads,
            g.head_dim,
            g.token_stride,
            g.head_stride,
        );
        Ok(())
    }

    fn conv1d_silu(
        &self,
        u: &Vec<f32>,
        w: &Vec<f32>,
        state: &mut Vec<f32>,
        y: &mut Vec<f32>,
        shape: ConvShape,
        n_tokens: usize,
    ) -> Result<(), ModelError> {
        let ConvShape { channels, kernel } = shape;
        // Internal invariants: the config limits the kernel to 2..=16 and sizes every buffer.
        assert!(
            (2..=17).contains(&kernel),
            "conv kernel {kernel} outside 2..=17"
        );
        assert!(state.len() >= (kernel - 1) * channels && y.len() >= n_tokens * channels);
        let (s, yp) = (SyncPtr(state.as_mut_ptr()), SyncPtr(y.as_mut_ptr()));
        self.par_ranges(channels, 256, &|_, r| {
            // SAFETY: disjoint channel ranges per thread; sizes asserted above.
            unsafe { kernels::conv1d_silu_channels(u, w, s.get(), yp.get(), n_tokens, shape, r) }
        });
        Ok(())
    }

    fn gated_delta_rule(&self, args: GdnArgs<'_, Vec<f32>>) -> Result<(), ModelError> {
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
        let hv = dims.n_v_heads;
        kernels::gdn_normalize_qk(y, dims, n_tokens);
        kernels::gdn_gates(
            &mut b[..n_tokens * hv],
            &mut alpha[..n_tokens * hv],
            a,
            dt_bias,
            hv,
        );
        assert!(state.len() >= dims.state_len() && out.len() >= n_tokens * dims.value_dim());
        let (s, o) = (SyncPtr(state.as_mut_ptr()), SyncPtr(out.as_mut_ptr()));
        let rows = kernels::GdnRows {
            y,
            beta: b,
            g: alpha,
            dims,
            n_tokens,
        };
        let chunked = self.gdn_chunked && n_tokens >= GDN_CHUNKED_MIN_TOKENS;
        let scratch_len = kernels::gdn_chunk_scratch_len(dims);
        self.par_ranges(hv, 1, &|ti, heads| {
            if chunked {
                self.with_scratch(ti, scratch_len, |scr| {
                    // SAFETY: disjoint head ranges per thread; sizes asserted above.
                    unsafe { kernels::gdn_chunked_heads(&rows, s.get(), o.get(), heads, scr) }
                });
            } else {
                // SAFETY: as above.
                unsafe { kernels::gdn_recurrent_heads(&rows, s.get(), o.get(), heads) }
            }
        });
        Ok(())
    }

    fn gated_delta_rule_traced(
        &self,
        args: GdnArgs<'_, Vec<f32>>,
        trace: GdnTrace<'_, Vec<f32>>,
    ) -> Result<(), ModelError> {
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
        let (trace, trace_row0) = (trace.states, trace.row0);
        // Normalisation and gates act on each row alone, and the recurrent form steps one
        // token at a time, so stepping it per row in place gives the bits of one-row calls
        // (never the chunked form, whose bits differ) without copying rows to scratch.
        let (hv, cd, vd, sl) = (
            dims.n_v_heads,
            dims.conv_dim(),
            dims.value_dim(),
            dims.state_len(),
        );
        kernels::gdn_normalize_qk(y, dims, n_tokens);
        kernels::gdn_gates(
            &mut b[..n_tokens * hv],
            &mut alpha[..n_tokens * hv],
            a,
            dt_bias,
            hv,
        );
        assert!(
            state.len() >= sl
                && out.len() >= n_tokens * vd
                && trace.len() >= (trace_row0 + n_tokens) * sl
        );
        for t in 0..n_tokens {
            let (s, o) = (
                SyncPtr(state.as_mut_ptr()),
                // SAFETY: row `t` of `out` is in bounds (asserted above).
                SyncPtr(unsafe { out.as_mut_ptr().add(t * vd) }),
            );
            let row = kernels::GdnRows {
                y: &y[t * cd..],
                beta: &b[t * hv..],
                g: &alpha[t * hv..],
                dims,
                n_tokens: 1,
            };
            self.par_ranges(hv, 1, &|_, heads| {
                // SAFETY: disjoint head ranges per thread; sizes asserted above.
                unsafe { kernels::gdn_recurrent_heads(&row, s.get(), o.get(), heads) }
            });
            trace[(trace_row0 + t) * sl..(trace_row0 + t + 1) * sl].copy_from_slice(&state[..sl]);
        }
        Ok(())
    }

    fn swiglu(&self, gate: &mut Vec<f32>, up: &Vec<f32>, len: usize) -> Result<(), ModelError> {
        kernels::swiglu(&mut gate[..len], &up[..len]);
        Ok(())
    }

    fn add(&self, x: &mut Vec<f32>, y: &Vec<f32>, len: usize) -> Result<(), ModelError> {
        kernels::add(&mut x[..len], &y[..len]);
        Ok(())
    }
}

/// `y[t, r] = w_r . x_t` with the fused per-type dot product, each weight row multiplied with up
/// to [`MULTI_ROWS`] input rows per call (fastest for a few input rows, and for f32 weights).
fn matmul_direct(
    w: &CpuWeight,
    x: &[f32],
    rows: usize,
    y: SyncPtr,
    range: std::ops::Range<usize>,
) -> Result<(), ModelError> {
    let k = w.cols;
    if rows == 1 {
        // Decode: the single-vector kernel straight away (no per-row grouping overhead, which
        // shows on small matrices).
        for r in range {
            let v = w.dot_row(r, &x[..k])?;
            // SAFETY: row `r` of the output belongs to this thread only.
            unsafe { *y.get().add(r) = v };
        }
        return Ok(());
    }
    let mut vals = [0f32; MULTI_ROWS];
    for r in range {
        for t0 in (0..rows).step_by(MULTI_ROWS) {
            let n = (rows - t0).min(MULTI_ROWS);
            let xs: [&[f32]; MULTI_ROWS] = std::array::from_fn(|j| {
                let t = t0 + j.min(n - 1);
                &x[t * k..(t + 1) * k]
            });
            w.dot_rows(r, &xs[..n], &mut vals[..n])?;
            for (j, &v) in vals[..n].iter().enumerate() {
                // SAFETY: row `r` of every output row `t` belongs to this thread only.
                unsafe { *y.get().add((t0 + j) * w.rows + r) = v };
            }
        }
    }
    Ok(())
}

/// As [`matmul_direct`], but decodes each weight row to f32 once and reuses it for all inputs.
fn matmul_decoded(
    w: &CpuWeight,
    x: &[f32],
    rows: usize,
    y: SyncPtr,
    range: std::ops::Range<usize>,
    buf: &mut [f32],
) -> Result<(), ModelError> {
    let k = w.cols;
    for r in range {
        w.decode_row(r, buf)?;
        let mut t = 0;
        while t + 4 <= rows {
            let xs = [0, 1, 2, 3].map(|j| &x[(t + j) * k..(t + j + 1) * k]);
            let v = kernels::dot4(buf, xs);
            for (j, &vj) in v.iter().enumerate() {
                // SAFETY: as in `matmul_direct`.
                unsafe { *y.get().add((t + j) * w.rows + r) = vj };
            }
            t += 4;
        }
        for t in t..rows {
            let v = kernels::dot(buf, &x[t * k..(t + 1) * k]);
            // SAFETY: as in `matmul_direct`.
            unsafe { *y.get().add(t * w.rows + r) = v };
        }
    }
    Ok(())
}

/// PN rows against prepared activations (one per input row), via
/// `pn_format::dot::matvec_multi`: every weight block is read once for all input rows.
fn matmul_pn(
    w: &CpuWeight,
    ty: PnType,
    acts: &[PreparedI16],
    y: SyncPtr,
    range: std::ops::Range<usize>,
) -> Result<(), ModelError> {
    let rb = w.row_bytes;
    let bytes = &w.bytes()[range.start * rb..range.end * rb];
    let pn_err = |e: pn_format::PnError| ModelError::BadTensorData {
        name: w.name().into(),
        reason: format!("rows {range:?}: {e}"),
    };
    if let [a] = acts {
        // SAFETY: as below, for the single output row.
        let out = unsafe { std::slice::from_raw_parts_mut(y.get().add(range.start), range.len()) };
        return pn_format::dot::matvec(ty, bytes, range.len(), a, out).map_err(pn_err);
    }
    for (g, group) in acts.chunks(MULTI_ROWS).enumerate() {
        let mut outs: [&mut [f32]; MULTI_ROWS] = Default::default();
        for (j, o) in outs.iter_mut().enumerate().take(group.len()) {
            let t = g * MULTI_ROWS + j;
            // SAFETY: rows `range` of output row `t` belong to this thread only (disjoint from
            // every other `outs` entry, which are other output rows); in bounds because the
            // output holds `rows * w.rows` floats (checked by `matmul`).
            *o = unsafe {
                std::slice::from_raw_parts_mut(y.get().add(t * w.rows + range.start), range.len())
            };
        }
        pn_format::dot::matvec_multi(ty, bytes, range.len(), group, &mut outs[..group.len()])
            .map_err(pn_err)?;
    }
    Ok(())
}
