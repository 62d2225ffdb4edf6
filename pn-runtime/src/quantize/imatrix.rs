//! Importance matrices (per input column mean of `x^2`), used only to rank promotion candidates.
//!
//! Two layouts are read: the GGUF layout (`<tensor>.in_sum2` and `<tensor>.counts` tensors) and
//! the older flat binary layout (`i32 n`, then per entry `i32 len, name, i32 ncall, i32 nval,
//! f32 values[nval]`, values already averaged per call).

use super::error::QuantizeError;
use std::collections::HashMap;
use std::path::Path;

/// Column importances by tensor name.
pub type Importance = HashMap<String, Vec<f32>>;

/// Reads an importance matrix file in either layout.
pub fn load(path: &Path) -> Result<Importance, QuantizeError> {
    let bytes = std::fs::read(path).map_err(|e| QuantizeError::Imatrix {
        path: path.to_path_buf(),
        why: e.to_string(),
    })?;
    if bytes.starts_with(b"GGUF") {
        load_gguf(path, bytes)
    } else {
        parse_legacy(&bytes).map_err(|why| QuantizeError::Imatrix {
            path: path.to_path_buf(),
            why,
        })
    }
}

fn load_gguf(path: &Path, bytes: Vec<u8>) -> Result<Importance, QuantizeError> {
    let err = |why: String| QuantizeError::Imatrix {
        path: path.to_path_buf(),
        why,
    };
    let f = gguf_io::GgufFile::from_bytes(bytes).map_err(|e| QuantizeError::Gguf {
        path: path.to_path_buf(),
        source: e,
    })?;
    let mut out = Importance::new();
    for info in f.tensor_infos() {
        let Some(name) = info.name.strip_suffix(".in_sum2") else {
            continue;
        };
        let sums = f32_tensor(&f, &info.name).map_err(&err)?;
        let counts_name = format!("{name}.counts");
        let counts = f32_tensor(&f, &counts_name).map_err(&err)?;
        let k = info.dims.first().copied().unwrap_or(0) as usize;
        if k == 0 || !sums.len().is_multiple_of(k) || sums.len() / k != counts.len() {
            return Err(err(format!(
                "{}: {} sums do not match {} counts of K = {k}",
                info.name,
                sums.len(),
                counts.len()
            )));
        }
        // Several matrices (experts) share a name in MoE models; average them.
        let mut imp = vec![0f32; k];
        for (m, c) in counts.iter().enumerate() {
            let c = if *c > 0.0 { *c } else { 1.0 };
            for (j, v) in imp.iter_mut().enumerate() {
                *v += sums[m * k + j] / c / counts.len() as f32;
            }
        }
        out.insert(name.to_string(), imp);
    }
    Ok(out)
}

fn f32_tensor(f: &gguf_io::GgufFile, name: &str) -> Result<Vec<f32>, String> {
    let t = f.tensor(name).map_err(|e| e.to_string())?;
    if t.ty != gguf_io::GgmlType::F32 {
        return Err(format!("{name}: type {} (expected f32)", t.ty.name()));
    }
    Ok(t.bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// Parses the flat binary layout.
pub fn parse_legacy(bytes: &[u8]) -> Result<Importance, String> {
    let mut pos = 0usize;
    let mut take = |n: usize, what: &str| -> Result<&[u8], String> {
        let end = pos
            .checked_add(n)
            .filter(|&e| e <= bytes.len())
            .ok_or_else(|| format!("truncated: {what} needs {n} bytes at offset {pos}"))?;
        let s = &bytes[pos..end];
        pos = end;
        Ok(s)
    };
    let read_i32 = |s: &[u8]| i32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    let n = read_i32(take(4, "entry count")?);
    if n < 0 {
        return Err(format!("negative entry count {n}"));
    }
    let mut out = Importance::new();
    for i in 0..n {
        let len = read_i32(take(4, "name length")?);
        if !(0..=4096).contains(&len) {
            return Err(format!("entry {i}: bad name length {len}"));
        }
        let name = String::from_utf8(take(len as usize, "name")?.to_vec())
            .map_err(|_| format!("entry {i}: name is not UTF-8"))?;
        let _ncall = read_i32(take(4, "ncall")?);
        let nval = read_i32(take(4, "nval")?);
        if nval < 0 {
            return Err(format!("entry {name}: negative value count {nval}"));
        }
        let raw = take(nval as usize * 4, "values")?;
        let vals: Vec<f32> = raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        if let Some(j) = vals.iter().position(|v| !v.is_finite() || *v < 0.0) {
            return Err(format!(
                "entry {name}: value {j} is {} (must be finite, >= 0)",
                vals[j]
            ));
        }
        out.insert(name, vals);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn legacy(entries: &[(&str, &[f32])]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&(entries.len() as i32).to_le_bytes());
        for (name, vals) in entries {
            b.extend_from_slice(&(name.len() as i32).to_le_bytes());
            b.extend_from_slice(name.as_bytes());
            b.extend_from_slice(&1i32.to_le_bytes());
            b.extend_from_slice(&(vals.len() as i32).to_le_bytes());
            for v in *vals {
                b.extend_from_slice(&v.to_le_bytes());
            }
        }
        b
    }

    #[test]
    fn legacy_layout_parses_and_rejects_truncation() {
        let b = legacy(&[("blk.0.ffn_up.weight", &[1.0, 2.0]), ("x", &[0.5])]);
        let m = parse_legacy(&b).unwrap();
        assert_eq!(m["blk.0.ffn_up.weight"], vec![1.0, 2.0]);
        assert_eq!(m["x"], vec![0.5]);
        let e = parse_legacy(&b[..b.len() - 2]).unwrap_err();
        assert!(e.contains("truncated"), "{e}");
    }
}
