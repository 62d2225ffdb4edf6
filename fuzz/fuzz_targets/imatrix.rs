//! Fuzz target `imatrix`: the body and its properties are [`pn_fuzz::cases::imatrix`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pn_fuzz::cases::imatrix(data));
