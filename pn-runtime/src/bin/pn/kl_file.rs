//! The compact KL-divergence base file of `pn perplexity --kl-divergence-base` (written by the
//! base model, read by `pn perplexity --kl-divergence` and `pn eval-kl --kl-base`).
//!
//! Raw logits are `vocab` f32 per token (~1 MB at Qwen's 248k vocabulary); this file keeps, for
//! each scored position, the base model's top-k log-probabilities and the log of the mass of the
//! rest: `8k + 8` bytes a position (264 at k = 32). KL(base || model) is then computed over the
//! k + 1 outcomes "token i of the top k" and "any other token", which is a lower bound of the
//! full KL (merging outcomes never increases it) and equals it when the rest is negligible.
//!
//! Layout, all little-endian:
//!
//! | bytes | field |
//! | --- | --- |
//! | 4 | magic `PNKL` |
//! | 4 | version (1) |
//! | 4 × 6 | `n_vocab`, `n_ctx` (window), `first` (first scored row of a window), `top_k`, `n_tokens`, `n_rows` |
//! | 4 × n_tokens | the token ids (u32) the windows were cut from |
//! | n_rows × (8 + 8 × top_k) | per scored position: the target token's log-prob (f32), the rest's log-mass (f32, `-inf` when none), then `top_k` × (id u32, log-prob f32), most likely first |

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// The file's first four bytes.
pub const MAGIC: [u8; 4] = *b"PNKL";
/// The layout version this code writes and reads.
pub const VERSION: u32 = 1;
/// Log-probs kept per position when `--kl-top-k` is not given.
pub const DEFAULT_TOP_K: usize = 32;

/// Why a KL base file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KlFileError {
    /// Reading or writing failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Not a file of this format, or a damaged one.
    #[error("{path}: not a pn KL base file ({why}); write one with `pn perplexity -m BASE --kl-divergence-base FILE`")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
}

/// One scored position of the base model.
#[derive(Debug, Clone, PartialEq)]
pub struct KlRow {
    /// The base model's log-prob of the token that follows.
    pub target_logprob: f32,
    /// ln of the probability mass outside `top` (`-inf` when `top` holds all of it).
    pub rest_logprob: f32,
    /// The `top_k` most likely (id, log-prob), most likely first.
    pub top: Vec<(u32, f32)>,
}

impl KlRow {
    /// The row of one position from its log-softmax `lp` (`[vocab]`) and the next token.
    pub fn from_logprobs(lp: &[f64], target: u32, top_k: usize) -> KlRow {
        let mut idx: Vec<u32> = (0..lp.len() as u32).collect();
        let k = top_k.min(idx.len());
        if k > 0 && k < idx.len() {
            idx.select_nth_unstable_by(k - 1, |&a, &b| lp[b as usize].total_cmp(&lp[a as usize]));
        }
        idx.truncate(k);
        idx.sort_by(|&a, &b| lp[b as usize].total_cmp(&lp[a as usize]).then(a.cmp(&b)));
        let kept: f64 = idx.iter().map(|&i| lp[i as usize].exp()).sum();
        let rest = 1.0 - kept;
        KlRow {
            target_logprob: lp
                .get(target as usize)
                .copied()
                .unwrap_or(f64::NEG_INFINITY) as f32,
            rest_logprob: if rest > 0.0 {
                rest.ln() as f32
            } else {
                f32::NEG_INFINITY
            },
            top: idx.iter().map(|&i| (i, lp[i as usize] as f32)).collect(),
        }
    }

    /// KL(base || model) over the top-k outcomes and the rest, with the model's log-softmax
    /// `lq` (`[vocab]`).
    pub fn kl(&self, lq: &[f64]) -> f64 {
        let mut kl = 0.0;
        let mut q_kept = 0.0;
        for &(id, lp) in &self.top {
            let lq_i = lq.get(id as usize).copied().unwrap_or(f64::NEG_INFINITY);
            q_kept += lq_i.exp();
            let lp = lp as f64;
            kl += lp.exp() * (lp - lq_i);
        }
        let p_rest = (self.rest_logprob as f64).exp();
        if p_rest > 0.0 {
            // The model's rest can round to zero or below when it is sure of the top k.
            let q_rest = (1.0 - q_kept).max(f64::MIN_POSITIVE);
            kl += p_rest * (self.rest_logprob as f64 - q_rest.ln());
        }
        kl.max(0.0)
    }

    /// The base model's most likely token.
    pub fn top1(&self) -> Option<u32> {
        self.top.first().map(|&(id, _)| id)
    }
}

/// A whole KL base file.
#[derive(Debug, Clone, PartialEq)]
pub struct KlBase {
    /// The base model's vocabulary.
    pub n_vocab: u32,
    /// Window length (`-c`).
    pub n_ctx: u32,
    /// First scored row of each window.
    pub first: u32,
    /// Log-probs kept per row.
    pub top_k: u32,
    /// The tokens the windows were cut from.
    pub tokens: Vec<u32>,
    /// The scored positions in order (window by window).
    pub rows: Vec<KlRow>,
}

