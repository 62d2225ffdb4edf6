//! Shared helpers of the pn-kernels tests: an independent Rust reading of the PN layout and
//! random test data.
#![allow(dead_code)]

use half::f16;
use rand::rngs::StdRng;
use rand::Rng;

// The seeded data every crate's tests use (`rng(seed)`, `random_vec(rng, n, a)`).
// Not every test binary that includes this module uses both.
#[allow(unused_imports)]
pub use pn_tests::{random_vec, rng};

/// Bits, zero point, weights per block, codes per word.
pub fn pn_geom(bits: u32) -> (u32, i32, usize, usize) {
    match bits {
        3 => (3, 4, 80, 10),
        4 => (4, 8, 64, 8),
        _ => panic!("bits must be 3 or 4"),
    }
}

/// Word i of a 34-byte block, read byte by byte (no alignment assumed).
pub fn ref_word(block: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(block[2 + 4 * i..6 + 4 * i].try_into().unwrap())
}

/// Code of element e: word e / per_word, shift BITS*(t>>1) + 16*(t&1).
pub fn ref_code(bits: u32, block: &[u8], e: usize) -> u32 {
    let (b, _, _, per) = pn_geom(bits);
    let t = e % per;
    (ref_word(block, e / per) >> (b as usize * (t >> 1) + 16 * (t & 1))) & ((1 << b) - 1)
}

/// w = d * (n - z) in f32.
pub fn ref_value(bits: u32, block: &[u8], e: usize) -> f32 {
    let (_, z, _, _) = pn_geom(bits);
    let d = f16::from_bits(u16::from_le_bytes([block[0], block[1]])).to_f32();
    d * (ref_code(bits, block, e) as i32 - z) as f32
}

/// A random PN block with a finite scale and (pn3t) the reserved bits clear.
pub fn random_pn_block(rng: &mut StdRng, bits: u32) -> [u8; 34] {
    let mut b = [0u8; 34];
    rng.fill(&mut b[..]);
    loop {
        let d = f16::from_bits(rng.random());
        if d.is_finite() {
            b[..2].copy_from_slice(&d.to_bits().to_le_bytes());
            break;
        }
    }
    if bits == 3 {
        for i in 0..8 {
            let w = ref_word(&b, i) & !0x8000_8000;
            b[2 + 4 * i..6 + 4 * i].copy_from_slice(&w.to_le_bytes());
        }
    }
    b
}

/// `n` random blocks back to back.
pub fn random_pn_row(rng: &mut StdRng, bits: u32, n: usize) -> Vec<u8> {
    (0..n).flat_map(|_| random_pn_block(rng, bits)).collect()
}

/// Pair q of a tensor (68 bytes, zero-padded past the end).
pub fn pair_bytes(data: &[u8], q: usize) -> [u8; 68] {
    let mut p = [0u8; 68];
    let start = 68 * q;
    let end = (start + 68).min(data.len());
    p[..end - start].copy_from_slice(&data[start..end]);
    p
}

/// f64 -> f16 with one round-to-nearest-even (the `half` crate's `from_f64` truncates low bits
/// first, which can break ties): the rounding of `__hfma2`, whose exact result the caller passes.
pub fn f16_rne(v: f64) -> f16 {
    if v.is_nan() {
        return f16::NAN;
    }
    let a = v.abs();
    let r = if a >= 65520.0 {
        f64::INFINITY
    } else if a == 0.0 {
        0.0
    } else {
        let e = a.log2().floor() as i32;
        // Correct an off-by-one of log2 near powers of two.
        let e = if 2f64.powi(e) > a {
            e - 1
        } else if 2f64.powi(e + 1) <= a {
            e + 1
        } else {
            e
        };
        let q = 2f64.powi(e.max(-14) - 10);
        (a / q).round_ties_even() * q
    };
    f16::from_f64(r.copysign(v))
}

/// Which pn_gemv kernel (kernels/pn_gemv.cu) to emulate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PnKernel {
    /// `pn*_gemv_h2_r1` / `_r2` (rows with an even block count; same per-row arithmetic).
    H2Even,
    /// `pn*_gemv_h2_any`.
    H2Any,
    /// `pn*_gemv_f32`.
    F32,
}

/// The kernel the wrappers pick for a shape with `Half2`.
pub fn h2_kernel_for(bits: u32, k: usize) -> PnKernel {
    if (k / pn_geom(bits).2).is_multiple_of(2) {
        PnKernel::H2Even
    } else {
        PnKernel::H2Any
    }
}

