//! Binding the tensors of a `qwen35` GGUF by name, with shape and type checks
//! (reference: `qwen38-architecture.md` section 2).

use crate::backend::{Backend, WeightSource};
use crate::config::{LayerKind, ModelConfig};
use crate::error::ModelError;
use gguf_io::{GgmlType, GgufFile};
use std::sync::Arc;

/// Storage types a weight matrix may have: everything the CPU backend can multiply (every
/// stock type `gguf_io::quants` decodes, then the PN types). The CUDA backend reads a subset and
/// refuses the others at load, naming tensor and type (`cuda::device_type`).
pub fn matrix_types() -> Vec<GgmlType> {
    let mut v = gguf_io::quants::DECODABLE.to_vec();
    v.extend([GgmlType::Pn3t, GgmlType::Pn4t]);
    v
}

/// Storage types a vector (norm weight, `ssm_a`, conv kernel...) may have; converted to f32.
pub const VECTOR_TYPES: &[GgmlType] = &[GgmlType::F32, GgmlType::F16, GgmlType::BF16];

/// Whether a type is one of the PN types (their math lives in `pn-format`).
pub fn is_pn(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Pn3t | GgmlType::Pn4t)
}

/// A bound weight matrix `[rows, cols]` (`y = W x` with `x` of length `cols`).
pub struct Matrix<B: Backend> {
    /// The backend-resident weight.
    pub w: B::Weight,
    /// Tensor name.
    pub name: String,
    /// Storage type.
    pub ty: GgmlType,
    /// Output rows.
    pub rows: usize,
    /// Reduction length K.
    pub cols: usize,
    /// Whether the rows are stored Hadamard-rotated (the input must be rotated too).
    pub rotated: bool,
}

impl<B: Backend> Matrix<B> {
    /// Bytes of weight data one product with this matrix reads.
    pub fn n_bytes(&self) -> u64 {
        self.ty.row_bytes(self.cols as u64).unwrap_or(0) * self.rows as u64
    }
}

/// Weights of a gated full-attention mixer.
pub struct AttnWeights<B: Backend> {
    /// `attn_q`: `[2 * Hq * Dh, D]`, per head `[query | gate]`.
    pub q: Matrix<B>,
    /// `attn_k`: `[Hkv * Dh, D]`.
    pub k: Matrix<B>,
    /// `attn_v`: `[Hkv * Dh, D]`.
    pub v: Matrix<B>,
    /// `attn_output`: `[D, Hq * Dh]`.
    pub o: Matrix<B>,
    /// `attn_q_norm` (`Dh`, stored 1+w).
    pub q_norm: B::Buf,
    /// `attn_k_norm` (`Dh`, stored 1+w).
    pub k_norm: B::Buf,
}

/// Weights of a Gated DeltaNet mixer.
pub struct GdnWeights<B: Backend> {
    /// `attn_qkv`: `[conv_dim, D]`.
    pub qkv: Matrix<B>,
    /// `attn_gate` (z): `[Hv * dv, D]`.
    pub gate: Matrix<B>,
    /// `ssm_beta`: `[Hv, D]`.
    pub beta: Matrix<B>,
    /// `ssm_alpha`: `[Hv, D]`.
    pub alpha: Matrix<B>,
    /// `ssm_out`: `[D, Hv * dv]`.
    pub out: Matrix<B>,
    /// `ssm_conv1d` (`[conv_dim, kernel]`, tap-major per channel).
    pub conv: B::Buf,
    /// `ssm_a` (`-exp(A_log)`, `Hv`).
    pub a: B::Buf,
    /// `ssm_dt.bias` (`Hv`).
    pub dt_bias: B::Buf,
    /// `ssm_norm` (`dv`, plain weight).
    pub norm: B::Buf,
}

/// The SwiGLU MLP.
pub struct FfnWeights<B: Backend> {
    /// `ffn_gate`: `[F, D]`.
    pub gate: Matrix<B>,
    /// `ffn_up`: `[F, D]`.
    pub up: Matrix<B>,
    /// `ffn_down`: `[D, F]`.
    pub down: Matrix<B>,
}

/// The mixer of one layer.
pub enum Mixer<B: Backend> {
    /// Full attention.
    Attention(AttnWeights<B>),
    /// Gated DeltaNet.
    DeltaNet(GdnWeights<B>),
}

