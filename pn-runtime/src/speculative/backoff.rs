//! The acceptance back-off of the speculative decoder: drafting pauses while drafts keep being
//! rejected.

/// Drafting pauses while the running acceptance rate is below this. A rejected draft costs its
/// row of the verification pass (the rollback copies the GDN state recorded after the accepted
/// prefix, no replay pass), and a drafter that is never right (a random or mismatched MTP
/// head) still wastes those rows and the drafting itself.
pub const MIN_ACCEPTANCE: f32 = 0.5;
/// Steps without drafting after the first low-acceptance verdict; doubles while probes keep
/// failing, up to [`MAX_PAUSE`].
const MIN_PAUSE: u32 = 8;
const MAX_PAUSE: u32 = 128;
/// Weight of the newest step in the running acceptance rate.
const EMA_WEIGHT: f32 = 0.25;

/// Deterministic back-off (it depends only on the accept/reject history, so a seeded run is
/// reproducible): drafting stops for a while when drafts keep being rejected, then probes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Backoff {
    ema: f32,
    pause: u32,
    next_pause: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            ema: 1.0,
            pause: 0,
            next_pause: MIN_PAUSE,
        }
    }
}

impl Backoff {
    /// Whether this step may draft (counts down a pause).
    pub(super) fn may_draft(&mut self) -> bool {
        if self.pause > 0 {
            self.pause -= 1;
            return false;
        }
        true
    }

    /// Records a step that drafted `drafted > 0` tokens and accepted `accepted`.
    pub(super) fn record(&mut self, drafted: usize, accepted: usize) {
        let rate = accepted as f32 / drafted as f32;
        self.ema = (1.0 - EMA_WEIGHT) * self.ema + EMA_WEIGHT * rate;
        if self.ema < MIN_ACCEPTANCE {
            self.pause = self.next_pause;
            self.next_pause = (self.next_pause * 2).min(MAX_PAUSE);
            // The probe after the pause is judged on its own result, from just above the bar.
            self.ema = MIN_ACCEPTANCE + EMA_WEIGHT * 0.5;
        } else if rate >= MIN_ACCEPTANCE {
            self.next_pause = MIN_PAUSE;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_pauses_doubles_and_recovers() {
        let mut b = Backoff::default();
        // Always rejected: 1.0 -> 0.75 -> 0.56 -> 0.42 < 0.5 on the third step.
        for _ in 0..2 {
            assert!(b.may_draft());
            b.record(2, 0);
            assert_eq!(b.pause, 0);
        }
        assert!(b.may_draft());
        b.record(2, 0);
        assert_eq!(b.pause, MIN_PAUSE);
        for _ in 0..MIN_PAUSE {
            assert!(!b.may_draft());
        }
        // A failed probe pauses twice as long.
        assert!(b.may_draft());
        b.record(2, 0);
        assert_eq!(b.pause, 2 * MIN_PAUSE);
        while !b.may_draft() {}
        // A good probe ends the doubling; steady acceptance keeps drafting on.
        b.record(2, 2);
        assert_eq!(b.next_pause, MIN_PAUSE);
        for _ in 0..50 {
            assert!(b.may_draft());
            b.record(2, 1);
        }
        assert_eq!(b.pause, 0);
    }
}
