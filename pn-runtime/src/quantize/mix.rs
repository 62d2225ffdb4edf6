//! Tensor roles and the named type mixes (pn-format-decisions.md section 7).
//!
//! A role is what a tensor does in the model, decided from its name and shape; a mix maps roles
//! to types. Keeping the two apart lets one table of roles serve every mix, and lets the summary
//! report sizes per role.

use super::error::QuantizeError;
use gguf_io::GgmlType;
use std::fmt;

/// What a tensor is for, as far as choosing its type goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// A matrix that reads the residual stream (K = hidden): `attn_q`, `attn_qkv`, `attn_gate`,
    /// `ffn_gate`, `ffn_up`. pn3t in the P0k mixes, the promotion candidates.
    ResidualReader,
    /// `attn_k`, `attn_v` (K = hidden, kept at 4 bits).
    AttnKv,
    /// Matrices with any other K: `attn_output`, `ssm_out`, `ffn_down`, `nextn.eh_proj`.
    OtherK,
    /// `token_embd` (and an optional `nextn.embed_tokens`).
    TokenEmbd,
    /// `output` (and an optional `nextn.shared_head_head`).
    Output,
    /// `ssm_alpha`, `ssm_beta`.
    SsmAlphaBeta,
    /// Norms, `ssm_a`, `ssm_dt.bias`, `ssm_conv1d`, every 1-D tensor: always F32.
    Vector,
}

impl Role {
    /// Every role, in report order.
    pub const ALL: [Role; 7] = [
        Role::ResidualReader,
        Role::AttnKv,
        Role::OtherK,
        Role::TokenEmbd,
        Role::Output,
        Role::SsmAlphaBeta,
        Role::Vector,
    ];

    /// A short label for tables.
    pub fn label(self) -> &'static str {
        match self {
            Role::ResidualReader => "residual readers (q/qkv/gate/ffn_gate/ffn_up)",
            Role::AttnKv => "attn_k/attn_v",
            Role::OtherK => "other K (attn_output/ssm_out/ffn_down/eh_proj)",
            Role::TokenEmbd => "token_embd",
            Role::Output => "output",
            Role::SsmAlphaBeta => "ssm_alpha/ssm_beta",
            Role::Vector => "vectors/norms/conv (F32)",
        }
    }
}

/// The part of a tensor name after `blk.N.` (or the whole name for global tensors), without a
/// trailing `.weight`/`.bias` only when that leaves the role word (`ssm_dt.bias` keeps its suffix).
fn base_name(name: &str) -> &str {
    let rest = match name.strip_prefix("blk.") {
        Some(r) => match r.find('.') {
            Some(i) => &r[i + 1..],
            None => r,
        },
        None => name,
    };
    rest.strip_suffix(".weight").unwrap_or(rest)
}

/// Decides a tensor's role from its name and GGUF dims (fastest first; `dims[0]` is K).
pub fn classify(name: &str, dims: &[u64], hidden: u64) -> Result<Role, QuantizeError> {
    let base = base_name(name);
    let k = dims.first().copied().unwrap_or(0);
    let rows: u64 = dims.iter().skip(1).product();
    let no_rule = |why: &str| QuantizeError::NoRule {
        tensor: name.to_string(),
        k,
        why: why.to_string(),
    };
    // 1-D tensors, norms and the conv kernel stay F32 whatever their name.
    if dims.len() < 2 || rows <= 1 || base.ends_with("norm") || base.starts_with("ssm_conv1d") {
        return Ok(Role::Vector);
    }
    if base == "ssm_a" || base == "ssm_dt.bias" || base == "ssm_dt" {
        return Ok(Role::Vector);
    }
    let role = match base {
        "token_embd" | "nextn.embed_tokens" => Role::TokenEmbd,
        "output" | "nextn.shared_head_head" => Role::Output,
        "ssm_alpha" | "ssm_beta" => Role::SsmAlphaBeta,
        "attn_k" | "attn_v" => Role::AttnKv,
        "attn_q" | "attn_qkv" | "attn_gate" | "ffn_gate" | "ffn_up" => Role::ResidualReader,
        "attn_output" | "ssm_out" | "ffn_down" | "nextn.eh_proj" => Role::OtherK,
        _ => {
            return Err(no_rule(
                "matrix with no rule in the mix (unknown tensor name)",
            ))
        }
    };
    // The roles that read the residual stream must have K = hidden; anything else means the
    // file is not what its names say.
    let needs_hidden = matches!(
        role,
        Role::ResidualReader | Role::AttnKv | Role::SsmAlphaBeta | Role::TokenEmbd | Role::Output
    );
    if needs_hidden && k != hidden {
        return Err(no_rule(&format!(
            "expected K = embedding_length = {hidden} for this role"
        )));
    }
    if role == Role::OtherK && k == hidden {
        return Err(no_rule(
            "expected K different from embedding_length for attn_output/ssm_out/ffn_down/eh_proj",
        ));
    }
    Ok(role)
}

