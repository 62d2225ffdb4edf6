//! Shapes of the fused mixer kernels (`kernels/mixer.cu`, the L2-normalising delta rule),
//! shared by the CUDA wrappers and the host emulator.

/// The q and k heads one [`qk_norm_rope`](crate::emu_mixer::qk_norm_rope) launch normalises
/// (per-head RMSNorm) and rotates (partial NeoX RoPE) in place.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QkNormRopeShape {
    /// Tokens (grid y, strided past 65535).
    pub n_tokens: usize,
    /// q heads per token.
    pub n_q_heads: usize,
    /// Floats between the q rows of consecutive tokens.
    pub q_tok_stride: usize,
    /// Floats between the q heads of one token.
    pub q_head_stride: usize,
    /// k heads per token.
    pub n_k_heads: usize,
    /// Floats between the k rows of consecutive tokens.
    pub k_tok_stride: usize,
    /// Floats between the k heads of one token.
    pub k_head_stride: usize,
    /// Values per head (the norm's length; the norm weights hold this many).
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// RoPE position of the first token.
    pub pos0: usize,
    /// Leading dims RoPE rotates (even, at most `head_dim`).
    pub n_rot: usize,
    /// RoPE frequency base.
    pub base: f32,
}

impl QkNormRopeShape {
    /// Why the kernel cannot take this shape, if it cannot.
    pub fn refusal(&self) -> Option<String> {
        let s = self;
        if s.n_tokens == 0 || s.n_q_heads + s.n_k_heads == 0 || s.head_dim == 0 {
            return Some(format!("empty shape {s:?}"));
        }
        if !s.n_rot.is_multiple_of(2) || s.n_rot > s.head_dim {
            return Some(format!(
                "n_rot {} must be even and <= head_dim {}",
                s.n_rot, s.head_dim
            ));
        }
        // The head sits in dynamic shared memory (48 KB without an opt-in, less the scratch).
        if s.head_dim > QK_NORM_ROPE_MAX_HEAD {
            return Some(format!(
                "head_dim {} exceeds {QK_NORM_ROPE_MAX_HEAD}",
                s.head_dim
            ));
        }
        if s.n_q_heads + s.n_k_heads > u32::MAX as usize / 2
            || s.pos0 + s.n_tokens > i32::MAX as usize
        {
            return Some(format!(
                "heads or positions past the kernel's 32-bit indices: {s:?}"
            ));
        }
        None
    }

    /// Floats the q buffer needs.
    pub fn q_len(&self) -> usize {
        span(
            self.n_tokens,
            self.q_tok_stride,
            self.n_q_heads,
            self.q_head_stride,
            self.head_dim,
        )
    }

    /// Floats the k buffer needs.
    pub fn k_len(&self) -> usize {
        span(
            self.n_tokens,
            self.k_tok_stride,
            self.n_k_heads,
            self.k_head_stride,
            self.head_dim,
        )
    }
}

fn span(t: usize, ts: usize, h: usize, hs: usize, n: usize) -> usize {
    if h == 0 {
        return 0;
    }
    (t.max(1) - 1) * ts + (h - 1) * hs + n
}

/// Longest head [`QkNormRopeShape`] takes (staged in 48 KB of shared memory less the kernel's
/// 128-byte reduction scratch).
pub const QK_NORM_ROPE_MAX_HEAD: usize = (48 * 1024 - 128) / 4;

/// The attention output gate and rotation of one `sigmoid_gate_hadamard` launch:
/// `out = H_block(x * sigmoid(g))` over `len` values of `x` (`[tokens][n_heads][head_dim]`
/// contiguous), the gate of value `(t, h, i)` at `g[t * gate_tok_stride + h * gate_head_stride
/// + i]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateRotation {
    /// Values of `x` (tokens x n_heads x head_dim), a multiple of `block`.
    pub len: usize,
    /// Heads per token.
    pub n_heads: usize,
    /// Values per head.
    pub head_dim: usize,
    /// Floats between the gates of consecutive tokens.
    pub gate_tok_stride: usize,
    /// Floats between the gates of the heads of one token.
    pub gate_head_stride: usize,
    /// Rotation block (a power of two in 2..=1024).
    pub block: usize,
}

