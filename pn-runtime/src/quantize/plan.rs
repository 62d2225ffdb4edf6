//! The per-tensor plan: role, target type, rotation, and what happens to a K-quant whose
//! super-block does not tile K (a measured real fallback, or an F32 simulation).

use super::codec::{input_supported, RowEncoder};
use super::error::QuantizeError;
use super::fallback::{FallbackChoice, FallbackPolicy};
use super::kmix;
use super::mix::{classify, Mix, Role, Target};
use super::rotation::{self, RotationChoice};
use super::source::InputModel;
use gguf_io::GgmlType;
use std::path::Path;

/// One input tensor and what will be written for it.
#[derive(Clone, Debug)]
pub struct TensorPlan {
    /// The role the mix assigned from name and shape.
    pub role: Role,
    /// GGUF dims (fastest first), unchanged in the output.
    pub dims: Vec<u64>,
    /// The input type.
    pub in_ty: GgmlType,
    /// Number of rows (product of dims after the first).
    pub rows: u64,
    /// Bytes of the input tensor.
    pub in_bytes: u64,
    /// How rows are encoded (target type, rotation, simulation).
    pub encoder: RowEncoder,
    /// True if promoted from pn3t to pn4t.
    pub promoted: bool,
    /// Set when the mix's K-quant cannot tile K and [`FallbackPolicy::Real`] is in force:
    /// the K-quant asked for (until [`super::resolve_fallbacks`] measures and picks a type).
    pub fallback_from: Option<GgmlType>,
    /// The measured fallback decision, once made.
    pub fallback: Option<FallbackChoice>,
    /// The type was fixed by a `--tensor-type` override: no promotion or climb changes it.
    pub fixed: bool,
    /// The tensor belongs to the multi-token-prediction block (`blk.N.*` with `N` past the
    /// trunk): it does not change the main head's output, so the byte-budget climbs leave it.
    pub mtp: bool,
}

impl TensorPlan {
    /// Tensor name.
    pub fn name(&self) -> &str {
        &self.encoder.tensor
    }

    /// Bytes of the output tensor.
    pub fn out_bytes(&self) -> u64 {
        self.encoder.out_row_bytes() as u64 * self.rows
    }

    /// Bytes the intended type would take: the file's bytes, except for simulated stock tensors,
    /// which count the type's bits per weight over the real K (their zero padding is an artifact
    /// of small test models, not part of the type's cost).
    pub fn nominal_bytes(&self) -> u64 {
        if !self.encoder.simulated {
            return self.out_bytes();
        }
        let ty = self.encoder.target.ggml();
        (self.params() * ty.type_size() as u64).div_ceil(ty.block_size() as u64)
    }

    /// Weights in the tensor.
    pub fn params(&self) -> u64 {
        self.encoder.k as u64 * self.rows
    }
}

/// The plan of a whole model.
#[derive(Clone, Debug)]
pub struct ModelPlan {
    /// Tensors in input order.
    pub tensors: Vec<TensorPlan>,
    /// The Hadamard block size applied to PN tensors (`None`: no rotation).
    pub rotation: Option<usize>,
}

/// Reads `general.architecture` and the hidden size, failing for anything but `qwen35`.
pub fn check_arch(file: &InputModel, path: &Path) -> Result<u64, QuantizeError> {
    let arch = file
        .get_str("general.architecture")
        .map_err(|e| QuantizeError::NotQwen35 {
            path: path.to_path_buf(),
            found: format!("<{e}>"),
        })?;
    if arch != "qwen35" {
        return Err(QuantizeError::NotQwen35 {
            path: path.to_path_buf(),
            found: arch.to_string(),
        });
    }
    file.get_u64("qwen35.embedding_length")
        .map_err(|e| QuantizeError::Gguf {
            path: path.to_path_buf(),
            source: e,
        })
}

/// Builds the plan (before promotion) of every tensor.
pub fn make_plan(
    file: &InputModel,
    path: &Path,
    mix: &Mix,
    rotation: RotationChoice,
    policy: FallbackPolicy,
) -> Result<ModelPlan, QuantizeError> {
    let hidden = check_arch(file, path)?;
    let mut tensors = Vec::new();
    // The q3k-m recipe counts layers as llama.cpp does (by its `ffn_down` tensors) and the
    // `attn_v` tensors in file order.
    let n_ffn_down = file
        .tensor_infos()
        .iter()
        .filter(|i| i.name.contains("ffn_down"))
        .count();
    let mut attn_v_seen = 0;
    // The MTP blocks are the last `nextn_predict_layers` of `block_count`.
    let first_mtp = file
        .get_u64("qwen35.block_count")
        .ok()
        .map(|b| b.saturating_sub(file.get_u64("qwen35.nextn_predict_layers").unwrap_or(0)));
    for info in file.tensor_infos() {
        let name = info.name.clone();
        if !input_supported(info.ty) {
            return Err(QuantizeError::UnsupportedInputType {
                tensor: name,
                ty: info.ty.name(),
            });
        }
        let role = classify(&name, &info.dims, hidden)?;
        let target = if kmix::is_q3km(mix.kind) {
            Target::Stock(kmix::recipe_type(&name, role, &mut attn_v_seen, n_ffn_down))
        } else {
            mix.target(role)
        };
        let k = info.dims.first().copied().unwrap_or(1);
        let rows: u64 = info.dims.iter().skip(1).product();
        let bs = target.ggml().block_size() as u64;
        let fits = k.is_multiple_of(bs);
        let simulated = match target {
            Target::Pn3t | Target::Pn4t if !fits => {
                return Err(QuantizeError::NoRule {
                    tensor: name,
                    k,
                    why: format!(
                        "{} needs K to be a multiple of {bs}{}",
                        target.ggml().name(),
                        if target == Target::Pn3t {
                            " (use --mix pn4t for models whose hidden size is not)"
                        } else {
                            ""
                        }
                    ),
                });
            }
            Target::Stock(_) => !fits && policy == FallbackPolicy::Simulate,
            _ => false,
        };
        let fallback_from = match target {
            Target::Stock(t) if !fits && policy == FallbackPolicy::Real => Some(t),
            _ => None,
        };
        let in_bytes = info.n_bytes;
        tensors.push(TensorPlan {
            role,
            dims: info.dims.clone(),
            in_ty: info.ty,
            rows,
            in_bytes,
            encoder: RowEncoder {
                tensor: name,
                target,
                k: k as usize,
                rotation: None,
                simulated,
                weights: None,
            },
            promoted: false,
            fallback_from,
            fallback: None,
            fixed: false,
            mtp: super::stream::layer_of(&info.name)
                .zip(first_mtp)
                .is_some_and(|(l, f)| l as u64 >= f),
        });
    }
    let rotated: Vec<(&str, u64)> = tensors
        .iter()
        .filter(|t| t.encoder.target.is_pn())
        .map(|t| (t.name(), t.encoder.k as u64))
        .collect();
    let r = rotation::resolve(rotation, &rotated)?;
    for t in &mut tensors {
        if t.encoder.target.is_pn() {
            t.encoder.rotation = r;
        }
    }
    Ok(ModelPlan {
        tensors,
        rotation: r,
    })
}

