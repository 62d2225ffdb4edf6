//! Prompt cache on the demo model: a restored prefix gives the logits of a full recompute,
//! multi-turn chats process only the new tokens (ChatML and the Qwen3.5 template, whose
//! re-rendered assistant turns differ from what was generated), branching reuses the nearest
//! checkpoint, and eviction keeps the cache bounded.

use pn_runtime::chat_template::ChatMessage;
use pn_runtime::engine::{checkpoint_bytes, Engine, EngineOptions, Session, StopConditions};
use pn_runtime::sampling::SamplingParams;
use pn_tests::{argmax, data, max_abs};

/// The demo model with a prompt cache, and `template` (a file of `tests/data/chat-template`) as
/// its chat template when given.
fn demo(interval: usize, checkpoints: usize, template: Option<&str>) -> Engine {
    let opts = EngineOptions {
        threads: 2,
        context: 1024,
        prompt_cache_interval: interval,
        prompt_cache_checkpoints: checkpoints,
        chat_template: template.map(|t| std::fs::read_to_string(data("chat-template", t)).unwrap()),
        ..EngineOptions::default()
    };
    Engine::load(pn_runtime::DEMO_MODEL_PATH, opts).expect("demo model")
}

const SOURCE: &str = "import os\nimport sys\n\n\ndef read_lines(path):\n    \"\"\"Return the lines of a file without their newlines.\"\"\"\n    with open(path) as f:\n        return [line.rstrip('\\n') for line in f]\n\n\ndef count_words(lines):\n    total = 0\n    for line in lines:\n        total += len(line.split())\n    return total\n\n\nclass Counter:\n    def __init__(self):\n        self.counts = {}\n\n    def add(self, key):\n        self.counts[key] = self.counts.get(key, 0) + 1\n";

fn source_tokens(e: &Engine) -> Vec<u32> {
    let t = e.tokenizer().encode(SOURCE).unwrap();
    assert!(t.len() >= 120, "{} tokens", t.len());
    t
}

/// Processes `tokens` as a whole sequence without generating; returns (processed, reused).
fn prefill(s: &mut Session, tokens: &[u32]) -> (usize, usize) {
    let g = s
        .generate_sequence(
            tokens,
            SamplingParams::greedy(),
            StopConditions::max_tokens(0),
        )
        .unwrap();
    let t = g.timings();
    (t.prompt_tokens, t.prompt_reused)
}

fn logits_of_fresh(e: &Engine, tokens: &[u32]) -> Vec<f32> {
    let mut s = e.session().unwrap();
    s.feed(tokens).unwrap().to_vec()
}

/// Restoring a checkpoint and recomputing the rest gives the logits of a fresh session over
/// the whole sequence: bit for bit when the fresh session runs the same chunks (the prompt
/// cache splits prefill chunks at checkpoints, and a restore starts a chunk there), and within
/// 2e-4 of a fresh session that runs the sequence in other chunks (3e-2 where prompt rows take
/// int8 activations). That tolerance is the chunking noise of the CPU forward pass itself (a
/// different chunking reorders float sums in the batched matmuls and the Gated DeltaNet
/// prefill; measured 7.5e-5 here on logits of size ~10 with int16 prompt rows, 7.7e-3 with
/// int8 ones, printed by the test), below any argmax change.
#[test]
fn logits_after_a_restore_equal_a_full_recompute() {
    let e = demo(16, 8, None);
    let src = source_tokens(&e);
    let a = &src[..100];
    let mut b = src[..70].to_vec();
    b.extend_from_slice(&src[100..120]);
    let mut s = e.session().unwrap();
    assert_eq!(prefill(&mut s, a), (100, 0));
    // Interval checkpoints at 16, 32, ..., 96, the prompt end at 100.
    assert_eq!(
        s.prompt_cache_positions(),
        [16, 32, 48, 64, 80, 96, 100][..]
    );
    // b diverges from a at 70: the newest checkpoint at or before it is 64.
    assert_eq!(s.reusable_prefix(&b), 64);
    assert_eq!(prefill(&mut s, &b), (b.len() - 64, 64));
    let cached = s.logits().unwrap().to_vec();
    // Same chunks: a's prefill ran 0..64 in chunks ending at its checkpoints, b's rest runs
    // 64..80 and 80..90 (the interval mark at 80); a fresh session's prefill of b runs the
    // same chunks with the same outputs (the last row's logits only: the other rows may take
    // the state-only rows' kernels, `Backend::set_state_rows`).
    let mut same = e.session().unwrap();
    assert_eq!(prefill(&mut same, &b), (b.len(), 0));
    assert_eq!(same.prompt_cache_positions(), [16, 32, 48, 64, 80, 90][..]);
    assert_eq!(cached, same.logits().unwrap(), "restore is not lossless");
    let fresh = logits_of_fresh(&e, &b);
    let d = max_abs(&cached, &fresh);
    let scale = fresh.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    eprintln!("restore vs one-chunk recompute: max |diff| = {d:e}, max |logit| = {scale}");
    // Prompt rows on int8 activations turn that noise into int8 rounding steps where a value
    // sits near a boundary (1/254 of its block's largest): measured 7.7e-3 here.
    let tol = if qwen_model::CpuBackend::state_rows_int8() {
        3e-2
    } else {
        2e-4
    };
    assert!(d <= tol, "max |diff| {d}");
    assert_eq!(argmax(&cached), argmax(&fresh));
    // Checkpoints past the divergence are gone; the new ones follow b.
    assert_eq!(s.prompt_cache_positions(), [16, 32, 48, 64, 80, 90][..]);
}

