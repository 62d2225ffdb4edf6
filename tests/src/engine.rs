//! The demo and tiny engines, loaded once per test binary, and greedy decoding through a
//! session.

use pn_runtime::engine::{Engine, EngineOptions, KvCacheType, Session, StopConditions};
use pn_runtime::sampling::SamplingParams;
use std::sync::OnceLock;

/// The options of the cached engines: 2 threads, a 512-token context, an f32 KV cache, the rest
/// default (speculative decoding where the model has an MTP head). The KV cache is pinned to f32
/// (the default is f16): these engines are compared with the oracles' full-precision logits.
pub fn engine_options() -> EngineOptions {
    EngineOptions {
        threads: 2,
        context: 512,
        kv_type_k: KvCacheType::F32,
        kv_type_v: KvCacheType::F32,
        ..EngineOptions::default()
    }
}

/// The tiny oracle model (`tests/data/tiny-qwen35/model-f16.gguf`) with [`engine_options`].
pub fn tiny_engine() -> &'static Engine {
    static E: OnceLock<Engine> = OnceLock::new();
    E.get_or_init(|| {
        Engine::load(crate::tiny("model-f16.gguf"), engine_options()).expect("tiny model")
    })
}

/// The shipped PN3 demo model (`tests/data/demo-code-model/model-pn3.gguf`) with
/// [`engine_options`].
pub fn demo_engine() -> &'static Engine {
    static E: OnceLock<Engine> = OnceLock::new();
    E.get_or_init(|| {
        Engine::load(crate::data(crate::DEMO, "model-pn3.gguf"), engine_options())
            .expect("demo model (PN3)")
    })
}

/// The demo model's F16 original (`tests/data/demo-code-model/model-f16.gguf`) with
/// [`engine_options`].
pub fn demo_f16_engine() -> &'static Engine {
    static E: OnceLock<Engine> = OnceLock::new();
    E.get_or_init(|| {
        Engine::load(crate::data(crate::DEMO, "model-f16.gguf"), engine_options())
            .expect("demo model (F16)")
    })
}

/// Feeds `prompt`, then decodes `n` greedy tokens through `Session::generate` (speculative when
/// the engine is), end-of-generation tokens ignored so there are always `n`.
pub fn greedy_tokens(s: &mut Session, prompt: &[u32], n: usize) -> Vec<u32> {
    let stop = StopConditions {
        max_tokens: Some(n),
        ignore_eog: true,
        ..StopConditions::default()
    };
    s.generate(prompt, SamplingParams::greedy(), stop)
        .expect("generate")
        .map(|e| e.expect("token").token.expect("a token"))
        .collect()
}
