//! Per-sequence state: the KV cache of the attention layers, the conv and recurrent state of the
//! Gated DeltaNet layers, and the MTP block's own KV cache.

use crate::backend::{Backend, GdnRowScratch, KvCacheType, Requirements};
use crate::config::{LayerKind, ModelConfig};
use crate::error::ModelError;

/// State of one trunk layer.
pub enum LayerState<B: Backend> {
    /// KV cache `[capacity, Hkv * Dh]` each (elements of the state's [`KvCacheType`]s).
    Attention {
        /// Keys (after norm and RoPE).
        k: B::KvBuf,
        /// Values.
        v: B::KvBuf,
    },
    /// Gated DeltaNet state.
    DeltaNet(GdnState<B>),
}

/// The state one Gated DeltaNet layer carries between tokens.
pub struct GdnState<B: Backend> {
    /// Last `kernel - 1` pre-conv rows, `[kernel - 1, conv_dim]`.
    pub conv: B::Buf,
    /// Recurrent state `[Hv, dv, dk]`.
    pub ssm: B::Buf,
}

/// Everything a sequence carries between forward calls.
pub struct State<B: Backend> {
    /// Per trunk layer, in order: its KV cache or its GDN state.
    pub(crate) layers: Vec<LayerState<B>>,
    /// MTP KV cache (an attention layer state), when the model has an MTP block.
    pub(crate) mtp: Option<LayerState<B>>,
    /// Tokens the trunk has processed: the position of the next token, the rows of the KV
    /// caches in use.
    pub(crate) pos: usize,
    /// Rows of the MTP KV cache in use.
    pub(crate) mtp_len: usize,
    /// Positions every KV cache holds.
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
    /// Per trunk layer: for a GDN layer copies of its conv state `[kernel - 1, conv_dim]` and
    /// recurrent state `[Hv, dv, dk]`; `None` for an attention layer.
    layers: Vec<Option<(B::Buf, B::Buf)>>,
    /// [`State::pos`] when taken.
    pos: usize,
    /// [`State::mtp_len`] when taken.
    mtp_len: usize,
}

impl<B: Backend> Snapshot<B> {
    /// Trunk position when the snapshot was taken.
    pub fn pos(&self) -> usize {
        self.pos
    }
}

/// The recurrent state after every row of one traced multi-row forward
/// ([`Model::forward_traced`](crate::Model::forward_traced)): a speculative verification pass
/// that rejects a draft rolls back to its accepted prefix by copying ([`State::restore_traced`])
/// instead of re-running the prefix.
///
/// Memory: `max_rows` copies of the GDN conv and recurrent state (on the 27B shape about
/// 150 MB a row; a few hundred KB on the small test models).
pub struct StateTrace<B: Backend> {
    /// Per trunk layer: for a GDN layer the conv states `[max_rows, conv_state_len]` and the
    /// recurrent states `[max_rows, state_len]`, row `t` holding the state after input row `t`.
    pub(crate) layers: Vec<Option<(B::Buf, B::Buf)>>,
    /// One-row work buffers of the backend's traced delta rule.
    pub(crate) scratch: GdnRowScratch<B::Buf>,
    /// Most rows one traced pass may record.
    max_rows: usize,
    /// Trunk position before the traced pass.
    pub(crate) pos0: usize,
    /// Rows the traced pass recorded (0: nothing recorded).
    pub(crate) rows: usize,
}

