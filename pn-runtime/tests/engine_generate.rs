//! The engine end to end on real models: greedy decoding against oracle data, seeded sampling,
//! stop strings, cancellation, chat continuation and load errors.

use pn_runtime::chat_template::ChatMessage;
use pn_runtime::engine::{
    CancelToken, Device, Engine, EngineError, EngineOptions, FinishReason, Speculation,
    StopConditions,
};
use pn_runtime::sampling::SamplingParams;
// The cached engines: `demo()` is the F16 demo model, `options()` their options.
use pn_tests::engine::{demo_f16_engine as demo, engine_options as options, tiny_engine as tiny};
use pn_tests::{data, ids, read_f32, read_json, read_tokens, DEMO, TINY};
use std::sync::OnceLock;

/// The demo model without speculative decoding (the pinned seeded transcript is plain
/// sampling's; speculative sampling draws differently for the same seed).
fn demo_plain() -> &'static Engine {
    static E: OnceLock<Engine> = OnceLock::new();
    E.get_or_init(|| {
        let o = EngineOptions {
            speculation: Speculation::None,
            ..options()
        };
        Engine::load(pn_runtime::DEMO_MODEL_F16_PATH, o).expect("demo model (F16)")
    })
}

/// Runs a generation, returning (tokens, text, finish reason).
fn collect(
    engine: &Engine,
    prompt: &str,
    params: SamplingParams,
    stop: StopConditions,
) -> (Vec<u32>, String, FinishReason) {
    let mut s = engine.session().unwrap();
    let mut g = s.generate(prompt, params, stop).unwrap();
    let (mut toks, mut text) = (Vec::new(), String::new());
    for e in g.by_ref() {
        let e = e.unwrap();
        toks.extend(e.token);
        text.push_str(&e.text);
    }
    (toks, text, g.finish_reason().cloned().unwrap())
}

/// The tiny oracle model: the first greedy token after every prefix of sequences a and b equals
/// the argmax of the transformers logits row of that prefix (rows whose top two logits are
/// within 1e-3 are near-ties and skipped; there must be few).
#[test]
fn greedy_first_tokens_follow_the_oracle_argmax() {
    let engine = tiny();
    let vocab = engine.config().vocab;
    for (seq, logits, max_prefixes) in [("a", "logits_a.f32", 16), ("b", "logits_b.f32", 48)] {
        let tokens = read_tokens(&data(TINY, &format!("tokens_{seq}.json")));
        let oracle = read_f32(&data(TINY, logits));
        let (mut checked, mut ties) = (0, 0);
        for k in 1..=max_prefixes.min(tokens.len()) {
            let row = &oracle[(k - 1) * vocab..k * vocab];
            let mut sorted: Vec<(usize, f32)> = row.iter().copied().enumerate().collect();
            sorted.sort_by(|x, y| y.1.total_cmp(&x.1));
            if sorted[0].1 - sorted[1].1 < 1e-3 {
                ties += 1;
                continue;
            }
            let mut s = engine.session().unwrap();
            let prompt = tokens[..k].to_vec();
            let mut g = s
                .generate(
                    prompt,
                    SamplingParams::greedy(),
                    StopConditions::max_tokens(1),
                )
                .unwrap();
            let first = g.next().unwrap().unwrap();
            assert_eq!(
                first.token,
                Some(sorted[0].0 as u32),
                "sequence {seq}, prefix of {k} tokens"
            );
            checked += 1;
        }
        assert!(
            ties <= 2 && checked >= max_prefixes.min(tokens.len()) - 2,
            "{seq}: {ties} ties"
        );
    }
}

/// The demo model: greedy generation reproduces transformers' 64-token greedy continuations
/// (a true chain: each token is fed back).
#[test]
fn greedy_chain_matches_transformers_generate() {
    let engine = demo();
    for sample in read_json(&data(DEMO, "greedy_samples.json"))
        .as_array()
        .unwrap()
    {
        let prompt = ids(&sample["prompt_tokens"]);
        let expected = ids(&sample["greedy_tokens"]);
        let mut s = engine.session().unwrap();
        let stop = StopConditions {
            max_tokens: Some(expected.len()),
            ignore_eog: true,
            ..StopConditions::default()
        };
        let got: Vec<u32> = s
            .generate(prompt, SamplingParams::greedy(), stop)
            .unwrap()
            .filter_map(|e| e.unwrap().token)
            .collect();
        assert_eq!(got, expected, "prompt {:?}", sample["prompt"]);
    }
}

