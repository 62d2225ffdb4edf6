//! The kernels of `host/emu_ops.cpp` (matmul, rope, conv1d, delta_rule, get_rows, elementwise,
//! top-k) and the grid-strided launches of `host/emu_attention.cpp`, run on the host by the SIMT
//! emulator with the CUDA wrappers' launch geometry (see [`crate::emu`]). For the host tests;
//! not a production API.

use crate::emu::{self, need, Aligned, EmuError, EmuStats, KvGeom};
use crate::types::{DeltaRuleInputs, DeltaRuleShape, WeightType};
use std::ffi::c_void;

#[allow(clippy::too_many_arguments)] // the C side mirrors the kernels' own parameter lists
extern "C" {
    fn pn_emu_matmul(
        ty: i32,
        w: *const c_void,
        row_bytes: i64,
        x: *const f32,
        x_stride: i64,
        y: *mut f32,
        y_stride: i64,
        n: i32,
        k: i32,
        t: i32,
    ) -> i32;
    fn pn_emu_rope(
        x: *mut f32,
        tok_stride: i64,
        head_stride: i64,
        pos: *const i32,
        pos0: i32,
        n_rot: i32,
        base: f32,
        n_tokens: i32,
        n_heads: i32,
        grid_y: u32,
    ) -> i32;
    fn pn_emu_conv1d(
        u: *const f32,
        u_stride: i64,
        state: *mut f32,
        w: *const f32,
        y: *mut f32,
        y_stride: i64,
        c: i32,
        t: i32,
    ) -> i32;
    fn pn_emu_delta_rule(
        q: *const f32,
        k: *const f32,
        qk_stride: i64,
        v: *const f32,
        v_stride: i64,
        b: *const f32,
        al: *const f32,
        ab_stride: i64,
        dt_bias: *const f32,
        ssm_a: *const f32,
        state: *mut f32,
        out: *mut f32,
        out_stride: i64,
        n_v_heads: i32,
        n_k_heads: i32,
        t: i32,
    ) -> i32;
    fn pn_emu_get_rows(
        ty: i32,
        w: *const c_void,
        ids: *const i32,
        n_ids: i32,
        out: *mut f32,
        k: i32,
        n_rows: i32,
    ) -> i32;
    fn pn_emu_elementwise(
        kind: i32,
        a: *mut f32,
        b: *const f32,
        out: *mut f32,
        n: i64,
        hd: i32,
        n_heads: i32,
        g_ts: i64,
        g_hs: i64,
        grid: u32,
    ) -> i32;
    fn pn_emu_topk(
        x: *const f32,
        n: i32,
        k: i32,
        cand_v: *mut f32,
        cand_i: *mut i32,
        out_v: *mut f32,
        out_i: *mut i32,
    ) -> i32;
    fn pn_emu_topk_slice() -> i32;
    fn pn_emu_topk_max() -> i32;
    fn pn_emu_attention_grid(
        kv_type: i32,
        q: *const f32,
        q_tok_stride: i64,
        q_head_stride: i64,
        kc: *const c_void,
        vc: *const c_void,
        pos_stride: i64,
        head_stride: i64,
        n_head: i32,
        group: i32,
        p0: i32,
        t: i32,
        n_split: i32,
        chunk: i32,
        scale: f32,
        part_o: *mut f32,
        part_ml: *mut f32,
        o: *mut f32,
        o_tok_stride: i64,
        grid_t: u32,
    ) -> i32;
    fn pn_emu_kv_store_grid(
        kv_type: i32,
        k: *const f32,
        v: *const f32,
        tok_stride: i64,
        kc: *mut c_void,
        vc: *mut c_void,
        pos_stride: i64,
        head_stride: i64,
        p0: i32,
        n_kv: i32,
        t: i32,
        grid_t: u32,
    ) -> i32;
}

