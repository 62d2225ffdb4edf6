//! One row in, one row out: decode an input row to f32, rotate it for PN types, and encode it in
//! the target type, optionally measuring the quantization error.

use super::error::QuantizeError;
use super::mix::Target;
use gguf_io::GgmlType;

/// Input types the quantizer reads.
pub fn input_supported(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::Q8_0
    )
}

/// Decodes one input row into `dst` and checks every value is finite.
pub fn decode_row(
    tensor: &str,
    row: u64,
    ty: GgmlType,
    src: &[u8],
    dst: &mut [f32],
) -> Result<(), QuantizeError> {
    gguf_io::quants::dequantize_row(ty, src, dst).map_err(|e| QuantizeError::Codec {
        tensor: tensor.to_string(),
        msg: format!("decoding row {row}: {e}"),
    })?;
    if let Some((col, &value)) = dst.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(QuantizeError::NonFinite {
            tensor: tensor.to_string(),
            row,
            col: col as u64,
            value,
        });
    }
    Ok(())
}

/// Sums of squares accumulated over rows, for relative errors `e2 / w2`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ErrStats {
    /// `sum w^2` over the original weights.
    pub w2: f64,
    /// `sum (w - q)^2` of the encoding actually written.
    pub e2: f64,
    /// `sum (w - q)^2` of the same type without rotation (only filled when asked; PN only).
    pub e2_unrotated: f64,
    /// `sum imp_j w_j^2` (importance-weighted), when an importance vector is given.
    pub w2_weighted: f64,
    /// `sum imp_j e_j^2` in the original basis, when an importance vector is given.
    pub e2_weighted: f64,
}

impl ErrStats {
    /// Adds another partial sum.
    pub fn add(&mut self, o: &ErrStats) {
        self.w2 += o.w2;
        self.e2 += o.e2;
        self.e2_unrotated += o.e2_unrotated;
        self.w2_weighted += o.w2_weighted;
        self.e2_weighted += o.e2_weighted;
    }

    /// `e2 / w2` (0 for an all-zero tensor).
    pub fn rel(&self) -> f64 {
        ratio(self.e2, self.w2)
    }

    /// `e2_unrotated / w2`.
    pub fn rel_unrotated(&self) -> f64 {
        ratio(self.e2_unrotated, self.w2)
    }