#[test]
fn a_fixed_seed_reproduces_the_transcript() {
    let params = |seed| SamplingParams {
        temperature: 0.9,
        seed,
        ..SamplingParams::default()
    };
    let run_on = |engine, seed| {
        collect(
            engine,
            "class Stack:\n",
            params(seed),
            StopConditions::max_tokens(40),
        )
    };
    // Speculative sampling (the default) is reproducible too.
    let spec = run_on(demo(), 1234);
    assert_eq!(run_on(demo(), 1234), spec);
    assert_ne!(run_on(demo(), 99).0, spec.0);
    let run = |seed| run_on(demo_plain(), seed);
    let (toks, text, finish) = run(1234);
    assert_eq!(run(1234), (toks.clone(), text.clone(), finish.clone()));
    assert_ne!(run(99).0, toks, "another seed should sample differently");
    insta::assert_snapshot!(
        "seed_1234_transcript",
        format!("{toks:?}\n---\n{text}\n---\n{finish:?}")
    );
}

#[test]
fn stop_strings_cut_exactly() {
    let prompt = "def fibonacci(n):\n";
    let (_, full, _) = collect(
        demo(),
        prompt,
        SamplingParams::greedy(),
        StopConditions::max_tokens(48),
    );
    for stop in ["default", "\n\n", "a list"] {
        let at = full
            .find(stop)
            .unwrap_or_else(|| panic!("{stop:?} not in {full:?}"));
        let (_, cut, finish) = collect(
            demo(),
            prompt,
            SamplingParams::greedy(),
            StopConditions::max_tokens(48).with_strings([stop]),
        );
        assert_eq!(cut, full[..at], "stop {stop:?}");
        assert_eq!(finish, FinishReason::StopString(stop.to_string()));
    }
}

#[test]
fn cancellation_stops_within_one_token() {
    let cancel = CancelToken::new();
    let mut s = demo().session().unwrap();
    let stop = StopConditions::max_tokens(100).with_cancel(cancel.clone());
    let mut g = s
        .generate("import os\n", SamplingParams::greedy(), stop)
        .unwrap();
    let mut tokens = 0;
    let mut last = None;
    for e in g.by_ref() {
        let e = e.unwrap();
        if e.token.is_some() && e.finish.is_none() {
            tokens += 1;
            if tokens == 3 {
                cancel.cancel();
            }
        }
        last = Some(e);
    }
    let last = last.unwrap();
    assert_eq!(tokens, 3);
    assert_eq!(last.token, None);
    assert_eq!(last.finish, Some(FinishReason::Cancelled));
    assert_eq!(g.timings().generated_tokens, 3);
}

#[test]
fn end_tokens_stop_and_max_tokens_counts() {
    let (toks, _, finish) = collect(
        demo(),
        "x = 1\n",
        SamplingParams::greedy(),
        StopConditions::max_tokens(5),
    );
    assert_eq!(toks.len(), 5);
    assert_eq!(finish, FinishReason::MaxTokens);
    // Both of Qwen's end tokens stop a generation.
    let engine = demo();
    let eot = engine.tokenizer().token_id("<|endoftext|>").unwrap();
    assert!(engine.stop_tokens().contains(eot));
    assert!(engine
        .stop_tokens()
        .contains(engine.tokenizer().token_id("<|im_end|>").unwrap()));
}

