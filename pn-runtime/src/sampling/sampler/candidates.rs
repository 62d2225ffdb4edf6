//! Sampling from a row's best candidates instead of the whole row: with a device backend the
//! logits stay on the device and only the `k` best `(id, logit)` pairs come back
//! (`qwen_model::Backend::top_k`: one id for greedy decoding instead of about 1 MB per token at
//! the 27B vocabulary).
//!
//! Exact, not approximate: [`Sampler::sample_candidates`] returns the token
//! [`Sampler::sample`] would return on the whole row, with the same random draw, whenever
//! [`Sampler::candidates_needed`] says how many candidates it needs. It says `None` (the
//! documented fallback: download the whole row and call [`Sampler::sample`]) when a stage reads
//! the whole vocabulary or the row's order:
//! - repetition / presence / frequency penalties (they can lift a token from outside the top k);
//! - log probabilities (the log-softmax is over the whole row);
//! - a grammar constraint (it masks arbitrary ids);
//! - top-k off (0) or larger than the device kernel takes;
//! - top-p off (1.0) with top-k on: the full-row path then draws in the partial order of its
//!   top-k selection, which the candidates cannot reproduce (same distribution, other draws).
//!
//! The mask's banned ids may sit among the best logits, so the sampler asks for top-k plus their
//! count and skips them; ids past the mask's allowed range are not asked for at all
//! ([`Sampler::candidate_ids`]).

use super::{Filtered, Sampler, TokenDist};

impl Sampler {
    /// How many of the row's best candidates (in [`qwen_model::topk::top_k_row`]'s order, over
    /// ids `0..`[`candidate_ids`](Self::candidate_ids)) [`sample_candidates`](Self::sample_candidates)
    /// needs to choose exactly as [`sample`](Self::sample) would, at most `max`; `None` when it
    /// needs the whole row (see the module docs).
    pub fn candidates_needed(&self, max: usize) -> Option<usize> {
        let p = &self.params;
        if self.logprobs.is_some() || self.constraint.is_some() || p.has_penalties() {
            return None;
        }
        let k = if p.temperature <= 0.0 {
            1
        } else if p.top_k > 0 && p.top_p < 1.0 {
            p.top_k
        } else {
            return None;
        };
        let k = k + self.mask.banned.len();
        (k <= max).then_some(k)
    }

    /// The ids the candidates are taken from, for a row of `n_logits`: those below the mask's
    /// allowed count.
    pub fn candidate_ids(&self, n_logits: usize) -> usize {
        self.mask.n_allowed.map_or(n_logits, |n| n.min(n_logits))
    }

    /// Picks the next token from `cand`, the row's best `(id, logit)` pairs best first (as
    /// many as [`candidates_needed`](Self::candidates_needed) said, fewer when fewer logits are
    /// finite), for a row of `n_logits`: the token [`sample`](Self::sample) would pick from the
    /// whole row, with the same use of the random stream.
    pub fn sample_candidates(&mut self, cand: &[(u32, f32)], n_logits: usize) -> u32 {
        match self.filter_candidates(cand, n_logits) {
            Filtered::Token(id) => id,
            Filtered::Candidates => self.draw_candidate(),
        }
    }

    /// [`distribution`](Self::distribution) from the row's best candidates (as
    /// [`sample_candidates`](Self::sample_candidates) takes them): the same distribution,
    /// support in the same order (speculative verification judges drafts against it).
    pub fn distribution_candidates(
        &mut self,
        cand: &[(u32, f32)],
        n_logits: usize,
        out: &mut TokenDist,
    ) {
        out.reset(n_logits);
        match self.filter_candidates(cand, n_logits) {
            Filtered::Token(id) => out.push(id, 1.0),
            Filtered::Candidates => self.push_candidates(out),
        }
    }

    /// The filtering stages of [`sample`](Self::sample) over the best candidates: the greedy
    /// answer (or the fallback when none is allowed and finite), or the survivors of top-k,
    /// top-p and min-p in `self.cand`.
    fn filter_candidates(&mut self, cand: &[(u32, f32)], n_logits: usize) -> Filtered {
        let mask = &self.mask;
        let mut allowed = cand
            .iter()
            .copied()
            .filter(|c| c.1.is_finite() && mask.allows(c.0));
        if self.params.temperature <= 0.0 {
            return Filtered::Token(match allowed.next() {
                Some(c) => c.0,
                None => self.fallback(n_logits),
            });
        }
        let top_k = self.params.top_k;
        self.cand.clear();
        self.cand.extend(allowed.take(top_k));
        if self.cand.is_empty() {
            return Filtered::Token(self.fallback(n_logits));
        }
        self.top_p_min_p();
        Filtered::Candidates
    }
}

