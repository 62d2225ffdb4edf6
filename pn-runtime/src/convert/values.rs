//! Element conversion: checkpoint dtype to the working precision, the value transform, and the
//! output type, with the rounding llama.cpp's converter uses.
//!
//! The converter computes its transforms in the input's precision when that is F16 or F32 and
//! in F32 for BF16 (which it widens first): `1 + w` of an F16 weight is rounded to F16 before
//! it is stored as F32. F32 to F16 rounds to nearest even (numpy's `astype(float16)`); F32 to
//! BF16 rounds to nearest even with NaN forced quiet (gguf-py's `quants.py`, BF16).

use super::names::ValueOp;
use super::shards::Dtype;
use gguf_io::GgmlType;
use half::f16;

/// The GGUF types the converter writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutType {
    /// IEEE single.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    Bf16,
}

impl OutType {
    /// The ggml type.
    pub fn ggml(self) -> GgmlType {
        match self {
            OutType::F32 => GgmlType::F32,
            OutType::F16 => GgmlType::F16,
            OutType::Bf16 => GgmlType::BF16,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            OutType::F32 => 4,
            OutType::F16 | OutType::Bf16 => 2,
        }
    }

    /// `general.file_type` (llama.cpp's `LlamaFileType`: ALL_F32 0, MOSTLY_F16 1, MOSTLY_BF16 32).
    pub fn file_type(self) -> u32 {
        match self {
            OutType::F32 => 0,
            OutType::F16 => 1,
            OutType::Bf16 => 32,
        }
    }

    /// The output type that keeps a checkpoint of dtype `d` exact.
    pub fn lossless_for(d: Dtype) -> OutType {
        match d {
            Dtype::F16 => OutType::F16,
            Dtype::Bf16 => OutType::Bf16,
            Dtype::F32 => OutType::F32,
        }
    }
}

/// F32 to BF16 bits as gguf-py rounds: NaN made quiet, otherwise round to nearest even.
pub fn bf16_bits(x: f32) -> u16 {
    let n = x.to_bits();
    if n & 0x7fff_ffff > 0x7f80_0000 {
        // The low half is zero after this, so the rounding below would not change it.
        return (((n & 0xffff_0000) | (64 << 16)) >> 16) as u16;
    }
    ((u64::from(n) + (0x7fff + u64::from((n >> 16) & 1))) >> 16) as u16
}

/// Converts `n` elements of `input` (dtype `dt`, little-endian) into `out` (type `ot`),
/// applying `op` at the converter's working precision.
pub fn convert_elements(input: &[u8], dt: Dtype, op: ValueOp, ot: OutType, out: &mut Vec<u8>) {
    match dt {
        Dtype::F16 => {
            for c in input.chunks_exact(2) {
                let x = f16::from_le_bytes([c[0], c[1]]);
                // Working precision F16: the result of the op is rounded to F16.
                let w = match op {
                    ValueOp::None => x,
                    ValueOp::PlusOne => f16::from_f32(x.to_f32() + 1.0),
                    ValueOp::NegExp => -f16::from_f32(x.to_f32().exp()),
                };
                match ot {
                    OutType::F16 => out.extend_from_slice(&w.to_le_bytes()),
                    OutType::F32 => out.extend_from_slice(&w.to_f32().to_le_bytes()),
                    OutType::Bf16 => out.extend_from_slice(&bf16_bits(w.to_f32()).to_le_bytes()),
                }
            }
        }
        Dtype::Bf16 | Dtype::F32 => {
            let step = dt.size();
            for c in input.chunks_exact(step) {
                let x = if step == 2 {
                    f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16)
                } else {
                    f32::from_le_bytes([c[0], c[1], c[2], c[3]])
                };
                let w = match op {
                    ValueOp::None => x,
                    ValueOp::PlusOne => x + 1.0,
                    ValueOp::NegExp => -x.exp(),
                };
                match ot {
                    OutType::F32 => out.extend_from_slice(&w.to_le_bytes()),
                    OutType::F16 => out.extend_from_slice(&f16::from_f32(w).to_le_bytes()),
                    OutType::Bf16 => out.extend_from_slice(&bf16_bits(w).to_le_bytes()),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even_and_quiets_nan() {
        assert_eq!(bf16_bits(1.0), 0x3f80);
        // Exactly half way between 0x3f80 and 0x3f81: to even (0x3f80).
        assert_eq!(bf16_bits(f32::from_bits(0x3f80_8000)), 0x3f80);
        // Half way between 0x3f81 and 0x3f82: to even (0x3f82).
        assert_eq!(bf16_bits(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(bf16_bits(f32::from_bits(0x3f80_8001)), 0x3f81);
        // A signalling NaN with only low payload bits stays a NaN.
        assert_eq!(bf16_bits(f32::from_bits(0x7f80_0001)), 0x7fc0);
    }

    #[test]
    fn f16_transforms_round_in_f16() {
        // 1 + 2^-12 is not an f16 (ulp of 1 is 2^-10): the F16 path rounds it to 1, the F32
        // path keeps it.
        let w = f16::from_f32(2f32.powi(-12));
        let mut out = Vec::new();
        convert_elements(
            &w.to_le_bytes(),
            Dtype::F16,
            ValueOp::PlusOne,
            OutType::F32,
            &mut out,
        );
        assert_eq!(f32::from_le_bytes(out[..4].try_into().unwrap()), 1.0);
        out.clear();
        let x = w.to_f32().to_le_bytes();
        convert_elements(&x, Dtype::F32, ValueOp::PlusOne, OutType::F32, &mut out);
        assert_eq!(
            f32::from_le_bytes(out[..4].try_into().unwrap()),
            1.0 + 2f32.powi(-12)
        );
        out.clear();
        convert_elements(&x, Dtype::F32, ValueOp::NegExp, OutType::F32, &mut out);
        assert_eq!(
            f32::from_le_bytes(out[..4].try_into().unwrap()),
            -(2f32.powi(-12)).exp()
        );
    }
}
