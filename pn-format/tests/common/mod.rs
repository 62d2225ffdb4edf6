//! Helpers shared by the integration tests: a fixed PRNG (so golden inputs never change with a
//! dependency upgrade) and an independent, deliberately naive reference quantizer.
#![allow(dead_code)]

use half::f16;
use pn_format::PnType;

/// SplitMix64: tiny, fixed forever, good enough for test data.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(1e-300);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
    pub fn normals(&mut self, n: usize, sigma: f64) -> Vec<f32> {
        (0..n).map(|_| (self.normal() * sigma) as f32).collect()
    }
}

/// What the naive quantizer decided for one group.
#[derive(Debug, Clone, PartialEq)]
pub struct Naive {
    pub d: f16,
    pub codes: Vec<u8>,
    /// Index of the winning multiplier, None for the canonical zero group.
    pub best: Option<usize>,
    /// Error of every candidate (None = skipped).
    pub errors: Vec<Option<f64>>,
}

/// The decisions page's algorithm, written as plainly as possible: one candidate at a time,
/// a sequential f64 sum per candidate, `round_ties_even` for rint.
pub fn naive_quantize(ty: PnType, w: &[f32]) -> Naive {
    let z = ty.zero_point() as f64;
    let wf: Vec<f64> = w.iter().map(|&v| v as f64).collect();
    let amax = wf.iter().fold(0.0f64, |a, v| a.max(v.abs()));
    let max = wf.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let min = wf.iter().cloned().fold(f64::INFINITY, f64::min);
    let zero = Naive {
        d: f16::from_f32(0.0),
        codes: vec![ty.zero_point() as u8; w.len()],
        best: None,
        errors: vec![None; 36],
    };
    if amax == 0.0 {
        return zero;
    }
    let sigma = if min.abs() > max { 1.0 } else { -1.0 };
    let code = |v: f64, s: f64| ((v / s).round_ties_even() + z).clamp(0.0, 2.0 * z - 1.0);
    let mut errors = vec![None; 36];
    let mut best: Option<(usize, f64)> = None;
    for (i, slot) in errors.iter_mut().enumerate() {
        let m = (50 + 2 * i) as f64 / 100.0;
        let s = f16::from_f32((sigma * m * amax / z) as f32);
        if s.to_f32() == 0.0 || !s.is_finite() {
            continue;
        }
        let s = s.to_f64();
        let mut err = 0.0;
        for &v in &wf {
            let n = code(v, s);
            err += (v - s * (n - z)) * (v - s * (n - z));
        }
        *slot = Some(err);
        if best.is_none_or(|(_, e)| err <= e) {
            best = Some((i, err));
        }
    }
    let Some((bi, _)) = best else {
        return Naive { errors, ..zero };
    };
    let m = (50 + 2 * bi) as f64 / 100.0;
    let s = f16::from_f32((sigma * m * amax / z) as f32);
    Naive {
        d: s,
        codes: wf.iter().map(|&v| code(v, s.to_f64()) as u8).collect(),
        best: Some(bi),
        errors,
    }
}

/// Codes of a block, read with the spec's formula written out independently of the crate.
pub fn spec_codes(ty: PnType, block: &[u8]) -> Vec<u8> {
    let (bits, cpw) = match ty {
        PnType::Pn3t => (3u32, 10usize),
        PnType::Pn4t => (4, 8),
    };
    let mut out = Vec::new();
    for i in 0..8 {
        let w = u32::from_le_bytes(block[2 + 4 * i..6 + 4 * i].try_into().unwrap());
        for t in 0..cpw {
            let shift = if t % 2 == 0 {
                bits * (t as u32 / 2)
            } else {
                16 + bits * (t as u32 / 2)
            };
            out.push(((w >> shift) & ((1 << bits) - 1)) as u8);
        }
    }
    out
}

/// Scale for error bounds: `sum over blocks of |d| * sum((n + z) * |x|)`, which bounds every
/// partial sum that either the direct or the `sum(n x) - z sum(x)` formulation forms.
pub fn magnitude(ty: PnType, row: &[u8], x: &[f32]) -> f64 {
    let bpw = ty.weights_per_block();
    let mut s = 0.0;
    for (b, blk) in pn_format::blocks(ty, row).unwrap().enumerate() {
        for e in 0..bpw {
            let n = blk.code(e) as f64 + ty.zero_point() as f64;
            s += (blk.scale() as f64).abs() * n * (x[b * bpw + e] as f64).abs();
        }
    }
    s
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Random blocks with finite scales of any sign and random words (reserved bits included).
pub fn random_rows(nb: usize, rows: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed);
    let mut out = Vec::with_capacity(nb * rows * 34);
    for _ in 0..nb * rows {
        let mut d = rng.next_u64() as u16;
        if d & 0x7c00 == 0x7c00 {
            d &= 0xbfff;
        }
        out.extend_from_slice(&d.to_le_bytes());
        for _ in 0..8 {
            out.extend_from_slice(&(rng.next_u64() as u32).to_le_bytes());
        }
    }
    out
}
