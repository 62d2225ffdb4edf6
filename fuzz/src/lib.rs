//! The fuzz targets' bodies ([`cases`]), one function per target; the binaries in
//! `fuzz_targets/` are one-line wrappers, and `pn-runtime/tests/fuzz_replay.rs` replays the
//! committed corpora through the same functions as an ordinary test.

pub mod cases;
