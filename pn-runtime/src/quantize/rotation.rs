//! Choosing the Hadamard block size (pn-format-decisions.md section 6).

use super::error::QuantizeError;

/// The largest default block: larger blocks spread outliers further but cost more per token.
pub const DEFAULT_CAP: usize = 256;

/// How the user asked for rotation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RotationChoice {
    /// The largest power of two dividing every rotated K, capped at [`DEFAULT_CAP`].
    #[default]
    Default,
    /// An explicit block size (a power of two that must divide every rotated K).
    Block(usize),
    /// No rotation: no `pn.rotation.*` keys are written.
    None,
}

/// The largest power of two dividing `k` (0 for `k == 0`).
fn pow2_part(k: u64) -> u64 {
    if k == 0 {
        0
    } else {
        1u64 << k.trailing_zeros()
    }
}

/// Resolves the block size for tensors `(name, K)` that will be stored rotated.
/// Returns `None` when nothing is rotated.
pub fn resolve(
    choice: RotationChoice,
    rotated: &[(&str, u64)],
) -> Result<Option<usize>, QuantizeError> {
    if rotated.is_empty() {
        return Ok(None);
    }
    match choice {
        RotationChoice::None => Ok(None),
        RotationChoice::Default => {
            let r = rotated
                .iter()
                .map(|&(_, k)| pow2_part(k))
                .min()
                .unwrap_or(1)
                .min(DEFAULT_CAP as u64) as usize;
            if r < 2 {
                // Some K is odd: no common Hadamard block exists.
                let (name, k) = rotated
                    .iter()
                    .find(|(_, k)| !k.is_multiple_of(2))
                    .copied()
                    .unwrap_or(rotated[0]);
                return Err(QuantizeError::RotationBlock {
                    tensor: name.to_string(),
                    k,
                    r: 2,
                });
            }
            Ok(Some(r))
        }
        RotationChoice::Block(r) => {
            if r < 2 || !r.is_power_of_two() {
                return Err(QuantizeError::BadRotationBlock(r));
            }
            if let Some(&(name, k)) = rotated.iter().find(|(_, k)| !k.is_multiple_of(r as u64)) {
                return Err(QuantizeError::RotationBlock {
                    tensor: name.to_string(),
                    k,
                    r,
                });
            }
            Ok(Some(r))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_section_6() {
        let big = [("a", 5120), ("b", 6144), ("c", 17408), ("d", 10240)];
        assert_eq!(resolve(RotationChoice::Default, &big).unwrap(), Some(256));
        let tiny = [("a", 320), ("b", 704), ("c", 1536), ("d", 768), ("e", 640)];
        assert_eq!(resolve(RotationChoice::Default, &tiny).unwrap(), Some(64));
        assert_eq!(resolve(RotationChoice::None, &tiny).unwrap(), None);
        assert_eq!(resolve(RotationChoice::Default, &[]).unwrap(), None);
    }

    #[test]
    fn explicit_block_must_divide_every_k() {
        let tiny = [("blk.0.ffn_down.weight", 704), ("x", 320)];
        let e = resolve(RotationChoice::Block(128), &tiny).unwrap_err();
        assert!(e.to_string().contains("blk.0.ffn_down.weight"), "{e}");
        assert!(resolve(RotationChoice::Block(48), &tiny).is_err());
        assert_eq!(resolve(RotationChoice::Block(32), &tiny).unwrap(), Some(32));
    }
}
