//! The token sampler.

use super::logprobs::{LogprobRecorder, TokenLogprob};
use super::rng::SplitMix64;
use crate::constrain::Constraint;
use std::collections::HashMap;

mod candidates;

/// How the next token is chosen. Neutral values switch a stage off.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; `<= 0` means greedy (argmax).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability sum reaches `top_p`; 1 keeps all.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; 0 keeps all.
    pub min_p: f32,
    /// Divide positive (multiply negative) logits of recently seen tokens by this; 1 is off.
    pub repeat_penalty: f32,
    /// Subtract this from the logit of every token seen recently; 0 is off.
    pub presence_penalty: f32,
    /// Subtract this times the token's recent count; 0 is off.
    pub frequency_penalty: f32,
    /// How many of the last history tokens the penalties look at; 0 disables the penalties.
    pub penalty_last_n: usize,
    /// Seed of the random generator: the same seed and inputs give the same tokens.
    pub seed: u64,
    /// A grammar the output must match (JSON schema, GBNF, regex): tokens it does not allow
    /// next are masked before every other stage. Speculative drafting is off while it is set
    /// (the verify rows would need the grammar's state after each draft).
    pub constraint: Option<Constraint>,
}

impl Default for SamplingParams {
    /// llama.cpp's defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, no penalties
    /// (window 64), seed 0.
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            seed: 0,
            constraint: None,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding: always the most likely (allowed) token.
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        }
    }

    fn has_penalties(&self) -> bool {
        self.penalty_last_n > 0
            && (self.repeat_penalty != 1.0
                || self.presence_penalty != 0.0
                || self.frequency_penalty != 0.0)
    }
}

/// Which token ids may be sampled: ids below `n_allowed`, minus an explicit list (the unused
/// padding entries of the vocabulary). Logits beyond the tokenizer's vocabulary (embedding rows
/// that exist only for alignment) are never sampled.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenMask {
    n_allowed: Option<usize>,
    banned: Vec<u32>,
}

impl TokenMask {
    /// A mask that allows every id.
    pub fn allow_all() -> Self {
        TokenMask::default()
    }

    /// Allows ids `< n_allowed` except those in `banned`.
    pub fn new(n_allowed: usize, banned: impl IntoIterator<Item = u32>) -> Self {
        let mut banned: Vec<u32> = banned.into_iter().collect();
        banned.sort_unstable();
        banned.dedup();
        TokenMask {
            n_allowed: Some(n_allowed),
            banned,
        }
    }

    /// The mask of a tokenizer: its vocabulary, minus unused (padding) entries.
    pub fn from_tokenizer(tok: &crate::tokenizer::Tokenizer) -> Self {
        let n = tok.n_vocab();
        TokenMask::new(n, (0..n as u32).filter(|&id| !tok.is_sampleable(id)))
    }

    /// Whether `id` may be sampled.
    pub fn allows(&self, id: u32) -> bool {
        self.n_allowed.is_none_or(|n| (id as usize) < n) && self.banned.binary_search(&id).is_err()
    }

    /// Sets every disallowed logit to minus infinity.
    pub fn apply(&self, logits: &mut [f32]) {
        if let Some(n) = self.n_allowed {
            if n < logits.len() {
                logits[n..].fill(f32::NEG_INFINITY);
            }
        }
        for &id in &self.banned {
            if let Some(l) = logits.get_mut(id as usize) {
                *l = f32::NEG_INFINITY;
            }
        }
    }
}

/// Chooses tokens from logits; owns its random generator, so one sampler per sequence.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    mask: TokenMask,
    rng: SplitMix64,
    /// The live grammar state (a copy of `params.constraint`, advanced by each emitted token).
    constraint: Option<Constraint>,
    /// Reused candidate buffer: (id, logit).
    cand: Vec<(u32, f32)>,
    /// Records each row's log-softmax when log probabilities are asked for (`None`: nothing
    /// is computed, so generations that do not ask pay nothing).
    logprobs: Option<Box<LogprobRecorder>>,
}