impl<B: Backend> StateTrace<B> {
    /// Room for the states after up to `max_rows` rows of one traced pass.
    pub fn new(
        cfg: &ModelConfig,
        backend: &B,
        max_rows: usize,
    ) -> Result<StateTrace<B>, ModelError> {
        let g = &cfg.gdn;
        let layers = cfg
            .layer_kinds
            .iter()
            .map(|k| match k {
                LayerKind::GatedDeltaNet => Ok(Some((
                    backend.alloc(max_rows * g.conv_state_len())?,
                    backend.alloc(max_rows * g.state_len())?,
                ))),
                LayerKind::FullAttention => Ok(None),
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(StateTrace {
            layers,
            scratch: GdnRowScratch::new(backend, g)?,
            max_rows,
            pos0: 0,
            rows: 0,
        })
    }

    /// Most rows one traced pass may have.
    pub fn max_rows(&self) -> usize {
        self.max_rows
    }

    /// Trunk position before the last traced pass.
    pub fn pos0(&self) -> usize {
        self.pos0
    }

    /// Rows the last traced pass recorded (0 before the first).
    pub fn rows(&self) -> usize {
        self.rows
    }
}

impl<B: Backend> State<B> {
    /// An empty state able to hold `capacity` positions, with an f32 KV cache.
    pub fn new(cfg: &ModelConfig, backend: &B, capacity: usize) -> Result<State<B>, ModelError> {
        Self::with_kv_type(cfg, backend, capacity, KvCacheType::F32)
    }

    /// An empty state able to hold `capacity` positions, with K and V caches of type `kv_type`.
    pub fn with_kv_type(
        cfg: &ModelConfig,
        backend: &B,
        capacity: usize,
        kv_type: KvCacheType,
    ) -> Result<State<B>, ModelError> {
        Self::with_kv_types(cfg, backend, capacity, kv_type, kv_type)
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
        // A cache type or head size the backend cannot run fails before any allocation.
        backend.supports(&Requirements::model(cfg).with_kv(k_type, v_type))?;
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
                        k: backend.alloc_kv(capacity * kv, k_type)?,
                        v: backend.alloc_kv(capacity * kv, v_type)?,
                    },
                    LayerKind::GatedDeltaNet => LayerState::DeltaNet(GdnState {
                        conv: backend.alloc_dense(cfg.gdn.conv_state_len())?,
                        ssm: backend.alloc_dense(cfg.gdn.state_len())?,
                    }),
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let mtp = if cfg.n_mtp > 0 {
            Some(LayerState::Attention {
                k: backend.alloc_kv(capacity * kv, k_type)?,
                v: backend.alloc_kv(capacity * kv, v_type)?,
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
    pub fn reset(&mut self, cfg: &ModelConfig, backend: &B) -> Result<(), ModelError> {
        for l in &mut self.layers {
            if let LayerState::DeltaNet(GdnState { conv, ssm }) = l {
                backend.zero(conv, cfg.gdn.conv_state_len())?;
                backend.zero(ssm, cfg.gdn.state_len())?;
            }
        }
        self.pos = 0;
        self.mtp_len = 0;
        Ok(())
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
                LayerState::DeltaNet(GdnState { conv, ssm }) => {
                    let mut c = backend.alloc(cfg.gdn.conv_state_len())?;
                    let mut s = backend.alloc(cfg.gdn.state_len())?;
                    backend.copy(conv, 0, &mut c, 0, cfg.gdn.conv_state_len())?;
                    backend.copy(ssm, 0, &mut s, 0, cfg.gdn.state_len())?;
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
    pub fn snapshot_into(
        &self,
        cfg: &ModelConfig,
        backend: &B,
        snap: &mut Snapshot<B>,
    ) -> Result<(), ModelError> {
        for (l, s) in self.layers.iter().zip(snap.layers.iter_mut()) {
            if let (LayerState::DeltaNet(GdnState { conv, ssm }), Some((c, st))) = (l, s) {
                backend.copy(conv, 0, c, 0, cfg.gdn.conv_state_len())?;
                backend.copy(ssm, 0, st, 0, cfg.gdn.state_len())?;
            }
        }
        snap.pos = self.pos;
        snap.mtp_len = self.mtp_len;
        Ok(())
    }

    /// Rolls back to the state after the first `rows` rows of the last traced pass
    /// (`1..=trace.rows()`), which must be the last pass this state ran: the recurrent state
    /// is copied from `trace` and the position set to `trace.pos0() + rows`. KV rows past it
    /// are dropped; the MTP cache is left as it is. The trace then ends at `rows` (a later
    /// restore may go back further, not forward again).
    pub fn restore_traced(
        &mut self,
        cfg: &ModelConfig,
        backend: &B,
        trace: &mut StateTrace<B>,
        rows: usize,
    ) -> Result<(), ModelError> {
        if rows == 0 || rows > trace.rows || self.pos != trace.pos0 + trace.rows {
            return Err(ModelError::BadArgument(format!(
                "cannot restore {rows} rows of a traced pass of {} rows at position {} (state at {})",
                trace.rows, trace.pos0, self.pos
            )));
        }
        let (cl, sl) = (cfg.gdn.conv_state_len(), cfg.gdn.state_len());
        let r = rows - 1;
        for (l, t) in self.layers.iter_mut().zip(trace.layers.iter()) {
            if let (LayerState::DeltaNet(GdnState { conv, ssm }), Some((tc, ts))) = (l, t) {
                backend.copy(tc, r * cl, conv, 0, cl)?;
                backend.copy(ts, r * sl, ssm, 0, sl)?;
            }
        }
        self.pos = trace.pos0 + rows;
        trace.rows = rows;
        Ok(())
    }

    /// The conv and recurrent states of every GDN layer, downloaded and concatenated in layer
    /// order (conv then recurrent per layer): for tests and debugging comparing two states.
    pub fn recurrent_state(&self, cfg: &ModelConfig, backend: &B) -> Result<Vec<f32>, ModelError> {
        let (cl, sl) = (cfg.gdn.conv_state_len(), cfg.gdn.state_len());
        let mut v = Vec::new();
        for l in &self.layers {
            if let LayerState::DeltaNet(GdnState { conv, ssm }) = l {
                let at = v.len();
                v.resize(at + cl + sl, 0.0);
                backend.download(conv, 0, &mut v[at..at + cl])?;
                backend.download(ssm, 0, &mut v[at + cl..])?;
            }
        }
        Ok(v)
    }

    /// Rolls back to `snap` (taken from this state). KV rows at or after the snapshot's
    /// position are dropped.
    pub fn restore(
        &mut self,
        cfg: &ModelConfig,
        backend: &B,
        snap: &Snapshot<B>,
    ) -> Result<(), ModelError> {
        for (l, s) in self.layers.iter_mut().zip(snap.layers.iter()) {
            if let (LayerState::DeltaNet(GdnState { conv, ssm }), Some((c, st))) = (l, s) {
                backend.copy(c, 0, conv, 0, cfg.gdn.conv_state_len())?;
                backend.copy(st, 0, ssm, 0, cfg.gdn.state_len())?;
            }
        }
        self.pos = snap.pos;
        self.mtp_len = snap.mtp_len;
        Ok(())
    }
}
