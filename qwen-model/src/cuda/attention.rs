//! Causal GQA attention over the device KV caches: the split-K kernels for decode and short
//! inputs, the tiled prefill kernel for prefill chunks ([`attn_tiled`](super::attn_tiled)).

use super::kv::with_kv_pair;
use super::shape_error;
use super::{
    attn_tiled, lock, view, view_mut, CudaBackend, CudaBuf, CudaError, CudaKv, ATTN_SCRATCH_FLOATS,
    HEAD_DIM, PN_H2_MAX_K, SYNC_WORDS,
};
use crate::AttnLayout;
use pn_kernels::cudarc::driver::{CudaSlice, CudaView, CudaViewMut};
use pn_kernels::launch::PN_BATCH_MAX_T;
use pn_kernels::{AttnShape, GateRotation, Gpu, KvElem, KvLayout, PreparedOut, RowPrepOut, SplitK};
use std::ops::Range;

/// Positions per attention split for decode (split-K over long contexts).
const ATTN_CHUNK: usize = 256;

/// The kernel of one attention call: split-K in chunks of `chunk` positions over `scratch`
/// (decode, short inputs), or the tiled prefill kernel.
enum Kernel<'s, 'b> {
    SplitK {
        chunk: usize,
        scratch: &'s mut CudaViewMut<'b, f32>,
        /// Where the fused merge also writes its rows' fp16 copy.
        prep: Option<RowPrepOut<'s, 'b>>,
    },
    Tiled,
}

/// Where one attention call's output goes: as is, or gated and rotated by the fused merge.
enum Merge<'o, 'b> {
    /// Output rows `[n_tokens, Hq * 256]`.
    Plain(&'o mut CudaViewMut<'b, f32>),
    /// `out = H(o * sigmoid(g))` laid out as `gr`; with `prep`, also its fp16 copy into the
    /// backend's prepared-input scratch (the o-projection's input, rows of `Hq * 256`).
    GateRot {
        gr: GateRotation,
        g: &'o CudaView<'b, f32>,
        out: &'o mut CudaViewMut<'b, f32>,
        prep: bool,
    },
}

/// The type-independent arguments of one attention call.
struct AttnCall<'a, 'q> {
    q: &'a CudaView<'q, f32>,
    l: &'a AttnLayout,
    /// Positions each cache holds.
    cap: usize,
    /// Positions of the query tokens.
    positions: Range<usize>,
}

impl AttnCall<'_, '_> {
    /// The kernels' geometry of this call over caches laid out as `kv`: output rows of
    /// `n_q_heads` heads of 256 per token.
    fn shape(&self, kv: KvLayout) -> AttnShape {
        let l = self.l;
        AttnShape {
            kv,
            n_head: l.n_q_heads,
            p0: self.positions.start,
            t_len: self.positions.len(),
            scale: l.scale,
            q_tok_stride: l.q_token_stride,
            q_head_stride: l.q_head_stride,
            o_tok_stride: l.n_q_heads * HEAD_DIM,
        }
    }
}

/// Whether [`CudaBackend::try_attention_gate_hadamard`] runs `n_tokens` queries of layout `l`
/// as the split-K partials and one merge fused with the gate and rotation `gr` (decode lengths,
/// gate rows laid out as the attention output's heads); else the caller's default. The launch
/// counter asks the same.
pub(crate) fn attn_gate_fuses(l: &AttnLayout, n_tokens: usize, gr: &GateRotation) -> bool {
    attention_fuses(n_tokens, l.n_q_heads, gr)
}

impl CudaBackend {
    /// Attention of the query tokens at `positions` (rows of `q` laid out as `l`) against the
    /// caches, which already hold positions `0..positions.end`; output `[n_tokens, Hq * 256]`.
    pub(super) fn try_attention(
        &self,
        q: &CudaBuf,
        (k_cache, v_cache): (&CudaKv, &CudaKv),
        out: &mut CudaBuf,
        l: &AttnLayout,
        positions: Range<usize>,
    ) -> Result<(), CudaError> {
        let o_len = positions.len() * l.n_q_heads * HEAD_DIM;
        let mut ov = view_mut("attention", out, 0, o_len)?;
        self.attention_into(q, (k_cache, v_cache), l, positions, Merge::Plain(&mut ov))
    }

