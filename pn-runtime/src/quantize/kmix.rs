//! The stock K-quant baseline `q3k-m`: the type recipe of llama.cpp's Q3_K_M, then promotions up
//! the ladder Q3_K -> Q4_K -> Q5_K -> Q6_K until a step count or a byte budget is reached, so a
//! K-quant file can be compared with a PN file of the same size.
//!
//! The recipe (read from llama.cpp's `llama_tensor_get_type` as facts, not code): `output`
//! Q6_K; `attn_v` Q5_K for the first two such tensors, Q4_K after; `ffn_down` Q5_K in the first
//! `n_layer / 16` layers, Q4_K in the others; `attn_output` and `attn_qkv` Q4_K; every other
//! matrix (`token_embd` included) Q3_K. `ssm_alpha`/`ssm_beta` stay Q8_0 and vectors F32, as in
//! every pn mix.
//!
//! The promotions are chosen by measurement, as the PN mixes' are: each step raises the tensor
//! whose relative error at its current type is the largest (importance-weighted when an
//! imatrix covers the tensor), re-measures it at the new type, and repeats. With a budget, a
//! step that would take the file over it is skipped and the next-worst tensor tried.
//!
//! The same climb serves the PN side of a same-size comparison (`P0k@B`): [`Ladder::Pn`] steps
//! pn3t -> pn4t -> Q8_0 by the same measured rule, so both mixes spend a byte budget the same
//! way. Tensors whose type was fixed by `--tensor-type`, and the MTP block's, are no candidates
//! in either ladder.

use super::codec::ErrStats;
use super::error::QuantizeError;
use super::mix::{MixKind, Role, Target};
use super::plan::{ModelPlan, TensorPlan};
use gguf_io::GgmlType;

/// The recipe's type for a tensor; `attn_v_seen` counts the `attn_v` tensors met so far (in
/// file order, as llama.cpp counts them) and `n_layer` is the trunk's block count.
pub fn recipe_type(name: &str, role: Role, attn_v_seen: &mut usize, n_layer: usize) -> GgmlType {
    use GgmlType as G;
    let base = name
        .strip_prefix("blk.")
        .and_then(|r| r.split_once('.'))
        .map_or(name, |(_, rest)| rest);
    let base = base.strip_suffix(".weight").unwrap_or(base);
    let layer = name
        .strip_prefix("blk.")
        .and_then(|r| r.split('.').next())
        .and_then(|n| n.parse::<usize>().ok());
    match role {
        Role::Vector => return G::F32,
        Role::SsmAlphaBeta => return G::Q8_0,
        Role::Output => return G::Q6K,
        _ => {}
    }
    match base {
        "attn_v" => {
            *attn_v_seen += 1;
            if *attn_v_seen <= 2 {
                G::Q5K
            } else {
                G::Q4K
            }
        }
        "ffn_down" if layer.is_some_and(|l| l < n_layer / 16) => G::Q5K,
        "ffn_down" | "attn_output" | "attn_qkv" => G::Q4K,
        _ => G::Q3K,
    }
}

/// The next type up the ladder, if any.
pub fn step_up(ty: GgmlType) -> Option<GgmlType> {
    match ty {
        GgmlType::Q3K => Some(GgmlType::Q4K),
        GgmlType::Q4K => Some(GgmlType::Q5K),
        GgmlType::Q5K => Some(GgmlType::Q6K),
        _ => None,
    }
}

/// Which ladder a climb uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ladder {
    /// Q3_K -> Q4_K -> Q5_K -> Q6_K ([`step_up`]).
    KQuant,
    /// pn3t -> pn4t -> Q8_0 (the PN mixes' types; Q8_0 is stored unrotated).
    Pn,
    /// pn3t -> pn4t -> Q5_K -> Q6_K -> Q8_0: the PN ladder with the K mix's upper rungs, for
    /// the tensors whose K the K-quant block tiles, or (`simulate`, the K mix's stand-in rule
    /// `--kquant-fallback simulate`) as F32 stand-ins counted at their nominal size. A rung
    /// that cannot hold the tensor is stepped over.
    PnK {
        /// Whether an untiled K-quant rung is an F32 stand-in (else it is stepped over).
        simulate: bool,
    },
}

