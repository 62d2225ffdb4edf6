//! The demo model built into the `pn` executable, so that any copy of it runs with no files:
//! every subcommand that takes `-m` falls back to it, the same way, through [`open_model`].

use gguf_io::GgufFile;
use std::path::{Path, PathBuf};

/// The name the built-in model goes by (in `Engine::path`, `pn bench`'s model column, errors).
pub const DEMO_NAME: &str = "demo-code-model-pn3.gguf (built in)";

/// `include_bytes!` gives a byte array with alignment 1; the backends read tensor data in place
/// as f32/f16 words at the file's offsets (multiples of its 32-byte alignment), so the bytes
/// must start on at least that boundary: the wrapper puts them on 64.
#[repr(C, align(64))]
struct Aligned<T: ?Sized>(T);

static DEMO: &Aligned<[u8]> = &Aligned(*include_bytes!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/data/demo-code-model/model-pn3.gguf"
)));

/// The built-in demo model's bytes (the PN3 file of `pn_runtime::DEMO_MODEL_PATH`).
pub fn demo_bytes() -> &'static [u8] {
    &DEMO.0
}

/// Says on stderr that the built-in demo model is used, and how to run a real one.
pub fn announce() {
    eprintln!(
        "pn: no model given (-m), using the built-in DEMO model: a 17M-parameter Qwen3.5-architecture\n\
         pn: model trained on Python source, quantized to PN3 ({:.1} MB, inside this executable).\n\
         pn: To run a real model: pn run -m /path/to/Qwen3.8-27B-PN3.gguf -p \"...\"",
        demo_bytes().len() as f64 / 1e6
    );
}

/// The GGUF of `-m PATH`, or the built-in demo model when no `-m` was given (saying so), with
/// the name it goes by.
pub fn open_model(model: Option<&Path>) -> Result<(GgufFile, PathBuf), Box<dyn std::error::Error>> {
    match model {
        Some(path) => {
            let file =
                GgufFile::open(path).map_err(|e| format!("opening {}: {e}", path.display()))?;
            Ok((file, path.to_path_buf()))
        }
        None => {
            announce();
            Ok((
                GgufFile::from_static(demo_bytes())?,
                PathBuf::from(DEMO_NAME),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The embedded bytes are the repository's demo file, on a 64-byte boundary.
    #[test]
    fn embedded_demo_is_the_file_and_aligned() {
        let bytes = demo_bytes();
        assert_eq!(bytes.as_ptr() as usize % 64, 0);
        assert_eq!(bytes, std::fs::read(pn_runtime::DEMO_MODEL_PATH).unwrap());
        let file = GgufFile::from_static(bytes).unwrap();
        assert_eq!(file.get_str("general.architecture").unwrap(), "qwen35");
    }
}
