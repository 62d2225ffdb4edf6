//! Checkpoint tensor names to GGUF names, the transform each tensor gets, and the shape
//! config.json implies for it.
//!
//! The names and transforms are those llama.cpp's `convert_hf_to_gguf.py` uses for `qwen35`
//! (documented in tests/data/tiny-qwen35/README.md, "Converter transforms"): RMSNorm weights
//! (except the gated norm of Gated DeltaNet) are stored as `1 + w`; `A_log` becomes
//! `ssm_a = -exp(A_log)`; `dt_bias` is renamed `ssm_dt.bias`; the conv1d weight loses its
//! middle dimension; and where there are more value heads than key heads the value heads are
//! moved from grouped to tiled order in every tensor that has a value-head axis.

use super::config::Qwen35Config;

/// What happens to a tensor's values on the way to the GGUF.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueOp {
    /// Copied.
    None,
    /// `1 + w` (zero-centred RMSNorm weights).
    PlusOne,
    /// `-exp(w)` (`A_log` to `ssm_a`).
    NegExp,
}

/// A permutation of value heads from grouped order (`g * r + s`: key group `g`, `r` value heads
/// per key head) to tiled order (`s * nk + g`), applied to blocks of `d` consecutive rows or
/// columns starting at `start`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadReorder {
    /// Key heads (`nk`).
    pub nk: u64,
    /// Value heads per key head (`r`).
    pub r: u64,
    /// Rows (or columns) per head.
    pub d: u64,
    /// First row (or column) of the permuted range; the ones before stay.
    pub start: u64,
    /// Permute columns (the input dimension) instead of rows.
    pub columns: bool,
}

impl HeadReorder {
    /// The input index that output index `o` takes its data from.
    pub fn source(&self, o: u64) -> u64 {
        if o < self.start {
            return o;
        }
        let rel = o - self.start;
        let (head, e) = (rel / self.d, rel % self.d);
        // Output head j' = s * nk + g holds input head g * r + s.
        let (s, g) = (head / self.nk, head % self.nk);
        self.start + (g * self.r + s) * self.d + e
    }
}

/// Where a checkpoint tensor goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// The GGUF name.
    pub gguf: String,
    /// Value transform.
    pub op: ValueOp,
    /// Head permutation, if any.
    pub reorder: Option<HeadReorder>,
    /// The checkpoint shape config.json implies (row-major).
    pub expected_shape: Vec<u64>,
    /// Drop the size-1 middle dimension (the conv1d weight `[C, 1, K]` becomes `[C, K]`).
    pub squeeze: bool,
    /// Stored as F32 whatever the output type (norms, 1-D tensors, the conv kernel).
    pub force_f32: bool,
}

/// The checkpoint name with the multimodal prefixes removed (`model.language_model.` to
/// `model.`, `model.mtp.` to `mtp.`), or `None` for tensors of other modalities, which are
/// not converted.
pub fn normalise(name: &str) -> Option<String> {
    let vision = [
        "visual.",
        "vision.",
        "audio.",
        "vision_",
        "audio_",
        "merger.",
        "patch_embed",
    ];
    if name.starts_with("mlp") || vision.iter().any(|v| name.contains(v)) {
        return None;
    }
    let n = name.replacen("language_model.", "", 1);
    Some(match n.strip_prefix("model.mtp.") {
        Some(rest) => format!("mtp.{rest}"),
        None => n,
    })
}

/// A tensor copied as it is, of checkpoint shape `shape`.
fn plain(gguf: impl Into<String>, shape: Vec<u64>) -> Mapping {
    Mapping {
        gguf: gguf.into(),
        op: ValueOp::None,
        reorder: None,
        expected_shape: shape,
        squeeze: false,
        force_f32: false,
    }
}

/// A zero-centred RMSNorm weight of `n` elements: stored as F32 `1 + w`.
fn norm(gguf: impl Into<String>, n: u64) -> Mapping {
    Mapping {
        gguf: gguf.into(),
        op: ValueOp::PlusOne,
        reorder: None,
        expected_shape: vec![n],
        squeeze: false,
        force_f32: true,
    }
}

