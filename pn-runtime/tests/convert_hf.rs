//! `pn_runtime::convert` on the tiny Qwen3.5 checkpoint: what llama.cpp's converter wrote from
//! the same folder (`tests/data/tiny-qwen35/hf/expected-gguf.json`, and `model-f16.gguf` for F32
//! input), the logits of the result, sharded input, and one error per kind of damage.

mod convert_fixture;

use convert_fixture::{sha256_hex, to_f32, write_safetensors, write_tiny_checkpoint};
use gguf_io::{Array, GgufFile, Value};
use pn_runtime::convert::{convert_checkpoint, ConvertError, ConvertOptions, OutType};
use pn_runtime::quantize::no_progress;
use pn_tests::paths::{scratch_dir, tiny};
use serde_json::Value as Json;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

fn convert(input: &Path, output: &Path, outtype: Option<OutType>) -> Result<(), ConvertError> {
    let mut opts = ConvertOptions::new(input, output);
    opts.outtype = outtype;
    // The oracle's converter run named the model (its folder had another name).
    opts.model_name = Some("tiny-qwen35".into());
    convert_checkpoint(&opts, &no_progress, &AtomicBool::new(false)).map(|_| ())
}

/// Python's `json.dumps(v, ensure_ascii=False)` (default separators), which the listing hashed.
fn py_json(v: &Json, out: &mut String) {
    match v {
        Json::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_json(x, out);
            }
            out.push(']');
        }
        Json::String(s) => {
            out.push('"');
            for c in s.chars() {
                match c {
                    '"' => out.push_str("\\\""),
                    '\\' => out.push_str("\\\\"),
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    '\t' => out.push_str("\\t"),
                    '\u{8}' => out.push_str("\\b"),
                    '\u{c}' => out.push_str("\\f"),
                    c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                    c => out.push(c),
                }
            }
            out.push('"');
        }
        Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Json::Number(n) => out.push_str(&n.to_string()),
        other => panic!("unexpected {other}"),
    }
}

fn value_json(v: &Value) -> Json {
    match v {
        Value::String(s) => Json::String(s.clone()),
        Value::U32(x) => Json::from(*x),
        Value::I32(x) => Json::from(*x),
        Value::Bool(b) => Json::Bool(*b),
        Value::F32(x) => Json::from(f64::from(*x)),
        Value::Array(a) => match a {
            Array::String(v) => Json::Array(v.iter().map(|s| Json::String(s.clone())).collect()),
            Array::I32(v) => Json::Array(v.iter().map(|&x| Json::from(x)).collect()),
            Array::Bool(v) => Json::Array(v.iter().map(|&x| Json::Bool(x)).collect()),
            other => panic!("unexpected array {other:?}"),
        },
        other => panic!("unexpected value {other:?}"),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::String(_) => "STRING",
        Value::U32(_) => "UINT32",
        Value::I32(_) => "INT32",
        Value::F32(_) => "FLOAT32",
        Value::Bool(_) => "BOOL",
        Value::Array(_) => "ARRAY",
        _ => "OTHER",
    }
}

/// Checks `path` against expected-gguf.json: every metadata key (in order) with its type and
/// value, every tensor (in order) with type, dims and sha256 of its bytes, and the file's sha256.
fn check_against_listing(path: &Path) {
    let want = pn_tests::read_json(&convert_fixture::hf_data("expected-gguf.json"));
    let f = GgufFile::open(path).expect("converted file");
    let meta = f.metadata();
    let want_meta = want["metadata"].as_array().expect("metadata list");
    let got_keys: Vec<&str> = meta.iter().map(|m| m.key.as_str()).collect();
    let want_keys: Vec<&str> = want_meta
        .iter()
        .map(|m| m["key"].as_str().unwrap())
        .collect();
    assert_eq!(got_keys, want_keys, "metadata keys and their order");
    for (m, w) in meta.iter().zip(want_meta) {
        assert_eq!(type_name(&m.value), w["type"], "{}: type", m.key);
        let got = value_json(&m.value);
        if let Some(h) = w.get("sha256_of_json") {
            let mut s = String::new();
            py_json(&got, &mut s);
            assert_eq!(
                got.as_array().unwrap().len() as u64,
                w["len"].as_u64().unwrap(),
                "{}",
                m.key
            );
            assert_eq!(sha256_hex(s.as_bytes()), *h, "{}: array contents", m.key);
        } else if let Value::F32(x) = m.value {
            assert_eq!(f64::from(x), w["value"].as_f64().unwrap(), "{}", m.key);
        } else {
            assert_eq!(got, w["value"], "{}", m.key);
        }
    }
    let want_t = want["tensors"].as_array().expect("tensor list");
    assert_eq!(f.tensor_infos().len(), want_t.len());
    for (t, w) in f.tensors().zip(want_t) {
        assert_eq!(t.name, w["name"].as_str().unwrap());
        assert_eq!(
            t.ty.gguf_py_name(),
            w["type"].as_str().unwrap(),
            "{}: type",
            t.name
        );
        let dims: Vec<u64> = w["dims"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        assert_eq!(t.dims, dims.as_slice(), "{}: dims", t.name);
        assert_eq!(
            sha256_hex(t.bytes),
            w["sha256"].as_str().unwrap(),
            "{}: data",
            t.name
        );
    }
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(bytes.len() as u64, want["file_bytes"].as_u64().unwrap());
    assert_eq!(
        sha256_hex(&bytes),
        want["file_sha256"].as_str().unwrap(),
        "whole file"
    );
}

fn scratch(name: &str) -> PathBuf {
    scratch_dir(&format!("pn-convert-{name}"))
}

#[test]
fn f16_checkpoint_gives_exactly_what_llama_cpp_wrote() {
    let dir = scratch("f16");
    let ck = dir.join("hf");
    std::fs::create_dir_all(&ck).unwrap();
    write_tiny_checkpoint(&ck);
    let out = dir.join("out.gguf");
    convert(&ck, &out, Some(OutType::F16)).expect("convert");
    check_against_listing(&out);
    // `auto` on an F16 checkpoint is F16 too.
    let auto = dir.join("auto.gguf");
    convert(&ck, &auto, None).expect("convert auto");
    assert_eq!(std::fs::read(&auto).unwrap(), std::fs::read(&out).unwrap());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn f32_checkpoint_gives_model_f16_gguf_byte_for_byte() {
    let dir = scratch("f32");
    let ck = dir.join("hf");
    std::fs::create_dir_all(&ck).unwrap();
    let tensors = write_tiny_checkpoint(&ck);
    write_safetensors(&ck.join("model.safetensors"), &to_f32(&tensors));
    let out = dir.join("out.gguf");
    convert(&ck, &out, Some(OutType::F16)).expect("convert");
    assert!(
        std::fs::read(&out).unwrap() == std::fs::read(tiny("model-f16.gguf")).unwrap(),
        "the F32 route must reproduce tests/data/tiny-qwen35/model-f16.gguf"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
