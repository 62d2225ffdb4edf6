//! Hyperparameters of a `qwen35` GGUF (reference: `qwen38-architecture.md` section 1).

use crate::backend::{AttnLayout, GdnDims};
use crate::error::ModelError;
use gguf_io::GgufFile;

/// The architecture name this crate loads.
pub const ARCH: &str = "qwen35";

/// The mixer of one decoder layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// Gated full attention (softmax over a KV cache).
    FullAttention,
    /// Gated DeltaNet (linear attention with a recurrent state).
    GatedDeltaNet,
}

/// Hadamard rotation applied to activations feeding PN tensors (`pn-format-decisions.md` 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rotation {
    /// Block size `R` of the block-diagonal Walsh-Hadamard transform.
    pub block_size: usize,
}

/// Every hyperparameter the forward pass needs.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Hidden size `D` (`embedding_length`).
    pub hidden: usize,
    /// Trunk decoder layers (`block_count - nextn_predict_layers`).
    pub n_layers: usize,
    /// MTP blocks stored after the trunk (`nextn_predict_layers`, 0 if absent).
    pub n_mtp: usize,
    /// FFN width (`feed_forward_length`).
    pub ffn: usize,
    /// Attention query heads.
    pub n_q_heads: usize,
    /// Attention key/value heads.
    pub n_kv_heads: usize,
    /// Attention head dim (`key_length` = `value_length`).
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Trained context length.
    pub context_length: usize,
    /// RoPE base.
    pub rope_theta: f32,
    /// Rotated dims per head (`rope.dimension_count`).
    pub rope_dims: usize,
    /// Gated DeltaNet shape.
    pub gdn: GdnDims,
    /// Vocabulary size (rows of `token_embd`).
    pub vocab: usize,
    /// Mixer kind of each trunk layer.
    pub layer_kinds: Vec<LayerKind>,
    /// Activation rotation for PN tensors, if the file asks for it.
    pub rotation: Option<Rotation>,
}

fn key(name: &str) -> String {
    format!("{ARCH}.{name}")
}

fn get_usize(f: &GgufFile, k: &str) -> Result<usize, ModelError> {
    if f.get(k).is_none() {
        return Err(ModelError::MissingKey { key: k.to_string() });
    }
    Ok(f.get_u64(k)? as usize)
}

fn get_f32(f: &GgufFile, k: &str) -> Result<f32, ModelError> {
    if f.get(k).is_none() {
        return Err(ModelError::MissingKey { key: k.to_string() });
    }
    Ok(f.get_f32(k)?)
}

fn positive(k: &str, v: usize) -> Result<usize, ModelError> {
    if v == 0 {
        return Err(ModelError::BadKey {
            key: k.to_string(),
            reason: "must be positive".into(),
        });
    }
    Ok(v)
}

