//! Sampler properties: determinism, the masks of each stage, penalties, and the padding mask.

use pn_runtime::sampling::{Sampler, SamplingParams, StopStrings, TokenMask};
use proptest::prelude::*;

fn params(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
    let mut p = SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        ..SamplingParams::default()
    };
    f(&mut p);
    p
}

/// Draws `n` tokens from fresh copies of `logits`.
fn draw(s: &mut Sampler, logits: &[f32], n: usize) -> Vec<u32> {
    (0..n)
        .map(|_| s.sample(&mut logits.to_vec(), &[]))
        .collect()
}

fn logits_strategy() -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec(-8.0f32..8.0, 2..200)
}

/// Ids sorted by logit, highest first (ties: lower id first).
fn ranked(logits: &[f32]) -> Vec<u32> {
    let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
    ids.sort_by(|&a, &b| {
        logits[b as usize]
            .total_cmp(&logits[a as usize])
            .then(a.cmp(&b))
    });
    ids
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn same_seed_same_tokens(logits in logits_strategy(), seed in any::<u64>()) {
        let p = params(|p| p.seed = seed);
        let a = draw(&mut Sampler::new(p.clone(), TokenMask::allow_all()), &logits, 32);
        let b = draw(&mut Sampler::new(p, TokenMask::allow_all()), &logits, 32);
        prop_assert_eq!(a, b);
    }

    #[test]
    fn greedy_is_argmax(logits in logits_strategy()) {
        let mut s = Sampler::new(SamplingParams::greedy(), TokenMask::allow_all());
        prop_assert_eq!(s.sample(&mut logits.clone(), &[]), ranked(&logits)[0]);
    }

    #[test]
    fn top_k_only_returns_the_k_best(logits in logits_strategy(), k in 1usize..10, seed in any::<u64>()) {
        let best = &ranked(&logits)[..k.min(logits.len())];
        let mut s = Sampler::new(params(|p| { p.top_k = k; p.seed = seed }), TokenMask::allow_all());
        for t in draw(&mut s, &logits, 50) {
            prop_assert!(best.contains(&t), "{} not in top {}", t, k);
        }
    }

    #[test]
    fn top_p_keeps_the_smallest_nucleus(logits in logits_strategy(), top_p in 0.05f32..0.95, seed in any::<u64>()) {
        let order = ranked(&logits);
        let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        let z: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
        let mut cum = 0.0;
        let mut nucleus = Vec::new();
        for &id in &order {
            nucleus.push(id);
            cum += (logits[id as usize] as f64 - max).exp() / z;
            if cum >= top_p as f64 { break; }
        }
        let mut s = Sampler::new(params(|p| { p.top_p = top_p; p.seed = seed }), TokenMask::allow_all());
        for t in draw(&mut s, &logits, 50) {
            prop_assert!(nucleus.contains(&t), "{} outside the top-p nucleus {:?}", t, nucleus);
        }
    }

    #[test]
    fn min_p_drops_unlikely_tokens(logits in logits_strategy(), min_p in 0.01f32..0.9, seed in any::<u64>()) {
        let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let mut s = Sampler::new(params(|p| { p.min_p = min_p; p.seed = seed }), TokenMask::allow_all());
        for t in draw(&mut s, &logits, 50) {
            let ratio = ((logits[t as usize] - max) as f64).exp();
            prop_assert!(ratio >= min_p as f64 * (1.0 - 1e-6), "p/p_max {} < {}", ratio, min_p);
        }
    }

    #[test]
    fn masked_ids_are_never_sampled(logits in logits_strategy(), seed in any::<u64>(), temp in 0.0f32..3.0) {
        // The highest logits sit on the banned ids and beyond the allowed vocabulary.
        let mut logits = logits;
        let n = logits.len();
        // Id 0 is banned and id n-1 lies beyond the allowed vocabulary: at least one id must
        // remain allowed for the property to mean anything.
        prop_assume!(n >= 3);
        let n_allowed = n - 1;
        logits[0] = 100.0;
        logits[n - 1] = 200.0;
        let mask = TokenMask::new(n_allowed, [0u32]);
        let mut s = Sampler::new(params(|p| { p.temperature = temp; p.seed = seed }), mask);
        for t in draw(&mut s, &logits, 50) {
            prop_assert!(t != 0 && (t as usize) < n_allowed);
        }
    }
}

#[test]
fn sampling_follows_the_distribution() {
    // p = softmax([ln 1, ln 3]) = [0.25, 0.75]
    let logits = [0.0f32, 3.0f32.ln()];
    let mut s = Sampler::new(params(|p| p.seed = 11), TokenMask::allow_all());
    let ones = draw(&mut s, &logits, 20_000)
        .iter()
        .filter(|&&t| t == 1)
        .count();
    let frac = ones as f64 / 20_000.0;
    assert!((frac - 0.75).abs() < 0.02, "{frac}");
    // A low temperature sharpens it.
    let mut s = Sampler::new(
        params(|p| {
            p.seed = 11;
            p.temperature = 0.25
        }),
        TokenMask::allow_all(),
    );
    let ones = draw(&mut s, &logits, 20_000)
        .iter()
        .filter(|&&t| t == 1)
        .count();
    let want = 81.0 / 82.0; // 3^4 : 1
    assert!((ones as f64 / 20_000.0 - want).abs() < 0.01);
}

