//! Split-K decode attention over the KV caches (`kernels/attention.cu`: `attn_partial_*kv`
//! per cache type, then `attn_combine`), and the geometry both attention wrappers share.

use super::{drv, Gpu, KvElem, KvLayout};
use crate::error::{check, KernelError};
use cudarc::driver::{CudaView, CudaViewMut, LaunchArgs, LaunchConfig, PushKernelArg};

/// Geometry of one causal GQA attention call, head_dim 256: `t_len` queries at positions
/// `p0..p0 + t_len` over caches laid out as `kv` that already hold positions `0..p0 + t_len`.
/// Query `t` head `h` is at `q[t*q_tok_stride + h*q_head_stride ..][..256]`; its output at
/// `o[t*o_tok_stride + h*256 ..][..256]` (strides in floats).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnShape {
    /// Where the caches keep each kv head's rows.
    pub kv: KvLayout,
    /// Query heads (a multiple of `kv.n_kv`; head `h` reads kv head `h / (n_head / n_kv)`).
    pub n_head: usize,
    /// Position of the first query.
    pub p0: usize,
    /// Queries (at least 1).
    pub t_len: usize,
    /// Score scale (usually `1/sqrt(256)`).
    pub scale: f32,
    /// Floats between query tokens.
    pub q_tok_stride: usize,
    /// Floats between query heads of one token.
    pub q_head_stride: usize,
    /// Floats between output tokens (each holds `n_head` rows of 256).
    pub o_tok_stride: usize,
}

/// How [`Gpu::attention`] splits the context: chunks of `chunk` positions, each reduced
/// separately into `scratch` ([`Gpu::attention_scratch_len`] floats), then merged.
#[derive(Debug)]
pub struct SplitK<'a, 'b> {
    /// Positions per split (at least 1).
    pub chunk: usize,
    /// Partial outputs and (max, sum) pairs of every split.
    pub scratch: &'a mut CudaViewMut<'b, f32>,
}

/// The leading kernel arguments both attention kernels take, in their integer widths:
/// `(q, q_tok_stride, q_head_stride, kc, vc, pos_stride, head_stride, group, p0)`.
pub(super) struct AttnArgs {
    qts: i64,
    qhs: i64,
    ps: i64,
    hs: i64,
    group: i32,
    p0: i32,
}

impl AttnArgs {
    pub(super) fn new(s: &AttnShape) -> AttnArgs {
        AttnArgs {
            qts: s.q_tok_stride as i64,
            qhs: s.q_head_stride as i64,
            ps: s.kv.pos_stride as i64,
            hs: s.kv.head_stride as i64,
            group: (s.n_head / s.kv.n_kv) as i32,
            p0: s.p0 as i32,
        }
    }

    /// Pushes the shared leading arguments onto `b`.
    pub(super) fn push<'a, T: KvElem>(
        &'a self,
        b: &mut LaunchArgs<'a>,
        q: &'a CudaView<'_, f32>,
        kc: &'a CudaView<'_, T>,
        vc: &'a CudaView<'_, T>,
    ) {
        b.arg(q)
            .arg(&self.qts)
            .arg(&self.qhs)
            .arg(kc)
            .arg(vc)
            .arg(&self.ps)
            .arg(&self.hs)
            .arg(&self.group)
            .arg(&self.p0);
    }
}

impl AttnShape {
    /// Whether `gr` is a rotation the fused merge takes of this call's output: heads of 256,
    /// one per query head, all `t_len` tokens, contiguous (`o_tok_stride` = `n_head * 256`).
    pub(super) fn refusal_free(&self, gr: &crate::GateRotation) -> bool {
        gr.refusal().is_none()
            && gr.head_dim == 256
            && gr.n_heads == self.n_head
            && gr.len == self.t_len * self.n_head * 256
            && self.o_tok_stride == self.n_head * 256
    }
}

impl Gpu {
    /// Checks an attention call: head grouping, context within the caches, q and o lengths.
    pub(super) fn check_attention<T: KvElem>(
        &self,
        op: &'static str,
        s: &AttnShape,
        q_len: usize,
        kc: &CudaView<'_, T>,
        vc: &CudaView<'_, T>,
        o_len: usize,
    ) -> Result<(), KernelError> {
        let (kv, n_head, t_len) = (&s.kv, s.n_head, s.t_len);
        check(
            n_head.is_multiple_of(kv.n_kv.max(1)) && n_head > 0 && t_len > 0,
            op,
            || format!("n_head {n_head}, n_kv {}, t {t_len}", kv.n_kv),
        )?;
        let n_ctx = s.p0 + t_len;
        check(n_ctx <= kv.cap && n_ctx <= i32::MAX as usize, op, || {
            format!("context {n_ctx} exceeds the cache capacity {}", kv.cap)
        })?;
        self.check_cache(op, kc, vc, kv)?;
        check(
            q_len >= (t_len - 1) * s.q_tok_stride + (n_head - 1) * s.q_head_stride + 256,
            op,
            || format!("q has {q_len} elements"),
        )?;
        check(
            o_len >= (t_len - 1) * s.o_tok_stride + n_head * 256,
            op,
            || format!("o has {o_len} elements"),
        )
    }