/// Maps the normalised checkpoint name `name`; `None` if the architecture has no such tensor.
pub fn map(name: &str, cfg: &Qwen35Config) -> Option<Mapping> {
    let h = cfg.hidden;
    match name {
        "model.embed_tokens.weight" => {
            return Some(plain("token_embd.weight", vec![cfg.vocab_size, h]))
        }
        "lm_head.weight" => return Some(plain("output.weight", vec![cfg.vocab_size, h])),
        "model.norm.weight" => return Some(norm("output_norm.weight", h)),
        _ => {}
    }
    // MTP tensors: `mtp.layers.J.X` is block `layers + J`; `mtp.{fc, pre_fc_norm_*, norm}` belong
    // to the first MTP block.
    if let Some(rest) = name.strip_prefix("mtp.") {
        let bid = cfg.layers;
        if let Some(r) = rest.strip_prefix("layers.") {
            let (j, tail) = r.split_once('.')?;
            let j: u64 = j.parse().ok()?;
            if j >= cfg.mtp_layers {
                return None;
            }
            return layer_tensor(cfg.layers + j, tail, cfg, false);
        }
        if cfg.mtp_layers == 0 {
            return None;
        }
        return match rest {
            "fc.weight" => Some(plain(
                format!("blk.{bid}.nextn.eh_proj.weight"),
                vec![h, 2 * h],
            )),
            "pre_fc_norm_embedding.weight" => {
                Some(norm(format!("blk.{bid}.nextn.enorm.weight"), h))
            }
            "pre_fc_norm_hidden.weight" => Some(norm(format!("blk.{bid}.nextn.hnorm.weight"), h)),
            "norm.weight" => Some(norm(format!("blk.{bid}.nextn.shared_head_norm.weight"), h)),
            _ => None,
        };
    }
    let r = name.strip_prefix("model.layers.")?;
    let (i, tail) = r.split_once('.')?;
    let i: u64 = i.parse().ok()?;
    if i >= cfg.layers {
        return None;
    }
    layer_tensor(i, tail, cfg, cfg.recurrent[i as usize])
}

