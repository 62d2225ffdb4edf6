//! Prompt cache for a hybrid model: checkpoints of the recurrent state at chosen positions.
//!
//! A session's attention KV cache can be cut back to any length (the rows past it are simply
//! overwritten later), but the Gated DeltaNet layers keep one recurrent state and one conv state
//! that every token overwrites: they cannot be rewound. To reuse a cached prefix after the
//! sequence diverged at position `p`, the session restores the recurrent state from the nearest
//! checkpoint at or before `p`, keeps the KV rows before it, and recomputes only the tokens after
//! the checkpoint.
//!
//! Checkpoints are taken while a prompt is processed: every `interval` tokens (absolute
//! positions that are multiples of it), before the last two `<|im_start|>` of the processed
//! tokens (the last message, usually the new user one: the end of the previous turn, where a
//! request that edits or replaces that message diverges; and the start of the assistant turn,
//! where a re-rendered conversation diverges when the chat template rewrites earlier assistant
//! turns, e.g. strips their thinking) and at the end of the prompt (with the logits there, so the same prompt again,
//! a regenerated reply, needs no forward pass at all).
//!
//! Size of one checkpoint: the conv state `(kernel - 1) x conv_dim` and the recurrent state
//! `Hv x dv x dk` of every GDN layer, in f32 ([`checkpoint_bytes`]), plus `vocab` f32 logits for
//! prompt-end checkpoints. The demo model: 6 GDN layers x (3 x 512 + 4 x 64 x 64) floats =
//! 430,080 bytes. The 27B shape: 48 x (3 x 10,240 + 48 x 128 x 128) floats = 156,893,184 bytes
//! (149.6 MiB), plus 0.95 MiB of logits.
//!
//! Memory stays bounded: at most `max_checkpoints` are kept. Eviction rule: the three newest
//! checkpoints (the current request's turn end, assistant start and prompt end) are kept; among the others the one with the lowest *level*
//! goes, where an interval checkpoint at `k x interval` has level `1 + trailing_zeros(k)` and
//! any other (turn start, prompt end) level 0; ties go to the one whose removal leaves the
//! smallest gap between its neighbours, then to the older. Like a binary counter, the kept
//! interval checkpoints thin out to ever rounder positions as a long prompt grows (spacing
//! doubling towards the start, so recent positions, where a next request most likely diverges,
//! stay dense), and old turn checkpoints go before them, a prompt-end one a few tokens after its
//! turn-start one first. The evicted snapshot's buffers are reused for the next checkpoint (no
//! allocation churn).

use qwen_model::{Backend, LayerKind, ModelConfig, ModelError, Snapshot, State};

/// Newest checkpoints never evicted (the current request's turn end, assistant start, prompt
/// end).
const KEEP_NEWEST: usize = 3;

/// Bytes of one checkpoint's recurrent state (conv and recurrent state of every Gated DeltaNet
/// layer, f32). Prompt-end checkpoints also hold `vocab` f32 logits.
pub fn checkpoint_bytes(cfg: &ModelConfig) -> u64 {
    let gdn_layers = cfg
        .layer_kinds
        .iter()
        .filter(|k| **k == LayerKind::GatedDeltaNet)
        .count();
    (gdn_layers * (cfg.gdn.conv_state_len() + cfg.gdn.state_len()) * 4) as u64
}

/// One saved recurrent state.
pub(crate) struct Checkpoint<B: Backend> {
    /// Tokens processed when it was taken (the position of the next token).
    pub(crate) pos: usize,
    pub(crate) snap: Snapshot<B>,
    /// Logits after token `pos - 1`, kept for prompt-end checkpoints.
    pub(crate) logits: Option<Vec<f32>>,
    /// The trunk's post-norm hidden state of position `pos - 1`, when speculation carried it:
    /// the MTP head's next row pairs it with token `pos`, so a restore that lacks it leaves that
    /// row out (different drafts, so a seeded sampled run would differ from a fresh one).
    pub(crate) hidden: Option<Vec<f32>>,
    /// Creation order (larger is newer).
    seq: u64,
}

/// A session's checkpoints, all of them states of prefixes of the session's current tokens (the
/// session drops those past a point where its tokens change).
pub(crate) struct PromptCache<B: Backend> {
    /// Sorted by position; positions are distinct and never 0 (the empty state is free).
    checkpoints: Vec<Checkpoint<B>>,
    interval: usize,
    max: usize,
    /// Buffers of an evicted or dropped checkpoint, reused by the next one.
    spare: Option<Snapshot<B>>,
    next_seq: u64,
}

impl<B: Backend> PromptCache<B> {
    /// Checkpoints every `interval` tokens (0: none at fixed intervals), at most `max` kept
    /// (0: no checkpoints at all; only the live state is reused).
    pub(crate) fn new(interval: usize, max: usize) -> Self {
        PromptCache {
            checkpoints: Vec::new(),
            interval,
            max,
            spare: None,
            next_seq: 0,
        }
    }

    /// Whether checkpoints are taken at all.
    pub(crate) fn enabled(&self) -> bool {
        self.max > 0
    }

