//! Log probabilities of generated tokens (OpenAI's `logprobs` / `top_logprobs`).
//!
//! What is reported is the log-softmax of the model's logits over the tokens that can be
//! sampled at all (the [`TokenMask`](super::TokenMask): the tokenizer's vocabulary minus its
//! unused padding entries), **before** the request's grammar, penalties, temperature and top-k /
//! top-p / min-p truncation: the model's own distribution, as OpenAI reports it. llama-server's
//! `post_sampling_probs` (the truncated, tempered distribution) is the other convention; it is
//! not what pn reports.

/// One generated token's log probability and the most likely tokens at its position.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The generated token.
    pub id: u32,
    /// Its natural-log probability under the model's distribution (`<= 0`).
    pub logprob: f32,
    /// The `top_n` most likely tokens at this position and their log probabilities, most
    /// likely first (ties: lower id first). Empty when `top_n` is 0.
    pub top: Vec<(u32, f32)>,
}

/// Records the log-softmax of one row of logits at a time: the sampler hands it the row it is
/// about to sample from, the generation then asks for the sampled token's entry.
#[derive(Debug, Clone)]
pub struct LogprobRecorder {
    top_n: usize,
    /// Copy of the last recorded row (`[vocab]`): the sampler modifies its row in place
    /// (penalties, grammar), and the sampled token's raw logit is read from here.
    row: Vec<f32>,
    /// `ln(sum(exp(row)))`.
    lse: f32,
    has_row: bool,
    /// The `top_n` largest `(id, logit)` of the row, largest first.
    top: Vec<(u32, f32)>,
}

impl LogprobRecorder {
    /// A recorder that keeps the `top_n` most likely alternatives of each token.
    pub fn new(top_n: usize) -> Self {
        LogprobRecorder {
            top_n,
            row: Vec::new(),
            lse: 0.0,
            has_row: false,
            top: Vec::with_capacity(top_n + 1),
        }
    }

    /// How many alternatives each token carries.
    pub fn top_n(&self) -> usize {
        self.top_n
    }

    /// Records `logits` (masked entries already minus infinity; NaN counts as minus infinity).
    pub fn record(&mut self, logits: &[f32]) {
        self.row.clear();
        self.row.extend_from_slice(logits);
        self.top.clear();
        let mut max = f32::NEG_INFINITY;
        for (i, &l) in logits.iter().enumerate() {
            if !l.is_finite() {
                continue;
            }
            max = max.max(l);
            if self.top_n == 0 {
                continue;
            }
            // Insert into the small sorted list when it beats the smallest kept entry.
            if self.top.len() < self.top_n || l > self.top[self.top.len() - 1].1 {
                let at = self.top.partition_point(|&(_, t)| t >= l);
                self.top.insert(at, (i as u32, l));
                self.top.truncate(self.top_n);
            }
        }
        let sum: f64 = if max.is_finite() {
            logits
                .iter()
                .filter(|l| l.is_finite())
                .map(|&l| f64::from(l - max).exp())
                .sum()
        } else {
            1.0
        };
        self.lse = max + sum.ln() as f32;
        self.has_row = true;
    }

    /// The entry of token `id` of the last recorded row (`None` when no row was recorded since
    /// the last call). A token the row gave no finite logit has log probability minus infinity.
    pub fn take(&mut self, id: u32) -> Option<TokenLogprob> {
        if !std::mem::take(&mut self.has_row) {
            return None;
        }
        let lp = |l: f32| {
            if l.is_finite() {
                l - self.lse
            } else {
                f32::NEG_INFINITY
            }
        };
        let logprob = self
            .row
            .get(id as usize)
            .map_or(f32::NEG_INFINITY, |&l| lp(l));
        Some(TokenLogprob {
            id,
            logprob,
            top: self.top.iter().map(|&(t, l)| (t, lp(l))).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_and_top_entries() {
        let mut r = LogprobRecorder::new(2);
        let logits = [1.0f32, 3.0, f32::NEG_INFINITY, 2.0, f32::NAN];
        r.record(&logits);
        let t = r.take(3).unwrap();
        let lse = (1f64.exp() + 3f64.exp() + 2f64.exp()).ln() as f32;
        assert!((t.logprob - (2.0 - lse)).abs() < 1e-6);
        assert_eq!(t.top.len(), 2);
        assert_eq!((t.top[0].0, t.top[1].0), (1, 3));
        assert!((t.top[0].1 - (3.0 - lse)).abs() < 1e-6);
        // Probabilities of the whole row sum to 1.
        let total: f32 = [0u32, 1, 3]
            .iter()
            .map(|&i| (logits[i as usize] - lse).exp())
            .sum();
        assert!((total - 1.0).abs() < 1e-5);
        // One entry per recorded row.
        assert!(r.take(3).is_none());
        r.record(&logits);
        assert_eq!(r.take(2).unwrap().logprob, f32::NEG_INFINITY);
    }

    #[test]
    fn ties_keep_the_lower_id_first_and_zero_top_keeps_none() {
        let mut r = LogprobRecorder::new(3);
        r.record(&[0.5, 0.5, 0.5, 0.5]);
        let t = r.take(0).unwrap();
        assert_eq!(t.top.iter().map(|e| e.0).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert!((t.logprob - 0.25f32.ln()).abs() < 1e-6);
        let mut r = LogprobRecorder::new(0);
        r.record(&[0.0, 1.0]);
        assert!(r.take(1).unwrap().top.is_empty());
    }
}
