//! The output file: written under a temporary name next to the final one and renamed only once
//! complete, so an error or an interrupt never leaves a half-written model at the final path.

use super::error::QuantizeError;
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

/// A temporary output file that is deleted on drop unless [`TempOutput::commit`] ran.
#[derive(Debug)]
pub struct TempOutput {
    final_path: PathBuf,
    temp_path: PathBuf,
    committed: bool,
}

impl TempOutput {
    /// Checks the final path (exists without `force`, or is the input) and creates the temporary
    /// file beside it.
    pub fn create(
        final_path: &Path,
        input: &Path,
        force: bool,
    ) -> Result<(TempOutput, BufWriter<File>), QuantizeError> {
        if let (Ok(a), Ok(b)) = (final_path.canonicalize(), input.canonicalize()) {
            if a == b {
                return Err(QuantizeError::OutputIsInput(final_path.to_path_buf()));
            }
        }
        if final_path.exists() && !force {
            return Err(QuantizeError::OutputExists(final_path.to_path_buf()));
        }
        let temp_path = temp_name(final_path);
        let file = File::create(&temp_path).map_err(|e| QuantizeError::Write {
            path: temp_path.clone(),
            source: e,
        })?;
        let guard = TempOutput {
            final_path: final_path.to_path_buf(),
            temp_path,
            committed: false,
        };
        Ok((guard, BufWriter::with_capacity(8 << 20, file)))
    }

    /// The temporary path (for tests and messages).
    pub fn temp_path(&self) -> &Path {
        &self.temp_path
    }

    /// Flushes and syncs `file`, then renames the temporary file to the final path.
    pub fn commit(mut self, file: File) -> Result<(), QuantizeError> {
        file.sync_all().map_err(|e| self.write_err(e, 0))?;
        drop(file);
        std::fs::rename(&self.temp_path, &self.final_path).map_err(|e| QuantizeError::Write {
            path: self.final_path.clone(),
            source: e,
        })?;
        self.committed = true;
        Ok(())
    }

    /// Turns an I/O error into a typed one (disk full is its own variant).
    pub fn write_err(&self, e: std::io::Error, needed: u64) -> QuantizeError {
        if is_disk_full(&e) {
            QuantizeError::DiskFull {
                path: self.final_path.clone(),
                needed,
            }
        } else {
            QuantizeError::Write {
                path: self.final_path.clone(),
                source: e,
            }
        }
    }
}

impl Drop for TempOutput {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.temp_path);
        }
    }
}

/// `dir/.name.partial-PID`: hidden, in the same directory so the rename is atomic.
pub fn temp_name(final_path: &Path) -> PathBuf {
    let name = final_path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "out.gguf".to_string());
    final_path.with_file_name(format!(".{name}.partial-{}", std::process::id()))
}

/// True for "no space left on device" (and quota exceeded, and the process's file-size limit
/// reached: for the user the same, no room for the output).
pub fn is_disk_full(e: &std::io::Error) -> bool {
    // ENOSPC = 28, EDQUOT = 122, EFBIG = 27 (RLIMIT_FSIZE, `ulimit -f`) on Linux.
    e.kind() == std::io::ErrorKind::StorageFull
        || e.kind() == std::io::ErrorKind::FileTooLarge
        || matches!(e.raw_os_error(), Some(27) | Some(28) | Some(122))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropped_output_leaves_nothing_and_existing_needs_force() {
        let dir = std::env::temp_dir().join(format!("pnq-out-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("m.gguf");
        let input = dir.join("in.gguf");
        std::fs::write(&input, b"x").unwrap();
        {
            let (g, _w) = TempOutput::create(&out, &input, false).unwrap();
            assert!(g.temp_path().exists());
        }
        assert!(!out.exists());
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::write(&out, b"old").unwrap();
        assert!(matches!(
            TempOutput::create(&out, &input, false),
            Err(QuantizeError::OutputExists(_))
        ));
        assert!(matches!(
            TempOutput::create(&input, &input, true),
            Err(QuantizeError::OutputIsInput(_))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn enospc_is_disk_full() {
        assert!(is_disk_full(&std::io::Error::from_raw_os_error(28)));
        assert!(!is_disk_full(&std::io::Error::from_raw_os_error(2)));
    }
}