impl Ladder {
    /// The next type up from `t` on this ladder, if any.
    pub fn next(self, t: Target) -> Option<Target> {
        match (self, t) {
            (Ladder::KQuant, Target::Stock(ty)) => step_up(ty).map(Target::Stock),
            (Ladder::Pn, Target::Pn3t) => Some(Target::Pn4t),
            (Ladder::Pn, Target::Pn4t) => Some(Target::Stock(GgmlType::Q8_0)),
            (Ladder::PnK { .. }, Target::Pn3t) => Some(Target::Pn4t),
            (Ladder::PnK { .. }, Target::Pn4t) => Some(Target::Stock(GgmlType::Q5K)),
            (Ladder::PnK { .. }, Target::Stock(GgmlType::Q5K)) => {
                Some(Target::Stock(GgmlType::Q6K))
            }
            (Ladder::PnK { .. }, Target::Stock(GgmlType::Q6K)) => {
                Some(Target::Stock(GgmlType::Q8_0))
            }
            _ => None,
        }
    }
}

/// `t` retargeted one step up `ladder` ([`retarget`]), `None` if that rung cannot hold it. On
/// [`Ladder::PnK`] the first rung above that can hold it (with `simulate`, an untiled K-quant
/// rung as an F32 stand-in, as the K mix stores it).
pub fn next_step(ladder: Ladder, t: &TensorPlan, rotation: Option<usize>) -> Option<TensorPlan> {
    let mut to = ladder.next(t.encoder.target)?;
    if !matches!(ladder, Ladder::PnK { .. }) {
        return retarget(t, to, rotation);
    }
    loop {
        let sim = matches!(ladder, Ladder::PnK { simulate: true })
            && matches!(to, Target::Stock(GgmlType::Q5K | GgmlType::Q6K));
        let p = if sim && !t.encoder.k.is_multiple_of(to.ggml().block_size()) {
            retarget(t, to, rotation).or_else(|| {
                let mut p = t.clone();
                p.encoder.target = to;
                p.encoder.rotation = None;
                p.encoder.simulated = true;
                Some(p)
            })
        } else {
            retarget(t, to, rotation)
        };
        if p.is_some() {
            return p;
        }
        to = ladder.next(to)?;
    }
}

/// Re-targets `t` to `to`: PN types keep the file's rotation `rotation`, stock types are stored
/// unrotated. `None` when `to` cannot hold a row of `t` (its block does not divide K; a K-quant
/// stand-in that is already simulated stays simulated).
pub fn retarget(t: &TensorPlan, to: Target, rotation: Option<usize>) -> Option<TensorPlan> {
    let k = t.encoder.k;
    let tiles = k.is_multiple_of(to.ggml().block_size());
    // An F32 stand-in of a K-quant can stand in for the next K-quant too.
    let stand_in = t.encoder.simulated && !to.is_pn();
    if !(tiles || stand_in) {
        return None;
    }
    if to.is_pn() && rotation.is_some_and(|r| !k.is_multiple_of(r)) {
        return None;
    }
    let mut p = t.clone();
    p.encoder.target = to;
    p.encoder.rotation = if to.is_pn() { rotation } else { None };
    p.encoder.simulated = t.encoder.simulated && !tiles;
    Some(p)
}

/// True for the `q3k-m` mixes.
pub fn is_q3km(kind: MixKind) -> bool {
    matches!(kind, MixKind::Q3kM | MixKind::Q3kMBudget(_))
}

/// How far the ladder climbs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Climb {
    /// At most this many single steps.
    Steps(usize),
    /// As many steps as keep the bytes per weight over every 2-D tensor (nominal bytes for
    /// simulated tensors) at or under this.
    Budget(f64),
}

/// Bytes and weights over every 2-D tensor of the plan.
pub fn bytes_2d(plan: &ModelPlan) -> (u64, u64) {
    plan.tensors
        .iter()
        .filter(|t| t.dims.len() == 2)
        .fold((0, 0), |(b, p), t| (b + t.nominal_bytes(), p + t.params()))
}

/// One promotion step taken.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// The tensor.
    pub name: String,
    /// Its type before and after.
    pub from: GgmlType,
    /// The new type.
    pub to: GgmlType,
    /// The relative error (weighted where measured so) that ranked it.
    pub rel: f64,
}