impl Sampler {
    /// A sampler with `params`, never choosing what `mask` forbids.
    pub fn new(params: SamplingParams, mask: TokenMask) -> Self {
        let rng = SplitMix64::new(params.seed);
        Sampler {
            constraint: params.constraint.clone(),
            params,
            mask,
            rng,
            cand: Vec::new(),
            logprobs: None,
        }
    }

    /// Records the log probabilities of every row sampled from from now on, with the `top_n`
    /// most likely alternatives (`None`: off). See [`super::logprobs`] for what is reported.
    pub fn set_logprobs(&mut self, top_n: Option<usize>) {
        self.logprobs = top_n.map(|n| Box::new(LogprobRecorder::new(n)));
    }

    /// The log probability of `id` in the last row this sampler chose from (or
    /// [`observe`](Self::observe)d), once per row; `None` when log probabilities are off.
    pub fn take_logprob(&mut self, id: u32) -> Option<TokenLogprob> {
        self.logprobs.as_mut().and_then(|r| r.take(id))
    }

    /// Records `logits` for [`take_logprob`](Self::take_logprob) without choosing from them:
    /// for a token that is emitted without sampling (a thinking budget's forced `</think>`).
    /// Masks `logits` in place; does nothing when log probabilities are off.
    pub fn observe(&mut self, logits: &mut [f32]) {
        if let Some(r) = self.logprobs.as_mut() {
            self.mask.apply(logits);
            r.record(logits);
        }
    }

    /// Whether a grammar constrains the output.
    pub fn is_constrained(&self) -> bool {
        self.constraint.is_some()
    }

    /// Tells the grammar that `id` was emitted (call once per emitted token, in order; a no-op
    /// without a constraint).
    pub fn advance(&mut self, id: u32) {
        if let Some(c) = self.constraint.as_mut() {
            c.advance(id);
        }
    }

    /// The live grammar state, if the output is constrained.
    pub fn constraint(&self) -> Option<&Constraint> {
        self.constraint.as_ref()
    }

    /// The parameters in use.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Restarts the random stream from `seed`.
    pub fn reseed(&mut self, seed: u64) {
        self.params.seed = seed;
        self.rng = SplitMix64::new(seed);
    }