/// The same prompt again is served from the prompt-end checkpoint's logits: nothing is
/// processed, and the generation is the same.
#[test]
fn the_same_prompt_again_processes_nothing() {
    let e = demo(64, 4, None);
    let p = &source_tokens(&e)[..40];
    let mut s = e.session().unwrap();
    let run = |s: &mut Session| {
        let g = s
            .generate_sequence(p, SamplingParams::greedy(), StopConditions::max_tokens(8))
            .unwrap();
        let t = g.timings();
        let toks: Vec<u32> = g.filter_map(|ev| ev.unwrap().token).collect();
        (t.prompt_tokens, t.prompt_reused, toks)
    };
    let (n1, r1, t1) = run(&mut s);
    assert_eq!((n1, r1), (40, 0));
    assert_eq!(s.reusable_prefix(p), 40);
    let (n2, r2, t2) = run(&mut s);
    assert_eq!((n2, r2), (0, 40));
    assert_eq!(t1, t2);
}

/// Branching: requests that share only part of a prefix reuse up to the nearest checkpoint,
/// and `reusable_prefix` says exactly how many tokens will not be processed.
#[test]
fn branching_requests_reuse_the_nearest_checkpoint() {
    let e = demo(32, 8, None);
    let src = source_tokens(&e);
    let shared = &src[..75];
    let branch = |tail: &[u32]| {
        let mut t = shared.to_vec();
        t.extend_from_slice(tail);
        t
    };
    let x = branch(&src[80..110]);
    let y = branch(&src[90..100]);
    let mut s = e.session().unwrap();
    assert_eq!(prefill(&mut s, &x), (x.len(), 0));
    // y diverges at 75: checkpoint 64.
    let expect = s.reusable_prefix(&y);
    assert_eq!(expect, 64);
    assert_eq!(prefill(&mut s, &y), (y.len() - 64, 64));
    // Back to x: the session now holds y, which shares 75 tokens with x: 64 again.
    assert_eq!(s.reusable_prefix(&x), 64);
    assert_eq!(prefill(&mut s, &x), (x.len() - 64, 64));
    // x extended: the whole session is reused.
    let mut x2 = x.clone();
    x2.extend_from_slice(&src[110..115]);
    assert_eq!(s.reusable_prefix(&x2), x.len());
    assert_eq!(prefill(&mut s, &x2), (5, x.len()));
    // Something unrelated: nothing to reuse, and the old checkpoints are dropped.
    let other = &src[1..30];
    assert_eq!(s.reusable_prefix(other), 0);
    assert_eq!(prefill(&mut s, other), (29, 0));
    assert_eq!(s.prompt_cache_positions(), [29][..]);
}

