//! The fused mixer kernels (`host/emu_mixer.cpp`: `kernels/mixer.cu`; the L2-normalising delta
//! rule of `kernels/delta_rule.cu` from `host/emu_ops.cpp`) run on the host by the SIMT
//! emulator with the CUDA wrappers' launch geometry (see [`crate::emu`]). For the host tests;
//! not a production API.

use crate::emu::Prepared;
use crate::emu::{self, need, EmuError, EmuStats};
use crate::mixer_types::{rotation_scale, GateRotation, GatedNormRotation, QkL2, QkNormRopeShape};
use crate::types::{DeltaRuleInputs, DeltaRuleShape};
use std::ffi::c_void;

#[allow(clippy::too_many_arguments)] // the C side mirrors the kernels' own parameter lists
extern "C" {
    fn pn_emu_qk_norm_rope(
        q: *mut f32,
        q_ts: i64,
        q_hs: i64,
        k: *mut f32,
        k_ts: i64,
        k_hs: i64,
        wq: *const f32,
        wk: *const f32,
        n_q: i32,
        n_k: i32,
        n: i32,
        eps: f32,
        pos0: i32,
        n_rot: i32,
        base: f32,
        n_tokens: i32,
        grid_y: u32,
    ) -> i32;
    fn pn_emu_sigmoid_gate_hadamard(
        x: *const f32,
        g: *const f32,
        out: *mut f32,
        hd: i32,
        n_heads: i32,
        g_ts: i64,
        g_hs: i64,
        r: i32,
        scale: f32,
        grid: u32,
    ) -> i32;
    fn pn_emu_gated_rms_norm_hadamard(
        o: *const f32,
        z: *const f32,
        w: *const f32,
        out: *mut f32,
        n: i32,
        eps: f32,
        span: i32,
        r: i32,
        scale: f32,
        grid: u32,
        xh: *mut c_void,
        e: *mut i32,
        sync: *mut u32,
        row_len: i32,
    ) -> i32;
    fn pn_emu_attn_combine_gate_hadamard(
        part_o: *const f32,
        part_ml: *const f32,
        n_split: i32,
        n_head: i32,
        g: *const f32,
        g_ts: i64,
        g_hs: i64,
        out: *mut f32,
        r: i32,
        scale: f32,
        grid: u32,
        xh: *mut c_void,
        e: *mut i32,
        sync: *mut u32,
    ) -> i32;
    fn pn_emu_delta_rule_conv(
        c: *const DrConvC,
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
        q_scale: f32,
        eps: f32,
    ) -> i32;
    fn pn_emu_attn_combine(
        part_o: *const f32,
        part_ml: *const f32,
        n_split: i32,
        n_head: i32,
        o: *mut f32,
        t: i32,
    ) -> i32;
    fn pn_emu_delta_rule_l2(
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
        q_scale: f32,
        eps: f32,
    ) -> i32;
}

/// `qk_norm_rope_f32` in place on `q` and `k` (norm weights `wq`, `wk` of `head_dim`), on a
/// grid of `grid_y` token blocks (below `s.n_tokens` the kernel strides).
pub fn qk_norm_rope(
    s: &QkNormRopeShape,
    (q, k): (&mut [f32], &mut [f32]),
    (wq, wk): (&[f32], &[f32]),
    grid_y: u32,
) -> Result<EmuStats, EmuError> {
    const K: &str = "qk_norm_rope_f32";
    if let Some(why) = s.refusal() {
        return Err(EmuError::Shape {
            kernel: K.into(),
            what: why,
        });
    }
    need(
        K,
        q.len() >= s.q_len()
            && k.len() >= s.k_len()
            && wq.len() >= s.head_dim
            && wk.len() >= s.head_dim
            && grid_y > 0,
        || format!("buffers short for {s:?}"),
    )?;
    emu::counted(K, &[], || {
        // SAFETY: every length the kernel reads or writes is checked above.
        unsafe {
            pn_emu_qk_norm_rope(
                q.as_mut_ptr(),
                s.q_tok_stride as i64,
                s.q_head_stride as i64,
                k.as_mut_ptr(),
                s.k_tok_stride as i64,
                s.k_head_stride as i64,
                wq.as_ptr(),
                wk.as_ptr(),
                s.n_q_heads as i32,
                s.n_k_heads as i32,
                s.head_dim as i32,
                s.eps,
                s.pos0 as i32,
                s.n_rot as i32,
                s.base,
                s.n_tokens as i32,
                grid_y,
            )
        }
    })
}

