//! The `Backend` trait: the small set of ops the forward graph is written against.
//!
//! Buffers and weights are associated types so a device backend keeps them resident (a CUDA
//! backend's `Buf` is a device allocation; the CPU backend's is a `Vec<f32>`). Every activation
//! buffer holds f32 values laid out row-major, one row per token; ops take the number of rows
//! (tokens) they act on, so a workspace sized for the largest batch serves every call.

use crate::config::ModelConfig;
use crate::error::ModelError;
use gguf_io::{GgmlType, GgufFile};
use std::sync::Arc;

pub(crate) mod mixer_ops;
pub(crate) mod mixer_proj;
pub use mixer_ops::{AttnGateRot, GatedNormShape, QkNormRope, RotatedOut};
pub use mixer_proj::{ConvIn, MixerOut};

/// Layout of the q/k heads a RoPE call rotates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RopeLayout {
    /// Heads per token.
    pub n_heads: usize,
    /// Floats between consecutive heads of one token.
    pub head_stride: usize,
    /// Floats between consecutive tokens.
    pub token_stride: usize,
    /// Leading dims of each head that are rotated (NeoX pairing `(i, i + n_rot/2)`).
    pub n_rot: usize,
}

/// Layout and shape of a causal GQA attention call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnLayout {
    /// Query heads.
    pub n_q_heads: usize,
    /// Key/value heads (query head `h` reads kv head `h / (n_q_heads / n_kv_heads)`).
    pub n_kv_heads: usize,
    /// Head dimension (q, k and v).
    pub head_dim: usize,
    /// Floats between consecutive tokens in the query buffer.
    pub q_token_stride: usize,
    /// Floats between consecutive heads of one token in the query buffer.
    pub q_head_stride: usize,
    /// Score scale (`1/sqrt(head_dim)`).
    pub scale: f32,
}

/// Shape of a Gated DeltaNet layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GdnDims {
    /// Key heads (`ssm.group_count`).
    pub n_k_heads: usize,
    /// Value heads (`ssm.time_step_rank`); value head `p` reads key head `p % n_k_heads`.
    pub n_v_heads: usize,
    /// Key head dim (`ssm.state_size`).
    pub dk: usize,
    /// Value head dim (`ssm.inner_size / ssm.time_step_rank`).
    pub dv: usize,
    /// Conv kernel length (`ssm.conv_kernel`).
    pub conv_kernel: usize,
}

impl GdnDims {
    /// Channels of the conv / width of the `attn_qkv` output: `2 * Hk * dk + Hv * dv`.
    pub fn conv_dim(&self) -> usize {
        2 * self.n_k_heads * self.dk + self.n_v_heads * self.dv
    }
    /// Width of the value part / of the output: `Hv * dv`.
    pub fn value_dim(&self) -> usize {
        self.n_v_heads * self.dv
    }
    /// Floats of recurrent state: `Hv * dv * dk`.
    pub fn state_len(&self) -> usize {
        self.n_v_heads * self.dv * self.dk
    }
    /// Floats of conv state: `(kernel - 1) * conv_dim`.
    pub fn conv_state_len(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_dim()
    }
}

/// Where the output gate of an attention call sits in the gate buffer
/// ([`Backend::sigmoid_gate`]): head `h` of token `t` reads `head_dim` gate values from float
/// `offset + t * token_stride + h * head_stride`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateLayout {
    /// Heads per token.
    pub n_heads: usize,
    /// Values per head.
    pub head_dim: usize,
    /// Float of the first token's first head's gate.
    pub offset: usize,
    /// Floats between consecutive tokens' gates.
    pub token_stride: usize,
    /// Floats between consecutive heads' gates of one token.
    pub head_stride: usize,
}

/// Shape of a causal depthwise conv1d ([`Backend::conv1d_silu`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvShape {
    /// Channels (floats per row).
    pub channels: usize,
    /// Kernel length (the conv state holds the last `kernel - 1` input rows).
    pub kernel: usize,
}