    /// The importance-weighted relative error, falling back to the plain one.
    pub fn rel_weighted(&self) -> f64 {
        if self.w2_weighted > 0.0 {
            ratio(self.e2_weighted, self.w2_weighted)
        } else {
            self.rel()
        }
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// How to encode the rows of one tensor.
#[derive(Clone, Debug)]
pub struct RowEncoder {
    /// Tensor name (for errors).
    pub tensor: String,
    /// The intended type.
    pub target: Target,
    /// Row length.
    pub k: usize,
    /// Hadamard block size for PN targets; `None` = not rotated.
    pub rotation: Option<usize>,
    /// True when the stock target's block does not divide K: the row is zero-padded to whole
    /// blocks, quantized, decoded, and written as F32 (a quality stand-in, see the summary).
    pub simulated: bool,
    /// Per-column importance `[k]` (original basis, e.g. an imatrix's mean squared activation)
    /// that a stock K-quant/Q8_0 encoding minimises the weighted error of
    /// (`gguf_io::quants::quantize_row_weighted`); `None`: the unweighted quantizer. PN targets
    /// ignore it (their calibrated encoders live in `calibrated`).
    pub weights: Option<std::sync::Arc<[f32]>>,
}

impl RowEncoder {
    /// The type written to the file.
    pub fn out_type(&self) -> GgmlType {
        if self.simulated {
            GgmlType::F32
        } else {
            self.target.ggml()
        }
    }

    /// Bytes of one output row.
    pub fn out_row_bytes(&self) -> usize {
        let ty = self.out_type();
        // Checked when the plan was made; a failure here would be a planning bug.
        ty.row_bytes(self.k as u64).unwrap_or(0) as usize
    }

    fn codec_err(&self, row: u64, e: impl std::fmt::Display) -> QuantizeError {
        QuantizeError::Codec {
            tensor: self.tensor.clone(),
            msg: format!("row {row}: {e}"),
        }
    }

    /// Encodes `w` (one decoded row; rotated in place for PN targets) into `out`, which must be
    /// `out_row_bytes()` long. With `stats`, adds the row's error sums; `unrotated` also measures
    /// the PN encoding of the unrotated row (for the report); `importance` weights the error in
    /// the original basis (for ranking promotions).
    pub fn encode(
        &self,
        row: u64,
        w: &mut [f32],
        out: &mut [u8],
        stats: Option<&mut ErrStats>,
        unrotated: bool,
        importance: Option<&[f32]>,
    ) -> Result<(), QuantizeError> {
        match self.target.pn() {
            Some(pn) => {
                let measure = Measure {
                    stats,
                    unrotated,
                    importance,
                };
                self.encode_pn(pn, row, w, out, measure)
            }
            None => self.encode_stock(row, w, out, stats, importance),
        }
    }

    fn encode_pn(
        &self,
        pn: pn_format::PnType,
        row: u64,
        w: &mut [f32],
        out: &mut [u8],
        measure: Measure<'_>,
    ) -> Result<(), QuantizeError> {
        let Measure {
            stats,
            unrotated,
            importance,
        } = measure;
        let mut local = ErrStats::default();
        if stats.is_some() {
            local.w2 = sum_sq(w);
            if unrotated {
                let q = pn_format::quantize_row_ref(pn, w).map_err(|e| self.codec_err(row, e))?;
                let mut d = vec![0f32; w.len()];
                pn_format::dequantize_row(pn, &q, &mut d).map_err(|e| self.codec_err(row, e))?;
                local.e2_unrotated = diff_sq(w, &d);
            }
            if let Some(imp) = importance {
                local.w2_weighted = weighted_sq(w, imp);
            }
        }
        if let Some(r) = self.rotation {
            pn_format::hadamard::fwht_blocks_inplace(w, r).map_err(|e| self.codec_err(row, e))?;
        }
        let q = pn_format::quantize_row_ref(pn, w).map_err(|e| self.codec_err(row, e))?;
        if q.len() != out.len() {
            return Err(self.codec_err(
                row,
                format!("encoder gave {} bytes, expected {}", q.len(), out.len()),
            ));
        }
        out.copy_from_slice(&q);
        if let Some(stats) = stats {
            let mut d = vec![0f32; w.len()];
            pn_format::dequantize_row(pn, &q, &mut d).map_err(|e| self.codec_err(row, e))?;
            // H is orthonormal, so the error in the rotated basis has the same norm.
            local.e2 = diff_sq(w, &d);
            if let Some(imp) = importance {
                // Back to the original basis (H H = I) to weight each input column.
                let mut e: Vec<f32> = w.iter().zip(&d).map(|(a, b)| a - b).collect();
                if let Some(r) = self.rotation {
                    pn_format::hadamard::fwht_blocks_inplace(&mut e, r)
                        .map_err(|er| self.codec_err(row, er))?;
                }
                local.e2_weighted = weighted_sq(&e, imp);
            }
            stats.add(&local);
        }
        Ok(())
    }

    /// True when stock rows are encoded with the importance-weighted quantizer.
    pub fn weighted_stock(&self) -> bool {
        self.weights.is_some()
            && !self.target.is_pn()
            && gguf_io::quants::WEIGHTED.contains(&self.target.ggml())
    }

    /// Quantizes `x` (a whole number of blocks; `x.len() >= k`, zero padding past `k`) as the
    /// stock target, weighted when [`Self::weighted_stock`] (padding columns weigh 0).
    fn quantize_stock(&self, row: u64, x: &[f32], buf: &mut Vec<u8>) -> Result<(), QuantizeError> {
        let ty = self.target.ggml();
        match self.weights.as_deref().filter(|_| self.weighted_stock()) {
            Some(imp) => {
                let mut iw = vec![0f32; x.len()];
                let n = imp.len().min(x.len());
                iw[..n].copy_from_slice(&imp[..n]);
                gguf_io::quants::quantize_row_weighted(ty, x, &iw, buf)
            }
            None => gguf_io::quants::quantize_row(ty, x, buf),
        }
        .map_err(|e| self.codec_err(row, e))
    }

    fn encode_stock(
        &self,
        row: u64,
        w: &mut [f32],
        out: &mut [u8],
        stats: Option<&mut ErrStats>,
        importance: Option<&[f32]>,
    ) -> Result<(), QuantizeError> {
        let ty = self.target.ggml();
        if matches!(ty, GgmlType::F32) {
            for (o, v) in out.chunks_exact_mut(4).zip(w.iter()) {
                o.copy_from_slice(&v.to_le_bytes());
            }
            if let Some(s) = stats {
                s.w2 += sum_sq(w);
            }
            return Ok(());
        }
        let bs = ty.block_size();
        let padded_len = w.len().div_ceil(bs) * bs;
        let mut buf = Vec::new();
        let decoded: Option<Vec<f32>> = if self.simulated {
            let mut p = w.to_vec();
            p.resize(padded_len, 0.0);
            self.quantize_stock(row, &p, &mut buf)?;
            let mut d = vec![0f32; padded_len];
            gguf_io::quants::dequantize_row(ty, &buf, &mut d)
                .map_err(|e| self.codec_err(row, e))?;
            d.truncate(w.len());
            for (o, v) in out.chunks_exact_mut(4).zip(d.iter()) {
                o.copy_from_slice(&v.to_le_bytes());
            }
            Some(d)
        } else {
            self.quantize_stock(row, w, &mut buf)?;
            if buf.len() != out.len() {
                return Err(self.codec_err(
                    row,
                    format!("encoder gave {} bytes, expected {}", buf.len(), out.len()),
                ));
            }
            out.copy_from_slice(&buf);
            if stats.is_some() {
                let mut d = vec![0f32; w.len()];
                gguf_io::quants::dequantize_row(ty, &buf, &mut d)
                    .map_err(|e| self.codec_err(row, e))?;
                Some(d)
            } else {
                None
            }
        };
        if let (Some(s), Some(d)) = (stats, decoded) {
            s.w2 += sum_sq(w);
            let e = diff_sq(w, &d);
            s.e2 += e;
            s.e2_unrotated += e;
            if let Some(imp) = importance {
                s.w2_weighted += weighted_sq(w, imp);
                let err: Vec<f32> = w.iter().zip(&d).map(|(a, b)| a - b).collect();
                s.e2_weighted += weighted_sq(&err, imp);
            }
        }
        Ok(())
    }
}

/// What [`RowEncoder::encode`] measures besides encoding a row (see there).
struct Measure<'a> {
    /// Where the row's error sums go (`None`: not measured).
    stats: Option<&'a mut ErrStats>,
    /// Also measure the PN encoding of the unrotated row.
    unrotated: bool,
    /// Per-column importance weighting the error in the original basis.
    importance: Option<&'a [f32]>,
}

fn sum_sq(x: &[f32]) -> f64 {
    x.iter().map(|&v| (v as f64) * (v as f64)).sum()
}

fn diff_sq(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| {
            let d = x as f64 - y as f64;
            d * d
        })
        .sum()
}