    /// [`CudaBackend::try_attention`] with the merge of the splits also gating and rotating
    /// the output into `out` (`out = H(attention * sigmoid(gate))`, laid out as `gr`); `None`
    /// (nothing launched) where the call takes the tiled kernel or `gr` does not fit. With
    /// `prep` the merge also writes the fp16 copy of the output rows into the prepared-input
    /// scratch ([`attention_preps`] must hold).
    pub(super) fn try_attention_gate_hadamard(
        &self,
        (q, k_cache, v_cache): (&CudaBuf, &CudaKv, &CudaKv),
        (l, positions): (&AttnLayout, Range<usize>),
        (gate, gate_offset, gr): (&CudaBuf, usize, GateRotation),
        (out, prep): (&mut CudaBuf, bool),
    ) -> Result<Option<()>, CudaError> {
        const OP: &str = "attention_gate_hadamard";
        let n_tokens = positions.len();
        if !attention_fuses(n_tokens, l.n_q_heads, &gr) {
            return Ok(None);
        }
        if prep && !attention_preps(n_tokens, l.n_q_heads, &gr) {
            return Err(shape_error(OP, format!("no fp16 copy for {gr:?}")));
        }
        let gv = view(OP, gate, gate_offset, gr.gate_len())?;
        let mut ov = view_mut(OP, out, 0, gr.len)?;
        let merge = Merge::GateRot {
            gr,
            g: &gv,
            out: &mut ov,
            prep,
        };
        self.attention_into(q, (k_cache, v_cache), l, positions, merge)?;
        Ok(Some(()))
    }

    /// The attention call with its output merged as `merge` says.
    fn attention_into(
        &self,
        q: &CudaBuf,
        (k_cache, v_cache): (&CudaKv, &CudaKv),
        l: &AttnLayout,
        positions: Range<usize>,
        merge: Merge<'_, '_>,
    ) -> Result<(), CudaError> {
        const OP: &str = "attention";
        // Backend::supports refuses any other head dim at model bind.
        if l.head_dim != HEAD_DIM || l.n_kv_heads == 0 {
            return Err(shape_error(
                OP,
                format!("the kernels take head_dim {HEAD_DIM} and 1+ kv heads, got {l:?}"),
            ));
        }
        let n_tokens = positions.len();
        if n_tokens == 0 {
            return Ok(());
        }
        let row = l.n_kv_heads * HEAD_DIM;
        let cap = k_cache.len() / row;
        let q_len =
            (n_tokens - 1) * l.q_token_stride + (l.n_q_heads - 1) * l.q_head_stride + HEAD_DIM;
        let qv = view(OP, q, 0, q_len)?;
        let n_ctx = positions.end;
        let a = AttnCall {
            q: &qv,
            l,
            cap,
            positions,
        };
        let want_prep = matches!(merge, Merge::GateRot { prep: true, .. });
        let mut guard;
        let mut scr;
        let (mut xhm, mut em, mut syn);
        let kernel = if attn_tiled(n_tokens) {
            Kernel::Tiled
        } else {
            // Bounded scratch: long prefill chunks use fewer, longer splits.
            let per_split = n_tokens * l.n_q_heads * (HEAD_DIM + 2);
            let max_split = (ATTN_SCRATCH_FLOATS / per_split.max(1)).max(1);
            let n_split = n_ctx.div_ceil(ATTN_CHUNK).clamp(1, max_split);
            let chunk = n_ctx.div_ceil(n_split);
            let n_split = n_ctx.div_ceil(chunk);
            let need = Gpu::attention_scratch_len(n_tokens, l.n_q_heads, n_split);
            guard = lock(&self.scratch);
            let sc = &mut *guard;
            let s = self.grow(&mut sc.attn, need, "attention scratch")?;
            scr = s.slice_mut(0..need);
            let prep = if want_prep {
                // The o-projection's prepared input: rows of Hq * 256 into the scratch the
                // matmul reads ([`CudaBackend::try_matmul_from`] with `have_prepared`).
                let (rows, row_len) = (n_tokens, l.n_q_heads * HEAD_DIM);
                let xh = self.grow(
                    &mut sc.xh,
                    PN_H2_MAX_K.max(rows * row_len),
                    "fp16 activations",
                )?;
                let e = self.grow(&mut sc.e, PN_BATCH_MAX_T, "activation exponents")?;
                let sy = self.grow(&mut sc.sync, SYNC_WORDS, "cross-block sync words")?;
                xhm = xh.slice_mut(0..rows * row_len);
                em = e.slice_mut(0..rows);
                syn = sy.slice_mut(0..2 * rows);
                Some(RowPrepOut {
                    prep: PreparedOut {
                        xh: &mut xhm,
                        e: &mut em,
                    },
                    sync: &mut syn,
                    row_len,
                })
            } else {
                None
            };
            Kernel::SplitK {
                chunk,
                scratch: &mut scr,
                prep,
            }
        };
        with_kv_pair!(
            k_cache,
            v_cache,
            |kc, vc| self.attend(&a, (kc, vc), merge, kernel),
            |k, v| Err(CudaError::Unsupported {
                op: OP,
                what: format!(
                    "a {} k cache with a {} v cache (the attention kernels read one type for both)",
                    k.kv_type(),
                    v.kv_type()
                ),
            })
        )
    }

