//! Plain-slice f32 kernels of the CPU backend (everything except the quantized matrix products).
//!
//! Each kernel that the backend parallelises takes the range of independent work items (heads,
//! channels, query rows) it should process, so the same code runs single-threaded in tests and
//! split across the pool in the backend. Numerics follow HF transformers (the oracle): f32
//! everywhere, `rsqrt(mean + eps)` norms, softplus with threshold 20.

use crate::backend::{AttnLayout, ConvShape, GdnDims, RopeLayout};

/// `1 / (1 + e^-x)`.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `x * sigmoid(x)`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// `ln(1 + e^x)`, returning `x` above 20 (as torch and ggml do).
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// Sum of squares in f32 with four partial sums (vectorises; order differs from a plain loop only
/// at f32 rounding).
#[inline]
pub fn sum_sq(x: &[f32]) -> f32 {
    dot(x, x)
}

/// f32 dot product: AVX2+FMA when the CPU has it, else [`dot_scalar`].
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if simd::has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked at runtime).
        return unsafe { simd::dot_avx2(a, b) };
    }
    dot_scalar(a, b)
}

/// Portable f32 dot product (eight independent accumulators so it vectorises); the reference
/// the SIMD path is tested against.
#[inline]
pub fn dot_scalar(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; 8];
    let chunks = n / 8;
    for c in 0..chunks {
        let a8 = &a[c * 8..c * 8 + 8];
        let b8 = &b[c * 8..c * 8 + 8];
        for i in 0..8 {
            acc[i] += a8[i] * b8[i];
        }
    }
    let mut tail = 0.0f32;
    for i in chunks * 8..n {
        tail += a[i] * b[i];
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// Four dot products sharing `w`: `[w.x0, w.x1, w.x2, w.x3]` (the weight row is loaded once per
/// four activation rows, which halves the loads of a prefill matrix product).
#[inline]
pub fn dot4(w: &[f32], x: [&[f32]; 4]) -> [f32; 4] {
    #[cfg(target_arch = "x86_64")]
    if simd::has_avx2_fma() && x.iter().all(|xi| xi.len() >= w.len()) {
        // SAFETY: the CPU supports AVX2 and FMA; every `x[k]` is at least as long as `w`.
        return unsafe { simd::dot4_avx2(w, x) };
    }
    x.map(|xi| dot_scalar(w, xi))
}

/// `y += a * x`: AVX2+FMA when the CPU has it, else [`axpy_scalar`].
#[inline]
pub fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if simd::has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked at runtime).
        unsafe { simd::axpy_avx2(y, a, x) };
        return;
    }
    axpy_scalar(y, a, x);
}

