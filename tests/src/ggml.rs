//! Random rows of the stock (GGML) weight types, for the decoders' and dot products' tests.

use gguf_io::quants::dequantize_row;
use gguf_io::GgmlType;
use half::f16;
use rand::rngs::StdRng;
use rand::Rng;

/// Byte offsets of the f16 scale fields inside one block of `ty` (empty for float types).
pub fn scale_fields(ty: GgmlType) -> &'static [usize] {
    use GgmlType::*;
    match ty {
        Q4_0 | Q5_0 | Q8_0 => &[0],
        Q4_1 | Q5_1 | Q4K | Q5K => &[0, 2],
        Q2K => &[80, 82],
        Q3K => &[108],
        Q6K => &[208],
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
                row.extend(b);
            }
        }
    }
    row
}

/// `sum |w x|` of the decoded row `w` (plus 1e-30, never zero): the scale of the rounding error
/// of any summation order. Panics if `row` does not decode to `x.len()` values.
pub fn abs_dot(ty: GgmlType, row: &[u8], x: &[f32]) -> f32 {
    let mut w = vec![0f32; x.len()];
    dequantize_row(ty, row, &mut w).unwrap();
    w.iter().zip(x).map(|(a, b)| (a * b).abs()).sum::<f32>() + 1e-30
}