#[cfg(test)]
mod tests {
    use super::super::{SamplingParams, TokenMask};
    use super::*;
    use crate::sampling::rng::SplitMix64;

    #[test]
    fn sampling_from_the_best_candidates_equals_sampling_from_the_row() {
        let mut r = SplitMix64::new(5);
        let mut unit = move |lo: f64, hi: f64| lo + (hi - lo) * r.next_f64();
        let n = 1200;
        for case in 0..60 {
            let mut row: Vec<f32> = (0..n).map(|_| unit(-6.0, 6.0) as f32).collect();
            // Ties, non-finite values, a masked-out best logit.
            for i in (0..n).step_by(97) {
                row[i] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 5.5][i % 4];
            }
            row[7] = 9.0; // banned below
            row[n - 3] = 9.5; // past the allowed range
            let params = SamplingParams {
                temperature: if case % 4 == 0 {
                    0.0
                } else {
                    unit(0.3, 1.5) as f32
                },
                top_k: unit(1.0, 50.0) as usize,
                top_p: unit(0.3, 0.99) as f32,
                min_p: if case % 3 == 0 {
                    0.0
                } else {
                    unit(0.0, 0.2) as f32
                },
                seed: case,
                ..SamplingParams::default()
            };
            let mask = TokenMask::new(n - 10, [7, 100, 101]);
            let mut full = Sampler::new(params.clone(), mask.clone());
            let mut top = Sampler::new(params, mask);
            let k = top
                .candidates_needed(64)
                .expect("greedy / top-k with top-p");
            for step in 0..5 {
                let cand = qwen_model::topk::top_k_row(&row[..top.candidate_ids(n)], k);
                let (mut d_full, mut d_top) = (TokenDist::new(), TokenDist::new());
                full.distribution(&mut row.clone(), &[], &mut d_full);
                top.distribution_candidates(&cand, n, &mut d_top);
                assert_eq!(d_full.support(), d_top.support(), "case {case}");
                assert_eq!(d_full.vocab(), d_top.vocab());
                for &id in d_full.support() {
                    assert_eq!(d_full.prob(id).to_bits(), d_top.prob(id).to_bits());
                }
                let want = full.sample(&mut row.clone(), &[]);
                assert_eq!(
                    top.sample_candidates(&cand, n),
                    want,
                    "case {case} step {step}"
                );
            }
        }
    }

    #[test]
    fn stages_that_read_the_whole_row_need_it() {
        let mask = TokenMask::allow_all();
        let greedy = Sampler::new(SamplingParams::greedy(), mask.clone());
        assert_eq!(greedy.candidates_needed(64), Some(1));
        let d = SamplingParams::default(); // top-k 40, top-p 0.95
        assert_eq!(
            Sampler::new(d.clone(), mask.clone()).candidates_needed(64),
            Some(40)
        );
        assert_eq!(
            Sampler::new(d.clone(), mask.clone()).candidates_needed(32),
            None
        );
        let none = |p: SamplingParams| Sampler::new(p, mask.clone()).candidates_needed(64);
        assert_eq!(
            none(SamplingParams {
                top_k: 0,
                ..d.clone()
            }),
            None
        );
        assert_eq!(
            none(SamplingParams {
                top_p: 1.0,
                ..d.clone()
            }),
            None
        );
        assert_eq!(
            none(SamplingParams {
                repeat_penalty: 1.1,
                ..d.clone()
            }),
            None
        );
        let mut lp = Sampler::new(SamplingParams::greedy(), mask.clone());
        lp.set_logprobs(Some(2));
        assert_eq!(lp.candidates_needed(64), None);
        // Nothing finite: the lowest allowed id, as the full-row path.
        let mut s = Sampler::new(SamplingParams::greedy(), TokenMask::new(10, [0, 1]));
        assert_eq!(s.sample_candidates(&[], 12), 2);
    }
}
