//! Fuzz target `tokenizer`: the body and its properties are [`pn_fuzz::cases::tokenizer`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pn_fuzz::cases::tokenizer(data));
