//! Fuzz the GGUF parser: any input must give Ok or a typed error, never a panic, hang or
//! oversized allocation. Inputs that parse are exercised further: every tensor view, a decode of
//! the first row of decodable tensors, and a write/re-read round trip that must preserve the
//! metadata and tensor bytes.
#![no_main]

use gguf_io::quants::{dequantize_row, DECODABLE};
use gguf_io::{write_gguf_to_vec, GgufFile, TensorSpec};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(f) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    for e in f.metadata() {
        let _ = f.get_u32(&e.key);
        let _ = f.get_f32(&e.key);
        let _ = f.get_str_array(&e.key);
        let _ = f.get_i64_array(&e.key);
    }
    let mut specs: Vec<TensorSpec<'_>> = Vec::new();
    for t in f.tensors() {
        assert_eq!(t.bytes.len() as u64, f.tensor_info(t.name).unwrap().n_bytes);
        if DECODABLE.contains(&t.ty) {
            if let Some(row) = t.row(0) {
                let n = t.row_len() as usize;
                if n <= 1 << 16 {
                    let mut out = vec![0f32; n];
                    dequantize_row(t.ty, row, &mut out).expect("validated row decodes");
                }
            }
        }
        specs.push((t.name, t.ty, t.dims, t.bytes));
    }
    // Huge (valid) alignments make the rewritten file gigabytes of padding: skip those.
    if f.alignment() > 1 << 16 {
        return;
    }
    let bytes = write_gguf_to_vec(f.metadata(), &specs).expect("a parsed file can be written");
    let g = GgufFile::from_bytes(bytes).expect("a written file parses");
    assert_eq!(g.metadata().len(), f.metadata().len());
    for (a, b) in g.metadata().iter().zip(f.metadata()) {
        assert_eq!(a.key, b.key);
        assert_eq!(format!("{:?}", a.value), format!("{:?}", b.value));
    }
    for (a, b) in g.tensors().zip(f.tensors()) {
        assert_eq!(
            (a.name, a.ty, a.dims, a.bytes),
            (b.name, b.ty, b.dims, b.bytes)
        );
    }
});
