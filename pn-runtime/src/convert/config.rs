//! config.json of a Qwen3.5 checkpoint: the hyper-parameters the tensor shapes and the
//! `qwen35.*` metadata come from. A multimodal config (`Qwen3_5ForConditionalGeneration`) keeps
//! them under `text_config`, which is merged over the top level as llama.cpp's converter does.

use super::error::ConvertError;
use gguf_io::{Array, MetadataEntry, Value};
use serde_json::Value as Json;
use std::path::{Path, PathBuf};

/// The `architectures` entries this converter accepts.
pub const ARCHITECTURES: &[&str] = &["Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration"];

/// The hyper-parameters of a `qwen35` model.
#[derive(Clone, Debug)]
pub struct Qwen35Config {
    /// config.json.
    pub path: PathBuf,
    /// The merged (top level + text_config) JSON object.
    pub raw: serde_json::Map<String, Json>,
    /// Vocabulary rows of the embedding.
    pub vocab_size: u64,
    /// Model width.
    pub hidden: u64,
    /// FFN width.
    pub intermediate: u64,
    /// Main decoder layers.
    pub layers: u64,
    /// MTP blocks (appended as layers `layers..layers + mtp`).
    pub mtp_layers: u64,
    /// Full-attention query heads.
    pub heads: u64,
    /// Full-attention KV heads.
    pub kv_heads: u64,
    /// Full-attention head width.
    pub head_dim: u64,
    /// Gated DeltaNet key heads.
    pub lin_k_heads: u64,
    /// Gated DeltaNet value heads.
    pub lin_v_heads: u64,
    /// Gated DeltaNet key head width.
    pub lin_k_dim: u64,
    /// Gated DeltaNet value head width.
    pub lin_v_dim: u64,
    /// Causal conv kernel taps.
    pub conv_kernel: u64,
    /// True per main layer that is Gated DeltaNet.
    pub recurrent: Vec<bool>,
    /// Whether `q_proj` also holds the output gate rows (2x rows).
    pub attn_output_gate: bool,
    /// Whether the LM head is the embedding.
    pub tie_embeddings: bool,
}

fn field_err(path: &Path, field: &str, msg: impl Into<String>) -> ConvertError {
    ConvertError::Config {
        path: path.to_path_buf(),
        field: field.to_string(),
        msg: msg.into(),
    }
}

