//! [`LaunchCounter`]: a [`Backend`] that runs nothing and counts the launches (kernels and
//! device copies) [`super::CudaBackend`] issues for each op it is called with. Driving a
//! [`crate::Model`] with it gives the launches of the model's real op sequence (`cargo xtask
//! traffic` runs one 27B decode token through it), so the count follows `model/layers.rs`.
//!
//! The matrix products and every fused op are counted with the backend's own dispatch
//! predicates, the functions its dispatch calls ([`super::weight::matmul_launches`],
//! [`super::fused::norm_plan_of`], [`super::fused::swiglu_fuses_of`],
//! [`super::norms::rms_norm_hadamard_fuses`], [`super::norms::swiglu_hadamard_fuses`],
//! [`super::mixer::qk_fused`], [`super::mixer::gate_rotation`],
//! [`super::mixer::gated_norm_rotation`], [`super::attention::attn_gate_fuses`],
//! [`super::kv::kv_pair_fuses`], `attn_tiled`, `gdn_chunked`), so a change of those plans
//! changes the count and nothing here copies a shape condition. The other ops are one launch
//! each except where noted at the op; an op the CUDA backend overrides must be overridden here
//! too (a trait default here counts its composed ops).

use super::attention::attn_gate_fuses;
use super::fused::{norm_plan_of, swiglu_fuses_of, Described, NormPlan};
use super::kv::kv_pair_fuses;
use super::mixer::{gate_rotation, gated_norm_rotation, qk_fused};
use super::norms::{rms_norm_hadamard_fuses, swiglu_hadamard_fuses};
use super::weight::{device_type, matmul_launches, MatDesc};
use super::{attn_tiled, gdn_chunked};
use crate::backend::mixer_ops;
use crate::fused::{norm_matmul_default, swiglu_hadamard_matmul_default};
use crate::{AttnGateRot, GatedNormShape, QkNormRope, RotatedOut};
use crate::{
    AttnLayout, Backend, ConvShape, GateLayout, GdnArgs, KvCacheType, ModelError, NormDest, NormIn,
    NormRot, RopeLayout, SwigluRot, WeightSource,
};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// A buffer of the counter: its length only.
#[derive(Debug)]
pub struct CountBuf(usize);

impl CountBuf {
    /// Floats it stands for.
    pub fn len(&self) -> usize {
        self.0
    }
    /// Whether it stands for none.
    pub fn is_empty(&self) -> bool {
        self.0 == 0
    }
}

/// A KV cache of the counter: its length in values and its storage type.
#[derive(Debug)]
pub struct CountKv {
    len: usize,
    ty: KvCacheType,
}

/// A matrix of the counter: its launch-plan shape, name and rotation.
#[derive(Debug)]
pub struct CountWeight {
    desc: MatDesc,
    rotated: bool,
}

impl Described for CountWeight {
    fn mat_desc(&self) -> MatDesc {
        self.desc
    }
}

/// Counts launches per op name. See the module docs.
#[derive(Debug, Default)]
pub struct LaunchCounter {
    counts: Mutex<BTreeMap<&'static str, u64>>,
}

impl LaunchCounter {
    /// A counter at zero.
    pub fn new() -> LaunchCounter {
        LaunchCounter::default()
    }

    fn add(&self, op: &'static str, n: u64) {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        *c.entry(op).or_default() += n;
    }

