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

/// Strides and sizes of one gated delta-rule call (`kernels/delta_rule.cu`,
/// `kernels/delta_rule_chunked.cu`): heads of 128 values, strides in floats between tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaRuleShape {
    /// Floats between tokens of `q` and of `k` (each token holds `n_k_heads` rows of 128).
    pub qk_stride: usize,
    /// Floats between tokens of `v` (each token holds `n_v_heads` rows of 128).
    pub v_stride: usize,
    /// Floats between tokens of `beta_raw` and of `alpha_raw` (`n_v_heads` values per token).
    pub ab_stride: usize,
    /// Floats between tokens of the output (`n_v_heads` rows of 128 per token).
    pub out_stride: usize,
    /// Value heads (the state is `[n_v_heads][128][128]`).
    pub n_v_heads: usize,
    /// Key heads; value head `p` reads key head `p % n_k_heads`.
    pub n_k_heads: usize,
    /// Tokens (at least 1).
    pub t_len: usize,
}

/// The read-only inputs of a gated delta-rule call, as device views (`B = &CudaView<f32>`) or
/// host slices (`B = &[f32]`, the host shim's emulator); lengths per [`DeltaRuleShape`].
#[derive(Debug, Clone, Copy)]
pub struct DeltaRuleInputs<B> {
    /// Queries: token `t`, key head `h` at `t*qk_stride + h*128`, 128 floats (L2-normalised).
    pub q: B,
    /// Keys, laid out as `q`.
    pub k: B,
    /// Values: token `t`, value head `p` at `t*v_stride + p*128`, 128 floats.
    pub v: B,
    /// Raw beta (before the sigmoid): token `t`, value head `p` at `t*ab_stride + p`.
    pub beta_raw: B,
    /// Raw alpha (before softplus and the decay): laid out as `beta_raw`.
    pub alpha_raw: B,
    /// Per value head bias added to alpha (`n_v_heads` floats).
    pub dt_bias: B,
    /// Per value head rate A (`n_v_heads` floats): the state decays by
    /// `exp(softplus(alpha_raw + dt_bias) * ssm_a)` per token.
    pub ssm_a: B,
}