/// The buffers of one Gated DeltaNet core call ([`Backend::gated_delta_rule`]) over
/// `n_tokens` rows of a layer shaped `dims` (`Hk`/`Hv` key/value heads of `dk`/`dv`).
pub struct GdnArgs<'a, T> {
    /// Shape of the layer.
    pub dims: &'a GdnDims,
    /// Rows (tokens) of the call.
    pub n_tokens: usize,
    /// Post-conv rows `[n_tokens, conv_dim]`, each `q [Hk * dk] | k [Hk * dk] | v [Hv * dv]`;
    /// q and k are L2-normalised in place (q also scaled).
    pub y: &'a mut T,
    /// Beta inputs `[n_tokens, Hv]`, turned into beta in place.
    pub b: &'a mut T,
    /// Decay inputs `[n_tokens, Hv]`, turned into the log-decay in place.
    pub alpha: &'a mut T,
    /// The layer's `ssm_a`, `[Hv]`.
    pub a: &'a T,
    /// The layer's `ssm_dt` bias, `[Hv]`.
    pub dt_bias: &'a T,
    /// Recurrent state `[Hv, dv, dk]`, read and updated.
    pub state: &'a mut T,
    /// Output rows `[n_tokens, Hv * dv]`.
    pub out: &'a mut T,
}

/// Where [`Backend::gated_delta_rule_traced`] records the recurrent state after each row.
pub struct GdnTrace<'a, T> {
    /// Recorded states `[max_rows, Hv * dv * dk]`; row `t` of the call goes to row
    /// `row0 + t`.
    pub states: &'a mut T,
    /// Trace row of the call's first row.
    pub row0: usize,
    /// One-row work buffers of the trait default.
    pub scratch: &'a mut GdnRowScratch<T>,
}

/// One-row work buffers of the default [`Backend::gated_delta_rule_traced`].
pub struct GdnRowScratch<T> {
    /// One post-conv row, `conv_dim` floats.
    pub y: T,
    /// One row of beta inputs, `n_v_heads` floats.
    pub b: T,
    /// One row of decay inputs, `n_v_heads` floats.
    pub alpha: T,
    /// One output row, `value_dim` floats.
    pub out: T,
}

impl<T> GdnRowScratch<T> {
    /// Buffers for one row of a layer shaped `dims`.
    pub fn new<B: Backend<Buf = T>>(backend: &B, dims: &GdnDims) -> Result<Self, ModelError> {
        Ok(GdnRowScratch {
            y: backend.alloc(dims.conv_dim())?,
            b: backend.alloc(dims.n_v_heads)?,
            alpha: backend.alloc(dims.n_v_heads)?,
            out: backend.alloc(dims.value_dim())?,
        })
    }
}

/// Storage type of one KV cache (K or V): the float types and the block-quantized ones. A
/// backend declares which it stores in [`Backend::supports`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvCacheType {
    /// f32 (exact).
    #[default]
    F32,
    /// f16.
    F16,
    /// Blocks of 32 values: an f16 scale and 32 signed 8-bit integers (34 bytes, 8.5 bits/value).
    Q8_0,
    /// Blocks of 32 values: an f16 scale and 32 signed 4-bit integers (18 bytes, 4.5 bits/value).
    Q4_0,
}

impl KvCacheType {
    /// All types, for tests and help texts.
    pub const ALL: [KvCacheType; 4] = [Self::F32, Self::F16, Self::Q8_0, Self::Q4_0];

    /// Values per storage block (1 for the float types, 32 for the quantized ones); a cache row
    /// (one head) must be a whole number of blocks.
    pub fn block_len(self) -> usize {
        match self {
            Self::F32 | Self::F16 => 1,
            Self::Q8_0 | Self::Q4_0 => 32,
        }
    }

    /// Bytes per storage block.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 => 2,
            Self::Q8_0 => 34,
            Self::Q4_0 => 18,
        }
    }

    /// Bytes that `n` values take (`n` a multiple of [`Self::block_len`]).
    pub fn bytes_for(self, n: usize) -> usize {
        n / self.block_len() * self.block_bytes()
    }

    /// The name used on command lines (`f32`, `f16`, `q8_0`, `q4_0`).
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Q8_0 => "q8_0",
            Self::Q4_0 => "q4_0",
        }
    }
}

