//! The decode delta rule that runs its conv1d itself (`delta_rule_conv_f32` in
//! `kernels/delta_rule.cu`): `conv1d_silu` and `delta_rule_l2` in one launch.

use super::{drv, Gpu};
use crate::error::{check, KernelError};
use crate::mixer_types::{delta_rule_conv_refusal, QkL2};
use crate::types::DeltaRuleShape;
use cudarc::driver::{CudaView, CudaViewMut, DevicePtr, DevicePtrMut, PushKernelArg};

/// `DrConv` of delta_rule.cu, passed by value (device addresses as u64).
#[repr(C)]
#[derive(Clone, Copy)]
struct DrConvArg {
    u: u64,
    u_stride: i64,
    w: u64,
    state: u64,
    y: u64,
    y_stride: i64,
    sync: u64,
    c: i32,
    kd: i32,
}

// SAFETY: plain old data with the C layout of DrConv.
unsafe impl cudarc::driver::DeviceRepr for DrConvArg {}

/// The conv1d half of [`Gpu::delta_rule_conv`]: rows of `channels` (`q | k | v`).
pub struct ConvViews<'a, 'b> {
    /// Raw conv input rows `[t][channels]`.
    pub u: &'a CudaView<'b, f32>,
    /// Conv weights `[channels][4]`.
    pub w: &'a CudaView<'b, f32>,
    /// Conv state `[3][channels]`, shifted as `conv1d_silu` shifts it.
    pub state: &'a mut CudaViewMut<'b, f32>,
    /// Conv output rows `[t][channels]`, written as `conv1d_silu` writes them.
    pub y: &'a mut CudaViewMut<'b, f32>,
    /// One counter per key head, zero before the launch (left zero).
    pub sync: &'a mut CudaViewMut<'b, u32>,
}

/// The gates of [`Gpu::delta_rule_conv`] (as in [`crate::DeltaRuleInputs`]): raw beta and
/// alpha rows, `dt_bias` and `ssm_a` per value head.
pub struct DeltaGates<'a, 'b> {
    /// Raw beta `[t][ab_stride]`.
    pub beta_raw: &'a CudaView<'b, f32>,
    /// Raw alpha, alike.
    pub alpha_raw: &'a CudaView<'b, f32>,
    /// `[n_v_heads]`.
    pub dt_bias: &'a CudaView<'b, f32>,
    /// `[n_v_heads]`.
    pub ssm_a: &'a CudaView<'b, f32>,
}

impl Gpu {
    /// [`Gpu::conv1d_silu`] (kernel 4) of `c` then [`Gpu::delta_rule_l2`] of its output, in one
    /// launch with their bits (q, k and v are the conv's output); `s` as
    /// [`delta_rule_conv_refusal`] takes it.
    pub fn delta_rule_conv(
        &self,
        c: ConvViews<'_, '_>,
        x: &DeltaGates<'_, '_>,
        (s, l2): (&DeltaRuleShape, QkL2),
        state: &mut CudaViewMut<'_, f32>,
        out: &mut CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "delta_rule_conv";
        const K: &str = "delta_rule_conv_f32";
        check(delta_rule_conv_refusal(s).is_none(), OP, || {
            delta_rule_conv_refusal(s).unwrap_or_default()
        })?;
        let (ch, t, nv, nk) = (s.qk_stride, s.t_len, s.n_v_heads, s.n_k_heads);
        check(
            c.u.len() >= t * ch
                && c.y.len() >= t * ch
                && c.w.len() >= 4 * ch
                && c.state.len() >= 3 * ch
                && c.sync.len() >= nk,
            OP,
            || format!("conv buffers short for {t} rows of {ch} channels, {nk} key heads"),
        )?;
        let t1 = t - 1;
        check(
            x.beta_raw.len() >= t1 * s.ab_stride + nv
                && x.alpha_raw.len() >= t1 * s.ab_stride + nv
                && x.dt_bias.len() >= nv
                && x.ssm_a.len() >= nv
                && state.len() >= nv * 128 * 128
                && out.len() >= t1 * s.out_stride + nv * 128,
            OP,
            || format!("gate, state or output buffers short for {s:?}"),
        )?;
        let (up, gu) = c.u.device_ptr(&self.stream);
        let (wp, gw) = c.w.device_ptr(&self.stream);
        let (sp, gs) = c.state.device_ptr_mut(&self.stream);
        let (yp, gy) = c.y.device_ptr_mut(&self.stream);
        let (syp, gsy) = c.sync.device_ptr_mut(&self.stream);
        let arg = DrConvArg {
            u: up,
            u_stride: ch as i64,
            w: wp,
            state: sp,
            y: yp,
            y_stride: ch as i64,
            sync: syp,
            c: ch as i32,
            kd: (nk * 128) as i32,
        };
        let f = self.func("delta_rule", K)?;
        let (abs, os, nk_i, t_i) = (s.ab_stride as i64, s.out_stride as i64, nk as i32, t as i32);
        let mut b = self.stream.launch_builder(f);
        b.arg(&arg)
            .arg(x.beta_raw)
            .arg(x.alpha_raw)
            .arg(&abs)
            .arg(x.dt_bias)
            .arg(x.ssm_a)
            .arg(state)
            .arg(out)
            .arg(&os)
            .arg(&nk_i)
            .arg(&t_i)
            .arg(&l2.q_scale)
            .arg(&l2.eps);
        // SAFETY: (DrConv, b, al, ab_stride, dt_bias, ssm_a, state, out, out_stride, n_k_heads,
        // T, q_scale, eps) as declared; lengths checked; the conv views stay borrowed (their
        // guards) until the launch is enqueued.
        unsafe { b.launch(Self::cfg((nv as u32, 1, 1), 256, 0)) }.map_err(drv(K))?;
        drop((gu, gw, gs, gy, gsy));
        Ok(())
    }
}
