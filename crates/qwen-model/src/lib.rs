//! The Qwen3.5/Qwen3.8 hybrid model: configuration from GGUF metadata, weight binding, the forward
//! graph written once against a `Backend` trait, and the CPU backend.