/// Portable `y += a * x` (the reference of the SIMD path).
#[inline]
pub fn axpy_scalar(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// Whether the AVX2 + FMA kernels run here (cached).
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx2_fma() -> bool {
    simd::has_avx2_fma()
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;
    use std::sync::OnceLock;

    /// Cached runtime check for AVX2 + FMA.
    #[inline]
    pub fn has_avx2_fma() -> bool {
        static HAS: OnceLock<bool> = OnceLock::new();
        *HAS.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
    }

    /// Four 8-lane FMA accumulators (hides the FMA latency), then a scalar tail.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            for (k, acc) in acc.iter_mut().enumerate() {
                // SAFETY: `i + 32 <= n` bounds both 8-lane loads.
                let (va, vb) = unsafe {
                    (
                        _mm256_loadu_ps(pa.add(i + 8 * k)),
                        _mm256_loadu_ps(pb.add(i + 8 * k)),
                    )
                };
                *acc = _mm256_fmadd_ps(va, vb, *acc);
            }
            i += 32;
        }
        while i + 8 <= n {
            // SAFETY: `i + 8 <= n` bounds both loads.
            let (va, vb) = unsafe { (_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i))) };
            acc[0] = _mm256_fmadd_ps(va, vb, acc[0]);
            i += 8;
        }
        let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
        let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        let h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
        let mut sum = _mm_cvtss_f32(h);
        while i < n {
            sum += a[i] * b[i];
            i += 1;
        }
        sum
    }

    /// One weight row against four activation rows; `x[k].len() >= w.len()` (caller checks).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot4_avx2(w: &[f32], x: [&[f32]; 4]) -> [f32; 4] {
        let n = w.len();
        let pw = w.as_ptr();
        let px = x.map(|xi| xi.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: `i + 8 <= n <= x[k].len()` bounds every load.
            unsafe {
                let vw = _mm256_loadu_ps(pw.add(i));
                for k in 0..4 {
                    acc[k] = _mm256_fmadd_ps(vw, _mm256_loadu_ps(px[k].add(i)), acc[k]);
                }
            }
            i += 8;
        }
        let mut out = [0.0f32; 4];
        for k in 0..4 {
            let s = acc[k];
            let h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
            let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
            let h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
            out[k] = _mm_cvtss_f32(h);
            for j in i..n {
                out[k] += w[j] * x[k][j];
            }
        }
        out
    }

    /// `y += a * x`, 8 lanes at a time.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn axpy_avx2(y: &mut [f32], a: f32, x: &[f32]) {
        let n = y.len().min(x.len());
        let (py, px) = (y.as_mut_ptr(), x.as_ptr());
        let va = _mm256_set1_ps(a);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: `i + 8 <= n` bounds both accesses.
            unsafe {
                let v = _mm256_fmadd_ps(va, _mm256_loadu_ps(px.add(i)), _mm256_loadu_ps(py.add(i)));
                _mm256_storeu_ps(py.add(i), v);
            }
            i += 8;
        }
        while i < n {
            y[i] += a * x[i];
            i += 1;
        }
    }
}

/// RMSNorm of each `n`-element row of `x` into `out`: `out = x / sqrt(mean(x^2) + eps) * w`.
pub fn rms_norm(x: &[f32], w: &[f32], out: &mut [f32], n: usize, eps: f32) {
    for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let inv = 1.0 / (sum_sq(xr) / n as f32 + eps).sqrt();
        for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w) {
            *o = v * inv * g;
        }
    }
}

/// In-place RMSNorm of `count` rows of `n` elements, row `r` starting at `r * stride`.
pub fn rms_norm_strided(x: &mut [f32], w: &[f32], n: usize, stride: usize, count: usize, eps: f32) {
    for r in 0..count {
        let row = &mut x[r * stride..r * stride + n];
        let inv = 1.0 / (sum_sq(row) / n as f32 + eps).sqrt();
        for (v, &g) in row.iter_mut().zip(w) {
            *v = *v * inv * g;
        }
    }
}

/// Gated RMSNorm per `n`-element row: `x = rms(x) * w * silu(z)` (norm first, gate second).
pub fn gated_rms_norm(x: &mut [f32], z: &[f32], w: &[f32], n: usize, eps: f32) {
    for (xr, zr) in x.chunks_exact_mut(n).zip(z.chunks_exact(n)) {
        let inv = 1.0 / (sum_sq(xr) / n as f32 + eps).sqrt();
        for ((v, &g), &zz) in xr.iter_mut().zip(w).zip(zr) {
            *v = *v * inv * g * silu(zz);
        }
    }
}

/// `gate = silu(gate) * up`, elementwise (the SwiGLU activation; result left in `gate`).
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = silu(*g) * u;
    }
}