/// A tensor of decoder block `bid` (`tail` is the name after `layers.N.`); `recurrent` says
/// whether the block is Gated DeltaNet (else full attention).
fn layer_tensor(bid: u64, tail: &str, cfg: &Qwen35Config, recurrent: bool) -> Option<Mapping> {
    let h = cfg.hidden;
    let b = |s: &str| format!("blk.{bid}.{s}");
    let common = match tail {
        "input_layernorm.weight" => Some(norm(b("attn_norm.weight"), h)),
        "post_attention_layernorm.weight" => Some(norm(b("post_attention_norm.weight"), h)),
        "mlp.gate_proj.weight" => Some(plain(b("ffn_gate.weight"), vec![cfg.intermediate, h])),
        "mlp.up_proj.weight" => Some(plain(b("ffn_up.weight"), vec![cfg.intermediate, h])),
        "mlp.down_proj.weight" => Some(plain(b("ffn_down.weight"), vec![h, cfg.intermediate])),
        _ => None,
    };
    if common.is_some() {
        return common;
    }
    if !recurrent {
        let (nh, nkv, hd) = (cfg.heads, cfg.kv_heads, cfg.head_dim);
        let q_rows = nh * hd * if cfg.attn_output_gate { 2 } else { 1 };
        return match tail {
            "self_attn.q_proj.weight" => Some(plain(b("attn_q.weight"), vec![q_rows, h])),
            "self_attn.k_proj.weight" => Some(plain(b("attn_k.weight"), vec![nkv * hd, h])),
            "self_attn.v_proj.weight" => Some(plain(b("attn_v.weight"), vec![nkv * hd, h])),
            "self_attn.o_proj.weight" => Some(plain(b("attn_output.weight"), vec![h, nh * hd])),
            "self_attn.q_norm.weight" => Some(norm(b("attn_q_norm.weight"), hd)),
            "self_attn.k_norm.weight" => Some(norm(b("attn_k_norm.weight"), hd)),
            _ => None,
        };
    }
    let (nk, nv, dk, dv) = (
        cfg.lin_k_heads,
        cfg.lin_v_heads,
        cfg.lin_k_dim,
        cfg.lin_v_dim,
    );
    let reorder = |d: u64, start: u64, columns: bool| {
        (nk != nv).then_some(HeadReorder {
            nk,
            r: nv / nk,
            d,
            start,
            columns,
        })
    };
    let channels = cfg.conv_channels();
    let mut m = match tail {
        "linear_attn.in_proj_qkv.weight" => plain(b("attn_qkv.weight"), vec![channels, h]),
        "linear_attn.in_proj_z.weight" => plain(b("attn_gate.weight"), vec![nv * dv, h]),
        "linear_attn.in_proj_b.weight" => plain(b("ssm_beta.weight"), vec![nv, h]),
        "linear_attn.in_proj_a.weight" => plain(b("ssm_alpha.weight"), vec![nv, h]),
        "linear_attn.out_proj.weight" => plain(b("ssm_out.weight"), vec![h, nv * dv]),
        "linear_attn.A_log" => plain(b("ssm_a"), vec![nv]),
        "linear_attn.dt_bias" => plain(b("ssm_dt.bias"), vec![nv]),
        "linear_attn.conv1d.weight" => {
            plain(b("ssm_conv1d.weight"), vec![channels, 1, cfg.conv_kernel])
        }
        // The gated norm is plain `w * x`: no offset.
        "linear_attn.norm.weight" => plain(b("ssm_norm.weight"), vec![dv]),
        _ => return None,
    };
    m.reorder = match tail {
        "linear_attn.in_proj_qkv.weight" | "linear_attn.conv1d.weight" => {
            reorder(dv, 2 * nk * dk, false)
        }
        "linear_attn.in_proj_z.weight" => reorder(dv, 0, false),
        "linear_attn.in_proj_b.weight"
        | "linear_attn.in_proj_a.weight"
        | "linear_attn.A_log"
        | "linear_attn.dt_bias" => reorder(1, 0, false),
        "linear_attn.out_proj.weight" => reorder(dv, 0, true),
        _ => None,
    };
    match tail {
        "linear_attn.A_log" => {
            m.op = ValueOp::NegExp;
            m.force_f32 = true;
        }
        "linear_attn.dt_bias" | "linear_attn.norm.weight" => m.force_f32 = true,
        "linear_attn.conv1d.weight" => {
            m.squeeze = true;
            m.force_f32 = true;
        }
        _ => {}
    }
    Some(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reorder_moves_grouped_heads_to_tiled_positions() {
        // nk = 2, r = 3: HF heads [g0s0 g0s1 g0s2 g1s0 g1s1 g1s2] -> [g0s0 g1s0 g0s1 g1s1 g0s2 g1s2].
        let p = HeadReorder {
            nk: 2,
            r: 3,
            d: 1,
            start: 0,
            columns: false,
        };
        let got: Vec<u64> = (0..6).map(|o| p.source(o)).collect();
        assert_eq!(got, vec![0, 3, 1, 4, 2, 5]);
        // Rows before `start` stay; blocks of d rows move together.
        let p = HeadReorder {
            d: 2,
            start: 4,
            ..p
        };
        let got: Vec<u64> = (0..16).map(|o| p.source(o)).collect();
        assert_eq!(
            got,
            vec![0, 1, 2, 3, 4, 5, 10, 11, 6, 7, 12, 13, 8, 9, 14, 15]
        );
    }

    #[test]
    fn multimodal_names_normalise_and_vision_is_skipped() {
        assert_eq!(
            normalise("model.language_model.layers.0.mlp.up_proj.weight").as_deref(),
            Some("model.layers.0.mlp.up_proj.weight")
        );
        assert_eq!(
            normalise("model.mtp.fc.weight").as_deref(),
            Some("mtp.fc.weight")
        );
        assert_eq!(normalise("model.visual.blocks.0.attn.qkv.weight"), None);
    }
}
