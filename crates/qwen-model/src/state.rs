//! Per-sequence state: the KV cache of the attention layers, the conv and recurrent state of the
//! Gated DeltaNet layers, and the MTP block's own KV cache.

use crate::backend::{Backend, KvCacheType, KvType};
use crate::config::{LayerKind, ModelConfig};
use crate::error::ModelError;

/// State of one trunk layer.
pub enum LayerState<B: Backend> {
    /// KV cache `[capacity, Hkv * Dh]` each (f32 or f16).
    Attention {
        /// Keys (after norm and RoPE).
        k: B::KvBuf,
        /// Values.
        v: B::KvBuf,
    },
    /// Gated DeltaNet state.
    DeltaNet {
        /// Last `kernel - 1` pre-conv rows, `[kernel - 1, conv_dim]`.
        conv: B::Buf,
        /// Recurrent state `[Hv, dv, dk]`.
        ssm: B::Buf,
    },
}

/// Everything a sequence carries between forward calls.
pub struct State<B: Backend> {
    pub(crate) layers: Vec<LayerState<B>>,
    /// MTP KV cache (an attention layer state), when the model has an MTP block.
    pub(crate) mtp: Option<LayerState<B>>,
    pub(crate) pos: usize,
    pub(crate) mtp_len: usize,
    pub(crate) capacity: usize,
}

/// KV cache bytes one position costs: K and V rows of every full-attention layer plus the MTP
/// block's own cache (when the model has one). Multiply by the context length for the cache
/// size; the recurrent GDN state does not grow with the context.
pub fn kv_bytes_per_token(cfg: &ModelConfig, k_type: KvCacheType, v_type: KvCacheType) -> u64 {
    let layers = cfg
        .layer_kinds
        .iter()
        .filter(|k| **k == LayerKind::FullAttention)
        .count()
        + usize::from(cfg.n_mtp > 0);
    let kv = cfg.kv_dim();
    (layers * (k_type.bytes_for(kv) + v_type.bytes_for(kv))) as u64
}

/// A copy of the recurrent part of a [`State`] plus the positions, to roll back to (speculative
/// decoding, prompt caching). KV entries past the snapshot's position are simply overwritten.
pub struct Snapshot<B: Backend> {
    layers: Vec<Option<(B::Buf, B::Buf)>>,
    pos: usize,
    mtp_len: usize,
}

impl<B: Backend> Snapshot<B> {
    /// Trunk position when the snapshot was taken.
    pub fn pos(&self) -> usize {
        self.pos
    }
}

impl<B: Backend> State<B> {
    /// An empty state able to hold `capacity` positions, with an f32 KV cache.
    pub fn new(cfg: &ModelConfig, backend: &B, capacity: usize) -> Result<State<B>, ModelError> {
        Self::with_kv_type(cfg, backend, capacity, KvType::F32)
    }

    /// An empty state able to hold `capacity` positions, with a KV cache of type `kv`.
    pub fn with_kv_type(
        cfg: &ModelConfig,
        backend: &B,
        capacity: usize,
        kv_type: KvType,
    ) -> Result<State<B>, ModelError> {
        Self::with_kv_types(cfg, backend, capacity, kv_type.into(), kv_type.into())
    }