/// What type a role gets; `Pn` types are rotated, stock ones are not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// pn3t (80 weights per block).
    Pn3t,
    /// pn4t (64 weights per block).
    Pn4t,
    /// A stock ggml type, quantized by gguf-io.
    Stock(GgmlType),
}

impl Target {
    /// The ggml type written.
    pub fn ggml(self) -> GgmlType {
        match self {
            Target::Pn3t => GgmlType::Pn3t,
            Target::Pn4t => GgmlType::Pn4t,
            Target::Stock(t) => t,
        }
    }

    /// True for the PN types (stored rotated).
    pub fn is_pn(self) -> bool {
        matches!(self, Target::Pn3t | Target::Pn4t)
    }

    /// The PN type, if this is one.
    pub fn pn(self) -> Option<pn_format::PnType> {
        match self {
            Target::Pn3t => Some(pn_format::PnType::Pn3t),
            Target::Pn4t => Some(pn_format::PnType::Pn4t),
            Target::Stock(_) => None,
        }
    }
}

/// The family a mix belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MixKind {
    /// The PN3 mix of section 7 (`P0k+N`: N promotions).
    P0k,
    /// The P0k types, then measured steps up the PN ladder pn3t -> pn4t -> Q8_0
    /// ([`super::kmix::Ladder::Pn`]) while the bytes per 2-D weight stay at or under this many
    /// millionths of a byte: `P0k@0.609`, the PN side of a same-size comparison.
    P0kBudget(u32),
    /// As [`MixKind::P0kBudget`], on the PN ladder with the K mix's upper rungs pn3t -> pn4t ->
    /// Q5_K -> Q6_K -> Q8_0 ([`super::kmix::Ladder::PnK`]): `P0kK@0.609`. The K-quant rungs
    /// follow `--kquant-fallback` as the K mix's tensors do (a stand-in counted at its nominal
    /// size under `simulate`, stepped over under `real`).
    P0kKBudget(u32),
    /// Every PN tensor pn4t (no pn3t, nothing to promote).
    AllPn4t,
    /// The stock stand-in of P0k at about the same size: Q3_K where P0k has pn3t, Q4_K where it
    /// has pn4t; everything else as P0k.
    Q3kLike,
    /// llama.cpp's Q3_K_M type recipe, then `promote` measured steps up the K-quant ladder
    /// ([`super::kmix`]): `q3k-m+N`.
    Q3kM,
    /// The Q3_K_M recipe, then measured steps up the ladder while the bytes per 2-D weight stay
    /// at or under this many millionths of a byte: `q3k-m@0.609`.
    Q3kMBudget(u32),
    /// Every matrix in one stock type (alpha/beta Q8_0, vectors F32).
    AllStock(GgmlType),
}

/// A named mix: the kind plus the default promotion count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mix {
    /// What family of rules applies.
    pub kind: MixKind,
    /// How many pn3t tensors are promoted to pn4t (only meaningful for [`MixKind::P0k`]).
    pub promote: usize,
}

impl Mix {
    /// The default mix, `P0k+19`.
    pub fn p0k19() -> Mix {
        Mix {
            kind: MixKind::P0k,
            promote: 19,
        }
    }

