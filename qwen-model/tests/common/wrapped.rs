//! A delegating wrapper of the CPU backend for tests that need to watch the graph's calls or
//! run a trait default the CPU backend overrides.

use qwen_model::backend::gdn_traced_by_rows;
use qwen_model::cpu::{CpuKv, CpuWeight};
use qwen_model::{
    AttnLayout, Backend, ConvShape, CpuBackend, GateLayout, GdnArgs, GdnTrace, KvCacheType,
    ModelError, Requirements, RopeLayout, Unsupported, WeightSource,
};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// One call the model made that rotates activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rot {
    /// A separate `hadamard` of `len` floats.
    Plain { len: usize, block: usize },
    /// `rms_norm_hadamard` of `rows` rows of `n`.
    Norm { rows: usize, n: usize, block: usize },
    /// `swiglu_hadamard` of `len` floats.
    Swiglu { len: usize, block: usize },
}

/// The CPU backend seen through the trait: every op delegates to it, except
/// `gated_delta_rule_traced`, which [`Wrapped::new`] runs as the trait default does (what the
/// CUDA backend runs); every rotation the graph asks for is logged and every `embed` counted.
pub struct Wrapped {
    /// The backend doing the work.
    pub inner: CpuBackend,
    log: Mutex<Vec<Rot>>,
    /// Whether `gated_delta_rule_traced` goes to the CPU override instead of the default.
    delegate_traced: bool,
    /// `embed` calls and the rows they gathered.
    embeds: (AtomicU64, AtomicU64),
}

impl Wrapped {
    /// Wraps `inner` with an empty log; `gated_delta_rule_traced` runs the trait default.
    pub fn new(inner: CpuBackend) -> Self {
        Wrapped {
            inner,
            log: Mutex::new(Vec::new()),
            delegate_traced: false,
            embeds: (AtomicU64::new(0), AtomicU64::new(0)),
        }
    }
    /// Wraps `inner`, delegating every op (the CPU override of `gated_delta_rule_traced`
    /// included): the CPU backend's bits, with the calls counted.
    pub fn delegating(inner: CpuBackend) -> Self {
        Wrapped {
            delegate_traced: true,
            ..Wrapped::new(inner)
        }
    }
    /// `embed` calls and embedded rows since the backend was made.
    pub fn embeds(&self) -> (u64, u64) {
        (
            self.embeds.0.load(Ordering::Relaxed),
            self.embeds.1.load(Ordering::Relaxed),
        )
    }
    /// The rotations logged since the last call.
    pub fn take(&self) -> Vec<Rot> {
        std::mem::take(&mut *self.log.lock().unwrap())
    }
    fn push(&self, r: Rot) {
        self.log.lock().unwrap().push(r);
    }
}

impl Backend for Wrapped {
    type Buf = Vec<f32>;
    type Weight = CpuWeight;
    type KvBuf = CpuKv;

