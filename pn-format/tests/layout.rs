//! Bit layout, decoding and validation.

mod common;

use common::{spec_codes, Rng};
use pn_format::{
    blocks, dequantize_row, pack_block, validate_row, BlockRef, PnError, PnType, BLOCK_BYTES,
};

#[test]
fn constants() {
    let p3 = PnType::Pn3t;
    let p4 = PnType::Pn4t;
    assert_eq!(
        (p3.weights_per_block(), p3.block_bytes(), p3.bits()),
        (80, 34, 3)
    );
    assert_eq!(
        (p4.weights_per_block(), p4.block_bytes(), p4.bits()),
        (64, 34, 4)
    );
    assert_eq!((p3.zero_point(), p4.zero_point()), (4, 8));
    assert_eq!((p3.ggml_id(), p4.ggml_id()), (124, 125));
    assert_eq!(PnType::from_ggml_id(124), Some(p3));
    assert_eq!(PnType::from_ggml_id(125), Some(p4));
    assert_eq!(PnType::from_ggml_id(123), None);
    assert_eq!(p3.row_bytes(5120), Some(64 * 34));
    assert_eq!(p4.row_bytes(6144), Some(96 * 34));
    assert_eq!(p3.row_bytes(6144), None);
}

/// Every code `t` of every word sits at bit `BITS*(t>>1) + 16*(t&1)`: set one element to a
/// distinctive code, all others to 0, and look at the raw word.
#[test]
fn every_code_sits_at_its_spec_bit() {
    for ty in PnType::ALL {
        let n = ty.weights_per_block();
        let cpw = ty.codes_per_word();
        for e in 0..n {
            let mut codes = vec![0u8; n];
            codes[e] = ty.max_code() - 1; // 0b110 / 0b1110: not symmetric under bit reversal
            let blk = pack_block(ty, half::f16::from_f32(1.0), &codes);
            let (i, t) = (e / cpw, e % cpw);
            let shift = ty.bits() * (t as u32 >> 1) + 16 * (t as u32 & 1);
            for wi in 0..8 {
                let w = u32::from_le_bytes(blk[2 + 4 * wi..6 + 4 * wi].try_into().unwrap());
                let want = if wi == i {
                    u32::from(ty.max_code() - 1) << shift
                } else {
                    0
                };
                assert_eq!(w, want, "{ty} element {e} word {wi}");
            }
            let view = BlockRef::new(ty, &blk).unwrap();
            assert_eq!(view.code(e), ty.max_code() - 1);
            assert_eq!(spec_codes(ty, &blk), codes);
        }
    }
}

/// Decoding agrees with the spec's formula, and views work at every byte misalignment.
#[test]
fn decode_matches_formula_at_any_alignment() {
    let mut rng = Rng(11);
    for ty in PnType::ALL {
        let nb = 7;
        let mut bytes: Vec<u8> = (0..nb * BLOCK_BYTES + 3)
            .map(|_| rng.next_u64() as u8)
            .collect();
        for b in 0..nb {
            // finite scales, reserved bits clear
            bytes[b * 34 + 1] &= 0x3b;
            for i in 0..8 {
                let o = b * 34 + 2 + 4 * i;
                let mut w = u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap());
                w &= !ty.reserved_mask();
                bytes[o..o + 4].copy_from_slice(&w.to_le_bytes());
            }
        }
        for off in 0..4 {
            let mut buf = vec![0u8; off];
            buf.extend_from_slice(&bytes[..nb * BLOCK_BYTES]);
            let row = &buf[off..];
            validate_row(ty, row).unwrap();
            let mut out = vec![0.0; nb * ty.weights_per_block()];
            dequantize_row(ty, row, &mut out).unwrap();
            for (b, blk) in blocks(ty, row).unwrap().enumerate() {
                let d = half::f16::from_le_bytes([row[b * 34], row[b * 34 + 1]]).to_f32();
                let codes = spec_codes(ty, &row[b * 34..b * 34 + 34]);
                for (e, &c) in codes.iter().enumerate() {
                    let want = d * (c as i32 - ty.zero_point()) as f32;
                    let got = out[b * ty.weights_per_block() + e];
                    assert_eq!(got.to_bits(), want.to_bits());
                    assert_eq!(blk.value(e).to_bits(), want.to_bits());
                }
                assert_eq!(blk.scale(), d);
            }
        }
    }
}

