//! CPU-side tests of the kernels' `__host__ __device__` layout math (kernels/*.cuh compiled as
//! host C++): PN pairs, code extraction, the half2 exponent trick, row/pair index math and the
//! stock block decodes, bit for bit against an independent Rust reading of the layouts and
//! against pn-format / gguf-io.

mod common;

use common::*;
use half::f16;
use pn_kernels::host_shim::safe as shim;
use rand::Rng;

fn pn_type(bits: u32) -> pn_format::PnType {
    if bits == 3 {
        pn_format::PnType::Pn3t
    } else {
        pn_format::PnType::Pn4t
    }
}

#[test]
fn pair_words_and_scales_match_byte_layout() {
    let mut r = rng(1);
    for bits in [3, 4] {
        for nblocks in [1usize, 2, 3, 7, 8] {
            let data = random_pn_row(&mut r, bits, nblocks);
            for q in 0..nblocks.div_ceil(2) {
                let pair = pair_bytes(&data, q);
                for blk in 0..2 {
                    let g = 2 * q + blk;
                    if g >= nblocks {
                        continue;
                    }
                    let block = &data[34 * g..34 * g + 34];
                    assert_eq!(
                        shim::pn_pair_scale_bits(&pair, blk),
                        u16::from_le_bytes([block[0], block[1]]),
                        "scale of block {g}"
                    );
                    for i in 0..8 {
                        assert_eq!(
                            shim::pn_pair_word(&pair, blk, i),
                            ref_word(block, i),
                            "word {i} of block {g}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn dequant_block_is_bit_exact_against_reference_and_pn_format() {
    let mut r = rng(2);
    for bits in [3, 4] {
        let (_, _, wpb, _) = pn_geom(bits);
        let nblocks = 64;
        let data = random_pn_row(&mut r, bits, nblocks);
        let mut pnf = vec![0f32; nblocks * wpb];
        pn_format::dequantize_row(pn_type(bits), &data, &mut pnf).unwrap();
        for g in 0..nblocks {
            let pair = pair_bytes(&data, g / 2);
            let got = shim::pn_dequant_pair_block(bits, &pair, g % 2);
            let block: &[u8; 34] = data[34 * g..34 * g + 34].try_into().unwrap();
            for e in 0..wpb {
                let want = ref_value(bits, block, e);
                assert_eq!(
                    got[e].to_bits(),
                    want.to_bits(),
                    "bits {bits} block {g} elem {e}"
                );
                assert_eq!(
                    got[e].to_bits(),
                    pnf[g * wpb + e].to_bits(),
                    "vs pn-format: bits {bits} block {g} elem {e}"
                );
                assert_eq!(
                    shim::pn_elem_bytes(bits, block, e).to_bits(),
                    want.to_bits()
                );
            }
        }
    }
}

#[test]
fn element_index_shift_bug_would_be_caught() {
    // Element t = 1 lives at bit 16 (high half), not at bit BITS: a decoder that shifts by the
    // element index (the spec engine's CPU bug) reads a different code here.
    for bits in [3u32, 4] {
        let mut block = [0u8; 34];
        block[..2].copy_from_slice(&f16::from_f32(1.0).to_bits().to_le_bytes());
        let w: u32 = 1 << 16; // code 1 for t = 1, zero elsewhere
        block[2..6].copy_from_slice(&w.to_le_bytes());
        let mut pair = [0u8; 68];
        pair[..34].copy_from_slice(&block);
        let got = shim::pn_dequant_pair_block(bits, &pair, 0);
        let z = pn_geom(bits).1 as f32;
        assert_eq!(got[1], 1.0 - z);
        assert_eq!(got[0], -z);
        assert_eq!(got[2], -z);
    }
}

#[test]
fn exponent_trick_gives_codes_minus_zero_point_exactly() {
    let mut r = rng(3);
    for bits in [3u32, 4] {
        let (b, z, _, per) = pn_geom(bits);
        let zero = shim::pn_zero_h2bits(bits);
        assert_eq!(f16::from_bits(zero as u16).to_f32(), 1024.0 + z as f32);
        assert_eq!(
            f16::from_bits((zero >> 16) as u16).to_f32(),
            1024.0 + z as f32
        );
        for _ in 0..2000 {
            let mut w: u32 = r.random();
            if bits == 3 {
                w &= !0x8000_8000;
            }
            for j in 0..per / 2 {
                let h = shim::pn_code_pair_h2bits(bits, w, j);
                let lo = f16::from_bits(h as u16);
                let hi = f16::from_bits((h >> 16) as u16);
                let n0 = (w >> (b as usize * j)) & ((1 << b) - 1);
                let n1 = (w >> (16 + b as usize * j)) & ((1 << b) - 1);
                // The fp16 subtraction of 1024 + z is exact: both operands and the result are
                // integers below 2048.
                let zf = f16::from_bits(zero as u16);
                assert_eq!(
                    f16::from_f32(lo.to_f32() - zf.to_f32()).to_f32(),
                    n0 as f32 - z as f32
                );
                assert_eq!(
                    f16::from_f32(hi.to_f32() - zf.to_f32()).to_f32(),
                    n1 as f32 - z as f32
                );
            }
        }
    }
}

#[test]
fn row_pair_ranges_cover_each_block_once() {
    let mut r = rng(4);
    for _ in 0..500 {
        let g0: u64 = r.random_range(0..10_000);
        let nb: u64 = r.random_range(1..300);
        let (first, end) = shim::pn_row_pairs(g0, nb);
        let mut seen = Vec::new();
        for q in first..end {
            for blk in 0..2 {
                if shim::pn_block_in_row(q, blk, g0, nb) {
                    seen.push(2 * q + blk as u64);
                }
            }
        }
        let want: Vec<u64> = (g0..g0 + nb).collect();
        assert_eq!(seen, want, "g0 {g0} nb {nb}");
    }
}

#[test]
fn block_dot_f32_matches_rust_order_and_f64_reference() {
    let mut r = rng(5);
    for bits in [3u32, 4] {
        let (_, z, wpb, _) = pn_geom(bits);
        for _ in 0..200 {
            let block = random_pn_block(&mut r, bits);
            let x = random_vec(&mut r, wpb, 4.0);
            let mut pair = [0u8; 68];
            let blk = r.random_range(0..2usize);
            pair[34 * blk..34 * blk + 34].copy_from_slice(&block);
            let got = shim::pn_block_dot_f32(bits, &pair, blk, &x);
            // Same order in Rust: FMA chain over elements, then times d.
            let d = f16::from_bits(u16::from_le_bytes([block[0], block[1]])).to_f32();
            let mut s = 0f32;
            for (e, xe) in x.iter().enumerate() {
                s = ((ref_code(bits, &block, e) as i32 - z) as f32).mul_add(*xe, s);
            }
            assert_eq!(got.to_bits(), (d * s).to_bits());
            let exact: f64 = x
                .iter()
                .enumerate()
                .map(|(e, &xe)| ref_value(bits, &block, e) as f64 * xe as f64)
                .sum();
            let bound = 1e-5
                * x.iter()
                    .enumerate()
                    .map(|(e, &xe)| (ref_value(bits, &block, e) as f64 * xe as f64).abs())
                    .sum::<f64>();
            assert!(
                (got as f64 - exact).abs() <= bound + 1e-30,
                "got {got}, exact {exact}"
            );
        }
    }
}

#[test]
fn f16_conversion_is_exact_for_every_bit_pattern() {
    for h in 0..=u16::MAX {
        let want = f16::from_bits(h).to_f32();
        let got = shim::f16_to_f32(h);
        if want.is_nan() {
            assert!(got.is_nan(), "{h:#06x}");
        } else {
            assert_eq!(got.to_bits(), want.to_bits(), "{h:#06x}");
        }
    }
}

/// Random bytes for `nblocks` blocks of a stock type whose f16 fields (at `f16_offsets`) are
/// finite.
fn random_stock_blocks(
    r: &mut rand::rngs::StdRng,
    block_bytes: usize,
    f16_offsets: &[usize],
    nblocks: usize,
) -> Vec<u8> {
    let mut v = vec![0u8; block_bytes * nblocks];
    r.fill(&mut v[..]);
    for b in 0..nblocks {
        for &o in f16_offsets {
            let d = f16::from_f32(r.random_range(-2.0f32..2.0));
            v[b * block_bytes + o..b * block_bytes + o + 2]
                .copy_from_slice(&d.to_bits().to_le_bytes());
        }
    }
    v
}

#[test]
fn stock_block_decodes_match_gguf_io_bit_for_bit() {
    use gguf_io::{quants, GgmlType};
    let mut r = rng(6);
    /// (type, elements per block, bytes per block, f16 field offsets, the shim's element decode)
    type Case = (
        GgmlType,
        usize,
        usize,
        &'static [usize],
        fn(&[u8], usize) -> f32,
    );
    let cases: [Case; 3] = [
        (GgmlType::Q8_0, 32, 34, &[0], shim::q8_0_elem),
        (GgmlType::Q4K, 256, 144, &[0, 2], shim::q4_k_elem),
        (GgmlType::Q3K, 256, 110, &[108], shim::q3_k_elem),
    ];
    for (ty, blck, bytes, f16s, elem) in cases {
        let nblocks = 24;
        let data = random_stock_blocks(&mut r, bytes, f16s, nblocks);
        let mut want = vec![0f32; nblocks * blck];
        quants::dequantize_row(ty, &data, &mut want).unwrap();
        for b in 0..nblocks {
            for e in 0..blck {
                let got = elem(&data[b * bytes..(b + 1) * bytes], e);
                assert_eq!(
                    got.to_bits(),
                    want[b * blck + e].to_bits(),
                    "{ty:?} block {b} elem {e}: {got} vs {}",
                    want[b * blck + e]
                );
            }
        }
    }
}

#[test]
fn q4_k_scale_words_agree_with_scale_bytes() {
    let mut r = rng(7);
    for _ in 0..2000 {
        let mut s = [0u8; 12];
        r.fill(&mut s[..]);
        for j in 0..8 {
            let (bytes, words) = shim::q4_k_scale_min_both(&s, j);
            assert_eq!(bytes, words, "scales {s:?} sub-block {j}");
        }
    }
}

/// The CPU KV cache's q4_0 block as its 18 stored bytes (f16 d little-endian, then the nibbles).
fn cpu_q4_0_kv_bytes(x: &[f32; 32]) -> [u8; 18] {
    let b = gguf_io::kv_blocks::BlockQ4_0::quantize(x);
    let mut out = [0u8; 18];
    out[..2].copy_from_slice(&b.d.to_bits().to_le_bytes());
    out[2..].copy_from_slice(&b.qs);
    out
}

fn cpu_q4_0_kv_values(bytes: &[u8; 18]) -> [f32; 32] {
    let b = gguf_io::kv_blocks::BlockQ4_0 {
        d: f16::from_bits(u16::from_le_bytes([bytes[0], bytes[1]])),
        qs: bytes[2..].try_into().unwrap(),
    };
    let mut out = [0f32; 32];
    b.dequantize(&mut out);
    out
}

fn assert_q4_0_kv_block_matches_cpu(x: &[f32; 32], what: &str) {
    let got = shim::q4_0_kv_quantize(x);
    let want = cpu_q4_0_kv_bytes(x);
    assert_eq!(got, want, "q4_0 KV block of {what}: {x:?}");
    let (g, w) = (shim::q4_0_kv_dequantize(&got), cpu_q4_0_kv_values(&want));
    for e in 0..32 {
        assert!(
            g[e].to_bits() == w[e].to_bits() || (g[e].is_nan() && w[e].is_nan()),
            "q4_0 KV decode of {what}, elem {e}: {} vs {}",
            g[e],
            w[e]
        );
    }
}

#[test]
fn f32_to_f16_conversion_matches_half_round_to_nearest_even() {
    let check = |f: f32| {
        let (got, want) = (shim::f32_to_f16_bits(f), f16::from_f32(f));
        if want.is_nan() {
            assert!(f16::from_bits(got).is_nan(), "{:#010x}", f.to_bits());
            assert_eq!(got & 0x8000, want.to_bits() & 0x8000);
        } else {
            assert_eq!(got, want.to_bits(), "{f:e} ({:#010x})", f.to_bits());
        }
    };
    // Every f16 value, the f32 halfway points to its neighbour (ties to even) and one f32 ulp
    // either side of them: each rounding decision of every binade, subnormals and overflow.
    for h in 0..=u16::MAX {
        let a = f16::from_bits(h);
        if !a.is_finite() {
            check(a.to_f32());
            continue;
        }
        let x = a.to_f32();
        check(x);
        let up = f16::from_bits(h.wrapping_add(1)).to_f32();
        let mid = if up.is_finite() && up.abs() > x.abs() {
            (x + up) / 2.0 // exact: both have 11 significant bits
        } else {
            // 65504: the halfway point to the first value past the largest f16.
            x.signum() * 65520.0
        };
        for m in [
            mid,
            f32::from_bits(mid.to_bits() + 1),
            f32::from_bits(mid.to_bits() - 1),
        ] {
            check(m);
        }
    }
    // And a sweep over all f32 bit patterns.
    for u in (0..=u32::MAX).step_by(997) {
        check(f32::from_bits(u));
    }
}

#[test]
fn q4_0_kv_block_matches_cpu_kv_quantizer_on_random_rows() {
    let mut r = rng(8);
    for i in 0..20_000 {
        let scale = [1e-3f32, 0.5, 2.0, 100.0, 3e4][i % 5];
        let mut x = [0f32; 32];
        for v in &mut x {
            *v = r.random_range(-scale..scale);
        }
        if i % 3 == 0 {
            // An outlier, as real keys have.
            x[r.random_range(0..32)] *= 9.0;
        }
        assert_q4_0_kv_block_matches_cpu(&x, &format!("random row {i}"));
    }
}

#[test]
fn q4_0_kv_block_matches_cpu_kv_quantizer_on_adversarial_rows() {
    let mut cases: Vec<(String, [f32; 32])> = vec![
        ("all zeros".into(), [0.0; 32]),
        ("all negative zeros".into(), [-0.0; 32]),
        ("one huge value".into(), {
            let mut x = [0.25f32; 32];
            x[7] = 1e30; // d overflows f16 to -inf
            x
        }),
        ("largest f32".into(), {
            let mut x = [1.0f32; 32];
            x[3] = f32::MAX;
            x[4] = -f32::MAX;
            x
        }),
        ("just above the f16 range".into(), {
            let mut x = [-1.0f32; 32];
            x[0] = 65520.0 * 8.0;
            x
        }),
        ("negative max".into(), {
            let mut x = [0.5f32; 32];
            x[20] = -3.0;
            x
        }),
        (
            "equal magnitudes, negative first".into(),
            core::array::from_fn(|i| if i % 2 == 0 { -2.0 } else { 2.0 }),
        ),
        (
            "equal magnitudes, positive first".into(),
            core::array::from_fn(|i| if i % 2 == 0 { 2.0 } else { -2.0 }),
        ),
        ("subnormal values".into(), {
            let mut x = [1e-41f32; 32];
            x[9] = -3e-39;
            x
        }),
        ("tiny scale, reciprocal overflows".into(), {
            // m = 9 subnormal ulps: d = -1 ulp, id = -inf, codes of inf and of NaN (0 * inf).
            let mut x = [0.0f32; 32];
            x[0] = f32::from_bits(1);
            x[1] = f32::from_bits(9);
            x[2] = -f32::from_bits(5);
            x
        }),
        ("infinity".into(), {
            let mut x = [1.0f32; 32];
            x[5] = f32::INFINITY;
            x
        }),
        ("nan".into(), {
            let mut x: [f32; 32] = core::array::from_fn(|i| i as f32 - 16.0);
            x[0] = f32::NAN;
            x[31] = -f32::NAN;
            x
        }),
    ];
    // Rounding ties: with m = -8 (d = 1, id = 1) and m = 8 (d = -1, id = -1), values k + 0.5
    // are exact halfway cases (away from zero), and +-7.5.. +-8.5 hit the clamp.
    for m in [-8.0f32, 8.0] {
        let mut x = [0f32; 32];
        x[0] = m;
        for (i, v) in x.iter_mut().enumerate().skip(1) {
            *v = -7.5 + 0.5 * (i - 1) as f32; // -7.5 ..= 7.5
        }
        cases.push((format!("halfway values, m = {m}"), x));
        let mut y = x;
        y[1] = -m * 0.99; // the opposite sign near the top: +8 steps clamps to +7
        y[2] = 7.75;
        cases.push((format!("clamped values, m = {m}"), y));
    }
    // Halfway cases at a scale whose reciprocal is inexact (d = 3/8, id = 1/d rounded).
    let mut x = [0f32; 32];
    x[31] = -3.0;
    for (i, v) in x.iter_mut().enumerate().take(31) {
        *v = (i as f32 - 15.5) * 0.375;
    }
    cases.push(("halfway values at d = 0.375".into(), x));
    for (what, x) in &cases {
        assert_q4_0_kv_block_matches_cpu(x, what);
    }
}

#[test]
fn q4_0_kv_decode_matches_cpu_and_gguf_io_for_any_bytes() {
    use gguf_io::{quants, GgmlType};
    let mut r = rng(9);
    let mut blocks = vec![[0u8; 18]; 4096];
    for (i, b) in blocks.iter_mut().enumerate() {
        r.fill(&mut b[..]);
        if i < 2048 {
            // Finite scales for the gguf-io comparison; the rest keep any bits (inf, NaN).
            let d = f16::from_f32(r.random_range(-4.0f32..4.0));
            b[..2].copy_from_slice(&d.to_bits().to_le_bytes());
        }
    }
    let flat: Vec<u8> = blocks[..2048].iter().flatten().copied().collect();
    let mut ggml = vec![0f32; 2048 * 32];
    quants::dequantize_row(GgmlType::Q4_0, &flat, &mut ggml).unwrap();
    for (i, b) in blocks.iter().enumerate() {
        let got = shim::q4_0_kv_dequantize(b);
        let want = cpu_q4_0_kv_values(b);
        for e in 0..32 {
            assert!(
                got[e].to_bits() == want[e].to_bits() || (got[e].is_nan() && want[e].is_nan()),
                "block {i} elem {e}: {} vs {}",
                got[e],
                want[e]
            );
            if i < 2048 {
                assert_eq!(got[e].to_bits(), ggml[32 * i + e].to_bits(), "vs gguf-io");
            }
        }
    }
}
