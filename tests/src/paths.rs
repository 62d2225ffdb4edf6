//! Where the test data lives.

use std::path::PathBuf;

/// The tiny random-weight Qwen3.5 oracle model's folder (`tests/data/tiny-qwen35`).
pub const TINY: &str = "tiny-qwen35";

/// The trained demo code model's folder (`tests/data/demo-code-model`).
pub const DEMO: &str = "demo-code-model";

/// The repository root: `$PN_REPO_ROOT` when set (a test binary built on one machine and run
/// from a copy of the checkout on another, as `scripts/gpu-check.sh` does), else the checkout
/// this crate was compiled in.
pub fn repo_root() -> PathBuf {
    match std::env::var_os("PN_REPO_ROOT") {
        Some(r) => PathBuf::from(r),
        // This crate is `<root>/tests`.
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".."),
    }
}

/// `tests/data` under [`repo_root`].
pub fn data_dir() -> PathBuf {
    repo_root().join("tests/data")
}

/// `tests/data/<folder>/<file>` under [`repo_root`] (`file` may be empty: the folder).
pub fn data(folder: &str, file: &str) -> PathBuf {
    data_dir().join(folder).join(file)
}

/// `tests/data/tiny-qwen35/<file>`: the tiny oracle model and its reference logits.
pub fn tiny(file: &str) -> PathBuf {
    data(TINY, file)
}

/// A fresh, empty directory `<temp>/<name>-<pid>` for a test's outputs (removed first if a
/// crashed run left it; the process id keeps parallel test binaries apart).
pub fn scratch_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
    d
}
