//! The grouped PN GEMV (`pn_gemv_h2p_group`, kernels/pn_gemv.cu) run by the emulator: several
//! matrices that read one prepared x in one launch.

use super::{counted, need, region, Aligned, EmuError, EmuStats};
use crate::launch::{GroupLaunch, PN_GROUP_MAX};
use std::ffi::c_void;

/// `PnGroup` of pn_gemv.cu (pointers, rows, kinds, first blocks, count), as the launch passes
/// it by value.
#[repr(C)]
struct GroupC {
    w: [*const c_void; PN_GROUP_MAX],
    y: [*mut f32; PN_GROUP_MAX],
    n: [i32; PN_GROUP_MAX],
    kind: [i32; PN_GROUP_MAX],
    first: [i32; PN_GROUP_MAX + 1],
    count: i32,
}

extern "C" {
    fn pn_emu_pn_gemv_group(
        group: *const GroupC,
        xh: *const c_void,
        e: *const i32,
        k: i32,
        grid: u32,
        threads: u32,
        smem: u32,
    ) -> i32;
}

/// One member of a grouped launch: its weights (`n` rows of `k` PN elements of `bits`) and its
/// output (`n` values).
pub struct GroupMember<'a> {
    /// Code width (3 or 4).
    pub bits: u32,
    /// The matrix bytes.
    pub w: &'a [u8],
    /// Its output.
    pub y: &'a mut [f32],
}

/// Runs `g` ([`crate::launch::pn_group`] for these members) on the prepared x (`xh`: `k`
/// halves, `e`: its exponent). The members' weights are laid out one after another in one
/// 128-byte aligned buffer (each padded to 128 bytes), registered as [`region::WEIGHT`]; xh as
/// [`region::X`].
pub fn pn_gemv_group(
    g: &GroupLaunch,
    members: &mut [GroupMember<'_>],
    (xh, e): (&[u16], i32),
    k: usize,
) -> Result<EmuStats, EmuError> {
    const K: &str = "pn_gemv_h2p_group";
    need(
        K,
        members.len() == g.kinds.len()
            && (2..=PN_GROUP_MAX).contains(&members.len())
            && xh.len() >= k,
        || {
            format!(
                "{} members for a launch of {}",
                members.len(),
                g.kinds.len()
            )
        },
    )?;
    let mut all = Vec::new();
    let mut offsets = Vec::new();
    for m in members.iter() {
        let wpb = if m.bits == 3 { 80 } else { 64 };
        let n = m.y.len();
        need(
            K,
            k.is_multiple_of(2 * wpb) && m.w.len() >= n * k / wpb * 34,
            || format!("member of {n} rows: {} weight bytes for k = {k}", m.w.len()),
        )?;
        offsets.push(all.len());
        all.extend_from_slice(&m.w[..n * k / wpb * 34]);
        all.resize(all.len().next_multiple_of(128), 0);
    }
    let wa = Aligned::new(&all);
    let mut c = GroupC {
        w: [std::ptr::null(); PN_GROUP_MAX],
        y: [std::ptr::null_mut(); PN_GROUP_MAX],
        n: [0; PN_GROUP_MAX],
        kind: [0; PN_GROUP_MAX],
        first: [0; PN_GROUP_MAX + 1],
        count: members.len() as i32,
    };
    for (i, m) in members.iter_mut().enumerate() {
        // SAFETY: offsets[i] lies inside `all`, which `wa` copies.
        c.w[i] = unsafe { wa.as_ptr().cast::<u8>().add(offsets[i]) }.cast();
        c.y[i] = m.y.as_mut_ptr();
        c.n[i] = m.y.len() as i32;
        c.kind[i] = g.kinds[i];
    }
    for (slot, f) in c.first.iter_mut().zip(&g.first) {
        *slot = *f;
    }
    let e = [e];
    counted(
        K,
        &[
            (region::WEIGHT, wa.as_ptr(), all.len()),
            (region::X, xh.as_ptr().cast(), 2 * k),
        ],
        || {
            // SAFETY: every member's weights and output are sized for its rows (checked);
            // `c`, xh and e live across the call.
            unsafe {
                pn_emu_pn_gemv_group(
                    &c,
                    xh.as_ptr().cast(),
                    e.as_ptr(),
                    k as i32,
                    g.grid,
                    g.threads,
                    g.smem,
                )
            }
        },
    )
}
