//! The q8_0 and q4_0 blocks a quantized KV cache stores: quantization on write and per-block
//! dequantization (the CPU attention loop reads them in place, the CUDA kernels in
//! `pn-kernels/kernels/kv_blocks.cuh` are tested bit for bit against these).
//!
//! Both formats hold 32 values per block with one f16 scale `d`; value `i` is `d * q_i`.
//! q8_0: `q_i` in -127..=127, `d = max|x| / 127`. q4_0: `q_i` in -8..=7, `d = -m / 8` where `m`
//! is the value of largest magnitude (so it maps exactly onto -8 and the range is used fully);
//! nibble `i` of the 16 bytes holds value `i` (low) and value `i + 16` (high), stored offset by 8.

use half::f16;

/// Values per quantized block.
pub const QK: usize = 32;

/// 32 values as an f16 scale and 32 signed bytes (34 bytes).
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C)]
pub struct BlockQ8_0 {
    /// Scale.
    pub d: f16,
    /// Quantized values.
    pub qs: [i8; QK],
}

/// 32 values as an f16 scale and 32 offset 4-bit integers (18 bytes).
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C)]
pub struct BlockQ4_0 {
    /// Scale.
    pub d: f16,
    /// Nibbles: byte `i` holds value `i` (low) and value `i + 16` (high), each offset by 8.
    pub qs: [u8; QK / 2],
}

// SAFETY: plain data (f16 and integer arrays); all-zero bytes are a valid block with scale 0,
// which decodes to zeros.
unsafe impl bytemuck::Zeroable for BlockQ8_0 {}
// SAFETY: as above.
unsafe impl bytemuck::Zeroable for BlockQ4_0 {}

impl BlockQ8_0 {
    /// Quantizes 32 values.
    pub fn quantize(x: &[f32]) -> BlockQ8_0 {
        let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0i8; QK];
        for (q, &v) in qs.iter_mut().zip(x) {
            *q = (v * id).round().clamp(-127.0, 127.0) as i8;
        }
        BlockQ8_0 {
            d: f16::from_f32(d),
            qs,
        }
    }

    /// The 32 values.
    #[inline]
    pub fn dequantize(&self, out: &mut [f32; QK]) {
        let d = self.d.to_f32();
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = d * q as f32;
        }
    }
}

impl BlockQ4_0 {
    /// Quantizes 32 values.
    pub fn quantize(x: &[f32]) -> BlockQ4_0 {
        // The value of largest magnitude, with its sign, maps to -8.
        let m = x
            .iter()
            .fold(0.0f32, |a, &v| if v.abs() > a.abs() { v } else { a });
        let d = m / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let q = |v: f32| ((v * id).round().clamp(-8.0, 7.0) as i32 + 8) as u8;
        let mut qs = [0u8; QK / 2];
        for (i, b) in qs.iter_mut().enumerate() {
            *b = q(x[i]) | (q(x[i + QK / 2]) << 4);
        }
        BlockQ4_0 {
            d: f16::from_f32(d),
            qs,
        }
    }

    /// The 32 values.
    #[inline]
    pub fn dequantize(&self, out: &mut [f32; QK]) {
        let d = self.d.to_f32();
        let (lo, hi) = out.split_at_mut(QK / 2);
        for ((l, h), &b) in lo.iter_mut().zip(hi.iter_mut()).zip(&self.qs) {
            *l = d * ((b & 0x0f) as i32 - 8) as f32;
            *h = d * ((b >> 4) as i32 - 8) as f32;
        }
    }
}

/// A quantized block type (shared code for the two formats).
pub trait QuantBlock: Copy + Send + Sync {
    /// Quantizes 32 values.
    fn quantize_block(x: &[f32]) -> Self;
    /// Dequantizes 32 values.
    fn dequantize_block(&self, out: &mut [f32; QK]);
}

impl QuantBlock for BlockQ8_0 {
    fn quantize_block(x: &[f32]) -> Self {
        Self::quantize(x)
    }
    #[inline]
    fn dequantize_block(&self, out: &mut [f32; QK]) {
        self.dequantize(out)
    }
}

impl QuantBlock for BlockQ4_0 {
    fn quantize_block(x: &[f32]) -> Self {
        Self::quantize(x)
    }
    #[inline]
    fn dequantize_block(&self, out: &mut [f32; QK]) {
        self.dequantize(out)
    }
}

/// Quantizes `src` (a multiple of 32 values) into `dst` (one block per 32 values).
pub fn quantize_into<T: QuantBlock>(src: &[f32], dst: &mut [T]) {
    for (b, x) in dst.iter_mut().zip(src.chunks_exact(QK)) {
        *b = T::quantize_block(x);
    }
}

/// Dequantizes `src` into `dst` (32 values per block); the reference the attention loop's
/// in-place reads are tested against.
pub fn dequantize_into<T: QuantBlock>(src: &[T], dst: &mut [f32]) {
    for (b, o) in src.iter().zip(dst.chunks_exact_mut(QK)) {
        let mut buf = [0.0f32; QK];
        b.dequantize_block(&mut buf);
        o.copy_from_slice(&buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(seed: u32) -> Vec<f32> {
        // Deterministic, varied magnitudes (a few outliers like real keys have).
        (0..QK as u32)
            .map(|i| {
                let h = (i.wrapping_mul(2654435761) ^ seed.wrapping_mul(40503)) % 1000;
                let v = h as f32 / 500.0 - 1.0;
                if i % 11 == 3 {
                    v * 8.0
                } else {
                    v
                }
            })
            .collect()
    }

    #[test]
    fn q8_0_round_trip_error_is_half_a_step() {
        for seed in 0..50 {
            let x = sample(seed);
            let b = BlockQ8_0::quantize(&x);
            let mut y = [0.0; QK];
            b.dequantize(&mut y);
            let d = b.d.to_f32();
            for (a, c) in x.iter().zip(&y) {
                // Half a step, plus the f16 rounding of the scale times the largest code.
                assert!((a - c).abs() <= 0.5 * d + 127.0 * d * 1e-3, "{a} vs {c}");
            }
        }
    }

    #[test]
    fn q4_0_round_trip_error_is_at_most_a_step() {
        for seed in 0..50 {
            let x = sample(seed);
            let b = BlockQ4_0::quantize(&x);
            let mut y = [0.0; QK];
            b.dequantize(&mut y);
            let d = b.d.to_f32().abs();
            for (a, c) in x.iter().zip(&y) {
                // Half a step, except a value of the opposite sign near the largest magnitude:
                // +8 steps is clamped to +7, one step off.
                let step = if a.abs() > 7.5 * d { 1.0 } else { 0.5 };
                assert!((a - c).abs() <= step * d + 8.0 * d * 1e-3, "{a} vs {c}");
            }
            // The largest-magnitude value is represented (almost) exactly.
            let (i, _) = x
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
                .unwrap();
            assert!((x[i] - y[i]).abs() <= x[i].abs() * 1e-3);
        }
    }

    #[test]
    fn zero_blocks_decode_to_zero() {
        let z = [0.0f32; QK];
        let mut y = [1.0; QK];
        BlockQ8_0::quantize(&z).dequantize(&mut y);
        assert!(y.iter().all(|&v| v == 0.0));
        let mut y = [1.0; QK];
        BlockQ4_0::quantize(&z).dequantize(&mut y);
        assert!(y.iter().all(|&v| v == 0.0));
        let mut y = [1.0; QK];
        <BlockQ4_0 as bytemuck::Zeroable>::zeroed().dequantize(&mut y);
        assert!(y.iter().all(|&v| v == 0.0));
    }
}