impl ModelConfig {
    /// Reads and checks the hyperparameters of a `qwen35` file.
    pub fn from_gguf(f: &GgufFile) -> Result<ModelConfig, ModelError> {
        let arch_key = "general.architecture";
        if f.get(arch_key).is_none() {
            return Err(ModelError::MissingKey {
                key: arch_key.into(),
            });
        }
        let arch = f.get_str(arch_key)?;
        if arch != ARCH {
            return Err(ModelError::UnsupportedArch {
                arch: arch.to_string(),
            });
        }
        let u = |name: &str| -> Result<usize, ModelError> {
            let k = key(name);
            positive(&k, get_usize(f, &k)?)
        };
        let block_count = u("block_count")?;
        let n_mtp_key = key("nextn_predict_layers");
        let n_mtp = if f.get(&n_mtp_key).is_some() {
            get_usize(f, &n_mtp_key)?
        } else {
            0
        };
        if n_mtp >= block_count {
            return Err(ModelError::BadKey {
                key: n_mtp_key,
                reason: format!(
                    "{n_mtp} MTP layers leave no trunk layer (block_count {block_count})"
                ),
            });
        }
        let n_layers = block_count - n_mtp;
        let hidden = u("embedding_length")?;
        let ffn = u("feed_forward_length")?;
        let n_q_heads = u("attention.head_count")?;
        let n_kv_heads = u("attention.head_count_kv")?;
        if n_q_heads % n_kv_heads != 0 {
            return Err(ModelError::BadKey {
                key: key("attention.head_count_kv"),
                reason: format!("{n_kv_heads} does not divide head_count {n_q_heads}"),
            });
        }
        let head_dim = u("attention.key_length")?;
        let v_len = u("attention.value_length")?;
        if v_len != head_dim {
            return Err(ModelError::BadKey {
                key: key("attention.value_length"),
                reason: format!("{v_len} differs from attention.key_length {head_dim}"),
            });
        }
        let rms_eps = get_f32(f, &key("attention.layer_norm_rms_epsilon"))?;
        if !(rms_eps > 0.0 && rms_eps < 1.0) {
            return Err(ModelError::BadKey {
                key: key("attention.layer_norm_rms_epsilon"),
                reason: format!("{rms_eps} is not in (0, 1)"),
            });
        }
        let context_length = u("context_length")?;
        let rope_theta = get_f32(f, &key("rope.freq_base"))?;
        if !(rope_theta > 1.0 && rope_theta.is_finite()) {
            return Err(ModelError::BadKey {
                key: key("rope.freq_base"),
                reason: format!("{rope_theta} must be a finite value > 1"),
            });
        }
        let rope_dims = u("rope.dimension_count")?;
        if rope_dims % 2 != 0 || rope_dims > head_dim {
            return Err(ModelError::BadKey {
                key: key("rope.dimension_count"),
                reason: format!("{rope_dims} must be even and at most the head dim {head_dim}"),
            });
        }
        let conv_kernel = u("ssm.conv_kernel")?;
        if !(2..=16).contains(&conv_kernel) {
            return Err(ModelError::BadKey {
                key: key("ssm.conv_kernel"),
                reason: format!("{conv_kernel} is outside 2..=16"),
            });
        }
        let dk = u("ssm.state_size")?;
        let n_k_heads = u("ssm.group_count")?;
        let n_v_heads = u("ssm.time_step_rank")?;
        let inner = u("ssm.inner_size")?;
        if n_v_heads % n_k_heads != 0 {
            return Err(ModelError::BadKey {
                key: key("ssm.time_step_rank"),
                reason: format!(
                    "{n_v_heads} value heads is not a multiple of {n_k_heads} key heads"
                ),
            });
        }
        if inner % n_v_heads != 0 {
            return Err(ModelError::BadKey {
                key: key("ssm.inner_size"),
                reason: format!("{inner} is not a multiple of time_step_rank {n_v_heads}"),
            });
        }
        let gdn = GdnDims {
            n_k_heads,
            n_v_heads,
            dk,
            dv: inner / n_v_heads,
            conv_kernel,
        };
        let layer_kinds = layer_schedule(f, n_layers, block_count)?;
        let vocab = vocab_size(f)?;
        let rotation = rotation(f)?;
        Ok(ModelConfig {
            hidden,
            n_layers,
            n_mtp,
            ffn,
            n_q_heads,
            n_kv_heads,
            head_dim,
            rms_eps,
            context_length,
            rope_theta,
            rope_dims,
            gdn,
            vocab,
            layer_kinds,
            rotation,
        })
    }

