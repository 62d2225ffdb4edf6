//! Bandwidth benchmark of the matrix-vector kernels at the Qwen3.8-27B-PN3 shapes, next to a
//! device-to-device copy measured in the same run (the practical bandwidth ceiling).
//!
//! `cargo run --release -p pn-kernels --bin pn-kernels-bench [-- --iters N]`. Without a GPU (or
//! without kernels in the build) it prints why and exits successfully.

#[cfg(feature = "cuda")]
fn main() {
    let iters = std::env::args()
        .skip_while(|a| a != "--iters")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(50usize);
    let gpu = match pn_kernels::gpu_or_reason(0) {
        Ok(g) => g,
        Err(why) => {
            println!("pn-kernels-bench: SKIPPED, no GPU: {why}");
            return;
        }
    };
    if let Err(e) = bench::run(&gpu, iters) {
        eprintln!("pn-kernels-bench: {e}");
        std::process::exit(1);
    }
}

#[cfg(not(feature = "cuda"))]
fn main() {
    println!("pn-kernels-bench: SKIPPED, built without the `cuda` feature");
}

#[cfg(feature = "cuda")]
mod bench {
    use pn_kernels::cudarc::driver::sys::CUevent_flags;
    use pn_kernels::{Gpu, MatrixShape, PnPrecision, WeightType};

    /// (label, type, precision, n rows, k columns): the 27B model's matrix-vector shapes.
    const SHAPES: &[(&str, WeightType, PnPrecision, usize, usize)] = &[
        (
            "ffn_gate/up pn3t",
            WeightType::Pn3t,
            PnPrecision::Half2,
            17408,
            5120,
        ),
        (
            "attn_qkv pn3t",
            WeightType::Pn3t,
            PnPrecision::Half2,
            10240,
            5120,
        ),
        (
            "attn_q pn3t",
            WeightType::Pn3t,
            PnPrecision::Half2,
            12288,
            5120,
        ),
        (
            "attn_gate pn3t",
            WeightType::Pn3t,
            PnPrecision::Half2,
            6144,
            5120,
        ),
        (
            "attn_k pn4t",
            WeightType::Pn4t,
            PnPrecision::Half2,
            1024,
            5120,
        ),
        (
            "ffn_down pn4t",
            WeightType::Pn4t,
            PnPrecision::Half2,
            5120,
            17408,
        ),
        (
            "attn_output pn4t",
            WeightType::Pn4t,
            PnPrecision::Half2,
            5120,
            6144,
        ),
        (
            "ffn_gate/up pn3t f32",
            WeightType::Pn3t,
            PnPrecision::F32,
            17408,
            5120,
        ),
        (
            "ffn_down pn4t f32",
            WeightType::Pn4t,
            PnPrecision::F32,
            5120,
            17408,
        ),
        (
            "output q4_K",
            WeightType::Q4K,
            PnPrecision::F32,
            248320,
            5120,
        ),
        (
            "ssm_alpha q8_0",
            WeightType::Q8_0,
            PnPrecision::F32,
            48,
            5120,
        ),
    ];

    fn err(e: impl std::fmt::Display) -> String {
        e.to_string()
    }

    /// Random bytes with every f16 scale replaced by a small finite value: timing does not depend
    /// on the values, but NaN scales would make the outputs meaningless to eyeball.
    fn weights(ty: WeightType, n: usize, k: usize) -> Vec<u8> {
        let bytes = ty.row_bytes(k).expect("shape") * n;
        let mut v = vec![0u8; bytes];
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        for b in v.iter_mut() {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            *b = s as u8;
        }
        let (bb, scale_offsets): (usize, &[usize]) = match ty {
            WeightType::Pn3t | WeightType::Pn4t | WeightType::Q8_0 => (34, &[0]),
            WeightType::Q4K => (144, &[0, 2]),
            _ => (1, &[]),
        };
        let one = half::f16::from_f32(0.01).to_bits().to_le_bytes();
        for blk in v.chunks_mut(bb) {
            for &o in scale_offsets {
                blk[o..o + 2].copy_from_slice(&one);
            }
        }
        v
    }