    /// Positions of the checkpoints, ascending.
    pub(crate) fn positions(&self) -> Vec<usize> {
        self.checkpoints.iter().map(|c| c.pos).collect()
    }

    /// Bytes held by the checkpoints' states and logits.
    pub(crate) fn bytes(&self, cfg: &ModelConfig) -> u64 {
        let logits: usize = self
            .checkpoints
            .iter()
            .filter_map(|c| c.logits.as_ref().map(|l| l.len() * 4))
            .sum();
        self.checkpoints.len() as u64 * checkpoint_bytes(cfg) + logits as u64
    }

    /// Drops every checkpoint.
    pub(crate) fn clear(&mut self) {
        self.truncate(0);
    }

    /// Drops the checkpoints past position `len` (the tokens after it change).
    pub(crate) fn truncate(&mut self, len: usize) {
        let keep = self.checkpoints.partition_point(|c| c.pos <= len);
        for c in self.checkpoints.drain(keep..) {
            self.spare = Some(c.snap);
        }
    }

    /// Absolute positions in `(start, end)` at which a fixed-interval checkpoint is due.
    pub(crate) fn interval_marks(&self, start: usize, end: usize) -> Vec<usize> {
        if !self.enabled() || self.interval == 0 {
            return Vec::new();
        }
        let first = (start / self.interval + 1) * self.interval;
        (first..end).step_by(self.interval).collect()
    }

    /// The newest state usable for a sequence of `full_len` tokens whose first `common` tokens
    /// equal the session's: the checkpoint with the largest position `<= common`; one at
    /// `full_len` itself only if it holds logits (otherwise the last token must be run again).
    pub(crate) fn best(&self, common: usize, full_len: usize) -> Option<&Checkpoint<B>> {
        self.checkpoints
            .iter()
            .rev()
            .find(|c| c.pos <= common && (c.pos < full_len || c.logits.is_some()))
    }