    /// Launches so far, per op (ops with none left out).
    pub fn counts(&self) -> BTreeMap<&'static str, u64> {
        let c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        c.iter()
            .filter(|(_, n)| **n > 0)
            .map(|(k, v)| (*k, *v))
            .collect()
    }

    /// Launches so far, all ops.
    pub fn total(&self) -> u64 {
        self.counts().values().sum()
    }

    /// Back to zero (e.g. after loading, before the pass to count).
    pub fn reset(&self) {
        self.counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

fn descs(outs: &[(&CountWeight, &mut CountBuf)]) -> Vec<MatDesc> {
    outs.iter().map(|(w, _)| w.desc).collect()
}

impl Backend for LaunchCounter {
    type Buf = CountBuf;
    type Weight = CountWeight;
    type KvBuf = CountKv;

    fn name(&self) -> String {
        "launch counter (the CUDA backend's launches)".into()
    }

    fn alloc(&self, len: usize) -> Result<CountBuf, ModelError> {
        Ok(CountBuf(len))
    }

    fn upload(&self, _: &[f32], _: &mut CountBuf, _: usize) -> Result<(), ModelError> {
        self.add("upload", 1);
        Ok(())
    }

    fn download(&self, _: &CountBuf, _: usize, dst: &mut [f32]) -> Result<(), ModelError> {
        dst.fill(0.0);
        self.add("download", 1);
        Ok(())
    }

    fn top_k(
        &self,
        _: &CountBuf,
        _: usize,
        _: usize,
        k: usize,
        out: &mut Vec<(u32, f32)>,
    ) -> Result<(), ModelError> {
        // The two top-k kernels and the copy of the k results.
        out.clear();
        out.extend((0..k as u32).map(|i| (i, 0.0)));
        self.add("top_k", 3);
        Ok(())
    }

    fn copy(
        &self,
        _: &CountBuf,
        _: usize,
        _: &mut CountBuf,
        _: usize,
        len: usize,
    ) -> Result<(), ModelError> {
        self.add("copy", u64::from(len > 0));
        Ok(())
    }

    fn zero(&self, _: &mut CountBuf, _: usize) -> Result<(), ModelError> {
        self.add("zero", 1);
        Ok(())
    }

    fn alloc_kv(&self, len: usize, ty: KvCacheType) -> Result<CountKv, ModelError> {
        Ok(CountKv { len, ty })
    }

    fn kv_write(
        &self,
        _: &CountBuf,
        _: &mut CountKv,
        _: usize,
        _: usize,
    ) -> Result<(), ModelError> {
        self.add("kv_write", 1);
        Ok(())
    }

    fn load_weight(&self, src: &WeightSource<'_>) -> Result<CountWeight, ModelError> {
        let ty = device_type(src.ty).ok_or_else(|| ModelError::BadType {
            name: src.name.into(),
            found: src.ty.name().into(),
            allowed: "the CUDA backend's types".into(),
        })?;
        Ok(CountWeight {
            desc: MatDesc {
                ty,
                rows: src.rows,
                cols: src.cols,
            },
            rotated: src.rotated,
        })
    }

    fn embed(&self, t: &CountWeight, tokens: &[u32], _: &mut CountBuf) -> Result<(), ModelError> {
        // The token id upload, the gather, and the un-rotation of a rotated table.
        if !tokens.is_empty() {
            self.add("embed", 2 + u64::from(t.rotated));
        }
        Ok(())
    }

    fn matmul(
        &self,
        _: &CountBuf,
        rows: usize,
        outs: &mut [(&CountWeight, &mut CountBuf)],
    ) -> Result<(), ModelError> {
        self.add("matmul", matmul_launches(rows, &descs(outs), false));
        Ok(())
    }

    fn hadamard(&self, _: &mut CountBuf, _: usize, _: usize) -> Result<(), ModelError> {
        self.add("hadamard", 1);
        Ok(())
    }

    fn rms_norm(
        &self,
        _: &CountBuf,
        _: &CountBuf,
        _: &mut CountBuf,
        _: usize,
        _: usize,
        _: f32,
    ) -> Result<(), ModelError> {
        self.add("rms_norm", 1);
        Ok(())
    }

    fn rms_norm_strided(
        &self,
        _: &mut CountBuf,
        _: &CountBuf,
        _: usize,
        _: usize,
        _: usize,
        _: f32,
    ) -> Result<(), ModelError> {
        self.add("rms_norm_strided", 1);
        Ok(())
    }

    fn gated_rms_norm(
        &self,
        _: &mut CountBuf,
        _: &CountBuf,
        _: &CountBuf,
        _: usize,
        _: usize,
        _: f32,
    ) -> Result<(), ModelError> {
        self.add("gated_rms_norm", 1);
        Ok(())
    }

    fn rope(
        &self,
        _: &mut CountBuf,
        _: &RopeLayout,
        _: usize,
        _: usize,
        _: f32,
    ) -> Result<(), ModelError> {
        self.add("rope", 1);
        Ok(())
    }

    fn attention(
        &self,
        _: &CountBuf,
        _: &CountKv,
        _: &CountKv,
        _: &mut CountBuf,
        _: &AttnLayout,
        positions: std::ops::Range<usize>,
    ) -> Result<(), ModelError> {
        // The tiled prefill kernel, or split-K partials + combine.
        self.add("attention", if attn_tiled(positions.len()) { 1 } else { 2 });
        Ok(())
    }

    fn sigmoid_gate(
        &self,
        _: &mut CountBuf,
        _: &CountBuf,
        _: &GateLayout,
        _: usize,
    ) -> Result<(), ModelError> {
        self.add("sigmoid_gate", 1);
        Ok(())
    }

    fn conv1d_silu(
        &self,
        _: &CountBuf,
        _: &CountBuf,
        _: &mut CountBuf,
        _: &mut CountBuf,
        _: ConvShape,
        _: usize,
    ) -> Result<(), ModelError> {
        self.add("conv1d_silu", 1);
        Ok(())
    }

    fn gated_delta_rule(&self, a: GdnArgs<'_, CountBuf>) -> Result<(), ModelError> {
        // Decode: the token-by-token kernel normalises q and k itself (one launch); prefill:
        // the l2 norms of q and k in place, then the chunked delta rule.
        if a.n_tokens > 0 {
            let n = if gdn_chunked(a.n_tokens) { 3 } else { 1 };
            self.add("gated_delta_rule", n);
        }
        Ok(())
    }

    fn swiglu(&self, _: &mut CountBuf, _: &CountBuf, _: usize) -> Result<(), ModelError> {
        // The kernel into scratch, then the copy back.
        self.add("swiglu", 2);
        Ok(())
    }

    fn add(&self, _: &mut CountBuf, _: &CountBuf, _: usize) -> Result<(), ModelError> {
        LaunchCounter::add(self, "add", 1);
        Ok(())
    }

    fn rms_norm_hadamard(
        &self,
        _: &CountBuf,
        _: &CountBuf,
        _: &mut CountBuf,
        _: usize,
        n: usize,
        _: f32,
        block: usize,
    ) -> Result<(), ModelError> {
        let fused = rms_norm_hadamard_fuses(n, block);
        self.add("rms_norm_hadamard", if fused { 1 } else { 2 });
        Ok(())
    }

    fn swiglu_hadamard(
        &self,
        _: &CountBuf,
        _: &CountBuf,
        _: &mut CountBuf,
        len: usize,
        block: usize,
    ) -> Result<(), ModelError> {
        // The fused kernel, or copy + SwiGLU (2) + rotation.
        let fused = swiglu_hadamard_fuses(len, block);
        self.add("swiglu_hadamard", if fused { 1 } else { 4 });
        Ok(())
    }

    fn norm_matmul(
        &self,
        x: NormIn<'_, CountBuf>,
        norm: &NormRot<'_, CountBuf>,
        rot: Option<NormDest<'_, '_, CountBuf, CountWeight>>,
        plain: Option<NormDest<'_, '_, CountBuf, CountWeight>>,
    ) -> Result<(), ModelError> {
        // `CudaBackend::fused_norm_matmul`: the plan's one launch, then the matrices (the
        // rotated ones reading the fp16 copy it wrote).
        let op = match norm_plan_of(&x, norm, rot.as_ref(), plain.is_some()) {
            NormPlan::Unfused => return norm_matmul_default(self, x, norm, rot, plain),
            NormPlan::Prepared => "add_rms_norm_hadamard_prep",
            NormPlan::AddPlain => "add_rms_norm",
        };
        self.add(op, 1);
        if let Some(r) = rot {
            self.add("matmul", matmul_launches(norm.rows, &descs(r.outs), true));
        }
        if let Some(p) = plain {
            self.matmul(p.buf, norm.rows, p.outs)?;
        }
        Ok(())
    }

    fn swiglu_hadamard_matmul(
        &self,
        s: &SwigluRot<'_, CountBuf>,
        out: &mut CountBuf,
        outs: &mut [(&CountWeight, &mut CountBuf)],
    ) -> Result<(), ModelError> {
        if !swiglu_fuses_of(s, outs) {
            return swiglu_hadamard_matmul_default(self, s, out, outs);
        }
        self.add("swiglu_hadamard_prep", 1);
        self.add("matmul", matmul_launches(s.rows, &descs(outs), true));
        Ok(())
    }

    // The mixer's fused ops (`super::mixer`, `super::kv`, `super::attention`): one launch
    // where the CUDA backend's shape checks take the fused kernel, else the composed default.
    fn qk_norm_rope(&self, a: QkNormRope<'_, CountBuf>) -> Result<(), ModelError> {
        if a.n_tokens == 0 {
            return Ok(());
        }
        if qk_fused(&a).is_some() {
            self.add("qk_norm_rope", 1);
            return Ok(());
        }
        mixer_ops::qk_norm_rope(self, a)
    }

    fn kv_write_pair(
        &self,
        _: (&CountBuf, &CountBuf),
        (kc, vc): (&mut CountKv, &mut CountKv),
        dst_off: usize,
        len: usize,
    ) -> Result<(), ModelError> {
        // `try_kv_write_pair`: one launch, or the two writes.
        let one = kv_pair_fuses(dst_off, len, (kc.len, kc.ty), (vc.len, vc.ty));
        if len > 0 {
            self.add("kv_write", if one { 1 } else { 2 });
        }
        Ok(())
    }

    fn sigmoid_gate_hadamard(
        &self,
        (x, gate, g): (&mut CountBuf, &CountBuf, &GateLayout),
        n_tokens: usize,
        o: RotatedOut<'_, CountBuf>,
    ) -> Result<(), ModelError> {
        if n_tokens == 0 {
            return Ok(());
        }
        if gate_rotation(g, n_tokens, o.block).refusal().is_none() {
            self.add("sigmoid_gate_hadamard", 1);
            return Ok(());
        }
        mixer_ops::sigmoid_gate_hadamard(self, (x, gate, g), n_tokens, o)
    }

    fn attention_gate_hadamard(
        &self,
        a: AttnGateRot<'_, Self>,
        o: RotatedOut<'_, CountBuf>,
    ) -> Result<(), ModelError> {
        // `try_attention_gate_hadamard`: the split-K partials, then the combine fused with the
        // gate and the rotation.
        let n = a.positions.len();
        if attn_gate_fuses(a.layout, n, &gate_rotation(&a.g, n, o.block)) {
            self.add("attention", 2);
            return Ok(());
        }
        mixer_ops::attention_gate_hadamard(self, a, o)
    }

    fn gated_rms_norm_hadamard(
        &self,
        xzw: (&mut CountBuf, &CountBuf, &CountBuf),
        out: &mut CountBuf,
        sh: GatedNormShape,
    ) -> Result<(), ModelError> {
        if sh.len == 0 {
            return Ok(());
        }
        if gated_norm_rotation(&sh).is_some() {
            self.add("gated_rms_norm_hadamard", 1);
            return Ok(());
        }
        mixer_ops::gated_rms_norm_hadamard(self, xzw, out, sh)
    }

    fn conv_gated_delta_rule(
        &self,
        c: crate::ConvIn<'_, CountBuf>,
        a: GdnArgs<'_, CountBuf>,
    ) -> Result<(), ModelError> {
        // `fused_conv_gated_delta_rule`: the conv inside the decode delta rule's one launch.
        if super::gdn::conv_delta_fuses(a.dims, a.n_tokens, c.shape) {
            self.add("gated_delta_rule", 1);
            return Ok(());
        }
        crate::backend::mixer_proj::conv_gated_delta_rule(self, c, a)
    }

    fn mixer_out_matmul(
        &self,
        src: crate::MixerOut<'_, Self>,
        o: RotatedOut<'_, CountBuf>,
        rows: usize,
        outs: &mut [(&CountWeight, &mut CountBuf)],
    ) -> Result<(), ModelError> {
        // `fused_mixer_out_matmul`: the fused producer writes the projection's fp16 input (the
        // attention's two launches, or the gated norm's one), then the projection alone.
        let d = descs(outs);
        if rows == 0 || !super::mixer_proj::mixer_out_preps(&src, o.block, rows, &d) {
            return crate::backend::mixer_proj::mixer_out_matmul(self, src, o, rows, outs);
        }
        match src {
            crate::MixerOut::Attention(_) => self.add("attention", 2),
            crate::MixerOut::GatedNorm { .. } => self.add("gated_rms_norm_hadamard", 1),
        }
        self.add("matmul", matmul_launches(rows, &d, true));
        Ok(())
    }
}
