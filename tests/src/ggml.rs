//! Random rows of the stock (GGML) weight types, for the decoders' and dot products' tests.

use gguf_io::quants::dequantize_row;
use gguf_io::GgmlType;
use half::f16;
use rand::rngs::StdRng;
use rand::Rng;

/// Byte offsets of the f16 scale fields inside one block of `ty` (empty for float types and for
/// IQ1_M, whose scale is split over four nibbles: see [`set_iq1m_scale`]).
pub fn scale_fields(ty: GgmlType) -> &'static [usize] {
    use GgmlType::*;
    match ty {
        Q4_0 | Q5_0 | Q8_0 | Iq4Nl | Iq4Xs | Iq3Xxs | Iq3S | Iq2Xxs | Iq2Xs | Iq2S | Iq1S => &[0],
        Q4_1 | Q5_1 | Q4K | Q5K => &[0, 2],
        Q2K => &[80, 82],
        Q3K => &[108],
        Q6K => &[208],
        Tq1_0 => &[52],
        Tq2_0 => &[64],
        _ => &[],
    }
}

/// A random row of `n_blocks` blocks of `ty`: random quant bytes with the scale fields set to
/// finite f16 values in roughly `+-scale`; float types get finite values in `+-scale`.
pub fn random_row(ty: GgmlType, n_blocks: usize, scale: f32, rng: &mut StdRng) -> Vec<u8> {
    let mut row = Vec::new();
    for _ in 0..n_blocks {
        match ty {
            GgmlType::F32 => row.extend(rng.random_range(-scale..scale).to_le_bytes()),
            GgmlType::F16 => {
                row.extend(f16::from_f32(rng.random_range(-scale..scale)).to_le_bytes())
            }
            GgmlType::BF16 => {
                row.extend(((rng.random_range(-scale..scale).to_bits() >> 16) as u16).to_le_bytes())
            }
            _ => {
                let mut b: Vec<u8> = (0..ty.type_size()).map(|_| rng.random()).collect();
                for &off in scale_fields(ty) {
                    let v = f16::from_f32(rng.random_range(-scale..scale)).to_le_bytes();
                    b[off..off + 2].copy_from_slice(&v);
                }
                if ty == GgmlType::Iq1M {
                    set_iq1m_scale(&mut b, rng.random_range(-scale..scale));
                }
                row.extend(b);
            }
        }
    }
    row
}

/// Sets the f16 scale of one IQ1_M block (56 bytes): its bits are the top nibbles of the four
/// u16 at bytes 48..56, lowest nibble first.
pub fn set_iq1m_scale(block: &mut [u8], d: f32) {
    let bits = f16::from_f32(d).to_bits();
    for i in 0..4 {
        let o = 48 + 2 * i;
        let w = u16::from_le_bytes([block[o], block[o + 1]]);
        let w = (w & 0x0fff) | (((bits >> (4 * i)) & 15) << 12);
        block[o..o + 2].copy_from_slice(&w.to_le_bytes());
    }
}

/// `sum |w x|` of the decoded row `w` (plus 1e-30, never zero): the scale of the rounding error
/// of any summation order. Panics if `row` does not decode to `x.len()` values.
pub fn abs_dot(ty: GgmlType, row: &[u8], x: &[f32]) -> f32 {
    let mut w = vec![0f32; x.len()];
    dequantize_row(ty, row, &mut w).unwrap();
    w.iter().zip(x).map(|(a, b)| (a * b).abs()).sum::<f32>() + 1e-30
}