/// `matmul.cu` (`matmul_<ty>w`) on the wrapper's grid: `y[t][n] = sum_k x[t][k] w[n][k]` for `t`
/// tokens (x `[t][k]`, y `[t][n]`, contiguous), `w` `n` rows of `k` in its stored type.
pub fn matmul(
    ty: WeightType,
    w: &[u8],
    x: &[f32],
    y: &mut [f32],
    n: usize,
    t: usize,
) -> Result<EmuStats, EmuError> {
    let k = x.len() / t.max(1);
    let rb = ty.row_bytes(k).unwrap_or(usize::MAX);
    need(
        "matmul",
        t > 0 && n > 0 && rb != usize::MAX && w.len() >= n * rb && y.len() >= t * n,
        || {
            format!(
                "{} w {} bytes, y {}, {t} x {n} x {k}",
                ty.name(),
                w.len(),
                y.len()
            )
        },
    )?;
    let code = match ty {
        WeightType::F32 => 0,
        WeightType::F16 => 1,
        WeightType::Q8_0 => 2,
        WeightType::Q4K => 3,
        WeightType::Q3K => 4,
        WeightType::Pn3t => 5,
        WeightType::Pn4t => 6,
    };
    let wa = Aligned::new(&w[..n * rb]);
    emu::counted("matmul", &[], || {
        // SAFETY: w holds n rows of rb bytes, x t rows of k, y t rows of n (checked above).
        unsafe {
            pn_emu_matmul(
                code,
                wa.as_ptr(),
                rb as i64,
                x.as_ptr(),
                k as i64,
                y.as_mut_ptr(),
                n as i64,
                n as i32,
                k as i32,
                t as i32,
            )
        }
    })
}

/// A `rope_neox_f32` call: `tokens` x `heads` rows at the strides, the first `n_rot` dims rotated.
#[derive(Clone, Copy, Debug)]
pub struct RopeCall<'a> {
    /// Tokens (the kernel's grid-strided dimension).
    pub tokens: usize,
    /// Heads per token (grid x).
    pub heads: usize,
    /// Floats between tokens.
    pub tok_stride: usize,
    /// Floats between heads.
    pub head_stride: usize,
    /// Positions per token, or none for `pos0 + t`.
    pub pos: Option<&'a [i32]>,
    /// First position when `pos` is none.
    pub pos0: i32,
    /// Rotated dims (even, block n_rot/2 threads).
    pub n_rot: usize,
    /// Frequency base.
    pub base: f32,
    /// Blocks on grid y (at most `tokens`; fewer shows the grid stride).
    pub grid_y: u32,
}

/// `rope_neox_f32` in place on `x`.
pub fn rope(c: &RopeCall<'_>, x: &mut [f32]) -> Result<EmuStats, EmuError> {
    let last =
        (c.tokens.max(1) - 1) * c.tok_stride + (c.heads.max(1) - 1) * c.head_stride + c.n_rot;
    need(
        "rope_neox_f32",
        c.tokens > 0
            && c.heads > 0
            && c.n_rot > 0
            && c.n_rot.is_multiple_of(2)
            && c.n_rot <= 2048
            && x.len() >= last
            && c.grid_y >= 1
            && c.pos.is_none_or(|p| p.len() >= c.tokens),
        || format!("x {} floats for {c:?}", x.len()),
    )?;
    emu::counted("rope_neox_f32", &[], || {
        // SAFETY: x covers every row (checked), pos has a value per token.
        unsafe {
            pn_emu_rope(
                x.as_mut_ptr(),
                c.tok_stride as i64,
                c.head_stride as i64,
                c.pos.map_or(std::ptr::null(), |p| p.as_ptr()),
                c.pos0,
                c.n_rot as i32,
                c.base,
                c.tokens as i32,
                c.heads as i32,
                c.grid_y,
            )
        }
    })
}

/// `conv1d_silu_f32` over `t` tokens of `c` channels (u, y `[t][c]`), state `[3][c]`, w `[c][4]`.
pub fn conv1d(
    u: &[f32],
    state: &mut [f32],
    w: &[f32],
    y: &mut [f32],
    c: usize,
) -> Result<EmuStats, EmuError> {
    let t = u.len() / c.max(1);
    need(
        "conv1d_silu_f32",
        t > 0 && y.len() >= t * c && state.len() >= 3 * c && w.len() >= 4 * c,
        || {
            format!(
                "u {}, y {}, state {}, w {} for {c} channels",
                u.len(),
                y.len(),
                state.len(),
                w.len()
            )
        },
    )?;
    emu::counted("conv1d_silu_f32", &[], || {
        // SAFETY: lengths checked above.
        unsafe {
            pn_emu_conv1d(
                u.as_ptr(),
                c as i64,
                state.as_mut_ptr(),
                w.as_ptr(),
                y.as_mut_ptr(),
                c as i64,
                c as i32,
                t as i32,
            )
        }
    })
}

