//! What the CUDA kernels can run, as a pure function of a model's [`Requirements`], so it is
//! checked at model bind and state creation (and testable without a device). Limits that
//! depend on the run's sizes rather than the model (tokens per forward step, context) are
//! checked by [`MemoryPlan::check_limits`](super::MemoryPlan::check_limits) at load.

use super::{CONV_KERNEL, GDN_HEAD_DIM, HEAD_DIM};
use crate::{Requirements, Unsupported};

/// Every limit the kernels have that a model config can ask past, for the backend named
/// `backend`:
/// - attention and the KV store kernels: head_dim 256 (one warp of 8-value lanes per row,
///   q8_0/q4_0 rows of 8 blocks);
/// - the delta-rule kernels: key and value head dims 128 (the state tile of one block);
/// - the conv1d kernel: kernel length 4 (a rolling state of 3 rows);
/// - the attention kernels read K and V with one element type (every type has kernels).
pub(super) fn check(backend: &str, req: &Requirements) -> Result<(), Unsupported> {
    let shape = |op, what, supported, found| {
        if found == supported {
            Ok(())
        } else {
            Err(Unsupported::Shape {
                backend: backend.to_string(),
                op,
                what,
                supported,
                found,
            })
        }
    };
    if let Some((k, v)) = req.kv {
        if k != v {
            return Err(Unsupported::MixedKvTypes {
                backend: backend.to_string(),
                k,
                v,
            });
        }
    }
    shape("attention", "head_dim", HEAD_DIM, req.attn_head_dim)?;
    shape("gated delta rule", "key head dim", GDN_HEAD_DIM, req.gdn.dk)?;
    shape(
        "gated delta rule",
        "value head dim",
        GDN_HEAD_DIM,
        req.gdn.dv,
    )?;
    shape("conv1d", "kernel length", CONV_KERNEL, req.gdn.conv_kernel)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GdnDims, KvCacheType};

    /// The 27B model's shapes: attention head_dim 256 (24 q / 4 kv heads), GDN heads of 128,
    /// conv kernel 4.
    fn qwen27b() -> Requirements {
        Requirements {
            attn_head_dim: 256,
            n_q_heads: 24,
            n_kv_heads: 4,
            gdn: GdnDims {
                n_k_heads: 16,
                n_v_heads: 48,
                dk: 128,
                dv: 128,
                conv_kernel: 4,
            },
            kv: None,
        }
    }

    #[test]
    fn accepts_the_shapes_the_kernels_are_written_for() {
        assert_eq!(check("cuda:0", &qwen27b()), Ok(()));
        for t in [
            KvCacheType::F32,
            KvCacheType::F16,
            KvCacheType::Q8_0,
            KvCacheType::Q4_0,
        ] {
            assert_eq!(check("cuda:0", &qwen27b().with_kv(t, t)), Ok(()), "{t}");
        }
    }

    #[test]
    fn refuses_attention_head_dim_128() {
        let req = Requirements {
            attn_head_dim: 128,
            ..qwen27b()
        };
        let e = check("cuda:0", &req).unwrap_err();
        assert_eq!(
            e,
            Unsupported::Shape {
                backend: "cuda:0".into(),
                op: "attention",
                what: "head_dim",
                supported: 256,
                found: 128,
            }
        );
        assert!(
            e.to_string().contains("head_dim 256, the model has 128"),
            "{e}"
        );
    }

    #[test]
    fn refuses_other_gdn_head_dims_and_conv_kernels() {
        let with_gdn = |f: fn(&mut GdnDims)| {
            let mut r = qwen27b();
            f(&mut r.gdn);
            check("cuda:0", &r).unwrap_err()
        };
        let what = |e: Unsupported| match e {
            Unsupported::Shape { what, found, .. } => (what, found),
            e => panic!("{e:?}"),
        };
        assert_eq!(what(with_gdn(|g| g.dk = 64)), ("key head dim", 64));
        assert_eq!(what(with_gdn(|g| g.dv = 256)), ("value head dim", 256));
        assert_eq!(what(with_gdn(|g| g.conv_kernel = 3)), ("kernel length", 3));
    }

    #[test]
    fn refuses_k_and_v_caches_of_two_types() {
        let req = qwen27b().with_kv(KvCacheType::Q8_0, KvCacheType::F16);
        assert!(matches!(
            check("cuda:0", &req),
            Err(Unsupported::MixedKvTypes {
                k: KvCacheType::Q8_0,
                v: KvCacheType::F16,
                ..
            })
        ));
    }

    #[test]
    fn memory_plan_refuses_steps_past_the_grid_limit() {
        let plan = |max_rows, context| crate::cuda::MemoryPlan {
            weights: 0,
            kv_cache: 0,
            recurrent_state: 0,
            workspace: 0,
            scratch: 0,
            reserve: 0,
            context,
            max_rows,
        };
        assert!(plan(16_384, 262_144).check_limits().is_ok());
        assert!(plan(pn_kernels::MAX_GRID_Y, 1 << 20).check_limits().is_ok());
        let e = plan(pn_kernels::MAX_GRID_Y + 1, 4096)
            .check_limits()
            .unwrap_err();
        assert!(e.to_string().contains("65535 per launch"), "{e}");
        assert!(plan(512, i32::MAX as usize + 1).check_limits().is_err());
    }
}
