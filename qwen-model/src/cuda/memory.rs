//! The device memory a model needs, planned before anything is allocated.

use super::CudaError;
use crate::{KvCacheType, LayerKind, ModelConfig};
use gguf_io::GgufFile;

/// Floats of the attention split-K scratch the backend keeps at most (64 MiB); longer prefill
/// chunks use fewer, longer splits.
pub const ATTN_SCRATCH_FLOATS: usize = 16 << 20;

/// Driver context, module images and allocator slack kept free beyond the planned buffers.
pub const RESERVE_BYTES: u64 = 256 << 20;

/// Bytes of each part of a model's device footprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryPlan {
    /// Weight matrices in their stored format plus f32 vectors (norms, conv, gates).
    pub weights: u64,
    /// KV caches of the attention layers (and the MTP block) at the requested context.
    pub kv_cache: u64,
    /// Conv and recurrent state of the Gated DeltaNet layers.
    pub recurrent_state: u64,
    /// Forward-pass activations for the largest step (`max_rows` tokens).
    pub workspace: u64,
    /// Backend scratch: attention partials, SwiGLU output, fp16 activations, token ids.
    pub scratch: u64,
    /// Fixed reserve for the driver context and allocator slack.
    pub reserve: u64,
    /// Context length the plan was made for.
    pub context: usize,
    /// Tokens per forward step the plan was made for.
    pub max_rows: usize,
}

impl MemoryPlan {
    /// The footprint of `file` at `context` positions with K and V caches of type `kv`,
    /// `max_rows` tokens per step, one sequence state.
    pub fn new(
        file: &GgufFile,
        cfg: &ModelConfig,
        context: usize,
        max_rows: usize,
        kv: impl Into<KvCacheType>,
    ) -> MemoryPlan {
        let kv = kv.into();
        Self::with_kv_types(file, cfg, context, max_rows, kv, kv)
    }

    /// [`MemoryPlan::new`] with a K cache of type `k` and a V cache of type `v` (q8_0/q4_0
    /// blocks counted at 34/18 bytes per 32 values).
    pub fn with_kv_types(
        file: &GgufFile,
        cfg: &ModelConfig,
        context: usize,
        max_rows: usize,
        k: KvCacheType,
        v: KvCacheType,
    ) -> MemoryPlan {
        let weights = file
            .tensors()
            .map(|t| {
                if t.dims.len() >= 2 {
                    t.bytes.len() as u64
                } else {
                    // Vectors are converted to f32 on upload.
                    4 * t.n_elements()
                }
            })
            .sum();
        // Per position and layer: one row of kv_dim values in each cache (kv_dim is whole
        // heads of 256, so whole blocks).
        let kv_row = (k.bytes_for(cfg.kv_dim()) + v.bytes_for(cfg.kv_dim())) as u64;
        let attn_layers = cfg.n_attention_layers() + usize::from(cfg.n_mtp > 0);
        let kv_cache = attn_layers as u64 * context as u64 * kv_row;
        let gdn_layers = cfg
            .layer_kinds
            .iter()
            .filter(|k| **k == LayerKind::GatedDeltaNet)
            .count() as u64;
        let recurrent_state =
            gdn_layers * 4 * (cfg.gdn.conv_state_len() + cfg.gdn.state_len()) as u64;
        let r = max_rows.max(1) as u64;
        let (d, g) = (cfg.hidden as u64, &cfg.gdn);
        let rot_k = [
            2 * d,
            cfg.ffn as u64,
            cfg.attn_out_dim() as u64,
            g.value_dim() as u64,
        ]
        .into_iter()
        .max()
        .unwrap_or(d);
        // The buffers of `Model::new_workspace`, in order.
        let ws_floats = r
            * (d + d
                + rot_k
                + cfg.q_proj_dim() as u64
                + 2 * cfg.kv_dim() as u64
                + cfg.attn_out_dim() as u64
                + d
                + 2 * g.conv_dim() as u64
                + 2 * g.value_dim() as u64
                + 2 * g.n_v_heads as u64
                + 2 * cfg.ffn as u64
                + 3 * d
                + 2 * d
                + cfg.vocab as u64);
        let scratch_floats = ATTN_SCRATCH_FLOATS as u64 + r * cfg.ffn as u64 + r;
        let scratch = 4 * scratch_floats + 2 * 24576 + 64;
        MemoryPlan {
            weights,
            kv_cache,
            recurrent_state,
            workspace: 4 * ws_floats,
            scratch,
            reserve: RESERVE_BYTES,
            context,
            max_rows,
        }
    }

    /// Fails when the run's sizes pass a kernel limit that no model shape declares
    /// ([`Backend::supports`](crate::Backend::supports) covers those): the kernels put the tokens
    /// of a step on grid y (at most [`pn_kernels::MAX_GRID_Y`] per launch) and take positions
    /// as 32-bit ints.
    pub fn check_limits(&self) -> Result<(), CudaError> {
        if self.max_rows > pn_kernels::MAX_GRID_Y {
            return Err(CudaError::Unsupported {
                op: "forward step",
                what: format!(
                    "{} tokens per step (the kernels take at most {} per launch); lower the \
                     prefill chunk",
                    self.max_rows,
                    pn_kernels::MAX_GRID_Y
                ),
            });
        }
        if self.context > i32::MAX as usize {
            return Err(CudaError::Unsupported {
                op: "attention",
                what: format!(
                    "context {} (the kernels take positions below {})",
                    self.context,
                    i32::MAX
                ),
            });
        }
        Ok(())
    }

    /// Sum of every term.
    pub fn total(&self) -> u64 {
        self.weights
            + self.kv_cache
            + self.recurrent_state
            + self.workspace
            + self.scratch
            + self.reserve
    }

    /// One line per term, for an error or a log.
    pub fn describe(&self) -> String {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        format!(
            "weights {:.1} MiB + KV cache at {} positions {:.1} MiB + recurrent state {:.1} MiB \
             + workspace for {} tokens {:.1} MiB + scratch {:.1} MiB + reserve {:.1} MiB \
             = {:.1} MiB",
            mib(self.weights),
            self.context,
            mib(self.kv_cache),
            mib(self.recurrent_state),
            self.max_rows,
            mib(self.workspace),
            mib(self.scratch),
            mib(self.reserve),
            mib(self.total())
        )
    }
}
