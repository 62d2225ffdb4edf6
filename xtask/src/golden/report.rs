//! The result table.

use std::fmt::Write as _;

/// Outcome of one case.
#[derive(Debug, Clone)]
pub enum Status {
    /// Matches the snapshot (`moved`: some bounded value differs, within tolerance).
    Pass {
        /// Largest bounded difference, for cases with bounded fields.
        max_abs_diff: Option<f64>,
        /// Whether anything differs at all.
        moved: bool,
    },
    /// Regressed: each reason names a field or a fixed check.
    Fail {
        /// Largest bounded difference, when compared.
        max_abs_diff: Option<f64>,
        /// What differs.
        reasons: Vec<String>,
    },
    /// No snapshot yet (a failure until blessed).
    New(String),
    /// Snapshot written.
    Blessed,
    /// Not run on this machine.
    Skip(String),
    /// The case could not run (missing file, load error).
    Error(String),
}

impl Status {
    /// Whether the run must exit non-zero.
    pub fn is_failure(&self) -> bool {
        matches!(
            self,
            Status::Fail { .. } | Status::New(_) | Status::Error(_)
        )
    }

    fn word(&self) -> &'static str {
        match self {
            Status::Pass { moved: false, .. } => "ok",
            Status::Pass { moved: true, .. } => "ok~",
            Status::Fail { .. } => "FAIL",
            Status::New(_) => "NEW",
            Status::Blessed => "blessed",
            Status::Skip(_) => "skip",
            Status::Error(_) => "ERROR",
        }
    }

    fn detail(&self) -> String {
        let diff = |d: &Option<f64>| d.map(|d| format!("max abs diff {d:.2e}"));
        match self {
            Status::Pass { max_abs_diff, .. } => {
                diff(max_abs_diff).unwrap_or_else(|| "identical".into())
            }
            Status::Fail {
                max_abs_diff,
                reasons,
            } => {
                let mut s = reasons.first().cloned().unwrap_or_default();
                if reasons.len() > 1 {
                    let _ = write!(s, " (+{} more)", reasons.len() - 1);
                }
                match diff(max_abs_diff) {
                    Some(d) => format!("{d}; {s}"),
                    None => s,
                }
            }
            Status::New(p) => format!("no snapshot {p}: run with --bless"),
            Status::Blessed => "snapshot written".into(),
            Status::Skip(r) | Status::Error(r) => r.clone(),
        }
    }
}

/// One table row.
#[derive(Debug, Clone)]
pub struct Row {
    /// Case name.
    pub case: String,
    /// Backend name.
    pub backend: &'static str,
    /// Outcome.
    pub status: Status,
    /// Wall time of the case.
    pub seconds: f64,
}

/// The table, then every failure reason in full.
pub fn table(rows: &[Row]) -> String {
    let w = rows.iter().map(|r| r.case.len()).max().unwrap_or(4).max(4);
    let mut s = format!(
        "{:<w$}  {:<7}  {:<7}  {:>6}  detail (max abs diff / first difference)\n",
        "case", "backend", "status", "time"
    );
    let _ = writeln!(s, "{}", "-".repeat(w + 72));
    for r in rows {
        let _ = writeln!(
            s,
            "{:<w$}  {:<7}  {:<7}  {:>5.1}s  {}",
            r.case,
            r.backend,
            r.status.word(),
            r.seconds,
            r.status.detail()
        );
    }
    for r in rows {
        if let Status::Fail { reasons, .. } = &r.status {
            let _ = writeln!(s, "\n{}@{} regressed:", r.case, r.backend);
            for reason in reasons.iter().take(20) {
                let _ = writeln!(s, "  {reason}");
            }
            if reasons.len() > 20 {
                let _ = writeln!(s, "  ... {} more", reasons.len() - 20);
            }
        }
    }
    let n = |f: fn(&Status) -> bool| rows.iter().filter(|r| f(&r.status)).count();
    let _ = writeln!(
        s,
        "\n{} cases: {} ok, {} failed, {} skipped",
        rows.len(),
        n(|s| matches!(s, Status::Pass { .. } | Status::Blessed)),
        n(Status::is_failure),
        n(|s| matches!(s, Status::Skip(_)))
    );
    s
}
