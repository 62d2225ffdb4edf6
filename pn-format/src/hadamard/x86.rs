//! AVX2 and AVX-512 butterflies. Stages with span `h` below the vector width are done inside a
//! register (permute + FMA with a +-1 sign vector); wider stages pair whole vectors.
//!
//! Safety contract: the CPU supports the enabled features; `r` is a power of two >= 2 dividing
//! `x.len()`.

use super::{fwht_scalar, hadamard_scale};
use std::arch::x86_64::*;

#[target_feature(enable = "avx512f,avx2,fma")]
pub unsafe fn fwht_avx512(x: &mut [f32], r: usize) {
    const W: usize = 16;
    let s1 = _mm512_setr_ps(
        1., -1., 1., -1., 1., -1., 1., -1., 1., -1., 1., -1., 1., -1., 1., -1.,
    );
    let s2 = _mm512_setr_ps(
        1., 1., -1., -1., 1., 1., -1., -1., 1., 1., -1., -1., 1., 1., -1., -1.,
    );
    let s4 = _mm512_setr_ps(
        1., 1., 1., 1., -1., -1., -1., -1., 1., 1., 1., 1., -1., -1., -1., -1.,
    );
    let s8 = _mm512_setr_ps(
        1., 1., 1., 1., 1., 1., 1., 1., -1., -1., -1., -1., -1., -1., -1., -1.,
    );
    let in_reg = |mut v: __m512| -> __m512 {
        // lane l gets (partner) + v*(+-1): a+b in the lower lane of a pair, a-b in the upper.
        v = _mm512_fmadd_ps(v, s1, _mm512_permute_ps::<0b10_11_00_01>(v));
        if r > 2 {
            v = _mm512_fmadd_ps(v, s2, _mm512_permute_ps::<0b01_00_11_10>(v));
        }
        if r > 4 {
            v = _mm512_fmadd_ps(v, s4, _mm512_shuffle_f32x4::<0b10_11_00_01>(v, v));
        }
        if r > 8 {
            v = _mm512_fmadd_ps(v, s8, _mm512_shuffle_f32x4::<0b01_00_11_10>(v, v));
        }
        v
    };
    let scale = _mm512_set1_ps(hadamard_scale(r));
    if r < W {
        // Several blocks per register; a ragged tail of whole blocks goes scalar.
        let (body, tail) = x.split_at_mut(x.len() / W * W);
        for c in body.chunks_exact_mut(W) {
            let p = c.as_mut_ptr();
            _mm512_storeu_ps(p, _mm512_mul_ps(in_reg(_mm512_loadu_ps(p)), scale));
        }
        fwht_scalar(tail, r);
        return;
    }
    for blk in x.chunks_exact_mut(r) {
        let p = blk.as_mut_ptr();
        for i in (0..r).step_by(W) {
            _mm512_storeu_ps(p.add(i), in_reg(_mm512_loadu_ps(p.add(i))));
        }
        let mut h = W;
        while h < r {
            let last = 2 * h == r;
            for base in (0..r).step_by(2 * h) {
                for j in (base..base + h).step_by(W) {
                    let a = _mm512_loadu_ps(p.add(j));
                    let b = _mm512_loadu_ps(p.add(j + h));
                    let (mut u, mut v) = (_mm512_add_ps(a, b), _mm512_sub_ps(a, b));
                    if last {
                        u = _mm512_mul_ps(u, scale);
                        v = _mm512_mul_ps(v, scale);
                    }
                    _mm512_storeu_ps(p.add(j), u);
                    _mm512_storeu_ps(p.add(j + h), v);
                }
            }
            h *= 2;
        }
        if r == W {
            for i in (0..r).step_by(W) {
                _mm512_storeu_ps(p.add(i), _mm512_mul_ps(_mm512_loadu_ps(p.add(i)), scale));
            }
        }
    }
}

#[target_feature(enable = "avx2,fma")]
pub unsafe fn fwht_avx2(x: &mut [f32], r: usize) {
    const W: usize = 8;
    let s1 = _mm256_setr_ps(1., -1., 1., -1., 1., -1., 1., -1.);
    let s2 = _mm256_setr_ps(1., 1., -1., -1., 1., 1., -1., -1.);
    let s4 = _mm256_setr_ps(1., 1., 1., 1., -1., -1., -1., -1.);
    let in_reg = |mut v: __m256| -> __m256 {
        v = _mm256_fmadd_ps(v, s1, _mm256_permute_ps::<0b10_11_00_01>(v));
        if r > 2 {
            v = _mm256_fmadd_ps(v, s2, _mm256_permute_ps::<0b01_00_11_10>(v));
        }
        if r > 4 {
            v = _mm256_fmadd_ps(v, s4, _mm256_permute2f128_ps::<1>(v, v));
        }
        v
    };
    let scale = _mm256_set1_ps(hadamard_scale(r));
    if r < W {
        let (body, tail) = x.split_at_mut(x.len() / W * W);
        for c in body.chunks_exact_mut(W) {
            let p = c.as_mut_ptr();
            _mm256_storeu_ps(p, _mm256_mul_ps(in_reg(_mm256_loadu_ps(p)), scale));
        }
        fwht_scalar(tail, r);
        return;
    }
    for blk in x.chunks_exact_mut(r) {
        let p = blk.as_mut_ptr();
        for i in (0..r).step_by(W) {
            _mm256_storeu_ps(p.add(i), in_reg(_mm256_loadu_ps(p.add(i))));
        }
        let mut h = W;
        while h < r {
            let last = 2 * h == r;
            for base in (0..r).step_by(2 * h) {
                for j in (base..base + h).step_by(W) {
                    let a = _mm256_loadu_ps(p.add(j));
                    let b = _mm256_loadu_ps(p.add(j + h));
                    let (mut u, mut v) = (_mm256_add_ps(a, b), _mm256_sub_ps(a, b));
                    if last {
                        u = _mm256_mul_ps(u, scale);
                        v = _mm256_mul_ps(v, scale);
                    }
                    _mm256_storeu_ps(p.add(j), u);
                    _mm256_storeu_ps(p.add(j + h), v);
                }
            }
            h *= 2;
        }
        if r == W {
            for i in (0..r).step_by(W) {
                _mm256_storeu_ps(p.add(i), _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), scale));
            }
        }
    }
}