    /// Picks the next token. `logits` (one per vocabulary id) are modified in place: masked
    /// entries become minus infinity and penalties are applied. `history` is the sequence so far
    /// (prompt and generated tokens) that the penalties look at.
    ///
    /// NaN logits count as minus infinity. If no allowed id has a finite logit, the lowest
    /// allowed id is returned (0 if the mask allows none of `logits`).
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        match self.filter(logits, history) {
            Filtered::Token(id) => id,
            Filtered::Candidates => self.draw_candidate(),
        }
    }

    /// Draws from `self.cand` at the temperature (one random number).
    fn draw_candidate(&mut self) -> u32 {
        let probs = softmax(&self.cand, self.params.temperature);
        let u = self.rng.next_f64();
        let mut cum = 0.0;
        for (c, q) in self.cand.iter().zip(&probs) {
            cum += q;
            if u < cum {
                return c.0;
            }
        }
        // Rounding left the sum just below 1: the last candidate takes the rest.
        self.cand.last().map(|c| c.0).unwrap_or(0)
    }

    /// The distribution [`sample`](Self::sample) would draw from, after every stage (mask,
    /// penalties, top-k, top-p, min-p, temperature), written into `out` without drawing. Greedy
    /// decoding (and logits with no finite allowed entry) give a single token of probability 1.
    /// Speculative sampling compares the target's and the drafter's distributions with it.
    pub fn distribution(&mut self, logits: &mut [f32], history: &[u32], out: &mut TokenDist) {
        out.reset(logits.len());
        match self.filter(logits, history) {
            Filtered::Token(id) => out.push(id, 1.0),
            Filtered::Candidates => self.push_candidates(out),
        }
    }

    /// Pushes `self.cand` with its probabilities at the temperature into `out`.
    fn push_candidates(&self, out: &mut TokenDist) {
        let probs = softmax(&self.cand, self.params.temperature);
        for (c, q) in self.cand.iter().zip(probs) {
            out.push(c.0, q);
        }
    }

    /// Draws a token from `dist` with this sampler's random stream (in the distribution's
    /// support order). A single-token distribution takes no random number, so greedy
    /// speculative decoding consumes none. An empty distribution gives 0.
    pub fn draw(&mut self, dist: &TokenDist) -> u32 {
        match dist.support.as_slice() {
            [] => 0,
            [only] => *only,
            support => {
                let u = self.rng.next_f64() * dist.total();
                let mut cum = 0.0;
                for &id in support {
                    cum += dist.probs[id as usize];
                    if u < cum {
                        return id;
                    }
                }
                support[support.len() - 1]
            }
        }
    }

    /// A uniform number in `[0, 1)` from this sampler's random stream (acceptance tests).
    pub fn uniform(&mut self) -> f64 {
        self.rng.next_f64()
    }

    /// Mask, penalties and truncation: either the answer (greedy, nothing allowed) or the
    /// surviving candidates in `self.cand`.
    fn filter(&mut self, logits: &mut [f32], history: &[u32]) -> Filtered {
        self.mask.apply(logits);
        if let Some(r) = self.logprobs.as_mut() {
            // The model's distribution: before the grammar, penalties and truncation.
            r.record(logits);
        }
        if let Some(c) = self.constraint.as_mut() {
            c.apply(logits);
        }
        for l in logits.iter_mut() {
            if l.is_nan() {
                *l = f32::NEG_INFINITY;
            }
        }
        if self.params.has_penalties() {
            apply_penalties(&self.params, logits, history);
        }
        if self.params.temperature <= 0.0 {
            return Filtered::Token(argmax(logits).unwrap_or_else(|| self.fallback(logits.len())));
        }

        let p = &self.params;
        self.cand.clear();
        self.cand.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, l)| l.is_finite())
                .map(|(i, &l)| (i as u32, l)),
        );
        if self.cand.is_empty() {
            return Filtered::Token(self.fallback(logits.len()));
        }
        if p.top_k > 0 && p.top_k < self.cand.len() {
            self.cand.select_nth_unstable_by(p.top_k - 1, by_logit_desc);
            self.cand.truncate(p.top_k);
        }
        self.top_p_min_p();
        Filtered::Candidates
    }

    /// The top-p and min-p stages over `self.cand` (top-p sorts it best first).
    fn top_p_min_p(&mut self) {
        let p = &self.params;
        if p.top_p < 1.0 {
            self.cand.sort_unstable_by(by_logit_desc);
            let probs = softmax(&self.cand, 1.0);
            let mut cum = 0.0;
            let mut keep = probs.len();
            for (i, q) in probs.iter().enumerate() {
                cum += q;
                if cum >= f64::from(p.top_p) {
                    keep = i + 1;
                    break;
                }
            }
            self.cand.truncate(keep.max(1));
        }
        if p.min_p > 0.0 {
            // p_i >= min_p * p_max  <=>  l_i >= l_max + ln(min_p)
            let max = self
                .cand
                .iter()
                .map(|c| c.1)
                .fold(f32::NEG_INFINITY, f32::max);
            let floor = f64::from(max) + f64::from(p.min_p).ln();
            self.cand.retain(|c| f64::from(c.1) >= floor);
        }
    }

    fn fallback(&self, n: usize) -> u32 {
        (0..n as u32).find(|&id| self.mask.allows(id)).unwrap_or(0)
    }
}

/// What the filtering stages left.
enum Filtered {
    /// The choice is made (greedy, or nothing allowed).
    Token(u32),
    /// `Sampler::cand` holds the candidates to draw from.
    Candidates,
}