/// `sigmoid_gate_hadamard_f32`: `out = H(x * sigmoid(g))` laid out as `s`.
pub fn sigmoid_gate_hadamard(
    s: &GateRotation,
    x: &[f32],
    g: &[f32],
    out: &mut [f32],
) -> Result<EmuStats, EmuError> {
    const K: &str = "sigmoid_gate_hadamard_f32";
    if let Some(why) = s.refusal() {
        return Err(EmuError::Shape {
            kernel: K.into(),
            what: why,
        });
    }
    need(
        K,
        x.len() >= s.len && out.len() >= s.len && g.len() >= s.gate_len(),
        || format!("buffers short for {s:?}"),
    )?;
    emu::counted(K, &[], || {
        // SAFETY: every length the kernel reads or writes is checked above.
        unsafe {
            pn_emu_sigmoid_gate_hadamard(
                x.as_ptr(),
                g.as_ptr(),
                out.as_mut_ptr(),
                s.head_dim as i32,
                s.n_heads as i32,
                s.gate_tok_stride as i64,
                s.gate_head_stride as i64,
                s.block as i32,
                rotation_scale(s.block),
                (s.len / s.block) as u32,
            )
        }
    })
}

/// `gated_rms_norm_hadamard_f32`: `out = H(rms(o) * w * silu(z))` laid out as `s`.
pub fn gated_rms_norm_hadamard(
    s: &GatedNormRotation,
    (o, z, w): (&[f32], &[f32], &[f32]),
    out: &mut [f32],
) -> Result<EmuStats, EmuError> {
    gated_rms_norm_hadamard_into(s, (o, z, w), out, None)
}

/// [`gated_rms_norm_hadamard`] that also writes the prepared fp16 copy of each row of
/// `row_len` values (the bits of `pn_prepare_x_h2` on `out`'s rows), as the decode path feeds
/// ssm_out. Fails if the kernel leaves its sync words non-zero.
pub fn gated_rms_norm_hadamard_prep(
    s: &GatedNormRotation,
    (o, z, w): (&[f32], &[f32], &[f32]),
    out: &mut [f32],
    row_len: usize,
) -> Result<(EmuStats, Prepared), EmuError> {
    const K: &str = "gated_rms_norm_hadamard_f32";
    need(
        K,
        row_len > 0 && row_len.is_multiple_of(s.span()) && s.len.is_multiple_of(row_len),
        || format!("rows of {row_len} are not whole spans of {s:?}"),
    )?;
    let mut p = RowPrep::new(s.len / row_len, row_len);
    let st = gated_rms_norm_hadamard_into(s, (o, z, w), out, Some((&mut p, row_len)))?;
    p.finish(K).map(|p| (st, p))
}

fn gated_rms_norm_hadamard_into(
    s: &GatedNormRotation,
    (o, z, w): (&[f32], &[f32], &[f32]),
    out: &mut [f32],
    prep: Option<(&mut RowPrep, usize)>,
) -> Result<EmuStats, EmuError> {
    const K: &str = "gated_rms_norm_hadamard_f32";
    if let Some(why) = s.refusal() {
        return Err(EmuError::Shape {
            kernel: K.into(),
            what: why,
        });
    }
    need(
        K,
        o.len() >= s.len && z.len() >= s.len && out.len() >= s.len && w.len() >= s.n,
        || format!("buffers short for {s:?}"),
    )?;
    let span = s.span();
    let row_len = prep.as_ref().map_or(0, |p| p.1);
    let (xh, e, sync) = RowPrep::ptrs(prep.map(|p| p.0));
    emu::counted(K, &[], || {
        // SAFETY: every length the kernel reads or writes is checked above.
        unsafe {
            pn_emu_gated_rms_norm_hadamard(
                o.as_ptr(),
                z.as_ptr(),
                w.as_ptr(),
                out.as_mut_ptr(),
                s.n as i32,
                s.eps,
                span as i32,
                s.block as i32,
                rotation_scale(s.block),
                (s.len / span) as u32,
                xh,
                e,
                sync,
                row_len as i32,
            )
        }
    })
}

/// The fp16 copy a mixer kernel writes for its rows, and the zeroed sync words it counts on.
struct RowPrep {
    xh: Vec<u16>,
    e: Vec<i32>,
    sync: Vec<u32>,
}

impl RowPrep {
    fn new(rows: usize, row_len: usize) -> RowPrep {
        RowPrep {
            xh: vec![0; rows * row_len],
            e: vec![i32::MIN; rows],
            sync: vec![0; 2 * rows],
        }
    }
    /// The pointers of `p` (null without one) for the C launch.
    fn ptrs(p: Option<&mut RowPrep>) -> (*mut c_void, *mut i32, *mut u32) {
        match p {
            Some(p) => (
                p.xh.as_mut_ptr().cast(),
                p.e.as_mut_ptr(),
                p.sync.as_mut_ptr(),
            ),
            None => (
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            ),
        }
    }
    fn finish(self, kernel: &str) -> Result<Prepared, EmuError> {
        need(kernel, self.sync.iter().all(|&w| w == 0), || {
            format!("sync words left at {:?}", self.sync)
        })?;
        Ok(Prepared {
            xh: self.xh,
            e: self.e,
        })
    }
}

