//! Fuzz target `pn_validate`: the body and its properties are [`pn_fuzz::cases::pn_validate`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pn_fuzz::cases::pn_validate(data));
