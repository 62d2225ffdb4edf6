//! Cross-crate integration tests (oracle logits, golden transcripts, bad-input suites) and the
//! helpers they share for finding the test data under `tests/data/`.