    fn name(&self) -> String {
        format!("wrapped {}", self.inner.name())
    }
    fn alloc(&self, len: usize) -> Result<Vec<f32>, ModelError> {
        self.inner.alloc(len)
    }
    fn upload(&self, src: &[f32], dst: &mut Vec<f32>, offset: usize) -> Result<(), ModelError> {
        self.inner.upload(src, dst, offset)
    }
    fn download(&self, src: &Vec<f32>, offset: usize, dst: &mut [f32]) -> Result<(), ModelError> {
        self.inner.download(src, offset, dst)
    }
    fn copy(
        &self,
        src: &Vec<f32>,
        so: usize,
        dst: &mut Vec<f32>,
        d_o: usize,
        len: usize,
    ) -> Result<(), ModelError> {
        self.inner.copy(src, so, dst, d_o, len)
    }
    fn zero(&self, buf: &mut Vec<f32>, len: usize) -> Result<(), ModelError> {
        self.inner.zero(buf, len)
    }
    fn supports(&self, req: &Requirements) -> Result<(), Unsupported> {
        self.inner.supports(req)
    }
    fn alloc_kv(&self, len: usize, ty: KvCacheType) -> Result<CpuKv, ModelError> {
        self.inner.alloc_kv(len, ty)
    }
    fn kv_write(
        &self,
        src: &Vec<f32>,
        dst: &mut CpuKv,
        dst_off: usize,
        len: usize,
    ) -> Result<(), ModelError> {
        self.inner.kv_write(src, dst, dst_off, len)
    }
    fn load_weight(&self, src: &WeightSource<'_>) -> Result<CpuWeight, ModelError> {
        self.inner.load_weight(src)
    }
    fn embed(&self, t: &CpuWeight, tokens: &[u32], out: &mut Vec<f32>) -> Result<(), ModelError> {
        self.embeds.0.fetch_add(1, Ordering::Relaxed);
        self.embeds
            .1
            .fetch_add(tokens.len() as u64, Ordering::Relaxed);
        self.inner.embed(t, tokens, out)
    }
    fn set_state_rows(&self, state_only: &mut dyn Iterator<Item = bool>) {
        self.inner.set_state_rows(state_only)
    }
    fn matmul(
        &self,
        x: &Vec<f32>,
        rows: usize,
        outs: &mut [(&CpuWeight, &mut Vec<f32>)],
    ) -> Result<(), ModelError> {
        self.inner.matmul(x, rows, outs)
    }
    fn hadamard(&self, x: &mut Vec<f32>, len: usize, block: usize) -> Result<(), ModelError> {
        self.push(Rot::Plain { len, block });
        self.inner.hadamard(x, len, block)
    }
    fn rms_norm(
        &self,
        x: &Vec<f32>,
        w: &Vec<f32>,
        o: &mut Vec<f32>,
        r: usize,
        n: usize,
        e: f32,
    ) -> Result<(), ModelError> {
        self.inner.rms_norm(x, w, o, r, n, e)
    }
    fn rms_norm_strided(
        &self,
        x: &mut Vec<f32>,
        w: &Vec<f32>,
        n: usize,
        s: usize,
        c: usize,
        e: f32,
    ) -> Result<(), ModelError> {
        self.inner.rms_norm_strided(x, w, n, s, c, e)
    }
    fn gated_rms_norm(
        &self,
        x: &mut Vec<f32>,
        z: &Vec<f32>,
        w: &Vec<f32>,
        l: usize,
        n: usize,
        e: f32,
    ) -> Result<(), ModelError> {
        self.inner.gated_rms_norm(x, z, w, l, n, e)
    }
    fn rope(
        &self,
        x: &mut Vec<f32>,
        l: &RopeLayout,
        n: usize,
        pos0: usize,
        theta: f32,
    ) -> Result<(), ModelError> {
        self.inner.rope(x, l, n, pos0, theta)
    }
    fn attention(
        &self,
        q: &Vec<f32>,
        k: &CpuKv,
        v: &CpuKv,
        out: &mut Vec<f32>,
        layout: &AttnLayout,
        positions: Range<usize>,
    ) -> Result<(), ModelError> {
        self.inner.attention(q, k, v, out, layout, positions)
    }
    fn sigmoid_gate(
        &self,
        x: &mut Vec<f32>,
        gate: &Vec<f32>,
        g: &GateLayout,
        n_tokens: usize,
    ) -> Result<(), ModelError> {
        self.inner.sigmoid_gate(x, gate, g, n_tokens)
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
        self.inner.conv1d_silu(u, w, state, y, shape, n_tokens)
    }
    fn gated_delta_rule(&self, args: GdnArgs<'_, Vec<f32>>) -> Result<(), ModelError> {
        self.inner.gated_delta_rule(args)
    }
    fn gated_delta_rule_traced(
        &self,
        args: GdnArgs<'_, Vec<f32>>,
        trace: GdnTrace<'_, Vec<f32>>,
    ) -> Result<(), ModelError> {
        if self.delegate_traced {
            self.inner.gated_delta_rule_traced(args, trace)
        } else {
            // The trait default, as the CUDA backend runs it.
            gdn_traced_by_rows(self, args, trace)
        }
    }
    fn swiglu(&self, gate: &mut Vec<f32>, up: &Vec<f32>, len: usize) -> Result<(), ModelError> {
        self.inner.swiglu(gate, up, len)
    }
    fn add(&self, x: &mut Vec<f32>, y: &Vec<f32>, len: usize) -> Result<(), ModelError> {
        self.inner.add(x, y, len)
    }
    fn rms_norm_hadamard(
        &self,
        x: &Vec<f32>,
        w: &Vec<f32>,
        out: &mut Vec<f32>,
        rows: usize,
        n: usize,
        eps: f32,
        block: usize,
    ) -> Result<(), ModelError> {
        self.push(Rot::Norm { rows, n, block });
        self.inner.rms_norm_hadamard(x, w, out, rows, n, eps, block)
    }
    fn swiglu_hadamard(
        &self,
        gate: &Vec<f32>,
        up: &Vec<f32>,
        out: &mut Vec<f32>,
        len: usize,
        block: usize,
    ) -> Result<(), ModelError> {
        self.push(Rot::Swiglu { len, block });
        self.inner.swiglu_hadamard(gate, up, out, len, block)
    }
}