    /// Parses a mix name: `P0k+N`, `P0k` (no promotion), `P0k@BYTES_PER_WEIGHT`,
    /// `P0kK@BYTES_PER_WEIGHT`, `pn4t`,
    /// `q3k-like`, `q3k-m+N`, `q3k-m@BYTES_PER_WEIGHT`, `all-q3_K`, `all-q4_K`, `all-q8_0`
    /// (case-insensitive).
    pub fn parse(name: &str) -> Result<Mix, QuantizeError> {
        let lower = name.to_ascii_lowercase();
        let bad = || QuantizeError::UnknownMix(name.to_string());
        let kind_only = |kind| Ok(Mix { kind, promote: 0 });
        // A budget in millionths of a byte per weight.
        let budget = |b: &str| -> Result<u32, QuantizeError> {
            let b: f64 = b.parse().map_err(|_| bad())?;
            if !(b.is_finite() && b > 0.0 && b < 100.0) {
                return Err(bad());
            }
            Ok((b * 1e6).round() as u32)
        };
        match lower.as_str() {
            "p0k" => kind_only(MixKind::P0k),
            "pn4t" | "all-pn4t" => kind_only(MixKind::AllPn4t),
            "q3k-like" => kind_only(MixKind::Q3kLike),
            "q3k-m" => kind_only(MixKind::Q3kM),
            "all-q3_k" | "all-q3k" => kind_only(MixKind::AllStock(GgmlType::Q3K)),
            "all-q4_k" | "all-q4k" => kind_only(MixKind::AllStock(GgmlType::Q4K)),
            "all-q8_0" | "all-q8" => kind_only(MixKind::AllStock(GgmlType::Q8_0)),
            _ if lower.starts_with("q3k-m@") => {
                kind_only(MixKind::Q3kMBudget(budget(&lower["q3k-m@".len()..])?))
            }
            _ if lower.starts_with("p0kk@") => {
                kind_only(MixKind::P0kKBudget(budget(&lower["p0kk@".len()..])?))
            }
            _ if lower.starts_with("p0k@") => {
                kind_only(MixKind::P0kBudget(budget(&lower["p0k@".len()..])?))
            }
            _ if lower.starts_with("q3k-m+") => {
                let promote = lower["q3k-m+".len()..].parse().map_err(|_| bad())?;
                Ok(Mix {
                    kind: MixKind::Q3kM,
                    promote,
                })
            }
            _ => {
                let n = lower.strip_prefix("p0k+").ok_or_else(bad)?;
                let promote = n.parse::<usize>().map_err(|_| bad())?;
                Ok(Mix {
                    kind: MixKind::P0k,
                    promote,
                })
            }
        }
    }

    /// The promotion count actually used (0 for mixes without pn3t).
    pub fn effective_promote(&self) -> usize {
        if self.kind == MixKind::P0k {
            self.promote
        } else {
            0
        }
    }

    /// The type a role gets before promotion.
    pub fn target(&self, role: Role) -> Target {
        use GgmlType as G;
        let stock = Target::Stock;
        match (self.kind, role) {
            (_, Role::Vector) => stock(G::F32),
            (MixKind::AllStock(t), Role::SsmAlphaBeta) if t != G::Q8_0 => stock(G::Q8_0),
            (MixKind::AllStock(t), _) => stock(t),
            (_, Role::TokenEmbd) => stock(G::Q3K),
            (_, Role::Output) => stock(G::Q4K),
            (_, Role::SsmAlphaBeta) => stock(G::Q8_0),
            (
                MixKind::P0k | MixKind::P0kBudget(_) | MixKind::P0kKBudget(_),
                Role::ResidualReader,
            ) => Target::Pn3t,
            (
                MixKind::P0k | MixKind::P0kBudget(_) | MixKind::P0kKBudget(_) | MixKind::AllPn4t,
                _,
            ) => Target::Pn4t,
            // The q3k-m recipe is per tensor name (`kmix::recipe_type`); by role it starts as
            // q3k-like.
            (MixKind::Q3kLike | MixKind::Q3kM | MixKind::Q3kMBudget(_), Role::ResidualReader) => {
                stock(G::Q3K)
            }
            (MixKind::Q3kLike | MixKind::Q3kM | MixKind::Q3kMBudget(_), _) => stock(G::Q4K),
        }
    }
}

