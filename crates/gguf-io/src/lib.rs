//! GGUF v2/v3 reading (memory-mapped, zero-copy, bounds-checked) and writing, the ggml type
//! table, and CPU decoding and dot products of the stock ggml types a model uses.