/// `x += y`.
pub fn add(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// Inverse frequencies `base^(-2i/n_rot)` for `i` in `0..n_rot/2`, computed in f64.
pub fn rope_inv_freq(n_rot: usize, base: f32) -> Vec<f64> {
    (0..n_rot / 2)
        .map(|i| (base as f64).powf(-(2.0 * i as f64) / n_rot as f64))
        .collect()
}

/// NeoX-style partial RoPE in place: for each token `t` (position `pos0 + t`) and head `h`, the
/// head vector at `t * token_stride + h * head_stride` has its first `n_rot` dims rotated in pairs
/// `(i, i + n_rot/2)`; the remaining dims pass through.
pub fn rope_neox(
    x: &mut [f32],
    layout: &RopeLayout,
    n_tokens: usize,
    pos0: usize,
    inv_freq: &[f64],
) {
    let half = layout.n_rot / 2;
    for t in 0..n_tokens {
        let pos = (pos0 + t) as f64;
        for h in 0..layout.n_heads {
            let base = t * layout.token_stride + h * layout.head_stride;
            let v = &mut x[base..base + layout.n_rot];
            for (i, &f) in inv_freq.iter().enumerate().take(half) {
                let (s, c) = (pos * f).sin_cos();
                let (s, c) = (s as f32, c as f32);
                let (a, b) = (v[i], v[i + half]);
                v[i] = a * c - b * s;
                v[i + half] = a * s + b * c;
            }
        }
    }
}

/// Keys per block of [`attention_rows`]: a block's keys and values are widened to f32 once for
/// every query row of a (token, kv head) run, and each row's running maximum moves once per
/// block instead of at every larger score.
const KEY_BLOCK: usize = 16;

/// Largest head dimension [`attention_rows`] blocks (its widened keys and values live on the
/// stack: `2 x KEY_BLOCK x 512` floats, 64 KiB); larger heads take one key at a time.
const MAX_BLOCKED_HEAD_DIM: usize = 512;

/// Most query rows of one run (a GQA group: Qwen3.5/3.8 have 6 or 8 query heads per kv head).
const MAX_RUN: usize = 16;

/// Causal GQA attention for query rows `rows` (a range of `token * n_q_heads + head` indices).
///
/// `q` holds `n_tokens` query tokens at positions `pos0..pos0+n_tokens` (head `h` of token `t` at
/// `t * q_token_stride + h * q_head_stride`); `k_cache`/`v_cache` hold `n_kv_heads * head_dim`
/// floats per cached position and already contain positions `0..pos0+n_tokens`. Query head `h`
/// reads kv head `h / (n_q_heads / n_kv_heads)`. The output of row `(t, h)` goes to
/// `out[t * n_q_heads * head_dim + h * head_dim ..]`; online softmax in f32, so no score buffer.
///
/// The rows of one token that read the same kv head (a run, at most [`MAX_RUN`]) walk the keys
/// together in blocks of [`KEY_BLOCK`]: each block's keys and values are widened to f32 once
/// for the whole run (an f16 or quantized cache was widened once per query row and key, a
/// tenth of a 512-token prompt's time at the 27B shapes), the scores of the block come first,
/// then one rescale per row and block. Blocks start at multiples of `KEY_BLOCK` whatever the
/// run, so a row's result does not depend on how the rows were split across threads.
///
/// # Safety
/// `out` must point to a buffer of at least `n_tokens * n_q_heads * head_dim` floats, and no other
/// thread may write the rows this call writes.
pub unsafe fn attention_rows<K: KvElem, V: KvElem>(
    q: &[f32],
    k_cache: &[K],
    v_cache: &[V],
    out: *mut f32,
    l: &AttnLayout,
    pos0: usize,
    rows: std::ops::Range<usize>,
) {
    let dh = l.head_dim;
    if dh > MAX_BLOCKED_HEAD_DIM {
        // SAFETY: the caller's contract.
        return unsafe { attention_rows_each(q, k_cache, v_cache, out, l, pos0, rows) };
    }
    let group = l.n_q_heads / l.n_kv_heads;
    let kv_stride = l.n_kv_heads * dh;
    // `[key of the block][dh]`: the block's keys and values widened to f32.
    let mut keys = [0.0f32; KEY_BLOCK * MAX_BLOCKED_HEAD_DIM];
    let mut values = [0.0f32; KEY_BLOCK * MAX_BLOCKED_HEAD_DIM];
    let mut row = rows.start;
    while row < rows.end {
        let (t, h0) = (row / l.n_q_heads, row % l.n_q_heads);
        let g = h0 / group;
        // The run: heads `h0..h1` of token `t`, all reading kv head `g`, inside `rows`.
        let h1 = ((g + 1) * group)
            .min(h0 + (rows.end - row))
            .min(h0 + MAX_RUN);
        let n = h1 - h0;
        // Per row of the run: running maximum, running sum, the block's scores.
        let mut max = [f32::NEG_INFINITY; MAX_RUN];
        let mut sum = [0.0f32; MAX_RUN];
        let mut scores = [[0.0f32; KEY_BLOCK]; MAX_RUN];
        let q_row = |i: usize| &q[t * l.q_token_stride + (h0 + i) * l.q_head_stride..][..dh];
        // SAFETY: rows `row..row + n` belong to this call (caller contract); bounds by the
        // buffer-size contract.
        let o_row = |i: usize| unsafe {
            std::slice::from_raw_parts_mut(out.add((t * l.n_q_heads + h0 + i) * dh), dh)
        };
        for i in 0..n {
            o_row(i).fill(0.0);
        }
        let len = pos0 + t + 1;
        for j0 in (0..len).step_by(KEY_BLOCK) {
            let nk = KEY_BLOCK.min(len - j0);
            // Quantized caches hold blocks of `K::PER` values; a head row is whole blocks.
            let at = |j: usize| (j0 + j) * kv_stride + g * dh;
            for j in 0..nk {
                let k = &k_cache[at(j) / K::PER..][..dh / K::PER];
                K::widen(k, &mut keys[j * dh..(j + 1) * dh]);
            }
            for j in 0..nk {
                let v = &v_cache[at(j) / V::PER..][..dh / V::PER];
                V::widen(v, &mut values[j * dh..(j + 1) * dh]);
            }
            for i in 0..n {
                let qv = q_row(i);
                let mut block_max = max[i];
                for (j, s) in scores[i].iter_mut().enumerate().take(nk) {
                    *s = dot(qv, &keys[j * dh..(j + 1) * dh]) * l.scale;
                    block_max = block_max.max(*s);
                }
                let o = o_row(i);
                // The first block: `exp(-inf) = 0` clears nothing (all zero already).
                let r = (max[i] - block_max).exp();
                if r != 1.0 {
                    sum[i] *= r;
                    o.iter_mut().for_each(|x| *x *= r);
                }
                for (j, &s) in scores[i].iter().enumerate().take(nk) {
                    let p = (s - block_max).exp();
                    sum[i] += p;
                    axpy(o, p, &values[j * dh..(j + 1) * dh]);
                }
                max[i] = block_max;
            }
        }
        for (i, &s) in sum.iter().enumerate().take(n) {
            let inv = 1.0 / s;
            o_row(i).iter_mut().for_each(|x| *x *= inv);
        }
        row += n;
    }
}

/// [`attention_rows`] one query row and key at a time (heads wider than
/// [`MAX_BLOCKED_HEAD_DIM`]; the reference the blocked form is tested against).
///
/// # Safety
/// As [`attention_rows`].
pub unsafe fn attention_rows_each<K: KvElem, V: KvElem>(
    q: &[f32],
    k_cache: &[K],
    v_cache: &[V],
    out: *mut f32,
    l: &AttnLayout,
    pos0: usize,
    rows: std::ops::Range<usize>,
) {
    let dh = l.head_dim;
    let group = l.n_q_heads / l.n_kv_heads;
    let kv_stride = l.n_kv_heads * dh;
    for row in rows {
        let (t, h) = (row / l.n_q_heads, row % l.n_q_heads);
        let g = h / group;
        let qv = &q[t * l.q_token_stride + h * l.q_head_stride..][..dh];
        // SAFETY: disjoint rows per caller contract; bounds by the buffer-size contract.
        let o = unsafe { std::slice::from_raw_parts_mut(out.add((t * l.n_q_heads + h) * dh), dh) };
        o.fill(0.0);
        let mut m = f32::NEG_INFINITY;
        let mut sum = 0.0f32;
        for j in 0..=pos0 + t {
            // Quantized caches hold blocks of `K::PER` values; a head row is whole blocks.
            let at = j * kv_stride + g * dh;
            let kv = &k_cache[at / K::PER..][..dh / K::PER];
            let s = K::dot_q(qv, kv) * l.scale;
            let vv = &v_cache[at / V::PER..][..dh / V::PER];
            if s > m {
                let r = (m - s).exp();
                sum = sum * r + 1.0;
                for x in o.iter_mut() {
                    *x *= r;
                }
                V::axpy_v(o, 1.0, vv);
                m = s;
            } else {
                let p = (s - m).exp();
                sum += p;
                V::axpy_v(o, p, vv);
            }
        }
        let inv = 1.0 / sum;
        for x in o.iter_mut() {
            *x *= inv;
        }
    }
}

/// An element type a KV cache may hold (a value, or a block of values).
pub trait KvElem: Copy + Send + Sync {
    /// Values per element (1 for floats, the block length for quantized blocks).
    const PER: usize = 1;
    /// `q . k` in f32.
    fn dot_q(q: &[f32], k: &[Self]) -> f32;
    /// `o += p * v` in f32.
    fn axpy_v(o: &mut [f32], p: f32, v: &[Self]);
    /// The values of `src` as f32 into `dst` (`src.len() * PER` floats).
    fn widen(src: &[Self], dst: &mut [f32]);
}

impl KvElem for f32 {
    #[inline]
    fn dot_q(q: &[f32], k: &[f32]) -> f32 {
        dot(q, k)
    }
    #[inline]
    fn axpy_v(o: &mut [f32], p: f32, v: &[f32]) {
        axpy(o, p, v)
    }
    #[inline]
    fn widen(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src)
    }
}

