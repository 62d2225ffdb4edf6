//! Property tests: SIMD == scalar on random rows (odd block counts, unaligned buffers), and no
//! panic from validation, decoding or dot products on arbitrary bytes.

mod common;

use common::magnitude;
use pn_format::dot::dot_prepared_with;
use pn_format::{dequantize_row, dot_ref_f64, validate_row, Isa, PnType, PreparedF32, PreparedI16};
use proptest::prelude::*;

fn ty_strategy() -> impl Strategy<Value = PnType> {
    prop_oneof![Just(PnType::Pn3t), Just(PnType::Pn4t)]
}

/// Random blocks with finite scales (any sign, subnormals, zero) and random words (reserved bits
/// included: every path must ignore them the same way).
fn row_bytes(nb: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut out = Vec::with_capacity(nb * 34);
    for _ in 0..nb {
        let mut d = next() as u16;
        if d & 0x7c00 == 0x7c00 {
            d &= 0xbfff; // keep it finite
        }
        out.extend_from_slice(&d.to_le_bytes());
        for _ in 0..8 {
            out.extend_from_slice(&(next() as u32).to_le_bytes());
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn simd_matches_scalar(
        ty in ty_strategy(),
        nb in 1usize..70,
        offset in 0usize..4,
        seed in any::<u64>(),
        xs in prop::collection::vec(-100.0f32..100.0, 80 * 70),
        zero_block in any::<bool>(),
    ) {
        let bpw = ty.weights_per_block();
        let mut buf = vec![0u8; offset];
        buf.extend(row_bytes(nb, seed));
        let row = &buf[offset..];
        let mut x = xs[..nb * bpw].to_vec();
        if zero_block {
            x[..bpw].iter_mut().for_each(|v| *v = 0.0);
        }
        let reference = dot_ref_f64(ty, row, &x).unwrap();
        let mag = magnitude(ty, row, &x);
        let pf = PreparedF32::new(ty, &x).unwrap();
        let pq = PreparedI16::new(ty, &x).unwrap();
        let sf = dot_prepared_with(Isa::Scalar, ty, row, &pf).unwrap() as f64;
        let sq = dot_prepared_with(Isa::Scalar, ty, row, &pq).unwrap() as f64;
        prop_assert!((sf - reference).abs() <= 1e-5 * mag + 1e-30);
        // int16: at most half a step (amax/65534) per activation, times |w| <= mag.
        prop_assert!((sq - reference).abs() <= 4e-5 * mag + 1e-30);
        for isa in Isa::available() {
            let f = dot_prepared_with(isa, ty, row, &pf).unwrap() as f64;
            let q = dot_prepared_with(isa, ty, row, &pq).unwrap() as f64;
            prop_assert!((f - sf).abs() <= 2e-5 * mag + 1e-30, "{:?} f32 {} vs {}", isa, f, sf);
            prop_assert!((q - sq).abs() <= 2e-5 * mag + 1e-30, "{:?} i16 {} vs {}", isa, q, sq);
        }
    }

    /// Blocks at the edges of the integer sums (every code at its maximum or minimum, activations
    /// at +-32767 after quantization, largest and subnormal scales of both signs, reserved bits
    /// set) across block counts on both sides of the kernels' 8- and 16-block groups.
    #[test]
    fn adversarial_blocks_match_scalar(
        ty in ty_strategy(),
        nb in prop::sample::select(vec![1usize, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 48, 63]),
        word in prop::sample::select(vec![0u32, u32::MAX, 0x7fff_7fff, 0x5555_5555, 0xaaaa_aaaa]),
        scale in prop::sample::select(vec![0x7bffu16, 0xfbff, 0x0001, 0x8001, 0x3c00, 0]),
        alternate in any::<bool>(),
        offset in 0usize..4,
    ) {
        let bpw = ty.weights_per_block();
        let mut buf = vec![0u8; offset];
        for _ in 0..nb {
            buf.extend_from_slice(&scale.to_le_bytes());
            for _ in 0..8 {
                buf.extend_from_slice(&word.to_le_bytes());
            }
        }
        let row = &buf[offset..];
        let x: Vec<f32> = (0..nb * bpw)
            .map(|i| if alternate && i % 2 == 1 { -3.5 } else { 3.5 })
            .collect();
        let mag = magnitude(ty, row, &x);
        let pq = PreparedI16::new(ty, &x).unwrap();
        let sq = dot_prepared_with(Isa::Scalar, ty, row, &pq).unwrap() as f64;
        for isa in Isa::available() {
            let q = dot_prepared_with(isa, ty, row, &pq).unwrap() as f64;
            prop_assert!((q - sq).abs() <= 1e-6 * mag + 1e-30, "{:?} i16 {} vs {}", isa, q, sq);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(
        ty in ty_strategy(),
        bytes in prop::collection::vec(any::<u8>(), 0..400),
        xlen in 0usize..400,
    ) {
        let _ = validate_row(ty, &bytes);
        let mut out = vec![0.0; xlen];
        let _ = dequantize_row(ty, &bytes, &mut out);
        let x = vec![1.0f32; xlen];
        let _ = dot_ref_f64(ty, &bytes, &x);
        if let Ok(p) = PreparedF32::new(ty, &x) {
            for isa in Isa::ALL {
                let _ = dot_prepared_with(isa, ty, &bytes, &p);
            }
        }
        if let Ok(p) = PreparedI16::new(ty, &x) {
            let _ = dot_prepared_with(Isa::detect(), ty, &bytes, &p);
        }
        // A whole number of blocks validates exactly when every block does.
        if bytes.len() % 34 == 0 {
            let all_ok = bytes.chunks(34).enumerate().all(|(b, c)| {
                pn_format::BlockRef::new(ty, c).unwrap().validate(b).is_ok()
            });
            prop_assert_eq!(validate_row(ty, &bytes).is_ok(), all_ok);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// The fast whole-row check (`block::all_valid`, which `validate_row` tries first) agrees
    /// with the block-by-block one on rows of valid blocks with at most one corruption (a scale
    /// with an all-ones exponent, or one reserved bit), and `validate_row` still names the first
    /// bad block and the reason.
    #[test]
    fn fast_validation_agrees_with_block_walk(
        ty in ty_strategy(),
        // Past 32 blocks (1088 bytes) the AVX-512 check takes whole periods, the rest the
        // scalar loop: both parts, and a corruption in either.
        n_blocks in 1usize..100,
        codes_seed in any::<u64>(),
        corrupt in prop::option::of((any::<prop::sample::Index>(), 0u8..4, 0usize..8)),
    ) {
        let mut s = codes_seed | 1;
        let mut bytes = Vec::new();
        for b in 0..n_blocks {
            let codes: Vec<u8> = (0..ty.weights_per_block())
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    (s % 16) as u8
                })
                .collect();
            let d = half::f16::from_f32(0.01 * (b as f32 + 1.0));
            bytes.extend(pn_format::pack_block(ty, d, &codes));
        }
        prop_assert!(pn_format::block::all_valid(ty, &bytes));
        prop_assert!(validate_row(ty, &bytes).is_ok());
        if let Some((at, kind, word)) = corrupt {
            let b = at.index(n_blocks);
            let o = 34 * b;
            match kind {
                // +inf, NaN, -inf scales.
                0 => bytes[o..o + 2].copy_from_slice(&0x7c00u16.to_le_bytes()),
                1 => bytes[o..o + 2].copy_from_slice(&0x7e01u16.to_le_bytes()),
                2 => bytes[o..o + 2].copy_from_slice(&0xfc00u16.to_le_bytes()),
                // Bit 15 or 31 of code word `word`: reserved in pn3t, a code bit in pn4t.
                _ => bytes[o + 2 + 4 * word + 1 + 2 * (word % 2)] |= 0x80,
            }
            let walk = bytes.chunks(34).enumerate().try_for_each(|(i, c)| {
                pn_format::BlockRef::new(ty, c).unwrap().validate(i)
            });
            prop_assert_eq!(pn_format::block::all_valid(ty, &bytes), walk.is_ok());
            prop_assert_eq!(pn_format::block::all_valid_scalar(ty, &bytes), walk.is_ok());
            prop_assert_eq!(
                validate_row(ty, &bytes).map_err(|e| e.to_string()),
                walk.map_err(|e| e.to_string())
            );
        }
    }
}