/// Power-of-two staging exponent of the half2 kernels: max|x| into [512, 1024).
pub fn h2_scale_exp(x: &[f32]) -> i32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    if !(amax > 0.0 && amax.is_finite()) {
        return 0;
    }
    // frexp: amax = m * 2^e with m in [0.5, 1).
    let e = (amax as f64).log2().floor() as i32 + 1;
    let e = if 2f64.powi(e - 1) > amax as f64 {
        e - 1
    } else if 2f64.powi(e) <= amax as f64 {
        e + 1
    } else {
        e
    };
    (10 - e).min(120)
}

fn pow2f(e: i32) -> f32 {
    f32::from_bits(((e + 127) as u32) << 23)
}

/// One block of the half2 path: fp16 FMAs over one word's code pairs, fp32 beyond, times d.
fn block_dot_h2(bits: u32, block: &[u8], xs: &[f16]) -> f32 {
    let (b, z, _, per) = pn_geom(bits);
    let mask = (1u32 << b) - 1;
    let d = f16::from_bits(u16::from_le_bytes([block[0], block[1]])).to_f32();
    let mut s = 0f32;
    for i in 0..8 {
        let w = ref_word(block, i);
        let (mut lo, mut hi) = (f16::ZERO, f16::ZERO);
        for j in 0..per / 2 {
            let n0 = ((w >> (b as usize * j)) & mask) as i32 - z;
            let n1 = ((w >> (16 + b as usize * j)) & mask) as i32 - z;
            lo = f16_rne(n0 as f64 * xs[i * per + 2 * j].to_f64() + lo.to_f64());
            hi = f16_rne(n1 as f64 * xs[i * per + 2 * j + 1].to_f64() + hi.to_f64());
        }
        s += lo.to_f32() + hi.to_f32();
    }
    d * s
}

/// One block of the fp32 path: FMA chain in element order, times d.
fn block_dot_f32(bits: u32, block: &[u8], x: &[f32]) -> f32 {
    let (_, z, wpb, _) = pn_geom(bits);
    let d = f16::from_bits(u16::from_le_bytes([block[0], block[1]])).to_f32();
    let mut s = 0f32;
    for (e, xe) in x.iter().enumerate().take(wpb) {
        s = ((ref_code(bits, block, e) as i32 - z) as f32).mul_add(*xe, s);
    }
    d * s
}

/// Bit-exact host emulation of the pn_gemv kernels: per-lane pair assignment, the kernels'
/// operation order, and the warp's butterfly reduction.
pub fn emulate_pn_gemv(
    bits: u32,
    kernel: PnKernel,
    w: &[u8],
    x: &[f32],
    n: usize,
    k: usize,
) -> Vec<f32> {
    let (_, _, wpb, _) = pn_geom(bits);
    let nb = k / wpb;
    let se = if kernel == PnKernel::F32 {
        0
    } else {
        h2_scale_exp(x)
    };
    let scale = pow2f(se);
    let xs: Vec<f16> = x.iter().map(|v| f16::from_f32(v * scale)).collect();
    let block = |g: usize| -> &[u8] { &w[34 * g..34 * g + 34] };
    (0..n)
        .map(|row| {
            let mut lanes = [0f32; 32];
            let g0 = row * nb;
            for (lane, acc) in lanes.iter_mut().enumerate() {
                match kernel {
                    PnKernel::H2Even => {
                        let mut j = lane;
                        while j < nb / 2 {
                            let g = g0 + 2 * j;
                            let b0 = block_dot_h2(bits, block(g), &xs[2 * j * wpb..]);
                            let b1 = block_dot_h2(bits, block(g + 1), &xs[(2 * j + 1) * wpb..]);
                            *acc += b0 + b1;
                            j += 32;
                        }
                    }
                    PnKernel::H2Any | PnKernel::F32 => {
                        let mut q = g0 / 2 + lane;
                        while q < (g0 + nb).div_ceil(2) {
                            for blk in 0..2 {
                                let g = 2 * q + blk;
                                if g >= g0 && g < g0 + nb {
                                    let off = (g - g0) * wpb;
                                    *acc += if kernel == PnKernel::F32 {
                                        block_dot_f32(bits, block(g), &x[off..])
                                    } else {
                                        block_dot_h2(bits, block(g), &xs[off..])
                                    };
                                }
                            }
                            q += 32;
                        }
                    }
                }
            }
            for o in [16, 8, 4, 2, 1] {
                let prev = lanes;
                for l in 0..32 {
                    lanes[l] = prev[l] + prev[l ^ o];
                }
            }
            lanes[0] * pow2f(-se)
        })
        .collect()
}