    /// Scratch floats [`Gpu::attention`] needs for `t_len` queries, `n_head` heads, `n_split` splits.
    pub fn attention_scratch_len(t_len: usize, n_head: usize, n_split: usize) -> usize {
        t_len * n_head * n_split * (256 + 2)
    }

    /// The split-K partial kernel of [`Gpu::attention`] (shape `s` checked by the caller):
    /// returns the split count and the scratch's partial outputs `[T][n_head][n_split][256]`
    /// and (max, sum) pairs, for a merge kernel to read.
    pub(super) fn attention_partials<'s, T: KvElem>(
        &self,
        s: &AttnShape,
        q: &CudaView<'_, f32>,
        (kc, vc): (&CudaView<'_, T>, &CudaView<'_, T>),
        split: SplitK<'s, '_>,
    ) -> Result<(usize, CudaViewMut<'s, f32>, CudaViewMut<'s, f32>), KernelError> {
        const OP: &str = "attention";
        let SplitK { chunk, scratch } = split;
        check(chunk > 0, OP, || "chunk 0".into())?;
        let (n_head, t_len) = (s.n_head, s.t_len);
        let n_split = (s.p0 + t_len).div_ceil(chunk);
        Self::check_grid_y(OP, "context splits", n_split)?;
        let need = Self::attention_scratch_len(t_len, n_head, n_split);
        check(scratch.len() >= need, OP, || {
            format!("scratch has {} floats, needs {need}", scratch.len())
        })?;
        let n_part = t_len * n_head * n_split * 256;
        let (mut part_o, mut part_ml) = scratch.split_at_mut(n_part);
        let fp = self.func("attention", T::PARTIAL_KERNEL)?;
        let a = AttnArgs::new(s);
        let (chunk_i, nt) = (chunk as i32, t_len as i32);
        let mut b = self.stream.launch_builder(fp);
        a.push(&mut b, q, kc, vc);
        b.arg(&chunk_i)
            .arg(&s.scale)
            .arg(&mut part_o)
            .arg(&mut part_ml)
            .arg(&nt);
        let cfg = LaunchConfig {
            // Grid z strides over the query tokens (any count; 65535 blocks at most).
            grid_dim: (
                n_head as u32,
                n_split as u32,
                crate::launch::grid_y_blocks(t_len),
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: arguments as declared in attention.cu; lengths checked; splits beyond a
        // query's causal end write (max = -inf, sum = 0) and are skipped by the merge.
        unsafe { b.launch(cfg) }.map_err(drv(T::PARTIAL_KERNEL))?;
        Ok((n_split, part_o, part_ml))
    }

    /// Causal GQA attention of shape `s` over f16, f32, q8_0 or q4_0 caches `kc`/`vc` (decode:
    /// `t_len = 1`). Splits the context in chunks of `split.chunk` positions (split-K), merged
    /// by a second kernel.
    pub fn attention<T: KvElem>(
        &self,
        s: &AttnShape,
        q: &CudaView<'_, f32>,
        kc: &CudaView<'_, T>,
        vc: &CudaView<'_, T>,
        o: &mut CudaViewMut<'_, f32>,
        split: SplitK<'_, '_>,
    ) -> Result<(), KernelError> {
        const OP: &str = "attention";
        self.check_attention(OP, s, q.len(), kc, vc, o.len())?;
        let (n_head, t_len) = (s.n_head, s.t_len);
        let (n_split, mut part_o, mut part_ml) = self.attention_partials(s, q, (kc, vc), split)?;
        let nt = t_len as i32;
        let fc = self.func("attention", "attn_combine")?;
        let (ns, ots) = (n_split as i32, s.o_tok_stride as i64);
        let mut b = self.stream.launch_builder(fc);
        b.arg(&mut part_o)
            .arg(&mut part_ml)
            .arg(&ns)
            .arg(o)
            .arg(&ots)
            .arg(&nt);
        let cfg = LaunchConfig {
            grid_dim: (n_head as u32, crate::launch::grid_y_blocks(t_len), 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: arguments as declared; reads the partials written above on the same stream.
        unsafe { b.launch(cfg) }.map_err(drv("attn_combine"))?;
        Ok(())
    }
}