/// `delta_rule_l2_f32`: [`crate::emu_ops::delta_rule`] on raw q and k, normalised as `l2`
/// says inside the kernel.
pub fn delta_rule_l2(
    x: &DeltaRuleInputs<&[f32]>,
    s: &DeltaRuleShape,
    l2: QkL2,
    state: &mut [f32],
    out: &mut [f32],
) -> Result<EmuStats, EmuError> {
    crate::emu_ops::check_delta_rule("delta_rule_l2_f32", x, s, state, out)?;
    let (nv, nk, t) = (s.n_v_heads, s.n_k_heads, s.t_len);
    emu::counted("delta_rule_l2_f32", &[], || {
        // SAFETY: every length the kernel reads or writes is checked above.
        unsafe {
            pn_emu_delta_rule_l2(
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
                l2.q_scale,
                l2.eps,
            )
        }
    })
}

/// The split-K partials of one attention call: `part_o` `[T][n_head][n_split][256]`,
/// `part_ml` `[T][n_head][n_split][2]` (max, sum).
#[derive(Clone, Copy, Debug)]
pub struct AttnPartials<'a> {
    /// Partial outputs.
    pub part_o: &'a [f32],
    /// (max, sum) per split.
    pub part_ml: &'a [f32],
    /// Splits per (token, head).
    pub n_split: usize,
}

impl AttnPartials<'_> {
    fn check(&self, kernel: &str, rows: usize) -> Result<(), EmuError> {
        let n = rows * self.n_split;
        need(
            kernel,
            self.n_split > 0 && self.part_o.len() >= n * 256 && self.part_ml.len() >= 2 * n,
            || format!("partials short for {rows} rows of {} splits", self.n_split),
        )
    }
}

/// `attn_combine_gate_hadamard_f32`: `out = H(combine(p) * sigmoid(g))` laid out as `s`
/// (`s.head_dim` 256, `s.len` = T * n_heads * 256).
pub fn attn_combine_gate_hadamard(
    p: &AttnPartials<'_>,
    s: &GateRotation,
    g: &[f32],
    out: &mut [f32],
) -> Result<EmuStats, EmuError> {
    attn_combine_gate_hadamard_into(p, s, g, out, None)
}

/// [`attn_combine_gate_hadamard`] that also writes the prepared fp16 copy of each token's row
/// (`n_heads * 256` values, the bits of `pn_prepare_x_h2` on `out`'s rows), as the decode path
/// feeds the o-projection. Fails if the kernel leaves its sync words non-zero.
pub fn attn_combine_gate_hadamard_prep(
    p: &AttnPartials<'_>,
    s: &GateRotation,
    g: &[f32],
    out: &mut [f32],
) -> Result<(EmuStats, Prepared), EmuError> {
    const K: &str = "attn_combine_gate_hadamard_f32";
    let row = s.n_heads * 256;
    need(
        K,
        row > 0 && row.is_multiple_of(s.block) && s.len.is_multiple_of(row),
        || format!("token rows of {row} are not whole blocks of {s:?}"),
    )?;
    let mut rp = RowPrep::new(s.len / row, row);
    let st = attn_combine_gate_hadamard_into(p, s, g, out, Some(&mut rp))?;
    rp.finish(K).map(|rp| (st, rp))
}

fn attn_combine_gate_hadamard_into(
    p: &AttnPartials<'_>,
    s: &GateRotation,
    g: &[f32],
    out: &mut [f32],
    prep: Option<&mut RowPrep>,
) -> Result<EmuStats, EmuError> {
    const K: &str = "attn_combine_gate_hadamard_f32";
    if let Some(why) = s.refusal() {
        return Err(EmuError::Shape {
            kernel: K.into(),
            what: why,
        });
    }
    need(
        K,
        s.head_dim == 256 && out.len() >= s.len && g.len() >= s.gate_len(),
        || format!("heads of 256 and buffers for {s:?}"),
    )?;
    p.check(K, s.len / 256)?;
    let (xh, e, sync) = RowPrep::ptrs(prep);
    emu::counted(K, &[], || {
        // SAFETY: every length the kernel reads or writes is checked above.
        unsafe {
            pn_emu_attn_combine_gate_hadamard(
                p.part_o.as_ptr(),
                p.part_ml.as_ptr(),
                p.n_split as i32,
                s.n_heads as i32,
                g.as_ptr(),
                s.gate_tok_stride as i64,
                s.gate_head_stride as i64,
                out.as_mut_ptr(),
                s.block as i32,
                rotation_scale(s.block),
                (s.len / s.block) as u32,
                xh,
                e,
                sync,
            )
        }
    })
}