#[test]
fn different_seeds_differ() {
    let logits = vec![0.0f32; 1000];
    let a = draw(
        &mut Sampler::new(params(|p| p.seed = 1), TokenMask::allow_all()),
        &logits,
        16,
    );
    let b = draw(
        &mut Sampler::new(params(|p| p.seed = 2), TokenMask::allow_all()),
        &logits,
        16,
    );
    assert_ne!(a, b);
}

#[test]
fn penalties_follow_llama_cpp() {
    let p = SamplingParams {
        temperature: 0.0,
        repeat_penalty: 2.0,
        presence_penalty: 0.5,
        frequency_penalty: 0.25,
        penalty_last_n: 3,
        ..SamplingParams::default()
    };
    let mut s = Sampler::new(p, TokenMask::allow_all());
    let mut logits = vec![4.0, -1.0, 3.0, 1.0];
    // Window is the last 3: [0, 1, 0] (token 3 at the front falls outside).
    s.sample(&mut logits, &[3, 0, 1, 0]);
    assert_eq!(
        logits,
        // token 0: count 2, positive: 4 / 2 - 2 * 0.25 - 0.5; token 1: count 1, negative: -1 * 2 - 0.25 - 0.5
        vec![1.0, -2.75, 3.0, 1.0]
    );
    // Greedy picks the now-best token 2.
    let mut logits = vec![4.0, -1.0, 3.0, 1.0];
    assert_eq!(s.sample(&mut logits, &[3, 0, 1, 0]), 2);
    // Window 0 switches penalties off.
    let mut s = Sampler::new(
        SamplingParams {
            penalty_last_n: 0,
            ..s.params().clone()
        },
        TokenMask::allow_all(),
    );
    let mut logits = vec![4.0, -1.0, 3.0, 1.0];
    assert_eq!(s.sample(&mut logits, &[0, 0, 0]), 0);
}

#[test]
fn degenerate_logits_do_not_panic() {
    let mut s = Sampler::new(SamplingParams::default(), TokenMask::new(3, [0u32]));
    assert_eq!(s.sample(&mut [f32::NAN, f32::NAN, f32::NAN, 1.0], &[]), 1);
    assert_eq!(s.sample(&mut [], &[]), 0);
    let mut g = Sampler::new(SamplingParams::greedy(), TokenMask::allow_all());
    assert_eq!(
        g.sample(&mut [f32::NEG_INFINITY, f32::NAN, 2.0], &[7, 9]),
        2
    );
}

#[test]
fn the_qwen_mask_bans_padding_rows() {
    // 248,320 vocabulary entries, of which 248,077..248,319 unused; logits may be wider.
    let banned: Vec<u32> = (248_077..248_320).collect();
    let mask = TokenMask::new(248_320, banned);
    let mut logits = vec![0.0f32; 248_448];
    logits[248_077..].fill(50.0);
    let mut s = Sampler::new(
        SamplingParams {
            seed: 3,
            ..SamplingParams::default()
        },
        mask.clone(),
    );
    for _ in 0..20 {
        let t = s.sample(&mut logits.clone(), &[]);
        assert!(t < 248_077, "{t}");
    }
    assert!(mask.allows(248_076) && !mask.allows(248_100) && !mask.allows(248_400));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn stop_strings_cut_exactly_however_the_text_is_split(
        text in "[ab</s>é]{0,40}",
        cuts in prop::collection::vec(0usize..40, 0..6),
    ) {
        let stops = ["</s>", "ébé", "b<", "s>a"];
        // Reference: the earliest match in the whole text.
        let first = stops.iter().filter_map(|s| text.find(s)).min();
        let want = match first { Some(at) => text[..at].to_string(), None => text.clone() };

        let mut bounds: Vec<usize> = cuts.into_iter().filter(|&c| c <= text.len() && text.is_char_boundary(c)).collect();
        bounds.push(0);
        bounds.push(text.len());
        bounds.sort_unstable();
        let mut m = StopStrings::new(stops);
        let mut out = String::new();
        let mut stopped = false;
        for w in bounds.windows(2) {
            let c = m.push(&text[w[0]..w[1]]);
            out.push_str(&c.text);
            if c.stop.is_some() { stopped = true; break; }
        }
        if !stopped {
            let last = m.finish();
            stopped = last.stop.is_some();
            out.push_str(&last.text);
        }
        prop_assert_eq!(stopped, first.is_some());
        prop_assert_eq!(out, want);
    }
}
