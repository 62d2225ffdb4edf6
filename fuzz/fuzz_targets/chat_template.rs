//! Fuzz target `chat_template`: the body and its properties are [`pn_fuzz::cases::chat_template`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pn_fuzz::cases::chat_template(data));