    /// Width of the attention q projection: query + gate per head.
    pub fn q_proj_dim(&self) -> usize {
        2 * self.n_q_heads * self.head_dim
    }
    /// Width of the k (and v) projection.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
    /// Width of the concatenated attention head outputs.
    pub fn attn_out_dim(&self) -> usize {
        self.n_q_heads * self.head_dim
    }
    /// Number of full-attention trunk layers.
    pub fn n_attention_layers(&self) -> usize {
        self.layer_kinds
            .iter()
            .filter(|k| **k == LayerKind::FullAttention)
            .count()
    }
    /// Attention layout for a q buffer that holds `[q | gate]` per head (the `attn_q` output).
    pub fn attn_layout(&self) -> AttnLayout {
        AttnLayout {
            n_q_heads: self.n_q_heads,
            n_kv_heads: self.n_kv_heads,
            head_dim: self.head_dim,
            q_token_stride: self.q_proj_dim(),
            q_head_stride: 2 * self.head_dim,
            scale: 1.0 / (self.head_dim as f32).sqrt(),
        }
    }
}

/// Full attention every `full_attention_interval`-th layer, or the explicit
/// `attention.recurrent_layers` list when present (it wins, as in llama.cpp).
fn layer_schedule(
    f: &GgufFile,
    n_layers: usize,
    block_count: usize,
) -> Result<Vec<LayerKind>, ModelError> {
    let list_key = key("attention.recurrent_layers");
    if let Some(v) = f.get(&list_key) {
        let flags: Vec<bool> = match v {
            gguf_io::Value::Array(gguf_io::Array::Bool(b)) => b.clone(),
            _ => {
                // Accept integer arrays (0/1) too.
                f.get_i64_array(&list_key)?
                    .iter()
                    .map(|&x| x != 0)
                    .collect()
            }
        };
        if flags.len() != block_count && flags.len() != n_layers {
            return Err(ModelError::BadKey {
                key: list_key,
                reason: format!(
                    "{} entries, expected block_count {block_count} (or {n_layers} trunk layers)",
                    flags.len()
                ),
            });
        }
        return Ok(flags[..n_layers]
            .iter()
            .map(|&rec| {
                if rec {
                    LayerKind::GatedDeltaNet
                } else {
                    LayerKind::FullAttention
                }
            })
            .collect());
    }
    let k = key("full_attention_interval");
    if f.get(&k).is_none() {
        return Err(ModelError::MissingKey {
            key: format!("{k} (or {list_key})"),
        });
    }
    let interval = positive(&k, get_usize(f, &k)?)?;
    Ok((0..n_layers)
        .map(|i| {
            if (i + 1) % interval == 0 {
                LayerKind::FullAttention
            } else {
                LayerKind::GatedDeltaNet
            }
        })
        .collect())
}

fn vocab_size(f: &GgufFile) -> Result<usize, ModelError> {
    if let Some(v) = f.get("tokenizer.ggml.tokens") {
        if let gguf_io::Value::Array(a) = v {
            return Ok(a.len());
        }
        return Err(ModelError::BadKey {
            key: "tokenizer.ggml.tokens".into(),
            reason: "not an array".into(),
        });
    }
    // No tokenizer in the file (e.g. a synthetic model): the embedding rows define the vocab.
    match f
        .tensor_infos()
        .iter()
        .find(|t| t.name == "token_embd.weight")
    {
        Some(t) if t.dims.len() == 2 => Ok(t.dims[1] as usize),
        _ => Err(ModelError::MissingKey {
            key: "tokenizer.ggml.tokens".into(),
        }),
    }
}

fn rotation(f: &GgufFile) -> Result<Option<Rotation>, ModelError> {
    let kind_key = "pn.rotation.kind";
    let bs_key = "pn.rotation.block_size";
    if f.get(kind_key).is_none() {
        return Ok(None);
    }
    let kind = f.get_str(kind_key)?;
    if kind != "hadamard" {
        return Err(ModelError::BadKey {
            key: kind_key.into(),
            reason: format!("unknown rotation `{kind}` (expected `hadamard`)"),
        });
    }
    let bs = get_usize(f, bs_key)?;
    if !bs.is_power_of_two() || bs < 2 {
        return Err(ModelError::BadKey {
            key: bs_key.into(),
            reason: format!("{bs} is not a power of two >= 2"),
        });
    }
    Ok(Some(Rotation { block_size: bs }))
}