/// Climbs `ladder`; `measure` encodes one tensor as planned and returns its error sums.
/// Tensors with a measured real fallback are not candidates (their type was chosen for parity),
/// nor are tensors whose type was fixed (`--tensor-type`), nor the MTP block's (they do not
/// change the main head's output: bytes spent there buy no quality the budget is judged by).
pub fn climb(
    plan: &mut ModelPlan,
    limit: Climb,
    ladder: Ladder,
    mut measure: impl FnMut(&TensorPlan) -> Result<ErrStats, QuantizeError>,
) -> Result<Vec<Step>, QuantizeError> {
    let max_steps = match limit {
        Climb::Steps(n) => n,
        Climb::Budget(_) => usize::MAX,
    };
    let mut steps = Vec::new();
    if max_steps == 0 {
        return Ok(steps);
    }
    let rotation = plan.rotation;
    let candidate = |t: &TensorPlan| {
        t.fallback.is_none()
            && !t.fixed
            && !t.mtp
            && ladder.next(t.encoder.target).is_some()
            && !matches!(t.role, Role::Vector | Role::SsmAlphaBeta)
    };
    // (relative error at the current type, tensor index); re-measured after each step.
    let mut scored: Vec<(f64, usize)> = Vec::new();
    for i in 0..plan.tensors.len() {
        if candidate(&plan.tensors[i]) {
            scored.push((measure(&plan.tensors[i])?.rel_weighted(), i));
        }
    }
    let (mut bytes, params) = bytes_2d(plan);
    while steps.len() < max_steps && !scored.is_empty() {
        scored.sort_by(|a, b| {
            b.0.total_cmp(&a.0)
                .then_with(|| plan.tensors[a.1].name().cmp(plan.tensors[b.1].name()))
        });
        let mut took = None;
        for (pos, &(rel, i)) in scored.iter().enumerate() {
            let t = &plan.tensors[i];
            let Some(probe) = next_step(ladder, t, rotation) else {
                continue;
            };
            let new_bytes = bytes - t.nominal_bytes() + probe.nominal_bytes();
            if let Climb::Budget(b) = limit {
                if params == 0 || new_bytes as f64 / params as f64 > b {
                    continue;
                }
            }
            took = Some((pos, i, probe, rel, new_bytes));
            break;
        }
        let Some((pos, i, probe, rel, new_bytes)) = took else {
            break;
        };
        bytes = new_bytes;
        let from = plan.tensors[i].encoder.target.ggml();
        let to = probe.encoder.target;
        plan.tensors[i] = probe;
        let t = &mut plan.tensors[i];
        t.promoted = true;
        steps.push(Step {
            name: t.name().to_string(),
            from,
            to: to.ggml(),
            rel,
        });
        if next_step(ladder, &plan.tensors[i], rotation).is_some() {
            scored[pos].0 = measure(&plan.tensors[i])?.rel_weighted();
        } else {
            scored.remove(pos);
        }
    }
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recipe_follows_q3_k_m() {
        let mut v = 0;
        let mut t = |n: &str, r| recipe_type(n, r, &mut v, 32);
        assert_eq!(t("output.weight", Role::Output), GgmlType::Q6K);
        assert_eq!(t("token_embd.weight", Role::TokenEmbd), GgmlType::Q3K);
        assert_eq!(t("blk.0.attn_v.weight", Role::AttnKv), GgmlType::Q5K);
        assert_eq!(t("blk.1.attn_v.weight", Role::AttnKv), GgmlType::Q5K);
        assert_eq!(t("blk.2.attn_v.weight", Role::AttnKv), GgmlType::Q4K);
        assert_eq!(t("blk.2.attn_k.weight", Role::AttnKv), GgmlType::Q3K);
        assert_eq!(t("blk.1.ffn_down.weight", Role::OtherK), GgmlType::Q5K);
        assert_eq!(t("blk.2.ffn_down.weight", Role::OtherK), GgmlType::Q4K);
        assert_eq!(t("blk.9.attn_output.weight", Role::OtherK), GgmlType::Q4K);
        assert_eq!(
            t("blk.9.attn_qkv.weight", Role::ResidualReader),
            GgmlType::Q4K
        );
        assert_eq!(
            t("blk.9.ffn_up.weight", Role::ResidualReader),
            GgmlType::Q3K
        );
        assert_eq!(t("blk.9.ssm_out.weight", Role::OtherK), GgmlType::Q3K);
        assert_eq!(
            t("blk.9.ssm_beta.weight", Role::SsmAlphaBeta),
            GgmlType::Q8_0
        );
        assert_eq!(step_up(GgmlType::Q3K), Some(GgmlType::Q4K));
        assert_eq!(step_up(GgmlType::Q6K), None);
    }
}