/// Gives every stock K-quant/Q8_0 tensor that `importance` covers (a vector of length K) that
/// vector as its encoding weights; returns how many tensors it weighted.
pub fn set_stock_weights(plan: &mut ModelPlan, importance: &super::imatrix::Importance) -> usize {
    let mut n = 0;
    for t in &mut plan.tensors {
        if t.encoder.target.is_pn() {
            continue;
        }
        if let Some(v) = importance.get(t.name()).filter(|v| v.len() == t.encoder.k) {
            t.encoder.weights = Some(v.as_slice().into());
            if t.encoder.weighted_stock() {
                n += 1;
            } else {
                t.encoder.weights = None;
            }
        }
    }
    n
}

/// Parses a `--tensor-type` value `NAME=TYPE` (a ggml type name: `q6_K`, `q8_0`, `pn4t`, ...,
/// case-insensitive).
pub fn parse_tensor_type(s: &str) -> Result<(String, GgmlType), QuantizeError> {
    let bad = |name: &str, ty: &str, why: &str| QuantizeError::TensorType {
        tensor: name.to_string(),
        ty: ty.to_string(),
        why: why.to_string(),
    };
    let (name, ty) = s
        .split_once('=')
        .ok_or_else(|| bad(s, "", "expected NAME=TYPE, e.g. output.weight=q6_K"))?;
    let t = GgmlType::ALL
        .iter()
        .copied()
        .find(|t| t.name().eq_ignore_ascii_case(ty))
        .ok_or_else(|| bad(name, ty, "unknown ggml type name"))?;
    Ok((name.to_string(), t))
}

/// Applies `--tensor-type` overrides: each named 2-D matrix gets the type asked for and is
/// marked [`TensorPlan::fixed`] (no promotion or climb moves it). A PN type takes the plan's
/// rotation and must tile K and the rotation block; a stock type whose block does not divide K
/// follows `policy` as the mix's own types do (an F32 stand-in counted at its nominal size, or a
/// measured real fallback). Used to give two mixes the same non-trunk tensors in a same-size
/// comparison (see the README's quantizing section).
pub fn apply_overrides(
    plan: &mut ModelPlan,
    overrides: &[(String, GgmlType)],
    policy: FallbackPolicy,
) -> Result<(), QuantizeError> {
    for (name, ty) in overrides {
        let bad = |why: String| QuantizeError::TensorType {
            tensor: name.clone(),
            ty: ty.name().to_string(),
            why,
        };
        let t = plan
            .tensors
            .iter_mut()
            .find(|t| t.name() == name)
            .ok_or_else(|| bad("no tensor of that name in the input".into()))?;
        if matches!(t.role, Role::Vector) {
            return Err(bad(
                "only matrices can be re-typed (vectors stay F32)".into()
            ));
        }
        let target = match ty {
            GgmlType::Pn3t => Target::Pn3t,
            GgmlType::Pn4t => Target::Pn4t,
            other if gguf_io::quants::QUANTIZABLE.contains(other) => Target::Stock(*other),
            other => {
                return Err(bad(format!(
                    "{} is not a type pn quantize writes",
                    other.name()
                )))
            }
        };
        let k = t.encoder.k;
        let tiles = k.is_multiple_of(target.ggml().block_size());
        if target.is_pn() {
            if !tiles {
                return Err(bad(format!(
                    "K = {k} is no multiple of {}",
                    target.ggml().block_size()
                )));
            }
            if let Some(r) = plan.rotation.filter(|&r| !k.is_multiple_of(r)) {
                return Err(bad(format!(
                    "K = {k} is no multiple of the rotation block {r}"
                )));
            }
        }
        t.encoder.target = target;
        t.encoder.rotation = if target.is_pn() { plan.rotation } else { None };
        t.encoder.simulated = !tiles && policy == FallbackPolicy::Simulate;
        t.fallback_from = match target {
            Target::Stock(s) if !tiles && policy == FallbackPolicy::Real => Some(s),
            _ => None,
        };
        t.fixed = true;
    }
    Ok(())
}
