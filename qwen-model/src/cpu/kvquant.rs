//! The CPU attention's in-place reads of q8_0/q4_0 KV blocks (the block math itself lives in
//! `gguf_io::kv_blocks`, with the other ggml block code).

use super::kernels::{axpy, dot, KvElem};
pub use gguf_io::kv_blocks::{
    dequantize_into, quantize_into, BlockQ4_0, BlockQ8_0, QuantBlock, QK,
};

macro_rules! kv_elem_for_block {
    ($t:ty) => {
        impl KvElem for $t {
            const PER: usize = QK;
            #[inline]
            fn dot_q(q: &[f32], k: &[$t]) -> f32 {
                let mut buf = [0.0f32; QK];
                let mut acc = 0.0f32;
                for (qc, b) in q.chunks_exact(QK).zip(k) {
                    b.dequantize(&mut buf);
                    acc += dot(qc, &buf);
                }
                acc
            }
            #[inline]
            fn widen(src: &[$t], dst: &mut [f32]) {
                for (b, d) in src.iter().zip(dst.chunks_exact_mut(QK)) {
                    b.dequantize(d.try_into().expect("QK floats"));
                }
            }
            #[inline]
            fn axpy_v(o: &mut [f32], p: f32, v: &[$t]) {
                let mut buf = [0.0f32; QK];
                for (oc, b) in o.chunks_exact_mut(QK).zip(v) {
                    b.dequantize(&mut buf);
                    axpy(oc, p, &buf);
                }
            }
        }
    };
}

kv_elem_for_block!(BlockQ8_0);
kv_elem_for_block!(BlockQ4_0);

#[cfg(test)]
mod tests {
    use super::*;

    /// 32 values in [-1, 1) from the shared test kit, with a few 8x outliers like real keys.
    fn sample(seed: u32) -> Vec<f32> {
        let mut v = pn_tests::seeded_vec(u64::from(seed), QK, 1.0);
        for x in v.iter_mut().skip(3).step_by(11) {
            *x *= 8.0;
        }
        v
    }

    #[test]
    fn block_dot_and_axpy_match_dequantized_reference() {
        let k: Vec<f32> = (0..4).flat_map(sample).collect();
        let q: Vec<f32> = (10..14).flat_map(sample).collect();
        let mut blocks = vec![<BlockQ8_0 as bytemuck::Zeroable>::zeroed(); 4];
        quantize_into(&k, &mut blocks);
        let mut deq = vec![0.0; 4 * QK];
        dequantize_into(&blocks, &mut deq);
        let want: f32 = q.iter().zip(&deq).map(|(a, b)| a * b).sum();
        let got = BlockQ8_0::dot_q(&q, &blocks);
        assert!((want - got).abs() <= 1e-4 * want.abs().max(1.0));
        let mut o = q.clone();
        BlockQ8_0::axpy_v(&mut o, 0.3, &blocks);
        for ((a, b), c) in o.iter().zip(&q).zip(&deq) {
            assert!((a - (b + 0.3 * c)).abs() <= 1e-5);
        }
    }
}
