//! Portable versions of the prepared-activation kernels, in the same arithmetic as the SIMD
//! ones (the SIMD == scalar tests compare against these and against the f64 reference).

use super::layout::i16_index;
use crate::block::blocks;
use crate::types::PnType;

/// f32 activations in kernel order (`xs`), `zsum[b] = z * sum(x_b)`.
pub fn dot_f32(ty: PnType, row: &[u8], xs: &[f32], zsum: &[f32]) -> f32 {
    let bpw = ty.weights_per_block();
    let s = ty.pairs_per_word();
    let mask = u32::from(ty.max_code());
    let mut total = 0.0f32;
    let mut corr = 0.0f32;
    // `blocks` cannot fail: the callers checked the length.
    for (b, blk) in blocks(ty, row).into_iter().flatten().enumerate() {
        let x = &xs[b * bpw..(b + 1) * bpw];
        let mut acc = 0.0f32;
        for i in 0..8 {
            let lo = blk.word(i);
            let hi = lo >> 16;
            for j in 0..s {
                let m = mask << (ty.bits() * j as u32);
                acc += (lo & m) as f32 * x[16 * j + i];
                acc += (hi & m) as f32 * x[16 * j + 8 + i];
            }
        }
        let d = blk.scale();
        total += d * acc;
        corr += d * zsum[b];
    }
    total - corr
}

/// int16 activations in kernel order (`xq`), per-block scales `sx`, `zq[b] = z * sum(q_b)`.
pub fn dot_i16(ty: PnType, row: &[u8], xq: &[i16], sx: &[f32], zq: &[f32]) -> f32 {
    let cpw = ty.codes_per_word();
    let mask = u32::from(ty.max_code());
    let mut total = 0.0f32;
    for (b, blk) in blocks(ty, row).into_iter().flatten().enumerate() {
        let mut acc = 0i32;
        for e in 0..ty.weights_per_block() {
            let t = e % cpw;
            let n = (blk.word(e / cpw) >> ty.code_shift(t)) & mask;
            acc += n as i32 * i32::from(xq[i16_index(ty, b, e)]);
        }
        // `zq` holds an exact integer; the difference is exact in i32.
        let acc = acc - zq[b] as i32;
        total += blk.scale() * sx[b] * acc as f32;
    }
    total
}
