//! Where the time of a load went: wall and process CPU time of each phase (open, validation,
//! binding, tokenizer, chat template), and the resident memory after it, for `pn bench` and
//! `pn run`'s load line (issue #16: open to first token < 10 s on a 12 GB file, resident memory
//! at most file size + 5% + KV + state).

use std::time::{Duration, Instant};

/// One phase of a load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadPhase {
    /// What was done (`"open"`, `"validate"`, `"bind"`, `"tokenizer"`, `"template"`).
    pub name: &'static str,
    /// Wall-clock time.
    pub wall: Duration,
    /// CPU time of the whole process (every thread) during the phase.
    pub cpu: Duration,
}

/// The phases of one load, in order, and the memory the process held after it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// The phases, in the order they ran.
    pub phases: Vec<LoadPhase>,
    /// Resident memory after the load (`VmRSS`), bytes; `None` where the system does not say.
    pub resident_bytes: Option<u64>,
    /// The part of it that is mapped file pages (`RssFile`: the model's mapped weights).
    pub resident_file_bytes: Option<u64>,
}

impl LoadReport {
    /// Total wall time of the phases.
    pub fn wall(&self) -> Duration {
        self.phases.iter().map(|p| p.wall).sum()
    }

    /// Total process CPU time of the phases.
    pub fn cpu(&self) -> Duration {
        self.phases.iter().map(|p| p.cpu).sum()
    }
}

impl std::fmt::Display for LoadReport {
    /// `load 2.31 s wall, 3.90 s cpu (open 0.00/0.00, validate 1.20/2.35, ...); resident
    /// 11.95 GiB (file 11.90 GiB)`: each phase as wall/cpu seconds.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "load {:.2} s wall, {:.2} s cpu (",
            self.wall().as_secs_f64(),
            self.cpu().as_secs_f64()
        )?;
        for (i, p) in self.phases.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(
                f,
                "{sep}{} {:.2}/{:.2}",
                p.name,
                p.wall.as_secs_f64(),
                p.cpu.as_secs_f64()
            )?;
        }
        write!(f, " s wall/cpu)")?;
        if let Some(r) = self.resident_bytes {
            write!(f, "; resident {:.2} GiB", gib(r))?;
            if let Some(m) = self.resident_file_bytes {
                write!(f, " (mapped file {:.2} GiB)", gib(m))?;
            }
        }
        Ok(())
    }
}

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

/// Times phases as they end: [`PhaseClock::lap`] closes the phase started at the previous lap.
pub(crate) struct PhaseClock {
    wall: Instant,
    cpu: Duration,
    phases: Vec<LoadPhase>,
}

impl PhaseClock {
    /// Starts the first phase now.
    pub(crate) fn start() -> PhaseClock {
        PhaseClock {
            wall: Instant::now(),
            cpu: process_cpu(),
            phases: Vec::new(),
        }
    }

    /// Ends the current phase as `name` and starts the next.
    pub(crate) fn lap(&mut self, name: &'static str) {
        let (wall, cpu) = (Instant::now(), process_cpu());
        self.phases.push(LoadPhase {
            name,
            wall: wall - self.wall,
            cpu: cpu.saturating_sub(self.cpu),
        });
        (self.wall, self.cpu) = (wall, cpu);
    }

    /// The phases so far, with the resident memory now.
    pub(crate) fn finish(self) -> LoadReport {
        let status = std::fs::read_to_string("/proc/self/status").ok();
        let field = |key: &str| status.as_deref().and_then(|s| status_kib(s, key));
        LoadReport {
            phases: self.phases,
            resident_bytes: field("VmRSS:"),
            resident_file_bytes: field("RssFile:"),
        }
    }
}

/// CPU time of the whole process so far (all threads, user + system).
pub fn process_cpu() -> Duration {
    #[cfg(unix)]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid timespec to write into.
        if unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) } == 0 {
            return Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32);
        }
    }
    Duration::ZERO
}

/// A `/proc/self/status` line such as `VmRSS:  12345 kB`, in bytes.
fn status_kib(status: &str, key: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line[key.len()..].split_whitespace().next()?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_parse_in_bytes() {
        let s = "Name:\tpn\nVmRSS:\t  2048 kB\nRssFile:\t1024 kB\n";
        assert_eq!(status_kib(s, "VmRSS:"), Some(2048 * 1024));
        assert_eq!(status_kib(s, "RssFile:"), Some(1024 * 1024));
        assert_eq!(status_kib(s, "RssAnon:"), None);
    }

    #[test]
    fn phases_are_timed_in_order_and_summed() {
        let mut clock = PhaseClock::start();
        // Burn a little CPU so the process clock moves.
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        clock.lap("open");
        clock.lap("validate");
        let r = clock.finish();
        let names: Vec<_> = r.phases.iter().map(|p| p.name).collect();
        assert_eq!(names, ["open", "validate"]);
        assert_eq!(r.wall(), r.phases[0].wall + r.phases[1].wall);
        assert!(r.cpu() > Duration::ZERO, "{r:?}");
        let text = r.to_string();
        assert!(text.starts_with("load ") && text.contains("open ") && text.contains("validate "));
        if cfg!(target_os = "linux") {
            assert!(r.resident_bytes.is_some_and(|b| b > 0), "{r:?}");
        }
    }
}