#[test]
fn chat_continues_the_conversation_without_reprocessing_it() {
    let engine = demo();
    let mut s = engine.session().unwrap();
    let mut messages = vec![ChatMessage::user("def add(a, b):")];
    let mut g = s
        .chat(
            &messages,
            SamplingParams::greedy(),
            StopConditions::max_tokens(6),
        )
        .unwrap();
    let first_prompt = g.timings().prompt_tokens;
    let reply = g.by_ref().map(|e| e.unwrap().text).collect::<String>();
    assert!(first_prompt > 5);
    messages.push(ChatMessage::assistant(reply));
    messages.push(ChatMessage::user("again"));
    let full = engine
        .tokenizer()
        .encode(&engine.render_chat(&messages).unwrap())
        .unwrap();
    let g = s
        .chat(
            &messages,
            SamplingParams::greedy(),
            StopConditions::max_tokens(4),
        )
        .unwrap();
    let second_prompt = g.timings().prompt_tokens;
    assert!(
        second_prompt < full.len() - first_prompt + 2,
        "{second_prompt} of {}",
        full.len()
    );
    // The continued session equals a fresh one on the whole conversation.
    let cont: Vec<u32> = g.filter_map(|e| e.unwrap().token).collect();
    let mut fresh = engine.session().unwrap();
    let again: Vec<u32> = fresh
        .chat(
            &messages,
            SamplingParams::greedy(),
            StopConditions::max_tokens(4),
        )
        .unwrap()
        .filter_map(|e| e.unwrap().token)
        .collect();
    assert_eq!(cont, again);
}