/// f16 rows are widened to f32 in 64-element pieces on the stack.
const F16_PIECE: usize = 64;

impl KvElem for half::f16 {
    #[inline]
    fn widen(src: &[half::f16], dst: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        src.convert_to_f32_slice(dst)
    }
    #[inline]
    fn dot_q(q: &[f32], k: &[half::f16]) -> f32 {
        use half::slice::HalfFloatSliceExt;
        let mut buf = [0.0f32; F16_PIECE];
        let mut acc = 0.0f32;
        for (qc, kc) in q.chunks(F16_PIECE).zip(k.chunks(F16_PIECE)) {
            let b = &mut buf[..kc.len()];
            kc.convert_to_f32_slice(b);
            acc += dot(qc, b);
        }
        acc
    }
    #[inline]
    fn axpy_v(o: &mut [f32], p: f32, v: &[half::f16]) {
        use half::slice::HalfFloatSliceExt;
        let mut buf = [0.0f32; F16_PIECE];
        for (oc, vc) in o.chunks_mut(F16_PIECE).zip(v.chunks(F16_PIECE)) {
            let b = &mut buf[..vc.len()];
            vc.convert_to_f32_slice(b);
            axpy(oc, p, b);
        }
    }
}

/// `x[t, h] *= sigmoid(gate[t, h])` for every token and head: `x` is `[n_tokens, n_heads * dh]`,
/// the gate of head `h` of token `t` starts at `t * gate_token_stride + h * gate_head_stride`.
pub fn sigmoid_gate(
    x: &mut [f32],
    gate: &[f32],
    n_heads: usize,
    dh: usize,
    gate_token_stride: usize,
    gate_head_stride: usize,
) {
    for (t, xt) in x.chunks_exact_mut(n_heads * dh).enumerate() {
        for h in 0..n_heads {
            let g = &gate[t * gate_token_stride + h * gate_head_stride..][..dh];
            for (v, &gg) in xt[h * dh..(h + 1) * dh].iter_mut().zip(g) {
                *v *= sigmoid(gg);
            }
        }
    }
}

