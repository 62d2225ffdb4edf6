//! A GGUF written by other software (gguf-py) with real Q4_K_M model rows: the header, KVs and
//! tensor table must match gguf-py's reading, and every tensor must decode bit-exactly to
//! gguf-py's (and ggml's) dequantization. See tests/data/real-gguf/README.md.

use gguf_io::quants::{dequantize_row, reference, vec_dot_f32};
use gguf_io::{GgmlType, GgufFile};
use pn_tests::data;
use serde_json::Value as Json;
use sha2::{Digest, Sha256};

fn sha256_hex(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

fn expected() -> Json {
    serde_json::from_str(
        &std::fs::read_to_string(data("real-gguf", "slices-expected.json")).unwrap(),
    )
    .unwrap()
}

#[test]
fn header_and_kvs_match_gguf_py() {
    let bytes = std::fs::read(data("real-gguf", "slices.gguf")).unwrap();
    assert_eq!(
        sha256_hex(&bytes),
        expected()["slices_gguf_sha256"].as_str().unwrap()
    );
    let f = GgufFile::open(data("real-gguf", "slices.gguf")).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.metadata().len(), 15);
    assert_eq!(f.get_str("general.architecture").unwrap(), "gemma3");
    assert_eq!(f.get_str("general.license").unwrap(), "gemma");
    assert_eq!(f.get_str_array("general.tags").unwrap().len(), 4);
    // 1e-6 as stored: bytes bd 37 86 35.
    let eps = f
        .get_f32("gemma3.attention.layer_norm_rms_epsilon")
        .unwrap();
    assert_eq!(eps.to_le_bytes(), [0xbd, 0x37, 0x86, 0x35]);
    assert_eq!(f.get_str_array("tokenizer.ggml.tokens").unwrap().len(), 8);
    assert_eq!(f.get_u32("general.quantization_version").unwrap(), 2);
    assert!(f.get_bool("tokenizer.ggml.add_bos_token").is_ok());
}

#[test]
fn every_tensor_matches_and_decodes_bit_exactly() {
    let exp = expected();
    let tensors = exp["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), 26);
    let f = GgufFile::open(data("real-gguf", "slices.gguf")).unwrap();
    assert_eq!(f.tensor_infos().len(), 26);
    let bin = std::fs::read(data("real-gguf", "slices-expected.bin")).unwrap();
    assert_eq!(
        sha256_hex(&bin),
        exp["expected_bin_sha256"].as_str().unwrap()
    );

    let mut types_seen = std::collections::BTreeSet::new();
    for (info, e) in f.tensor_infos().iter().zip(tensors) {
        let name = e["name"].as_str().unwrap();
        assert_eq!(info.name, name);
        assert_eq!(
            u64::from(info.ty.id()),
            e["ggml_type"].as_u64().unwrap(),
            "{name}"
        );
        assert_eq!(
            info.ty.gguf_py_name(),
            e["ggml_type_name"].as_str().unwrap(),
            "{name}"
        );
        let dims: Vec<u64> = e["dims"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        assert_eq!(info.dims, dims, "{name}");
        assert_eq!(
            info.offset,
            e["tensor_offset_in_data_section"].as_u64().unwrap(),
            "{name}"
        );
        assert_eq!(info.n_bytes, e["n_bytes"].as_u64().unwrap(), "{name}");
        let view = f.tensor(name).unwrap();
        assert_eq!(
            sha256_hex(view.bytes),
            e["raw_sha256"].as_str().unwrap(),
            "{name}"
        );

        let n = info.n_elements() as usize;
        let mut out = vec![0f32; n];
        dequantize_row(info.ty, view.bytes, &mut out).unwrap();
        let off = e["expected_offset"].as_u64().unwrap() as usize;
        let want = &bin[off..off + 4 * n];
        let mut mismatches = 0;
        for (i, (got, w)) in out.iter().zip(want.chunks_exact(4)).enumerate() {
            let w = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
            if got.to_bits() != w {
                if mismatches < 5 {
                    eprintln!(
                        "{name}[{i}]: got {got} ({:#010x}) want {} ({w:#010x})",
                        got.to_bits(),
                        f32::from_bits(w)
                    );
                }
                mismatches += 1;
            }
        }
        assert_eq!(mismatches, 0, "{name}: {mismatches} of {n} values differ");
        types_seen.insert(info.ty);

        // The fast dot product agrees with the reference on these real rows.
        let row_len = view.row_len() as usize;
        let x: Vec<f32> = (0..row_len)
            .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        for r in 0..view.n_rows() as usize {
            let row = view.row(r).unwrap();
            let fast = vec_dot_f32(info.ty, row, &x).unwrap();
            let refv = reference::vec_dot_f32(info.ty, row, &x).unwrap();
            let mut w = vec![0f32; row_len];
            dequantize_row(info.ty, row, &mut w).unwrap();
            let scale: f32 = w.iter().zip(&x).map(|(a, b)| (a * b).abs()).sum::<f32>() + 1e-30;
            assert!(
                (fast - refv).abs() <= 1e-5 * scale,
                "{name} row {r}: {fast} vs {refv}"
            );
        }
    }
    use GgmlType::*;
    for t in [
        F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K,
    ] {
        assert!(types_seen.contains(&t), "{t} not covered");
    }
}

/// With the full 253 MB file rebuilt locally (see the README), compare the whole parse with
/// gguf-py's listing. Skipped when `PN_GEMMA3_GGUF` is not set.
#[test]
fn full_gemma_file_matches_listing_when_present() {
    let Ok(path) = std::env::var("PN_GEMMA3_GGUF") else {
        eprintln!("PN_GEMMA3_GGUF not set: skipping the full-file comparison");
        return;
    };
    let listing: Json = serde_json::from_str(
        &std::fs::read_to_string(data("real-gguf", "gemma3-270m-listing.json")).unwrap(),
    )
    .unwrap();
    let f = GgufFile::open(path).unwrap();
    assert_eq!(f.file_len(), listing["file_size"].as_u64().unwrap());
    assert_eq!(u64::from(f.version()), listing["version"].as_u64().unwrap());
    assert_eq!(f.alignment(), listing["alignment"].as_u64().unwrap());
    assert_eq!(f.data_offset(), listing["data_offset"].as_u64().unwrap());
    let kvs = listing["metadata"].as_array().unwrap();
    assert_eq!(f.metadata().len(), kvs.len());
    for (m, k) in f.metadata().iter().zip(kvs) {
        assert_eq!(m.key, k["key"].as_str().unwrap());
        let t = k["type"].as_str().unwrap();
        assert!(m.value.type_description().starts_with(t), "{}: {t}", m.key);
    }
    let ts = listing["tensors"].as_array().unwrap();
    assert_eq!(f.tensor_infos().len(), ts.len());
    for (info, t) in f.tensor_infos().iter().zip(ts) {
        assert_eq!(info.name, t["name"].as_str().unwrap());
        assert_eq!(u64::from(info.ty.id()), t["ggml_type"].as_u64().unwrap());
        assert_eq!(info.offset, t["offset"].as_u64().unwrap());
        assert_eq!(info.n_bytes, t["n_bytes"].as_u64().unwrap());
        let bytes = f.tensor(&info.name).unwrap().bytes;
        assert_eq!(
            sha256_hex(bytes),
            t["raw_sha256"].as_str().unwrap(),
            "{}",
            info.name
        );
    }
}