/// A probability distribution over token ids: dense probabilities (for lookups by id) and the
/// ids with non-zero probability in draw order. Reused across calls without reallocating.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenDist {
    probs: Vec<f64>,
    support: Vec<u32>,
}

impl TokenDist {
    /// An empty distribution.
    pub fn new() -> Self {
        Self::default()
    }

    /// Empties it for a vocabulary of `n` ids (clears only the entries in use).
    pub fn reset(&mut self, n: usize) {
        for &id in &self.support {
            if let Some(p) = self.probs.get_mut(id as usize) {
                *p = 0.0;
            }
        }
        self.support.clear();
        self.probs.resize(n, 0.0);
    }

    /// Adds probability `p` to `id` (ids outside the vocabulary and `p <= 0` are ignored).
    pub fn push(&mut self, id: u32, p: f64) {
        let Some(slot) = self.probs.get_mut(id as usize) else {
            return;
        };
        if p <= 0.0 || p.is_nan() {
            return;
        }
        if *slot == 0.0 {
            self.support.push(id);
        }
        *slot += p;
    }

    /// Probability of `id` (0 outside the support).
    pub fn prob(&self, id: u32) -> f64 {
        self.probs.get(id as usize).copied().unwrap_or(0.0)
    }

    /// Number of ids it covers (the vocabulary size it was reset for).
    pub fn vocab(&self) -> usize {
        self.probs.len()
    }

    /// Ids with non-zero probability, in draw order.
    pub fn support(&self) -> &[u32] {
        &self.support
    }

    /// Sum of the probabilities (1 up to rounding for a sampler's distribution; the residual
    /// of speculative sampling is left unnormalised).
    pub fn total(&self) -> f64 {
        self.support.iter().map(|&id| self.probs[id as usize]).sum()
    }
}

/// Sort order: higher logit first, then lower id (makes the order total and deterministic).
fn by_logit_desc(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// The index of the largest finite value of `logits`: greedy decoding's token.
///
/// Ties go to the first (lowest) index. NaN and infinite values are skipped (a masked token's
/// `-inf` never wins, and neither does an overflowed `+inf` or a NaN), and `None` comes back
/// when no value is finite (an empty row included). Every greedy choice, top-1 agreement and
/// accuracy count in the crate uses this one function; on rows of finite logits it is the
/// plain "first maximum".
pub fn argmax(logits: &[f32]) -> Option<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &l) in logits.iter().enumerate() {
        if l.is_finite() && best.is_none_or(|(_, b)| l > b) {
            best = Some((i, l));
        }
    }
    best.map(|(i, _)| i as u32)
}

/// Probabilities of `cand` at `temperature`, in f64 for a stable sum.
fn softmax(cand: &[(u32, f32)], temperature: f32) -> Vec<f64> {
    let t = f64::from(temperature);
    let max = cand
        .iter()
        .map(|c| f64::from(c.1))
        .fold(f64::NEG_INFINITY, f64::max);
    let mut probs: Vec<f64> = cand
        .iter()
        .map(|c| ((f64::from(c.1) - max) / t).exp())
        .collect();
    let sum: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|q| *q /= sum);
    probs
}

/// llama.cpp's penalties over the last `penalty_last_n` history tokens.
fn apply_penalties(p: &SamplingParams, logits: &mut [f32], history: &[u32]) {
    let window = &history[history.len().saturating_sub(p.penalty_last_n)..];
    let mut counts: HashMap<u32, u32> = HashMap::new();
    for &t in window {
        *counts.entry(t).or_default() += 1;
    }
    for (&t, &count) in &counts {
        let Some(l) = logits.get_mut(t as usize) else {
            continue;
        };
        if !l.is_finite() {
            continue;
        }
        if *l <= 0.0 {
            *l *= p.repeat_penalty;
        } else {
            *l /= p.repeat_penalty;
        }
        *l -= count as f32 * p.frequency_penalty + p.presence_penalty;
    }
}
