//! Launches per 27B decode token from the model's real op sequence: the 27B synthetic model's
//! header (a sparse file: shapes and types, no weight bytes) bound to
//! [`qwen_model::cuda::LaunchCounter`], which counts what the CUDA backend would launch for
//! every op `qwen-model` calls, through one decode token, a verify pass and an MTP draft row.

use qwen_model::cuda::LaunchCounter;
use qwen_model::{KvCacheType, Model, Outputs};
use std::collections::BTreeMap;

/// The counted passes.
pub(crate) struct Launches {
    /// One decode token (trunk, final norm, head, logits download).
    pub decode: u64,
    /// The decode token's launches per op.
    pub decode_ops: BTreeMap<&'static str, u64>,
    /// One verify pass over `verify_rows` rows (logits of every row).
    pub verify: u64,
    /// One MTP draft row (the MTP block, its norm, the head).
    pub draft: u64,
}

/// Removes the sparse file when dropped (also on an error path).
struct TempFile(std::path::PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Counts the launches of the 27B passes (see [`Launches`]).
pub(crate) fn count_27b(verify_rows: usize) -> Result<Launches, Box<dyn std::error::Error>> {
    let tmp =
        TempFile(std::env::temp_dir().join(format!("pn-traffic-27b-{}.gguf", std::process::id())));
    crate::synth_model::write_sparse_27b(&tmp.0)?;
    let model = Model::load(&tmp.0, LaunchCounter::new())?;
    let (vocab, d) = (model.config.vocab, model.config.hidden);
    let be = &model.backend;
    let mut state = model.new_state_with_kv(64, KvCacheType::F16)?;
    let mut ws = model.new_workspace(verify_rows.max(1))?;
    let mut logits = vec![0f32; vocab * verify_rows.max(1)];
    let mut hidden = vec![0f32; d * verify_rows.max(1)];
    // A first token so the counted ones attend over a cache, as decode does.
    model.forward(
        &mut state,
        &mut ws,
        &[1],
        Outputs::last_logits(&mut logits[..vocab]),
    )?;
    be.reset();
    model.forward(
        &mut state,
        &mut ws,
        &[2],
        Outputs::last_logits(&mut logits[..vocab]),
    )?;
    let (decode, decode_ops) = (be.total(), be.counts());
    be.reset();
    let toks: Vec<u32> = (3..3 + verify_rows as u32).collect();
    let out = Outputs {
        logits: Some(&mut logits),
        hidden: Some(&mut hidden),
        all_rows: true,
        layer_residuals: None,
    };
    model.forward(&mut state, &mut ws, &toks, out)?;
    let verify = be.total();
    be.reset();
    let pos = state.pos();
    model.mtp_forward(
        &mut state,
        &mut ws,
        &[7],
        &hidden[..d],
        pos,
        Outputs::last_logits(&mut logits[..vocab]),
    )?;
    let draft = be.total();
    Ok(Launches {
        decode,
        decode_ops,
        verify,
        draft,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The counted 27B decode token, by op, against the count by hand from `model/layers.rs`:
    /// 64 layers (48 GDN, 16 attention), every PN input produced by a fused kernel that writes
    /// its fp16 copy (the mixers' norms with the residual add of the previous FFN output, the GDN
    /// ones also writing the unrotated rows of the Q8_0 alpha/beta; the FFN norms with the
    /// residual add of the mixer output; the SwiGLU), the last FFN output's add fused into the
    /// final norm, and the mixers' fused ops.
    #[test]
    fn the_27b_decode_token_is_counted_from_the_op_sequence() {
        let l = count_27b(3).unwrap();
        let op = |name: &str| l.decode_ops.get(name).copied().unwrap_or(0);
        assert_eq!(op("add_rms_norm_hadamard_prep"), 128, "{:?}", l.decode_ops);
        assert_eq!(op("add_rms_norm"), 1, "the final norm takes the last add");
        assert_eq!(op("swiglu_hadamard_prep"), 64);
        assert_eq!(op("add"), 0, "every residual add fused into a norm");
        assert_eq!(
            op("rms_norm"),
            0,
            "the alpha/beta rows come from the fused norm"
        );
        assert_eq!(op("rms_norm_hadamard"), 0, "every rotated norm fused");
        assert_eq!(op("swiglu_hadamard"), 0);
        // The mixers (`kernels/mixer.cu`): split-K partials + the combine fused with the gate
        // and rotation; q/k norms with RoPE and the K/V pair in one launch each; the GDN's
        // l2 norms inside the decode delta rule and its gated norm fused with the rotation.
        assert_eq!(op("attention"), 2 * 16);
        assert_eq!(op("qk_norm_rope"), 16);
        assert_eq!(op("kv_write"), 16);
        assert_eq!(op("sigmoid_gate"), 0);
        // The conv1d runs inside the decode delta rule's launch.
        assert_eq!(op("gated_delta_rule"), 48);
        assert_eq!(op("conv1d_silu"), 0);
        assert_eq!(op("gated_rms_norm_hadamard"), 48);
        assert_eq!(op("gated_rms_norm"), 0);
        // The matrix products, each one launch with no fp16 conversion before it (the mixers'
        // rotated outputs write their projection's input too): per GDN layer qkv+gate
        // (grouped), alpha+beta (the grouped Q8_0 GEMV), ssm_out, FFN gate+up (grouped), down;
        // per attention layer q/k/v (grouped), o, gate+up, down; and the head.
        assert_eq!(op("matmul"), 48 * 5 + 16 * 4 + 1, "{:?}", l.decode_ops);
        assert_eq!(op("download"), 1);
        assert_eq!(l.decode, l.decode_ops.values().sum::<u64>());
        // Before the fusions: 1684 (stop 28's traffic model).
        assert!(l.decode < 1684, "{}", l.decode);
        // The goal: under 700 launches per 27B decode token (661 with the fusions).
        assert!(l.decode < 700, "{}", l.decode);
        // A verify pass of 3 rows issues more (per-row GEMVs of the stock matrices), a draft
        // row far fewer (one block).
        assert!(
            l.verify > l.decode && l.draft < l.decode / 10,
            "{} {}",
            l.verify,
            l.draft
        );
    }
}