impl GateRotation {
    /// Floats the gate buffer needs.
    pub fn gate_len(&self) -> usize {
        let tokens = self.len / (self.n_heads * self.head_dim).max(1);
        span(
            tokens,
            self.gate_tok_stride,
            self.n_heads,
            self.gate_head_stride,
            self.head_dim,
        )
    }

    /// Why the kernel cannot take this shape, if it cannot.
    pub fn refusal(&self) -> Option<String> {
        let s = self;
        if !block_ok(s.block) || s.len == 0 || !s.len.is_multiple_of(s.block) {
            return Some(format!("len {} in blocks of {}: {s:?}", s.len, s.block));
        }
        if s.n_heads == 0 || s.head_dim == 0 || !s.len.is_multiple_of(s.n_heads * s.head_dim) {
            return Some(format!("len {} is not whole tokens of {s:?}", s.len));
        }
        if s.len / s.block > u32::MAX as usize
            || s.head_dim > i32::MAX as usize
            || s.n_heads > i32::MAX as usize
        {
            return Some(format!("grid past its limit: {s:?}"));
        }
        None
    }
}

/// The GDN output norm and rotation of one `gated_rms_norm_hadamard` launch:
/// `out = H_block(rms(o) * w * silu(z))` per row of `n` over `len` values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GatedNormRotation {
    /// Values (rows x n).
    pub len: usize,
    /// Row length (the value head dim).
    pub n: usize,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// Rotation block (a power of two in 2..=1024).
    pub block: usize,
}

impl GatedNormRotation {
    /// Values one thread block normalises and rotates: `max(n, block)`, a multiple of both.
    pub fn span(&self) -> usize {
        self.n.max(self.block)
    }

    /// Why the kernel cannot take this shape, if it cannot.
    pub fn refusal(&self) -> Option<String> {
        let (s, span) = (self, self.span());
        if !block_ok(s.block)
            || s.n == 0
            || !span.is_multiple_of(s.n)
            || !span.is_multiple_of(s.block)
        {
            return Some(format!(
                "rows of {} with a rotation block of {}",
                s.n, s.block
            ));
        }
        if s.len == 0 || !s.len.is_multiple_of(span) || s.len / span > u32::MAX as usize {
            return Some(format!("len {} is not whole spans of {span}", s.len));
        }
        if span > QK_NORM_ROPE_MAX_HEAD {
            return Some(format!(
                "span {span} exceeds the shared memory ({QK_NORM_ROPE_MAX_HEAD} floats)"
            ));
        }
        None
    }
}

fn block_ok(r: usize) -> bool {
    r.is_power_of_two() && (2..=1024).contains(&r)
}

/// The L2 norms `delta_rule_l2` applies to each raw q and k head: `q * q_scale / max(||q||,
/// eps)` and `k / max(||k||, eps)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QkL2 {
    /// Scale of q after its norm (1/sqrt(dk) in the model).
    pub q_scale: f32,
    /// Lower bound of the norms.
    pub eps: f32,
}

/// `1/sqrt(r)` rounded once from f64, the rotation's scale (as pn-format scales).
pub fn rotation_scale(r: usize) -> f32 {
    (1.0f64 / (r as f64).sqrt()) as f32
}

/// Why `delta_rule_conv_f32` (the decode delta rule that runs its conv1d itself) refuses `s`,
/// or `None`: its conv rows (input and output) are `qk_stride` floats, all channels of one
/// token (`q | k | v`: `2 * n_k_heads * 128 + n_v_heads * 128`, so `v_stride` is the same), and
/// the value heads split evenly over the key heads (each key head's group counts on one sync
/// word).
pub fn delta_rule_conv_refusal(s: &crate::DeltaRuleShape) -> Option<String> {
    let c = 2 * s.n_k_heads * 128 + s.n_v_heads * 128;
    let ok = s.n_k_heads > 0
        && s.n_v_heads.is_multiple_of(s.n_k_heads)
        && s.t_len > 0
        && s.qk_stride == c
        && s.v_stride == c
        && c <= i32::MAX as usize;
    (!ok).then(|| format!("the fused conv takes whole conv rows of q | k | v: {s:?}"))
}