    /// An empty state able to hold `capacity` positions, with keys stored as `k_type` and values
    /// as `v_type`. A quantized type needs a head dim that is a whole number of its blocks (one
    /// block never spans two heads, so attention dequantizes per head row).
    pub fn with_kv_types(
        cfg: &ModelConfig,
        backend: &B,
        capacity: usize,
        k_type: KvCacheType,
        v_type: KvCacheType,
    ) -> Result<State<B>, ModelError> {
        for t in [k_type, v_type] {
            if !cfg.head_dim.is_multiple_of(t.block_len()) {
                return Err(ModelError::BadArgument(format!(
                    "{t} KV cache needs a head dim that is a multiple of {}, the model has {}",
                    t.block_len(),
                    cfg.head_dim
                )));
            }
        }
        let kv = cfg.kv_dim();
        let layers = cfg
            .layer_kinds
            .iter()
            .map(|k| {
                Ok(match k {
                    LayerKind::FullAttention => LayerState::Attention {
                        k: backend.alloc_kv_cache(capacity * kv, k_type)?,
                        v: backend.alloc_kv_cache(capacity * kv, v_type)?,
                    },
                    LayerKind::GatedDeltaNet => LayerState::DeltaNet {
                        conv: backend.alloc(cfg.gdn.conv_state_len())?,
                        ssm: backend.alloc(cfg.gdn.state_len())?,
                    },
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let mtp = if cfg.n_mtp > 0 {
            Some(LayerState::Attention {
                k: backend.alloc_kv_cache(capacity * kv, k_type)?,
                v: backend.alloc_kv_cache(capacity * kv, v_type)?,
            })
        } else {
            None
        };
        Ok(State {
            layers,
            mtp,
            pos: 0,
            mtp_len: 0,
            capacity,
        })
    }

    /// Tokens the trunk has processed (the position of the next token).
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Rows in the MTP block's KV cache.
    pub fn mtp_len(&self) -> usize {
        self.mtp_len
    }

    /// Positions the KV caches can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Back to an empty sequence (zeroes the recurrent state; KV rows are overwritten later).
    pub fn reset(&mut self, cfg: &ModelConfig, backend: &B) {
        for l in &mut self.layers {
            if let LayerState::DeltaNet { conv, ssm } = l {
                backend.zero(conv, cfg.gdn.conv_state_len());
                backend.zero(ssm, cfg.gdn.state_len());
            }
        }
        self.pos = 0;
        self.mtp_len = 0;
    }

    /// Drops MTP cache rows past `len` (rejected drafts).
    pub fn truncate_mtp(&mut self, len: usize) {
        self.mtp_len = self.mtp_len.min(len);
    }

    /// Copies the recurrent state and positions.
    pub fn snapshot(&self, cfg: &ModelConfig, backend: &B) -> Result<Snapshot<B>, ModelError> {
        let layers = self
            .layers
            .iter()
            .map(|l| match l {
                LayerState::DeltaNet { conv, ssm } => {
                    let mut c = backend.alloc(cfg.gdn.conv_state_len())?;
                    let mut s = backend.alloc(cfg.gdn.state_len())?;
                    backend.copy(conv, 0, &mut c, 0, cfg.gdn.conv_state_len());
                    backend.copy(ssm, 0, &mut s, 0, cfg.gdn.state_len());
                    Ok(Some((c, s)))
                }
                LayerState::Attention { .. } => Ok(None),
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(Snapshot {
            layers,
            pos: self.pos,
            mtp_len: self.mtp_len,
        })
    }

    /// Overwrites an existing snapshot (no allocation).
    pub fn snapshot_into(&self, cfg: &ModelConfig, backend: &B, snap: &mut Snapshot<B>) {
        for (l, s) in self.layers.iter().zip(snap.layers.iter_mut()) {
            if let (LayerState::DeltaNet { conv, ssm }, Some((c, st))) = (l, s) {
                backend.copy(conv, 0, c, 0, cfg.gdn.conv_state_len());
                backend.copy(ssm, 0, st, 0, cfg.gdn.state_len());
            }
        }
        snap.pos = self.pos;
        snap.mtp_len = self.mtp_len;
    }

    /// Rolls back to `snap` (taken from this state). KV rows at or after the snapshot's
    /// position are dropped.
    pub fn restore(&mut self, cfg: &ModelConfig, backend: &B, snap: &Snapshot<B>) {
        for (l, s) in self.layers.iter_mut().zip(snap.layers.iter()) {
            if let (LayerState::DeltaNet { conv, ssm }, Some((c, st))) = (l, s) {
                backend.copy(c, 0, conv, 0, cfg.gdn.conv_state_len());
                backend.copy(st, 0, ssm, 0, cfg.gdn.state_len());
            }
        }
        self.pos = snap.pos;
        self.mtp_len = snap.mtp_len;
    }
}