impl std::fmt::Display for KvCacheType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvCacheType {
    type Err = ModelError;
    fn from_str(s: &str) -> Result<Self, ModelError> {
        Self::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                ModelError::BadArgument(format!(
                    "unknown KV cache type `{s}` (expected f32, f16, q8_0 or q4_0)"
                ))
            })
    }
}

/// A weight matrix as stored in the file, handed to [`Backend::load_weight`].
#[derive(Debug, Clone, Copy)]
pub struct WeightSource<'a> {
    /// Tensor name (for errors).
    pub name: &'a str,
    /// Storage type.
    pub ty: GgmlType,
    /// Output rows (`ne[1]`).
    pub rows: usize,
    /// Reduction length K (`ne[0]`).
    pub cols: usize,
    /// `rows * row_bytes` bytes, row-major.
    pub bytes: &'a [u8],
    /// Whether the rows were stored Hadamard-rotated (`W H`, PN tensors in a rotated file): the
    /// graph feeds such a matrix rotated activations; `embed` un-rotates gathered rows.
    pub rotated: bool,
    /// Rotation block size when `rotated`.
    pub rotation_block: usize,
    /// The file `bytes` points into, so a backend can keep it alive and read the bytes in place.
    pub file: Option<&'a Arc<GgufFile>>,
}

/// What a model (and, once a state is made, its KV caches) asks of a backend: the shapes its
/// kernels must take and the cache storage types. [`Backend::supports`] checks it before any
/// buffer is allocated, so a limit of the backend is a load-time error naming it, never a
/// failed op in the middle of a forward pass (as ggml's `supports_op`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Requirements {
    /// Head dim of the full-attention layers (q, k and v).
    pub attn_head_dim: usize,
    /// Query heads of the full-attention layers.
    pub n_q_heads: usize,
    /// Key/value heads of the full-attention layers.
    pub n_kv_heads: usize,
    /// Shape of the Gated DeltaNet layers (head dims, conv kernel).
    pub gdn: GdnDims,
    /// K and V cache storage types, once a state is asked for (`None`: binding weights only).
    pub kv: Option<(KvCacheType, KvCacheType)>,
}

impl Requirements {
    /// What the model `config` asks of a backend, without a KV cache.
    pub fn model(config: &ModelConfig) -> Requirements {
        Requirements {
            attn_head_dim: config.head_dim,
            n_q_heads: config.n_q_heads,
            n_kv_heads: config.n_kv_heads,
            gdn: config.gdn,
            kv: None,
        }
    }

    /// These requirements plus K and V caches of types `k` and `v`.
    pub fn with_kv(self, k: KvCacheType, v: KvCacheType) -> Requirements {
        Requirements {
            kv: Some((k, v)),
            ..self
        }
    }
}

/// A limit of a backend that a model or state asks past ([`Backend::supports`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Unsupported {
    /// A kernel is written for one size of a dimension and the model has another.
    #[error("{backend} {op} kernels take {what} {supported}, the model has {found}")]
    Shape {
        /// The backend's name.
        backend: String,
        /// The op family (`attention`, `gated delta rule`, `conv1d`).
        op: &'static str,
        /// The dimension (`head_dim`, `key head dim`...).
        what: &'static str,
        /// The size the kernels take.
        supported: usize,
        /// The model's size.
        found: usize,
    },
    /// A KV cache storage type the backend cannot store.
    #[error("KV cache type {ty} not supported by backend {backend} (supported: {})", names(.supported))]
    KvType {
        /// The backend's name.
        backend: String,
        /// The type asked for.
        ty: KvCacheType,
        /// The types the backend stores.
        supported: Vec<KvCacheType>,
    },
    /// K and V caches of different types on a backend whose attention reads one type for both.
    #[error("backend {backend} needs K and V caches of one type, asked for K {k} and V {v}")]
    MixedKvTypes {
        /// The backend's name.
        backend: String,
        /// The K cache type asked for.
        k: KvCacheType,
        /// The V cache type asked for.
        v: KvCacheType,
    },
}

