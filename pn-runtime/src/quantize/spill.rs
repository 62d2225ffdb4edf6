//! A hidden scratch file beside the output that holds the ranking pass's encoded tensors until
//! the main pass copies them; removed on drop (also on error or interrupt).

use super::error::QuantizeError;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// An append-then-read scratch file.
pub struct Spill {
    path: PathBuf,
    file: File,
    len: u64,
}

impl Spill {
    /// Creates `dir/.name.rank-PID` next to `output`.
    pub fn create(output: &Path) -> Result<Spill, QuantizeError> {
        let name = output
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "out.gguf".into());
        let path = output.with_file_name(format!(".{name}.rank-{}", std::process::id()));
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(|e| io_err(&path, e))?;
        Ok(Spill { path, file, len: 0 })
    }

    /// Appends `bytes`; returns their offset.
    pub fn append(&mut self, bytes: &[u8]) -> Result<u64, QuantizeError> {
        let off = self.len;
        self.file
            .seek(SeekFrom::Start(off))
            .and_then(|_| self.file.write_all(bytes))
            .map_err(|e| io_err(&self.path, e))?;
        self.len += bytes.len() as u64;
        Ok(off)
    }

    /// Reads `len` bytes at `off`.
    pub fn read(&mut self, off: u64, len: u64) -> Result<Vec<u8>, QuantizeError> {
        let mut buf = vec![0u8; len as usize];
        self.file
            .seek(SeekFrom::Start(off))
            .and_then(|_| self.file.read_exact(&mut buf))
            .map_err(|e| io_err(&self.path, e))?;
        Ok(buf)
    }
}

fn io_err(path: &Path, e: std::io::Error) -> QuantizeError {
    if super::output::is_disk_full(&e) {
        QuantizeError::DiskFull {
            path: path.to_path_buf(),
            needed: 0,
        }
    } else {
        QuantizeError::Write {
            path: path.to_path_buf(),
            source: e,
        }
    }
}

impl Drop for Spill {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