/// Fails unless the buffers of a token-by-token delta-rule launch `kernel` hold shape `s`.
pub(crate) fn check_delta_rule(
    kernel: &str,
    x: &DeltaRuleInputs<&[f32]>,
    s: &DeltaRuleShape,
    state: &[f32],
    out: &[f32],
) -> Result<(), EmuError> {
    let (nv, nk, t, d) = (s.n_v_heads, s.n_k_heads, s.t_len, 128);
    let t1 = t.max(1) - 1;
    need(
        kernel,
        t > 0
            && nv > 0
            && nk > 0
            && x.q.len() >= t1 * s.qk_stride + nk * d
            && x.k.len() >= t1 * s.qk_stride + nk * d
            && x.v.len() >= t1 * s.v_stride + nv * d
            && out.len() >= t1 * s.out_stride + nv * d
            && x.beta_raw.len() >= t1 * s.ab_stride + nv
            && x.alpha_raw.len() >= t1 * s.ab_stride + nv
            && x.dt_bias.len() >= nv
            && x.ssm_a.len() >= nv
            && state.len() >= nv * d * d,
        || format!("buffers short for {s:?}"),
    )
}

/// `delta_rule_f32` (the token-by-token kernel): arguments as [`crate::Gpu::delta_rule`].
pub fn delta_rule(
    x: &DeltaRuleInputs<&[f32]>,
    s: &DeltaRuleShape,
    state: &mut [f32],
    out: &mut [f32],
) -> Result<EmuStats, EmuError> {
    check_delta_rule("delta_rule_f32", x, s, state, out)?;
    let (nv, nk, t) = (s.n_v_heads, s.n_k_heads, s.t_len);
    emu::counted("delta_rule_f32", &[], || {
        // SAFETY: every length the kernel reads or writes is checked above.
        unsafe {
            pn_emu_delta_rule(
                x.q.as_ptr(),
                x.k.as_ptr(),
                s.qk_stride as i64,
                x.v.as_ptr(),
                s.v_stride as i64,
                x.beta_raw.as_ptr(),
                x.alpha_raw.as_ptr(),
                s.ab_stride as i64,
                x.dt_bias.as_ptr(),
                x.ssm_a.as_ptr(),
                state.as_mut_ptr(),
                out.as_mut_ptr(),
                s.out_stride as i64,
                nv as i32,
                nk as i32,
                t as i32,
            )
        }
    })
}

/// `*_get_rows` (Q3_K, Q8_0, F16, F32): `out[i][..k] = W[ids[i]]` from `n_rows` rows of `k`.
/// Ids outside `0..n_rows` leave their output row untouched (the kernel's guard).
pub fn get_rows(
    ty: WeightType,
    w: &[u8],
    ids: &[i32],
    out: &mut [f32],
    k: usize,
    n_rows: usize,
) -> Result<EmuStats, EmuError> {
    let code = match ty {
        WeightType::F32 => 0,
        WeightType::F16 => 1,
        WeightType::Q8_0 => 2,
        WeightType::Q3K => 4,
        _ => -1,
    };
    let rb = ty.row_bytes(k).unwrap_or(usize::MAX);
    need(
        "get_rows",
        code >= 0
            && rb != usize::MAX
            && !ids.is_empty()
            && w.len() >= n_rows * rb
            && out.len() >= ids.len() * k,
        || {
            format!(
                "{} w {} bytes, {} ids, out {}",
                ty.name(),
                w.len(),
                ids.len(),
                out.len()
            )
        },
    )?;
    let wa = Aligned::new(&w[..n_rows * rb]);
    emu::counted("get_rows", &[], || {
        // SAFETY: the kernel reads rows of in-range ids only, writes ids.len() rows of k.
        unsafe {
            pn_emu_get_rows(
                code,
                wa.as_ptr(),
                ids.as_ptr(),
                ids.len() as i32,
                out.as_mut_ptr(),
                k as i32,
                n_rows as i32,
            )
        }
    })
}