/// `f32, f16, ...`
fn names(types: &[KvCacheType]) -> String {
    types
        .iter()
        .map(|t| t.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The ops the forward graph needs. Implementations must give results equal to the CPU
/// reference up to f32 rounding.
///
/// Every op returns a `Result`: a device backend reports a failed launch or copy where it
/// happens, and the graph propagates it with `?`. Limits a backend has on shapes and storage
/// types are declared up front by [`Backend::supports`].
pub trait Backend: Send + Sync {
    /// An f32 buffer resident where the backend computes.
    type Buf: Send;
    /// A weight matrix resident where the backend computes, in its stored format.
    type Weight: Send + Sync;
    /// A KV cache buffer (elements of one [`KvCacheType`]).
    type KvBuf: Send;

    /// A short human-readable name ("cpu (2 threads)").
    fn name(&self) -> String;

    /// Whether this backend can run a model asking for `req` (head sizes, KV cache types), or
    /// the limit it asks past. Called when a model is bound and when a state is made, before
    /// anything is allocated. The default accepts everything.
    fn supports(&self, req: &Requirements) -> Result<(), Unsupported> {
        let _ = req;
        Ok(())
    }

    /// A zero-filled buffer of `len` floats.
    fn alloc(&self, len: usize) -> Result<Self::Buf, ModelError>;
    /// As [`Backend::alloc`], for a buffer every pass reads and writes in full (the recurrent
    /// state): a backend whose `alloc` commits memory lazily may commit this one now. The
    /// default is `alloc`.
    fn alloc_dense(&self, len: usize) -> Result<Self::Buf, ModelError> {
        self.alloc(len)
    }
    /// Writes `src` into `dst[offset..offset + src.len()]`.
    fn upload(&self, src: &[f32], dst: &mut Self::Buf, offset: usize) -> Result<(), ModelError>;
    /// Reads `dst.len()` floats from `src[offset..]` (after every enqueued op).
    fn download(&self, src: &Self::Buf, offset: usize, dst: &mut [f32]) -> Result<(), ModelError>;
    /// The `k` best `(id, logit)` of the row `src[offset..offset + n]` into `out` (cleared
    /// first), in the sampler's order ([`crate::topk::top_k_row`]: finite values only, higher
    /// first, ties to the lower id): what decoding needs instead of the whole row (greedy:
    /// `k = 1`). The default downloads the row and selects on the host; a device backend
    /// overrides it to download only the `k` pairs.
    fn top_k(
        &self,
        src: &Self::Buf,
        offset: usize,
        n: usize,
        k: usize,
        out: &mut Vec<(u32, f32)>,
    ) -> Result<(), ModelError> {
        let mut row = vec![0f32; n];
        self.download(src, offset, &mut row)?;
        *out = crate::topk::top_k_row(&row, k);
        Ok(())
    }
    /// Whether downloading a logits row costs enough that decoding should select on the
    /// backend ([`top_k`](Self::top_k)) and download the whole row only where a sampling
    /// stage reads it. The default (host memory: the row is already at hand) says no.
    fn prefers_top_k(&self) -> bool {
        false
    }
    /// Copies `len` floats `src[src_off..]` -> `dst[dst_off..]`.
    fn copy(
        &self,
        src: &Self::Buf,
        src_off: usize,
        dst: &mut Self::Buf,
        dst_off: usize,
        len: usize,
    ) -> Result<(), ModelError>;
    /// Sets the first `len` floats to zero.
    fn zero(&self, buf: &mut Self::Buf, len: usize) -> Result<(), ModelError>;

    /// A zero-filled KV cache buffer of `len` elements of type `ty` (`len` a multiple of the
    /// type's block length).
    fn alloc_kv(&self, len: usize, ty: KvCacheType) -> Result<Self::KvBuf, ModelError>;
    /// Writes `len` floats of `src` into the cache at element `dst_off` (converting). For a
    /// block-quantized cache `dst_off` and `len` are multiples of the block length.
    fn kv_write(
        &self,
        src: &Self::Buf,
        dst: &mut Self::KvBuf,
        dst_off: usize,
        len: usize,
    ) -> Result<(), ModelError>;

    /// Makes a weight matrix resident (zero copy where possible).
    fn load_weight(&self, src: &WeightSource<'_>) -> Result<Self::Weight, ModelError>;

    /// Gathers rows `tokens[i]` of the embedding matrix into row `i` of `out` (dequantized to
    /// f32; un-rotated if the table is stored rotated). Token ids must already be checked.
    fn embed(
        &self,
        table: &Self::Weight,
        tokens: &[u32],
        out: &mut Self::Buf,
    ) -> Result<(), ModelError>;

    /// For each `(w, y)`: `y[t] = w x[t]` for the first `rows` rows of `x` (row length =
    /// `w`'s K). All outputs share the input, so a backend prepares (converts, quantizes) the
    /// activations once.
    fn matmul(
        &self,
        x: &Self::Buf,
        rows: usize,
        outs: &mut [(&Self::Weight, &mut Self::Buf)],
    ) -> Result<(), ModelError>;

    /// Which rows of the matrix products that follow, until the next call, only feed their
    /// sequence's state (`state_only[t]` for row `t`: prompt rows whose logits nobody reads).
    /// A backend may multiply those at a faster, lower activation precision (the CPU's int8
    /// tiles); the decision follows each row's role, so a sequence's numerics do not depend on
    /// the rows it shares a pass with. A product of another row count takes every row at full
    /// precision. The default ignores it. (An iterator, not a slice: a decode step must not
    /// allocate, and the backend keeps the flags in a buffer it reuses.)
    fn set_state_rows(&self, state_only: &mut dyn Iterator<Item = bool>) {
        let _ = state_only;
    }

    /// In-place Walsh-Hadamard rotation of `len` floats in blocks of `block` (orthonormal).
    fn hadamard(&self, x: &mut Self::Buf, len: usize, block: usize) -> Result<(), ModelError>;

    /// RMSNorm of each `n`-float row of the first `rows` rows: `out = x / rms(x) * w`.
    fn rms_norm(
        &self,
        x: &Self::Buf,
        w: &Self::Buf,
        out: &mut Self::Buf,
        rows: usize,
        n: usize,
        eps: f32,
    ) -> Result<(), ModelError>;
    /// In-place RMSNorm of `count` rows of `n` floats spaced `stride` apart (per-head q/k norm).
    fn rms_norm_strided(
        &self,
        x: &mut Self::Buf,
        w: &Self::Buf,
        n: usize,
        stride: usize,
        count: usize,
        eps: f32,
    ) -> Result<(), ModelError>;
    /// Gated RMSNorm in place: each `n`-float row `x = rms(x) * w * silu(z)`, over `len` floats.
    fn gated_rms_norm(
        &self,
        x: &mut Self::Buf,
        z: &Self::Buf,
        w: &Self::Buf,
        len: usize,
        n: usize,
        eps: f32,
    ) -> Result<(), ModelError>;

    /// NeoX partial RoPE in place for `n_tokens` tokens at positions `pos0..`.
    fn rope(
        &self,
        x: &mut Self::Buf,
        layout: &RopeLayout,
        n_tokens: usize,
        pos0: usize,
        theta: f32,
    ) -> Result<(), ModelError>;

    /// Causal GQA attention of the query tokens at sequence positions `positions` (rows of
    /// `q`, `[positions.len(), ..]` laid out as `layout` says) against the caches, which
    /// already hold positions `0..positions.end`; output `[positions.len(), Hq * head_dim]`.
    fn attention(
        &self,
        q: &Self::Buf,
        k_cache: &Self::KvBuf,
        v_cache: &Self::KvBuf,
        out: &mut Self::Buf,
        layout: &AttnLayout,
        positions: std::ops::Range<usize>,
    ) -> Result<(), ModelError>;
    /// `x[t, h, :] *= sigmoid(gate[g.offset + t * g.token_stride + h * g.head_stride ..])` for
    /// the `n_tokens` rows of `x` (`[n_tokens, n_heads * head_dim]`), `g` the gate layout.
    fn sigmoid_gate(
        &self,
        x: &mut Self::Buf,
        gate: &Self::Buf,
        g: &GateLayout,
        n_tokens: usize,
    ) -> Result<(), ModelError>;

    /// Causal depthwise conv1d + SiLU over `n_tokens` rows of `u` (`[n_tokens, channels]`,
    /// weights `w` `[channels, kernel]`) into `y`, with the conv state (the last `kernel - 1`
    /// pre-conv rows, `[kernel - 1, channels]`) read and updated.
    fn conv1d_silu(
        &self,
        u: &Self::Buf,
        w: &Self::Buf,
        state: &mut Self::Buf,
        y: &mut Self::Buf,
        shape: ConvShape,
        n_tokens: usize,
    ) -> Result<(), ModelError>;

    /// The Gated DeltaNet core for `args.n_tokens` tokens: L2-normalises q/k of `args.y` (and
    /// scales q; in place or inside the kernel: `y` is unspecified afterwards), turns `b`/`alpha` into beta and log-decay in place, runs the gated
    /// delta rule over the recurrent state and writes `out` (`[n_tokens, Hv * dv]`). Backends
    /// may use the chunked form for long inputs; it must match the recurrent one.
    fn gated_delta_rule(&self, args: GdnArgs<'_, Self::Buf>) -> Result<(), ModelError>;

    /// [`Backend::gated_delta_rule`] that also records the recurrent state after each of the
    /// `n_tokens` rows into `trace.states` (row `t`'s state at float `(trace.row0 + t) *
    /// dims.state_len()`), for rolling a speculative verification back to any accepted prefix
    /// without re-running it. `out` and the final `state` are as for `gated_delta_rule`; the
    /// contents of `y`, `b` and `alpha` afterwards are unspecified.
    ///
    /// Every recorded state must have the bits a one-row `gated_delta_rule` call per token
    /// gives (what plain decoding computes), so the default runs the rows one at a time
    /// through `trace.scratch` (each buffer sized for one row, see [`GdnRowScratch::new`]); a
    /// backend overrides it only where its batched kernel has those bits.
    fn gated_delta_rule_traced(
        &self,
        args: GdnArgs<'_, Self::Buf>,
        trace: GdnTrace<'_, Self::Buf>,
    ) -> Result<(), ModelError> {
        gdn_traced_by_rows(self, args, trace)
    }

    /// `gate = silu(gate) * up` over `len` floats.
    fn swiglu(&self, gate: &mut Self::Buf, up: &Self::Buf, len: usize) -> Result<(), ModelError>;
    /// `x += y` over `len` floats.
    fn add(&self, x: &mut Self::Buf, y: &Self::Buf, len: usize) -> Result<(), ModelError>;

    /// RMSNorm of the first `rows` rows of `n` floats, then the block-diagonal Walsh-Hadamard
    /// rotation (blocks of `block`, `n` a multiple of it) of the `rows * n` results:
    /// `out = H(x / rms(x) * w)`, the rotated input of PN matrices for callers that do not need
    /// the unrotated norm output. The default is [`Backend::rms_norm`] then
    /// [`Backend::hadamard`] (so its bits are theirs); a backend overrides it with one fused
    /// kernel (one launch and one trip through memory less).
    #[allow(clippy::too_many_arguments)]
    fn rms_norm_hadamard(
        &self,
        x: &Self::Buf,
        w: &Self::Buf,
        out: &mut Self::Buf,
        rows: usize,
        n: usize,
        eps: f32,
        block: usize,
    ) -> Result<(), ModelError> {
        self.rms_norm(x, w, out, rows, n, eps)?;
        self.hadamard(out, rows * n, block)
    }

    /// `out = H(silu(gate) * up)` over `len` floats (`len` a multiple of `block`), the rotated
    /// input of a PN `ffn_down`; `gate` is left unchanged. The default copies `gate` to `out`,
    /// then runs [`Backend::swiglu`] and [`Backend::hadamard`] on `out` (the bits of the
    /// in-place `swiglu` followed by a rotated copy); a backend overrides it with one fused
    /// kernel.
    fn swiglu_hadamard(
        &self,
        gate: &Self::Buf,
        up: &Self::Buf,
        out: &mut Self::Buf,
        len: usize,
        block: usize,
    ) -> Result<(), ModelError> {
        self.copy(gate, 0, out, 0, len)?;
        self.swiglu(out, up, len)?;
        self.hadamard(out, len, block)
    }

    /// A block's input norm and the matrices reading it, in one op: `x` (after `x += add` for
    /// [`crate::NormIn::AddFirst`]: the residual add fused into the norm that follows it)
    /// through RMSNorm, then for `rot` the rotation into `rot.buf` (as
    /// [`Backend::rms_norm_hadamard`]: the input of PN matrices) and for `plain` the unrotated
    /// rows into `plain.buf` (as [`Backend::rms_norm`]: stock matrices, the hidden-state
    /// output), each followed by `y = buf W^T` for its matrices. The default is those ops in
    /// sequence ([`crate::fused::norm_matmul_default`]); a backend overrides it to write the
    /// sum, both forms of the rows and the PN matrices' converted input in one kernel.
    fn norm_matmul(
        &self,
        x: crate::NormIn<'_, Self::Buf>,
        norm: &crate::NormRot<'_, Self::Buf>,
        rot: Option<crate::NormDest<'_, '_, Self::Buf, Self::Weight>>,
        plain: Option<crate::NormDest<'_, '_, Self::Buf, Self::Weight>>,
    ) -> Result<(), ModelError> {
        crate::fused::norm_matmul_default(self, x, norm, rot, plain)
    }

    /// [`Backend::swiglu_hadamard`] of `s` into `out`, then `y = out W^T` for every `(W, y)`
    /// of `outs`. The default is the two ops ([`crate::fused::swiglu_hadamard_matmul_default`]);
    /// a backend overrides it to write its matrices' converted input in the same kernel.
    fn swiglu_hadamard_matmul(
        &self,
        s: &crate::SwigluRot<'_, Self::Buf>,
        out: &mut Self::Buf,
        outs: &mut [(&Self::Weight, &mut Self::Buf)],
    ) -> Result<(), ModelError> {
        crate::fused::swiglu_hadamard_matmul_default(self, s, out, outs)
    }

    /// Per-head RMSNorm then NeoX RoPE of the q and k heads of `a`, in place (the attention's
    /// q/k preparation, [`QkNormRope`]). The default is `rms_norm_strided` and `rope` of each;
    /// a backend overrides it with one kernel (four launches less three).
    fn qk_norm_rope(&self, a: QkNormRope<'_, Self::Buf>) -> Result<(), ModelError> {
        mixer_ops::qk_norm_rope(self, a)
    }

    /// [`Backend::kv_write`] of `len` floats of `k` into `k_cache` and of `v` into `v_cache`,
    /// both at element `dst_off`; the default is the two writes, a backend overrides it with
    /// one launch.
    fn kv_write_pair(
        &self,
        (k, v): (&Self::Buf, &Self::Buf),
        (k_cache, v_cache): (&mut Self::KvBuf, &mut Self::KvBuf),
        dst_off: usize,
        len: usize,
    ) -> Result<(), ModelError> {
        self.kv_write(k, k_cache, dst_off, len)?;
        self.kv_write(v, v_cache, dst_off, len)
    }

    /// `o.out = H(x * sigmoid(gate))` over the `n_tokens` rows of `x` (gate layout `g`, as
    /// [`Backend::sigmoid_gate`]), rotated in blocks of `o.block`: the rotated input of a PN
    /// o-projection. `x` is unspecified afterwards. The default is `sigmoid_gate` in place, a
    /// copy and `hadamard` (their bits); a backend overrides it with one kernel.
    fn sigmoid_gate_hadamard(
        &self,
        (x, gate, g): (&mut Self::Buf, &Self::Buf, &GateLayout),
        n_tokens: usize,
        o: RotatedOut<'_, Self::Buf>,
    ) -> Result<(), ModelError> {
        mixer_ops::sigmoid_gate_hadamard(self, (x, gate, g), n_tokens, o)
    }

    /// [`Backend::attention`] then [`Backend::sigmoid_gate_hadamard`] of its output into
    /// `o.out` (the rotated input of a PN o-projection). The default is the two ops (their
    /// bits); a backend overrides it by merging the attention's splits, the gate and the
    /// rotation in one kernel.
    fn attention_gate_hadamard(
        &self,
        a: AttnGateRot<'_, Self>,
        o: RotatedOut<'_, Self::Buf>,
    ) -> Result<(), ModelError> {
        mixer_ops::attention_gate_hadamard(self, a, o)
    }

    /// `out = H(rms(x) * w * silu(z))` per row of `s.n` over `s.len` floats, rotated in blocks
    /// of `s.block`: the rotated input of a PN ssm_out. `x` is unspecified afterwards. The
    /// default is `gated_rms_norm` in place, a copy and `hadamard` (their bits); a backend
    /// overrides it with one kernel.
    fn gated_rms_norm_hadamard(
        &self,
        (x, z, w): (&mut Self::Buf, &Self::Buf, &Self::Buf),
        out: &mut Self::Buf,
        s: GatedNormShape,
    ) -> Result<(), ModelError> {
        mixer_ops::gated_rms_norm_hadamard(self, (x, z, w), out, s)
    }

    /// `src`'s rotated output into `o.out`, then `y = o.out W^T` for every `(W, y)` of `outs`
    /// over `rows` rows ([`MixerOut`]); the default is the two ops, a backend overrides it so
    /// the producer also writes its matrices' converted input.
    fn mixer_out_matmul(
        &self,
        src: MixerOut<'_, Self>,
        o: RotatedOut<'_, Self::Buf>,
        rows: usize,
        outs: &mut [(&Self::Weight, &mut Self::Buf)],
    ) -> Result<(), ModelError> {
        mixer_proj::mixer_out_matmul(self, src, o, rows, outs)
    }

    /// [`Backend::conv1d_silu`] of `c` into `args.y`, then [`Backend::gated_delta_rule`] of
    /// `args` (the default, [`ConvIn`]); a backend overrides it with one kernel for decode
    /// (`args.y` then holds the conv output with its q/k heads not normalised).
    fn conv_gated_delta_rule(
        &self,
        c: ConvIn<'_, Self::Buf>,
        args: GdnArgs<'_, Self::Buf>,
    ) -> Result<(), ModelError> {
        mixer_proj::conv_gated_delta_rule(self, c, args)
    }
}

/// The trait default of [`Backend::gated_delta_rule_traced`]: the rows one at a time through
/// one-row [`Backend::gated_delta_rule`] calls in `trace.scratch`, the state copied into the
/// trace after each. Public so a backend that overrides the op (or a test wrapper) can still
/// run or compare against it.
pub fn gdn_traced_by_rows<B: Backend + ?Sized>(
    be: &B,
    args: GdnArgs<'_, B::Buf>,
    trace: GdnTrace<'_, B::Buf>,
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
    let GdnTrace {
        states,
        row0,
        scratch,
    } = trace;
    let (cd, hv, vd, sl) = (
        dims.conv_dim(),
        dims.n_v_heads,
        dims.value_dim(),
        dims.state_len(),
    );
    for t in 0..n_tokens {
        be.copy(y, t * cd, &mut scratch.y, 0, cd)?;
        be.copy(b, t * hv, &mut scratch.b, 0, hv)?;
        be.copy(alpha, t * hv, &mut scratch.alpha, 0, hv)?;
        be.gated_delta_rule(GdnArgs {
            dims,
            n_tokens: 1,
            y: &mut scratch.y,
            b: &mut scratch.b,
            alpha: &mut scratch.alpha,
            a,
            dt_bias,
            state: &mut *state,
            out: &mut scratch.out,
        })?;
        be.copy(&scratch.out, 0, out, t * vd, vd)?;
        be.copy(state, 0, states, (row0 + t) * sl, sl)?;
    }
    Ok(())
}
