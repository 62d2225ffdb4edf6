//! Fuzz target `server_request`: the body and its properties are [`pn_fuzz::cases::server_request`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pn_fuzz::cases::server_request(data));
