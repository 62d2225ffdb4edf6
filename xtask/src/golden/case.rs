//! What a golden case is: a name, a backend, a tolerance, and a function producing fields.

use super::snapshot::Field;
use std::path::PathBuf;

/// Error type of case bodies.
pub type CaseError = Box<dyn std::error::Error + Send + Sync>;

/// Where a case runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The CPU (kernels picked at run time: AVX-512, AVX2 or scalar).
    Cpu,
    /// CUDA device 0.
    Cuda,
}

impl Backend {
    /// Table and file-name spelling.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Cuda => "cuda",
        }
    }
}

/// How bounded fields are compared (exact fields are always byte for byte).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Tolerance {
    /// Every field byte for byte.
    Exact,
    /// Bounded fields within this absolute difference.
    Abs(f64),
}

impl Tolerance {
    /// The bound applied to bounded fields.
    pub fn abs(self) -> f64 {
        match self {
            Tolerance::Exact => 0.0,
            Tolerance::Abs(t) => t,
        }
    }

    /// Text for the table's front matter and the README.
    pub fn describe(self) -> String {
        match self {
            Tolerance::Exact => "exact".into(),
            Tolerance::Abs(t) => format!("abs {t:.0e}"),
        }
    }
}

/// Inputs every case reads: the test-data folder and a scratch folder.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// `tests/data` of the workspace.
    pub data: PathBuf,
    /// A private scratch folder (quantized models).
    pub scratch: PathBuf,
    /// Overrides the tiny F16 model (the regression test points this at a perturbed copy).
    pub tiny_model: Option<PathBuf>,
}

impl Ctx {
    /// A file under `tests/data/<folder>/`.
    pub fn file(&self, folder: &str, name: &str) -> PathBuf {
        self.data.join(folder).join(name)
    }

    /// The tiny-qwen35 F16 model (or its override).
    pub fn tiny_model(&self) -> PathBuf {
        self.tiny_model
            .clone()
            .unwrap_or_else(|| self.file("tiny-qwen35", "model-f16.gguf"))
    }
}

/// What a case run produced.
#[derive(Debug, Default)]
pub struct Output {
    /// Fields compared with the snapshot.
    pub fields: Vec<Field>,
    /// Fixed-bound checks that failed (e.g. distance to the transformers oracle): a failure
    /// whatever the snapshot says.
    pub violations: Vec<String>,
}

impl Output {
    /// Records a fixed-bound check: a violation when `ok` is false.
    pub fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            self.violations.push(what());
        }
    }
}

/// The result of a case: produced output, or skipped with a reason.
pub enum Run {
    /// Ran.
    Done(Output),
    /// Not run here (printed reason).
    Skipped(String),
}

/// The body of a case.
pub type CaseFn = Box<dyn Fn(&Ctx) -> Result<Run, CaseError>>;

/// One golden case.
pub struct Case {
    /// Name shown in the table, `group/name`.
    pub name: &'static str,
    /// Backend it runs on.
    pub backend: Backend,
    /// Comparison of bounded fields.
    pub tolerance: Tolerance,
    /// Produces the fields.
    pub run: CaseFn,
}

/// sha256 of bytes, hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// sha256 of f32 values' little-endian bits (exact identity of a float vector).
pub fn f32_digest(v: &[f32]) -> String {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    sha256_hex(&bytes)
}

/// `[1, 2, 3]`.
pub fn ids_text(ids: &[u32]) -> String {
    format!("{ids:?}")
}