/// At most `prompt_cache_checkpoints` are kept (the newest three, and the roundest older
/// interval positions), in bytes as documented; a reset empties the cache.
#[test]
fn eviction_keeps_the_cache_bounded() {
    let e = demo(8, 4, None);
    let cfg = e.config();
    assert_eq!(checkpoint_bytes(cfg), 430_080);
    let src = source_tokens(&e);
    let mut s = e.session().unwrap();
    prefill(&mut s, &src[..100]);
    let pos = s.prompt_cache_positions();
    assert_eq!(pos.len(), 4, "{pos:?}");
    // The newest three (88, 96, 100) are kept; the fourth is the roundest interval position.
    assert_eq!(pos, [64, 88, 96, 100][..]);
    let bytes = s.prompt_cache_bytes();
    assert_eq!(bytes, 4 * checkpoint_bytes(cfg) + 4 * cfg.vocab as u64);
    // Growing the sequence keeps the count bounded.
    for end in [110, 120, 125] {
        prefill(&mut s, &src[..end]);
        assert_eq!(s.prompt_cache_positions().len(), 4);
        assert_eq!(s.prompt_cache_positions().last(), Some(&end));
    }
    s.reset().unwrap();
    assert!(s.prompt_cache_positions().is_empty());
    assert_eq!(s.prompt_cache_bytes(), 0);
    // Disabled: no checkpoints; an extension of the live state is still reused.
    let off = demo(8, 0, None);
    let mut s = off.session().unwrap();
    prefill(&mut s, &src[..50]);
    assert!(s.prompt_cache_positions().is_empty());
    assert_eq!(prefill(&mut s, &src[..60]), (10, 50));
    assert_eq!(prefill(&mut s, &src[..55]), (55, 0));
}

/// Runs `turns` chat turns (greedy, `max_tokens` each) and returns per turn (prompt tokens
/// processed, tokens reused, rendered length), asserting the counts the prompt cache promises.
fn chat_turns(
    e: &Engine,
    turns: usize,
    max_tokens: usize,
    expect_restore: bool,
) -> Vec<[usize; 3]> {
    let users = [
        "def add(a, b):",
        "Now subtract.",
        "And multiply?",
        "Write a class for it.",
        "Add a docstring.",
    ];
    let im_start = e.tokenizer().token_id("<|im_start|>").unwrap();
    let mut s = e.session().unwrap();
    let mut messages = vec![ChatMessage::system("You write Python.")];
    let mut out = Vec::new();
    let mut prev_full: Vec<u32> = Vec::new();
    for (k, user) in users.iter().cycle().take(turns).enumerate() {
        messages.push(ChatMessage::user(*user));
        let full = e
            .tokenizer()
            .encode(&e.render_chat(&messages).unwrap())
            .unwrap();
        let before = s.tokens();
        let g = s
            .chat(
                &messages,
                SamplingParams::greedy(),
                StopConditions::max_tokens(max_tokens),
            )
            .unwrap();
        let t = g.timings();
        let reply: String = g.map(|ev| ev.unwrap().text).collect();
        // Expected reuse, computed from the token sequences: the session's processed tokens
        // (all but the pending sampled one) when the new rendering extends them, else the
        // checkpoint before the previous prompt's last `<|im_start|>` (its assistant turn).
        let expected = if k == 0 {
            0
        } else {
            let live = before.len() - 1;
            if full.starts_with(&before[..live]) {
                assert!(
                    !expect_restore,
                    "turn {k}: the template kept the generated turn"
                );
                live
            } else {
                assert!(
                    expect_restore,
                    "turn {k}: the rendering differs from the session"
                );
                let turn_start = prev_full.iter().rposition(|&x| x == im_start).unwrap();
                assert!(full.starts_with(&prev_full[..turn_start]));
                turn_start
            }
        };
        assert_eq!(t.prompt_reused, expected, "turn {k}");
        assert_eq!(t.prompt_tokens, full.len() - expected, "turn {k}");
        out.push([t.prompt_tokens, t.prompt_reused, full.len()]);
        messages.push(ChatMessage::assistant(reply));
        prev_full = full;
    }
    // The continued conversation equals a fresh session on the whole of it.
    messages.push(ChatMessage::user("Thanks."));
    let cont = |s: &mut Session| -> Vec<u32> {
        s.chat(
            &messages,
            SamplingParams::greedy(),
            StopConditions::max_tokens(6),
        )
        .unwrap()
        .filter_map(|ev| ev.unwrap().token)
        .collect()
    };
    assert_eq!(cont(&mut s), cont(&mut e.session().unwrap()));
    out
}

/// ChatML (the demo model has no template): every later turn processes only its new tokens.
#[test]
fn chatml_turns_process_only_the_new_tokens() {
    let e = demo(512, 4, None);
    assert!(e.chat_template_is_fallback());
    let turns = chat_turns(&e, 4, 12, false);
    for w in turns.windows(2) {
        // Reused = everything the previous turn processed and generated but the last token.
        assert!(w[1][1] >= w[0][2], "{turns:?}");
    }
}

