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
