//! The CPU backend: f32 activations in `Vec<f32>`, weights read in place from the GGUF mapping,
//! data-parallel ops on a small persistent thread pool.

mod block_dot;
pub mod kernels;
mod kv;
pub mod kvquant;
mod matmul;
mod pool;
mod weight;

pub use kv::CpuKv;
pub use pool::split_range;
pub use weight::CpuWeight;

use crate::backend::{
    AttnLayout, Backend, ConvShape, GateLayout, GdnArgs, GdnTrace, KvCacheType, RopeLayout,
    WeightSource,
};
use crate::error::ModelError;
use kv::zeroed_vec;
use matmul::DECODE_ROWS_MIN;
use pn_format::dot::{PreparedI16, TileActs};
use pool::Pool;
use std::sync::Mutex;

/// Tokens at or above which the GDN layer uses the chunked delta-rule form.
pub const GDN_CHUNKED_MIN_TOKENS: usize = 16;

/// The next [`CpuBackend`]'s id.
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

thread_local! {
    /// Per calling thread, the rows of the pass it runs (`Backend::set_state_rows`): the id of
    /// the backend it declared them to and, per row, whether the row only feeds its sequence's
    /// state (such rows of PN products may take int8 tiles). Per thread, so sessions running
    /// passes on one backend from several threads never read each other's rows.
    pub(crate) static STATE_ROWS: std::cell::RefCell<(u64, Vec<bool>)> =
        const { std::cell::RefCell::new((0, Vec::new())) };
}

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
    /// Activations quantized in tile order for many-row calls on a CPU with AMX or AVX-512
    /// VNNI, `[precision (int16, int8)][PN type]`; reused across calls like `pn_acts`.
    pn_tiles: Mutex<[[Option<TileActs>; 2]; 2]>,
    /// The input rows of the current product on each PN path (`CpuBackend::pn_row_sets`),
    /// kept so a decode step does not allocate them.
    pn_row_sets: Mutex<[Vec<usize>; 3]>,
    /// This backend's key in [`STATE_ROWS`] (unique per backend in the process).
    id: u64,
    /// The prepared activations of a few-row pass (the MTP verify) as AMX byte tiles, per PN
    /// type (`pn_format::dot::SmallActs`); reused across calls like `pn_acts`.
    pn_small: Mutex<[pn_format::dot::SmallActs; 2]>,
    /// Input rows at or above which quantized rows are decoded once (see [`DECODE_ROWS_MIN`]).
    decode_rows_min: usize,
    /// Called with every matmul's input before it runs (activation statistics for
    /// calibration); `None` in normal use, where it costs one branch per matmul.
    observer: Option<MatmulObserver>,
}

/// A matmul observer: `(weight names, input [rows, cols], rows, cols)`, called once per
/// [`Backend::matmul`] call with the names of every weight that multiplies the same input (in
/// the call's order). The input is what the weights see: Hadamard-rotated for rotated PN
/// weights, as given otherwise.
pub type MatmulObserver = std::sync::Arc<dyn Fn(&[&str], &[f32], usize, usize) + Send + Sync>;

/// A raw pointer that may be shared with the pool's threads (each writes a disjoint part).
#[derive(Clone, Copy)]
pub(crate) struct SyncPtr(*mut f32);
// SAFETY: used only to hand disjoint output regions to worker threads inside `Pool::run`.
unsafe impl Send for SyncPtr {}
unsafe impl Sync for SyncPtr {}

