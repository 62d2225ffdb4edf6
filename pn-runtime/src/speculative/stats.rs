//! Counters of a speculative run.

/// What a speculative run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Batched target verification passes.
    pub target_passes: u64,
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
    /// Tokens the trunk re-ran after a rollback: 0 since rollbacks copy the states the
    /// verification pass recorded (kept so reports and tests can check it stays so).
    pub replayed: u64,
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
}