    /// The attention kernel `kernel` over caches of element type `T`.
    fn attend<T: KvElem>(
        &self,
        a: &AttnCall<'_, '_>,
        (kc, vc): (&CudaSlice<T>, &CudaSlice<T>),
        merge: Merge<'_, '_>,
        kernel: Kernel<'_, '_>,
    ) -> Result<(), CudaError> {
        let kl = KvLayout::token_major::<T>(a.l.n_kv_heads, a.cap);
        let sh = a.shape(kl);
        let (kc, vc) = (kc.slice(..), vc.slice(..));
        match (kernel, merge) {
            (Kernel::Tiled, Merge::Plain(ov)) => {
                self.gpu.attention_prefill(&sh, a.q, &kc, &vc, ov)?
            }
            (Kernel::SplitK { chunk, scratch, .. }, Merge::Plain(ov)) => {
                let split = SplitK { chunk, scratch };
                self.gpu.attention(&sh, a.q, &kc, &vc, ov, split)?
            }
            (
                Kernel::SplitK {
                    chunk,
                    scratch,
                    prep,
                },
                Merge::GateRot { gr, g, out, .. },
            ) => {
                let split = SplitK { chunk, scratch };
                let (q, caches) = ((&sh, a.q), (&kc, &vc));
                self.gpu
                    .attention_gate_hadamard_prep(q, caches, split, (&gr, g), (out, prep))?
            }
            (Kernel::Tiled, Merge::GateRot { .. }) => {
                // try_attention_gate_hadamard never asks for this.
                return Err(shape_error(
                    "attention_gate_hadamard",
                    "the tiled prefill kernel has no fused merge".into(),
                ));
            }
        }
        Ok(())
    }
}

/// Whether the split-K attention of `n_tokens` query rows of `n_q_heads` merges its splits
/// with the gate and rotation `gr` in one kernel ([`CudaBackend::try_attention_gate_hadamard`];
/// also what [`super::LaunchCounter`] counts with).
pub(crate) fn attention_fuses(n_tokens: usize, n_q_heads: usize, gr: &GateRotation) -> bool {
    let contiguous = gr.len == n_tokens * n_q_heads * HEAD_DIM && gr.n_heads == n_q_heads;
    n_tokens > 0 && !attn_tiled(n_tokens) && gr.refusal().is_none() && contiguous
}

/// Whether that fused merge can also write the fp16 copy of its rows (`n_q_heads * 256`
/// values, whole rotation blocks; at most the small-batch rows the prepared kernels read).
pub(crate) fn attention_preps(n_tokens: usize, n_q_heads: usize, gr: &GateRotation) -> bool {
    attention_fuses(n_tokens, n_q_heads, gr)
        && n_tokens <= PN_BATCH_MAX_T
        && (n_q_heads * HEAD_DIM).is_multiple_of(gr.block)
}