/// Causal depthwise conv1d (kernel `k = shape.kernel`) followed by SiLU, for channels `chans`
/// of `c = shape.channels`.
///
/// `u` is `[n_tokens, c]` (pre-conv projections), `state` is `[k-1, c]` (the previous `k-1`
/// pre-conv rows, oldest first), `w` is `[c, k]` (tap-major per channel, tap `k-1` multiplies the
/// current token). Writes `y` (`[n_tokens, c]`) and shifts the new rows into `state`.
///
/// # Safety
/// `y` and `state` must point to buffers of `n_tokens * c` and `(k-1) * c` floats; no other thread
/// may touch the channels in `chans`.
pub unsafe fn conv1d_silu_channels(
    u: &[f32],
    w: &[f32],
    state: *mut f32,
    y: *mut f32,
    n_tokens: usize,
    shape: ConvShape,
    chans: std::ops::Range<usize>,
) {
    let ConvShape {
        channels: c,
        kernel: k,
    } = shape;
    let hist = k - 1;
    for ch in chans {
        let wc = &w[ch * k..ch * k + k];
        // The input at "relative time" r (r < hist: state row r; else token r - hist).
        let at = |r: usize| -> f32 {
            if r < hist {
                // SAFETY: in bounds by contract.
                unsafe { *state.add(r * c + ch) }
            } else {
                u[(r - hist) * c + ch]
            }
        };
        for t in 0..n_tokens {
            let mut acc = 0.0f32;
            for (tap, &wt) in wc.iter().enumerate() {
                acc += wt * at(t + tap);
            }
            // SAFETY: in bounds by contract.
            unsafe { *y.add(t * c + ch) = silu(acc) };
        }
        // New state: the last `hist` rows of [state ; u].
        let total = hist + n_tokens;
        let mut newest = [0.0f32; 16];
        for (r, slot) in newest.iter_mut().enumerate().take(hist) {
            *slot = at(total - hist + r);
        }
        for (r, &v) in newest.iter().enumerate().take(hist) {
            // SAFETY: in bounds by contract.
            unsafe { *state.add(r * c + ch) = v };
        }
    }
}

