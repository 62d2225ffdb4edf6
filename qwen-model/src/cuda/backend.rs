//! [`Backend`] for [`CudaBackend`]: a thin adapter from the trait's ops to the backend's own
//! (`try_*`, each in the module of its op family), turning [`CudaError`] into [`ModelError`].

use super::{caps, CudaBackend, CudaBuf, CudaKv, CudaWeight};
use crate::NormDest;
use crate::{AttnGateRot, GatedNormShape, QkNormRope, RotatedOut};
use crate::{
    AttnLayout, Backend, ConvShape, GateLayout, GdnArgs, KvCacheType, ModelError, NormIn, NormRot,
    Requirements, RopeLayout, SwigluRot, Unsupported, WeightSource,
};
use pn_kernels::{NormShape, RowLayout};
use std::ops::Range;

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
        caps::check(&self.name(), req)
    }

    fn alloc(&self, len: usize) -> Result<CudaBuf, ModelError> {
        Ok(CudaBuf {
            data: self.alloc_zeros(len, "activation buffer")?,
            len,
        })
    }

    fn upload(&self, src: &[f32], dst: &mut CudaBuf, offset: usize) -> Result<(), ModelError> {
        Ok(self.try_upload(src, dst, offset)?)
    }

    fn download(&self, src: &CudaBuf, offset: usize, dst: &mut [f32]) -> Result<(), ModelError> {
        Ok(self.try_download(src, offset, dst)?)
    }

    fn top_k(
        &self,
        src: &CudaBuf,
        offset: usize,
        n: usize,
        k: usize,
        out: &mut Vec<(u32, f32)>,
    ) -> Result<(), ModelError> {
        Ok(self.try_top_k(src, offset, (n, k), out)?)
    }

    /// A logits row is a synchronous device-to-host copy (about 1 MB at the 27B vocabulary).
    fn prefers_top_k(&self) -> bool {
        true
    }

    fn copy(
        &self,
        src: &CudaBuf,
        src_off: usize,
        dst: &mut CudaBuf,
        dst_off: usize,
        len: usize,
    ) -> Result<(), ModelError> {
        Ok(self.try_copy(src, src_off, dst, dst_off, len)?)
    }

    fn zero(&self, buf: &mut CudaBuf, len: usize) -> Result<(), ModelError> {
        Ok(self.try_zero(buf, len)?)
    }

    fn alloc_kv(&self, len: usize, ty: KvCacheType) -> Result<CudaKv, ModelError> {
        if !len.is_multiple_of(ty.block_len()) {
            return Err(ModelError::BadArgument(format!(
                "{ty} KV cache of {len} values is not a whole number of {}-value blocks",
                ty.block_len()
            )));
        }
        Ok(self.try_alloc_kv(len, ty)?)
    }

    fn kv_write(
        &self,
        src: &CudaBuf,
        dst: &mut CudaKv,
        dst_off: usize,
        len: usize,
    ) -> Result<(), ModelError> {
        Ok(self.try_kv_write(src, dst, dst_off, len)?)
    }

    fn load_weight(&self, src: &WeightSource<'_>) -> Result<CudaWeight, ModelError> {
        self.try_load_weight(src)
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
        Ok(self.try_hadamard(x, len, block)?)
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
        Ok(self.try_rms_norm((x, w), out, rows, NormShape { n, eps })?)
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
        Ok(self.try_rms_norm_strided(x, w, NormShape { n, eps }, (stride, count))?)
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
        Ok(self.try_gated_rms_norm(x, (z, w), len, NormShape { n, eps })?)
    }

    fn rope(
        &self,
        x: &mut CudaBuf,
        layout: &RopeLayout,
        n_tokens: usize,
        pos0: usize,
        theta: f32,
    ) -> Result<(), ModelError> {
        Ok(self.try_rope(x, layout, n_tokens, pos0, theta)?)
    }

    fn attention(
        &self,
        q: &CudaBuf,
        k_cache: &CudaKv,
        v_cache: &CudaKv,
        out: &mut CudaBuf,
        layout: &AttnLayout,
        positions: Range<usize>,
    ) -> Result<(), ModelError> {
        Ok(self.try_attention(q, (k_cache, v_cache), out, layout, positions)?)
    }

    fn sigmoid_gate(
        &self,
        x: &mut CudaBuf,
        gate: &CudaBuf,
        g: &GateLayout,
        n_tokens: usize,
    ) -> Result<(), ModelError> {
        let gl = RowLayout {
            tokens: n_tokens,
            heads: g.n_heads,
            tok_stride: g.token_stride,
            head_stride: g.head_stride,
        };
        Ok(self.try_sigmoid_gate(x, (gate, g.offset), gl, g.head_dim)?)
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
        Ok(self.try_conv1d_silu((u, w), state, y, shape, n_tokens)?)
    }

    fn gated_delta_rule(&self, args: GdnArgs<'_, CudaBuf>) -> Result<(), ModelError> {
        Ok(self.try_gdn(args)?)
    }

    fn swiglu(&self, gate: &mut CudaBuf, up: &CudaBuf, len: usize) -> Result<(), ModelError> {
        Ok(self.try_swiglu(gate, up, len)?)
    }

    fn add(&self, x: &mut CudaBuf, y: &CudaBuf, len: usize) -> Result<(), ModelError> {
        Ok(self.try_add(x, y, len)?)
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
        let norm = NormShape { n, eps };
        Ok(self.try_rms_norm_hadamard((x, w), out, rows, norm, block)?)
    }

    fn swiglu_hadamard(
        &self,
        gate: &CudaBuf,
        up: &CudaBuf,
        out: &mut CudaBuf,
        len: usize,
        block: usize,
    ) -> Result<(), ModelError> {
        Ok(self.try_swiglu_hadamard((gate, up), out, len, block)?)
    }

    fn norm_matmul(
        &self,
        x: NormIn<'_, CudaBuf>,
        norm: &NormRot<'_, CudaBuf>,
        rot: Option<NormDest<'_, '_, CudaBuf, CudaWeight>>,
        plain: Option<NormDest<'_, '_, CudaBuf, CudaWeight>>,
    ) -> Result<(), ModelError> {
        self.fused_norm_matmul(x, norm, rot, plain)
    }

    fn swiglu_hadamard_matmul(
        &self,
        s: &SwigluRot<'_, CudaBuf>,
        out: &mut CudaBuf,
        outs: &mut [(&CudaWeight, &mut CudaBuf)],
    ) -> Result<(), ModelError> {
        self.fused_swiglu_matmul(s, out, outs)
    }

    fn qk_norm_rope(&self, a: QkNormRope<'_, CudaBuf>) -> Result<(), ModelError> {
        self.fused_qk_norm_rope(a)
    }

    fn kv_write_pair(
        &self,
        kv: (&CudaBuf, &CudaBuf),
        caches: (&mut CudaKv, &mut CudaKv),
        dst_off: usize,
        len: usize,
    ) -> Result<(), ModelError> {
        Ok(self.try_kv_write_pair(kv, caches, dst_off, len)?)
    }

    fn sigmoid_gate_hadamard(
        &self,
        xg: (&mut CudaBuf, &CudaBuf, &GateLayout),
        n_tokens: usize,
        o: RotatedOut<'_, CudaBuf>,
    ) -> Result<(), ModelError> {
        self.fused_sigmoid_gate_hadamard(xg, n_tokens, o)
    }

    fn gated_rms_norm_hadamard(
        &self,
        xzw: (&mut CudaBuf, &CudaBuf, &CudaBuf),
        out: &mut CudaBuf,
        s: GatedNormShape,
    ) -> Result<(), ModelError> {
        self.fused_gated_rms_norm_hadamard(xzw, out, s)
    }

    fn attention_gate_hadamard(
        &self,
        a: AttnGateRot<'_, Self>,
        o: RotatedOut<'_, CudaBuf>,
    ) -> Result<(), ModelError> {
        self.fused_attention_gate_hadamard(a, o)
    }

    fn mixer_out_matmul(
        &self,
        src: crate::MixerOut<'_, Self>,
        o: RotatedOut<'_, CudaBuf>,
        rows: usize,
        outs: &mut [(&CudaWeight, &mut CudaBuf)],
    ) -> Result<(), ModelError> {
        self.fused_mixer_out_matmul(src, o, rows, outs)
    }

    fn conv_gated_delta_rule(
        &self,
        c: crate::ConvIn<'_, CudaBuf>,
        args: GdnArgs<'_, CudaBuf>,
    ) -> Result<(), ModelError> {
        self.fused_conv_gated_delta_rule(c, args)
    }
}
