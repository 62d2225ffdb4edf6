//! `cargo xtask golden`: reruns the golden set (PN vectors, stock decoders, tokenizer and chat
//! template, the tiny oracle model F16 and PN3, demo-model transcripts) and compares every case
//! with its reviewed snapshot in `xtask/golden/` (insta's `.snap` layout). Prints a table and
//! fails on any regression; `--bless` rewrites the snapshots after review.

mod case;
mod cases;
mod report;
mod snapshot;

use case::{Backend, Case, Ctx, Run};
use clap::{Parser, ValueEnum};
use report::{Row, Status};
use snapshot::Snapshot;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Which backends to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendChoice {
    /// The CPU backend only.
    Cpu,
    /// CUDA only (skipped with the reason when no device or no kernels).
    Cuda,
    /// Every backend (the default).
    All,
}

/// Arguments of `cargo xtask golden`.
#[derive(Debug, Parser)]
pub struct Args {
    /// Rewrite the snapshots of the cases run (review the diff before committing).
    #[arg(long)]
    pub bless: bool,
    /// Backends to run.
    #[arg(long, value_enum, default_value = "all")]
    pub backend: BackendChoice,
    /// Run only the cases whose name contains this.
    #[arg(long)]
    pub filter: Option<String>,
    /// Snapshot folder (default: xtask/golden).
    #[arg(long)]
    pub snapshots: Option<PathBuf>,
}

/// How a run is set up (the CLI's arguments, or a test's).
pub struct Options {
    /// Rewrite snapshots instead of comparing.
    pub bless: bool,
    /// Backends to run.
    pub backend: BackendChoice,
    /// Name filter.
    pub filter: Option<String>,
    /// Snapshot folder.
    pub snapshots: PathBuf,
    /// Inputs.
    pub ctx: Ctx,
}

/// The workspace's `xtask/golden`.
pub fn default_snapshot_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("golden")
}

/// The workspace's `tests/data`.
pub fn default_data_dir() -> PathBuf {
    pn_tests::data_dir()
}

fn wanted(o: &Options, c: &Case) -> bool {
    let backend = match o.backend {
        BackendChoice::All => true,
        BackendChoice::Cpu => c.backend == Backend::Cpu,
        BackendChoice::Cuda => c.backend == Backend::Cuda,
    };
    backend
        && o.filter
            .as_ref()
            .is_none_or(|f| c.name.contains(f.as_str()))
}

/// Runs one case and compares (or blesses) its snapshot.
fn run_case(o: &Options, c: &Case) -> Row {
    let t0 = Instant::now();
    let path = snapshot::path_for(&o.snapshots, c.name, c.backend.name());
    let label = format!("{}@{}", c.name, c.backend.name());
    let status = match (c.run)(&o.ctx) {
        Err(e) => Status::Error(e.to_string()),
        Ok(Run::Skipped(reason)) => Status::Skip(reason),
        Ok(Run::Done(out)) => {
            let snap = Snapshot {
                case: label.clone(),
                tolerance: c.tolerance.describe(),
                fields: out.fields,
            };
            if o.bless {
                match std::fs::write(&path, snap.render()) {
                    Ok(()) if out.violations.is_empty() => Status::Blessed,
                    Ok(()) => Status::Fail {
                        max_abs_diff: None,
                        reasons: out.violations,
                    },
                    Err(e) => Status::Error(format!("{}: {e}", path.display())),
                }
            } else {
                compare_with_file(&path, &snap, c.tolerance.abs(), out.violations)
            }
        }
    };
    Row {
        case: c.name.to_string(),
        backend: c.backend.name(),
        status,
        seconds: t0.elapsed().as_secs_f64(),
    }
}

fn compare_with_file(path: &Path, got: &Snapshot, tol: f64, violations: Vec<String>) -> Status {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Status::New(path.display().to_string())
        }
        Err(e) => return Status::Error(format!("{}: {e}", path.display())),
    };
    let want = match Snapshot::parse(&text, path) {
        Ok(s) => s,
        Err(e) => return Status::Error(e.to_string()),
    };
    let cmp = snapshot::compare(&got.fields, &want.fields, tol);
    let bounded = got.fields.iter().any(|f| f.kind == snapshot::Kind::Bounded);
    let max_abs_diff = bounded.then_some(cmp.max_abs_diff);
    let mut reasons = violations;
    reasons.extend(cmp.failures);
    if reasons.is_empty() {
        Status::Pass {
            max_abs_diff,
            moved: cmp.moved,
        }
    } else {
        Status::Fail {
            max_abs_diff,
            reasons,
        }
    }
}

/// Runs the selected cases of `cases`; returns the table rows.
pub fn run_cases(o: &Options, cases: &[Case]) -> Vec<Row> {
    if o.bless {
        if let Err(e) = std::fs::create_dir_all(&o.snapshots) {
            eprintln!("cannot create {}: {e}", o.snapshots.display());
        }
    }
    let mut rows = Vec::new();
    for c in cases.iter().filter(|c| wanted(o, c)) {
        eprintln!("golden: running {}@{}", c.name, c.backend.name());
        rows.push(run_case(o, c));
    }
    rows
}

/// `cargo xtask golden`.
pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    if cfg!(debug_assertions) {
        eprintln!("golden: note: a debug build (use `cargo xtask golden`, which builds --release)");
    }
    let scratch = std::env::temp_dir().join(format!("pn-golden-{}", std::process::id()));
    let o = Options {
        bless: args.bless,
        backend: args.backend,
        filter: args.filter,
        snapshots: args.snapshots.unwrap_or_else(default_snapshot_dir),
        ctx: Ctx {
            data: default_data_dir(),
            scratch: scratch.clone(),
            tiny_model: None,
        },
    };
    let rows = run_cases(&o, &cases::all());
    let _ = std::fs::remove_dir_all(&scratch);
    print!("{}", report::table(&rows));
    if rows.is_empty() {
        return Err("no case matches the filter".into());
    }
    let failed = rows.iter().filter(|r| r.status.is_failure()).count();
    if failed > 0 {
        return Err(format!(
            "{failed} golden case(s) regressed (after reviewing, `cargo xtask golden --bless` accepts the new outputs)"
        )
        .into());
    }
    Ok(())
}

#[cfg(test)]
mod tests;
