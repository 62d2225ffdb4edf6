//! The runner fails when something regresses: a perturbed snapshot (exact and bounded fields),
//! and a tiny model with one weight perturbed, each run in-process against the committed
//! snapshots.

use super::case::Ctx;
use super::report::Status;
use super::{cases, default_data_dir, default_snapshot_dir, run_cases, BackendChoice, Options};
use std::path::{Path, PathBuf};

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pn-golden-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn options(snapshots: &Path, filter: &str, tiny_model: Option<PathBuf>, work: &Path) -> Options {
    Options {
        bless: false,
        backend: BackendChoice::Cpu,
        filter: Some(filter.to_string()),
        snapshots: snapshots.to_path_buf(),
        ctx: Ctx {
            data: default_data_dir(),
            scratch: work.join("scratch"),
            tiny_model,
        },
    }
}

/// Copies the committed snapshot of `file` into `dir`, editing its text with `edit`.
fn copy_snapshot(dir: &Path, file: &str, edit: impl FnOnce(String) -> String) {
    let text = std::fs::read_to_string(default_snapshot_dir().join(file)).unwrap();
    std::fs::write(dir.join(file), edit(text)).unwrap();
}

fn only_status(o: &Options) -> Status {
    let rows = run_cases(o, &cases::all());
    assert_eq!(rows.len(), 1, "{rows:?}");
    rows[0].status.clone()
}

#[test]
fn a_changed_byte_in_an_exact_snapshot_fails() {
    let d = scratch("exact");
    let file = "format__pn3t-vectors@cpu.snap";
    // Unchanged: passes.
    copy_snapshot(&d, file, |t| t);
    let o = options(&d, "format/pn3t", None, &d);
    assert!(matches!(only_status(&o), Status::Pass { moved: false, .. }));
    // One hex digit of the first quantized row changed.
    copy_snapshot(&d, file, |t| {
        let i = t.find("= normal-sigma1.bytes: ").unwrap() + "= normal-sigma1.bytes: ".len() + 4;
        let mut b = t.into_bytes();
        b[i] = if b[i] == b'0' { b'1' } else { b'0' };
        String::from_utf8(b).unwrap()
    });
    match only_status(&o) {
        Status::Fail { reasons, .. } => {
            assert!(
                reasons
                    .iter()
                    .any(|r| r.starts_with("normal-sigma1.bytes: differs at char 4")),
                "{reasons:?}"
            )
        }
        s => panic!("expected a failure, got {s:?}"),
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_perturbed_weight_fails_the_tiny_model_case() {
    let d = scratch("weight");
    copy_snapshot(&d, "tiny__logits-f16@cpu.snap", |t| t);
    let o = options(&d, "tiny/logits-f16", None, &d);
    assert!(
        matches!(only_status(&o), Status::Pass { .. }),
        "the unperturbed model must pass"
    );

    // One F16 weight of layer 0's FFN down projection: 0.0-ish -> 0.5.
    let src = default_data_dir().join("tiny-qwen35/model-f16.gguf");
    let f = gguf_io::GgufFile::open(&src).unwrap();
    let info = f
        .tensor_infos()
        .iter()
        .find(|t| t.name == "blk.0.ffn_down.weight")
        .unwrap();
    assert_eq!(info.ty, gguf_io::GgmlType::F16);
    let at = (f.data_offset() + info.offset) as usize + 2 * 1000;
    drop(f);
    let mut bytes = std::fs::read(&src).unwrap();
    bytes[at..at + 2].copy_from_slice(&half::f16::from_f32(0.5).to_le_bytes());
    let perturbed = d.join("perturbed.gguf");
    std::fs::write(&perturbed, bytes).unwrap();

    let o = options(&d, "tiny/logits-f16", Some(perturbed), &d);
    match only_status(&o) {
        Status::Fail {
            reasons,
            max_abs_diff,
        } => {
            // Both nets catch it: the fixed oracle bound and the snapshot comparison.
            assert!(
                reasons
                    .iter()
                    .any(|r| r.contains("max abs diff to transformers")),
                "{reasons:?}"
            );
            assert!(
                reasons.iter().any(|r| r.contains(".logits_sample: |diff|")),
                "{reasons:?}"
            );
            assert!(max_abs_diff.unwrap() > super::cases::ORACLE_TOL as f64);
        }
        s => panic!("expected a failure, got {s:?}"),
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_bounded_value_moved_beyond_the_tolerance_fails() {
    let d = scratch("bounded");
    let file = "tiny__logits-f16@cpu.snap";
    let nudge = |delta: f64| {
        move |t: String| {
            let key = "~ a.logits_sample: ";
            let i = t.find(key).unwrap() + key.len();
            let end = i + t[i..].find(' ').unwrap();
            let v: f64 = t[i..end].parse().unwrap();
            format!("{}{:e}{}", &t[..i], v + delta, &t[end..])
        }
    };
    let o = options(&d, "tiny/logits-f16", None, &d);
    copy_snapshot(&d, file, nudge(1e-6));
    assert!(matches!(only_status(&o), Status::Pass { moved: true, .. }));
    copy_snapshot(&d, file, nudge(1e-3));
    match only_status(&o) {
        Status::Fail { reasons, .. } => {
            assert_eq!(reasons.len(), 1, "{reasons:?}");
            assert!(
                reasons[0].starts_with("a.logits_sample: |diff| 1.000e-3"),
                "{reasons:?}"
            );
        }
        s => panic!("expected a failure, got {s:?}"),
    }
    let _ = std::fs::remove_dir_all(&d);
}