/// An `elementwise.cu` kernel.
#[derive(Debug)]
pub enum Elementwise<'a> {
    /// `swiglu_f32`: `out = silu(gate) * up`.
    Swiglu {
        /// Gate values.
        gate: &'a [f32],
        /// Up values.
        up: &'a [f32],
        /// Output.
        out: &'a mut [f32],
    },
    /// `sigmoid_gate_f32`: `x[t][h][i] *= sigmoid(g[t*g_ts + h*g_hs + i])`.
    SigmoidGate {
        /// x, `[tokens][n_heads][hd]`, in place.
        x: &'a mut [f32],
        /// The gate.
        g: &'a [f32],
        /// Head dim.
        hd: usize,
        /// Heads per token.
        n_heads: usize,
        /// Gate floats between tokens.
        g_ts: usize,
        /// Gate floats between heads.
        g_hs: usize,
    },
    /// `add_inplace_f32`: `a += b`.
    Add {
        /// Accumulator.
        a: &'a mut [f32],
        /// Addend.
        b: &'a [f32],
    },
}

/// Runs an elementwise kernel over its whole first buffer on `grid` blocks of 256 threads (a
/// grid below `n / 256` shows the grid-stride loop).
pub fn elementwise(op: Elementwise<'_>, grid: u32) -> Result<EmuStats, EmuError> {
    let (kind, a, b, out, n, hd, nh, gts, ghs) = match op {
        Elementwise::Swiglu { gate, up, out } => {
            need(
                "swiglu_f32",
                up.len() >= gate.len() && out.len() >= gate.len(),
                || "up/out shorter than gate".into(),
            )?;
            // The kernel only reads `gate` through this pointer.
            (
                0,
                gate.as_ptr().cast_mut(),
                up.as_ptr(),
                out.as_mut_ptr(),
                gate.len(),
                0,
                0,
                0,
                0,
            )
        }
        Elementwise::SigmoidGate {
            x,
            g,
            hd,
            n_heads,
            g_ts,
            g_hs,
        } => {
            let rows = x.len() / hd.max(1);
            let t = rows / n_heads.max(1);
            need(
                "sigmoid_gate_f32",
                hd > 0
                    && n_heads > 0
                    && t > 0
                    && g.len() >= (t - 1) * g_ts + (n_heads - 1) * g_hs + hd,
                || format!("gate {} floats for {t} tokens", g.len()),
            )?;
            let n = t * n_heads * hd;
            (
                1,
                x.as_mut_ptr(),
                g.as_ptr(),
                std::ptr::null_mut(),
                n,
                hd,
                n_heads,
                g_ts,
                g_hs,
            )
        }
        Elementwise::Add { a, b } => {
            need("add_inplace_f32", b.len() >= a.len(), || {
                "b shorter than a".into()
            })?;
            (
                2,
                a.as_mut_ptr(),
                b.as_ptr(),
                std::ptr::null_mut(),
                a.len(),
                0,
                0,
                0,
                0,
            )
        }
    };
    need("elementwise", n > 0 && grid > 0, || "empty".into())?;
    emu::counted("elementwise", &[], || {
        // SAFETY: every buffer holds the n values (checked above); the gate covers its layout.
        unsafe {
            pn_emu_elementwise(
                kind, a, b, out, n as i64, hd as i32, nh as i32, gts as i64, ghs as i64, grid,
            )
        }
    })
}

/// Values each block of `topk_partial_f32` takes (`TK_SLICE`; equals
/// [`crate::launch::TOP_K_SLICE`], checked by the host tests).
pub fn top_k_slice() -> usize {
    // SAFETY: returns a constant.
    unsafe { pn_emu_topk_slice() as usize }
}

/// Largest k of the top-k kernels (`TK_MAX`; equals [`crate::launch::TOP_K_MAX`]).
pub fn top_k_max() -> usize {
    // SAFETY: returns a constant.
    unsafe { pn_emu_topk_max() as usize }
}

