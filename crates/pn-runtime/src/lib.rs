//! The engine: loading and validating models, sessions, sampling, speculative decoding, the
//! tokenizer and chat template, the CUDA backend, and the `pn` command-line program.