/// The Qwen3.5 template renders earlier assistant turns without the generation prompt's
/// `<think>` block, so the session's tokens diverge at the previous assistant turn: it is
/// restored from the checkpoint taken before that turn's `<|im_start|>`.
#[test]
fn qwen35_template_turns_restore_from_the_turn_start_checkpoint() {
    let e = demo(512, 4, Some("qwen3.5_chat_template.jinja"));
    assert!(!e.chat_template_is_fallback());
    chat_turns(&e, 4, 12, true);
}

/// Per turn of a 5-turn greedy chat: (processed, reused, rendered length), without asserting
/// which prefix is reused.
fn five_turns(e: &Engine) -> Vec<[usize; 3]> {
    let users = [
        "def add(a, b):",
        "Now subtract.",
        "And multiply?",
        "Write a class for it.",
        "Add a docstring.",
    ];
    let mut s = e.session().unwrap();
    let mut messages = vec![ChatMessage::system("You write Python.")];
    let mut out = Vec::new();
    for user in users {
        messages.push(ChatMessage::user(user));
        let full = e
            .tokenizer()
            .encode(&e.render_chat(&messages).unwrap())
            .unwrap();
        let g = s
            .chat(
                &messages,
                SamplingParams::greedy(),
                StopConditions::max_tokens(24),
            )
            .unwrap();
        let t = g.timings();
        let reply: String = g.map(|ev| ev.unwrap().text).collect();
        out.push([t.prompt_tokens, t.prompt_reused, full.len()]);
        messages.push(ChatMessage::assistant(reply));
    }
    out
}

/// The closing note's measurement: prompt tokens processed per turn of a 5-turn chat with the
/// prompt cache (default options), with checkpoints off (only a session state that the new
/// prompt extends is reused) and with no reuse at all (the whole rendered conversation, what a
/// hybrid model costs without any cache). Printed with `--nocapture`.
#[test]
fn five_turn_chat_reprocessed_tokens() {
    for template in [None, Some("qwen3.5_chat_template.jinja")] {
        let cached = five_turns(&demo(512, 4, template));
        let live_only = five_turns(&demo(512, 0, template));
        let name = template.map_or("ChatML fallback", |_| "Qwen3.5 template");
        eprintln!("{name}: turn | rendered (no reuse) | processed, checkpoints off | processed, prompt cache (reused)");
        for (k, (c, l)) in cached.iter().zip(&live_only).enumerate() {
            eprintln!(
                "{name}: {} | {} | {} | {} ({})",
                k + 1,
                c[2],
                l[0],
                c[0],
                c[1]
            );
            // Greedy on the same model: both runs see the same conversation.
            assert_eq!(c[2], l[2]);
            assert_eq!(c[0] + c[1], c[2]);
            assert!(c[0] <= l[0] && l[0] <= l[2], "turn {k}: {c:?} {l:?}");
            if k > 0 && template.is_none() {
                // ChatML renders the generated turn back exactly: the live state suffices.
                assert_eq!(c[0], l[0], "turn {k}");
                assert!(c[0] < c[2] / 2, "turn {k}: {c:?}");
            }
            if k > 0 && template.is_some() {
                // The re-rendered assistant turn defeats a cache without checkpoints.
                assert_eq!(l[0], l[2], "turn {k}");
                assert!(c[0] < l[0], "turn {k}: {c:?} {l:?}");
            }
        }
    }
}

fn pn_chat(args: &[&str], input: &str) -> (String, String) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_pn"))
        .arg("chat")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run pn chat");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "{stderr}");
    (stdout, stderr)
}

/// (processed, reused) from each of `pn chat`'s per-turn lines.
fn turn_lines(stderr: &str) -> Vec<(usize, usize)> {
    stderr
        .lines()
        .filter_map(|l| {
            // The line follows the `> ` prompt on stderr.
            let rest = &l[l.find("[prompt: ")? + "[prompt: ".len()..];
            let (processed, rest) = rest.split_once(" tokens processed, ")?;
            let (reused, _) = rest.split_once(" reused")?;
            Some((processed.parse().ok()?, reused.parse().ok()?))
        })
        .collect()
}