/// f64 reference `W x` and the per-row scale `sum |w x|` from dequantized rows.
pub fn pn_ref_f64(bits: u32, w: &[u8], x: &[f32], n: usize, k: usize) -> (Vec<f64>, Vec<f64>) {
    let ty = if bits == 3 {
        pn_format::PnType::Pn3t
    } else {
        pn_format::PnType::Pn4t
    };
    let mut wd = vec![0f32; n * k];
    pn_format::dequantize_row(ty, w, &mut wd).unwrap();
    let mut y = vec![0f64; n];
    let mut s = vec![0f64; n];
    for r in 0..n {
        for c in 0..k {
            let p = wd[r * k + c] as f64 * x[c] as f64;
            y[r] += p;
            s[r] += p.abs();
        }
    }
    (y, s)
}

/// Random weights quantized by the reference quantizer.
pub fn random_pn_weights(rng: &mut StdRng, bits: u32, n: usize, k: usize) -> Vec<u8> {
    let ty = if bits == 3 {
        pn_format::PnType::Pn3t
    } else {
        pn_format::PnType::Pn4t
    };
    let x = random_vec(rng, n * k, 1.0);
    pn_format::quantize_rows(ty, &x, k, 1).unwrap()
}

/// Activations like a normed, rotated residual: mostly small, a few large outliers.
pub fn activation_like(rng: &mut StdRng, k: usize) -> Vec<f32> {
    let mut x = random_vec(rng, k, 2.0);
    for _ in 0..4 {
        let i = rng.random_range(0..k);
        x[i] = rng.random_range(-300.0f32..300.0);
    }
    x
}

/// Dense f32 rows of a matrix through the CPU decoders.
pub fn dequant(ty: pn_kernels::WeightType, w: &[u8], n: usize, k: usize) -> Vec<f32> {
    let mut out = vec![0f32; n * k];
    match ty {
        pn_kernels::WeightType::Pn3t => {
            pn_format::dequantize_row(pn_format::PnType::Pn3t, w, &mut out).unwrap()
        }
        pn_kernels::WeightType::Pn4t => {
            pn_format::dequantize_row(pn_format::PnType::Pn4t, w, &mut out).unwrap()
        }
        pn_kernels::WeightType::F32 => {
            for (o, b) in out.iter_mut().zip(w.chunks(4)) {
                *o = f32::from_le_bytes(b.try_into().unwrap());
            }
        }
        _ => {
            let g = match ty {
                pn_kernels::WeightType::F16 => gguf_io::GgmlType::F16,
                pn_kernels::WeightType::Q8_0 => gguf_io::GgmlType::Q8_0,
                pn_kernels::WeightType::Q4K => gguf_io::GgmlType::Q4K,
                _ => gguf_io::GgmlType::Q3K,
            };
            gguf_io::quants::dequantize_row(g, w, &mut out).unwrap()
        }
    }
    out
}

/// A random matrix of `ty` (quantized from random floats by the CPU quantizers).
pub fn random_weights(r: &mut StdRng, ty: pn_kernels::WeightType, n: usize, k: usize) -> Vec<u8> {
    let x = random_vec(r, n * k, 1.0);
    match ty {
        pn_kernels::WeightType::Pn3t => {
            pn_format::quantize_rows(pn_format::PnType::Pn3t, &x, k, 1).unwrap()
        }
        pn_kernels::WeightType::Pn4t => {
            pn_format::quantize_rows(pn_format::PnType::Pn4t, &x, k, 1).unwrap()
        }
        pn_kernels::WeightType::F32 => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
        pn_kernels::WeightType::F16 => x
            .iter()
            .flat_map(|v| f16::from_f32(*v).to_le_bytes())
            .collect(),
        _ => {
            let g = match ty {
                pn_kernels::WeightType::Q8_0 => gguf_io::GgmlType::Q8_0,
                pn_kernels::WeightType::Q4K => gguf_io::GgmlType::Q4K,
                _ => gguf_io::GgmlType::Q3K,
            };
            let mut out = Vec::new();
            gguf_io::quants::quantize_row(g, &x, &mut out).unwrap();
            out
        }
    }
}