/// L2-normalises (HF: `x * rsqrt(sum x^2 + 1e-6)`) every q and k key head of each token of the
/// post-conv GDN vector `y` (`[n_tokens, conv_dim]`), and scales q by `1/sqrt(dk)`.
pub fn gdn_normalize_qk(y: &mut [f32], d: &GdnDims, n_tokens: usize) {
    let key_dim = d.n_k_heads * d.dk;
    let q_scale = 1.0 / (d.dk as f32).sqrt();
    for t in 0..n_tokens {
        let row = &mut y[t * d.conv_dim()..][..2 * key_dim];
        for (i, head) in row.chunks_exact_mut(d.dk).enumerate() {
            let inv = 1.0 / (sum_sq(head) + 1e-6).sqrt();
            let s = if i < d.n_k_heads { inv * q_scale } else { inv };
            for v in head.iter_mut() {
                *v *= s;
            }
        }
    }
}

/// Per-token, per-value-head gate values: `beta = sigmoid(b)` and `decay = exp(softplus(alpha +
/// dt_bias) * a)` (`a` already holds `-exp(A_log)`), written over `b` and `alpha` in place.
pub fn gdn_gates(b: &mut [f32], alpha: &mut [f32], a: &[f32], dt_bias: &[f32], n_v_heads: usize) {
    for (bt, at) in b
        .chunks_exact_mut(n_v_heads)
        .zip(alpha.chunks_exact_mut(n_v_heads))
    {
        for p in 0..n_v_heads {
            bt[p] = sigmoid(bt[p]);
            at[p] = softplus(at[p] + dt_bias[p]) * a[p];
        }
    }
}

