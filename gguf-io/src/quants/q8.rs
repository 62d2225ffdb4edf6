//! The int8-activation path: activations quantized once per token (Q8_K blocks of 256 for the
//! K-quants, Q8_0 blocks of 32 for Q4_0 and Q8_0, as ggml's CPU backend does), then integer dot
//! products per weight row. Scalar versions here are the reference for the SIMD ones.

use super::fp::{f16_at, f32_to_f16_bits};
use super::kquants::{q3k_scales, scale_min_k4, QK_K};
use super::legacy::QK;
use super::{check_row, QuantError};
use crate::types::GgmlType;

/// The activation block format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActFormat {
    /// 32 values per block, one scale (ggml's Q8_0; the scale is rounded through f16).
    Q8_0,
    /// 256 values per block, an f32 scale and sixteen 16-value sums (ggml's Q8_K).
    Q8K,
}

impl ActFormat {
    fn name(self) -> &'static str {
        match self {
            ActFormat::Q8_0 => "q8_0",
            ActFormat::Q8K => "q8_K",
        }
    }

    fn block(self) -> usize {
        match self {
            ActFormat::Q8_0 => QK,
            ActFormat::Q8K => QK_K,
        }
    }

    /// The activation format a weight type's integer dot product needs.
    pub fn for_weights(ty: GgmlType) -> Option<ActFormat> {
        match ty {
            GgmlType::Q4_0 | GgmlType::Q8_0 => Some(ActFormat::Q8_0),
            GgmlType::Q2K | GgmlType::Q3K | GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K => {
                Some(ActFormat::Q8K)
            }
            _ => None,
        }
    }
}

/// Activations quantized to int8 blocks for [`vec_dot_q`].
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizedActs {
    format: ActFormat,
    /// One scale per block.
    pub(crate) d: Vec<f32>,
    /// The quantized values.
    pub(crate) qs: Vec<i8>,
    /// Sums of each group of 16 quants (Q8K only).
    pub(crate) bsums: Vec<i16>,
}

impl QuantizedActs {
    /// The block format.
    pub fn format(&self) -> ActFormat {
        self.format
    }

    /// Number of activations.
    pub fn len(&self) -> usize {
        self.qs.len()
    }

    /// Whether there are no activations.
    pub fn is_empty(&self) -> bool {
        self.qs.is_empty()
    }

    /// The dequantized activations (`d * q`), for error analysis.
    pub fn dequantize(&self) -> Vec<f32> {
        let blk = self.format.block();
        self.qs
            .iter()
            .enumerate()
            .map(|(i, &q)| self.d[i / blk] * q as f32)
            .collect()
    }
}

/// Quantizes `x` into the activation format that weights of type `ty_of_weight` need
/// (Q8_K for Q2_K..Q6_K, Q8_0 for Q4_0 and Q8_0).
pub fn quantize_activations(
    ty_of_weight: GgmlType,
    x: &[f32],
) -> Result<QuantizedActs, QuantError> {
    let format = ActFormat::for_weights(ty_of_weight).ok_or(QuantError::Unsupported {
        ty: ty_of_weight,
        op: "quantize_activations",
    })?;
    let blk = format.block();
    if !x.len().is_multiple_of(blk) {
        return Err(QuantError::NotBlockMultiple {
            ty: ty_of_weight,
            n: x.len(),
            block_size: blk,
        });
    }
    let mut acts = QuantizedActs {
        format,
        d: Vec::with_capacity(x.len() / blk),
        qs: Vec::with_capacity(x.len()),
        bsums: Vec::new(),
    };
    match format {
        ActFormat::Q8_0 => {
            for b in x.chunks_exact(QK) {
                let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                acts.d.push(f16_at(&f32_to_f16_bits(d).to_le_bytes(), 0));
                acts.qs
                    .extend(b.iter().map(|&v| (v * id).round_ties_even() as i8));
            }
        }
        ActFormat::Q8K => {
            acts.bsums.reserve(x.len() / 16);
            for b in x.chunks_exact(QK_K) {
                // The element of largest magnitude, with its sign, maps to -127.
                let mx = b
                    .iter()
                    .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
                if mx == 0.0 {
                    acts.d.push(0.0);
                    acts.qs.extend(std::iter::repeat_n(0i8, QK_K));
                    acts.bsums.extend(std::iter::repeat_n(0i16, 16));
                    continue;
                }
                let iscale = -127.0 / mx;
                let start = acts.qs.len();
                acts.qs.extend(
                    b.iter()
                        .map(|&v| (iscale * v).round_ties_even().min(127.0) as i8),
                );
                for g in acts.qs[start..].chunks_exact(16) {
                    acts.bsums.push(g.iter().map(|&q| q as i16).sum());
                }
                acts.d.push(1.0 / iscale);
            }
        }
    }
    Ok(acts)
}

/// The dot product of one weight row with int8-quantized activations, using SIMD when the CPU
/// has it.
pub fn vec_dot_q(ty: GgmlType, row: &[u8], acts: &QuantizedActs) -> Result<f32, QuantError> {
    check_acts(ty, row, acts)?;
    #[cfg(target_arch = "x86_64")]
    if let Some(v) = super::x86::vec_dot_q(ty, row, acts) {
        return Ok(v);
    }
    Ok(dot_q_scalar(ty, row, acts))
}

/// Scalar reference of [`vec_dot_q`].
pub fn vec_dot_q_scalar(ty: GgmlType, row: &[u8], acts: &QuantizedActs) -> Result<f32, QuantError> {
    check_acts(ty, row, acts)?;
    Ok(dot_q_scalar(ty, row, acts))
}

