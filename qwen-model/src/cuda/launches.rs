//! [`LaunchCounter`]: a [`Backend`] that runs nothing and counts the launches (kernels and
//! device copies) [`super::CudaBackend`] issues for each op it is called with. Driving a
//! [`crate::Model`] with it gives the launches of the model's real op sequence (`cargo xtask
//! traffic` runs one 27B decode token through it), so the count follows `model/layers.rs`.
//!
//! The matrix products and the fused ops are counted with the backend's own dispatch
//! predicates ([`super::weight::matmul_launches`], [`super::fused::norm_fuses`],
//! [`super::fused::swiglu_fuses`]), so a change of those plans changes the count. The other ops
//! are one launch each except where noted at the op; an op the CUDA backend overrides must be
//! overridden here too (a trait default here counts its composed ops).

use super::attn_tiled;
use super::fused::{norm_fuses, swiglu_fuses};
use super::weight::{device_type, matmul_launches, MatDesc};
use crate::fused::{norm_hadamard_matmul_default, swiglu_hadamard_matmul_default};
use crate::{
    AttnLayout, Backend, ConvShape, GateLayout, GdnArgs, KvCacheType, ModelError, NormIn, NormRot,
    RopeLayout, SwigluRot, WeightSource,
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

/// A matrix of the counter: its launch-plan shape, name and rotation.
#[derive(Debug)]
pub struct CountWeight {
    desc: MatDesc,
    rotated: bool,
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
    type KvBuf = CountBuf;

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

    fn alloc_kv(&self, len: usize, _: KvCacheType) -> Result<CountBuf, ModelError> {
        Ok(CountBuf(len))
    }

    fn kv_write(
        &self,
        _: &CountBuf,
        _: &mut CountBuf,
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
        _: &CountBuf,
        _: &CountBuf,
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

    fn gated_delta_rule(&self, _: GdnArgs<'_, CountBuf>) -> Result<(), ModelError> {
        // The l2 norms of q and k, then the token-by-token or chunked delta rule.
        self.add("gated_delta_rule", 3);
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
        let fused = pn_kernels::Gpu::rotation_fits(n, block)
            && n <= pn_kernels::Gpu::RMS_NORM_HADAMARD_MAX_N;
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
        let fused = pn_kernels::Gpu::rotation_fits(len, block);
        self.add("swiglu_hadamard", if fused { 1 } else { 4 });
        Ok(())
    }

    fn norm_hadamard_matmul(
        &self,
        x: NormIn<'_, CountBuf>,
        norm: &NormRot<'_, CountBuf>,
        rot: &mut CountBuf,
        outs: &mut [(&CountWeight, &mut CountBuf)],
    ) -> Result<(), ModelError> {
        let d = descs(outs);
        if !norm_fuses(norm.rows, norm.n, norm.block, &d) {
            return norm_hadamard_matmul_default(self, x, norm, rot, outs);
        }
        self.add("add_rms_norm_hadamard_prep", 1);
        self.add("matmul", matmul_launches(norm.rows, &d, true));
        Ok(())
    }

    fn swiglu_hadamard_matmul(
        &self,
        s: &SwigluRot<'_, CountBuf>,
        out: &mut CountBuf,
        outs: &mut [(&CountWeight, &mut CountBuf)],
    ) -> Result<(), ModelError> {
        let d = descs(outs);
        if !swiglu_fuses(s.rows, s.n, s.block, &d) {
            return swiglu_hadamard_matmul_default(self, s, out, outs);
        }
        self.add("swiglu_hadamard_prep", 1);
        self.add("matmul", matmul_launches(s.rows, &d, true));
        Ok(())
    }
}