/// The inputs of the delta-rule kernels: `n_tokens` rows of a layer shaped `dims`, after
/// [`gdn_normalize_qk`] and [`gdn_gates`].
#[derive(Clone, Copy)]
pub struct GdnRows<'a> {
    /// The normalised post-conv vector per token, `[n_tokens, conv_dim]`: q | k | v.
    pub y: &'a [f32],
    /// Beta per token and value head, `[n_tokens, n_v_heads]`.
    pub beta: &'a [f32],
    /// Log-decay per token and value head, `[n_tokens, n_v_heads]`.
    pub g: &'a [f32],
    /// Shape of the layer.
    pub dims: &'a GdnDims,
    /// Tokens (rows).
    pub n_tokens: usize,
}

/// The gated delta rule, recurrent form, for value heads `heads`.
///
/// `rows` holds the inputs (see [`GdnRows`]); `state` is `[n_v_heads, dv, dk]` (row `j` of
/// head `p` holds `S[.][j]` over the key dim). Output `[n_tokens, n_v_heads * dv]`. Value head
/// `p` reads key head `p % n_k_heads` (GGUF order).
///
/// # Safety
/// `state` and `out` must cover `n_v_heads * dv * dk` and `n_tokens * n_v_heads * dv` floats;
/// no other thread may touch the heads in `heads`.
pub unsafe fn gdn_recurrent_heads(
    rows: &GdnRows<'_>,
    state: *mut f32,
    out: *mut f32,
    heads: std::ops::Range<usize>,
) {
    let GdnRows {
        y,
        beta,
        g,
        dims: d,
        n_tokens,
    } = *rows;
    let key_dim = d.n_k_heads * d.dk;
    let value_dim = d.n_v_heads * d.dv;
    for p in heads {
        let kh = p % d.n_k_heads;
        // SAFETY: head `p`'s state is ours alone (contract).
        let s = unsafe { std::slice::from_raw_parts_mut(state.add(p * d.dv * d.dk), d.dv * d.dk) };
        for t in 0..n_tokens {
            let row = &y[t * d.conv_dim()..];
            let q = &row[kh * d.dk..][..d.dk];
            let k = &row[key_dim + kh * d.dk..][..d.dk];
            let v = &row[2 * key_dim + p * d.dv..][..d.dv];
            let decay = g[t * d.n_v_heads + p].exp();
            let b = beta[t * d.n_v_heads + p];
            for (j, sj) in s.chunks_exact_mut(d.dk).enumerate() {
                for x in sj.iter_mut() {
                    *x *= decay;
                }
                let pred = dot(sj, k);
                let dj = b * (v[j] - pred);
                axpy(sj, dj, k);
                // SAFETY: row (t, p) is ours alone (contract).
                unsafe { *out.add(t * value_dim + p * d.dv + j) = dot(sj, q) };
            }
        }
    }
}

/// Chunk length of the chunked delta-rule form (as HF and llama.cpp use).
pub const GDN_CHUNK: usize = 64;