/// `topk_partial_f32` then `topk_merge_f32`: the `k` best `(index, value)` of `x` in the CPU
/// sampler's order (finite values only, higher first, ties to the lower index); index -1 fills
/// the slots past the number of finite values.
pub fn top_k(x: &[f32], k: usize) -> Result<(Vec<(i32, f32)>, EmuStats), EmuError> {
    need(
        "top_k",
        !x.is_empty() && x.len() <= i32::MAX as usize && (1..=top_k_max()).contains(&k),
        || format!("{} values, k = {k}", x.len()),
    )?;
    let g = x.len().div_ceil(top_k_slice());
    let (mut cv, mut ci) = (vec![f32::NAN; g * k], vec![i32::MIN; g * k]);
    let (mut ov, mut oi) = (vec![f32::NAN; k], vec![i32::MIN; k]);
    // The row at an aligned address, as a device allocation is (the sector counts depend on it).
    let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let xa = Aligned::new(&bytes);
    let s = emu::counted(
        "top_k",
        &[(emu::region::X, xa.as_ptr(), 4 * x.len())],
        || {
            // SAFETY: xa holds the n values of x; the candidates g * k, the outputs k.
            unsafe {
                pn_emu_topk(
                    xa.as_ptr().cast(),
                    x.len() as i32,
                    k as i32,
                    cv.as_mut_ptr(),
                    ci.as_mut_ptr(),
                    ov.as_mut_ptr(),
                    oi.as_mut_ptr(),
                )
            }
        },
    )?;
    Ok((oi.into_iter().zip(ov).collect(), s))
}

/// [`emu::attention`] with `grid_t` blocks on the token dimension (grid z of the partials, y of
/// the combine): fewer than `c.t` shows the kernels' grid stride.
pub fn attention_grid(
    c: &emu::AttnCall,
    q: &[f32],
    kc: &[u8],
    vc: &[u8],
    o: &mut [f32],
    grid_t: u32,
) -> Result<EmuStats, EmuError> {
    let hd = c.n_head * 256;
    let need_b = c.kv.bytes(c.p0 + c.t);
    need(
        "attention",
        q.len() >= c.t * hd
            && o.len() >= c.t * hd
            && c.group > 0
            && c.n_head == c.group * c.kv.n_kv
            && kc.len() >= need_b
            && vc.len() >= need_b
            && c.n_split * c.chunk >= c.p0 + c.t
            && (0..4).contains(&c.kv.kv_type)
            && grid_t >= 1,
        || {
            format!(
                "shape {c:?}: q/o {} / {}, caches {} bytes (need {need_b})",
                q.len(),
                o.len(),
                kc.len()
            )
        },
    )?;
    let mut part_o = vec![0f32; c.t * c.n_head * c.n_split * 256];
    let mut part_ml = vec![0f32; c.t * c.n_head * c.n_split * 2];
    emu::counted("attention", &[], || {
        // SAFETY: the caches cover p0 + t positions at the strides; scratch sized above.
        unsafe {
            pn_emu_attention_grid(
                c.kv.kv_type,
                q.as_ptr(),
                hd as i64,
                256,
                kc.as_ptr().cast(),
                vc.as_ptr().cast(),
                c.kv.pos_stride as i64,
                c.kv.head_stride as i64,
                c.n_head as i32,
                c.group as i32,
                c.p0 as i32,
                c.t as i32,
                c.n_split as i32,
                c.chunk as i32,
                c.scale,
                part_o.as_mut_ptr(),
                part_ml.as_mut_ptr(),
                o.as_mut_ptr(),
                hd as i64,
                grid_t,
            )
        }
    })
}

/// [`emu::kv_store`] with `grid_t` blocks on grid y (fewer than the tokens: the grid stride).
pub fn kv_store_grid(
    g: &KvGeom,
    k: &[f32],
    v: &[f32],
    kc: &mut [u8],
    vc: &mut [u8],
    p0: usize,
    grid_t: u32,
) -> Result<EmuStats, EmuError> {
    let t = k.len() / (g.n_kv * 256);
    let need_b = g.bytes(p0 + t);
    need(
        "kv_store",
        v.len() >= k.len()
            && t > 0
            && kc.len() >= need_b
            && vc.len() >= need_b
            && (0..4).contains(&g.kv_type)
            && grid_t >= 1,
        || {
            format!(
                "{t} tokens, caches {} / {} bytes, need {need_b}",
                kc.len(),
                vc.len()
            )
        },
    )?;
    emu::counted("kv_store", &[], || {
        // SAFETY: the caches cover p0 + t positions at the given strides (checked above).
        unsafe {
            pn_emu_kv_store_grid(
                g.kv_type,
                k.as_ptr(),
                v.as_ptr(),
                (g.n_kv * 256) as i64,
                kc.as_mut_ptr().cast(),
                vc.as_mut_ptr().cast(),
                g.pos_stride as i64,
                g.head_stride as i64,
                p0 as i32,
                g.n_kv as i32,
                t as i32,
                grid_t,
            )
        }
    })
}