    pub fn run(gpu: &Gpu, iters: usize) -> Result<(), String> {
        let s = gpu.stream().clone();
        let ctx = gpu.context().clone();
        let (major, minor) = gpu.compute_capability();
        println!(
            "device sm_{major}{minor}, kernels from {}, {iters} iterations each",
            if gpu.uses_jit_ptx() {
                "compute_60 PTX (JIT)"
            } else {
                "sm_60 cubin"
            }
        );
        let time = |f: &mut dyn FnMut() -> Result<(), String>| -> Result<f64, String> {
            f()?; // warm-up
            let start = ctx
                .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(err)?;
            let end = ctx
                .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(err)?;
            start.record(&s).map_err(err)?;
            for _ in 0..iters {
                f()?;
            }
            end.record(&s).map_err(err)?;
            Ok(start.elapsed_ms(&end).map_err(err)? as f64 / iters as f64)
        };

        // Device-to-device copy of 1 GiB (read + write = 2 GiB of traffic).
        let n_copy = 1usize << 30;
        let src = s.alloc_zeros::<u8>(n_copy).map_err(err)?;
        let mut dst = s.alloc_zeros::<u8>(n_copy).map_err(err)?;
        let ms = time(&mut || s.memcpy_dtod(&src, &mut dst).map_err(err))?;
        let copy_gbs = 2.0 * n_copy as f64 / (ms * 1e6);
        drop((src, dst));
        println!(
            "{:<30} {:>10} {:>10} {:>10} {:>8}",
            "kernel", "MB read", "us", "GB/s", "% copy"
        );
        println!(
            "{:<30} {:>10.1} {:>10.1} {:>10.1} {:>8}",
            "d2d copy 1 GiB",
            2.0 * n_copy as f64 / 1e6,
            ms * 1e3,
            copy_gbs,
            "100.0"
        );
        let row = |label: &str, bytes: f64, ms: f64| {
            let gbs = bytes / (ms * 1e6);
            println!(
                "{label:<30} {:>10.1} {:>10.1} {gbs:>10.1} {:>8.1}",
                bytes / 1e6,
                ms * 1e3,
                100.0 * gbs / copy_gbs
            );
        };
        for &(label, ty, prec, n, k) in SHAPES {
            let w = s.clone_htod(&weights(ty, n, k)).map_err(err)?;
            let x = s.clone_htod(&vec![0.5f32; k]).map_err(err)?;
            let mut y = s.alloc_zeros::<f32>(n).map_err(err)?;
            let is_pn = matches!(ty, WeightType::Pn3t | WeightType::Pn4t);
            let m = MatrixShape { ty, n, k };
            let ms = time(&mut || {
                if is_pn {
                    gpu.pn_gemv(m, prec, &w.as_view(), &x.as_view(), &mut y.as_view_mut())
                        .map_err(err)
                } else {
                    gpu.gemv(m, &w.as_view(), &x.as_view(), &mut y.as_view_mut())
                        .map_err(err)
                }
            })?;
            let bytes = (w.len() + 4 * k + 4 * n) as f64;
            row(label, bytes, ms);
            if is_pn && prec == PnPrecision::Half2 {
                // The decode path: x converted once per activation, shared by its matrices.
                let mut xh = s.alloc_zeros::<half::f16>(k).map_err(err)?;
                let mut e = s.alloc_zeros::<i32>(1).map_err(err)?;
                gpu.pn_prepare_x(&x.as_view(), k, &mut xh.as_view_mut(), &mut e.as_view_mut())
                    .map_err(err)?;
                let ms = time(&mut || {
                    gpu.pn_gemv_prepared(
                        m,
                        &w.as_view(),
                        &xh.as_view(),
                        &e.as_view(),
                        &mut y.as_view_mut(),
                    )
                    .map_err(err)
                })?;
                row(
                    &format!("{label} (prepared x)"),
                    (w.len() + 2 * k + 4 * n) as f64,
                    ms,
                );
            }
        }
        Ok(())
    }
}
