//! The AVX-512 form of [`crate::block::all_valid`]: 64 bytes per step instead of 8, so the
//! load-time check of a 12 GB file runs at the speed of reading it.
//!
//! Blocks are 34 bytes, so the block boundaries repeat every 32 blocks = 1088 bytes = 17
//! vectors of 32 little-endian 16-bit lanes: lane `u` of a period is a block's scale when
//! `u % 17 == 0` and one of its 16 code lanes otherwise (pn3t's reserved bit is bit 15 of each
//! code lane). Per vector, a masked compare tests the scale lanes' exponent for all ones and a
//! masked test the code lanes' reserved bit; the ragged tail goes to the scalar loop.

use crate::types::BLOCK_BYTES;
use std::arch::x86_64::*;

/// Bytes of one period of block boundaries.
const PERIOD: usize = 32 * BLOCK_BYTES;

/// Per vector of a period: the lanes that hold a block's scale.
fn scale_lanes() -> [u32; 17] {
    std::array::from_fn(|z| {
        (0..32).fold(0u32, |k, l| {
            if (32 * z + l) % 17 == 0 {
                k | 1 << l
            } else {
                k
            }
        })
    })
}

/// Whether the whole periods of `src` pass (scales finite, and with `codes` no reserved bit
/// set); returns the bytes checked, a multiple of 1088 (the caller checks the rest).
///
/// # Safety
/// The CPU has AVX-512F and AVX-512BW.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn all_valid_periods(src: &[u8], codes: bool) -> (bool, usize) {
    let scales = scale_lanes();
    let exp = _mm512_set1_epi16(0x7c00);
    let reserved = _mm512_set1_epi16(0x8000u16 as i16);
    let periods = src.len() / PERIOD;
    let mut bad: u32 = 0;
    for c in 0..periods {
        let p = src.as_ptr().add(c * PERIOD);
        for (z, &sk) in scales.iter().enumerate() {
            let v = _mm512_loadu_si512(p.add(64 * z) as *const _);
            bad |= _mm512_mask_cmpeq_epi16_mask(sk, _mm512_and_si512(v, exp), exp);
            if codes {
                bad |= _mm512_mask_test_epi16_mask(!sk, v, reserved);
            }
        }
    }
    (bad == 0, periods * PERIOD)
}