/// `src` with every function-like macro whose body pastes tokens (`##`) expanded at its
/// invocations, each expansion on a line of its own, and adjacent string literals joined: a
/// scan for kernel names then sees the kernels a macro defines or launches (`PN_BATCH(3, 2)`
/// defines `pn3t_gemv_h2p_b2`). Other macros are left as written (their kernels are named
/// literally at their `__global__`).
pub fn expand_pasting_macros(src: &str) -> String {
    let joined = src.replace("\\\n", " ");
    // (name, parameters, body) of each pasting macro; their #define lines are dropped.
    let mut macros: Vec<(String, Vec<String>, String)> = Vec::new();
    let mut kept = Vec::new();
    for line in joined.lines() {
        if let Some(m) = pasting_macro(line) {
            macros.push(m);
        } else {
            kept.push(line);
        }
    }
    let mut text = kept.join("\n");
    for (name, params, body) in &macros {
        let call = format!("{name}(");
        let mut out = String::new();
        let mut rest = text.as_str();
        while let Some(at) = rest.find(&call) {
            let starts_token = rest[..at]
                .chars()
                .last()
                .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
            out.push_str(&rest[..at]);
            let after = &rest[at + call.len()..];
            match macro_args(after) {
                Some((args, used)) if starts_token && args.len() == params.len() => {
                    out.push('\n');
                    out.push_str(&substitute(body, params, &args));
                    out.push('\n');
                    rest = &after[used..];
                }
                _ => {
                    out.push_str(&call);
                    rest = after;
                }
            }
        }
        out.push_str(rest);
        text = out;
    }
    text
}

/// `#define NAME(a, b) body` with `##` in its body.
fn pasting_macro(line: &str) -> Option<(String, Vec<String>, String)> {
    let def = line.trim_start().strip_prefix("#define ")?;
    let open = def.find('(')?;
    let name = &def[..open];
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return None;
    }
    let close = open + def[open..].find(')')?;
    let body = &def[close + 1..];
    body.contains("##").then(|| {
        let params = def[open + 1..close]
            .split(',')
            .map(|p| p.trim().to_string())
            .collect();
        (name.to_string(), params, body.trim().to_string())
    })
}

/// The arguments of a macro call whose `(` was just passed (split at top-level commas) and
/// the bytes up to and including its `)`.
fn macro_args(after: &str) -> Option<(Vec<String>, usize)> {
    let (mut depth, mut args, mut cur) = (0usize, Vec::new(), String::new());
    for (i, c) in after.char_indices() {
        match c {
            '(' => {
                depth += 1;
                cur.push(c);
            }
            ')' if depth == 0 => {
                args.push(cur.trim().to_string());
                return Some((args, i + 1));
            }
            ')' => {
                depth -= 1;
                cur.push(c);
            }
            ',' if depth == 0 => args.push(std::mem::take(&mut cur).trim().to_string()),
            _ => cur.push(c),
        }
    }
    None
}

/// A macro body with its parameters replaced (`#p` by the argument as a string literal),
/// `##` pasted and adjacent string literals joined.
fn substitute(body: &str, params: &[String], args: &[String]) -> String {
    let mut out = String::new();
    let chars: Vec<char> = body.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let stringify = out.ends_with('#') && !out.ends_with("##");
            match params.iter().position(|p| *p == word) {
                Some(k) if stringify => {
                    out.pop();
                    out.push_str(&format!("\"{}\"", args[k]));
                }
                Some(k) => out.push_str(&args[k]),
                None => out.push_str(&word),
            }
            continue;
        }
        out.push(c);
        i += 1;
    }
    // Paste: `a ## b` -> `ab`; then `"x" "y"` -> `"xy"`.
    let mut pasted = out.replace(" ## ", "").replace("##", "");
    loop {
        let joined = join_adjacent_literals(&pasted);
        if joined == pasted {
            return pasted;
        }
        pasted = joined;
    }
}

/// One pass joining string literals separated only by spaces.
fn join_adjacent_literals(s: &str) -> String {
    let mut out = String::new();
    let mut in_lit = false;
    let bytes: Vec<char> = s.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c == '"' && in_lit {
            let mut j = i + 1;
            while j < bytes.len() && bytes[j] == ' ' {
                j += 1;
            }
            if j < bytes.len() && bytes[j] == '"' {
                i = j + 1; // drop the closing quote, the spaces and the next opening quote
                continue;
            }
            in_lit = false;
        } else if c == '"' {
            in_lit = true;
        }
        out.push(c);
        i += 1;
    }
    out
}