#[test]
fn negative_scale_decodes_code_z_to_negative_zero() {
    for ty in PnType::ALL {
        let n = ty.weights_per_block();
        let mut codes = vec![ty.zero_point() as u8; n];
        codes[1] = 0;
        let blk = pack_block(ty, half::f16::from_f32(-0.5), &codes);
        let mut out = vec![1.0; n];
        dequantize_row(ty, &blk, &mut out).unwrap();
        assert_eq!(out[0].to_bits(), (-0.0f32).to_bits(), "{ty}: -0.0");
        assert_eq!(out[1], 0.5 * ty.zero_point() as f32);
        let blk = pack_block(ty, half::f16::from_f32(0.5), &codes);
        dequantize_row(ty, &blk, &mut out).unwrap();
        assert_eq!(out[0].to_bits(), 0.0f32.to_bits(), "{ty}: +0.0");
    }
}

#[test]
fn validation_names_block_and_reason() {
    let ty = PnType::Pn3t;
    let good = pack_block(ty, half::f16::from_f32(0.25), &[4u8; 80]);
    let mut row: Vec<u8> = good.iter().chain(&good).chain(&good).cloned().collect();
    validate_row(ty, &row).unwrap();
    for (bits, what) in [
        (0x7c00u16, "inf"),
        (0xfc00, "-inf"),
        (0x7e00, "nan"),
        (0xfc01, "nan"),
    ] {
        let mut r = row.clone();
        r[68..70].copy_from_slice(&bits.to_le_bytes());
        assert_eq!(
            validate_row(ty, &r),
            Err(PnError::NonFiniteScale { block: 2, bits }),
            "{what}"
        );
        // pn4t has the same rule for scales
        assert!(matches!(
            validate_row(PnType::Pn4t, &r),
            Err(PnError::NonFiniteScale { block: 2, .. })
        ));
    }
    for bit in [15u32, 31] {
        let mut r = row.clone();
        let o = 34 + 2 + 4 * 5;
        let w = u32::from_le_bytes(r[o..o + 4].try_into().unwrap()) | (1 << bit);
        r[o..o + 4].copy_from_slice(&w.to_le_bytes());
        let e = validate_row(ty, &r).unwrap_err();
        assert_eq!(
            e,
            PnError::ReservedBits {
                block: 1,
                word: 5,
                value: w
            }
        );
        assert!(e.to_string().contains("block 1"), "{e}");
        validate_row(PnType::Pn4t, &r).unwrap(); // pn4t has no reserved bits
    }
    row.push(0);
    assert_eq!(
        validate_row(ty, &row),
        Err(PnError::RaggedBytes { ty, len: 103 })
    );
    let mut out = vec![0.0; 239];
    assert!(matches!(
        dequantize_row(ty, &row[..102], &mut out),
        Err(PnError::LengthMismatch {
            expected: 240,
            got: 239,
            ..
        })
    ));
    assert!(BlockRef::new(ty, &row[..33]).is_err());
}

/// Every instruction set decodes bit-identically to the scalar path, at any byte offset and for
/// odd block counts, including negative, zero and subnormal scales.
#[test]
fn simd_decode_is_bit_identical() {
    let mut rng = Rng(12);
    for ty in PnType::ALL {
        for nb in [1usize, 2, 5, 16] {
            let mut bytes: Vec<u8> = (0..nb * 34 + 3).map(|_| rng.next_u64() as u8).collect();
            for b in 0..nb {
                bytes[b * 34 + 1] &= 0xbb; // finite scales of both signs
            }
            for off in 0..4 {
                let row = &bytes[off..off + nb * 34];
                let mut want = vec![0.0f32; nb * ty.weights_per_block()];
                pn_format::dequantize_row_with(pn_format::Isa::Scalar, ty, row, &mut want).unwrap();
                for isa in pn_format::Isa::available() {
                    let mut got = vec![1.0f32; want.len()];
                    pn_format::dequantize_row_with(isa, ty, row, &mut got).unwrap();
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{ty} {isa:?} nb {nb} off {off}");
                }
            }
        }
    }
}