/// One decoder block.
pub struct LayerWeights<B: Backend> {
    /// `attn_norm` (pre-mixer RMSNorm, 1+w).
    pub attn_norm: B::Buf,
    /// `post_attention_norm` (pre-MLP RMSNorm, 1+w).
    pub post_norm: B::Buf,
    /// The mixer.
    pub mixer: Mixer<B>,
    /// The MLP.
    pub ffn: FfnWeights<B>,
}

/// The MTP block (`blk.{n_layers}.*`).
pub struct MtpWeights<B: Backend> {
    /// `nextn.eh_proj`: `[D, 2D]` over `[enorm(embedding) ; hnorm(h)]`.
    pub eh_proj: Matrix<B>,
    /// `nextn.enorm`.
    pub enorm: B::Buf,
    /// `nextn.hnorm`.
    pub hnorm: B::Buf,
    /// `nextn.shared_head_norm` (falls back to `output_norm` when absent).
    pub head_norm: Option<B::Buf>,
    /// The full-attention block.
    pub block: LayerWeights<B>,
    /// `nextn.embed_tokens` if present (else `token_embd`).
    pub embed: Option<Matrix<B>>,
    /// `nextn.shared_head_head` if present (else the LM head).
    pub head: Option<Matrix<B>>,
}

/// All weights of a model.
pub struct Weights<B: Backend> {
    /// `token_embd`: `[V, D]`.
    pub token_embd: Matrix<B>,
    /// `output_norm`.
    pub output_norm: B::Buf,
    /// `output` (None: tied to `token_embd`).
    pub output: Option<Matrix<B>>,
    /// Trunk layers.
    pub layers: Vec<LayerWeights<B>>,
    /// MTP block, when the file has one.
    pub mtp: Option<MtpWeights<B>>,
}

impl<B: Backend> Weights<B> {
    /// The LM head (`output`, or `token_embd` when tied).
    pub fn lm_head(&self) -> &Matrix<B> {
        self.output.as_ref().unwrap_or(&self.token_embd)
    }

    /// Every matrix the trunk multiplies for one decoded token (the LM head included, the
    /// embedding gather excluded), for bandwidth accounting.
    pub fn trunk_matrices(&self) -> Vec<&Matrix<B>> {
        let mut v = Vec::new();
        for l in &self.layers {
            match &l.mixer {
                Mixer::Attention(a) => v.extend([&a.q, &a.k, &a.v, &a.o]),
                Mixer::DeltaNet(g) => v.extend([&g.qkv, &g.gate, &g.beta, &g.alpha, &g.out]),
            }
            v.extend([&l.ffn.gate, &l.ffn.up, &l.ffn.down]);
        }
        v.push(self.lm_head());
        v
    }

    /// Bytes of weights read per decoded token (all trunk matrices, the head, one embedding row).
    pub fn bytes_per_token(&self) -> u64 {
        let emb_row = self
            .token_embd
            .ty
            .row_bytes(self.token_embd.cols as u64)
            .unwrap_or(0);
        self.trunk_matrices()
            .iter()
            .map(|m| m.n_bytes())
            .sum::<u64>()
            + emb_row
    }

    /// Binds every tensor of `cfg` from `file` onto `backend`.
    pub fn load(
        file: &Arc<GgufFile>,
        cfg: &ModelConfig,
        backend: &B,
    ) -> Result<Weights<B>, ModelError> {
        let b = Binder { file, cfg, backend };
        let d = cfg.hidden as u64;
        let v = cfg.vocab as u64;
        let token_embd = b.matrix("token_embd.weight", d, v)?;
        let output_norm = b.vector("output_norm.weight", d)?;
        let output = if b.has("output.weight") {
            Some(b.matrix("output.weight", d, v)?)
        } else {
            None
        };
        let layers = (0..cfg.n_layers)
            .map(|i| b.layer(i, cfg.layer_kinds[i]))
            .collect::<Result<Vec<_>, _>>()?;
        let mtp = if cfg.n_mtp > 0 {
            Some(b.mtp(cfg.n_layers)?)
        } else {
            None
        };
        Ok(Weights {
            token_embd,
            output_norm,
            output,
            layers,
            mtp,
        })
    }
}

struct Binder<'a, B: Backend> {
    file: &'a Arc<GgufFile>,
    cfg: &'a ModelConfig,
    backend: &'a B,
}