impl KlBase {
    /// Writes the file.
    pub fn write(&self, path: &Path) -> Result<(), KlFileError> {
        let io = |source| KlFileError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut w = BufWriter::new(std::fs::File::create(path).map_err(io)?);
        let mut put = |b: &[u8]| w.write_all(b);
        put(&MAGIC).map_err(io)?;
        for v in [
            VERSION,
            self.n_vocab,
            self.n_ctx,
            self.first,
            self.top_k,
            self.tokens.len() as u32,
            self.rows.len() as u32,
        ] {
            put(&v.to_le_bytes()).map_err(io)?;
        }
        for t in &self.tokens {
            put(&t.to_le_bytes()).map_err(io)?;
        }
        for r in &self.rows {
            put(&r.target_logprob.to_le_bytes()).map_err(io)?;
            put(&r.rest_logprob.to_le_bytes()).map_err(io)?;
            for i in 0..self.top_k as usize {
                // A vocabulary smaller than k pads with impossible entries.
                let (id, lp) = r
                    .top
                    .get(i)
                    .copied()
                    .unwrap_or((u32::MAX, f32::NEG_INFINITY));
                put(&id.to_le_bytes()).map_err(io)?;
                put(&lp.to_le_bytes()).map_err(io)?;
            }
        }
        w.flush().map_err(io)
    }

    /// Reads and checks a file written by [`write`](Self::write).
    pub fn read(path: &Path) -> Result<KlBase, KlFileError> {
        let bytes = std::fs::read(path).map_err(|source| KlFileError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let bad = |why: String| KlFileError::Format {
            path: path.to_path_buf(),
            why,
        };
        if bytes.get(..4) != Some(&MAGIC[..]) {
            return Err(bad("no PNKL magic".into()));
        }
        let words: Vec<u32> = bytes[4..]
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        if words.len() < 7 {
            return Err(bad("truncated header".into()));
        }
        let [version, n_vocab, n_ctx, first, top_k, n_tokens, n_rows] =
            [0, 1, 2, 3, 4, 5, 6].map(|i| words[i]);
        if version != VERSION {
            return Err(bad(format!("version {version}, this pn reads {VERSION}")));
        }
        let row_words = 2 + 2 * top_k as usize;
        let want = 7 + n_tokens as usize + n_rows as usize * row_words;
        if (bytes.len() - 4) % 4 != 0 || words.len() != want {
            return Err(bad(format!(
                "{} bytes, the header promises {}",
                bytes.len(),
                4 + 4 * want
            )));
        }
        let tokens = words[7..7 + n_tokens as usize].to_vec();
        let f = |w: u32| f32::from_bits(w);
        let rows = words[7 + n_tokens as usize..]
            .chunks_exact(row_words)
            .map(|r| KlRow {
                target_logprob: f(r[0]),
                rest_logprob: f(r[1]),
                top: r[2..]
                    .chunks_exact(2)
                    .filter(|p| p[0] != u32::MAX)
                    .map(|p| (p[0], f(p[1])))
                    .collect(),
            })
            .collect();
        Ok(KlBase {
            n_vocab,
            n_ctx,
            first,
            top_k,
            tokens,
            rows,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_softmax(x: &[f64]) -> Vec<f64> {
        let m = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = x.iter().map(|v| (v - m).exp()).sum::<f64>().ln() + m;
        x.iter().map(|v| v - lse).collect()
    }

    fn full_kl(p: &[f64], q: &[f64]) -> f64 {
        p.iter().zip(q).map(|(&a, &b)| a.exp() * (a - b)).sum()
    }

    /// With k = vocab the file's KL is the exact KL; with a small k it is a lower bound that a
    /// peaked base distribution keeps close.
    #[test]
    fn topk_kl_bounds_the_full_kl() {
        let p = log_softmax(&[4.0, 1.0, 0.5, -1.0, 0.0, -2.0, 0.3, 2.0]);
        let q = log_softmax(&[3.5, 1.2, 0.1, -0.5, 0.2, -2.5, 0.0, 2.4]);
        let exact = full_kl(&p, &q);
        let all = KlRow::from_logprobs(&p, 1, 8);
        assert!(
            (all.kl(&q) - exact).abs() < 1e-6,
            "{} vs {exact}",
            all.kl(&q)
        );
        assert_eq!(all.top1(), Some(0));
        assert_eq!(all.top[1].0, 7);
        let three = KlRow::from_logprobs(&p, 1, 3);
        assert_eq!(three.top.iter().map(|t| t.0).collect::<Vec<_>>(), [0, 7, 1]);
        let k3 = three.kl(&q);
        assert!(k3 <= exact + 1e-9 && k3 > 0.5 * exact, "{k3} vs {exact}");
        assert!((three.target_logprob as f64 - p[1]).abs() < 1e-6);
        assert_eq!(KlRow::from_logprobs(&p, 1, 3).kl(&p), 0.0);
    }

    #[test]
    fn file_round_trips_and_refuses_damage() {
        let dir = std::env::temp_dir().join(format!("pn-klfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("base.kld");
        let p = log_softmax(&[1.0, 2.0, 3.0]);
        let base = KlBase {
            n_vocab: 3,
            n_ctx: 4,
            first: 2,
            top_k: 4,
            tokens: vec![0, 2, 1, 1],
            rows: vec![
                KlRow::from_logprobs(&p, 1, 4),
                KlRow::from_logprobs(&p, 2, 4),
            ],
        };
        base.write(&path).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            4 + 28 + 16 + 2 * (8 + 8 * 4)
        );
        assert_eq!(KlBase::read(&path).unwrap(), base);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 4]).unwrap();
        let e = KlBase::read(&path).unwrap_err().to_string();
        assert!(e.contains("header promises"), "{e}");
        std::fs::write(&path, b"GGUF....").unwrap();
        assert!(KlBase::read(&path)
            .unwrap_err()
            .to_string()
            .contains("magic"));
        std::fs::remove_dir_all(&dir).ok();
    }
}