/// `pn chat` says per turn how many prompt tokens it processed and reused; later turns reuse
/// the conversation, `/reset` starts from nothing.
#[test]
fn pn_chat_reports_processed_and_reused_tokens() {
    let input = "def add(a, b):\nNow subtract.\nAnd multiply?\n/reset\ndef add(a, b):\n";
    let (_, stderr) = pn_chat(&["--temp", "0", "-n", "8", "-t", "2"], input);
    let turns = turn_lines(&stderr);
    assert_eq!(turns.len(), 4, "{stderr}");
    assert_eq!(turns[0].1, 0);
    for (k, t) in turns[1..3].iter().enumerate() {
        // The previous turn's prompt and reply (but its last token) are reused.
        assert!(t.1 > turns[k].0 + turns[k].1, "{turns:?}");
        assert!(t.0 < t.1, "{turns:?}");
    }
    assert!(stderr.contains("(conversation reset)"), "{stderr}");
    assert_eq!(turns[3], turns[0], "{stderr}");
}

/// Editing the last user message (a chat UI's "edit and resend") restarts from the checkpoint
/// taken at the end of the previous turn, before that message's `<|im_start|>`.
#[test]
fn an_edited_last_message_restarts_at_the_previous_turn_end() {
    for template in [None, Some("qwen3.5_chat_template.jinja")] {
        let e = demo(512, 4, template);
        let im_start = e.tokenizer().token_id("<|im_start|>").unwrap();
        let mut s = e.session().unwrap();
        let mut messages = vec![ChatMessage::user("def add(a, b):")];
        let reply: String = s
            .chat(
                &messages,
                SamplingParams::greedy(),
                StopConditions::max_tokens(10),
            )
            .unwrap()
            .map(|ev| ev.unwrap().text)
            .collect();
        messages.push(ChatMessage::assistant(reply));
        messages.push(ChatMessage::user("Now subtract."));
        let full = e
            .tokenizer()
            .encode(&e.render_chat(&messages).unwrap())
            .unwrap();
        drop(
            s.chat(
                &messages,
                SamplingParams::greedy(),
                StopConditions::max_tokens(10),
            )
            .unwrap(),
        );
        // The edited conversation diverges inside the last user message; the previous turn
        // ends before that message's `<|im_start|>` (the second to last one of the prompt).
        *messages.last_mut().unwrap() = ChatMessage::user("Now divide.");
        let edited = e
            .tokenizer()
            .encode(&e.render_chat(&messages).unwrap())
            .unwrap();
        let starts: Vec<usize> = (0..full.len()).filter(|&i| full[i] == im_start).collect();
        let turn_end = starts[starts.len() - 2];
        assert!(edited.starts_with(&full[..turn_end + 2]), "{template:?}");
        assert_eq!(s.reusable_prefix(&edited), turn_end, "{template:?}");
        let g = s
            .chat(
                &messages,
                SamplingParams::greedy(),
                StopConditions::max_tokens(4),
            )
            .unwrap();
        let t = g.timings();
        assert_eq!(
            (t.prompt_tokens, t.prompt_reused),
            (edited.len() - turn_end, turn_end),
            "{template:?}"
        );
    }
}

/// With MTP speculation on (the default for a model with an MTP block), a seeded sampled
/// continuation depends on the drafts, hence on the MTP head's cache: a prompt restored from a
/// checkpoint must give the MTP head the same rows as a fresh run, so the same seed gives the
/// same tokens whether or not the prefix came from the cache.
#[test]
fn seeded_speculative_sampling_is_the_same_after_a_restore() {
    let e = demo(16, 8, None);
    let src = source_tokens(&e);
    let mut b = src[..70].to_vec();
    b.extend_from_slice(&src[100..120]);
    let params = SamplingParams {
        temperature: 0.9,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed: 7,
        ..SamplingParams::default()
    };
    let run = |s: &mut Session| -> (Vec<u32>, usize) {
        let g = s
            .generate_sequence(&b[..], params.clone(), StopConditions::max_tokens(24))
            .unwrap();
        let reused = g.timings().prompt_reused;
        let toks = g.filter_map(|ev| ev.unwrap().token).collect();
        (toks, reused)
    };
    let mut fresh = e.session().unwrap();
    assert!(
        fresh.speculation_mut().is_some(),
        "demo model drafts with MTP"
    );
    let (want, reused) = run(&mut fresh);
    assert_eq!(reused, 0);

    let mut cached = e.session().unwrap();
    prefill(&mut cached, &src[..100]);
    let (got, reused) = run(&mut cached);
    assert!(reused >= 64, "restored from a checkpoint, reused {reused}");
    assert_eq!(
        got, want,
        "same seed, same tokens with and without the cache"
    );
}