fn check_acts(ty: GgmlType, row: &[u8], acts: &QuantizedActs) -> Result<(), QuantError> {
    let needed = ActFormat::for_weights(ty).ok_or(QuantError::Unsupported {
        ty,
        op: "vec_dot_q",
    })?;
    if needed != acts.format {
        return Err(QuantError::ActsMismatch {
            ty,
            needed: needed.name(),
            prepared: acts.format.name(),
        });
    }
    check_row(ty, acts.len(), row.len(), "weight row")
}

fn dot_q_scalar(ty: GgmlType, row: &[u8], a: &QuantizedActs) -> f32 {
    let bs = ty.type_size();
    let blk = ty.block_size();
    let mut sum = 0f32;
    for (i, b) in row.chunks_exact(bs).enumerate() {
        let q = &a.qs[i * blk..(i + 1) * blk];
        let da = a.d[i];
        sum += match ty {
            GgmlType::Q8_0 => {
                let s: i32 = b[2..34]
                    .iter()
                    .zip(q)
                    .map(|(&w, &x)| (w as i8) as i32 * x as i32)
                    .sum();
                f16_at(b, 0) * da * s as f32
            }
            GgmlType::Q4_0 => {
                let mut s = 0i32;
                for j in 0..16 {
                    s += ((b[2 + j] & 15) as i32 - 8) * q[j] as i32;
                    s += ((b[2 + j] >> 4) as i32 - 8) * q[j + 16] as i32;
                }
                f16_at(b, 0) * da * s as f32
            }
            _ => {
                let bsums = &a.bsums[i * 16..i * 16 + 16];
                kquant_block_dot(ty, b, q, bsums, da)
            }
        };
    }
    sum
}

/// One K-quant super-block times one Q8_K block, in integers as far as possible.
fn kquant_block_dot(ty: GgmlType, b: &[u8], q: &[i8], bsums: &[i16], da: f32) -> f32 {
    let dot16 = |w: &dyn Fn(usize) -> i32, g: usize| -> i32 {
        (16 * g..16 * g + 16).map(|e| w(e) * q[e] as i32).sum()
    };
    match ty {
        GgmlType::Q4K | GgmlType::Q5K => {
            let (d, dmin) = (f16_at(b, 0) * da, f16_at(b, 2) * da);
            let scales = &b[4..16];
            let five = ty == GgmlType::Q5K;
            let level = |e: usize| -> i32 {
                let (c, r) = (e / 64, e % 64);
                let l = r % 32;
                if five {
                    let qs = &b[48..];
                    let low = if r < 32 {
                        qs[32 * c + l] & 15
                    } else {
                        qs[32 * c + l] >> 4
                    };
                    let j = 2 * c + r / 32;
                    low as i32 + 16 * ((b[16 + l] >> j) & 1) as i32
                } else {
                    let qs = &b[16..];
                    (if r < 32 {
                        qs[32 * c + l] & 15
                    } else {
                        qs[32 * c + l] >> 4
                    }) as i32
                }
            };
            let (mut s, mut m) = (0i32, 0i32);
            for j in 0..8 {
                let (sc, mn) = scale_min_k4(j, scales);
                s += sc as i32 * (dot16(&level, 2 * j) + dot16(&level, 2 * j + 1));
                m += mn as i32 * (bsums[2 * j] as i32 + bsums[2 * j + 1] as i32);
            }
            d * s as f32 - dmin * m as f32
        }
        GgmlType::Q6K => {
            let d = f16_at(b, 208) * da;
            let level = |e: usize| -> i32 {
                let (h, r) = (e / 128, e % 128);
                let (k, l) = (r / 32, r % 32);
                let byte = b[64 * h + 32 * (k & 1) + l];
                let low = if k < 2 { byte & 15 } else { byte >> 4 };
                let hi = (b[128 + 32 * h + l] >> (2 * k)) & 3;
                (low | (hi << 4)) as i32 - 32
            };
            let s: i32 = (0..16)
                .map(|g| (b[192 + g] as i8) as i32 * dot16(&level, g))
                .sum();
            d * s as f32
        }
        GgmlType::Q3K => {
            let d = f16_at(b, 108) * da;
            let sc = q3k_scales(&b[96..108]);
            let level = |e: usize| -> i32 {
                let (h, r) = (e / 128, e % 128);
                let (j, l) = (r / 32, r % 32);
                let q2 = ((b[32 + 32 * h + l] >> (2 * j)) & 3) as i32;
                if (b[l] >> (4 * h + j)) & 1 != 0 {
                    q2
                } else {
                    q2 - 4
                }
            };
            let s: i32 = (0..16).map(|g| sc[g] as i32 * dot16(&level, g)).sum();
            d * s as f32
        }
        GgmlType::Q2K => {
            let (d, dmin) = (f16_at(b, 80) * da, f16_at(b, 82) * da);
            let level = |e: usize| -> i32 {
                let (h, r) = (e / 128, e % 128);
                let (shift, l) = (2 * (r / 32), r % 32);
                ((b[16 + 32 * h + l] >> shift) & 3) as i32
            };
            let (mut s, mut m) = (0i32, 0i32);
            for g in 0..16 {
                let sc = b[g];
                s += (sc & 15) as i32 * dot16(&level, g);
                m += (sc >> 4) as i32 * bsums[g] as i32;
            }
            d * s as f32 - dmin * m as f32
        }
        _ => unreachable!("checked by ActFormat::for_weights"),
    }
}
