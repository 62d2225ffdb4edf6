//! The gated delta rule of the GDN layers: the token-by-token recurrence
//! (`kernels/delta_rule.cu`) and its chunked form for prefill (`kernels/delta_rule_chunked.cu`).

use super::{drv, Gpu};
use crate::error::{check, KernelError};
use crate::mixer_types::QkL2;
use crate::types::{DeltaRuleInputs, DeltaRuleShape};
use cudarc::driver::{CudaView, CudaViewMut, PushKernelArg};

/// Value columns per block of the chunked delta-rule kernel (`PN_GDN_JB`).
const DELTA_RULE_COLUMNS: usize = 32;

/// The inputs of [`Gpu::delta_rule`] as device views.
pub type DeltaRuleViews<'a, 'b> = DeltaRuleInputs<&'a CudaView<'b, f32>>;

impl Gpu {
    /// Gated delta rule over `s.t_len` tokens for `s.n_v_heads` value heads of 128 (key heads
    /// of 128, head `p % n_k_heads`), fp32 `state` `[n_v_heads][128 (j)][128 (i)]` updated in
    /// place, outputs into `out`. Walks the tokens one by one (exact recurrence): decode and
    /// short inputs.
    pub fn delta_rule(
        &self,
        x: &DeltaRuleViews<'_, '_>,
        s: &DeltaRuleShape,
        state: &mut CudaViewMut<'_, f32>,
        out: &mut CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        self.delta_rule_launch((false, None), x, s, state, out)
    }

    /// [`Gpu::delta_rule`] on raw q and k heads (read, not written), each L2-normalised inside
    /// the kernel as `l2` says: decode without the two norm launches before it.
    pub fn delta_rule_l2(
        &self,
        x: &DeltaRuleViews<'_, '_>,
        s: &DeltaRuleShape,
        l2: QkL2,
        state: &mut CudaViewMut<'_, f32>,
        out: &mut CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        self.delta_rule_launch((false, Some(l2)), x, s, state, out)
    }

    /// [`Gpu::delta_rule`] in the chunked form (chunks of [`crate::DELTA_RULE_CHUNK`] tokens,
    /// the tail chunk shorter): same arguments, outputs and final state up to fp32 rounding,
    /// for prefill.
    pub fn delta_rule_chunked(
        &self,
        x: &DeltaRuleViews<'_, '_>,
        s: &DeltaRuleShape,
        state: &mut CudaViewMut<'_, f32>,
        out: &mut CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        self.delta_rule_launch((true, None), x, s, state, out)
    }

    /// The launch of one of the kernels: chunked, or token by token (normalising q and k
    /// when `l2` is given).
    fn delta_rule_launch(
        &self,
        (chunked, l2): (bool, Option<QkL2>),
        x: &DeltaRuleViews<'_, '_>,
        s: &DeltaRuleShape,
        state: &mut CudaViewMut<'_, f32>,
        out: &mut CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "delta_rule";
        let DeltaRuleShape {
            qk_stride,
            v_stride,
            ab_stride,
            out_stride,
            n_v_heads,
            n_k_heads,
            t_len,
        } = *s;
        check(n_k_heads > 0 && n_v_heads > 0 && t_len > 0, OP, || {
            format!("heads {n_v_heads}/{n_k_heads}, t {t_len}")
        })?;
        let t1 = t_len - 1;
        check(
            x.q.len() >= t1 * qk_stride + n_k_heads * 128
                && x.k.len() >= t1 * qk_stride + n_k_heads * 128,
            OP,
            || "q/k too short".into(),
        )?;
        check(x.v.len() >= t1 * v_stride + n_v_heads * 128, OP, || {
            "v too short".into()
        })?;
        check(
            x.beta_raw.len() >= t1 * ab_stride + n_v_heads
                && x.alpha_raw.len() >= t1 * ab_stride + n_v_heads,
            OP,
            || "beta/alpha too short".into(),
        )?;
        check(
            x.dt_bias.len() >= n_v_heads && x.ssm_a.len() >= n_v_heads,
            OP,
            || "dt_bias/ssm_a too short".into(),
        )?;
        check(state.len() >= n_v_heads * 128 * 128, OP, || {
            format!(
                "state has {} floats, needs {}",
                state.len(),
                n_v_heads * 128 * 128
            )
        })?;
        check(out.len() >= t1 * out_stride + n_v_heads * 128, OP, || {
            "out too short".into()
        })?;
        let (module, kernel, grid) = if chunked {
            let slices = (128 / DELTA_RULE_COLUMNS) as u32;
            (
                "delta_rule_chunked",
                "delta_rule_chunked_f32",
                (n_v_heads as u32, slices, 1),
            )
        } else if l2.is_some() {
            ("delta_rule", "delta_rule_l2_f32", (n_v_heads as u32, 1, 1))
        } else {
            ("delta_rule", "delta_rule_f32", (n_v_heads as u32, 1, 1))
        };
        let f = self.func(module, kernel)?;
        let (qks, vs, abs, os) = (
            qk_stride as i64,
            v_stride as i64,
            ab_stride as i64,
            out_stride as i64,
        );
        let (nk, t_i) = (n_k_heads as i32, t_len as i32);
        let mut b = self.stream.launch_builder(f);
        b.arg(x.q)
            .arg(x.k)
            .arg(&qks)
            .arg(x.v)
            .arg(&vs)
            .arg(x.beta_raw)
            .arg(x.alpha_raw)
            .arg(&abs)
            .arg(x.dt_bias)
            .arg(x.ssm_a)
            .arg(state)
            .arg(out)
            .arg(&os)
            .arg(&nk)
            .arg(&t_i);
        if let Some(QkL2 { q_scale, eps }) = &l2 {
            b.arg(q_scale).arg(eps);
        }
        // SAFETY: arguments as declared; lengths checked.
        unsafe { b.launch(Self::cfg(grid, 256, 0)) }.map_err(drv(kernel))?;
        Ok(())
    }
}