impl Qwen35Config {
    /// Reads and checks `dir/config.json`.
    pub fn load(dir: &Path) -> Result<Qwen35Config, ConvertError> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| ConvertError::io(&path, e))?;
        let top: Json = serde_json::from_str(&text).map_err(|e| ConvertError::Json {
            path: path.clone(),
            msg: e.to_string(),
        })?;
        let Json::Object(mut raw) = top else {
            return Err(ConvertError::Json {
                path,
                msg: "not a JSON object".into(),
            });
        };
        let archs: Vec<String> = raw
            .get("architectures")
            .and_then(|a| a.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        if !archs.iter().any(|a| ARCHITECTURES.contains(&a.as_str())) {
            let model_type = raw
                .get("model_type")
                .and_then(|m| m.as_str())
                .unwrap_or("?");
            return Err(ConvertError::WrongArchitecture {
                path,
                found: format!("{archs:?} (model_type {model_type})"),
            });
        }
        if let Some(Json::Object(text_cfg)) = raw.get("text_config").cloned() {
            for (k, v) in text_cfg {
                raw.insert(k, v);
            }
        }
        let u = |field: &str| -> Result<u64, ConvertError> {
            raw.get(field)
                .ok_or_else(|| field_err(&path, field, "missing"))?
                .as_u64()
                .ok_or_else(|| field_err(&path, field, "not a non-negative integer"))
        };
        let layers = u("num_hidden_layers")?;
        let layer_types = raw
            .get("layer_types")
            .and_then(|l| l.as_array())
            .ok_or_else(|| field_err(&path, "layer_types", "missing or not a list"))?;
        let mut recurrent = Vec::with_capacity(layer_types.len());
        for t in layer_types {
            match t.as_str() {
                Some("linear_attention") => recurrent.push(true),
                Some("full_attention") => recurrent.push(false),
                _ => {
                    return Err(field_err(
                        &path,
                        "layer_types",
                        format!("entry {t} is neither linear_attention nor full_attention"),
                    ))
                }
            }
        }
        if recurrent.len() as u64 != layers {
            return Err(field_err(
                &path,
                "layer_types",
                format!("{} entries, num_hidden_layers is {layers}", recurrent.len()),
            ));
        }
        let bool_field = |field: &str, default: bool| {
            raw.get(field).and_then(|b| b.as_bool()).unwrap_or(default)
        };
        let hidden = u("hidden_size")?;
        let heads = u("num_attention_heads")?;
        let head_dim = match raw.get("head_dim") {
            Some(_) => u("head_dim")?,
            None if heads > 0 => hidden / heads,
            None => return Err(field_err(&path, "head_dim", "missing")),
        };
        let cfg = Qwen35Config {
            vocab_size: u("vocab_size")?,
            hidden,
            intermediate: u("intermediate_size")?,
            layers,
            mtp_layers: match raw.get("mtp_num_hidden_layers") {
                Some(_) => u("mtp_num_hidden_layers")?,
                None => 0,
            },
            heads,
            kv_heads: u("num_key_value_heads")?,
            head_dim,
            lin_k_heads: u("linear_num_key_heads")?,
            lin_v_heads: u("linear_num_value_heads")?,
            lin_k_dim: u("linear_key_head_dim")?,
            lin_v_dim: u("linear_value_head_dim")?,
            conv_kernel: u("linear_conv_kernel_dim")?,
            recurrent,
            attn_output_gate: bool_field("attn_output_gate", true),
            tie_embeddings: bool_field("tie_word_embeddings", false),
            path: path.clone(),
            raw,
        };
        if cfg.lin_k_heads == 0 || !cfg.lin_v_heads.is_multiple_of(cfg.lin_k_heads) {
            return Err(field_err(
                &path,
                "linear_num_value_heads",
                format!(
                    "{} value heads are not a multiple of {} key heads",
                    cfg.lin_v_heads, cfg.lin_k_heads
                ),
            ));
        }
        for (field, v) in [
            ("hidden_size", cfg.hidden),
            ("vocab_size", cfg.vocab_size),
            ("num_attention_heads", cfg.heads),
            ("num_key_value_heads", cfg.kv_heads),
        ] {
            if v == 0 {
                return Err(field_err(&path, field, "is 0"));
            }
        }
        Ok(cfg)
    }

    /// All blocks in the GGUF: the main layers then the MTP blocks.
    pub fn block_count(&self) -> u64 {
        self.layers + self.mtp_layers
    }

    /// Rows of `in_proj_qkv` (and channels of the conv): q, k, then v.
    pub fn conv_channels(&self) -> u64 {
        2 * self.lin_k_heads * self.lin_k_dim + self.lin_v_heads * self.lin_v_dim
    }

    /// The `rope_parameters` (or legacy `rope_scaling`) object, if any.
    fn rope_params(&self) -> Option<&serde_json::Map<String, Json>> {
        self.raw
            .get("rope_parameters")
            .or_else(|| self.raw.get("rope_scaling"))
            .and_then(|r| r.as_object())
    }

    fn rope_theta(&self) -> Option<f64> {
        self.rope_params()
            .and_then(|r| r.get("rope_theta"))
            .or_else(|| self.raw.get("rope_theta"))
            .and_then(|t| t.as_f64())
    }

    fn partial_rotary_factor(&self) -> f64 {
        self.rope_params()
            .and_then(|r| r.get("partial_rotary_factor"))
            .or_else(|| self.raw.get("partial_rotary_factor"))
            .and_then(|t| t.as_f64())
            .unwrap_or(0.25)
    }

    /// The `qwen35.*` hyper-parameter keys, in the order llama.cpp's converter writes them
    /// (`general.file_type` falls among them, so it is passed in).
    pub fn metadata(&self, file_type: u32) -> Result<Vec<MetadataEntry>, ConvertError> {
        let a = |k: &str| format!("qwen35.{k}");
        let u32v = |field: &str, v: u64| -> Result<Value, ConvertError> {
            u32::try_from(v)
                .map(Value::U32)
                .map_err(|_| field_err(&self.path, field, format!("{v} does not fit u32")))
        };
        let mut m = vec![MetadataEntry::new(
            a("block_count"),
            u32v("num_hidden_layers", self.block_count())?,
        )];
        if let Some(ctx) = self
            .raw
            .get("max_position_embeddings")
            .and_then(|v| v.as_u64())
        {
            m.push(MetadataEntry::new(
                a("context_length"),
                u32v("max_position_embeddings", ctx)?,
            ));
        }
        m.push(MetadataEntry::new(
            a("embedding_length"),
            u32v("hidden_size", self.hidden)?,
        ));
        m.push(MetadataEntry::new(
            a("feed_forward_length"),
            u32v("intermediate_size", self.intermediate)?,
        ));
        m.push(MetadataEntry::new(
            a("attention.head_count"),
            u32v("num_attention_heads", self.heads)?,
        ));
        m.push(MetadataEntry::new(
            a("attention.head_count_kv"),
            u32v("num_key_value_heads", self.kv_heads)?,
        ));
        let sections = self
            .rope_params()
            .and_then(|r| r.get("mrope_section"))
            .and_then(|s| s.as_array())
            .map(|s| s.iter().map(|x| x.as_i64()).collect::<Option<Vec<i64>>>());
        let sections = match sections {
            Some(Some(mut s)) => {
                s.resize(s.len().max(4), 0);
                s.truncate(4);
                Some(s)
            }
            Some(None) => {
                return Err(field_err(
                    &self.path,
                    "rope_parameters.mrope_section",
                    "not a list of integers",
                ))
            }
            None => None,
        };
        let to_i32 = |s: &[i64]| -> Result<Vec<i32>, ConvertError> {
            s.iter()
                .map(|&x| {
                    i32::try_from(x).map_err(|_| {
                        field_err(&self.path, "rope_parameters.mrope_section", "out of range")
                    })
                })
                .collect()
        };
        if let Some(s) = &sections {
            m.push(MetadataEntry::new(
                a("rope.dimension_sections"),
                Value::Array(Array::I32(to_i32(s)?)),
            ));
        }
        if let Some(theta) = self.rope_theta() {
            m.push(MetadataEntry::new(
                a("rope.freq_base"),
                Value::F32(theta as f32),
            ));
        }
        if let Some(eps) = self.raw.get("rms_norm_eps").and_then(|v| v.as_f64()) {
            m.push(MetadataEntry::new(
                a("attention.layer_norm_rms_epsilon"),
                Value::F32(eps as f32),
            ));
        }
        if self.raw.contains_key("head_dim") {
            m.push(MetadataEntry::new(
                a("attention.key_length"),
                u32v("head_dim", self.head_dim)?,
            ));
            m.push(MetadataEntry::new(
                a("attention.value_length"),
                u32v("head_dim", self.head_dim)?,
            ));
        }
        m.push(MetadataEntry::new(
            "general.file_type",
            Value::U32(file_type),
        ));
        if self.mtp_layers > 0 {
            m.push(MetadataEntry::new(
                a("nextn_predict_layers"),
                u32v("mtp_num_hidden_layers", self.mtp_layers)?,
            ));
        }
        m.push(MetadataEntry::new(
            a("ssm.conv_kernel"),
            u32v("linear_conv_kernel_dim", self.conv_kernel)?,
        ));
        m.push(MetadataEntry::new(
            a("ssm.state_size"),
            u32v("linear_key_head_dim", self.lin_k_dim)?,
        ));
        m.push(MetadataEntry::new(
            a("ssm.group_count"),
            u32v("linear_num_key_heads", self.lin_k_heads)?,
        ));
        m.push(MetadataEntry::new(
            a("ssm.time_step_rank"),
            u32v("linear_num_value_heads", self.lin_v_heads)?,
        ));
        m.push(MetadataEntry::new(
            a("ssm.inner_size"),
            u32v("linear_value_head_dim", self.lin_v_dim * self.lin_v_heads)?,
        ));
        let mut recurrent = self.recurrent.clone();
        // The MTP blocks are full-attention layers.
        recurrent.resize(self.block_count() as usize, false);
        m.push(MetadataEntry::new(
            a("attention.recurrent_layers"),
            Value::Array(Array::Bool(recurrent)),
        ));
        let interval = match self.raw.get("full_attention_interval") {
            Some(v) => v.as_u64().ok_or_else(|| {
                field_err(&self.path, "full_attention_interval", "not an integer")
            })?,
            None => 4,
        };
        m.push(MetadataEntry::new(
            a("full_attention_interval"),
            u32v("full_attention_interval", interval)?,
        ));
        let rope_dims = (self.head_dim as f64 * self.partial_rotary_factor()) as u64;
        m.push(MetadataEntry::new(
            a("rope.dimension_count"),
            u32v("partial_rotary_factor", rope_dims)?,
        ));
        if sections.is_none() {
            // Qwen3.5 always uses interleaved M-RoPE; the loader needs the key, so the
            // converter writes the architecture's default sections when the config has none.
            m.push(MetadataEntry::new(
                a("rope.dimension_sections"),
                Value::Array(Array::I32(vec![11, 11, 10, 0])),
            ));
        }
        Ok(m)
    }
}