    /// Saves `state` (at position `state.pos()`, holding a prefix of the session's tokens) with
    /// the logits after its last token, if given. A checkpoint already at that position is
    /// refreshed (made newest, logits added) instead. Evicts one first when full.
    pub(crate) fn insert(
        &mut self,
        state: &State<B>,
        cfg: &ModelConfig,
        backend: &B,
        logits: Option<&[f32]>,
        hidden: Option<&[f32]>,
    ) -> Result<(), ModelError> {
        let pos = state.pos();
        if !self.enabled() || pos == 0 {
            return Ok(());
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let at = self.checkpoints.partition_point(|c| c.pos < pos);
        if let Some(c) = self.checkpoints.get_mut(at).filter(|c| c.pos == pos) {
            // Same prefix, same state: only the age and the logits change.
            c.seq = seq;
            if let Some(l) = logits {
                c.logits = Some(l.to_vec());
            }
            if let Some(h) = hidden {
                c.hidden = Some(h.to_vec());
            }
            return Ok(());
        }
        if self.checkpoints.len() >= self.max {
            let pos_list = self.positions();
            let seqs: Vec<u64> = self.checkpoints.iter().map(|c| c.seq).collect();
            // The new checkpoint is the newest: one fewer of the others is protected.
            let keep = KEEP_NEWEST.min(self.max).saturating_sub(1);
            if let Some(v) = victim(&pos_list, &seqs, pos, keep, self.interval) {
                self.spare = Some(self.checkpoints.remove(v).snap);
            }
        }
        let snap = match self.spare.take() {
            Some(mut s) => {
                state.snapshot_into(cfg, backend, &mut s)?;
                s
            }
            None => state.snapshot(cfg, backend)?,
        };
        let at = self.checkpoints.partition_point(|c| c.pos < pos);
        self.checkpoints.insert(
            at,
            Checkpoint {
                pos,
                snap,
                logits: logits.map(<[f32]>::to_vec),
                hidden: hidden.map(<[f32]>::to_vec),
                seq,
            },
        );
        Ok(())
    }
}

/// Which checkpoint to evict: `pos` ascending and distinct, `seq` their creation order, `end`
/// the sequence length, the `keep` newest never chosen. The victim has the lowest
/// [`level`]; among equals, the one whose removal leaves the smallest gap between its
/// neighbours (the previous checkpoint or 0, the next one or `end`); then the older one.
pub(crate) fn victim(
    pos: &[usize],
    seq: &[u64],
    end: usize,
    keep: usize,
    interval: usize,
) -> Option<usize> {
    let mut by_age: Vec<u64> = seq.to_vec();
    by_age.sort_unstable_by(|a, b| b.cmp(a));
    let protected = &by_age[..keep.min(by_age.len())];
    (0..pos.len())
        .filter(|&i| !protected.contains(&seq[i]))
        .min_by_key(|&i| {
            let prev = if i == 0 { 0 } else { pos[i - 1] };
            let next = pos.get(i + 1).copied().unwrap_or(end.max(pos[i]));
            (level(pos[i], interval), next - prev, seq[i])
        })
}

/// How round a checkpoint position is: `1 + trailing_zeros(k)` at `k x interval`, 0 elsewhere.
fn level(pos: usize, interval: usize) -> u32 {
    if interval > 0 && pos > 0 && pos.is_multiple_of(interval) {
        1 + (pos / interval).trailing_zeros()
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn victim_closes_the_smallest_gap_and_spares_the_newest() {
        // No interval checkpoints. At 100, 200, 203, 400 (203 the newest): removing 200 leaves
        // 100..203, the smallest gap, but 200 is the second newest and protected with keep = 2.
        let pos = [100, 200, 203, 400];
        let seq = [0, 2, 3, 1];
        assert_eq!(victim(&pos, &seq, 500, 0, 0), Some(1));
        assert_eq!(victim(&pos, &seq, 500, 1, 0), Some(1));
        // 200 and 203 kept: 100 (gap 0..200 = 200) vs 400 (gap 203..500 = 297).
        assert_eq!(victim(&pos, &seq, 500, 2, 0), Some(0));
        // Equal gaps: the older goes.
        assert_eq!(victim(&[10, 20, 30], &[5, 4, 9], 40, 0, 0), Some(1));
        assert_eq!(victim(&[10, 20, 30], &[3, 4, 9], 40, 0, 0), Some(0));
        // Everything protected, or nothing there: no victim.
        assert_eq!(victim(&[10, 20], &[0, 1], 40, 2, 0), None);
        assert_eq!(victim(&[], &[], 0, 0, 0), None);
        // Interval 100: 200 (level 2) outlives 100 and 300 (level 1); 203 (level 0) goes first.
        assert_eq!(
            victim(&[100, 200, 203, 300], &[0, 1, 2, 3], 400, 1, 100),
            Some(2)
        );
        assert_eq!(victim(&[100, 200, 300], &[0, 1, 2], 400, 0, 100), Some(0));
        assert_eq!(victim(&[100, 200, 300], &[0, 1, 2], 400, 1, 100), Some(0));
        assert_eq!(victim(&[200, 300], &[0, 1], 400, 0, 100), Some(1));
    }

    /// Streaming interval checkpoints into a small cache keeps ever rounder positions: with one
    /// free slot it holds the largest power-of-two multiple of the interval so far.
    #[test]
    fn interval_checkpoints_thin_out_like_a_binary_counter() {
        let mut pos: Vec<usize> = Vec::new();
        let mut seq: Vec<u64> = Vec::new();
        for (s, p) in (8..=96).step_by(8).enumerate() {
            if pos.len() >= 3 {
                let v = victim(&pos, &seq, p, 1, 8).unwrap();
                pos.remove(v);
                seq.remove(v);
            }
            pos.push(p);
            seq.push(s as u64);
        }
        assert_eq!(pos, [64, 88, 96]);
    }

    /// The 27B shape of `qwen38-architecture.md` (section 1): 48 GDN layers of 16 key heads and
    /// 48 value heads of 128, conv kernel 4; 16 attention layers (no recurrent state).
    #[test]
    fn checkpoint_size_of_the_27b_shape() {
        let layer_kinds = (0..64)
            .map(|i| {
                if (i + 1) % 4 == 0 {
                    LayerKind::FullAttention
                } else {
                    LayerKind::GatedDeltaNet
                }
            })
            .collect();
        let cfg = ModelConfig {
            hidden: 5120,
            n_layers: 64,
            n_mtp: 1,
            ffn: 17408,
            n_q_heads: 24,
            n_kv_heads: 4,
            head_dim: 256,
            rms_eps: 1e-6,
            context_length: 262_144,
            rope_theta: 1e7,
            rope_dims: 64,
            gdn: qwen_model::GdnDims {
                n_k_heads: 16,
                n_v_heads: 48,
                dk: 128,
                dv: 128,
                conv_kernel: 4,
            },
            vocab: 248_320,
            layer_kinds,
            rotation: None,
        };
        // Section 5 of the architecture reference: 144 MiB recurrent + 5.625 MiB conv.
        assert_eq!(checkpoint_bytes(&cfg), 156_893_184);
        assert_eq!(
            checkpoint_bytes(&cfg),
            (144 << 20) + (5 << 20) + (5 << 20) / 8
        );
    }

    #[test]
    fn interval_marks_are_absolute_multiples() {
        let c = PromptCache::<qwen_model::CpuBackend>::new(64, 4);
        assert_eq!(c.interval_marks(0, 64), Vec::<usize>::new());
        assert_eq!(c.interval_marks(0, 65), vec![64]);
        assert_eq!(c.interval_marks(64, 200), vec![128, 192]);
        assert_eq!(c.interval_marks(70, 128), Vec::<usize>::new());
        let off = PromptCache::<qwen_model::CpuBackend>::new(64, 0);
        assert!(off.interval_marks(0, 1000).is_empty());
        let no_interval = PromptCache::<qwen_model::CpuBackend>::new(0, 4);
        assert!(no_interval.interval_marks(0, 1000).is_empty());
    }
}
