//! Fuzz target `safetensors`: the body and its properties are [`pn_fuzz::cases::safetensors`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pn_fuzz::cases::safetensors(data));
