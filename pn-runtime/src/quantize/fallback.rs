//! Real types for K-quant tensors whose row length the 256-weight super-block does not divide.
//!
//! The mixes give `token_embd` Q3_K and `output` Q4_K (and the stock baselines give every
//! matrix a K-quant). On models whose hidden size is not a multiple of 256 (the shipped demo
//! model: 320) those rows cannot be tiled. Two policies:
//!
//! - [`FallbackPolicy::Real`] (default for the PN mixes): measure the K-quant's relative squared
//!   error on the zero-padded rows, then take the *smallest* real type, in the order pn3t, pn4t,
//!   Q8_0, F16, whose error on the same tensor is at most [`SIMILAR`] times that error. PN
//!   candidates use the file's rotation (they must hold whole PN blocks and rotation blocks).
//!   The rule is general (per tensor, measured), not tuned to one model; for models whose K is a
//!   multiple of 256 (every real Qwen3.5/3.8 size) it never triggers.
//! - [`FallbackPolicy::Simulate`] (default for the stock baseline mixes, which exist to measure
//!   what a K-quant would do at its nominal size): store F32 values of the padded quantization
//!   and count the K-quant's nominal size; listed in `pn.simulated`.

use super::codec::{ErrStats, RowEncoder};
use super::error::QuantizeError;
use super::mix::{MixKind, Target};
use gguf_io::GgmlType;

/// "Similar quality": a fallback type may have at most this many times the K-quant's error.
pub const SIMILAR: f64 = 1.25;

/// What to do with a K-quant tensor whose K the super-block does not divide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FallbackPolicy {
    /// Store the smallest real type of similar or better measured quality.
    Real,
    /// Store an F32 stand-in of the padded K-quant (measurement only; the file is large).
    Simulate,
}

impl FallbackPolicy {
    /// The default for a mix: real types for the PN mixes, simulation for the stock baselines.
    pub fn default_for(kind: MixKind) -> FallbackPolicy {
        match kind {
            MixKind::P0k | MixKind::P0kBudget(_) | MixKind::P0kKBudget(_) | MixKind::AllPn4t => {
                FallbackPolicy::Real
            }
            MixKind::Q3kLike | MixKind::Q3kM | MixKind::Q3kMBudget(_) | MixKind::AllStock(_) => {
                FallbackPolicy::Simulate
            }
        }
    }

    /// Parses `real` or `simulate`.
    pub fn parse(s: &str) -> Option<FallbackPolicy> {
        match s.to_ascii_lowercase().as_str() {
            "real" => Some(FallbackPolicy::Real),
            "simulate" | "simulated" => Some(FallbackPolicy::Simulate),
            _ => None,
        }
    }
}

/// The record of one fallback decision (written to `pn.fallback`, shown in the summary).
#[derive(Clone, Debug, PartialEq)]
pub struct FallbackChoice {
    /// The K-quant the mix asked for.
    pub intended: GgmlType,
    /// Its measured relative squared error (zero-padded rows).
    pub intended_rel: f64,
    /// Every candidate tried, in order, with its relative error.
    pub tried: Vec<(GgmlType, f64)>,
    /// The type written.
    pub chosen: Target,
}

impl FallbackChoice {
    /// `intended->chosen`, as stored in the metadata.
    pub fn label(&self) -> String {
        format!("{}->{}", self.intended.name(), self.chosen.ggml().name())
    }
}

/// True for a stock target whose block does not tile K.
pub fn needs_fallback(target: Target, k: u64) -> bool {
    match target {
        Target::Stock(t) => !k.is_multiple_of(t.block_size() as u64),
        _ => false,
    }
}

/// The real candidates for a row of length `k`, smallest first, given the file's rotation.
pub fn candidates(k: usize, rotation: Option<usize>) -> Vec<Target> {
    let rot_ok = rotation.is_none_or(|r| k.is_multiple_of(r));
    let mut v = Vec::new();
    for pn in [Target::Pn3t, Target::Pn4t] {
        if rot_ok && k.is_multiple_of(pn.ggml().block_size()) {
            v.push(pn);
        }
    }
    if k.is_multiple_of(GgmlType::Q8_0.block_size()) {
        v.push(Target::Stock(GgmlType::Q8_0));
    }
    // F16 tiles any K and is always good enough: the chain ends here.
    v.push(Target::Stock(GgmlType::F16));
    v
}

