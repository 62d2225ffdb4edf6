//! The PN weight format (PNX-FORMAT-v0): pn3t and pn4t blocks.
//!
//! This crate will own the block layout, bit-exact decoding, the reference quantizer, validation,
//! CPU dot products (scalar reference plus SIMD) and the Hadamard transform. It knows nothing of
//! GGUF, models or CUDA.
