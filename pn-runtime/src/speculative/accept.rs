//! The acceptance rule of speculative sampling (Leviathan et al. / Chen et al.): a draft `d`
//! drawn from the drafter's distribution `q` is kept with probability `min(1, p(d) / q(d))`,
//! where `p` is the target's distribution; on rejection the replacement is drawn from
//! `normalize(max(0, p - q))`. The emitted token then has distribution exactly `p`, whatever
//! `q` is. With point masses (greedy decoding, forced drafts) this is exact matching, and no
//! random number is drawn.

use crate::sampling::{Sampler, TokenDist};

/// How drafts are accepted. Only [`AcceptRule::Standard`] preserves the target distribution;
/// the other rule exists so tests can show that the statistical test catches a wrong rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AcceptRule {
    /// `min(1, p(d) / q(d))`, residual resampling on rejection.
    #[default]
    Standard,
    /// Keeps every draft the target gives non-zero probability (wrong on purpose: the output
    /// follows the drafter's distribution; for tests only).
    AlwaysAccept,
}

/// Judges the draft `d` (drawn from `q`) against the target's `p`: `Ok(())` keeps it,
/// `Err(t)` rejects it and gives the replacement token `t`. `resid` is scratch space.
pub fn judge(
    rule: AcceptRule,
    sampler: &mut Sampler,
    d: u32,
    p: &TokenDist,
    q: &TokenDist,
    resid: &mut TokenDist,
) -> Result<(), u32> {
    let pd = p.prob(d);
    let qd = q.prob(d);
    let keep = match rule {
        AcceptRule::AlwaysAccept => pd > 0.0,
        AcceptRule::Standard => {
            if pd <= 0.0 {
                false
            } else if qd <= 0.0 || pd >= qd {
                // Ratio >= 1 (a draft outside q's support cannot happen; keep it safe).
                true
            } else {
                sampler.uniform() < pd / qd
            }
        }
    };
    if keep {
        return Ok(());
    }
    resid.reset(p.vocab());
    for &id in p.support() {
        let r = p.prob(id) - q.prob(id);
        if r > 0.0 {
            resid.push(id, r);
        }
    }
    // `p - q` can be all non-positive only by rounding when p == q; fall back to p itself.
    let t = if resid.support().is_empty() {
        sampler.draw(p)
    } else {
        sampler.draw(resid)
    };
    Err(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::{SamplingParams, TokenMask};

    fn dist(ps: &[f64]) -> TokenDist {
        let mut d = TokenDist::new();
        d.reset(ps.len());
        for (i, &p) in ps.iter().enumerate() {
            d.push(i as u32, p);
        }
        d
    }

    /// One token drawn from q, judged against p: the emitted token's frequencies.
    fn emitted(rule: AcceptRule, p: &[f64], q: &[f64], n: usize) -> Vec<f64> {
        let (pd, qd) = (dist(p), dist(q));
        let mut resid = TokenDist::new();
        let mut s = Sampler::new(
            SamplingParams {
                seed: 11,
                ..SamplingParams::default()
            },
            TokenMask::allow_all(),
        );
        let mut counts = vec![0.0; p.len()];
        for _ in 0..n {
            let d = s.draw(&qd);
            let t = match judge(rule, &mut s, d, &pd, &qd, &mut resid) {
                Ok(()) => d,
                Err(t) => t,
            };
            counts[t as usize] += 1.0;
        }
        counts.iter().map(|c| c / n as f64).collect()
    }

    fn tv(a: &[f64], b: &[f64]) -> f64 {
        0.5 * a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum::<f64>()
    }

    #[test]
    fn standard_rule_emits_the_target_distribution() {
        let p = [0.5, 0.3, 0.15, 0.05, 0.0];
        let q = [0.1, 0.2, 0.3, 0.2, 0.2];
        let f = emitted(AcceptRule::Standard, &p, &q, 40_000);
        // TV of 40k samples from p stays far below 0.02 (sd ~0.003 per cell).
        assert!(tv(&f, &p) < 0.02, "{f:?}");
        let wrong = emitted(AcceptRule::AlwaysAccept, &p, &q, 40_000);
        assert!(
            tv(&wrong, &p) > 0.1,
            "always-accept should follow q: {wrong:?}"
        );
    }

    #[test]
    fn point_masses_are_exact_matching_without_randomness() {
        let mut s = Sampler::new(SamplingParams::greedy(), TokenMask::allow_all());
        let mut resid = TokenDist::new();
        let (p, q_same, q_other) = (dist(&[0.0, 1.0, 0.0]), dist(&[0.0, 1.0, 0.0]), dist(&[1.0]));
        let before = s.clone().uniform();
        assert_eq!(
            judge(AcceptRule::Standard, &mut s, 1, &p, &q_same, &mut resid),
            Ok(())
        );
        assert_eq!(
            judge(AcceptRule::Standard, &mut s, 0, &p, &q_other, &mut resid),
            Err(1)
        );
        assert_eq!(s.uniform(), before, "no random number was used");
    }
}