/// The gated delta rule, chunked form (same inputs/outputs as [`gdn_recurrent_heads`]).
///
/// Within a chunk of `C` tokens with cumulative log-decay `G_t`, it solves the unit-lower
/// triangular system `(I + A) U = diag(beta) (V - ...)` by forward substitution instead of
/// stepping the full `dk x dv` state per token: per chunk the state is read and written once.
/// Work buffers come from `scratch` (at least [`gdn_chunk_scratch_len`] floats per thread).
///
/// # Safety
/// As for [`gdn_recurrent_heads`].
pub unsafe fn gdn_chunked_heads(
    rows: &GdnRows<'_>,
    state: *mut f32,
    out: *mut f32,
    heads: std::ops::Range<usize>,
    scratch: &mut [f32],
) {
    let GdnRows {
        y,
        beta,
        g,
        dims: d,
        n_tokens,
    } = *rows;
    let key_dim = d.n_k_heads * d.dk;
    let value_dim = d.n_v_heads * d.dv;
    let (dk, dv) = (d.dk, d.dv);
    let c_max = GDN_CHUNK;
    let (gcum, rest) = scratch.split_at_mut(c_max);
    let (w_mat, rest) = rest.split_at_mut(c_max * dv); // U rows (new values), [C, dv]
    let (kq, rest) = rest.split_at_mut(c_max * c_max); // k_i . k_j, then reused
    let (qk, _rest) = rest.split_at_mut(c_max * c_max); // q_i . k_j
    for p in heads {
        let kh = p % d.n_k_heads;
        // SAFETY: head `p`'s state is ours alone (contract).
        let s = unsafe { std::slice::from_raw_parts_mut(state.add(p * dv * dk), dv * dk) };
        let mut t0 = 0;
        while t0 < n_tokens {
            let c = c_max.min(n_tokens - t0);
            let qrow = |i: usize| &y[(t0 + i) * d.conv_dim() + kh * dk..][..dk];
            let krow = |i: usize| &y[(t0 + i) * d.conv_dim() + key_dim + kh * dk..][..dk];
            let vrow = |i: usize| &y[(t0 + i) * d.conv_dim() + 2 * key_dim + p * dv..][..dv];
            let mut acc = 0.0f32;
            for (i, gc) in gcum.iter_mut().enumerate().take(c) {
                acc += g[(t0 + i) * d.n_v_heads + p];
                *gc = acc;
            }
            for i in 0..c {
                for j in 0..=i {
                    kq[i * c_max + j] = dot(krow(i), krow(j));
                    qk[i * c_max + j] = dot(qrow(i), krow(j));
                }
            }
            // U_i = beta_i * (v_i - e^{G_i} S^T k_i - sum_{j<i} e^{G_i - G_j} (k_i.k_j) U_j):
            // the value each token writes, given the chunk-start state and earlier tokens.
            for i in 0..c {
                let b = beta[(t0 + i) * d.n_v_heads + p];
                let eg = gcum[i].exp();
                let ki = krow(i);
                let vi = vrow(i);
                let (done, cur) = w_mat.split_at_mut(i * dv);
                let ui = &mut cur[..dv];
                for (jv, u) in ui.iter_mut().enumerate() {
                    *u = vi[jv] - eg * dot(&s[jv * dk..(jv + 1) * dk], ki);
                }
                for j in 0..i {
                    let coef = (gcum[i] - gcum[j]).exp() * kq[i * c_max + j];
                    axpy(ui, -coef, &done[j * dv..(j + 1) * dv]);
                }
                for u in ui.iter_mut() {
                    *u *= b;
                }
            }
            // O_i = e^{G_i} S^T q_i + sum_{j<=i} e^{G_i - G_j} (q_i.k_j) U_j.
            for i in 0..c {
                let eg = gcum[i].exp();
                let qi = qrow(i);
                // SAFETY: row (t0 + i, p) is ours alone (contract).
                let o = unsafe {
                    std::slice::from_raw_parts_mut(out.add((t0 + i) * value_dim + p * dv), dv)
                };
                for (jv, ov) in o.iter_mut().enumerate() {
                    *ov = eg * dot(&s[jv * dk..(jv + 1) * dk], qi);
                }
                for j in 0..=i {
                    let coef = (gcum[i] - gcum[j]).exp() * qk[i * c_max + j];
                    axpy(o, coef, &w_mat[j * dv..(j + 1) * dv]);
                }
            }
            // S <- e^{G_last} S + sum_j e^{G_last - G_j} k_j U_j^T.
            let glast = gcum[c - 1];
            let eg = glast.exp();
            for x in s.iter_mut() {
                *x *= eg;
            }
            for j in 0..c {
                let f = (glast - gcum[j]).exp();
                let kj = krow(j);
                let uj = &w_mat[j * dv..(j + 1) * dv];
                for (jv, &u) in uj.iter().enumerate() {
                    axpy(&mut s[jv * dk..(jv + 1) * dk], f * u, kj);
                }
            }
            t0 += c;
        }
    }
}

/// Floats of scratch one thread needs for [`gdn_chunked_heads`].
pub fn gdn_chunk_scratch_len(d: &GdnDims) -> usize {
    GDN_CHUNK + GDN_CHUNK * d.dv + 2 * GDN_CHUNK * GDN_CHUNK
}