/// `attn_combine` (attention.cu) alone: the merged output `o` `[t][n_head][256]`.
pub fn attn_combine(
    p: &AttnPartials<'_>,
    (t, n_head): (usize, usize),
    o: &mut [f32],
) -> Result<EmuStats, EmuError> {
    const K: &str = "attn_combine";
    need(
        K,
        t > 0 && n_head > 0 && o.len() >= t * n_head * 256,
        || format!("o has {} floats for {t} x {n_head} heads", o.len()),
    )?;
    p.check(K, t * n_head)?;
    emu::counted(K, &[], || {
        // SAFETY: lengths checked above.
        unsafe {
            pn_emu_attn_combine(
                p.part_o.as_ptr(),
                p.part_ml.as_ptr(),
                p.n_split as i32,
                n_head as i32,
                o.as_mut_ptr(),
                t as i32,
            )
        }
    })
}

/// The conv half of `delta_rule_conv_f32`'s arguments (layout of `PnDrConvArgs` in
/// host/emu_delta_conv.cpp).
#[repr(C)]
struct DrConvC {
    u: *const f32,
    u_stride: i64,
    w: *const f32,
    state: *mut f32,
    y: *mut f32,
    y_stride: i64,
    sync: *mut u32,
    c: i32,
    kd: i32,
}

/// The conv1d of [`delta_rule_conv`]: raw input rows `u` `[t][channels]`, weights `w`
/// `[channels][4]`, the state `[3][channels]` (shifted) and the output rows `y` (written as
/// `conv1d_silu_f32` writes them).
pub struct ConvRows<'a> {
    /// Conv input rows.
    pub u: &'a [f32],
    /// Conv weights.
    pub w: &'a [f32],
    /// Conv state.
    pub state: &'a mut [f32],
    /// Conv output rows.
    pub y: &'a mut [f32],
}

/// `delta_rule_conv_f32`: `conv1d_silu_f32` of `c` then [`delta_rule_l2`] of its output in one
/// launch, with the gates of `x` (its q/k/v are not read; the conv rows are `s.qk_stride`
/// channels, [`crate::delta_rule_conv_refusal`]). Fails if the kernel leaves its sync words
/// non-zero.
pub fn delta_rule_conv(
    c: ConvRows<'_>,
    x: &DeltaRuleInputs<&[f32]>,
    s: &DeltaRuleShape,
    l2: QkL2,
    (state, out): (&mut [f32], &mut [f32]),
) -> Result<EmuStats, EmuError> {
    const K: &str = "delta_rule_conv_f32";
    if let Some(why) = crate::delta_rule_conv_refusal(s) {
        return Err(EmuError::Shape {
            kernel: K.into(),
            what: why,
        });
    }
    crate::emu_ops::check_delta_rule(K, x, s, state, out)?;
    let ch = s.qk_stride;
    let rows = s.t_len * ch;
    need(
        K,
        c.u.len() >= rows && c.y.len() >= rows && c.w.len() >= 4 * ch && c.state.len() >= 3 * ch,
        || format!("conv buffers short for {} rows of {ch}", s.t_len),
    )?;
    let mut sync = vec![0u32; s.n_k_heads];
    let cc = DrConvC {
        u: c.u.as_ptr(),
        u_stride: ch as i64,
        w: c.w.as_ptr(),
        state: c.state.as_mut_ptr(),
        y: c.y.as_mut_ptr(),
        y_stride: ch as i64,
        sync: sync.as_mut_ptr(),
        c: ch as i32,
        kd: (s.n_k_heads * 128) as i32,
    };
    let st = emu::counted(K, &[], || {
        // SAFETY: every length the kernel reads or writes is checked above; `cc` and `sync`
        // live across the call.
        unsafe {
            pn_emu_delta_rule_conv(
                &cc,
                x.beta_raw.as_ptr(),
                x.alpha_raw.as_ptr(),
                s.ab_stride as i64,
                x.dt_bias.as_ptr(),
                x.ssm_a.as_ptr(),
                state.as_mut_ptr(),
                out.as_mut_ptr(),
                s.out_stride as i64,
                s.n_v_heads as i32,
                s.n_k_heads as i32,
                s.t_len as i32,
                l2.q_scale,
                l2.eps,
            )
        }
    })?;
    need(K, sync.iter().all(|&w| w == 0), || {
        format!("sync words left at {sync:?}")
    })?;
    Ok(st)
}
