//! The plain float types: F32, F16 and BF16 rows, and the half-precision conversions every
//! block format uses for its scales.

use half::f16;

/// The f16 at byte `off` of `b`, widened to f32 (exact).
#[inline(always)]
pub(crate) fn f16_at(b: &[u8], off: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f32()
}

/// Rounds `x` to the nearest f16 (ties to even), as its bits.
#[inline]
pub(crate) fn f32_to_f16_bits(x: f32) -> u16 {
    f16::from_f32(x).to_bits()
}

/// bf16 bits to f32: the bits are the top half of an f32 (exact).
#[inline(always)]
pub(crate) fn bf16_bits_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// f32 to bf16 bits, round to nearest even; NaNs stay NaN (quiet bit set), like ggml.
#[inline]
pub(crate) fn f32_to_bf16_bits(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u + (0x7fff + ((u >> 16) & 1))) >> 16) as u16
}

pub(crate) fn dequantize_f32(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    }
}

pub(crate) fn dequantize_f16(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = f16::from_bits(u16::from_le_bytes([s[0], s[1]])).to_f32();
    }
}

pub(crate) fn dequantize_bf16(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = bf16_bits_to_f32(u16::from_le_bytes([s[0], s[1]]));
    }
}

pub(crate) fn quantize_f32(src: &[f32], dst: &mut Vec<u8>) {
    dst.extend(src.iter().flat_map(|x| x.to_le_bytes()));
}

pub(crate) fn quantize_f16(src: &[f32], dst: &mut Vec<u8>) {
    dst.extend(src.iter().flat_map(|&x| f32_to_f16_bits(x).to_le_bytes()));
}

pub(crate) fn quantize_bf16(src: &[f32], dst: &mut Vec<u8>) {
    dst.extend(src.iter().flat_map(|&x| f32_to_bf16_bits(x).to_le_bytes()));
}
