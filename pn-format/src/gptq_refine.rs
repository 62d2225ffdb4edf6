//! Local refinement of GPTQ's blocks against the full Hessian, in the unchanged PN format.
//!
//! GPTQ ([`crate::gptq`]) fixes each block's scale before its columns are rounded and never
//! revisits a column, so its result is a good but not a local optimum of the row's output error
//! `e^T H e` (`e = w - q`, `H` the damped Hessian of the layer's inputs in the rotated basis).
//! This pass descends on that same error, coordinate by coordinate, with every change accepted
//! only when it lowers the row's error exactly:
//! 1. each block's fp16 scale is refitted with its codes fixed (the closed-form least-squares
//!    step `ds = v . (H e)_b / (v^T H_bb v)`, `v` the block's centred codes, rounded to fp16);
//! 2. then each code of the block is re-chosen at that scale (the closed-form step of one
//!    coordinate, `dc = rint((H e)_j / (s H_jj))`, clamped to the code range).
//!
//! Both steps keep `g = H e` current (one column of `H` per change), so a round costs one
//! `k x k` product per row plus `k` per change. Rows are independent and every sum runs in a
//! fixed order in f64, so the bytes do not depend on threads or machine.

use crate::block::{pack_block, BlockRef};
use crate::error::PnError;
use crate::types::{PnType, BLOCK_BYTES};
use half::f16;

/// Refinement rounds `pn quantize --method gptq` runs after the GPTQ pass.
pub const DEFAULT_ROUNDS: usize = 2;

/// What [`refine_rows`] changed, summed over its rows.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RefineStats {
    /// `sum e^T H e` over the rows before the pass (damped `H`).
    pub before: f64,
    /// The same after it; never more than `before`.
    pub after: f64,
    /// Scales changed.
    pub scales: usize,
    /// Codes changed.
    pub codes: usize,
}

/// Refines the PN blocks `out` (`rows * k / weights_per_block` blocks, as
/// [`crate::gptq::quantize_rows_gptq`] wrote them) of the rotated rows `w` (`[rows, k]`) against
/// `h + damp I` (`h` `[k, k]` row-major, symmetric), for `rounds` rounds of scale refits and code
/// re-choices. Zero blocks stay as they are. Errors name the row (within `w`).
pub fn refine_rows(
    ty: PnType,
    h: &[f64],
    damp: f64,
    w: &[f32],
    out: &mut [u8],
    rounds: usize,
) -> Result<RefineStats, PnError> {
    let g = ty.weights_per_block();
    let k = (h.len() as f64).sqrt() as usize;
    if k * k != h.len() || k == 0 || !k.is_multiple_of(g) {
        return Err(PnError::LengthMismatch {
            what: "Hessian entries (k x k, k a multiple of the block)",
            expected: k * k,
            got: h.len(),
        });
    }
    let row_bytes = k / g * BLOCK_BYTES;
    if !w.len().is_multiple_of(k) || out.len() != w.len() / k * row_bytes {
        return Err(PnError::LengthMismatch {
            what: "quantized row bytes",
            expected: w.len() / k * row_bytes,
            got: out.len(),
        });
    }
    let z = ty.zero_point();
    let maxc = i32::from(ty.max_code());
    let hd = |i: usize, j: usize| h[i * k + j] + if i == j { damp } else { 0.0 };
    let mut st = RefineStats::default();
    // Per row: codes `[k]`, scales `[k / g]`, error `e = w - q` `[k]`, `he = (H + damp I) e` `[k]`.
    let mut codes = vec![0i32; k];
    let mut scales = vec![0f64; k / g];
    let (mut e, mut he) = (vec![0f64; k], vec![0f64; k]);
    for (r, (wr, orow)) in w
        .chunks_exact(k)
        .zip(out.chunks_exact_mut(row_bytes))
        .enumerate()
    {
        for (b, blk) in orow.chunks_exact(BLOCK_BYTES).enumerate() {
            let br = BlockRef::new(ty, blk).map_err(|e| e.in_row(r))?;
            scales[b] = f64::from(br.scale());
            for t in 0..g {
                codes[b * g + t] = i32::from(br.code(t));
            }
        }
        for j in 0..k {
            let q = scales[j / g] * f64::from(codes[j] - z);
            e[j] = f64::from(wr[j]) - q;
        }
        for i in 0..k {
            let hi = &h[i * k..(i + 1) * k];
            he[i] = hi.iter().zip(&e).map(|(&a, &b)| a * b).sum::<f64>() + damp * e[i];
        }
        let err0: f64 = e.iter().zip(&he).map(|(a, b)| a * b).sum();
        let mut gain = 0.0f64;
        // `he -= d * H[:, j]` for a change `d` of q_j (H symmetric: row j is column j).
        let push = |he: &mut [f64], e: &mut [f64], j: usize, d: f64| {
            e[j] -= d;
            for (x, &hij) in he.iter_mut().zip(&h[j * k..(j + 1) * k]) {
                *x -= d * hij;
            }
            he[j] -= d * damp;
        };
        for _ in 0..rounds {
            let mut changed = false;
            for (b, sb) in scales.iter_mut().enumerate() {
                let a = b * g;
                let s = *sb;
                if s == 0.0 {
                    continue;
                }
                // 1. The scale, codes fixed: q_b = s v.
                let v: Vec<f64> = (a..a + g).map(|j| f64::from(codes[j] - z)).collect();
                let num: f64 = v.iter().zip(&he[a..a + g]).map(|(x, y)| x * y).sum();
                let mut den = 0.0;
                for (i, &vi) in v.iter().enumerate() {
                    if vi != 0.0 {
                        for (j, &vj) in v.iter().enumerate() {
                            den += vi * vj * hd(a + i, a + j);
                        }
                    }
                }
                if den > 0.0 {
                    let s_new = f16::from_f64(s + num / den).to_f64();
                    let ds = s_new - s;
                    let delta = -2.0 * ds * num + ds * ds * den;
                    if s_new.is_finite() && s_new != 0.0 && ds != 0.0 && delta < 0.0 {
                        for (i, &vi) in v.iter().enumerate() {
                            if vi != 0.0 {
                                push(&mut he, &mut e, a + i, ds * vi);
                            }
                        }
                        *sb = s_new;
                        gain -= delta;
                        st.scales += 1;
                        changed = true;
                    }
                }
                // 2. Each code at the block's (new) scale.
                let s = *sb;
                for j in a..a + g {
                    let hjj = hd(j, j);
                    if hjj <= 0.0 {
                        continue;
                    }
                    let step = (he[j] / (s * hjj)).round() as i32;
                    let c = (codes[j] + step).clamp(0, maxc);
                    let dc = c - codes[j];
                    if dc == 0 {
                        continue;
                    }
                    let d = s * f64::from(dc);
                    let delta = -2.0 * d * he[j] + d * d * hjj;
                    if delta < 0.0 {
                        push(&mut he, &mut e, j, d);
                        codes[j] = c;
                        gain -= delta;
                        st.codes += 1;
                        changed = true;
                    }
                }
            }
            if !changed {
                break;
            }
        }
        st.before += err0;
        st.after += err0 - gain;
        let mut cbuf = [0u8; 80];
        for (b, blk) in orow.chunks_exact_mut(BLOCK_BYTES).enumerate() {
            if scales[b] == 0.0 {
                continue;
            }
            for t in 0..g {
                cbuf[t] = codes[b * g + t] as u8;
            }
            blk.copy_from_slice(&pack_block(ty, f16::from_f64(scales[b]), &cbuf[..g]));
        }
    }
    Ok(st)
}
