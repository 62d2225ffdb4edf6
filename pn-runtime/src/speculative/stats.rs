//! Counters of a speculative run.

/// What a speculative run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Trunk (target) passes the speculative steps ran: one batched verification pass per
    /// step. A rollback runs none (it copies the GDN state the pass recorded).
    pub target_passes: u64,
    /// Rows those passes ran: `1 + drafts` per step (`verify_rows / target_passes` is the
    /// mean batch of a verification pass).
    pub verify_rows: u64,
    /// Draft tokens proposed.
    pub drafted: u64,
    /// Draft tokens accepted.
    pub accepted: u64,
    /// Tokens generated (accepted drafts plus one target token per pass, plus the first token
    /// from the prompt).
    pub generated: u64,
    /// Passes with a rejected draft (GDN state restored to the one recorded after the
    /// accepted rows).
    pub rollbacks: u64,
    /// Steps that did not draft because recent drafts were mostly rejected (the back-off of
    /// [`MIN_ACCEPTANCE`](super::MIN_ACCEPTANCE)).
    pub paused_steps: u64,
}

impl SpecStats {
    /// Accepted / drafted (0 when nothing was drafted).
    pub fn acceptance_rate(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }

    /// Tokens produced per target verification pass (1 + accepted drafts per pass on average).
    pub fn tokens_per_pass(&self) -> f64 {
        if self.target_passes == 0 {
            0.0
        } else {
            (self.target_passes + self.accepted) as f64 / self.target_passes as f64
        }
    }

    /// Rows per target verification pass (1 + drafts per pass on average; 0 without passes).
    pub fn rows_per_pass(&self) -> f64 {
        if self.target_passes == 0 {
            0.0
        } else {
            self.verify_rows as f64 / self.target_passes as f64
        }
    }
}

/// Sums the counters (e.g. over the repetitions of a benchmark).
impl std::ops::AddAssign for SpecStats {
    fn add_assign(&mut self, o: SpecStats) {
        self.target_passes += o.target_passes;
        self.verify_rows += o.verify_rows;
        self.drafted += o.drafted;
        self.accepted += o.accepted;
        self.generated += o.generated;
        self.rollbacks += o.rollbacks;
        self.paused_steps += o.paused_steps;
    }
}