impl fmt::Display for Mix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            MixKind::P0k if self.promote == 0 => write!(f, "P0k"),
            MixKind::P0k => write!(f, "P0k+{}", self.promote),
            MixKind::P0kBudget(b) => write!(f, "P0k@{}", f64::from(b) / 1e6),
            MixKind::P0kKBudget(b) => write!(f, "P0kK@{}", f64::from(b) / 1e6),
            MixKind::AllPn4t => write!(f, "pn4t"),
            MixKind::Q3kLike => write!(f, "q3k-like"),
            MixKind::Q3kM => write!(f, "q3k-m+{}", self.promote),
            MixKind::Q3kMBudget(b) => write!(f, "q3k-m@{}", f64::from(b) / 1e6),
            MixKind::AllStock(t) => write!(f, "all-{}", t.name()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_follow_section_7() {
        let h = 5120;
        let c = |n: &str, d: &[u64]| classify(n, d, h).unwrap();
        assert_eq!(
            c("blk.0.attn_qkv.weight", &[5120, 10240]),
            Role::ResidualReader
        );
        assert_eq!(
            c("blk.3.attn_q.weight", &[5120, 12288]),
            Role::ResidualReader
        );
        assert_eq!(c("blk.3.attn_k.weight", &[5120, 1024]), Role::AttnKv);
        assert_eq!(c("blk.3.attn_output.weight", &[6144, 5120]), Role::OtherK);
        assert_eq!(
            c("blk.64.nextn.eh_proj.weight", &[10240, 5120]),
            Role::OtherK
        );
        assert_eq!(c("blk.0.ssm_alpha.weight", &[5120, 48]), Role::SsmAlphaBeta);
        assert_eq!(c("blk.0.ssm_conv1d.weight", &[4, 10240]), Role::Vector);
        assert_eq!(c("blk.0.ssm_a", &[48]), Role::Vector);
        assert_eq!(c("blk.0.ssm_dt.bias", &[48]), Role::Vector);
        assert_eq!(c("blk.64.nextn.enorm.weight", &[5120]), Role::Vector);
        assert_eq!(c("token_embd.weight", &[5120, 248320]), Role::TokenEmbd);
        assert_eq!(c("output.weight", &[5120, 248320]), Role::Output);
    }

    #[test]
    fn unknown_matrix_and_wrong_k_are_errors() {
        let e = classify("blk.0.mystery.weight", &[5120, 10], 5120).unwrap_err();
        assert!(e.to_string().contains("blk.0.mystery.weight"), "{e}");
        let e = classify("blk.0.ffn_up.weight", &[4096, 10], 5120).unwrap_err();
        assert!(e.to_string().contains("K = 4096"), "{e}");
    }

    #[test]
    fn mix_names_round_trip() {
        for n in [
            "P0k+19",
            "P0k",
            "pn4t",
            "q3k-like",
            "all-q8_0",
            "q3k-m+7",
            "q3k-m@0.609",
            "P0k@0.609",
            "P0kK@0.609",
        ] {
            let m = Mix::parse(n).unwrap();
            assert_eq!(Mix::parse(&m.to_string()).unwrap(), m, "{n}");
        }
        assert_eq!(Mix::parse("p0k+7").unwrap().promote, 7);
        assert!(Mix::parse("P0k+x").is_err());
        assert_eq!(Mix::parse("q3k-m").unwrap().kind, MixKind::Q3kM);
        assert_eq!(
            Mix::parse("q3k-m@0.609").unwrap().kind,
            MixKind::Q3kMBudget(609_000)
        );
        assert!(Mix::parse("q3k-m@x").is_err() && Mix::parse("q3k-m@-1").is_err());
        let pb = Mix::parse("p0k@0.5").unwrap();
        assert_eq!(pb.kind, MixKind::P0kBudget(500_000));
        assert_eq!(pb.target(Role::ResidualReader), Target::Pn3t);
        assert_eq!(pb.target(Role::OtherK), Target::Pn4t);
        assert_eq!(pb.effective_promote(), 0);
        assert!(Mix::parse("p0k@0").is_err() && Mix::parse("p0k@").is_err());
        let pk = Mix::parse("P0kK@0.5").unwrap();
        assert_eq!(pk.kind, MixKind::P0kKBudget(500_000));
        assert_eq!(pk.target(Role::ResidualReader), Target::Pn3t);
        assert!(Mix::parse("p0kk@x").is_err());
        assert_eq!(Mix::p0k19().target(Role::ResidualReader), Target::Pn3t);
        assert_eq!(Mix::p0k19().target(Role::AttnKv), Target::Pn4t);
        assert_eq!(
            Mix::parse("pn4t").unwrap().target(Role::ResidualReader),
            Target::Pn4t
        );
    }
}
