//! Logits kept on the backend after a pass ([`Workspace::keep_next_logits`]): decoding reads
//! the best `k` of a row ([`Backend::top_k`]: on a device backend only those pairs come back)
//! and downloads the whole row only where a sampling stage reads it.

use super::{Model, Workspace, NO_ROW};
use crate::backend::Backend;
use crate::error::ModelError;

impl<B: Backend> Model<B> {
    /// The workspace offset of row `row` of sequence `seq`'s kept logits (sequences numbered
    /// in the order of the pass; a lone [`forward`](Self::forward) is sequence 0).
    fn kept_offset(&self, ws: &Workspace<B>, seq: usize, row: usize) -> Result<usize, ModelError> {
        match ws.kept_rows.get(seq) {
            Some(&(at, k)) if at != NO_ROW && row < k => Ok((at + row) * self.config.vocab),
            _ => Err(ModelError::BadArgument(format!(
                "no kept logits for row {row} of sequence {seq} (the last pass with logits kept \
                 {} sequences; keep_next_logits must come before it)",
                ws.kept_rows.len()
            ))),
        }
    }

    /// The `k` best `(id, logit)` among ids `0..n_ids` of row `row` of sequence `seq`'s logits
    /// kept by the last pass, into `out` (cleared first), in the sampler's order
    /// ([`crate::topk::top_k_row`]). An error when that pass kept no such row.
    pub fn kept_top_k(
        &self,
        ws: &Workspace<B>,
        (seq, row): (usize, usize),
        n_ids: usize,
        k: usize,
        out: &mut Vec<(u32, f32)>,
    ) -> Result<(), ModelError> {
        let off = self.kept_offset(ws, seq, row)?;
        let n = n_ids.min(self.config.vocab);
        self.backend.top_k(&ws.logits, off, n, k, out)
    }

    /// Downloads row `row` of sequence `seq`'s logits kept by the last pass into `dst`
    /// (`[vocab]`): what the pass would have written into its `Outputs::logits`.
    pub fn kept_logits(
        &self,
        ws: &Workspace<B>,
        (seq, row): (usize, usize),
        dst: &mut [f32],
    ) -> Result<(), ModelError> {
        let v = self.config.vocab;
        if dst.len() != v {
            return Err(ModelError::BadArgument(format!(
                "kept logits row into {} floats, expected {v}",
                dst.len()
            )));
        }
        let off = self.kept_offset(ws, seq, row)?;
        self.backend.download(&ws.logits, off, dst)
    }
}