#[test]
fn sessions_on_two_threads_are_independent() {
    let engine = demo();
    let run = || {
        collect(
            engine,
            "for i in range(",
            SamplingParams::greedy(),
            StopConditions::max_tokens(12),
        )
        .0
    };
    let alone = run();
    let (a, b) = std::thread::scope(|sc| {
        let a = sc.spawn(run);
        let b = sc.spawn(run);
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!(a, alone);
    assert_eq!(b, alone);
}

/// A session owns a handle to its engine: it moves into a plain (not scoped) thread, and the
/// model outlives every `Engine` value, freed with the last session.
#[test]
fn a_session_moves_to_a_thread_and_outlives_its_engine_value() {
    let stop = || StopConditions::max_tokens(6);
    let want = collect(demo(), "def add(a, b):", SamplingParams::greedy(), stop()).0;
    let engine = Engine::load(pn_runtime::DEMO_MODEL_F16_PATH, options()).unwrap();
    let mut session = engine.session().unwrap();
    let other = engine.clone();
    drop(engine);
    let worker = std::thread::spawn(move || {
        session
            .generate("def add(a, b):", SamplingParams::greedy(), stop())
            .unwrap()
            .map(|e| e.unwrap().token)
            .collect::<Option<Vec<u32>>>()
            .unwrap()
    });
    assert_eq!(worker.join().unwrap(), want);
    // The clone still works after the session thread is gone.
    assert_eq!(
        collect(&other, "def add(a, b):", SamplingParams::greedy(), stop()).0,
        want
    );
}

/// `e` says `what` (the library argument to change) and names no `pn` command-line flag.
fn assert_library_words(e: &EngineError, what: &str) {
    let msg = e.to_string();
    assert!(msg.contains(what), "{msg}");
    for flag in [" -m ", " -c", "--ctx-size", "--device", "--cache-type"] {
        assert!(!msg.contains(flag), "{flag} in {msg}");
    }
}

fn load_err(path: impl AsRef<std::path::Path>, opts: EngineOptions) -> EngineError {
    Engine::load(path, opts).expect_err("load should fail")
}

#[test]
fn load_errors_say_what_is_wrong() {
    let dir = std::env::temp_dir().join(format!("pn-engine-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    let e = load_err(dir.join("missing.gguf"), options());
    assert!(matches!(e, EngineError::NotFound { .. }), "{e}");
    assert!(e.to_string().contains("missing.gguf"), "{e}");
    // A library error names the library's argument, not a `pn` flag.
    assert_library_words(&e, "Engine::load");

    let text = dir.join("notes.txt");
    std::fs::write(&text, "hello, not a model").unwrap();
    let e = load_err(&text, options());
    assert!(e.to_string().contains("not a GGUF"), "{e}");

    use gguf_io::{GgmlType, MetadataEntry, Value};
    let llama = dir.join("llama.gguf");
    gguf_io::write_gguf(
        &llama,
        &[MetadataEntry::new(
            "general.architecture",
            Value::String("llama".into()),
        )],
        &[],
    )
    .unwrap();
    let e = load_err(&llama, options());
    assert!(
        matches!(e, EngineError::WrongArchitecture { ref found, .. } if found == "llama"),
        "{e}"
    );

    // A PN3 tensor whose second block has a NaN scale.
    let mut bytes = vec![0u8; 2 * 34];
    bytes[34..36].copy_from_slice(&0x7e00u16.to_le_bytes());
    let bad = dir.join("bad-pn.gguf");
    gguf_io::write_gguf(
        &bad,
        &[MetadataEntry::new(
            "general.architecture",
            Value::String("qwen35".into()),
        )],
        &[("blk.0.ffn_up.weight", GgmlType::Pn3t, &[160, 1], &bytes)],
    )
    .unwrap();
    let e = load_err(&bad, options());
    let msg = e.to_string();
    assert!(
        matches!(e, EngineError::InvalidPnTensor { row: 0, .. }),
        "{msg}"
    );
    assert!(
        msg.contains("blk.0.ffn_up.weight") && msg.contains("block 1"),
        "{msg}"
    );

    // Validation runs on the load's threads; with several bad tensors the error still names the
    // first in file order (its first bad row), however the threads interleave.
    let good = vec![0u8; 8 * 2 * 34];
    let mut bad_a = good.clone();
    // Row 5, block 0: a reserved bit (bit 15 of word 3).
    bad_a[5 * 68 + 2 + 4 * 3 + 1] |= 0x80;
    let mut bad_b = good.clone();
    bad_b[0..2].copy_from_slice(&0x7c00u16.to_le_bytes());
    let names: Vec<String> = (0..8).map(|i| format!("blk.{i}.ffn_up.weight")).collect();
    let tensors: Vec<gguf_io::TensorSpec<'_>> = (0..8)
        .map(|i| {
            let b: &[u8] = match i {
                2 => &bad_a,
                6 => &bad_b,
                _ => &good,
            };
            (names[i].as_str(), GgmlType::Pn3t, &[160u64, 8][..], b)
        })
        .collect();
    let two_bad = dir.join("two-bad-pn.gguf");
    gguf_io::write_gguf(
        &two_bad,
        &[MetadataEntry::new(
            "general.architecture",
            Value::String("qwen35".into()),
        )],
        &tensors,
    )
    .unwrap();
    for threads in [1, 2, 3] {
        for _ in 0..5 {
            let e = load_err(
                &two_bad,
                EngineOptions {
                    threads,
                    ..options()
                },
            );
            let msg = e.to_string();
            assert!(
                matches!(e, EngineError::InvalidPnTensor { row: 5, .. })
                    && msg.contains("blk.2.ffn_up.weight")
                    && msg.contains("block 0"),
                "{threads} threads: {msg}"
            );
        }
    }

    let e = load_err(
        pn_runtime::DEMO_MODEL_PATH,
        EngineOptions {
            context: 1 << 20,
            ..options()
        },
    );
    assert!(
        matches!(
            e,
            EngineError::ContextTooLarge {
                requested: 1048576,
                max: 4096
            }
        ),
        "{e}"
    );
    assert_library_words(&e, "EngineOptions::context to 4096 or less");

    std::fs::remove_dir_all(&dir).ok();
}

/// A CUDA device that cannot be used is a typed error naming the device and the reason, found
/// before the file is even opened (a missing file would be `NotFound` otherwise); with a GPU, an
/// ordinal past the last device is `CudaNoDevice`.
#[test]
fn an_unusable_cuda_device_is_a_typed_error_naming_it() {
    let cuda = |ordinal, path: &str| {
        load_err(
            path,
            EngineOptions {
                device: Device::Cuda(ordinal),
                ..options()
            },
        )
    };
    match qwen_model::cuda::CudaBackend::availability(0) {
        Err(why) => {
            for ordinal in [0, 3] {
                let t0 = std::time::Instant::now();
                let e = cuda(ordinal, "/nonexistent/model.gguf");
                assert!(t0.elapsed().as_secs() < 10, "slow refusal: {e}");
                assert!(
                    matches!(
                        e,
                        EngineError::CudaNoDriver { ordinal: o }
                            | EngineError::CudaNoKernels { ordinal: o, .. } if o == ordinal
                    ),
                    "{e:?}"
                );
                let msg = e.to_string();
                assert!(msg.contains(&format!("cuda:{ordinal}")), "{msg}");
                assert_library_words(&e, "Device::Cpu");
                // The reason the backend gives (driver or kernels) is the one the user sees.
                let reason = if matches!(e, EngineError::CudaNoDriver { .. }) {
                    "libcuda"
                } else {
                    "kernels"
                };
                assert!(msg.contains(reason), "{msg} (backend: {why})");
            }
        }
        Ok(()) => {
            let e = cuda(4096, pn_runtime::DEMO_MODEL_PATH);
            assert!(
                matches!(e, EngineError::CudaNoDevice { ordinal: 4096, .. }),
                "{e:?}"
            );
            assert!(e.to_string().contains("cuda:4096"), "{e}");
        }
    }
}

#[test]
fn a_prompt_longer_than_the_context_is_an_error() {
    let engine = Engine::load(
        pn_runtime::DEMO_MODEL_PATH,
        EngineOptions {
            context: 8,
            ..options()
        },
    )
    .unwrap();
    let mut s = engine.session().unwrap();
    let e = s
        .generate(
            vec![1u32; 9],
            SamplingParams::greedy(),
            StopConditions::max_tokens(1),
        )
        .unwrap_err();
    assert!(
        matches!(
            e,
            EngineError::PromptTooLong {
                prompt: 9,
                context: 8,
                ..
            }
        ),
        "{e}"
    );
    assert_library_words(&e, "larger EngineOptions::context");
    // Filling the context ends the generation gracefully.
    let g = s
        .generate(
            vec![1u32; 6],
            SamplingParams::greedy(),
            StopConditions::default(),
        )
        .unwrap();
    let events: Vec<_> = g.map(|e| e.unwrap()).collect();
    assert_eq!(
        events.last().unwrap().finish,
        Some(FinishReason::ContextFull)
    );
    assert_eq!(events.iter().filter(|e| e.token.is_some()).count(), 2);
}

#[test]
fn quantized_kv_caches_stay_close_to_f32() {
    use pn_runtime::engine::KvCacheType;
    let tokens: Vec<u32> = read_tokens(&data(DEMO, "tokens_val.json"))
        .into_iter()
        .take(64)
        .collect();
    let reference = demo().session().unwrap().feed_all_logits(&tokens).unwrap();
    // Bounds measured on this model (max abs logit difference against the f32 cache, logits up
    // to ~16): q8_0 is a few 1e-2 at most, q4_0 a few 1e-1; both far below what would move text.
    for (k, v, bound) in [
        (KvCacheType::F16, KvCacheType::F16, 5e-3),
        (KvCacheType::Q8_0, KvCacheType::Q8_0, 0.1),
        (KvCacheType::Q4_0, KvCacheType::Q4_0, 1.0),
    ] {
        let engine = Engine::load(
            pn_runtime::DEMO_MODEL_F16_PATH,
            EngineOptions {
                kv_type_k: k,
                kv_type_v: v,
                ..options()
            },
        )
        .unwrap();
        let got = engine.session().unwrap().feed_all_logits(&tokens).unwrap();
        assert_eq!(got.len(), reference.len());
        let diff = got
            .iter()
            .zip(&reference)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        eprintln!("KV {k}/{v}: max abs logit diff {diff:.3e}");
        assert!(diff <= bound, "KV {k}/{v}: {diff} > {bound}");
        // The cache type is really in use: a quantized cache does not reproduce f32 bit for bit.
        assert!(diff > 0.0, "KV {k}/{v} gave exactly the f32 logits");
    }
}
