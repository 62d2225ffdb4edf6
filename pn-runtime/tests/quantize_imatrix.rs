//! `pn quantize --imatrix` end to end on the demo model: an importance matrix (legacy flat
//! layout, one of the two `quantize/imatrix.rs` reads) changes which tensor is promoted, in the
//! way the importances say; a damaged imatrix is an error naming the file.

use gguf_io::GgufFile;
use std::path::{Path, PathBuf};
use std::process::Command;

fn demo_f16() -> PathBuf {
    pn_tests::data(pn_tests::DEMO, "model-f16.gguf")
}

/// Runs `pn quantize` with `--promote 1` and returns the promoted tensor names.
fn promoted_by_pn(out: &Path, extra: &[&str]) -> Vec<String> {
    let o = Command::new(env!("CARGO_BIN_EXE_pn"))
        .args(["quantize", "--promote", "1", "--threads", "2", "--quiet"])
        .args(extra)
        .arg(demo_f16())
        .arg(out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let f = GgufFile::open(out).unwrap();
    let v = f
        .get_str_array("pn.promoted")
        .unwrap()
        .into_iter()
        .map(str::to_string)
        .collect();
    std::fs::remove_file(out).unwrap();
    v
}

/// Per-column sums of squares of an F16 matrix `[rows, k]`.
fn column_norms(f: &GgufFile, name: &str) -> Vec<f64> {
    let info = f.tensor_info(name).unwrap().clone();
    let k = info.dims[0] as usize;
    let t = f.tensor(name).unwrap();
    let rows = info.dims[1] as usize;
    let rb = t.bytes.len() / rows;
    let mut norms = vec![0f64; k];
    let mut w = vec![0f32; k];
    for r in 0..rows {
        gguf_io::quants::dequantize_row(info.ty, &t.bytes[r * rb..(r + 1) * rb], &mut w).unwrap();
        for (n, v) in norms.iter_mut().zip(&w) {
            *n += (*v as f64) * (*v as f64);
        }
    }
    norms
}

/// The legacy imatrix layout: `i32 n`, then per entry `i32 len, name, i32 ncall, i32 nval,
/// f32 values[nval]`.
fn legacy_imatrix(entries: &[(&str, Vec<f32>)]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&(entries.len() as i32).to_le_bytes());
    for (name, vals) in entries {
        b.extend_from_slice(&(name.len() as i32).to_le_bytes());
        b.extend_from_slice(name.as_bytes());
        b.extend_from_slice(&1i32.to_le_bytes());
        b.extend_from_slice(&(vals.len() as i32).to_le_bytes());
        for v in vals {
            b.extend_from_slice(&v.to_le_bytes());
        }
    }
    b
}

#[test]
fn imatrix_steers_promotion() {
    let d = std::env::temp_dir().join(format!("pnq-imatrix-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let out = d.join("m.gguf");
    let plain = promoted_by_pn(&out, &[]);
    assert_eq!(plain.len(), 1);

    // Pick a pn3t candidate that is not promoted without an imatrix, and say that only its
    // weakest input column matters (an activation that is large exactly where the weights are
    // small). Quantization error is spread evenly over a block while that column's weights are
    // tiny, so its importance-weighted relative error is far above any tensor's plain error.
    let target = "blk.0.attn_gate.weight";
    assert_ne!(plain[0], target);
    let f = GgufFile::open(demo_f16()).unwrap();
    let norms = column_norms(&f, target);
    let weakest = (0..norms.len())
        .min_by(|&a, &b| norms[a].total_cmp(&norms[b]))
        .unwrap();
    let mut imp = vec![1e-6f32; norms.len()];
    imp[weakest] = 1.0;
    let imatrix = d.join("demo.imatrix.dat");
    std::fs::write(&imatrix, legacy_imatrix(&[(target, imp)])).unwrap();

    let steered = promoted_by_pn(&out, &["--imatrix", imatrix.to_str().unwrap()]);
    assert_eq!(steered, vec![target.to_string()], "plain: {plain:?}");

    // A broken file is a clear error naming it, and leaves nothing behind.
    std::fs::write(&imatrix, [1u8, 0, 0, 0, 200]).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_pn"))
        .args(["quantize", "--imatrix", imatrix.to_str().unwrap()])
        .arg(demo_f16())
        .arg(&out)
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("demo.imatrix.dat"), "{err}");
    assert!(!out.exists());
    std::fs::remove_dir_all(&d).unwrap();
}
