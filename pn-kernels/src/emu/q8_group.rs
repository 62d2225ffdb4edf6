//! The grouped Q8_0 GEMV (`q8_0_gemv_group`, kernels/q8_group.cu) run by the emulator: several
//! Q8_0 matrices that read one f32 x in one launch.

use super::{counted, need, region, Aligned, EmuError, EmuStats};
use crate::q8_group::{Q8GroupLaunch, Q8_GROUP_MAX};
use std::ffi::c_void;

/// `Q8Group` of q8_group.cu (pointers, rows, first blocks, count), passed by value.
#[repr(C)]
struct Q8GroupC {
    w: [*const c_void; Q8_GROUP_MAX],
    y: [*mut f32; Q8_GROUP_MAX],
    n: [i32; Q8_GROUP_MAX],
    first: [i32; Q8_GROUP_MAX + 1],
    count: i32,
}

extern "C" {
    fn pn_emu_q8_0_gemv_group(
        group: *const Q8GroupC,
        x: *const f32,
        k: i32,
        grid: u32,
        threads: u32,
        smem: u32,
    ) -> i32;
}

/// Runs `g` ([`crate::q8_group::q8_group`] for these members) on `x` (`k` floats): member i's
/// weights `ws[i].0` (`ys[i].len()` rows of `k / 32` 34-byte blocks) into `ys[i]`. The
/// members' weights are laid out one after another in one 128-byte aligned buffer (each padded
/// to 128 bytes), registered as [`region::WEIGHT`]; x as [`region::X`].
pub fn q8_0_gemv_group(
    g: &Q8GroupLaunch,
    ws: &[&[u8]],
    ys: &mut [&mut [f32]],
    x: &[f32],
) -> Result<EmuStats, EmuError> {
    const K: &str = "q8_0_gemv_group";
    let k = x.len();
    need(
        K,
        ws.len() == ys.len()
            && g.first.len() == ws.len() + 1
            && (2..=Q8_GROUP_MAX).contains(&ws.len()),
        || {
            format!(
                "{} weights, {} outputs for a launch of {:?}",
                ws.len(),
                ys.len(),
                g.first
            )
        },
    )?;
    let mut all = Vec::new();
    let mut offsets = Vec::new();
    for (w, y) in ws.iter().zip(ys.iter()) {
        let bytes = y.len() * k / 32 * 34;
        need(K, k.is_multiple_of(32) && w.len() >= bytes, || {
            format!("{} rows: {} weight bytes for k = {k}", y.len(), w.len())
        })?;
        offsets.push(all.len());
        all.extend_from_slice(&w[..bytes]);
        all.resize(all.len().next_multiple_of(128), 0);
    }
    let wa = Aligned::new(&all);
    let mut c = Q8GroupC {
        w: [std::ptr::null(); Q8_GROUP_MAX],
        y: [std::ptr::null_mut(); Q8_GROUP_MAX],
        n: [0; Q8_GROUP_MAX],
        first: [0; Q8_GROUP_MAX + 1],
        count: ws.len() as i32,
    };
    for (i, y) in ys.iter_mut().enumerate() {
        // SAFETY: offsets[i] lies inside `all`, which `wa` copies.
        c.w[i] = unsafe { wa.as_ptr().cast::<u8>().add(offsets[i]) }.cast();
        c.y[i] = y.as_mut_ptr();
        c.n[i] = y.len() as i32;
    }
    for (slot, f) in c.first.iter_mut().zip(&g.first) {
        *slot = *f;
    }
    counted(
        K,
        &[
            (region::WEIGHT, wa.as_ptr(), all.len()),
            (region::X, x.as_ptr().cast(), 4 * k),
        ],
        || {
            // SAFETY: every member's weights and output are sized for its rows (checked); `c`
            // and x live across the call.
            unsafe { pn_emu_q8_0_gemv_group(&c, x.as_ptr(), k as i32, g.grid, g.threads, g.smem) }
        },
    )
}
