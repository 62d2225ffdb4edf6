//! GPU test of the fused producers (`Gpu::add_rms_norm_hadamard_prep`,
//! `Gpu::swiglu_hadamard_prep`) and the grouped PN GEMV (`Gpu::pn_gemv_group`): on the device
//! each equals the unfused launches it replaces bit for bit (add + `rms_norm_hadamard` +
//! `pn_prepare_rows`, and `rms_norm` for the unrotated rows; `swiglu_hadamard` +
//! `pn_prepare_rows`; one `pn_gemv_prepared` per matrix).
//! The host emulator runs the same sources (host_emu_fuse.rs, host_emu_group.rs). Needs a CUDA
//! device, so `#[ignore]`d: `cargo test -p pn-kernels --test gpu_fuse -- --ignored`.
#![cfg(feature = "cuda")]

mod common;

use common::*;
use half::f16;
use pn_kernels::{
    FusedRows, GroupMat, MatrixShape, NormOutputs, NormShape, NormX, PreparedOut, RowLayout,
    RowStrides, WeightType,
};

#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_producers_and_grouped_gemv_equal_the_unfused_launches_on_the_device() {
    let g = match pn_kernels::gpu_or_reason(0) {
        Ok(g) => g,
        Err(why) => {
            eprintln!("SKIPPED (no GPU): {why}");
            return;
        }
    };
    let s = g.stream().clone();
    let mut r = rng(91);
    let (rows, n, blk) = (3usize, 5120usize, 256usize);
    let x = random_vec(&mut r, rows * n, 3.0);
    let add = random_vec(&mut r, rows * n, 1.0);
    let w = random_vec(&mut r, n, 1.0);
    let norm = NormShape { n, eps: 1e-6 };
    let (dadd, dw) = (s.clone_htod(&add).unwrap(), s.clone_htod(&w).unwrap());
    // Fused.
    let mut dx = s.clone_htod(&x).unwrap();
    let mut y = s.alloc_zeros::<f32>(rows * n).unwrap();
    let mut yp = s.alloc_zeros::<f32>(rows * n).unwrap();
    let mut xh = s.alloc_zeros::<f16>(rows * n).unwrap();
    let mut e = s.alloc_zeros::<i32>(rows).unwrap();
    let prep = PreparedOut {
        xh: &mut xh.as_view_mut(),
        e: &mut e.as_view_mut(),
    };
    g.add_rms_norm_hadamard_prep(
        NormX::AddFirst(&mut dx.as_view_mut(), &dadd.as_view()),
        NormOutputs {
            rot: Some(&mut y.as_view_mut()),
            prep: Some(prep),
            plain: Some(&mut yp.as_view_mut()),
        },
        (&dw.as_view(), norm),
        FusedRows { rows, n, r: blk },
    )
    .unwrap();
    // The unrotated rows alone (the final norm before an unrotated head).
    let mut dx2 = s.clone_htod(&x).unwrap();
    let mut yp2 = s.alloc_zeros::<f32>(rows * n).unwrap();
    g.add_rms_norm_hadamard_prep(
        NormX::AddFirst(&mut dx2.as_view_mut(), &dadd.as_view()),
        NormOutputs {
            rot: None,
            prep: None,
            plain: Some(&mut yp2.as_view_mut()),
        },
        (&dw.as_view(), norm),
        FusedRows { rows, n, r: blk },
    )
    .unwrap();
    // Unfused.
    let mut ux = s.clone_htod(&x).unwrap();
    g.add_inplace(&mut ux.as_view_mut(), &dadd.as_view(), rows * n)
        .unwrap();
    let mut uy = s.alloc_zeros::<f32>(rows * n).unwrap();
    g.rms_norm_hadamard(
        &ux.as_view(),
        &mut uy.as_view_mut(),
        &dw.as_view(),
        RowStrides::contiguous(rows, n),
        norm,
        blk,
    )
    .unwrap();
    let mut uyp = s.alloc_zeros::<f32>(rows * n).unwrap();
    let l = RowLayout::contiguous(rows, n);
    g.rms_norm(
        &ux.as_view(),
        l,
        &mut uyp.as_view_mut(),
        l,
        Some(&dw.as_view()),
        norm,
    )
    .unwrap();
    let mut uxh = s.alloc_zeros::<f16>(rows * n).unwrap();
    let mut ue = s.alloc_zeros::<i32>(rows).unwrap();
    g.pn_prepare_rows(
        &uy.as_view(),
        (rows, n),
        &mut uxh.as_view_mut(),
        &mut ue.as_view_mut(),
    )
    .unwrap();
    let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
    assert_eq!(
        bits(s.clone_dtoh(&dx).unwrap()),
        bits(s.clone_dtoh(&ux).unwrap()),
        "residual"
    );
    assert_eq!(
        bits(s.clone_dtoh(&y).unwrap()),
        bits(s.clone_dtoh(&uy).unwrap()),
        "normed"
    );
    let uyp = bits(s.clone_dtoh(&uyp).unwrap());
    assert_eq!(bits(s.clone_dtoh(&yp).unwrap()), uyp, "unrotated");
    assert_eq!(bits(s.clone_dtoh(&yp2).unwrap()), uyp, "unrotated alone");
    assert_eq!(
        bits(s.clone_dtoh(&dx2).unwrap()),
        bits(s.clone_dtoh(&ux).unwrap()),
        "residual (unrotated alone)"
    );
    assert_eq!(
        s.clone_dtoh(&xh).unwrap(),
        s.clone_dtoh(&uxh).unwrap(),
        "fp16 copy"
    );
    assert_eq!(
        s.clone_dtoh(&e).unwrap(),
        s.clone_dtoh(&ue).unwrap(),
        "exponents"
    );

    // SwiGLU at the FFN width.
    let f = 17408;
    let (gate, up) = (random_vec(&mut r, f, 4.0), random_vec(&mut r, f, 2.0));
    let (dg, du) = (s.clone_htod(&gate).unwrap(), s.clone_htod(&up).unwrap());
    let mut out = s.alloc_zeros::<f32>(f).unwrap();
    let mut fxh = s.alloc_zeros::<f16>(f).unwrap();
    let mut fe = s.alloc_zeros::<i32>(1).unwrap();
    let prep = PreparedOut {
        xh: &mut fxh.as_view_mut(),
        e: &mut fe.as_view_mut(),
    };
    g.swiglu_hadamard_prep(
        (&dg.as_view(), &du.as_view()),
        &mut out.as_view_mut(),
        FusedRows {
            rows: 1,
            n: f,
            r: blk,
        },
        Some(prep),
    )
    .unwrap();
    let mut uout = s.alloc_zeros::<f32>(f).unwrap();
    g.swiglu_hadamard(
        &dg.as_view(),
        &du.as_view(),
        &mut uout.as_view_mut(),
        f,
        blk,
    )
    .unwrap();
    let mut gxh = s.alloc_zeros::<f16>(f).unwrap();
    let mut ge = s.alloc_zeros::<i32>(1).unwrap();
    g.pn_prepare_x(
        &uout.as_view(),
        f,
        &mut gxh.as_view_mut(),
        &mut ge.as_view_mut(),
    )
    .unwrap();
    assert_eq!(
        bits(s.clone_dtoh(&out).unwrap()),
        bits(s.clone_dtoh(&uout).unwrap()),
        "swiglu"
    );
    assert_eq!(
        s.clone_dtoh(&fxh).unwrap(),
        s.clone_dtoh(&gxh).unwrap(),
        "swiglu fp16 copy"
    );

    // The grouped GEMV on row 0's prepared copy: gate + up like, and a q/k/v-like triple.
    for shapes in [
        vec![
            (WeightType::Pn3t, 3u32, 4096usize),
            (WeightType::Pn4t, 4, 4096),
        ],
        vec![
            (WeightType::Pn3t, 3, 1200),
            (WeightType::Pn3t, 3, 256),
            (WeightType::Pn4t, 4, 256),
        ],
    ] {
        let ws: Vec<_> = shapes
            .iter()
            .map(|&(_, b, rn)| s.clone_htod(&random_pn_weights(&mut r, b, rn, n)).unwrap())
            .collect();
        let mut ys: Vec<_> = shapes
            .iter()
            .map(|&(_, _, rn)| s.alloc_zeros::<f32>(rn).unwrap())
            .collect();
        let wvs: Vec<_> = ws.iter().map(|w| w.as_view()).collect();
        let mut yvs: Vec<_> = ys.iter_mut().map(|y| y.as_view_mut()).collect();
        let mut mats: Vec<GroupMat<'_, '_>> = shapes
            .iter()
            .zip(&wvs)
            .zip(yvs.iter_mut())
            .map(|((&(ty, _, rn), w), y)| GroupMat {
                m: MatrixShape { ty, n: rn, k: n },
                w,
                y,
            })
            .collect();
        let (xv, ev) = (xh.slice(0..n), e.slice(0..1));
        g.pn_gemv_group(&mut mats, (&xv, &ev)).unwrap();
        drop(mats);
        drop(yvs);
        for (i, &(ty, _, rn)) in shapes.iter().enumerate() {
            let mut want = s.alloc_zeros::<f32>(rn).unwrap();
            g.pn_gemv_prepared(
                MatrixShape { ty, n: rn, k: n },
                &ws[i].as_view(),
                &xv,
                &ev,
                &mut want.as_view_mut(),
            )
            .unwrap();
            assert_eq!(
                bits(s.clone_dtoh(&ys[i]).unwrap()),
                bits(s.clone_dtoh(&want).unwrap()),
                "group member {i}"
            );
        }
    }
}