/// The encoder for candidate `target` (PN types rotated with the file's block).
pub fn encoder_for(tensor: &str, k: usize, target: Target, rotation: Option<usize>) -> RowEncoder {
    RowEncoder {
        tensor: tensor.to_string(),
        target,
        k,
        rotation: if target.is_pn() { rotation } else { None },
        simulated: false,
        weights: None,
    }
}

/// Picks the first candidate whose error is within [`SIMILAR`] of the intended type's.
/// `measure` encodes the whole tensor with an encoder and returns the error sums.
pub fn choose(
    tensor: &str,
    k: usize,
    intended: GgmlType,
    rotation: Option<usize>,
    mut measure: impl FnMut(&RowEncoder) -> Result<ErrStats, QuantizeError>,
) -> Result<FallbackChoice, QuantizeError> {
    let sim = RowEncoder {
        tensor: tensor.to_string(),
        target: Target::Stock(intended),
        k,
        rotation: None,
        simulated: true,
        weights: None,
    };
    let intended_rel = measure(&sim)?.rel();
    let cands = candidates(k, rotation);
    let mut tried = Vec::with_capacity(cands.len());
    for (i, &c) in cands.iter().enumerate() {
        let last = i + 1 == cands.len();
        // F16 needs no measurement to be accepted, but it is cheap and makes the record whole.
        let rel = measure(&encoder_for(tensor, k, c, rotation))?.rel();
        tried.push((c.ggml(), rel));
        if last || rel <= intended_rel * SIMILAR {
            return Ok(FallbackChoice {
                intended,
                intended_rel,
                tried,
                chosen: c,
            });
        }
    }
    unreachable!("the candidate list always ends with F16")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_respect_blocks_and_rotation() {
        let names = |v: Vec<Target>| v.iter().map(|t| t.ggml().name()).collect::<Vec<_>>();
        assert_eq!(
            names(candidates(320, Some(64))),
            ["pn3t", "pn4t", "q8_0", "f16"]
        );
        // 896 = 14 x 64 but not a multiple of 80.
        assert_eq!(names(candidates(896, Some(64))), ["pn4t", "q8_0", "f16"]);
        // The rotation block must divide K too.
        assert_eq!(names(candidates(320, Some(128))), ["q8_0", "f16"]);
        assert_eq!(names(candidates(100, None)), ["f16"]);
        assert!(needs_fallback(Target::Stock(GgmlType::Q3K), 320));
        assert!(!needs_fallback(Target::Stock(GgmlType::Q3K), 512));
        assert!(!needs_fallback(Target::Pn3t, 320));
    }

    #[test]
    fn choose_takes_the_smallest_similar_candidate() {
        // Fake errors: intended 0.02, pn3t 0.03 (too much), pn4t 0.024 (within 1.25x).
        let errs = |e: &RowEncoder| -> Result<ErrStats, QuantizeError> {
            let rel = if e.simulated {
                0.02
            } else {
                match e.target.ggml() {
                    GgmlType::Pn3t => 0.03,
                    GgmlType::Pn4t => 0.024,
                    _ => 0.001,
                }
            };
            Ok(ErrStats {
                w2: 1.0,
                e2: rel,
                ..Default::default()
            })
        };
        let c = choose("t", 320, GgmlType::Q3K, Some(64), errs).unwrap();
        assert_eq!(c.chosen, Target::Pn4t);
        assert_eq!(c.label(), "q3_K->pn4t");
        assert_eq!(c.tried.len(), 2);
        let e = encoder_for("t", 320, c.chosen, Some(64));
        assert_eq!(e.rotation, Some(64));
        assert_eq!(
            encoder_for("t", 320, Target::Stock(GgmlType::Q8_0), Some(64)).rotation,
            None
        );
    }
}
