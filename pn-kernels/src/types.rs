//! Weight types the kernels read, with their block geometry.

/// Stored type of a weight matrix on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightType {
    /// IEEE f32.
    F32,
    /// IEEE f16.
    F16,
    /// ggml Q8_0 (32 per 34-byte block).
    Q8_0,
    /// ggml Q4_K (256 per 144-byte super-block).
    Q4K,
    /// ggml Q3_K (256 per 110-byte super-block).
    Q3K,
    /// PN 3-bit (80 per 34-byte block).
    Pn3t,
    /// PN 4-bit (64 per 34-byte block).
    Pn4t,
}

impl WeightType {
    /// Elements per block.
    pub fn block_elems(self) -> usize {
        match self {
            WeightType::F32 | WeightType::F16 => 1,
            WeightType::Q8_0 => 32,
            WeightType::Q4K | WeightType::Q3K => 256,
            WeightType::Pn3t => 80,
            WeightType::Pn4t => 64,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            WeightType::F32 => 4,
            WeightType::F16 => 2,
            WeightType::Q8_0 | WeightType::Pn3t | WeightType::Pn4t => 34,
            WeightType::Q4K => 144,
            WeightType::Q3K => 110,
        }
    }

    /// Bytes of a row of `k` elements, or `None` when `k` is not a whole number of blocks.
    pub fn row_bytes(self, k: usize) -> Option<usize> {
        k.is_multiple_of(self.block_elems())
            .then(|| k / self.block_elems() * self.block_bytes())
    }

    /// Lower-case ggml name.
    pub fn name(self) -> &'static str {
        match self {
            WeightType::F32 => "f32",
            WeightType::F16 => "f16",
            WeightType::Q8_0 => "q8_0",
            WeightType::Q4K => "q4_K",
            WeightType::Q3K => "q3_K",
            WeightType::Pn3t => "pn3t",
            WeightType::Pn4t => "pn4t",
        }
    }
}

/// Arithmetic of the PN matrix-vector product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PnPrecision {
    /// The decode hot path: activations rounded to fp16 (after an exact power-of-two scaling),
    /// code pairs as half2, fp16 products summed over one word (<= 5 pairs), fp32 beyond.
    Half2,
    /// fp32 products in element order (slower; the reference for `Half2`).
    F32,
}