fn weighted_sq(x: &[f32], imp: &[f32]) -> f64 {
    x.iter()
        .zip(imp)
        .map(|(&v, &i)| (i as f64) * (v as f64) * (v as f64))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(k: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..k)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1
            })
            .collect()
    }

    #[test]
    fn pn_row_is_rotated_then_reference_quantized() {
        let k = 320;
        let w = row(k, 7);
        let enc = RowEncoder {
            tensor: "t".into(),
            target: Target::Pn3t,
            k,
            rotation: Some(64),
            simulated: false,
            weights: None,
        };
        let mut out = vec![0u8; enc.out_row_bytes()];
        let mut work = w.clone();
        let mut st = ErrStats::default();
        enc.encode(0, &mut work, &mut out, Some(&mut st), true, None)
            .unwrap();
        let mut rot = w.clone();
        pn_format::hadamard::fwht_blocks_inplace(&mut rot, 64).unwrap();
        let expect = pn_format::quantize_row_ref(pn_format::PnType::Pn3t, &rot).unwrap();
        assert_eq!(out, expect);
        assert!(st.rel() > 0.0 && st.rel() < 0.2, "{st:?}");
        assert!(st.rel_unrotated() > 0.0, "{st:?}");
    }

    #[test]
    fn non_finite_input_names_row_and_column() {
        let mut bytes = Vec::new();
        for v in [1.0f32, 2.0, f32::NAN, 4.0] {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        let mut dst = [0f32; 4];
        let e = decode_row("blk.1.ffn_up.weight", 5, GgmlType::F32, &bytes, &mut dst).unwrap_err();
        let s = e.to_string();
        assert!(
            s.contains("blk.1.ffn_up.weight") && s.contains("row 5") && s.contains("column 2"),
            "{s}"
        );
    }

    #[test]
    fn simulated_stock_row_is_f32_of_padded_quantization() {
        let k = 320; // not a multiple of 256
        let w = row(k, 3);
        let enc = RowEncoder {
            tensor: "token_embd.weight".into(),
            target: Target::Stock(GgmlType::Q3K),
            k,
            rotation: None,
            simulated: true,
            weights: None,
        };
        assert_eq!(enc.out_type(), GgmlType::F32);
        let mut out = vec![0u8; enc.out_row_bytes()];
        let mut st = ErrStats::default();
        enc.encode(0, &mut w.clone(), &mut out, Some(&mut st), false, None)
            .unwrap();
        let rel = st.rel();
        assert!(rel > 1e-4 && rel < 0.2, "{rel}");
    }
}