impl SyncPtr {
    #[inline]
    pub(crate) fn get(self) -> *mut f32 {
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
            pn_tiles: Mutex::new(Default::default()),
            pn_row_sets: Mutex::new(Default::default()),
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            pn_small: Mutex::new(Default::default()),
            decode_rows_min: DECODE_ROWS_MIN,
            observer: None,
        }
    }

    /// Installs (or with `None` removes) the observer every matmul input is shown to first.
    pub fn set_matmul_observer(&mut self, observer: Option<MatmulObserver>) {
        self.observer = observer;
    }

    /// Sets the input-row count from which quantized matrix rows are decoded to f32 once and
    /// reused (below it: fused multi-vector dot products; at or above it PN rows on a CPU with
    /// an int16 tile kernel, AMX or AVX-512 VNNI, are multiplied in tiles instead, and without
    /// one they take the fused kernels; rows that only feed the state take int8 tiles at any
    /// count where [`CpuBackend::state_rows_int8`]). For benchmarks and tests that compare the
    /// paths; the default is tuned for decode and speculative verification.
    pub fn set_decode_rows_min(&mut self, rows: usize) {
        self.decode_rows_min = rows.max(1);
    }

    /// Enables or disables the chunked delta-rule form for long inputs (for testing both).
    pub fn set_gdn_chunked(&mut self, on: bool) {
        self.gdn_chunked = on;
    }

    /// Whether rows that only feed the state (`Backend::set_state_rows`: prompt rows whose
    /// logits nobody reads) take int8 activations in PN products on this CPU (AVX-512 VNNI or
    /// AVX2 tiles without AMX, unless `PN_TILE_ACTS=16`); elsewhere they take int16. Rows whose
    /// outputs are read take [`pn_format::dot::decode_precision`]'s grid (int16 unless
    /// `PN_DECODE_ACTS=8`).
    pub fn state_rows_int8() -> bool {
        pn_format::dot::int8_kernel() != pn_format::dot::TileKernel::Reference
            && pn_format::dot::default_tile_precision() == pn_format::dot::TilePrecision::I8
    }

    /// Threads the ops run on.
    pub fn n_threads(&self) -> usize {
        self.pool.n_threads()
    }

    pub(crate) fn with_scratch<R>(
        &self,
        i: usize,
        len: usize,
        f: impl FnOnce(&mut [f32]) -> R,
    ) -> R {
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

impl Backend for CpuBackend {
    fn set_state_rows(&self, state_only: &mut dyn Iterator<Item = bool>) {
        STATE_ROWS.with(|s| {
            let mut s = s.borrow_mut();
            s.0 = self.id;
            s.1.clear();
            s.1.extend(state_only);
        });
    }

    type Buf = Vec<f32>;
    type Weight = CpuWeight;
    type KvBuf = CpuKv;

    fn name(&self) -> String {
        format!("cpu ({} threads)", self.pool.n_threads())
    }

    fn alloc(&self, len: usize) -> Result<Vec<f32>, ModelError> {
        zeroed_vec(len)
    }

    /// Zeroed memory from the allocator comes lazily: the GDN kernels first read the state
    /// (the shared zero page) and then write it, so every 4 KiB page took a copy-on-write
    /// fault with a TLB shootdown, from both threads at once contending for the page-table
    /// lock, inside the first pass. Here each page is written once, on this thread (27B
    /// shapes, 2 threads, warm page cache, `pn run -p Hello -n 1`, alternated three times: the
    /// first pass 1540-1620 ms -> 990-1290 ms, first token 2.86-2.97 s -> 2.33-2.68 s after
    /// open).
    fn alloc_dense(&self, len: usize) -> Result<Vec<f32>, ModelError> {
        // Floats per 4 KiB page (the smallest page the allocator's memory can come in).
        const PAGE_FLOATS: usize = 4096 / std::mem::size_of::<f32>();
        let mut v: Vec<f32> = zeroed_vec(len)?;
        for i in (0..len).step_by(PAGE_FLOATS) {
            // SAFETY: `i < len`; a volatile store of the zero already there, so that it is
            // not elided as redundant.
            unsafe { std::ptr::write_volatile(v.as_mut_ptr().add(i), 0.0) };
        }
        Ok(v)
    }

    fn alloc_kv(&self, len: usize, ty: KvCacheType) -> Result<CpuKv, ModelError> {
        CpuKv::zeroed(len, ty)
    }

    fn kv_write(
        &self,
        src: &Vec<f32>,
        dst: &mut CpuKv,
        dst_off: usize,
        len: usize,
    ) -> Result<(), ModelError> {
        dst.write(&src[..len], dst_off);
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
        if let (Some(obs), Some((w0, _))) = (&self.observer, outs.first()) {
            let cols = w0.cols;
            if x.len() >= rows * cols {
                // At most 8 names (the backend's grouping limit); more are reported in turn.
                for group in outs.chunks(8) {
                    let mut names = [""; 8];
                    for (n, (w, _)) in names.iter_mut().zip(group) {
                        *n = w.name();
                    }
                    obs(&names[..group.len()], &x[..rows * cols], rows, cols);
                }
            }
        }
        self.matmul_outputs(x, rows, outs)
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
