//! `pn inspect`: the JSON agrees with gguf-io's reading, `--validate` catches bad PN rows, and a
//! malformed file is a non-zero exit with the error, never a panic.

mod common;

use std::path::PathBuf;

use common::pn;
use gguf_io::{write_gguf, GgmlType, GgufFile, MetadataEntry, Value};
use pn_tests::data;

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pn-inspect-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn json_matches_the_reader() {
    let path = data("tiny-qwen35", "model-f16.gguf");
    let out = pn(&["inspect", path.to_str().unwrap(), "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(j["version"], 3);
    assert_eq!(j["alignment"], f.alignment());
    assert_eq!(j["data_offset"], f.data_offset());
    let meta = j["metadata"].as_array().unwrap();
    assert_eq!(meta.len(), f.metadata().len());
    let tokens = meta
        .iter()
        .find(|m| m["key"] == "tokenizer.ggml.tokens")
        .unwrap();
    assert_eq!(tokens["type"], "ARRAY[STRING]");
    // Not cut by default: every token is there.
    assert_eq!(tokens["value"].as_array().unwrap().len(), 2048);
    let bc = meta
        .iter()
        .find(|m| m["key"] == "qwen35.block_count")
        .unwrap();
    assert_eq!(
        (bc["type"].as_str(), bc["value"].as_u64()),
        (Some("UINT32"), Some(9))
    );
    let tensors = j["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), f.tensor_infos().len());
    for (t, info) in tensors.iter().zip(f.tensor_infos()) {
        assert_eq!(t["name"], info.name.as_str());
        assert_eq!(t["type"], info.ty.name());
        assert_eq!(t["type_id"], info.ty.id());
        assert_eq!(t["dims"], serde_json::json!(info.dims));
        assert_eq!(t["offset"], info.offset);
        assert_eq!(t["bytes"], info.n_bytes);
    }
    assert_eq!(tensors[0]["dims"], serde_json::json!([320, 2048]));
}

#[test]
fn json_truncation_is_explicit() {
    let path = data("tiny-qwen35", "model-f16.gguf");
    let out = pn(&[
        "inspect",
        path.to_str().unwrap(),
        "--json",
        "--json-max-array",
        "4",
    ]);
    assert!(out.status.success());
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let tokens = j["metadata"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["key"] == "tokenizer.ggml.tokens")
        .unwrap();
    assert_eq!(tokens["value"]["count"], 2048);
    assert_eq!(tokens["value"]["truncated"], true);
    assert_eq!(tokens["value"]["first"].as_array().unwrap().len(), 4);
}

#[test]
fn human_output_lists_tensors() {
    let path = data("tiny-qwen35", "model-f16.gguf");
    let out = pn(&["inspect", path.to_str().unwrap()]);
    assert!(out.status.success());
    let s = String::from_utf8(out.stdout).unwrap();
    assert!(s.contains("124 tensors:"), "{s}");
    assert!(s.contains("output.weight") && s.contains("[320, 2048]"));
    assert!(s.contains("tokenizer.ggml.tokens (ARRAY[STRING]) = [2048 items] first 16:"));
}

#[test]
fn malformed_files_exit_nonzero_without_panic() {
    let good = std::fs::read(data("real-gguf", "slices.gguf")).unwrap();
    for (name, bytes) in [
        ("truncated.gguf", good[..good.len() / 2].to_vec()),
        ("header-cut.gguf", good[..100].to_vec()),
        ("magic.gguf", b"GGML\x03\0\0\0".to_vec()),
        ("empty.gguf", Vec::new()),
    ] {
        let p = tmp(name);
        std::fs::write(&p, &bytes).unwrap();
        let out = pn(&["inspect", p.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {err}");
        assert!(err.starts_with("error:"), "{name}: {err}");
        assert!(!err.contains("panicked"), "{name}: {err}");
    }
    let out = pn(&["inspect", "/nonexistent/file.gguf"]);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn validate_reports_bad_pn_rows() {
    // Two pn3t rows of 80 weights (one block each) and one pn4t row: all zero blocks are valid.
    let good3 = vec![0u8; 34 * 2];
    let mut bad3 = good3.clone();
    bad3[34 + 3] = 0x80; // row 1, word 0, reserved bit 15
    let pn4 = vec![0u8; 34];
    let meta = [MetadataEntry::new(
        "general.architecture",
        Value::String("qwen35".into()),
    )];
    let p_good = tmp("good-pn.gguf");
    write_gguf(
        &p_good,
        &meta,
        &[
            ("a", GgmlType::Pn3t, &[80, 2], &good3),
            ("b", GgmlType::Pn4t, &[64], &pn4),
        ],
    )
    .unwrap();
    let out = pn(&["inspect", p_good.to_str().unwrap(), "--validate", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["validation"]["pn_tensors"], 2);
    assert_eq!(j["validation"]["rows"], 3);
    assert_eq!(j["tensors"][0]["type"], "pn3t");
    assert_eq!(j["tensors"][0]["type_id"], 124);

    let p_bad = tmp("bad-pn.gguf");
    write_gguf(
        &p_bad,
        &meta,
        &[("blk.0.ffn_up.weight", GgmlType::Pn3t, &[80, 2], &bad3)],
    )
    .unwrap();
    let out = pn(&["inspect", p_bad.to_str().unwrap(), "--validate"]);
    assert_eq!(out.status.code(), Some(1));
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(s.contains("\"blk.0.ffn_up.weight\" row 1"), "{s}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("1 invalid PN rows"));
}

#[test]
fn validate_terminates_on_empty_tensor_with_huge_row_count() {
    // ne0 = 0 and 2^40 x 2^20 rows: zero bytes, but a naive row loop would never end.
    let p = tmp("empty-huge.gguf");
    write_gguf(
        &p,
        &[],
        &[("e", GgmlType::Pn3t, &[0, 1 << 40, 1 << 20], &[])],
    )
    .unwrap();
    let out = pn(&["inspect", p.to_str().unwrap(), "--validate", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["validation"]["rows"], 0);
    assert_eq!(
        j["tensors"][0]["dims"],
        serde_json::json!([0u64, 1u64 << 40, 1u64 << 20])
    );
}