impl<B: Backend> Binder<'_, B> {
    fn has(&self, name: &str) -> bool {
        self.file.tensor_infos().iter().any(|t| t.name == name)
    }

    fn view(&self, name: &str, expected: &[u64]) -> Result<gguf_io::TensorView<'_>, ModelError> {
        if !self.has(name) {
            return Err(ModelError::MissingTensor {
                name: name.into(),
                expected: expected.to_vec(),
            });
        }
        let t = self.file.tensor(name)?;
        if t.dims != expected {
            return Err(ModelError::BadShape {
                name: name.into(),
                expected: expected.to_vec(),
                found: t.dims.to_vec(),
            });
        }
        Ok(t)
    }

    fn check_type(name: &str, ty: GgmlType, allowed: &[GgmlType]) -> Result<(), ModelError> {
        if allowed.contains(&ty) {
            return Ok(());
        }
        Err(ModelError::BadType {
            name: name.into(),
            found: ty.name().into(),
            allowed: allowed
                .iter()
                .map(|t| t.name())
                .collect::<Vec<_>>()
                .join(", "),
        })
    }

    /// A matrix with `ne = [cols, rows]`.
    fn matrix(&self, name: &str, cols: u64, rows: u64) -> Result<Matrix<B>, ModelError> {
        let t = self.view(name, &[cols, rows])?;
        Self::check_type(name, t.ty, &matrix_types())?;
        let row_bytes =
            t.ty.row_bytes(cols)
                .ok_or_else(|| ModelError::BadTensorData {
                    name: name.into(),
                    reason: format!(
                        "row length {cols} is not a multiple of the {} block size",
                        t.ty.name()
                    ),
                })?;
        if t.bytes.len() as u64 != row_bytes * rows {
            return Err(ModelError::BadTensorData {
                name: name.into(),
                reason: format!("{} bytes, expected {}", t.bytes.len(), row_bytes * rows),
            });
        }
        let rotation = self.cfg.rotation.filter(|_| is_pn(t.ty));
        if let Some(r) = rotation {
            if !(cols as usize).is_multiple_of(r.block_size) {
                return Err(ModelError::BadTensorData {
                    name: name.into(),
                    reason: format!(
                        "K = {cols} is not a multiple of the rotation block size {}",
                        r.block_size
                    ),
                });
            }
        }
        let src = WeightSource {
            name,
            ty: t.ty,
            rows: rows as usize,
            cols: cols as usize,
            bytes: t.bytes,
            rotated: rotation.is_some(),
            rotation_block: rotation.map_or(0, |r| r.block_size),
            file: Some(self.file),
        };
        let w = self.backend.load_weight(&src)?;
        Ok(Matrix {
            w,
            name: name.into(),
            ty: t.ty,
            rows: rows as usize,
            cols: cols as usize,
            rotated: rotation.is_some(),
        })
    }

    /// A tensor of the given `ne`, converted to f32 and uploaded.
    fn f32_tensor(&self, name: &str, dims: &[u64]) -> Result<B::Buf, ModelError> {
        let t = self.view(name, dims)?;
        Self::check_type(name, t.ty, VECTOR_TYPES)?;
        let n: u64 = dims.iter().product();
        let mut vals = vec![0.0f32; n as usize];
        gguf_io::quants::dequantize_row(t.ty, t.bytes, &mut vals).map_err(|e| {
            ModelError::BadTensorData {
                name: name.into(),
                reason: e.to_string(),
            }
        })?;
        if let Some(i) = vals.iter().position(|x| !x.is_finite()) {
            return Err(ModelError::BadTensorData {
                name: name.into(),
                reason: format!("element {i} is not finite"),
            });
        }
        let mut buf = self.backend.alloc(vals.len())?;
        self.backend.upload(&vals, &mut buf, 0)?;
        Ok(buf)
    }

    fn vector(&self, name: &str, n: u64) -> Result<B::Buf, ModelError> {
        self.f32_tensor(name, &[n])
    }

    fn ffn(&self, p: &str) -> Result<FfnWeights<B>, ModelError> {
        let (d, f) = (self.cfg.hidden as u64, self.cfg.ffn as u64);
        Ok(FfnWeights {
            gate: self.matrix(&format!("{p}.ffn_gate.weight"), d, f)?,
            up: self.matrix(&format!("{p}.ffn_up.weight"), d, f)?,
            down: self.matrix(&format!("{p}.ffn_down.weight"), f, d)?,
        })
    }

    fn attention(&self, p: &str) -> Result<AttnWeights<B>, ModelError> {
        let c = self.cfg;
        let d = c.hidden as u64;
        Ok(AttnWeights {
            q: self.matrix(&format!("{p}.attn_q.weight"), d, c.q_proj_dim() as u64)?,
            k: self.matrix(&format!("{p}.attn_k.weight"), d, c.kv_dim() as u64)?,
            v: self.matrix(&format!("{p}.attn_v.weight"), d, c.kv_dim() as u64)?,
            o: self.matrix(
                &format!("{p}.attn_output.weight"),
                c.attn_out_dim() as u64,
                d,
            )?,
            q_norm: self.vector(&format!("{p}.attn_q_norm.weight"), c.head_dim as u64)?,
            k_norm: self.vector(&format!("{p}.attn_k_norm.weight"), c.head_dim as u64)?,
        })
    }

    fn deltanet(&self, p: &str) -> Result<GdnWeights<B>, ModelError> {
        let g = &self.cfg.gdn;
        let d = self.cfg.hidden as u64;
        let (cd, vd, hv) = (
            g.conv_dim() as u64,
            g.value_dim() as u64,
            g.n_v_heads as u64,
        );
        Ok(GdnWeights {
            qkv: self.matrix(&format!("{p}.attn_qkv.weight"), d, cd)?,
            gate: self.matrix(&format!("{p}.attn_gate.weight"), d, vd)?,
            beta: self.matrix(&format!("{p}.ssm_beta.weight"), d, hv)?,
            alpha: self.matrix(&format!("{p}.ssm_alpha.weight"), d, hv)?,
            out: self.matrix(&format!("{p}.ssm_out.weight"), vd, d)?,
            conv: self.f32_tensor(
                &format!("{p}.ssm_conv1d.weight"),
                &[g.conv_kernel as u64, cd],
            )?,
            a: self.vector(&format!("{p}.ssm_a"), hv)?,
            dt_bias: self.vector(&format!("{p}.ssm_dt.bias"), hv)?,
            norm: self.vector(&format!("{p}.ssm_norm.weight"), g.dv as u64)?,
        })
    }

    fn layer(&self, i: usize, kind: LayerKind) -> Result<LayerWeights<B>, ModelError> {
        let p = format!("blk.{i}");
        let d = self.cfg.hidden as u64;
        let mixer = match kind {
            LayerKind::FullAttention => Mixer::Attention(self.attention(&p)?),
            LayerKind::GatedDeltaNet => Mixer::DeltaNet(self.deltanet(&p)?),
        };
        Ok(LayerWeights {
            attn_norm: self.vector(&format!("{p}.attn_norm.weight"), d)?,
            post_norm: self.vector(&format!("{p}.post_attention_norm.weight"), d)?,
            mixer,
            ffn: self.ffn(&p)?,
        })
    }

    fn mtp(&self, i: usize) -> Result<MtpWeights<B>, ModelError> {
        let p = format!("blk.{i}");
        let d = self.cfg.hidden as u64;
        let v = self.cfg.vocab as u64;
        let opt_matrix = |name: String| -> Result<Option<Matrix<B>>, ModelError> {
            if self.has(&name) {
                Ok(Some(self.matrix(&name, d, v)?))
            } else {
                Ok(None)
            }
        };
        let head_norm_name = format!("{p}.nextn.shared_head_norm.weight");
        Ok(MtpWeights {
            eh_proj: self.matrix(&format!("{p}.nextn.eh_proj.weight"), 2 * d, d)?,
            enorm: self.vector(&format!("{p}.nextn.enorm.weight"), d)?,
            hnorm: self.vector(&format!("{p}.nextn.hnorm.weight"), d)?,
            head_norm: if self.has(&head_norm_name) {
                Some(self.vector(&head_norm_name, d)?)
            } else {
                None
            },
            block: self.layer(i, LayerKind::FullAttention)?,
            embed: opt_matrix(format!("{p}.nextn.embed_tokens.weight"))?,
            head: opt_matrix(format!("{p}.nextn.shared_head_head.weight"))?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matrices_take_the_stock_types_llama_cpp_writes_and_the_pn_types() {
        use GgmlType::*;
        let m = matrix_types();
        for ty in [
            F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K, Iq4Nl, Iq4Xs,
            Iq3Xxs, Iq3S, Iq2Xxs, Iq2Xs, Iq2S, Iq1S, Iq1M, Tq1_0, Tq2_0, Pn3t, Pn4t,
        ] {
            assert!(m.contains(&ty), "{ty}");
        }
        for ty in [Mxfp4, Nvfp4, Q8K, Q8_1, I8, F64] {
            assert!(!m.contains(&ty), "{ty}");
        }
    }
}
