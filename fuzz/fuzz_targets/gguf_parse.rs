//! Fuzz target `gguf_parse`: the body and its properties are [`pn_fuzz::cases::gguf_parse`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pn_fuzz::cases::gguf_parse(data));
